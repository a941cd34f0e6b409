"""The graph ops that compute on data-dependent values (tether_rpc/dynamic_ops.py): run as numpy on the device, as
the values' shapes are known only at run time. Their types are bounds: each output's shape is the largest the
op can give for inputs within their bounds (numpy_ops.bind_node refuses a result beyond it at run time, so a
bound must never be too small, and a loose one only costs memory).

``dyn_cast`` (from, to), ``dyn_transpose`` (perm), ``dyn_reshape`` (mode reshape/flatten/squeeze/unsqueeze with
shape, axis or axes), ``dyn_slice`` (starts, ends, axes, steps), ``dyn_concat`` (axis), ``dyn_shape`` (start and
end, or size: Shape and Size, whose values alone are data-dependent), ``dyn_gather`` (axis), ``dyn_gather_nd``,
``dyn_where``, ``dyn_binary`` (op, dtype), ``dyn_unary`` (op, dtype), ``dyn_reduce`` (op, axes or None, keepdims,
dtype); axes are normalized to be non-negative.
"""
from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

import numpy as np

from tether.graph.ir import TensorType
from tether.kernels.registry import DeviceNumpy, OpDef, Strategy


def _prod(dims: Sequence[int]) -> int:
    return int(np.prod([int(d) for d in dims], dtype=np.int64)) if len(dims) else 1


def broadcast_bound(*shapes: Sequence[int]) -> Tuple[int, ...]:
    """The bound of a broadcast of values within these bounds: per axis the largest (a real extent broadcasts to
    at most the largest real extent, and a bound of 1 may stand for a real 0 that meets a real 5)."""
    rank = max(len(s) for s in shapes)
    padded = [(1,) * (rank - len(s)) + tuple(s) for s in shapes]
    return tuple(max(int(s[k]) for s in padded) for k in range(rank))


def _reshape_bound(attrs, x: TensorType) -> Tuple[int, ...]:
    mode, b = attrs["mode"], list(x.shape)
    if mode == "flatten":
        axis = int(attrs["axis"])
        return (_prod(b[:axis]), _prod(b[axis:]))
    if mode == "squeeze":
        return tuple(d for i, d in enumerate(b) if i not in attrs["axes"])
    if mode == "unsqueeze":
        for a in sorted(attrs["axes"]):
            b.insert(a, 1)
        return tuple(b)
    target = [int(d) for d in attrs["shape"]]
    copied = [i for i, d in enumerate(target) if d == 0]
    out = [b[i] if d == 0 else d for i, d in enumerate(target)]
    if -1 in out:
        # the -1 extent is the size over the other extents: with the copied ones (the input's own) divided
        # out, what remains is at most the product of the input's other bounds
        known = _prod([d for d in target if d not in (0, -1)])
        rest = _prod([d for i, d in enumerate(b) if i not in copied])
        out[out.index(-1)] = rest // known if known else 0
    return tuple(out)


def _slice_count(start: int, end: int, step: int, dim: int) -> int:
    from tether_rpc.dynamic_ops import slice_range
    return slice_range(start, end, step, dim)[1]


def slice_bound(start: int, end: int, step: int, bound: int) -> int:
    """The most elements a slice takes from an axis of any extent up to ``bound``."""
    if (start >= 0 and end >= 0) or (start < 0 and end < 0 and step > 0):
        # the count never falls as the axis grows (with a negative step from the end, clamping makes it fall)
        return _slice_count(start, end, step, bound)
    if bound <= 4096:
        return max(_slice_count(start, end, step, d) for d in range(bound + 1))
    return bound


def _slice_infer(attrs, x):
    out = list(x.shape)
    for s, e, a, st in zip(attrs["starts"], attrs["ends"], attrs["axes"], attrs["steps"]):
        out[int(a)] = slice_bound(int(s), int(e), int(st), x.shape[int(a)])
    return [TensorType(tuple(out), x.dtype)]


def _concat_infer(attrs, *xs):
    axis = int(attrs["axis"])
    shape = list(broadcast_bound(*[x.shape for x in xs]))
    shape[axis] = sum(x.shape[axis] for x in xs)
    return [TensorType(tuple(shape), xs[0].dtype)]


def _gather_infer(attrs, x, idx):
    axis = int(attrs["axis"])
    return [TensorType(x.shape[:axis] + idx.shape + x.shape[axis + 1:], x.dtype)]


def _gather_nd_infer(attrs, x, idx):
    k = idx.shape[-1]
    return [TensorType(idx.shape[:-1] + x.shape[k:], x.dtype)]


_COMPARE = ("equal", "greater", "greater_equal", "less", "less_equal", "and", "or", "xor")


def _binary_infer(attrs, a, b):
    return [TensorType(broadcast_bound(a.shape, b.shape), "bool" if attrs["op"] in _COMPARE else a.dtype)]


def _reduce_infer(attrs, x):
    axes = range(len(x.shape)) if attrs.get("axes") is None else attrs["axes"]
    if attrs.get("keepdims", 1):
        shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape))
    else:
        shape = tuple(d for i, d in enumerate(x.shape) if i not in axes)
    return [TensorType(shape, x.dtype)]


def _numpy(name: str):
    def ref(attrs, *arrays):
        from tether_rpc import dynamic_ops
        return dynamic_ops.OPS[name](attrs, *arrays)
    return ref


_INFER = {
    "dyn_cast": lambda attrs, x: [TensorType(x.shape, attrs["to"])],
    "dyn_transpose": lambda attrs, x: [TensorType(tuple(x.shape[int(p)] for p in attrs["perm"]), x.dtype)],
    "dyn_reshape": lambda attrs, x: [TensorType(_reshape_bound(attrs, x), x.dtype)],
    "dyn_slice": _slice_infer,
    "dyn_concat": _concat_infer,
    "dyn_shape": lambda attrs, x: [TensorType(() if attrs.get("size") else (attrs["end"] - attrs["start"],),
                                              "int64")],
    "dyn_gather": _gather_infer,
    "dyn_gather_nd": _gather_nd_infer,
    "dyn_where": lambda attrs, c, x, y: [TensorType(broadcast_bound(c.shape, x.shape, y.shape), x.dtype)],
    "dyn_binary": _binary_infer,
    "dyn_unary": lambda attrs, x: [x],
    "dyn_reduce": _reduce_infer,
}

DEFINITIONS: Dict[str, OpDef] = {name: OpDef(name, "numpy", infer, _numpy(name)) for name, infer in _INFER.items()}
CPU_STRATEGIES: Dict[str, Strategy] = {name: DeviceNumpy() for name in DEFINITIONS}
__all__: List[str] = ["DEFINITIONS", "CPU_STRATEGIES", "broadcast_bound", "slice_bound"]
