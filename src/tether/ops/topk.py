"""The positions of the k largest (or smallest) elements along an axis, in order (ONNX TopK with a constant k).

Two reduce stages and no sort: rank[i] = how many elements beat x[i] (greater, or equal at a lower index: ties
go to the lower index, as onnxruntime orders them), then out[r] = the position whose rank is r. O(n**2) work along
the axis, fine for the short axes TopK sees in models (class scores, beam candidates). The values are a
gather_elements of these positions."""
from __future__ import annotations

from tether import te

from . import common as c


def topk_indices(x, k: int, axis: int, largest: bool = True, name: str = "topk"):
    shape = c.shape_of(x)
    axis = c.normalize_axes(axis, len(shape))[0]
    n = shape[axis]
    if not 1 <= k <= n:
        raise ValueError("topk: k=%d for an axis of %d" % (k, n))
    j = te.reduce_axis((0, n), name="j")

    def rank_f(*idx):
        other = tuple(j if d == axis else v for d, v in enumerate(idx))
        xi, xj = x[idx], x[other]
        beats = (xj > xi) if largest else (xj < xi)
        tie = (xj == xi) & (j < idx[axis])
        return te.sum(te.if_then_else(beats | tie, c.const(1, "int32"), c.const(0, "int32")), axis=j)
    rank = c.compute(shape, rank_f, name + "_rank", c.REDUCE)
    m = te.reduce_axis((0, n), name="m")

    def pick(*idx):
        src = tuple(m if d == axis else v for d, v in enumerate(idx))
        hit = rank[src] == te.cast(idx[axis], "int32")
        return te.sum(te.if_then_else(hit, te.cast(m, "int64"), c.const(0, "int64")), axis=m)
    out_shape = tuple(k if d == axis else e for d, e in enumerate(shape))
    return c.compute(out_shape, pick, name, c.REDUCE)
