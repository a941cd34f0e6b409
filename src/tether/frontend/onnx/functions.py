"""The fallback for ONNX ops tether has no converter for but the ONNX spec defines by a function body
(RMSNormalization, Shrink, Swish, MeanVarianceNormalization, NegativeLogLikelihoodLoss, ...): the node is
expanded through its body, built by onnx for the node's attributes and input types, and the body's nodes are
converted one by one like any other node. The body is written for the function's own opset, so its nodes
convert under that opset. What the body uses and tether lacks is refused, naming the node it came from."""
from __future__ import annotations

from typing import List, Optional

from tether.errors import UnsupportedOpError
from tether.frontend.onnx import dynamic, dynamic_values, half
from tether.frontend.onnx.importer import (ONNX_DTYPES, SEQUENCE_OPS, Importer, check_no_container, converter_key,
                                           defined, node_attrs)

_ONNX_ELEM = {v: k for k, v in ONNX_DTYPES.items()}


def _schema(op_type: str, opset: int):
    import onnx
    try:
        return onnx.defs.get_schema(op_type, opset, "")
    except onnx.defs.SchemaError:
        return None


def _versions(schema) -> List[int]:
    return list(schema.function_opset_versions) + list(schema.context_dependent_function_opset_versions)


def has_function_body(op_type: str, opset: int) -> bool:
    """Whether the spec (at ``opset``) defines ``op_type`` by a function body tether could expand."""
    s = _schema(op_type, opset)
    return s is not None and bool(_versions(s))


def _type_proto(im: Importer, value: str):
    from onnx import helper
    t = im.type(value)
    return helper.make_tensor_type_proto(_ONNX_ELEM[str(t.dtype)], list(t.shape))


def _with_defaults(node, schema):
    """The node with the schema's default for every attribute it leaves out (a body refers to them by name)."""
    import onnx
    full = onnx.NodeProto()
    full.CopyFrom(node)
    given = {a.name for a in node.attribute}
    for name, attr in schema.attributes.items():
        if name not in given and attr.default_value and attr.default_value.type:
            full.attribute.append(attr.default_value)
    return full


def _function_proto(im: Importer, node, ins: List[str]):
    """The body onnx builds for this node. Every body of the schema in force at the import opset defines the
    same op; they differ only in the opset their own nodes use, so the newest is taken."""
    import onnx
    schema = _schema(node.op_type, im.opset)
    fn = onnx.FunctionProto()
    best_plain = max(schema.function_opset_versions, default=-1)
    best_context = max(schema.context_dependent_function_opset_versions, default=-1)
    if best_plain >= best_context:
        fn.ParseFromString(schema.get_function_with_opset_version(best_plain))
        return fn
    # a context-dependent body depends on the input types: tell onnx the fixed shapes and dtypes
    types = []
    for v in ins:
        if v and str(im.type(v).dtype) not in _ONNX_ELEM:
            raise UnsupportedOpError("node %s: %s on %s inputs" % (node.name, node.op_type, im.type(v).dtype))
        types.append(_type_proto(im, v).SerializeToString() if v else onnx.TypeProto().SerializeToString())
    data = schema.get_context_dependent_function_with_opset_version(
        best_context, _with_defaults(node, schema).SerializeToString(), types)
    if not data:
        raise UnsupportedOpError("node %s: onnx built no function body for %s with these inputs"
                                 % (node.name, node.op_type))
    fn.ParseFromString(data)
    return fn


def _expand(node, fn, prefix: str):
    """The body's nodes with the function's formal inputs/outputs renamed to the node's actual values, the
    internal values prefixed, and attribute references bound to the node's attributes (or schema defaults)."""
    import onnx
    names = {}
    for i, formal in enumerate(fn.input):
        names[formal] = node.input[i] if i < len(node.input) else ""
    for i, formal in enumerate(fn.output):
        if i < len(node.output) and node.output[i]:
            names[formal] = node.output[i]
    attrs = {a.name: a for a in node.attribute}

    def rename(v: str) -> str:
        if v == "":
            return ""
        return names.get(v, prefix + v)

    body = []
    for k, inner in enumerate(fn.node):
        if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in inner.attribute):
            raise UnsupportedOpError("node %s: the function body of %s uses %s with a subgraph"
                                     % (node.name, node.op_type, inner.op_type))
        new = onnx.NodeProto()
        new.op_type = inner.op_type
        new.domain = inner.domain
        new.name = "%s%s_%d" % (prefix, inner.op_type, k)
        new.input.extend(rename(v) for v in inner.input)
        new.output.extend(rename(v) for v in inner.output)
        for a in inner.attribute:
            if a.ref_attr_name:
                if a.ref_attr_name in attrs:
                    b = onnx.AttributeProto()
                    b.CopyFrom(attrs[a.ref_attr_name])
                    b.name = a.name
                    new.attribute.append(b)
            else:
                new.attribute.append(a)
        body.append(new)
    return body


def _expand_converter(im: Importer, node, ins: List[str], attrs: dict) -> None:
    expand_node(im, node, ins)


def convert_node(im: Importer, node, declared: Optional[half.DeclaredTypes] = None) -> None:
    """Convert one ONNX node: through its converter, or else through its function body. A node reading float16
    runs its converter on float32 casts (half.py); ``declared`` gives the model's declared value types for that."""
    ins = [x for x in node.input]
    for x in ins:
        if x and not defined(im, x):
            raise ValueError("node %s (%s) reads %r, which nothing defines" % (node.name, node.op_type, x))
    check_no_container(im, node, ins)
    if any(x in im.dynamic for x in ins if x):
        convert_dynamic(im, node, ins)
        return
    convert = im.converters.get(converter_key(node), _expand_converter)
    if declared is not None and node.op_type not in half.NATIVE and node.op_type not in SEQUENCE_OPS \
            and half.reads_half(im, ins):
        half.convert_in_float32(im, node, ins, node_attrs(node), convert, declared.get())
    else:
        convert(im, node, ins, node_attrs(node))
        half.pass_through(im, node, ins)
    for o in node.output:
        if o and not defined(im, o):
            raise UnsupportedOpError("node %s (%s): output %r was not produced" % (node.name, node.op_type, o))


def convert_dynamic(im: Importer, node, ins: List[str]) -> None:
    """Convert a node that reads a data-dependent value: into a numpy node if its op takes such values (the
    ops that compute them, dynamic.py, or their post-processing, dynamic_values.py); else a one-line refusal."""
    key = converter_key(node)
    if key in dynamic_values.ON_DYNAMIC:
        dynamic_values.ON_DYNAMIC[key](im, node, ins, node_attrs(node))
    elif key in dynamic.CONVERTERS:
        dynamic.CONVERTERS[key](im, node, ins, node_attrs(node))
    else:
        value = next(x for x in ins if x in im.dynamic)
        raise UnsupportedOpError(
            "node %s (%s) reads %r, whose shape is data-dependent (known only at run time); tether runs such a "
            "value only through %s" % (node.name, node.op_type, value,
                                       ", ".join(sorted(set(dynamic_values.ON_DYNAMIC) | set(dynamic.CONVERTERS)))))
    for o in node.output:
        if o and not defined(im, o):
            raise UnsupportedOpError("node %s (%s): output %r was not produced" % (node.name, node.op_type, o))


def expand_node(im: Importer, node, ins: List[str]) -> None:
    """Convert ``node`` by converting the nodes of its function body. A converter that implements only part of
    an op's attribute space calls this for the rest."""
    schema = _schema(node.op_type, im.opset)
    if schema is None or not _versions(schema):
        raise UnsupportedOpError("node %s: %s has no converter and no function body" % (node.name, node.op_type))
    if node.domain not in ("", "ai.onnx"):
        raise UnsupportedOpError("node %s: %s of domain %r" % (node.name, node.op_type, node.domain))
    fn = _function_proto(im, node, ins)
    fn_opset: Optional[int] = None
    for o in fn.opset_import:
        if o.domain in ("", "ai.onnx"):
            fn_opset = o.version
        else:
            raise UnsupportedOpError("node %s: the function body of %s imports the opset domain %r"
                                     % (node.name, node.op_type, o.domain))
    body = _expand(_with_defaults(node, schema), fn, "%s__" % node.name)
    missing = sorted({n.op_type for n in body if n.op_type not in im.converters
                      and not has_function_body(n.op_type, fn_opset or im.opset)})
    if missing:
        raise UnsupportedOpError("node %s: %s expands through its function body into %s, which tether does not "
                                 "convert" % (node.name, node.op_type, ", ".join(missing)))
    for n in body:
        im.reserved.update(v for v in list(n.input) + list(n.output) if v)
    outer = im.opset
    im.opset = fn_opset or outer
    try:
        for n in body:
            convert_node(im, n)
    finally:
        im.opset = outer
