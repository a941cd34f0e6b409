"""The graph IR: a topologically ordered list of nodes over named tensor values.

A value is named by a string; its static type (shape + dtype) lives in ``Graph.types``. Constant values
(weights and folded tensors) are not stored in the graph: they travel beside it in a ``params`` dict
(name -> numpy array), so a pass can be written as ``graph, params = pass_(graph, params)`` and a graph can be
printed without dumping megabytes of weights.

Op names are tether's own (``conv2d``, ``dense``, ``add`` ...); their attributes, shape rules and numpy
semantics are defined once in the op table (``tether.kernels``). A fused node has op ``"fused"`` and carries its body
(a list of nodes over the fused node's inputs) in ``attrs["body"]``.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Tuple

import numpy as np
from tether_rpc.dtypes import name_of, numpy_dtype


@dataclass(frozen=True)
class TensorType:
    shape: Tuple[int, ...]
    dtype: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))
        object.__setattr__(self, "dtype", name_of(self.dtype))   # "bfloat16" without ml_dtypes too

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) if self.shape else 1

    @property
    def nbytes(self) -> int:
        return self.size * numpy_dtype(self.dtype).itemsize

    def __str__(self) -> str:
        return "%s[%s]" % (self.dtype, ",".join(str(d) for d in self.shape))


@dataclass
class Node:
    op: str
    name: str
    inputs: List[str]
    outputs: List[str]
    attrs: Dict[str, object] = field(default_factory=dict)

    def body(self) -> List["Node"]:
        """The single ops this node runs, in order: a fused node's body, else the node itself."""
        if self.op == "fused":
            return list(self.attrs["body"])
        return [self]

    def body_params(self) -> List[str]:
        """The values the body reads from outside it, in order: the arguments of the node's kernel (a value read
        twice, as in ``x * x``, is one argument)."""
        if self.op == "fused":
            return list(self.attrs["params"])
        return list(dict.fromkeys(self.inputs))

    def ops_label(self) -> str:
        """The body's ops joined by ``+`` (``conv2d+add+relu``): how logs, kernel names and deploy.json name it."""
        return "+".join(b.op for b in self.body())

    def __str__(self) -> str:
        return format_node(self)


def _fmt_attr(v: object) -> str:
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(_fmt_attr(x) for x in v) + "]"
    if isinstance(v, float):
        return "%g" % v
    if isinstance(v, np.ndarray):
        return "array%s" % (list(v.shape),)
    return str(v)


def format_node(node: Node, types: Optional[Dict[str, TensorType]] = None) -> str:
    outs = ", ".join("%" + o for o in node.outputs)
    ins = ", ".join("%" + i for i in node.inputs)
    if node.op == "fused":
        head = "fused[%s]" % node.ops_label()
        attrs = ""
    else:
        head = node.op
        shown = {k: v for k, v in sorted(node.attrs.items()) if not k.startswith("_")}
        attrs = (" {" + ", ".join("%s=%s" % (k, _fmt_attr(v)) for k, v in shown.items()) + "}") if shown else ""
    ty = ""
    if types is not None:
        ty = "  : " + ", ".join(str(types[o]) for o in node.outputs if o in types)
    return "%s = %s(%s)%s%s    # %s" % (outs, head, ins, attrs, ty, node.name)


_IMMUTABLE = (str, int, float, bool, type(None), TensorType)


def _copy_value(v: object, memo: Dict[int, object]) -> object:
    """copy.deepcopy for what a graph holds, taking the common cases (nodes, lists, dicts, immutables) without
    deepcopy's generic dispatch, which was two thirds of the graph passes' time; anything else goes to deepcopy
    with the same memo, so values shared within the graph stay shared in the copy."""
    if isinstance(v, _IMMUTABLE):
        return v
    hit = memo.get(id(v))
    if hit is not None:
        return hit
    t = type(v)
    if t is Node:
        n = Node.__new__(Node)
        memo[id(v)] = n
        n.__dict__.update({k: _copy_value(x, memo) for k, x in v.__dict__.items()})
        return n
    if t is list:
        out: list = []
        memo[id(v)] = out
        out.extend(_copy_value(x, memo) for x in v)
        return out
    if t is dict:
        d: dict = {}
        memo[id(v)] = d
        for k, x in v.items():
            d[_copy_value(k, memo)] = _copy_value(x, memo)
        return d
    if t is tuple:
        items = tuple(_copy_value(x, memo) for x in v)
        return v if all(a is b for a, b in zip(items, v)) else items
    return copy.deepcopy(v, memo)


@dataclass
class Graph:
    """Run-time inputs, outputs, nodes (in execution order) and the types of every value."""

    inputs: List[str]
    outputs: List[str]
    nodes: List[Node]
    types: Dict[str, TensorType]
    name: str = "main"

    def copy(self) -> "Graph":
        """A deep copy (a pass edits its copy freely)."""
        memo: Dict[int, object] = {}
        return Graph(_copy_value(self.inputs, memo), _copy_value(self.outputs, memo),
                     _copy_value(self.nodes, memo), dict(self.types), self.name)

    def producers(self) -> Dict[str, Node]:
        return {o: n for n in self.nodes for o in n.outputs}

    def consumers(self) -> Dict[str, List[Node]]:
        out: Dict[str, List[Node]] = {}
        for n in self.nodes:
            for i in n.inputs:
                out.setdefault(i, []).append(n)
        return out

    def ops_used(self) -> Dict[str, int]:
        counts: Dict[str, int] = {}
        for n in self.nodes:
            counts[n.op] = counts.get(n.op, 0) + 1
        return counts

    def validate(self, params: Optional[Dict[str, np.ndarray]] = None) -> None:
        """Every value is defined before use and typed; raises ValueError naming the first problem."""
        defined = set(self.inputs) | set(params or {})
        for n in self.nodes:
            for i in n.inputs:
                if i not in defined:
                    raise ValueError("node %s (%s) uses %r before it is defined" % (n.name, n.op, i))
            for o in n.outputs:
                if o not in self.types:
                    raise ValueError("node %s (%s) output %r has no type" % (n.name, n.op, o))
                defined.add(o)
        for o in self.outputs:
            if o not in defined:
                raise ValueError("graph output %r is never produced" % o)

    def __str__(self) -> str:
        lines = ["graph %s(%s) {" % (self.name, ", ".join("%%%s: %s" % (i, self.types[i]) for i in self.inputs))]
        for n in self.nodes:
            lines.append("  " + format_node(n, self.types))
        lines.append("  return " + ", ".join("%" + o for o in self.outputs))
        lines.append("}")
        return "\n".join(lines)


def body_inputs(body: List[Node]) -> List[str]:
    """The values a fused body reads from outside it, in order of first use (its ``params``)."""
    internal = {o for b in body for o in b.outputs}
    ext: List[str] = []
    for b in body:
        for i in b.inputs:
            if i not in internal and i not in ext:
                ext.append(i)
    return ext


def fused_node(name: str, body: List[Node]) -> Node:
    """One ``fused`` node running ``body`` (its last member's outputs are the results)."""
    ext = body_inputs(body)
    results = list(body[-1].outputs)
    return Node("fused", name, ext, results, {"body": list(body), "params": list(ext), "results": list(results)})


def unique_name(base: str, taken: Iterable[str]) -> str:
    if not isinstance(taken, (set, frozenset, dict)):   # (membership tests only: no copy of a big set per call)
        taken = set(taken)
    if base not in taken:
        return base
    i = 1
    while "%s_%d" % (base, i) in taken:
        i += 1
    return "%s_%d" % (base, i)
