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
