"""Inference-time normalization."""
from __future__ import annotations

from tether import te

from . import common as c


def batch_norm(x, gamma, beta, mean, var, axis: int = 1, epsilon: float = 1e-5, name: str = "batch_norm"):
    """(x - mean) / sqrt(var + eps) * gamma + beta with per-channel vectors along `axis` (inference mode)."""
    shape = c.shape_of(x)
    axis = c.normalize_axes(axis, len(shape))[0]
    for what, t in (("gamma", gamma), ("beta", beta), ("mean", mean), ("var", var)):
        if c.shape_of(t) != (shape[axis],):
            raise ValueError(f"{name}: {what} must have shape ({shape[axis]},), got {c.shape_of(t)}")
    eps = c.const(epsilon, x.dtype)

    def f(*idx):
        ch = idx[axis]
        return (x[idx] - mean[ch]) * (gamma[ch] * te.rsqrt(var[ch] + eps)) + beta[ch]

    return c.compute(shape, f, name, c.BROADCAST)


# ---------------------------------------------------------------- layer / instance / group normalization
def trailing_statistics(x, axis: int):
    """(shape, rank, axis, 1/count, statistics shape) of statistics over x's axes [axis, ndim)."""
    shape = c.shape_of(x)
    nd = len(shape)
    axis = c.normalize_axes(axis, nd)[0]
    count = 1
    for d in shape[axis:]:
        count *= d
    return shape, nd, axis, c.const(1.0 / count, x.dtype), tuple(shape[:axis]) + (1,) * (nd - axis)


def normalize(x, axis: int, epsilon: float = 1e-5, scale=None, bias=None, name: str = "normalize"):
    """(x - mean) / sqrt(var + eps) * scale + bias, mean and (biased) variance taken over axes [axis, ndim) for
    each index of the leading axes; `scale`/`bias` broadcast to x's shape (numpy rules, right-aligned). ONNX
    LayerNormalization is this directly; Instance- and GroupNormalization are it on a reshaped x."""
    shape, nd, axis, inv, stat_shape = trailing_statistics(x, axis)

    def stat_index(idx):
        return tuple(idx[:axis]) + (0,) * (nd - axis)

    def red_axes(tag):
        return [te.reduce_axis((0, shape[d]), name=f"{tag}{d}") for d in range(axis, nd)]

    rm = red_axes("m")
    mean = c.compute(stat_shape, lambda *i: te.sum(x[tuple(i[:axis]) + tuple(rm)] * inv, axis=rm),
                     f"{name}_mean", c.REDUCE)
    rv = red_axes("v")

    def var_f(*i):
        d = x[tuple(i[:axis]) + tuple(rv)] - mean[i]
        return te.sum(d * d * inv, axis=rv)
    var = c.compute(stat_shape, var_f, f"{name}_var", c.REDUCE)
    eps = c.const(epsilon, x.dtype)

    def f(*idx):
        s = stat_index(idx)
        v = (x[idx] - mean[s]) * te.rsqrt(var[s] + eps)
        if scale is not None:
            v = v * c.broadcast_load(scale, idx, x.dtype)
        if bias is not None:
            v = v + c.broadcast_load(bias, idx, x.dtype)
        return v
    return c.compute(shape, f, name, c.BROADCAST)
