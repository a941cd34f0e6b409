"""Quantized elementwise steps (int8/uint8/int16): quantize, requantize, dequantize, as onnxruntime computes them.

- ``quantize(x, scale, zp)``: ``clamp(x / scale, lo - zp, hi - zp)``, rounded half to even, ``+ zp`` (MLAS's
  QuantizeLinear: the clamp comes before the rounding, so the value rounded is small and exact in float32).
- ``requantize(acc, multiplier, zp)``: the same with ``float(acc) * multiplier`` for the division: an int32
  accumulator brought to the output's scale (MLAS's MlasRequantizeOutput).
- ``dequantize(x, scale, zp)``: ``float(int32(x) - int32(zp)) * scale``.
- ``qadd(a, b, ra, rb, fixed)``: the sum of two quantized tensors in a third's scale (MLAS's QLinearAdd).

Scales and zero points are tensors broadcast against the data (per tensor: one element; per channel: shaped
to broadcast along the channel axis).
"""
from __future__ import annotations

from tether import te
from tether.tir.op import round_even

from . import common as c
from .nary import elementwise

RANGES = {"int8": (-128, 127), "uint8": (0, 255), "int16": (-32768, 32767)}


def round_half_even(v):
    """float -> the nearest integer value (ties to even), as a float: te.round_even, one instruction where the
    target rounds natively (codegen/mathlib.py; it was a floor and a parity test, which cost an int8 kernel's
    write-back more than its dot products when the channels are few)."""
    return round_even(v)


def _to_int(v, zp, out_dtype: str):
    lo, hi = RANGES[out_dtype]
    zf = zp.astype(v.dtype)
    v = c.min2(c.max2(v, c.const(float(lo), v.dtype) - zf), c.const(float(hi), v.dtype) - zf)
    # (the zero point added to the integer: the same sum, as the rounded value is integral and small, and AArch64
    # converts with rounding in one instruction, codegen/expr.py nearest_int32)
    return (round_half_even(v).astype("int32") + zp.astype("int32")).astype(out_dtype)


def quantize(x, scale, zp, out_dtype: str, name: str = "quantize"):
    """float32 x -> out_dtype: saturate(round_half_even(x / scale) + zp)."""
    _check_out(out_dtype, name)
    return elementwise(lambda v, s, z: _to_int(v / s, z, out_dtype), [x, scale, zp], name)


def requantize(acc, multiplier, zp, out_dtype: str, name: str = "requantize"):
    """int32 acc -> out_dtype: saturate(round_half_even(float(acc) * multiplier) + zp)."""
    _check_out(out_dtype, name)
    if out_dtype == "int16":
        return elementwise(lambda v, m, z: _to_int(v.astype(m.dtype) * m, z, out_dtype), [acc, multiplier, zp],
                           name)
    return elementwise(lambda v, m, z: _narrowed(v.astype(m.dtype) * m, z, out_dtype), [acc, multiplier, zp], name)


def _narrowed(v, zp, out_dtype: str):
    """_to_int for a value that is never NaN (an int32 accumulator times a scale), clamped after the rounding, in
    int16 lanes: round to int32 (saturating), narrow to int16 saturating, clamp to [lo - zp, hi - zp] (which int16
    holds for 8-bit outputs), add zp, narrow. The same integers, as the clamp's bounds are integers; on Arm it is
    fcvtns, sqxtn, smax, smin and add on eight lanes, where float clamps and an int32 add took 4 instructions more
    per 16 outputs (every int8 conv's write-back)."""
    lo, hi = RANGES[out_dtype]
    r = round_half_even(v).astype("int32")
    t = c.min2(c.max2(r, c.const(-32768, "int32")), c.const(32767, "int32")).astype("int16")
    z = zp.astype("int16")
    t = c.min2(c.max2(t, c.const(lo, "int16") - z), c.const(hi, "int16") - z)
    return (t + z).astype(out_dtype)


def dequantize(x, scale, zp, name: str = "dequantize"):
    """integer x -> scale's dtype: float(int32(x) - int32(zp)) * scale."""
    return elementwise(lambda v, s, z: (v.astype("int32") - z.astype("int32")).astype(s.dtype) * s,
                       [x, scale, zp], name)


def qadd(a, b, ra, rb, fixed, out_dtype: str, name: str = "qadd", shift: int | None = None, zero_point: int = 0):
    """a, b integer -> out_dtype: saturate(round_half_even(a * ra + (b * rb + fixed))), the zero points folded into
    ``fixed``; each multiply-add contracts to one fused multiply-add where the target has one, as MLAS's.

    With ``shift``: XNNPACK's fixed-point sum in int32, ``saturate(((a * ra + b * rb + fixed) >> shift) +
    zero_point)`` with int32 ``ra``, ``rb``, ``fixed`` (kernels/quantize_ops.py qadd_fixed_point_constants)."""
    _check_out(out_dtype, name)
    lo, hi = RANGES[out_dtype]
    if shift is not None:
        def fixed_point(x, y, p, q, k):
            acc = x.astype("int32") * p + y.astype("int32") * q + k
            v = te.bitwise("shr", acc, c.const(int(shift), "int32")) + c.const(int(zero_point), "int32")
            v = c.min2(c.max2(v, c.const(lo, "int32")), c.const(hi, "int32"))
            return v.astype(out_dtype)
        return elementwise(fixed_point, [a, b, ra, rb, fixed], name)

    def f(x, y, p, q, k):
        v = x.astype(p.dtype) * p + (y.astype(q.dtype) * q + k)
        v = c.min2(c.max2(v, c.const(float(lo), v.dtype)), c.const(float(hi), v.dtype))
        return round_half_even(v).astype("int32").astype(out_dtype)
    return elementwise(f, [a, b, ra, rb, fixed], name)


def _check_out(out_dtype: str, name: str) -> None:
    if out_dtype not in RANGES:
        raise ValueError(f"{name}: output dtype {out_dtype} is not one of {sorted(RANGES)}")
