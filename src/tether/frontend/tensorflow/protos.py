"""TensorFlow's protobuf messages, described at run time: only the fields the frontend reads, with the field
numbers of TensorFlow's .proto files (tensorflow/core/framework and tensorflow/core/protobuf).

The messages are declared as proto2 so every singular field records whether it was written (an AttrValue is a
oneof in TensorFlow: the field that is set says which kind of value it holds). Enums are read as plain integers
(the wire encoding is the same) so a data type this table does not name still parses. Maps are repeated entry
messages with ``key`` and ``value``, which is how protobuf encodes them. Fields not declared here are kept as
unknown fields and ignored, so files written by newer TensorFlow versions parse as long as these numbers hold.
"""
from __future__ import annotations

from typing import Any, Dict, List, Tuple

from tether.frontend.proto_schema import build_messages

# message -> [(number, name, type, repeated)]; a type that is not a scalar names a message of this table
_MESSAGES: Dict[str, List[Tuple[int, str, str, bool]]] = {
    "TensorShapeProto": [(2, "dim", "TensorShapeProto.Dim", True), (3, "unknown_rank", "bool", False)],
    "TensorShapeProto.Dim": [(1, "size", "int64", False), (2, "name", "string", False)],
    "TensorProto": [(1, "dtype", "int32", False), (2, "tensor_shape", "TensorShapeProto", False),
                    (4, "tensor_content", "bytes", False), (13, "half_val", "int32", True),
                    (5, "float_val", "float", True), (6, "double_val", "double", True), (7, "int_val", "int32", True),
                    (8, "string_val", "bytes", True), (10, "int64_val", "int64", True), (11, "bool_val", "bool", True),
                    (16, "uint32_val", "uint32", True), (17, "uint64_val", "uint64", True)],
    "AttrValue": [(2, "s", "bytes", False), (3, "i", "int64", False), (4, "f", "float", False),
                  (5, "b", "bool", False), (6, "type", "int32", False), (7, "shape", "TensorShapeProto", False),
                  (8, "tensor", "TensorProto", False), (1, "list", "AttrValue.ListValue", False),
                  (10, "func", "NameAttrList", False), (9, "placeholder", "string", False)],
    "AttrValue.ListValue": [(2, "s", "bytes", True), (3, "i", "int64", True), (4, "f", "float", True),
                            (5, "b", "bool", True), (6, "type", "int32", True), (7, "shape", "TensorShapeProto", True),
                            (8, "tensor", "TensorProto", True), (9, "func", "NameAttrList", True)],
    "AttrEntry": [(1, "key", "string", False), (2, "value", "AttrValue", False)],
    "NameAttrList": [(1, "name", "string", False), (2, "attr", "AttrEntry", True)],
    "NodeDef": [(1, "name", "string", False), (2, "op", "string", False), (3, "input", "string", True),
                (4, "device", "string", False), (5, "attr", "AttrEntry", True)],
    "VersionDef": [(1, "producer", "int32", False), (2, "min_consumer", "int32", False)],
    "OpDef.ArgDef": [(1, "name", "string", False), (3, "type", "int32", False), (4, "type_attr", "string", False),
                     (5, "number_attr", "string", False), (6, "type_list_attr", "string", False)],
    "OpDef": [(1, "name", "string", False), (2, "input_arg", "OpDef.ArgDef", True),
              (3, "output_arg", "OpDef.ArgDef", True)],
    "StringEntry": [(1, "key", "string", False), (2, "value", "string", False)],
    "FunctionDef": [(1, "signature", "OpDef", False), (5, "attr", "AttrEntry", True),
                    (3, "node_def", "NodeDef", True), (4, "ret", "StringEntry", True)],
    "FunctionDefLibrary": [(1, "function", "FunctionDef", True)],
    "GraphDef": [(1, "node", "NodeDef", True), (4, "versions", "VersionDef", False),
                 (2, "library", "FunctionDefLibrary", False)],
    "TensorInfo": [(1, "name", "string", False), (2, "dtype", "int32", False),
                   (3, "tensor_shape", "TensorShapeProto", False)],
    "TensorInfoEntry": [(1, "key", "string", False), (2, "value", "TensorInfo", False)],
    "SignatureDef": [(1, "inputs", "TensorInfoEntry", True), (2, "outputs", "TensorInfoEntry", True),
                     (3, "method_name", "string", False)],
    "SignatureDefEntry": [(1, "key", "string", False), (2, "value", "SignatureDef", False)],
    "MetaInfoDef": [(4, "tags", "string", True), (5, "tensorflow_version", "string", False)],
    "MetaGraphDef": [(1, "meta_info_def", "MetaInfoDef", False), (2, "graph_def", "GraphDef", False),
                     (5, "signature_def", "SignatureDefEntry", True),
                     (7, "object_graph_def", "SavedObjectGraph", False)],
    "SavedModel": [(1, "saved_model_schema_version", "int64", False), (2, "meta_graphs", "MetaGraphDef", True)],
    "ObjectReference": [(1, "node_id", "int32", False), (2, "local_name", "string", False)],
    "SavedVariable": [(1, "dtype", "int32", False), (2, "shape", "TensorShapeProto", False),
                      (6, "name", "string", False)],
    "SavedObject": [(1, "children", "ObjectReference", True), (7, "variable", "SavedVariable", False)],
    "SavedConcreteFunction": [(2, "bound_inputs", "int32", True)],
    "ConcreteFunctionEntry": [(1, "key", "string", False), (2, "value", "SavedConcreteFunction", False)],
    "SavedObjectGraph": [(1, "nodes", "SavedObject", True), (2, "concrete_functions", "ConcreteFunctionEntry", True)],
    # the checkpoint's own object graph (trackable_object_graph.proto), stored in the bundle as a string tensor
    "SerializedTensor": [(1, "name", "string", False), (2, "full_name", "string", False),
                         (3, "checkpoint_key", "string", False)],
    "TrackableObject": [(1, "children", "ObjectReference", True), (2, "attributes", "SerializedTensor", True)],
    "TrackableObjectGraph": [(1, "nodes", "TrackableObject", True)],
    # the tensor bundle's index (tensor_bundle.proto)
    "BundleHeaderProto": [(1, "num_shards", "int32", False), (2, "endianness", "int32", False)],
    "TensorSliceProto": [],
    "BundleEntryProto": [(1, "dtype", "int32", False), (2, "shape", "TensorShapeProto", False),
                         (3, "shard_id", "int32", False), (4, "offset", "int64", False), (5, "size", "int64", False),
                         (7, "slices", "TensorSliceProto", True)],
}

_PACKAGE = "tether_tf"


def _build() -> Dict[str, Any]:
    # nested names ("TensorShapeProto.Dim") become flat ones: only the field numbers reach the wire
    flat = {msg.replace(".", "_"): "\n".join("%s %s %s = %d" % ("repeated" if repeated else "optional",
                                                                 typ.replace(".", "_"), name, number)
                                             for number, name, typ, repeated in fields)
            for msg, fields in _MESSAGES.items()}
    built = build_messages(_PACKAGE, {}, flat)
    return {msg: built[msg.replace(".", "_")] for msg in _MESSAGES}


MESSAGES = _build()
GraphDef = MESSAGES["GraphDef"]
SavedModel = MESSAGES["SavedModel"]
TrackableObjectGraph = MESSAGES["TrackableObjectGraph"]
BundleHeaderProto = MESSAGES["BundleHeaderProto"]
BundleEntryProto = MESSAGES["BundleEntryProto"]
TensorProto = MESSAGES["TensorProto"]
