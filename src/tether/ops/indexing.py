"""Index-driven ops (ONNX Gather, GatherElements, GatherND, OneHot, Trilu): the index comes from a tensor read at
run time (or the output position, for Trilu). Out-of-range indices are clamped into the data, so a bad index
reads a wrong element instead of faulting; onnxruntime rejects them, the result is undefined either way."""
from __future__ import annotations

from typing import Sequence

from tether import te

from . import common as c


def _wrap(j, n: int):
    """ONNX's negative indices count from the end; then clamped into [0, n)."""
    j = te.cast(j, "int64")
    j = te.if_then_else(j < c.const(0, "int64"), j + c.const(n, "int64"), j)
    return te.max(te.min(j, c.const(n - 1, "int64")), c.const(0, "int64"))


def gather(data, indices, axis: int, out_shape: Sequence[int], name: str = "gather"):
    """out[a..., i..., b...] = data[a..., indices[i...], b...]; `out_shape` (data.shape[:axis] + indices' graph
    shape + data.shape[axis+1:]) tells the index rank, since a rank-0 index tensor arrives as shape (1,)."""
    dshape = c.shape_of(data)
    r = len(out_shape) - len(dshape) + 1
    n = dshape[axis]

    def f(*o):
        ii = tuple(o[axis:axis + r]) if r else (0,)
        j = _wrap(indices[ii], n)
        return data[tuple(o[:axis]) + (j,) + tuple(o[axis + r:])]
    return c.compute(tuple(out_shape), f, name, c.INJECTIVE)


def gather_elements(data, indices, axis: int, name: str = "gather_elements"):
    n = c.shape_of(data)[axis]

    def f(*o):
        return data[tuple(o[:axis]) + (_wrap(indices[o], n),) + tuple(o[axis + 1:])]
    return c.compute(c.shape_of(indices), f, name, c.INJECTIVE)


def gather_nd(data, indices, batch_dims: int, out_shape: Sequence[int], name: str = "gather_nd"):
    dshape, ishape = c.shape_of(data), c.shape_of(indices)
    k = ishape[-1]
    r = len(ishape) - 1     # leading index dims (the first batch_dims of them shared with data)

    def f(*o):
        lead = tuple(o[:r])
        src = tuple(o[:batch_dims]) + tuple(_wrap(indices[lead + (t,)], dshape[batch_dims + t]) for t in range(k))
        return data[src + tuple(o[r:])]
    return c.compute(tuple(out_shape), f, name, c.INJECTIVE)


def one_hot(indices, values, depth: int, axis: int, out_shape: Sequence[int], name: str = "one_hot"):
    """out[..., d, ...] = values[1] if indices[...] (negative counting from depth) == d else values[0]."""

    def f(*o):
        rest = tuple(o[:axis]) + tuple(o[axis + 1:])
        j = te.cast(indices[rest if rest else (0,)], "int64")
        j = te.if_then_else(j < c.const(0, "int64"), j + c.const(depth, "int64"), j)
        return te.if_then_else(j == te.cast(o[axis], "int64"), values[1], values[0])
    return c.compute(tuple(out_shape), f, name, c.INJECTIVE)


def trilu(x, k: int, upper: bool, name: str = "trilu"):
    """Keep the elements on and above (upper) or on and below the k-th diagonal of the last two axes."""
    shape = c.shape_of(x)
    zero = c.const(0, x.dtype)

    def f(*o):
        i, j = o[-2], o[-1]
        keep = (j - i >= k) if upper else (j - i <= k)
        return te.if_then_else(keep, x[o], zero)
    return c.compute(shape, f, name, c.INJECTIVE)
