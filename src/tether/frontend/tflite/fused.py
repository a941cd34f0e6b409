"""Fused activations (ActivationFunctionType in schema.fbs), applied after the op that carries them.

LiteRT's float kernels turn a fused activation into an output clamp range (CalculateActivationRange): RELU,
RELU_N1_TO_1 and RELU6 clamp; TANH and SIGN_BIT give the unbounded range, so a convolution, pool or add that
names them computes no activation at all (and FULLY_CONNECTED refuses them). Models run as LiteRT runs them.
"""
from __future__ import annotations

import numpy as np

from tether.errors import UnsupportedOpError

NONE, RELU, RELU_N1_TO_1, RELU6, TANH, SIGN_BIT = range(6)


def clip(ctx, value: str, lo: float, hi: float) -> str:
    return ctx.emit1("Clip", [value, ctx.add_const(np.array(lo, np.float32), "clip_min"),
                              ctx.add_const(np.array(hi, np.float32), "clip_max")])


def apply(ctx, value: str, code: int) -> str:
    """``value`` with the fused activation ``code`` applied (the same value for NONE)."""
    code = int(code or 0)
    if code == NONE:
        return value
    if code == RELU:
        return ctx.emit1("Relu", [value])
    if code == RELU_N1_TO_1:
        return clip(ctx, value, -1.0, 1.0)
    if code == RELU6:
        return clip(ctx, value, 0.0, 6.0)
    if code in (TANH, SIGN_BIT):
        return value            # LiteRT's clamp range for these is unbounded: nothing applied
    raise UnsupportedOpError("%s: fused activation %d is not one schema.fbs defines" % (ctx.where(), code))


def apply_from(ctx, value: str) -> str:
    """``value`` with the current op's ``fused_activation_function`` applied."""
    return apply(ctx, value, ctx.op.options.get("fused_activation_function", NONE))
