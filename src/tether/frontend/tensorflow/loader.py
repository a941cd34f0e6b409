"""Reading a frozen GraphDef (.pb) or a SavedModel folder into a :class:`LoadedGraph`: the flat graph, its
inputs (Placeholders, or a signature's inputs), its outputs and, for a SavedModel, its variables' values.

A SavedModel written by TensorFlow 2 keeps its computation in library functions (the signature's
StatefulPartitionedCall, inlined by :mod:`graph`) and its weights in a checkpoint (``variables/``). Which
checkpoint tensor a VarHandleOp stands for is found the way TensorFlow's loader finds it: the called concrete
function's ``bound_inputs`` name the object-graph node of each captured variable, and the checkpoint's own
object graph (stored in the bundle, node for node the same as the SavedModel's) gives that node's checkpoint
key. Graphs written by TensorFlow 1 name their variables by checkpoint key directly.
"""
from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Sequence

import numpy as np
from google.protobuf.message import DecodeError

from tether.errors import InvalidInput
from tether.frontend.tensorflow import protos
from tether.frontend.tensorflow.bundle import TensorBundle
from tether.frontend.tensorflow.graph import CALL_OPS, FlatGraph, decode_attr, default_outputs, library_of, split_ref
from tether.frontend.tensorflow.model import GraphInput, LoadedGraph
from tether.frontend.tensorflow.tensors import np_dtype, shape_of

SERVING = "serving_default"


def _parse(message, data: bytes, path: str, expected: str):
    try:
        msg = message.FromString(data)
    except (DecodeError, RuntimeError, ValueError) as exc:
        raise InvalidInput("%s is not a valid %s: its protobuf does not parse (%s), so it is truncated or "
                           "another format" % (path, expected, " ".join(str(exc).split()) or type(exc).__name__)) \
            from None
    return msg


def _placeholder_input(node, name: str, what: str) -> GraphInput:
    dt = node.attr("dtype")
    return GraphInput(name, node.name + ":0", np_dtype(dt if dt is not None else 1, "input %s of %s" % (name, what)),
                      node.attr("shape"))


def _ref(name: str) -> str:
    name = name[1:] if name.startswith("^") else name
    return name if ":" in name else name + ":0"


def load_graphdef(data: bytes, path: str, outputs: Optional[Sequence[str]] = None) -> LoadedGraph:
    what = "TensorFlow GraphDef"
    gd = _parse(protos.GraphDef, data, path, "%s (a frozen .pb)" % what)
    if not len(gd.node):
        raise InvalidInput("%s is not a valid %s: it has no nodes" % (path, what))
    flat = FlatGraph(library_of(gd))
    flat.add_graph(gd.node)
    outs = [_ref(o) for o in outputs] if outputs else default_outputs(flat)
    for o in outs:
        if split_ref(flat.resolve(o))[0] not in flat.nodes:
            raise InvalidInput("%s: output %s is no node of the graph" % (path, o))
    loaded = LoadedGraph(what, path, flat, [], [(o[:-2] if o.endswith(":0") else o, o) for o in outs],
                         gd.versions.producer)
    loaded.inputs = [_placeholder_input(n, n.name, what) for n in loaded.ordered(allow_cycles=True)
                     if n.op == "Placeholder"]
    return loaded


class _Variables:
    """The values of a SavedModel's variable nodes, read from its checkpoint when first asked for."""

    def __init__(self, folder: str, meta, flat: FlatGraph) -> None:
        self.folder = folder
        self.meta = meta
        self.flat = flat
        self._bundle: Optional[TensorBundle] = None
        self._keys: Optional[Dict[str, str]] = None

    def bundle(self) -> TensorBundle:
        if self._bundle is None:
            self._bundle = TensorBundle(os.path.join(self.folder, "variables", "variables"))
        return self._bundle

    def _object_keys(self) -> Dict[int, str]:
        raw = self.bundle().string_scalar("_CHECKPOINTABLE_OBJECT_GRAPH")
        if raw is None:
            return {}
        graph = protos.TrackableObjectGraph.FromString(raw)
        keys = {}
        for i, node in enumerate(graph.nodes):
            for a in node.attributes:
                if a.name == "VARIABLE_VALUE":
                    keys[i] = a.checkpoint_key
        return keys

    def keys(self) -> Dict[str, str]:
        """Variable node name -> checkpoint key."""
        if self._keys is not None:
            return self._keys
        keys: Dict[str, str] = {}
        objects = self._object_keys()
        og = self.meta.object_graph_def
        bound = {e.key: list(e.value.bound_inputs) for e in og.concrete_functions}
        nodes = {n.name: n for n in self.meta.graph_def.node}
        for n in self.meta.graph_def.node:
            if n.op not in CALL_OPS:
                continue
            f = next((e.value.func.name for e in n.attr if e.key == "f"), None)
            ids = bound.get(f, [])
            captured = [i for i in n.input if not i.startswith("^")][-len(ids):] if ids else []
            for ref, obj in zip(captured, ids):
                src = nodes.get(split_ref(ref)[0])
                if src is not None and src.op == "VarHandleOp" and obj in objects:
                    keys.setdefault(src.name, objects[obj])
        # variables by name: TensorFlow 1 graphs, or a SavedVariable whose name is the handle's shared name
        by_name: Dict[str, List[int]] = {}
        for i, obj in enumerate(og.nodes):
            if obj.HasField("variable"):
                by_name.setdefault(obj.variable.name, []).append(i)
        entries = self.bundle().entries
        for n in self.meta.graph_def.node:
            if n.op not in ("VarHandleOp", "VariableV2") or n.name in keys:
                continue
            shared = next((decode_attr(e.value) for e in n.attr if e.key == "shared_name"), "") or n.name
            for candidate in (shared, n.name):
                if candidate in entries:
                    keys[n.name] = candidate
                    break
                ids = by_name.get(candidate, [])
                if len(ids) == 1 and ids[0] in objects:
                    keys[n.name] = objects[ids[0]]
                    break
        self._keys = keys
        return keys

    def get(self, name: str) -> Optional[np.ndarray]:
        key = self.keys().get(name)
        if key is None or key not in self.bundle().entries:
            return None
        return self.bundle().tensor(key)


def load_saved_model(folder: str, outputs: Optional[Sequence[str]] = None,
                     signature: Optional[str] = None) -> LoadedGraph:
    what = "TensorFlow SavedModel"
    pb = os.path.join(folder, "saved_model.pb")
    if not os.path.isfile(pb):
        if os.path.isfile(os.path.join(folder, "saved_model.pbtxt")):
            raise InvalidInput("%s holds saved_model.pbtxt (text format); tether reads the binary saved_model.pb"
                               % folder)
        raise InvalidInput("%s has no saved_model.pb; expected a TensorFlow SavedModel folder" % folder)
    with open(pb, "rb") as fh:
        sm = _parse(protos.SavedModel, fh.read(), pb, "TensorFlow SavedModel (saved_model.pb)")
    if not len(sm.meta_graphs):
        raise InvalidInput("%s is not a valid TensorFlow SavedModel: it holds no meta graph" % pb)
    meta = next((m for m in sm.meta_graphs if "serve" in m.meta_info_def.tags), sm.meta_graphs[0])
    flat = FlatGraph(library_of(meta.graph_def))
    flat.add_graph(meta.graph_def.node)
    sigs = {e.key: e.value for e in meta.signature_def}
    producer = meta.graph_def.versions.producer
    loaded = LoadedGraph(what, folder, flat, [], [], producer, _Variables(folder, meta, flat))
    if outputs:
        loaded.outputs = [(o, _ref(o)) for o in outputs]
        loaded.inputs = [_placeholder_input(n, n.name, what) for n in loaded.ordered(allow_cycles=True)
                     if n.op == "Placeholder"]
        return loaded
    usable = [k for k, s in sigs.items() if len(s.outputs) and not k.startswith("__")]
    name = signature or (SERVING if SERVING in sigs else (sorted(usable)[0] if usable else None))
    if name is None or name not in sigs:
        raise InvalidInput("%s has no signature %r (it has: %s); name the outputs instead"
                           % (folder, name or SERVING, ", ".join(sorted(sigs)) or "none"))
    sig = sigs[name]
    for e in sorted(sig.outputs, key=lambda e: e.key):
        loaded.outputs.append((e.key, _ref(e.value.name)))
    ordered = {n.name for n in loaded.ordered(allow_cycles=True)}
    for e in sorted(sig.inputs, key=lambda e: e.key):
        ref = _ref(e.value.name)
        node = flat.nodes.get(split_ref(ref)[0])
        if node is None or node.name not in ordered:
            continue                      # an input the outputs do not depend on
        shape = shape_of(e.value.tensor_shape) if e.value.HasField("tensor_shape") else node.attr("shape")
        loaded.inputs.append(GraphInput(e.key, ref, np_dtype(e.value.dtype or node.attr("dtype") or 1,
                                                             "input %s of %s" % (e.key, folder)), shape))
    return loaded


def load(source: Any, outputs: Optional[Sequence[str]] = None) -> LoadedGraph:
    """A SavedModel folder, a GraphDef file, or a GraphDef's serialized bytes."""
    if isinstance(source, (bytes, bytearray)):
        return load_graphdef(bytes(source), "<GraphDef bytes>", outputs)
    path = os.fspath(source)
    if os.path.isdir(path):
        return load_saved_model(path, outputs)
    if not os.path.isfile(path):
        raise InvalidInput("%s does not exist; expected a TensorFlow GraphDef (.pb) or SavedModel folder" % path)
    with open(path, "rb") as fh:
        return load_graphdef(fh.read(), path, outputs)
