"""Cumulative sums and products along one axis (ONNX CumSum, CumProd), inclusive or exclusive, forward or
reversed. Written as a masked reduction: out[..i..] = reduce over k of (k before-or-at i ? x[..k..] : identity),
so it is one ordinary reduce stage (the default reduce schedule), at O(n**2) work along the axis; the forward
inclusive sum adds in the same order as a running sum."""
from __future__ import annotations

from tether import te

from . import common as c


def cumulative(x, axis: int, kind: str = "sum", exclusive: bool = False, reverse: bool = False,
               name: str = "cumulative"):
    if kind not in ("sum", "prod"):
        raise ValueError("cumulative: kind %r (sum or prod)" % kind)
    shape = c.shape_of(x)
    axis = c.normalize_axes(axis, len(shape))[0]
    k = te.reduce_axis((0, shape[axis]), name="k")
    reducer = te.sum if kind == "sum" else te.prod
    identity = c.const(0 if kind == "sum" else 1, x.dtype)

    def f(*idx):
        i = idx[axis]
        src = tuple(k if d == axis else v for d, v in enumerate(idx))
        if reverse:
            take = (k > i) if exclusive else (k >= i)
        else:
            take = (k < i) if exclusive else (k <= i)
        return reducer(te.if_then_else(take, x[src], identity), axis=k)
    return c.compute(shape, f, name, c.REDUCE)
