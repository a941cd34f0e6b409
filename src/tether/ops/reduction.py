"""Reductions over axes (sum, mean, max, min with keepdims) and the softmax family."""
from __future__ import annotations

from typing import Callable

from tether import te

from . import common as c

_REDUCERS: dict[str, Callable] = {"sum": te.sum, "max": te.max, "min": te.min}


def _reduce(kind: str, x, axis, keepdims: bool, name: str, scale: float | None = None):
    shape = c.shape_of(x)
    axes = c.normalize_axes(axis, len(shape))
    raxes = [te.reduce_axis((0, shape[a]), name=f"k{a}") for a in axes]
    out_shape = tuple(1 if d in axes else e for d, e in enumerate(shape)) if keepdims else \
        tuple(e for d, e in enumerate(shape) if d not in axes)
    reducer = _REDUCERS[kind]
    scale_c = c.const(scale, x.dtype) if scale is not None else None

    def f(*idx):
        it = iter(idx)
        r = iter(raxes)
        full = []
        for d in range(len(shape)):
            if d in axes:
                if keepdims:
                    next(it)
                full.append(next(r))
            else:
                full.append(next(it))
        v = x[tuple(full)]
        return reducer(v * scale_c if scale_c is not None else v, axis=raxes)

    return c.compute(out_shape, f, name, c.REDUCE)


def sum(x, axis=None, keepdims: bool = False, name: str = "sum"):  # noqa: A001 - numpy's name
    return _reduce("sum", x, axis, keepdims, name)


def max(x, axis=None, keepdims: bool = False, name: str = "max"):  # noqa: A001
    return _reduce("max", x, axis, keepdims, name)


def min(x, axis=None, keepdims: bool = False, name: str = "min"):  # noqa: A001
    return _reduce("min", x, axis, keepdims, name)


def mean(x, axis=None, keepdims: bool = False, name: str = "mean"):
    shape = c.shape_of(x)
    count = 1
    for a in c.normalize_axes(axis, len(shape)):
        count *= shape[a]
    # scaling each term (not the total) keeps mean a single reduce stage
    return _reduce("sum", x, axis, keepdims, name, scale=1.0 / count)


def _row_stats(x, axis: int, name: str):
    """(max over `axis` keeping dims, exp(x - max) materialized, sum of that exp keeping dims)."""
    shape = c.shape_of(x)
    ax = c.normalize_axes(axis, len(shape))[0]
    mx = _reduce("max", x, ax, True, f"{name}_max")
    ex = c.compute(shape, lambda *i: te.exp(x[i] - mx[i[:ax] + (0,) + i[ax + 1:]]), f"{name}_exp",
                   c.SOFTMAX_STAGE)
    sm = _reduce("sum", ex, ax, True, f"{name}_sum")
    return ax, mx, ex, sm


def softmax(x, axis: int = -1, name: str = "softmax"):
    ax, _, ex, sm = _row_stats(x, axis, name)
    return c.compute(c.shape_of(x), lambda *i: ex[i] / sm[i[:ax] + (0,) + i[ax + 1:]], name, c.BROADCAST)


def log_softmax(x, axis: int = -1, name: str = "log_softmax"):
    ax, mx, _, sm = _row_stats(x, axis, name)
    return c.compute(c.shape_of(x),
                     lambda *i: x[i] - mx[i[:ax] + (0,) + i[ax + 1:]] - te.log(sm[i[:ax] + (0,) + i[ax + 1:]]),
                     name, c.BROADCAST)
