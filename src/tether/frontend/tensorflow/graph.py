"""A TensorFlow graph as one flat list of nodes: function calls inlined, pruned to what the outputs need, sorted.

GraphDef nodes name their inputs ``node`` / ``node:k`` (output k), ``^node`` for a control edge; FunctionDef
bodies name them ``arg`` (a function argument) or ``node:out_arg:k`` (element k of the node's output argument
``out_arg``). Both are rewritten to ``node:k`` here, so the translation sees one naming. A call
(StatefulPartitionedCall, PartitionedCall, or a node whose op is a library function) is replaced by the
function's body, its nodes renamed under the call's name; its outputs become aliases of the body's results.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Sequence, Tuple

from tether.errors import InvalidInput, UnsupportedOpError
from tether.frontend.tensorflow.tensors import shape_of

CALL_OPS = ("StatefulPartitionedCall", "PartitionedCall")
_MAX_CALL_DEPTH = 64

# ops whose outputs are several single-tensor arguments: a function body names them by argument
_OUTPUT_ARGS = {
    "FusedBatchNorm": ["y", "batch_mean", "batch_variance", "reserve_space_1", "reserve_space_2"],
    "FusedBatchNormV2": ["y", "batch_mean", "batch_variance", "reserve_space_1", "reserve_space_2"],
    "FusedBatchNormV3": ["y", "batch_mean", "batch_variance", "reserve_space_1", "reserve_space_2",
                         "reserve_space_3"],
    "TopKV2": ["values", "indices"], "Unique": ["y", "idx"], "Switch": ["output_false", "output_true"],
    "Merge": ["output", "value_index"], "QuantizeV2": ["output", "output_min", "output_max"],
}


def decode_attr(value) -> Any:
    """An AttrValue as a Python value: str (decoded bytes, else bytes), int, float, bool, a data type number,
    a shape tuple, a TensorProto (decoded by the op that reads it), a function name, or a list of these."""
    kind = next((k for k in ("s", "i", "f", "b", "type", "shape", "tensor", "func", "placeholder")
                 if value.HasField(k)), None)
    if kind is None:
        if not value.HasField("list"):
            return None
        lv = value.list
        for k in ("s", "i", "f", "b", "type", "shape", "tensor", "func"):
            items = list(getattr(lv, k))
            if items:
                return [_scalar(k, v) for v in items]
        return []
    return _scalar(kind, getattr(value, kind))


def _scalar(kind: str, v) -> Any:
    if kind == "s":
        try:
            return v.decode("utf-8")
        except UnicodeDecodeError:
            return v
    if kind == "shape":
        return shape_of(v)
    if kind == "func":
        return v.name
    return v


@dataclasses.dataclass
class TFNode:
    """One op of the flat graph: inputs are ``node:k`` references (control edges dropped)."""

    name: str
    op: str
    inputs: List[str]
    attrs: Dict[str, Any]
    tensors: Dict[str, Any]        # attr name -> TensorProto (decoded by the op that reads it)

    def attr(self, name: str, default: Any = None) -> Any:
        return self.attrs.get(name, default)


def _node(nd, name: str, inputs: List[str]) -> TFNode:
    attrs, tensors = {}, {}
    for entry in nd.attr:
        if entry.value.HasField("tensor"):
            tensors[entry.key] = entry.value.tensor
        attrs[entry.key] = decode_attr(entry.value)
    return TFNode(name, nd.op, inputs, attrs, tensors)


def split_ref(ref: str) -> Tuple[str, int]:
    name, _, idx = ref.partition(":")
    return name, int(idx) if idx else 0


class FlatGraph:
    """Nodes by name (in the order they were added) and the aliases a call's outputs leave."""

    def __init__(self, library: Dict[str, Any]) -> None:
        self.library = library
        self.nodes: Dict[str, TFNode] = {}
        self.alias: Dict[str, str] = {}

    def resolve(self, ref: str) -> str:
        seen = 0
        while ref in self.alias:
            ref = self.alias[ref]
            seen += 1
            if seen > 1 << 20:
                raise UnsupportedOpError("tensor %s: its call outputs alias each other in a cycle" % ref)
        return ref

    def add_graph(self, node_defs: Sequence[Any]) -> None:
        for nd in node_defs:
            inputs = [i if ":" in i else i + ":0" for i in nd.input if not i.startswith("^")]
            self._add(nd, nd.name, inputs, 0)

    def _add(self, nd, name: str, inputs: List[str], depth: int) -> None:
        func = None
        if nd.op in CALL_OPS:
            func = next((e.value.func.name for e in nd.attr if e.key == "f"), None)
        elif nd.op in self.library:
            func = nd.op
        if func is not None and func in self.library:
            self.inline(name, self.library[func], inputs, depth + 1)
            return
        if name in self.nodes:
            raise UnsupportedOpError("node %s: two nodes of the graph have this name" % name)
        self.nodes[name] = _node(nd, name, inputs)

    def inline(self, call: str, fdef, inputs: List[str], depth: int = 1) -> None:
        """Add ``fdef``'s body under ``call/``, its arguments bound to ``inputs``; ``call:k`` becomes output k."""
        if depth > _MAX_CALL_DEPTH:
            raise UnsupportedOpError("node %s: function calls nest deeper than %d (recursion?)"
                                     % (call, _MAX_CALL_DEPTH))
        sig = fdef.signature
        args = {a.name: ref for a, ref in zip(sig.input_arg, inputs)}
        if len(inputs) < len(sig.input_arg):
            raise UnsupportedOpError("node %s: calls %s with %d inputs, it takes %d"
                                     % (call, sig.name, len(inputs), len(sig.input_arg)))
        ops = {nd.name: nd.op for nd in fdef.node_def}
        prefix = call + "/"

        def ref(i: str) -> str:
            parts = i.split(":")
            if len(parts) == 1:
                return args[i] if i in args else prefix + i + ":0"
            if len(parts) == 2:               # "node:k" also appears in bodies written by hand
                return prefix + i
            node, out, k = parts[0], parts[1], int(parts[2])
            names = _OUTPUT_ARGS.get(ops.get(node, ""), [])
            return "%s%s:%d" % (prefix, node, (names.index(out) if out in names else 0) + k)

        for nd in fdef.node_def:
            self._add(nd, prefix + nd.name, [ref(i) for i in nd.input if not i.startswith("^")], depth)
        rets = {e.key: e.value for e in fdef.ret}
        for k, arg in enumerate(sig.output_arg):
            if arg.name not in rets:
                raise UnsupportedOpError("function %s: output %s has no return value" % (sig.name, arg.name))
            self.alias["%s:%d" % (call, k)] = ref(rets[arg.name])

    def ordered(self, outputs: Sequence[str], allow_cycles: bool = False) -> List[TFNode]:
        """The nodes the ``outputs`` depend on, each after its inputs; a cycle (a TF1 while loop) is refused, or
        with ``allow_cycles`` broken where it closes (for listing the nodes)."""
        order: List[TFNode] = []
        state: Dict[str, int] = {}            # 1: on the stack, 2: done
        for out in outputs:
            root = split_ref(self.resolve(out))[0]
            if root not in self.nodes:
                raise InvalidInput("output %s: no node of the graph produces it" % out)
            stack: List[Tuple[str, int]] = [(root, 0)]
            while stack:
                name, i = stack.pop()
                if i == 0:
                    if state.get(name) == 2:
                        continue
                    state[name] = 1
                node = self.nodes[name]
                if i < len(node.inputs):
                    stack.append((name, i + 1))
                    dep = split_ref(self.resolve(node.inputs[i]))[0]
                    if dep not in self.nodes:
                        raise InvalidInput("node %s reads %s, which no node of the graph produces (the file is "
                                           "truncated or incomplete)" % (name, node.inputs[i]))
                    if state.get(dep) == 1 and allow_cycles:
                        continue
                    if state.get(dep) == 1:
                        raise UnsupportedOpError("node %s (%s): the graph has a cycle through it (a TF1 control "
                                                 "flow loop), which tether does not translate" % (dep,
                                                                                                 self.nodes[dep].op))
                    if state.get(dep) != 2:
                        stack.append((dep, 0))
                else:
                    state[name] = 2
                    order.append(node)
        return order


def default_outputs(graph: FlatGraph) -> List[str]:
    """Output 0 of every node no other node reads and that depends on an input: a frozen graph keeps some
    constants nothing reads (what its variables were read into), which are no results."""
    used = {split_ref(graph.resolve(i))[0] for n in graph.nodes.values() for i in n.inputs}
    skip = {"NoOp", "Const", "Placeholder", "Assert", "AssignVariableOp", "VarHandleOp", "SaveV2", "RestoreV2"}
    readers: Dict[str, List[str]] = {}
    for n in graph.nodes.values():
        for i in n.inputs:
            readers.setdefault(split_ref(graph.resolve(i))[0], []).append(n.name)
    live = set()
    stack = [n.name for n in graph.nodes.values() if n.op == "Placeholder"]
    while stack:
        name = stack.pop()
        if name not in live:
            live.add(name)
            stack.extend(readers.get(name, []))
    return [n.name + ":0" for n in graph.nodes.values()
            if n.name not in used and n.op not in skip and (n.name in live or not live)]


def library_of(graph_def) -> Dict[str, Any]:
    return {f.signature.name: f for f in graph_def.library.function}

