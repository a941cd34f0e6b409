"""Reductions over axes (sum, mean, max, min with keepdims) and the softmax family."""
from __future__ import annotations

from typing import Callable

from tether import te

from . import common as c

_REDUCERS: dict[str, Callable] = {"sum": te.sum, "max": te.max, "min": te.min}


def _keep_index(idx, shape, axes, keepdims: bool, raxes):
    """The input index of output index `idx` with reduction variables `raxes` on `axes`."""
    it, r = iter(idx), iter(raxes)
    full = []
    for d in range(len(shape)):
        if d in axes:
            if keepdims:
                next(it)
            full.append(next(r))
        else:
            full.append(next(it))
    return tuple(full)


def _reduce(kind: str, x, axis, keepdims: bool, name: str, scale: float | None = None):
    shape = c.shape_of(x)
    axes = c.normalize_axes(axis, len(shape))
    raxes = [te.reduce_axis((0, shape[a]), name=f"k{a}") for a in axes]
    out_shape = tuple(1 if d in axes else e for d, e in enumerate(shape)) if keepdims else \
        tuple(e for d, e in enumerate(shape) if d not in axes)
    reducer = _REDUCERS[kind]
    scale_c = c.const(scale, x.dtype) if scale is not None else None

    def f(*idx):
        v = x[_keep_index(idx, shape, axes, keepdims, raxes)]
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


# Below this, exp(d) is under float32's smallest normal number (1.18e-38, exp(-87.34)). A subnormal result costs a
# microcode assist of ~100+ cycles on x86 in every multiply and divide that touches it: a masked attention row
# (scores of -1e4) ran its softmax at 33 ns per element instead of 0.7. Such terms are flushed to zero: a change
# of under 1.6e-38 in a softmax value, as flush-to-zero arithmetic would make it.
EXP_FLUSH_BELOW = -87.0


def _exp_or_zero(d):
    lo = c.const(EXP_FLUSH_BELOW, d.dtype)
    return te.if_then_else(d < lo, c.const(0.0, d.dtype), te.exp(te.max(d, lo)))


def _row_stats(x, axis: int, name: str):
    """(max over `axis` keeping dims, exp(x - max) materialized, sum of that exp keeping dims)."""
    shape = c.shape_of(x)
    ax = c.normalize_axes(axis, len(shape))[0]
    mx = _reduce("max", x, ax, True, f"{name}_max")
    ex = c.compute(shape, lambda *i: _exp_or_zero(x[i] - mx[i[:ax] + (0,) + i[ax + 1:]]), f"{name}_exp",
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


# ---------------------------------------------------------------- ONNX Reduce* kinds and arg-reductions
def _out_shape(shape, axes, keepdims: bool) -> tuple:
    return tuple(1 if d in axes else e for d, e in enumerate(shape)) if keepdims else \
        tuple(e for d, e in enumerate(shape) if d not in axes)


def _reduce_expr(kind: str, x, axes, keepdims: bool, name: str, pre=None):
    """A single reduce stage `kind` (sum/max/min/prod) over `axes` of pre(x[...]) (pre: per-element transform)."""
    shape = c.shape_of(x)
    raxes = [te.reduce_axis((0, shape[a]), name=f"k{a}") for a in axes]
    reducer = {"sum": te.sum, "max": te.max, "min": te.min, "prod": te.prod}[kind]

    def f(*idx):
        v = x[_keep_index(idx, shape, axes, keepdims, raxes)]
        return reducer(pre(v) if pre is not None else v, axis=raxes)
    return c.compute(_out_shape(shape, axes, keepdims), f, name, c.REDUCE)


REDUCE_KINDS = ("sum", "mean", "max", "min", "prod", "l1", "l2", "sum_square", "log_sum", "log_sum_exp")


def reduce(x, kind: str, axis=None, keepdims: bool = False, name: str = "reduce"):
    """The ONNX Reduce* family: `kind` in REDUCE_KINDS over `axis` (None: all; () : no axis, which leaves the
    per-element transform of the kind: |x| for l1, x*x for sum_square, log(x) for log_sum, ...)."""
    shape = c.shape_of(x)
    axes = () if axis == () else c.normalize_axes(axis, len(shape))
    dt = x.dtype
    if kind not in REDUCE_KINDS:
        raise ValueError(f"reduce: unknown kind {kind!r} (one of {REDUCE_KINDS})")
    if not axes:
        per = {"l1": lambda v: te.abs(v), "l2": lambda v: te.abs(v), "sum_square": lambda v: v * v,
               "log_sum": lambda v: te.log(v)}.get(kind, lambda v: v)
        return c.compute(shape, lambda *i: per(x[i]), name, c.ELEMWISE)
    if dt == "bool" and kind in ("max", "min"):
        # te reduces booleans as int32 (any / all): reduce, then narrow back
        r = _reduce_expr(kind, x, axes, keepdims, f"{name}_int")
        return c.compute(c.shape_of(r), lambda *i: te.cast(r[i], "bool"), name, c.ELEMWISE)
    if kind in ("sum", "max", "min", "prod"):
        return _reduce_expr(kind, x, axes, keepdims, name)
    if kind == "mean":
        count = 1
        for a in axes:
            count *= shape[a]
        inv = c.const(1.0 / count, dt)
        return _reduce_expr("sum", x, axes, keepdims, name, pre=lambda v: v * inv)
    if kind == "l1":
        return _reduce_expr("sum", x, axes, keepdims, name, pre=lambda v: te.abs(v))
    if kind == "sum_square":
        return _reduce_expr("sum", x, axes, keepdims, name, pre=lambda v: v * v)
    if kind == "l2":
        s = _reduce_expr("sum", x, axes, keepdims, f"{name}_sumsq", pre=lambda v: v * v)
        return c.compute(c.shape_of(s), lambda *i: te.sqrt(s[i]), name, c.ELEMWISE)
    if kind == "log_sum":
        s = _reduce_expr("sum", x, axes, keepdims, f"{name}_sum")
        return c.compute(c.shape_of(s), lambda *i: te.log(s[i]), name, c.ELEMWISE)
    # log_sum_exp: max-shifted so large inputs do not overflow exp
    mx = _reduce_expr("max", x, axes, True, f"{name}_max")
    raxes = [te.reduce_axis((0, shape[a]), name=f"k{a}") for a in axes]

    def f(*idx):
        full = _keep_index(idx, shape, axes, keepdims, raxes)
        m = mx[tuple(0 if d in axes else full[d] for d in range(len(shape)))]
        return te.sum(te.exp(x[full] - m), axis=raxes)
    s = c.compute(_out_shape(shape, axes, keepdims), f, f"{name}_sumexp", c.REDUCE)

    def g(*idx):
        it = iter(idx)
        m_idx = tuple(0 if d in axes else idx[d] for d in range(len(shape))) if keepdims else \
            tuple(0 if d in axes else next(it) for d in range(len(shape)))
        return te.log(s[idx]) + mx[m_idx]
    return c.compute(c.shape_of(s), g, name, c.BROADCAST)


def arg_reduce(x, kind: str, axis: int, keepdims: bool = True, select_last_index: bool = False,
               name: str = "arg_reduce"):
    """ONNX ArgMax/ArgMin along `axis` as int64: the first (or last) index holding the max (min). Two stages:
    the extreme value, then the min (max) index where the input equals it."""
    shape = c.shape_of(x)
    ax = c.normalize_axes(axis, len(shape))[0]
    ext = _reduce_expr("max" if kind == "max" else "min", x, (ax,), True, f"{name}_value")
    n = shape[ax]
    k = te.reduce_axis((0, n), name="k")

    def f(*idx):
        full = _keep_index(idx, shape, (ax,), keepdims, [k])
        e_idx = tuple(0 if d == ax else full[d] for d in range(len(shape)))
        kk = te.cast(k, "int64")
        hit = x[full] == ext[e_idx]
        if select_last_index:
            return te.max(te.if_then_else(hit, kk, c.const(-1, "int64")), axis=k)
        return te.min(te.if_then_else(hit, kk, c.const(n, "int64")), axis=k)
    return c.compute(_out_shape(shape, (ax,), keepdims), f, name, c.REDUCE)
