"""Self-contained, vectorisable math as LLVM IR: exp, log, tanh, sigmoid, erf, pow, sqrt, rsqrt, floor, ceil, abs,
sin, cos, tan, asin, acos, atan.

Modules carry their own math because they link without libm (docs/abi.md), and because straight-line IR over
``<N x float>`` vectorises where a libm call would not. Every function is branch-free (selects only), internal
and alwaysinline, built for scalar float/double or vectors of them. Nothing here may become a library call on
any target: no fptosi to 64-bit integers (a libcall on armv7), no llvm.fma (a libcall on x86-64 without FMA),
and floor/ceil use a rounding trick where the target lacks a rounding instruction.

Accuracy (tests/test_mathlib.py checks it against numpy, on the host and on ARM under qemu): float32 exp, log,
tanh, sigmoid, erf within 1e-6 relative (measured ~1e-7) over the normal range, with exp overflow -> inf,
underflow -> 0 (subnormals on the way), log(0) -> -inf, log(<0) -> NaN, tanh/erf saturating to +-1; pow is
computed in double. float64 versions are within 1e-14 relative (pow 1e-12). NEON on armv7 flushes subnormals to
zero, so vector results there are only as good as that allows in the subnormal range.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

from llvmlite import ir

from tether.errors import UnsupportedOpError

FLOAT, DOUBLE = ir.FloatType(), ir.DoubleType()

# erfc(x) * exp(x*x) on [1, cut] as a polynomial in t = (1/x - mid) * inv (fitted to a Chebyshev interpolant of
# math.erfc; highest degree first). float: 9th degree on [1, 4]; double: 22nd degree on [1, 6].
_ERFC_F32 = (0.625, 2.6666666666666665, (
    3.816594692503489e-06, -2.7791575215184426e-06, -2.807815438339612e-05, 0.00012420942505265102,
    -0.0003481154056824797, 0.0004599364168834839, 0.0023080212061388043, -0.024242834906895407,
    0.1433564144619662, 0.3059529887413257))
_ERFC_F64 = (0.5833333333333334, 2.4, (
    1.5029153422636508e-10, 1.6351718923828522e-09, -5.037772227267755e-09, -1.5930902627994737e-10,
    1.1994579482188407e-08, -1.7859143012118964e-08, 3.917155241772805e-08, -9.571821476289942e-08,
    1.325088325558374e-07, 2.096639321680233e-09, -6.664000719772323e-07, 2.5827941823522733e-06,
    -6.497123954910281e-06, 1.0882727038573402e-05, -4.046816966948434e-06, -5.5286507057666395e-05,
    0.00026560549176532977, -0.0007383867421409489, 0.0010344322248491695, 0.00282113189785451,
    -0.030831050508395217, 0.1653626900126148, 0.289722116323464))


class _Fmt:
    """Constants of one IEEE format."""

    def __init__(self, double: bool) -> None:
        self.double = double
        self.bits = 64 if double else 32
        self.mant = 52 if double else 23
        self.bias = 1023 if double else 127
        self.sign = 1 << (self.bits - 1)


class _E:
    """An IRBuilder wrapper that speaks in splatted constants of one (scalar or vector) float type."""

    def __init__(self, b: ir.IRBuilder, ty: ir.Type, target: Any) -> None:
        self.b, self.ty, self.target = b, ty, target
        self.lanes = ty.count if isinstance(ty, ir.VectorType) else None
        base = ty.element if self.lanes else ty
        self.fmt = _Fmt(isinstance(base, ir.DoubleType))
        ibase = ir.IntType(self.fmt.bits)
        self.ity = ir.VectorType(ibase, self.lanes) if self.lanes else ibase
        i32 = ir.IntType(32)
        self.i32ty = ir.VectorType(i32, self.lanes) if self.lanes else i32

    # constants
    def c(self, v: float) -> ir.Constant:
        return ir.Constant(self.ty, [float(v)] * self.lanes) if self.lanes else ir.Constant(self.ty, float(v))

    def ic(self, v: int, ty: Optional[ir.Type] = None) -> ir.Constant:
        ty = ty or self.ity
        if isinstance(ty, ir.VectorType):
            return ir.Constant(ty, [int(v)] * ty.count)
        return ir.Constant(ty, int(v))

    # arithmetic (no fast-math flags: the rounding tricks below rely on strict IEEE semantics)
    def add(self, a, b): return self.b.fadd(a, b)
    def sub(self, a, b): return self.b.fsub(a, b)
    def mul(self, a, b): return self.b.fmul(a, b)
    def div(self, a, b): return self.b.fdiv(a, b)
    def lt(self, a, b): return self.b.fcmp_ordered("<", a, b)
    def gt(self, a, b): return self.b.fcmp_ordered(">", a, b)
    def ge(self, a, b): return self.b.fcmp_ordered(">=", a, b)
    def eq(self, a, b): return self.b.fcmp_ordered("==", a, b)
    def ne(self, a, b): return self.b.fcmp_unordered("!=", a, b)
    def sel(self, c, a, b): return self.b.select(c, a, b)
    def bits(self, x): return self.b.bitcast(x, self.ity)
    def from_bits(self, i): return self.b.bitcast(i, self.ty)

    def muladd(self, a, b, c):
        """a*b + c; fused where the target has FMA, never a libcall (llvm.fmuladd)."""
        return self.b.call(self.intrinsic("fmuladd", 3), [a, b, c])

    def horner(self, x, coeffs: Sequence[float]):
        acc = self.c(coeffs[0])
        for k in coeffs[1:]:
            acc = self.muladd(acc, x, self.c(k))
        return acc

    def intrinsic(self, name: str, nargs: int = 1) -> ir.Function:
        module = self.b.module
        full = "llvm.%s.%s" % (name, _suffix(self.ty))
        fn = module.globals.get(full)
        if fn is None:
            fn = ir.Function(module, ir.FunctionType(self.ty, [self.ty] * nargs), full)
        return fn

    def fabs(self, x):
        return self.from_bits(self.b.and_(self.bits(x), self.ic(self.fmt.sign - 1)))

    def copysign(self, mag, sgn):
        m = self.b.and_(self.bits(mag), self.ic(self.fmt.sign - 1))
        s = self.b.and_(self.bits(sgn), self.ic(self.fmt.sign))
        return self.from_bits(self.b.or_(m, s))

    def round_nearest(self, x):
        """Round to nearest integer (valid for |x| < 2**mant): add and remove 1.5*2**mant."""
        big = self.copysign(self.c(2.0 ** self.fmt.mant), x)
        return self.sub(self.add(x, big), big)

    def call(self, name: str, *args):
        return self.b.call(get(self.b.module, name, self.ty, target=self.target), list(args))


def _suffix(ty: ir.Type) -> str:
    if isinstance(ty, ir.VectorType):
        return "v%d%s" % (ty.count, _suffix(ty.element))
    if isinstance(ty, ir.FloatType):
        return "f32"
    if isinstance(ty, ir.DoubleType):
        return "f64"
    raise UnsupportedOpError("math functions take float, double or vectors of them, not %s" % ty)


# ---- the functions -----------------------------------------------------------------------------------------
def _abs(e: _E, x):
    return e.fabs(x)


def _sqrt(e: _E, x):
    return e.b.call(e.intrinsic("sqrt"), [x])


def _rsqrt(e: _E, x):
    return e.div(e.c(1.0), _sqrt(e, x))


def _floor_ceil(e: _E, x, up: bool):
    if e.target is not None and e.target.native_rounding:
        return e.b.call(e.intrinsic("ceil" if up else "floor"), [x])
    r = e.round_nearest(x)
    if up:
        fixed = e.sel(e.lt(r, x), e.add(r, e.c(1.0)), r)
    else:
        fixed = e.sel(e.gt(r, x), e.sub(r, e.c(1.0)), r)
    # |x| >= 2**mant is already integral; inf and NaN fall through unchanged too.
    return e.sel(e.lt(e.fabs(x), e.c(2.0 ** e.fmt.mant)), e.copysign(fixed, x), x)


def _floor(e: _E, x):
    return _floor_ceil(e, x, up=False)


def _ceil(e: _E, x):
    return _floor_ceil(e, x, up=True)


def _exp(e: _E, x):
    f = e.fmt
    if f.double:
        hi, lo, c1, c2 = 710.0, -746.0, 6.93147180369123816490e-01, 1.90821492927058770002e-10
    else:
        hi, lo, c1, c2 = 89.0, -104.0, 0.693359375, -2.12194440e-4
    # Clamp so that n stays in range for the two-step scaling (NaN passes both selects unchanged).
    x = e.sel(e.gt(x, e.c(hi)), e.c(hi), x)
    x = e.sel(e.lt(x, e.c(lo)), e.c(lo), x)
    magic = e.c(1.5 * 2.0 ** f.mant)
    t = e.add(e.mul(x, e.c(1.4426950408889634)), magic)
    nf = e.sub(t, magic)
    n = e.b.sub(e.bits(t), e.bits(magic))  # integer n without fptosi (no poison for NaN, no libcall)
    r = e.sub(e.sub(x, e.mul(nf, e.c(c1))), e.mul(nf, e.c(c2)))
    if f.double:
        coeffs = [1.0 / math.factorial(k) for k in range(12, -1, -1)]
        y = e.horner(r, coeffs)
    else:
        p = e.horner(r, [1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1,
                         5.0000001201e-1])
        y = e.add(e.add(e.mul(p, e.mul(r, r)), r), e.c(1.0))
    # 2**n as two factors so results reaching the overflow/subnormal range round once, in the final multiply.
    n1 = e.b.ashr(n, e.ic(1))
    n2 = e.b.sub(n, n1)
    s1 = e.from_bits(e.b.shl(e.b.add(n1, e.ic(f.bias)), e.ic(f.mant)))
    s2 = e.from_bits(e.b.shl(e.b.add(n2, e.ic(f.bias)), e.ic(f.mant)))
    return e.mul(e.mul(y, s1), s2)


def _log(e: _E, x):
    f = e.fmt
    b = e.b
    if f.double:
        c1, c2, terms = 6.93147180369123816490e-01, 1.90821492927058770002e-10, 10
    else:
        c1, c2, terms = 0.693359375, -2.12194440e-4, 5
    tiny = e.lt(x, e.c(2.0 ** (1 - f.bias)))  # subnormal (or <= 0): rescale into the normal range first
    xs = e.sel(tiny, e.mul(x, e.c(2.0 ** (f.mant + 1))), x)
    bias = e.sel(tiny, e.ic(f.bias + f.mant + 1), e.ic(f.bias))
    xb = e.bits(xs)
    expo = b.sub(b.lshr(b.and_(xb, e.ic(f.sign - 1)), e.ic(f.mant)), bias)
    m = e.from_bits(b.or_(b.and_(xb, e.ic((1 << f.mant) - 1)), e.ic(f.bias << f.mant)))  # in [1, 2)
    big = e.gt(m, e.c(math.sqrt(2.0)))
    m = e.sel(big, e.mul(m, e.c(0.5)), m)
    expo = e.b.add(expo, b.zext(big, e.ity))
    if f.double:
        expo = b.trunc(expo, e.i32ty)  # i64 -> double conversion would be a libcall on armv7
    ef = b.sitofp(expo, e.ty)
    # log(1+g) = g - s*(g - R), s = g/(2+g), R = 2z(1/3 + z/5 + ...), z = s*s  (|s| < 0.172)
    g = e.sub(m, e.c(1.0))
    s = e.div(g, e.add(e.c(2.0), g))
    z = e.mul(s, s)
    poly = e.horner(z, [2.0 / (2 * k + 1) for k in range(terms, 0, -1)])
    rr = e.mul(z, poly)
    log1p = e.sub(g, e.mul(s, e.sub(g, rr)))
    res = e.add(e.mul(ef, e.c(c1)), e.add(log1p, e.mul(ef, e.c(c2))))
    inf = e.c(float("inf"))
    res = e.sel(e.eq(x, inf), inf, res)
    res = e.sel(e.eq(x, e.c(0.0)), e.c(float("-inf")), res)
    return e.sel(b.fcmp_unordered("<", x, e.c(0.0)), e.c(float("nan")), res)


def _tanh(e: _E, x):
    ax = e.fabs(x)
    z = e.mul(x, x)
    if e.fmt.double:
        p = e.horner(z, [-9.64399179425052238628e-1, -9.92877231001918586564e1, -1.61468768441708447952e3])
        q = e.horner(z, [1.0, 1.12811678491632931402e2, 2.23548839060100448583e3, 4.84406305325125486048e3])
        small = e.add(ax, e.mul(e.mul(ax, z), e.div(p, q)))
    else:
        p = e.horner(z, [-5.70498872745e-3, 2.06390887954e-2, -5.37397155531e-2, 1.33314422036e-1,
                         -3.33332819422e-1])
        small = e.add(ax, e.mul(e.mul(ax, z), p))
    ex = e.call("exp", e.add(ax, ax))
    large = e.sub(e.c(1.0), e.div(e.c(2.0), e.add(ex, e.c(1.0))))  # exp overflow -> inf -> exactly 1
    return e.copysign(e.sel(e.lt(ax, e.c(0.625)), small, large), x)  # odd; keeps tanh(-0) = -0


def _exp_sigmoid_f32(e: _E, x):
    """exp(x) for float32 x <= 0 (or NaN), as sigmoid needs it, in fewer ops than exp: no upper clamp, and 2**n is
    one normal scale factor, 2**(n + 24) below -87 (results under the smallest normal), the product then scaled by
    2**-24 so it rounds once into the subnormals as exp's two-step scaling does. SiLU's sigmoid runs on every
    element of EfficientNet's and MobileViT's feature maps."""
    f = e.fmt
    small = e.lt(x, e.c(-87.0))
    x = e.sel(e.lt(x, e.c(-104.0)), e.c(-104.0), x)     # (exp's lower clamp; NaN passes)
    magic = e.c(1.5 * 2.0 ** f.mant)
    t = e.add(e.mul(x, e.c(1.4426950408889634)), magic)
    nf = e.sub(t, magic)
    n = e.b.sub(e.bits(t), e.bits(magic))
    r = e.sub(e.sub(x, e.mul(nf, e.c(0.693359375))), e.mul(nf, e.c(-2.12194440e-4)))
    p = e.horner(r, [1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1,
                     5.0000001201e-1])
    y = e.add(e.add(e.mul(p, e.mul(r, r)), r), e.c(1.0))
    biased = e.b.add(n, e.sel(small, e.ic(f.bias + 24), e.ic(f.bias)))
    y = e.mul(y, e.from_bits(e.b.shl(biased, e.ic(f.mant))))
    return e.mul(y, e.sel(small, e.c(2.0 ** -24), e.c(1.0)))


def _sigmoid(e: _E, x):
    # exp(-|x|) never overflows, and e/(1+e) keeps the tiny results for very negative x (down to subnormals).
    ax = e.sub(e.c(0.0), e.fabs(x))
    ex = e.call("exp", ax) if e.fmt.double else _exp_sigmoid_f32(e, ax)
    inv = e.div(e.c(1.0), e.add(e.c(1.0), ex))
    return e.sel(e.lt(x, e.c(0.0)), e.mul(ex, inv), inv)


def _erf(e: _E, x):
    ax = e.fabs(x)
    z = e.mul(ax, ax)
    nterms = 18 if e.fmt.double else 10
    # |x| < 1: Taylor series erf(x) = 2/sqrt(pi) * sum (-1)^n x^(2n+1) / (n! (2n+1))
    series = [(-1) ** n / (math.factorial(n) * (2 * n + 1)) for n in range(nterms, -1, -1)]
    small = e.mul(e.mul(ax, e.c(2.0 / math.sqrt(math.pi))), e.horner(z, series))
    mid, inv, coeffs = _ERFC_F64 if e.fmt.double else _ERFC_F32
    cut = 6.0 if e.fmt.double else 4.0
    t = e.mul(e.sub(e.div(e.c(1.0), ax), e.c(mid)), e.c(inv))
    erfc = e.mul(e.call("exp", e.sub(e.c(0.0), z)), e.horner(t, coeffs))
    large = e.sub(e.c(1.0), erfc)
    res = e.sel(e.lt(ax, e.c(1.0)), small, large)
    res = e.sel(e.ge(ax, e.c(cut)), e.c(1.0), res)
    return e.copysign(res, x)


def _pow(e: _E, x, y):
    b = e.b
    ax = e.fabs(x)
    if e.fmt.double:
        base = e.call("exp", e.mul(y, e.call("log", ax)))
    else:
        # float pow via double: y*log(x) needs more bits than float has to keep 1e-7 relative accuracy.
        dty = ir.VectorType(DOUBLE, e.lanes) if e.lanes else DOUBLE
        ed = _E(b, dty, e.target)
        xd, yd = b.fpext(ax, dty), b.fpext(y, dty)
        based = ed.call("exp", ed.mul(yd, ed.call("log", xd)))
        base = b.fptrunc(based, e.ty)
    fy = _floor(e, y)
    yint = e.eq(fy, y)
    half = e.mul(y, e.c(0.5))
    yodd = b.and_(yint, e.ne(_floor(e, half), half))
    negative_sign = b.icmp_signed("<", e.bits(x), e.ic(0))
    res = e.sel(b.and_(negative_sign, yodd), e.sub(e.c(0.0), base), base)
    res = e.sel(b.and_(e.lt(x, e.c(0.0)), b.not_(yint)), e.c(float("nan")), res)
    res = e.sel(e.eq(y, e.c(0.0)), e.c(1.0), res)
    res = e.sel(b.and_(e.eq(ax, e.c(1.0)), e.eq(e.fabs(y), e.c(float("inf")))), e.c(1.0), res)  # (-1)**inf
    return e.sel(e.eq(x, e.c(1.0)), e.c(1.0), res)


# ---- trigonometry: sin, cos, tan, asin, acos, atan -----------------------------------------------------------
# All computed in double (float32 is widened and rounded once at the end), branch-free like the rest.
#
# sin/cos/tan reduce x modulo pi/2 exactly for every finite input (no Cody-Waite range limit): 2/pi is split into
# chunks C_i of a few bits each, so every product x*C_i is exact in double; each product is reduced modulo 4
# (quarter turns) exactly, centred on 0 so small arguments keep their relative precision, and the reduced terms
# are summed smallest first in double-double. float32: 7 chunks of 29 bits against the 24-bit x. double: x is
# split into two halves of <= 27 bits and 2/pi into 43 chunks of 26 bits (down to 2**-1118), so double
# sin/cos cost ~90 multiply-rounds per element: correct everywhere, slower than float32.


def _two_over_pi(nbits: int) -> int:
    """floor(2/pi * 2**nbits), from Machin's formula in integer arithmetic (64 guard bits)."""
    prec = nbits + 64
    one = 1 << prec

    def arctan_inv(n: int) -> int:
        total, term, k, sign = 0, one // n, 1, 1
        while term:
            total += sign * (term // k)
            term //= n * n
            k += 2
            sign = -sign
        return total

    pi = 16 * arctan_inv(5) - 4 * arctan_inv(239)
    return ((2 * one * one) // pi) >> 64


def _trig_chunks(bits: int, count: int) -> Tuple[Tuple[float, int], ...]:
    """(C_i * 2**s, s): chunks past 2**-900 are stored scaled up by 2**256 (and x scaled down to match), since
    double's subnormal floor is 2**-1074 and the largest doubles need 2/pi to about 2**-1100."""
    v = _two_over_pi(bits * count)
    mask = (1 << bits) - 1
    out = []
    for i in range(count):
        s = 256 if bits * (i + 1) > 900 else 0
        out.append((math.ldexp((v >> (bits * (count - 1 - i))) & mask, s - bits * (i + 1)), s))
    return tuple(out)


_TRIG_CHUNKS = {False: _trig_chunks(29, 7), True: _trig_chunks(26, 43)}
# atan(x) = x + x*z*P(z), z = x*x, |x| <= tan(pi/12); asin(x) = x + x*z*Q(z), |x| <= 1/2 (Chebyshev fits in
# 200-bit arithmetic, highest degree first; within 1e-16 of the remainder term)
_ATAN_P = (0.03459385816447865, -0.0507655385655925, 0.05867073012179241, -0.06665900669642257,
           0.0769228376870477, -0.0909090863428272, 0.11111111106092504, -0.14285714285686224, 0.1999999999999994,
           -0.3333333333333333)
_ASIN_Q = (0.028757851367421566, -0.014851887071247204, 0.01740087944269402, 0.005457506718640358,
           0.01032281435018578, 0.011479177415184906, 0.013971212973552933, 0.017352392720869973,
           0.02237217294214989, 0.030381944138531247, 0.04464285714635543, 0.07499999999998433,
           0.16666666666666669)


def _in_double(e: _E, x, fn: Callable[..., Any]):
    """fn(double emitter, x as double, x_was_double); float32 is widened and the result rounded once."""
    if e.fmt.double:
        return fn(e, x, True)
    dty = ir.VectorType(DOUBLE, e.lanes) if e.lanes else DOUBLE
    return e.b.fptrunc(fn(_E(e.b, dty, e.target), e.b.fpext(x, dty), False), e.ty)


def _rint(e: _E, v):
    """Nearest integer for any double (values beyond 2**52 are integers already; inf and NaN pass through)."""
    return e.sel(e.lt(e.fabs(v), e.c(2.0 ** 52)), e.round_nearest(v), v)


def _quarter_turns(e: _E, x, was_double: bool):
    """(r, q): x = (4k + q) * pi/2 + r with q in {0, 1, 2, 3} (as doubles) and |r| <= pi/4."""
    parts = [x]
    if was_double:
        hi = e.from_bits(e.b.and_(e.bits(x), e.ic(~((1 << 27) - 1) & ((1 << 64) - 1))))
        parts = [hi, e.sub(x, hi)]
    y = err = None
    for c, scale in reversed(_TRIG_CHUNKS[was_double]):
        for p in parts:
            t = e.mul(e.mul(p, e.c(2.0 ** -scale)) if scale else p, e.c(c))
            m = e.sub(t, e.mul(e.c(4.0), _rint(e, e.mul(t, e.c(0.25)))))   # exact: t mod 4 in [-2, 2]
            if y is None:
                y, err = m, e.c(0.0)
                continue
            # Knuth's two-sum: y + err carries the sum in double-double, so x near a multiple of pi/2 keeps its
            # tiny remainder (sin(pi) = 1.22e-16, not 0)
            s = e.add(y, m)
            bv = e.sub(s, y)
            err = e.add(err, e.add(e.sub(y, e.sub(s, bv)), e.sub(m, bv)))
            y = s
    q = _rint(e, y)
    r = e.mul(e.add(e.sub(y, q), err), e.c(math.pi / 2))
    q = e.sub(q, e.mul(e.c(4.0), _floor(e, e.mul(q, e.c(0.25)))))
    return r, q


def _sin_cos_kernels(e: _E, r):
    z = e.mul(r, r)
    s = e.add(r, e.mul(e.mul(r, z), e.horner(z, [(-1) ** k / math.factorial(2 * k + 1) for k in range(9, 0, -1)])))
    c = e.horner(z, [(-1) ** k / math.factorial(2 * k) for k in range(9, -1, -1)])
    return s, c


def _by_quadrant(e: _E, q, values):
    out = values[3]
    for k in (2, 1, 0):
        out = e.sel(e.eq(q, e.c(float(k))), values[k], out)
    return out


def _sin_d(e: _E, x, was_double: bool):
    r, q = _quarter_turns(e, x, was_double)
    s, c = _sin_cos_kernels(e, r)
    neg = lambda v: e.sub(e.c(0.0), v)  # noqa: E731
    return e.sel(e.eq(x, e.c(0.0)), x, _by_quadrant(e, q, (s, c, neg(s), neg(c))))   # sin(-0) = -0


def _cos_d(e: _E, x, was_double: bool):
    r, q = _quarter_turns(e, x, was_double)
    s, c = _sin_cos_kernels(e, r)
    neg = lambda v: e.sub(e.c(0.0), v)  # noqa: E731
    return _by_quadrant(e, q, (c, neg(s), neg(c), s))


def _tan_d(e: _E, x, was_double: bool):
    r, q = _quarter_turns(e, x, was_double)
    s, c = _sin_cos_kernels(e, r)
    odd = e.b.or_(e.eq(q, e.c(1.0)), e.eq(q, e.c(3.0)))
    res = e.sel(odd, e.sub(e.c(0.0), e.div(c, s)), e.div(s, c))
    return e.sel(e.eq(x, e.c(0.0)), x, res)


def _asin_core(e: _E, v):
    z = e.mul(v, v)
    return e.add(v, e.mul(e.mul(v, z), e.horner(z, _ASIN_Q)))


def _asin_d(e: _E, x, was_double: bool):
    ax = e.fabs(x)
    w = e.mul(e.sub(e.c(1.0), ax), e.c(0.5))          # asin(a) = pi/2 - 2 asin(sqrt((1 - a) / 2)); NaN past 1
    large = e.sub(e.c(math.pi / 2), e.mul(e.c(2.0), _asin_core(e, _sqrt(e, w))))
    return e.copysign(e.sel(e.b.fcmp_unordered("<=", ax, e.c(0.5)), _asin_core(e, ax), large), x)


def _acos_d(e: _E, x, was_double: bool):
    ax = e.fabs(x)
    half_angle = e.mul(e.c(2.0), _asin_core(e, _sqrt(e, e.mul(e.sub(e.c(1.0), ax), e.c(0.5)))))
    large = e.sel(e.lt(x, e.c(0.0)), e.sub(e.c(math.pi), half_angle), half_angle)
    small = e.sub(e.c(math.pi / 2), e.copysign(_asin_core(e, ax), x))
    return e.sel(e.b.fcmp_unordered("<=", ax, e.c(0.5)), small, large)


def _atan_d(e: _E, x, was_double: bool):
    ax = e.fabs(x)
    big = e.gt(ax, e.c(1.0))
    t = e.sel(big, e.div(e.c(1.0), ax), ax)                  # atan(a) = pi/2 - atan(1/a)
    mid = e.gt(t, e.c(2.0 - math.sqrt(3.0)))                   # atan(t) = pi/6 + atan((t*sqrt3 - 1)/(t + sqrt3))
    s3 = e.c(math.sqrt(3.0))
    t = e.sel(mid, e.div(e.sub(e.mul(t, s3), e.c(1.0)), e.add(t, s3)), t)
    core = e.add(t, e.mul(e.mul(t, e.mul(t, t)), e.horner(e.mul(t, t), _ATAN_P)))
    core = e.sel(mid, e.add(e.c(math.pi / 6), core), core)
    return e.copysign(e.sel(big, e.sub(e.c(math.pi / 2), core), core), x)


_TRIG_IMPLS: Dict[str, Tuple[int, Callable[..., Any]]] = {
    name: (1, (lambda f: lambda e, x: _in_double(e, x, f))(fn))
    for name, fn in (("sin", _sin_d), ("cos", _cos_d), ("tan", _tan_d), ("asin", _asin_d), ("acos", _acos_d),
                     ("atan", _atan_d))
}


_IMPLS: Dict[str, Tuple[int, Callable[..., Any]]] = {
    name: (1, (lambda f: lambda e, x: _in_double(e, x, f))(fn))
    for name, fn in (("sin", _sin_d), ("cos", _cos_d), ("tan", _tan_d), ("asin", _asin_d), ("acos", _acos_d),
                     ("atan", _atan_d))
}


# ---- round_even (the requantize of every int8 kernel): the nearest integer, ties to even, as
# onnxruntime's nearbyint; one instruction where the target rounds natively (vrndscaleps/roundps $8, frintn),
# else the add-and-remove of 2**mant with x's sign (ties to even under the default rounding mode, |x| < 2**mant);
# an internal function: a caller's fast-math flags cannot reassociate the add and remove away
def _round_even(e: _E, x):
    if e.target is not None and e.target.native_rounding:
        return e.b.call(e.intrinsic("roundeven"), [x])
    # |x| >= 2**mant is already integral (and inf, NaN): unchanged; copysign keeps -0.0 and -0.4 -> -0.0
    return e.sel(e.lt(e.fabs(x), e.c(2.0 ** e.fmt.mant)), e.copysign(e.round_nearest(x), x), x)


_IMPLS: Dict[str, Tuple[int, Callable[..., Any]]] = {
    "exp": (1, _exp), "log": (1, _log), "sqrt": (1, _sqrt), "rsqrt": (1, _rsqrt), "tanh": (1, _tanh),
    "sigmoid": (1, _sigmoid), "erf": (1, _erf), "pow": (2, _pow), "floor": (1, _floor), "ceil": (1, _ceil),
    "abs": (1, _abs), "fabs": (1, _abs), "round_even": (1, _round_even),
}
_IMPLS.update(_TRIG_IMPLS)
NAMES = tuple(sorted(_IMPLS))


def arity(name: str) -> int:
    return _IMPLS[name][0]


def get(module: ir.Module, name: str, ty: ir.Type, target: Any = None) -> ir.Function:
    """The internal, alwaysinline math function ``name`` over ``ty`` in ``module`` (created once per module).

    ``target`` decides target-specific lowering (floor/ceil); None means "assume no rounding instruction"."""
    if name not in _IMPLS:
        raise UnsupportedOpError("no math function %r; available: %s" % (name, ", ".join(NAMES)))
    nargs, impl = _IMPLS[name]
    fname = "tether.math.%s.%s" % (name, _suffix(ty))
    existing = module.globals.get(fname)
    if existing is not None:
        return existing
    fn = ir.Function(module, ir.FunctionType(ty, [ty] * nargs), fname)
    fn.linkage = "internal"
    fn.attributes.add("alwaysinline")
    fn.attributes.add("nounwind")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    b.ret(impl(_E(b, ty, target), *fn.args))
    return fn
