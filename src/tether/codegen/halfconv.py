"""float16 and bfloat16 are storage types: their elements live in memory as 16-bit patterns and are computed
with as float32 (a load widens, a store rounds to nearest even), the way onnxruntime's CPU provider runs most
half-precision ops.

The conversions are written out with integer and float32 IR that every target has, scalar or vector, rather
than LLVM's ``fpext half``/``fptrunc to half``: those lower to library calls (``__extendhfsf2``,
``__truncsfhf2``, ``__gnu_h2f_ieee``, ...) on armv7 and on x86_64 without F16C, and a tether module links
against nothing. None of the steps below depend on float denormals (armv7 NEON flushes them to zero): the only
float arithmetic sees normal operands.
"""
from __future__ import annotations

import struct

from llvmlite import ir

from tether.codegen.types import F32, I16, I32, const_like, like

# float16 -> float32 pieces
_F16_EXP_ADJUST = (127 - 15) << 23          # re-biases a shifted normal float16 exponent for float32
_F16_SUBNORMAL_SCALE = 2.0 ** -24           # a float16 subnormal is its 10-bit significand times 2^-24
# float32 -> float16 pieces
_F16_OVERFLOW = 0x477FF000                  # |x| >= 65520 rounds to infinity (65504 is the largest float16)
_F16_MIN_NORMAL = 0x38800000                # 2^-14, float16's smallest normal
_F16_REBIAS_ROUND = ((15 - 127) << 23) + 0xFFF   # re-bias, plus the round-to-nearest bias below a half ulp


def _u32(b: ir.IRBuilder, v: ir.Value, value: int) -> ir.Constant:
    return const_like(v, I32, value & 0xFFFFFFFF)


def f16_to_f32(b: ir.IRBuilder, h: ir.Value) -> ir.Value:
    """float16 bit patterns (i16, or a vector of them) -> float32 values, exactly (NaN payloads kept)."""
    x = b.zext(h, like(h, I32))
    sign = b.shl(b.and_(x, _u32(b, x, 0x8000)), _u32(b, x, 16))
    em = b.and_(x, _u32(b, x, 0x7FFF))                       # exponent and significand
    shifted = b.shl(em, _u32(b, x, 13))
    normal = b.add(shifted, _u32(b, x, _F16_EXP_ADJUST))
    special = b.or_(shifted, _u32(b, x, 0x7F800000))         # infinity and NaN
    # zero and subnormals: the significand as a float, scaled (exact; the product is a normal float32)
    small = b.bitcast(b.fmul(b.uitofp(em, like(h, F32)), const_like(h, F32, _F16_SUBNORMAL_SCALE)), like(h, I32))
    bits = b.select(b.icmp_unsigned(">=", em, _u32(b, x, 0x7C00)), special,
                    b.select(b.icmp_unsigned(">=", em, _u32(b, x, 0x0400)), normal, small))
    return b.bitcast(b.or_(bits, sign), like(h, F32))


def f32_to_f16(b: ir.IRBuilder, f: ir.Value) -> ir.Value:
    """float32 values -> float16 bit patterns, rounded to nearest even (overflow to infinity, NaN stays NaN)."""
    x = b.bitcast(f, like(f, I32))
    sign = b.and_(b.lshr(x, _u32(b, x, 16)), _u32(b, x, 0x8000))
    ax = b.and_(x, _u32(b, x, 0x7FFFFFFF))
    # NaN: the top significand bits, made sure to stay a NaN (numpy's rule)
    nan_sig = b.lshr(b.and_(ax, _u32(b, x, 0x007FFFFF)), _u32(b, x, 13))
    nan = b.or_(b.or_(nan_sig, _u32(b, x, 0x7C00)),
                b.zext(b.icmp_unsigned("==", nan_sig, _u32(b, x, 0)), like(f, I32)))
    # normal range: re-bias, round to nearest even on the 13 dropped bits
    odd = b.and_(b.lshr(ax, _u32(b, x, 13)), _u32(b, x, 1))
    normal = b.lshr(b.add(b.add(ax, _u32(b, x, _F16_REBIAS_ROUND)), odd), _u32(b, x, 13))
    # below 2^-14: adding 0.5 puts the float16 subnormal ulp (2^-24) at float32's ulp in [0.5, 1), so the float
    # add rounds to nearest even and the low bits are the result
    half = struct.unpack("<f", struct.pack("<I", 0x3F000000))[0]
    sub = b.sub(b.bitcast(b.fadd(b.bitcast(ax, like(f, F32)), const_like(f, F32, half)), like(f, I32)),
                _u32(b, x, 0x3F000000))
    r = b.select(b.icmp_unsigned(">", ax, _u32(b, x, 0x7F800000)), nan,
                 b.select(b.icmp_unsigned(">=", ax, _u32(b, x, _F16_OVERFLOW)), _u32(b, x, 0x7C00),
                          b.select(b.icmp_unsigned(">=", ax, _u32(b, x, _F16_MIN_NORMAL)), normal, sub)))
    return b.trunc(b.or_(r, sign), like(f, I16))


def bf16_to_f32(b: ir.IRBuilder, h: ir.Value) -> ir.Value:
    """bfloat16 bit patterns -> float32: the upper half of a float32 (exact)."""
    x = b.zext(h, like(h, I32))
    return b.bitcast(b.shl(x, _u32(b, x, 16)), like(h, F32))


def f32_to_bf16(b: ir.IRBuilder, f: ir.Value) -> ir.Value:
    """float32 -> bfloat16 bit patterns, rounded to nearest even; NaN stays a (quiet) NaN."""
    x = b.bitcast(f, like(f, I32))
    odd = b.and_(b.lshr(x, _u32(b, x, 16)), _u32(b, x, 1))
    rounded = b.lshr(b.add(b.add(x, _u32(b, x, 0x7FFF)), odd), _u32(b, x, 16))
    nan = b.or_(b.lshr(x, _u32(b, x, 16)), _u32(b, x, 0x0040))
    is_nan = b.icmp_unsigned(">", b.and_(x, _u32(b, x, 0x7FFFFFFF)), _u32(b, x, 0x7F800000))
    return b.trunc(b.select(is_nan, nan, rounded), like(f, I16))


def f64_to_f32_odd(b: ir.IRBuilder, d: ir.Value) -> ir.Value:
    """float64 -> float32 rounded to odd (toward zero, low bit set when inexact). Rounding that result once more
    to float16/bfloat16 (nearest even) equals rounding the float64 directly: float32 keeps more than two extra
    bits, and the odd low bit stands for everything dropped, so a value just off a float16 tie is not rounded
    onto the tie first (plain float64 -> float32 -> float16 would round twice)."""
    r = b.fptrunc(d, like(d, F32))
    rb = b.bitcast(r, like(d, I32))
    back = b.fpext(r, d.type)
    inexact = b.fcmp_unordered("!=", back, d)
    # rounded away from zero: one step back toward zero (the magnitude bits, sign untouched)
    away = b.fcmp_ordered(">", b.call(_fabs(b, d.type), [back]), b.call(_fabs(b, d.type), [d]))
    toward = b.select(b.and_(inexact, away), b.sub(rb, _u32(b, rb, 1)), rb)
    odd = b.select(inexact, b.or_(toward, _u32(b, rb, 1)), toward)
    return b.bitcast(odd, like(d, F32))


def _fabs(b: ir.IRBuilder, ty: ir.Type) -> ir.Function:
    suffix = ("v%df64" % ty.count) if isinstance(ty, ir.VectorType) else "f64"
    name = "llvm.fabs." + suffix
    module = b.module
    fn = module.globals.get(name)
    if fn is None:
        fn = ir.Function(module, ir.FunctionType(ty, [ty]), name)
    return fn


FROM_STORAGE = {"float16": f16_to_f32, "bfloat16": bf16_to_f32}
TO_STORAGE = {"float16": f32_to_f16, "bfloat16": f32_to_bf16}


def half_value(dtype: str, value: float) -> float:
    """The float16/bfloat16 value nearest ``value`` (round to nearest even), as a Python float: what a constant
    of that type holds."""
    import numpy as np

    if dtype == "float16":
        return float(np.float16(value))
    bits = int(np.array(value, np.float32).view(np.uint32))
    if (bits & 0x7FFFFFFF) > 0x7F800000:
        return float(value)
    bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    return float(np.array(bits & 0xFFFFFFFF, np.uint32).view(np.float32))
