"""RMS normalization (ONNX RMSNormalization, the LLaMA-style norm): x / sqrt(mean(x * x) + eps) * scale, one
reduction stage and one elementwise stage instead of the five kernels of its ONNX function body."""
from __future__ import annotations

from tether import te

from . import common as c
from .norm import trailing_statistics


def rms_normalize(x, axis: int, epsilon: float = 1e-5, scale=None, name: str = "rms_normalize"):
    """x * rsqrt(mean(x*x over axes [axis, ndim)) + eps) * scale; ``scale`` broadcasts to x (right-aligned)."""
    shape, nd, axis, inv, stat_shape = trailing_statistics(x, axis)
    r = [te.reduce_axis((0, shape[d]), name="r%d" % d) for d in range(axis, nd)]

    def ms_f(*i):
        v = x[tuple(i[:axis]) + tuple(r)]
        return te.sum(v * v * inv, axis=r)
    ms = c.compute(stat_shape, ms_f, name + "_ms", c.REDUCE)
    eps = c.const(epsilon, x.dtype)

    def f(*idx):
        v = x[idx] * te.rsqrt(ms[tuple(idx[:axis]) + (0,) * (nd - axis)] + eps)
        if scale is not None:
            v = v * c.broadcast_load(scale, idx, x.dtype)
        return v
    return c.compute(shape, f, name, c.BROADCAST)
