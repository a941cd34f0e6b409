"""Activation functions (elementwise; inlined into their consumer or producer by the default schedules)."""
from __future__ import annotations

import math

from tether import te

from . import common as c


def _unary(x, fn, name: str):
    return c.compute(x.shape, lambda *idx: fn(x[idx]), name, c.ELEMWISE)


def relu(x, name: str = "relu"):
    zero = c.const(0.0, x.dtype)
    return _unary(x, lambda v: c.max2(v, zero), name)


def clip(x, lo: float, hi: float, name: str = "clip"):
    lo_c, hi_c = c.const(lo, x.dtype), c.const(hi, x.dtype)
    return _unary(x, lambda v: c.min2(c.max2(v, lo_c), hi_c), name)


def relu6(x, name: str = "relu6"):
    return clip(x, 0.0, 6.0, name)


def leaky_relu(x, alpha: float = 0.01, name: str = "leaky_relu"):
    zero, a = c.const(0.0, x.dtype), c.const(alpha, x.dtype)
    return _unary(x, lambda v: te.if_then_else(v > zero, v, v * a), name)


def hard_sigmoid(x, alpha: float = 0.2, beta: float = 0.5, name: str = "hard_sigmoid"):
    """max(0, min(1, alpha*x + beta)); ONNX defaults (PyTorch's is alpha=1/6)."""
    a, b = c.const(alpha, x.dtype), c.const(beta, x.dtype)
    zero, one = c.const(0.0, x.dtype), c.const(1.0, x.dtype)
    return _unary(x, lambda v: c.min2(c.max2(v * a + b, zero), one), name)


def hard_swish(x, name: str = "hard_swish"):
    """x * relu6(x + 3) / 6 (ONNX HardSwish, PyTorch hardswish)."""
    three, sixth = c.const(3.0, x.dtype), c.const(1.0 / 6.0, x.dtype)
    zero, six = c.const(0.0, x.dtype), c.const(6.0, x.dtype)
    return _unary(x, lambda v: v * c.min2(c.max2(v + three, zero), six) * sixth, name)


def sigmoid(x, name: str = "sigmoid"):
    return _unary(x, lambda v: te.sigmoid(v), name)


def tanh(x, name: str = "tanh"):
    return _unary(x, lambda v: te.tanh(v), name)


def gelu(x, name: str = "gelu"):
    """Exact (erf) form: 0.5 * x * (1 + erf(x / sqrt(2)))."""
    half, one = c.const(0.5, x.dtype), c.const(1.0, x.dtype)
    inv_sqrt2 = c.const(1.0 / math.sqrt(2.0), x.dtype)
    return _unary(x, lambda v: half * v * (one + te.erf(v * inv_sqrt2)), name)
