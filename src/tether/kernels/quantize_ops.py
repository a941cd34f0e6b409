"""Quantized graph ops (int8 models): ``quantize``, ``requantize`` and ``dequantize``, each elementwise
with its scale and zero point as broadcast inputs: ``DEFINITIONS`` (shape/dtype rule, numpy reference) and
``CPU_STRATEGIES`` (the ``ops.qnn`` kernels), which ``tether.kernels.table`` registers.

- ``quantize(x, scale, zp) {dtype}``: float -> dtype, ``saturate(round_half_even(x / scale) + zp)``;
- ``requantize(acc, multiplier, zp) {dtype}``: int32 -> dtype, ``saturate(round_half_even(acc * multiplier) + zp)``:
  the epilogue of an integer conv/matmul (fused into it like any elementwise op);
- ``dequantize(x, scale, zp)``: integer -> float, ``(int32(x) - zp) * scale``;
- ``qadd(a, b, ra, rb, fixed) {dtype}``: ``saturate(round_half_even(a * ra + (b * rb + fixed)))``, the sum of two
  quantized tensors with ``ra = sa / sc``, ``rb = sb / sc``, ``fixed = zc - (ra * za + rb * zb)`` (MLAS's
  QLinearAdd, its multiply-adds fused where the target has FMA); with ``{shift, zero_point}``, XNNPACK's
  fixed-point sum ``saturate(((a * ra + b * rb + fixed) >> shift) + zero_point)`` in int32 (LiteRT's 8-bit ADD).

Integer convolutions and matrix products are the ordinary ``conv2d``/``dense``/``batch_matmul`` ops on int32
operands (the zero points subtracted first), so they take every existing path through the passes and the build.
"""
from __future__ import annotations

import numpy as np

from typing import Dict

from tether.graph.ir import TensorType
from tether.kernels.core import broadcast_shapes
from tether.kernels.registry import OpDef, Strategy, TeLowering
from tether.ops import qnn

RANGES = qnn.RANGES


def saturate_round(v: np.ndarray, zp: np.ndarray, dtype: str) -> np.ndarray:
    """numpy: the kernels' last step: clamp into [lo - zp, hi - zp], round half to even, add zp, in v's dtype."""
    lo, hi = RANGES[dtype]
    zf = np.asarray(zp).astype(v.dtype)
    v = np.minimum(np.maximum(v, np.asarray(lo, v.dtype) - zf), np.asarray(hi, v.dtype) - zf)
    return (np.rint(v) + zf).astype(np.int32).astype(dtype)


def _quantize_ref(attrs, x, scale, zp):
    return [saturate_round(x.astype(scale.dtype) / scale, zp, attrs["dtype"])]


def _requantize_ref(attrs, acc, mult, zp):
    return [saturate_round(acc.astype(mult.dtype) * mult, zp, attrs["dtype"])]


def _dequantize_ref(attrs, x, scale, zp):
    return [(x.astype(np.int32) - np.asarray(zp).astype(np.int32)).astype(scale.dtype) * scale]


def _qadd_ref(attrs, a, b, ra, rb, fixed):
    """float64 holds a * ra and b * rb exactly: each multiply-add rounds once to float32, as a fused one does."""
    if attrs.get("shift") is not None:
        i64 = np.int64
        acc = a.astype(i64) * i64(ra) + b.astype(i64) * i64(rb) + i64(fixed)
        lo, hi = RANGES[attrs["dtype"]]
        return [np.clip((acc >> int(attrs["shift"])) + int(attrs.get("zero_point", 0)), lo, hi).astype(attrs["dtype"])]
    f32 = np.float32
    inner = (b.astype(np.float64) * np.float64(rb) + np.float64(fixed)).astype(f32)
    v = (a.astype(np.float64) * np.float64(ra) + inner.astype(np.float64)).astype(f32)
    return [saturate_round(v, np.zeros((), np.int32), attrs["dtype"])]


def qadd_constants(sa, za, sb, zb, sc, zc):
    """(ra, rb, fixed) of ``qadd`` for constant scales and zero points: ra = sa / sc, rb = sb / sc and
    fixed = zc - fma(ra, za, rb * zb) in float32 (onnxruntime's compiled MLAS fuses that multiply-add)."""
    f32 = np.float32
    ra, rb = f32(f32(sa) / f32(sc)), f32(f32(sb) / f32(sc))
    prod = f32(rb * f32(int(zb)))
    fused = f32(np.float64(ra) * np.float64(int(za)) + np.float64(prod))
    return np.array(ra, f32), np.array(rb, f32), np.array(f32(f32(int(zc)) - fused), f32)


# XNNPACK's 8-bit addition takes output-to-input scale ratios in this range (else LiteRT's builtin kernel runs)
FIXED_POINT_RATIOS = (2.0 ** -10, 2.0 ** 8)


def qadd_fixed_point_constants(sa, za, sb, zb, sc, zc):
    """(ra, rb, fixed, shift) of ``qadd {shift, zero_point: zc}`` as XNNPACK derives its addition's parameters:
    the ratios ``s_a / s_c``, ``s_b / s_c`` in float32, the shift making the larger one a 21-bit multiplier, the
    multipliers rounded half to even, and ``fixed`` the rounding half-unit less the zero points' products (all
    int32, as XNNPACK's); None when a ratio is outside FIXED_POINT_RATIOS."""
    f32 = np.float32
    ratios = [f32(f32(s) / f32(sc)) for s in (sa, sb)]
    if not all(FIXED_POINT_RATIOS[0] <= r < FIXED_POINT_RATIOS[1] for r in ratios):
        return None
    shift = 20 - (int(f32(max(ratios)).view(np.uint32) >> 23) - 127)
    ma, mb = (int(np.rint(np.float64(r) * 2.0 ** shift)) for r in ratios)
    fixed = (1 << (shift - 1)) - ma * int(za) - mb * int(zb)
    return np.array(ma, np.int32), np.array(mb, np.int32), np.array(fixed, np.int32), shift


def _typed(dtype_of):
    def infer(attrs, *xs):
        return [TensorType(broadcast_shapes(*[x.shape for x in xs]), dtype_of(attrs, *xs))]
    return infer


DEFINITIONS: Dict[str, OpDef] = {d.name: d for d in (
    OpDef("quantize", "elemwise", _typed(lambda attrs, *xs: attrs["dtype"]), _quantize_ref),
    OpDef("requantize", "elemwise", _typed(lambda attrs, *xs: attrs["dtype"]), _requantize_ref),
    OpDef("qadd", "elemwise", _typed(lambda attrs, *xs: attrs["dtype"]), _qadd_ref),
    OpDef("dequantize", "elemwise", _typed(lambda attrs, x, s, z: s.dtype), _dequantize_ref),
)}

CPU_STRATEGIES: Dict[str, Strategy] = {
    "quantize": TeLowering(lambda attrs, x, s, z: qnn.quantize(x, s, z, attrs["dtype"])),
    "requantize": TeLowering(lambda attrs, a, m, z: qnn.requantize(a, m, z, attrs["dtype"])),
    "qadd": TeLowering(lambda attrs, a, b, ra, rb, k: qnn.qadd(a, b, ra, rb, k, attrs["dtype"],
                                                              shift=attrs.get("shift"),
                                                              zero_point=attrs.get("zero_point", 0))),
    "dequantize": TeLowering(lambda attrs, x, s, z: qnn.dequantize(x, s, z)),
}
