"""A flat TensorFlow graph (its inputs, outputs and variables) translated into an ONNX ModelProto, and the op
coverage table of one.

The translation walks every node the outputs need before it raises, so its UnsupportedOpError names every op
it does not cover at once: op, node and the graph's producer version (TensorFlow ops carry no version of their
own; the producer version says which TensorFlow wrote the graph).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Mapping, Optional, Sequence, Set, Tuple

import numpy as np
from onnx import TensorProto, helper

from tether.errors import InvalidInput, UnsupportedOpError
from tether.frontend.tensorflow.graph import FlatGraph, TFNode, split_ref
from tether.frontend.tensorflow import loops
from tether.frontend.tensorflow.ops import CONVERTERS, STRUCTURAL
from tether.frontend.tensorflow.translate import ONNX_TYPES, OPSET, Translator, Value

Shape = Tuple[Optional[int], ...]


@dataclasses.dataclass
class GraphInput:
    name: str                 # the ONNX input's name
    ref: str                  # the Placeholder's tensor ("node:0")
    dtype: np.dtype
    shape: Optional[Shape]


@dataclasses.dataclass
class LoadedGraph:
    """What a reader found in a file: the flat graph, its inputs and outputs, its variables' values."""

    what: str                 # "TensorFlow GraphDef" / "TensorFlow SavedModel", for messages and coverage rows
    path: str
    graph: FlatGraph
    inputs: List[GraphInput]
    outputs: List[Tuple[str, str]]          # (ONNX output name, tensor "node:k")
    producer: int
    resources: Any = dataclasses.field(default_factory=dict)

    def ordered(self, allow_cycles: bool = False) -> List[TFNode]:
        try:
            return self.graph.ordered([ref for _, ref in self.outputs], allow_cycles)
        except InvalidInput as exc:
            raise InvalidInput("%s: %s" % (self.path, exc)) from None


def _input_shape(inp: GraphInput, shape: Optional[Mapping[str, Sequence[int]]], what: str) -> Shape:
    given = None
    if shape:
        node = inp.ref.split(":")[0]
        given = shape.get(inp.name, shape.get(node))
    if given is not None:
        given = tuple(int(d) for d in given)
        if inp.shape is not None and (len(given) != len(inp.shape) or any(
                d is not None and d != g for d, g in zip(inp.shape, given))):
            raise InvalidInput("%s: input %s has shape %s; the shape given (%s) does not fit it"
                               % (what, inp.name, _fmt(inp.shape), list(given)))
        return given
    if inp.shape is None:
        raise InvalidInput("%s: input %s has no known rank; give its shape (shape={%r: [...]}, or "
                           "--input-shape)" % (what, inp.name, inp.name))
    # an unknown batch size defaults to 1, as most models are run; other unknown dims stay symbolic
    return tuple(1 if d is None and i == 0 and len(inp.shape) > 1 else d for i, d in enumerate(inp.shape))


def _fmt(shape: Shape) -> str:
    return "[%s]" % ", ".join("?" if d is None else str(d) for d in shape)


def translate(loaded: LoadedGraph, shape: Optional[Mapping[str, Sequence[int]]] = None) -> Any:
    """``loaded`` as an ONNX ModelProto (opset 18)."""
    g = loaded.graph
    order = loaded.ordered()
    t = Translator()
    t.resources = loaded.resources
    for name, _ in loaded.outputs:
        t.reserve(name)
    values: Dict[str, Optional[Value]] = {}
    onnx_inputs = []
    for inp in loaded.inputs:
        s = _input_shape(inp, shape, loaded.what)
        t.reserve(inp.name)
        values[g.resolve(inp.ref)] = Value(inp.name, None, s, None, inp.dtype)
        dims = [d if d is not None else "%s_d%d" % (inp.name, i) for i, d in enumerate(s)]
        onnx_inputs.append(helper.make_tensor_value_info(inp.name, ONNX_TYPES[np.dtype(inp.dtype)], dims))
    nodes = NodeTranslator(t, g.library)
    nodes.run(g, order, values)
    missing = nodes.missing
    dead = nodes.dead
    if missing:
        raise UnsupportedOpError("%s %s (TensorFlow producer %d) has ops tether does not translate: %s"
                                 % (loaded.what, loaded.path, loaded.producer, "; ".join(
                                     "%s (node%s %s)" % (op, "s" if len(names) > 1 else "",
                                                         ", ".join(names[:10]) + (" ..." if len(names) > 10 else ""))
                                     for op, names in missing.items())))
    t.node = None
    onnx_outputs = []
    for name, ref in loaded.outputs:
        r = g.resolve(ref)
        if r in dead or split_ref(r)[0] in dead or r not in values:
            raise UnsupportedOpError("%s %s: output %s is on a branch its constant predicate never takes"
                                     % (loaded.what, loaded.path, name))
        v = values[g.resolve(ref)]
        t.nodes.append(helper.make_node("Identity", [t.tf(v)], [name], name=t.unique(name + "/output")))
        elem = ONNX_TYPES.get(np.dtype(v.dtype)) if v.dtype is not None else None
        onnx_outputs.append(helper.make_tensor_value_info(name, elem or TensorProto.FLOAT, None))
    graph = helper.make_graph(t.nodes, "tensorflow", onnx_inputs, onnx_outputs, t.initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=8,
                             producer_name="tether.frontend.tensorflow")


_CONTROL_FLOW = ("Switch", "Merge")


class NodeTranslator:
    """Runs the converters over nodes in order, recording what it cannot translate (``missing``: op -> node
    names with reasons) and the nodes a constant predicate cut off (``dead``). Function bodies a loop runs are
    translated by the same instance, so their failures land in the same error."""

    def __init__(self, t: Translator, library: Dict[str, Any]) -> None:
        self.t = t
        self.library = library
        self.missing: Dict[str, List[str]] = {}
        self.dead: Set[str] = set()

    def run(self, g: FlatGraph, order: Sequence[TFNode], values: Dict[str, Optional[Value]]) -> None:
        t, missing, dead = self.t, self.missing, self.dead
        for node in order:
            if node.name + ":0" in values:
                continue
            if node.op in _CONTROL_FLOW:
                _control_flow(t, node, g, values, dead, missing)
                continue
            if any(g.resolve(i) in dead or split_ref(g.resolve(i))[0] in dead for i in node.inputs):
                dead.add(node.name)
                continue
            if node.op == "Placeholder":
                missing.setdefault(node.op, []).append("%s (a placeholder that is no input of the signature)"
                                                       % node.name)
                continue
            convert = loops.LOOP_OPS.get(node.op) or CONVERTERS.get(node.op)
            if convert is None:
                missing.setdefault(node.op, []).append(node.name)
                continue
            ins = [values.get(g.resolve(i)) for i in node.inputs]
            if any(v is None for v in ins):
                continue                          # an input failed to translate: reported at its own node
            t.node = node
            try:
                outs = convert(self, node, ins) if node.op in loops.LOOP_OPS else convert(t, node, ins)
            except InvalidInput:
                raise                             # a broken file (a missing checkpoint): not the op's fault
            except UnsupportedOpError as exc:
                missing.setdefault(node.op, []).append("%s: %s" % (node.name, _reason(exc, node)))
                continue
            except (ValueError, IndexError, KeyError, TypeError) as exc:
                missing.setdefault(node.op, []).append("%s: %s" % (node.name, " ".join(str(exc).split())))
                continue
            if outs is None:
                continue                          # a loop body failed: reported at its own nodes
            for k, v in enumerate(outs):
                values["%s:%d" % (node.name, k)] = v

    def call(self, fdef, args: Sequence[Value], prefix: str) -> Optional[List[Value]]:
        """The outputs of library function ``fdef`` on ``args``, its nodes translated under ``prefix``; None when
        one of them could not be (recorded in ``missing``)."""
        g = FlatGraph(self.library)
        refs = []
        values: Dict[str, Optional[Value]] = {}
        for i, v in enumerate(args):
            name = "%s/arg%d" % (prefix, i)
            g.nodes[name] = TFNode(name, "_Arg", [], {}, {})
            refs.append(name + ":0")
            values[name + ":0"] = v
        g.inline(prefix, fdef, refs)
        outs = ["%s:%d" % (prefix, k) for k in range(len(fdef.signature.output_arg))]
        before = sum(len(v) for v in self.missing.values())
        self.run(g, g.ordered(outs), values)
        if sum(len(v) for v in self.missing.values()) > before:
            return None
        return [values[g.resolve(o)] for o in outs]


def _control_flow(t: Translator, node: TFNode, g: FlatGraph, values: Dict[str, Optional[Value]], dead: Set[str],
                  missing: Dict[str, List[str]]) -> None:
    """TensorFlow 1's conditional with a constant predicate (a frozen learning phase, a training flag): Switch
    passes its data to the output the predicate picks and leaves the other branch dead; Merge forwards the one
    live input. A predicate computed at run time is refused."""
    refs = [g.resolve(i) for i in node.inputs]
    if node.op == "Switch":
        if any(r in dead or split_ref(r)[0] in dead for r in refs[:2]):
            dead.add(node.name)
            return
        data, pred = values.get(refs[0]), values.get(refs[1])
        if data is None or pred is None:
            return
        if pred.const is None:
            missing.setdefault(node.op, []).append("%s: its predicate is computed at run time (TensorFlow 1 control "
                                                   "flow is translated for constant predicates)" % node.name)
            return
        taken = int(bool(np.asarray(pred.const).reshape(-1)[0]))
        values["%s:%d" % (node.name, taken)] = data
        dead.add("%s:%d" % (node.name, 1 - taken))
        return
    live = [(k, values.get(r)) for k, r in enumerate(refs) if split_ref(r)[0] not in dead and r not in dead]
    if not live:
        dead.add(node.name)
        return
    k, v = live[0]
    if v is not None:
        values[node.name + ":0"] = v
        values[node.name + ":1"] = t.constant(np.asarray(k, dtype=np.int32))


def _reason(exc: Exception, node: TFNode) -> str:
    msg = " ".join(str(exc).split())
    prefix = "node %s (%s): " % (node.name, node.op)
    return msg[len(prefix):] if msg.startswith(prefix) else msg


def coverage(loaded: LoadedGraph) -> List[Dict[str, Any]]:
    """Per op type of the nodes the outputs need: whether the frontend translates it, and its nodes."""
    rows: Dict[str, Dict[str, Any]] = {}
    for node in loaded.ordered(allow_cycles=True):
        row = rows.setdefault(node.op, {"op_type": node.op, "domain": "TensorFlow", "opset": loaded.producer,
                                        "covered": node.op in CONVERTERS or node.op in STRUCTURAL
                                        or node.op in loops.LOOP_OPS, "nodes": []})
        row["nodes"].append(node.name)
    return list(rows.values())
