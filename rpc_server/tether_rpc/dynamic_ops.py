"""numpy ops on values whose shape is known only at run time (the outputs of NonZero, Compress, Unique, ...): the
common post-processing of such values (casts, layout changes, slicing, indexing, elementwise arithmetic and
comparisons, reductions), which no static-shape kernel can run. ``numpy_ops.OPS`` holds them; bindings/js runs
the same ops (numpy_ops.js) with the same results, bit for bit.

Values are computed the way both runtimes can agree on: floats in float64, rounded once to the output dtype
(exact for + - * / and sqrt, whose float64 result rounds to the float32 one), integers in their own width
(wrapping), sums accumulated in order. bfloat16 arrives as its uint16 bit patterns (the device has no bfloat16
dtype), so an op that reads values is told the dtype (attr ``dtype``). Device code: stdlib + numpy 1.19,
Python 3.9.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .dtypes import bfloat16_bits, bfloat16_to_float32, storage_of

FLOAT_NAMES = ("float16", "bfloat16", "float32", "float64")


def _values(x: np.ndarray, dtype: str) -> np.ndarray:
    """The elements as numbers to compute with: floats as float64, integers and bool as they are."""
    if dtype == "bfloat16":
        return bfloat16_to_float32(storage_of(np.asarray(x))).astype(np.float64)
    if dtype in FLOAT_NAMES:
        return np.asarray(x, dtype=np.float64)
    return np.asarray(x)


def _store(v: np.ndarray, dtype: str) -> np.ndarray:
    """Computed values as the storage of ``dtype`` (floats rounded once, integers wrapped)."""
    if dtype == "bfloat16":
        return bfloat16_bits(v)
    return np.asarray(v).astype(dtype)


def _c(x: np.ndarray) -> np.ndarray:
    # C order without np.ascontiguousarray, which makes a 0-d array 1-d
    return np.asarray(x, order="C")


# ------------------------------------------------------------------------------------------ casts
def dyn_cast(attrs: Dict[str, Any], x: np.ndarray) -> List[np.ndarray]:
    """ONNX Cast (also Identity: ``from`` == ``to``); bfloat16 goes through float32 as onnxruntime's."""
    src, to = attrs["from"], attrs["to"]
    if src == to:
        return [np.array(x)]
    v = bfloat16_to_float32(storage_of(np.asarray(x))) if src == "bfloat16" else np.asarray(x)
    if to == "bfloat16":
        return [bfloat16_bits(v.astype(np.float32))]
    return [v.astype(to)]


# ------------------------------------------------------------------------------------------ layout
def _norm(axis: int, ndim: int, what: str) -> int:
    a = int(axis)
    if not -ndim <= a < ndim:
        raise ValueError("%s axis %d is out of range for a tensor of rank %d" % (what, a, ndim))
    return a + ndim if a < 0 else a


def dyn_transpose(attrs: Dict[str, Any], x: np.ndarray) -> List[np.ndarray]:
    return [_c(np.transpose(x, [int(p) for p in attrs["perm"]]))]


def reshape_target(mode: str, attrs: Dict[str, Any], shape: Sequence[int]) -> Tuple[int, ...]:
    """The output shape of a reshape-like op on an input of ``shape`` (ONNX Reshape with allowzero 0, Flatten,
    Squeeze and Unsqueeze with their axes); ValueError where the input does not fit."""
    shape = [int(d) for d in shape]
    if mode == "reshape":
        out = [shape[i] if int(d) == 0 and i < len(shape) else int(d) for i, d in enumerate(attrs["shape"])]
        if -1 in out:
            known = 1
            for d in out:
                if d != -1:
                    known *= d
            total = int(np.prod(shape, dtype=np.int64))
            if known == 0 or total % known:
                raise ValueError("Reshape of a %s tensor to %s" % (tuple(shape), list(attrs["shape"])))
            out[out.index(-1)] = total // known
        return tuple(out)
    if mode == "flatten":
        axis = int(attrs["axis"])
        return (int(np.prod(shape[:axis], dtype=np.int64)), int(np.prod(shape[axis:], dtype=np.int64)))
    if mode == "squeeze":
        axes = [int(a) for a in attrs["axes"]]
        for a in axes:
            if shape[a] != 1:
                raise ValueError("Squeeze of axis %d, of size %d (1 expected)" % (a, shape[a]))
        return tuple(d for i, d in enumerate(shape) if i not in axes)
    if mode == "unsqueeze":
        out = list(shape)
        for a in sorted(int(a) for a in attrs["axes"]):
            out.insert(a, 1)
        return tuple(out)
    raise ValueError("reshape mode %.40r (reshape, flatten, squeeze or unsqueeze)" % (mode,))


def dyn_reshape(attrs: Dict[str, Any], x: np.ndarray) -> List[np.ndarray]:
    target = reshape_target(attrs["mode"], attrs, x.shape)
    if int(np.prod(target, dtype=np.int64)) != x.size:
        raise ValueError("Reshape of a %s tensor to %s" % (tuple(x.shape), list(target)))
    return [_c(x).reshape(target)]


def slice_range(start: int, end: int, step: int, dim: int) -> Tuple[int, int, int]:
    """ONNX Slice on an axis of ``dim``: (first index, count, step) after its clamping rules."""
    if step == 0:
        raise ValueError("Slice step 0")
    if start < 0:
        start += dim
    if end < 0:
        end += dim
    if step > 0:
        start, end = min(max(start, 0), dim), min(max(end, 0), dim)
        count = max(0, (end - start + step - 1) // step)
    else:
        start, end = min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)
        count = max(0, (start - end - step - 1) // -step)
    return start, count, step


def dyn_slice(attrs: Dict[str, Any], x: np.ndarray) -> List[np.ndarray]:
    index = [slice(None)] * x.ndim
    for s, e, a, st in zip(attrs["starts"], attrs["ends"], attrs["axes"], attrs["steps"]):
        first, count, step = slice_range(int(s), int(e), int(st), x.shape[int(a)])
        index[int(a)] = first + step * np.arange(count, dtype=np.int64)
    out = x
    for a, ix in enumerate(index):
        if not isinstance(ix, slice):
            out = np.take(out, ix, axis=a)
    return [_c(out)]


def dyn_concat(attrs: Dict[str, Any], *xs: np.ndarray) -> List[np.ndarray]:
    axis = int(attrs["axis"])
    first = xs[0]
    for x in xs[1:]:
        if x.ndim != first.ndim or any(a != b for k, (a, b) in enumerate(zip(x.shape, first.shape)) if k != axis):
            raise ValueError("Concat on axis %d of shapes %s and %s" % (axis, tuple(first.shape), tuple(x.shape)))
    return [np.concatenate(xs, axis=axis)]


def dyn_shape(attrs: Dict[str, Any], x: np.ndarray) -> List[np.ndarray]:
    """ONNX Shape (``start``/``end`` already clamped to the rank) or, with ``size``, Size: as int64."""
    if attrs.get("size"):
        return [np.array(x.size, dtype=np.int64)]
    return [np.array(x.shape, dtype=np.int64)[int(attrs["start"]):int(attrs["end"])]]


# ------------------------------------------------------------------------------------------ indexing
def _indices(idx: np.ndarray, dim: int, what: str) -> np.ndarray:
    """ONNX indices (negative counts from the end) as indices into an axis of ``dim``; ValueError if out of range."""
    i = np.asarray(idx).astype(np.int64)
    bad = (i < -dim) | (i >= dim)
    if bad.any():
        raise ValueError("%s index %d is out of range for an axis of %d" % (what, int(i[bad].reshape(-1)[0]), dim))
    return np.where(i < 0, i + dim, i)


def dyn_gather(attrs: Dict[str, Any], x: np.ndarray, idx: np.ndarray) -> List[np.ndarray]:
    axis = int(attrs["axis"])
    return [_c(np.take(x, _indices(idx, x.shape[axis], "Gather"), axis=axis))]


def dyn_gather_nd(attrs: Dict[str, Any], x: np.ndarray, idx: np.ndarray) -> List[np.ndarray]:
    """GatherND with batch_dims 0: each row of the last indices axis picks a slice of ``x``."""
    k = idx.shape[-1] if idx.ndim else 0
    if idx.ndim == 0 or k > x.ndim:
        raise ValueError("GatherND indices of shape %s into a rank-%d tensor" % (tuple(idx.shape), x.ndim))
    rows = np.asarray(idx).reshape(-1, k)
    picks = tuple(_indices(rows[:, d], x.shape[d], "GatherND") for d in range(k))
    out = x[picks] if k else np.broadcast_to(x, (rows.shape[0],) + x.shape)
    return [_c(out).reshape(tuple(idx.shape[:-1]) + tuple(x.shape[k:]))]


def dyn_where(attrs: Dict[str, Any], cond: np.ndarray, x: np.ndarray, y: np.ndarray) -> List[np.ndarray]:
    return [np.where(np.asarray(cond).astype(bool), x, y)]


# ------------------------------------------------------------------------------------------ elementwise
def _trunc_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if (np.asarray(b) == 0).any():
        raise ValueError("Div: integer division by zero")
    q = a // b
    # numpy floors; ONNX (C) truncates toward zero
    return np.where(((a % b) != 0) & ((a < 0) != (b < 0)), q + 1, q)


def _maximum(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.where((a >= b) | (a != a), a, b)


def _minimum(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.where((a <= b) | (a != a), a, b)


#: op -> (function of the two value arrays, whether the result is bool)
BINARY: Dict[str, Tuple[Callable[[np.ndarray, np.ndarray], np.ndarray], bool]] = {
    "add": (lambda a, b: a + b, False), "sub": (lambda a, b: a - b, False), "mul": (lambda a, b: a * b, False),
    "div": (lambda a, b: a / b, False), "max": (_maximum, False), "min": (_minimum, False),
    "equal": (lambda a, b: a == b, True), "greater": (lambda a, b: a > b, True),
    "greater_equal": (lambda a, b: a >= b, True), "less": (lambda a, b: a < b, True),
    "less_equal": (lambda a, b: a <= b, True), "and": (lambda a, b: a & b, True), "or": (lambda a, b: a | b, True),
    "xor": (lambda a, b: a ^ b, True),
}


def dyn_binary(attrs: Dict[str, Any], a: np.ndarray, b: np.ndarray) -> List[np.ndarray]:
    op, dtype = attrs["op"], attrs["dtype"]
    if op not in BINARY:
        raise ValueError("binary op %.40r (%s)" % (op, ", ".join(sorted(BINARY))))
    fn, boolean = BINARY[op]
    va, vb = _values(a, dtype), _values(b, dtype)
    np.broadcast(va, vb)        # a one-line error for shapes that do not broadcast
    if op == "div" and dtype not in FLOAT_NAMES:
        r = _trunc_div(va, vb)
    else:
        with np.errstate(all="ignore"):
            r = fn(va, vb)
    return [np.asarray(r, dtype=bool) if boolean else _store(r, dtype)]


def _sigmoid(v: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-v))


UNARY: Dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "neg": lambda v: -v, "abs": np.abs, "not": np.logical_not, "sqrt": np.sqrt, "exp": np.exp, "log": np.log,
    "sigmoid": _sigmoid, "relu": lambda v: np.where(v < 0, np.zeros_like(v), v), "floor": np.floor,
    "ceil": np.ceil,
}


def dyn_unary(attrs: Dict[str, Any], x: np.ndarray) -> List[np.ndarray]:
    op, dtype = attrs["op"], attrs["dtype"]
    if op not in UNARY:
        raise ValueError("unary op %.40r (%s)" % (op, ", ".join(sorted(UNARY))))
    with np.errstate(all="ignore"):
        r = UNARY[op](_values(x, dtype))
    return [_store(r, dtype)]


# ------------------------------------------------------------------------------------------ reductions
def dyn_reduce(attrs: Dict[str, Any], x: np.ndarray) -> List[np.ndarray]:
    """ReduceMax/Min/Sum/Mean over ``axes`` (None: all); sums accumulate element by element in index order."""
    op, dtype = attrs["op"], attrs["dtype"]
    axes: Optional[List[int]] = attrs.get("axes")
    keep = bool(attrs.get("keepdims", 1))
    v = _values(x, dtype)
    red = sorted(range(v.ndim) if axes is None else [int(a) for a in axes])
    rest = [d for d in range(v.ndim) if d not in red]
    n = 1
    for d in red:
        n *= v.shape[d]
    cols = np.transpose(v, rest + red).reshape(-1, n)
    if op in ("max", "min"):
        if n == 0:
            raise ValueError("Reduce%s over an empty axis" % op.capitalize())
        acc = cols[:, 0].copy()
        pick = _maximum if op == "max" else _minimum
        for j in range(1, n):
            acc = pick(acc, cols[:, j])
    elif op in ("sum", "mean"):
        acc = np.zeros(cols.shape[0], dtype=cols.dtype if dtype not in FLOAT_NAMES else np.float64)
        with np.errstate(all="ignore"):
            for j in range(n):
                acc = acc + cols[:, j]
            if op == "mean":
                acc = acc / n if n else acc * np.nan
    else:
        raise ValueError("reduce op %.40r (max, min, sum, mean)" % (op,))
    shape = [1 if d in red else v.shape[d] for d in range(v.ndim)] if keep else [v.shape[d] for d in rest]
    return [_store(acc.reshape(shape), dtype)]


OPS: Dict[str, Callable[..., List[np.ndarray]]] = {
    "dyn_cast": dyn_cast, "dyn_transpose": dyn_transpose, "dyn_reshape": dyn_reshape, "dyn_slice": dyn_slice,
    "dyn_concat": dyn_concat, "dyn_shape": dyn_shape, "dyn_gather": dyn_gather, "dyn_gather_nd": dyn_gather_nd,
    "dyn_where": dyn_where, "dyn_binary": dyn_binary, "dyn_unary": dyn_unary, "dyn_reduce": dyn_reduce,
}
