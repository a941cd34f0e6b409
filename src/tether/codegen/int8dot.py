"""Code for ``dot4(a, b, kind)`` (tether.tir.int8): four byte products summed into an int32, per lane.

In a vectorized loop ``acc + dot4(a, b)`` (either order) is one dot-product instruction accumulating into ``acc``
where the target has one for the kind (tether.target.int8_dot_native): x86 vpdpbusd (u8s8; 16, 8 or 4 lanes),
aarch64 sdot/udot (s8s8/u8u8; 4 lanes). Lane counts that are not the instruction's width are split into
instruction-wide pieces (the last one padded with zero lanes) and joined again.

``byte_of(word, t, signed)`` (tether.tir.int8) is emitted as the word's four bytes widened together to 16 bits and
lane t taken from that vector: broadcast into a vector loop and multiplied by sign-extended 16-bit weights, LLVM
selects Arm's multiply-accumulate long by element (smlal v.4s, v.4h, v.h[t]) with one load and one widening per
word; a byte extracted first and widened alone became a move to a general register and a dup per byte.

``pair_dot(a_lo, a_hi, b_lo, b_hi)`` (tether.tir.int8) is, per four int16 lanes (eight bytes a side), Arm's smull of
the low operands, smlal of the high ones (LLVM takes the high half of a 16-byte load: smull2/smlal2) and saddlp,
which LLVM folds with the accumulator's add into sadalp: sixteen byte products in three instructions. Elsewhere
it is the same arithmetic written out (sign extension, an i16 multiply-add that wraps, pairwise sums).

Elsewhere the bytes are widened and multiplied exactly, then the four products of a lane are added pairwise; the
pieces are written so that LLVM selects the target's widening instructions (x86 pmaddwd, Arm smull/saddlp or
vmull/vpaddl, WebAssembly i32x4.dot_i16x8_s). Products of two bytes fit int16 except 255*255 (u8u8), which fits
uint16; the sum of two never needs more than int32. pmaddubsw (u8*s8 pairs summed with int16 saturation) is not
used: two products can exceed int16 (2 * 255 * 127), so it is not exact.
"""
from __future__ import annotations

from typing import Any, Callable, List, Optional, Tuple

from llvmlite import ir

from tether.codegen.types import I8, I32, is_vec
from tether.target import int8_dot_native
from tether.tir import Binary, Call, Const, Expr, Load, byte_of_parts, dot4_kind
from tether.tir.simplify import simplify

I16 = ir.IntType(16)

# kind -> (A's bytes signed, B's bytes signed)
_SIGNED = {"u8s8": (False, True), "s8s8": (True, True), "u8u8": (False, False)}


def fused_operands(e: Binary) -> Optional[Tuple[Call, Expr]]:
    """``(dot4 call, accumulator)`` when ``e`` is ``acc + dot4(...)`` or ``dot4(...) + acc``, else None."""
    if e.op != "add" or e.dtype != "int32":
        return None
    if dot4_kind(e.b) is not None:
        return e.b, e.a
    if dot4_kind(e.a) is not None:
        return e.a, e.b
    return None


def emit(em: Any, call: Call, acc: Optional[Expr] = None) -> ir.Value:
    """``[acc +] dot4(...)`` for the expression emitter ``em`` (codegen/expr.py), scalar or vector."""
    kind = dot4_kind(call)
    B = em.b
    a, b = em.match(em.ev(call.args[0]), em.ev(call.args[1]))
    acc_v = None
    if acc is not None:
        acc_v = em.ev(acc)
        a, acc_v = em.match(a, acc_v)
        b, acc_v = em.match(b, acc_v)
    if is_vec(a):
        target = em.ctx.target
        group = _load_time(getattr(em.ctx, "cpu_variant", None), kind) or _native(target, kind) or _widening(target)
        if group is not None:
            widths, fn = group
            return _by_groups(B, widths, fn, kind, a, b, acc_v)
    out = _generic(B, kind, a, b)
    if acc_v is None:
        return out
    out, acc_v = em.match(out, acc_v)
    return B.add(acc_v, out)


def emit_byte(em: Any, call: Call) -> ir.Value:
    """``byte_of(word, index, signed)`` for the expression emitter ``em``: an int32, or <n x i32> for a vector of
    words (byte ``index`` of each lane)."""
    signed = byte_of_parts(call)
    B = em.b
    word, index = em.ev(call.args[0]), em.ev(call.args[1])
    ext = B.sext if signed else B.zext
    if is_vec(word) and isinstance(index, ir.Constant):
        n = word.type.count
        return ext(_pick(B, _as_bytes(B, word), [4 * i + index.constant for i in range(n)]), _vec(I32, n))
    if is_vec(word) or is_vec(index):   # a byte that varies by lane: shifted to the bottom, then extended
        word, index = em.match(word, index)
        n = word.type.count
        shifted = B.lshr(word, B.mul(index, ir.Constant(word.type, [8] * n)))
        return ext(B.trunc(shifted, _vec(I8, n)), word.type)
    wide = ext(_as_bytes(B, word), _vec(I16, 4))
    # the widened value fits int16 either way, so its sign extension is exact for unsigned bytes too
    if em.vec is not None and isinstance(index, ir.Constant):
        # broadcast in a vector loop: the lane splat of the widened vector, so that it stays one SIMD register
        # (a sign-extended byte extracted first went through a general register: umov, sxtb, dup)
        n = em.lanes()
        return B.sext(_pick(B, wide, [index.constant] * n), _vec(I32, n))
    return B.sext(B.extract_element(wide, index), I32)


def emit_pair_dot(em: Any, call: Call) -> ir.Value:
    """``pair_dot(a_lo, a_hi, b_lo, b_hi)`` for the expression emitter ``em``: an int32, or <n x i32>."""
    B = em.b
    vals = [em.ev(x) for x in call.args]
    scalar = not any(is_vec(v) for v in vals)
    n = max(_lanes(v) for v in vals)
    vals = [em.splat(v, n) for v in vals]
    as8 = [B.bitcast(v, _vec(I8, 2 * n)) for v in vals]
    if em.ctx.target.arch == "aarch64" and n % 4 == 0 and n & (n - 1) == 0:
        parts = []
        for g in range(0, n, 4):
            a_lo, a_hi, b_lo, b_hi = (_pick(B, v, list(range(2 * g, 2 * g + 8))) for v in as8)
            sums = B.add(_intrinsic(B, "llvm.aarch64.neon.smull.v8i16", _vec(I16, 8), [a_lo, b_lo]),
                         _intrinsic(B, "llvm.aarch64.neon.smull.v8i16", _vec(I16, 8), [a_hi, b_hi]))
            parts.append(_intrinsic(B, "llvm.aarch64.neon.saddlp.v4i32.v8i16", _vec(I32, 4), [sums]))
        while len(parts) > 1:
            parts = [_join(B, parts[k], parts[k + 1]) for k in range(0, len(parts), 2)]
        out = parts[0]
    else:
        a_lo, a_hi, b_lo, b_hi = (B.sext(v, _vec(I16, 2 * n)) for v in as8)
        sums = B.sext(B.add(B.mul(a_lo, b_lo), B.mul(a_hi, b_hi)), _vec(I32, 2 * n))
        out = B.add(_pick(B, sums, list(range(0, 2 * n, 2))), _pick(B, sums, list(range(1, 2 * n, 2))))
    return B.extract_element(out, ir.Constant(I32, 0)) if scalar else out


def emit_quad_sum(em: Any, call: Call) -> ir.Value:
    """``quad_sum(a0, a1, a2, a3)``: on aarch64, in a vector loop of n lanes (a multiple of 4) where a_j loads
    element 4 * lane + j of one buffer, the 4n elements as one load and each group's lanes added pairwise with
    addp, twice; elsewhere three adds."""
    B = em.b
    args = call.args
    if em.vec is not None and em.ctx.target.arch == "aarch64" and em.lanes() % 4 == 0 and em.mask is None and \
            all(isinstance(a, Load) and a.buffer is args[0].buffer for a in args) and \
            all(em.lane_stride(a.index) == 4 for a in args) and \
            all(_constant_offset(args[0].index, a.index) == j for j, a in enumerate(args)):
        n = em.lanes()
        ptr = B.gep(em.bufs[args[0].buffer], [em.ev_at_base(args[0].index)], inbounds=True, source_etype=I32)
        wide = B.load(ptr, typ=_vec(I32, 4 * n), align=4)
        groups = [_pick(B, wide, list(range(4 * g, 4 * g + 4))) for g in range(n)]
        for _ in range(2):
            groups = [_intrinsic(B, "llvm.aarch64.neon.addp.v4i32", _vec(I32, 4), [groups[k], groups[k + 1]])
                      for k in range(0, len(groups), 2)]
        while len(groups) > 1:
            groups = [_join(B, groups[k], groups[k + 1]) for k in range(0, len(groups), 2)]
        return groups[0]
    vals = [em.ev(a) for a in args]
    out = vals[0]
    for v in vals[1:]:
        out, v = em.match(out, v)
        out = B.add(out, v)
    return out


def _constant_offset(a: Expr, b: Expr) -> Optional[int]:
    """``b - a`` when it simplifies to a constant, else None."""
    d = simplify(Binary("sub", b, a, "int32"))
    return d.value if isinstance(d, Const) else None


def _join(B: ir.IRBuilder, a: ir.Value, b: ir.Value) -> ir.Value:
    n = a.type.count
    return B.shuffle_vector(a, b, ir.Constant(_vec(I32, 2 * n), list(range(2 * n))))


# ---- lane groups --------------------------------------------------------------------------------------------------
# A group function computes ``acc + dot4(a, b)`` for one instruction-wide group: (B, kind, acc, a, b) with
# <w x i32> values -> <w x i32>.
GroupFn = Callable[[ir.IRBuilder, str, ir.Value, ir.Value, ir.Value], ir.Value]


def _pieces(n: int, widths: Tuple[int, ...]) -> List[Tuple[int, int]]:
    """(first lane, width) of the groups covering n lanes: the widest that fits first, the last one padded."""
    out, start = [], 0
    while start < n:
        w = next((w for w in widths if w <= n - start), widths[-1])
        out.append((start, w))
        start += w
    return out


def _slice(B: ir.IRBuilder, v: ir.Value, start: int, w: int) -> ir.Value:
    """Lanes start..start+w-1 of ``v`` as a <w x i32> (lanes past its end are zero)."""
    n = v.type.count
    if start == 0 and w == n:
        return v
    zero = ir.Constant(v.type, [0] * n)
    return B.shuffle_vector(v, zero, ir.Constant(ir.VectorType(I32, w),
                                                 [start + i if start + i < n else n for i in range(w)]))


def _by_groups(B: ir.IRBuilder, widths: Tuple[int, ...], fn: GroupFn, kind: str, a: ir.Value, b: ir.Value,
               acc: Optional[ir.Value]) -> ir.Value:
    n = a.type.count
    out = None
    for start, w in _pieces(n, widths):
        g_acc = _slice(B, acc, start, w) if acc is not None else ir.Constant(ir.VectorType(I32, w), [0] * w)
        r = fn(B, kind, g_acc, _slice(B, a, start, w), _slice(B, b, start, w))
        if start == 0 and w == n:
            return r
        # r's lanes into lanes start.. of the result: widen r to n lanes, then blend
        r_n = B.shuffle_vector(r, ir.Constant(r.type, ir.Undefined),
                               ir.Constant(ir.VectorType(I32, n), [min(i - start, w - 1) if i >= start else 0
                                                                   for i in range(n)]))
        if out is None:
            out = r_n
        else:
            out = B.shuffle_vector(out, r_n, ir.Constant(ir.VectorType(I32, n),
                                                         [n + i if start <= i < start + w else i for i in range(n)]))
    return out


def _intrinsic(B: ir.IRBuilder, name: str, ret: ir.Type, args: List[ir.Value]) -> ir.Value:
    module = B.module
    fn = module.globals.get(name)
    if fn is None:
        fn = ir.Function(module, ir.FunctionType(ret, [x.type for x in args]), name)
    return B.call(fn, args)


def _vec(ty: ir.Type, n: int) -> ir.VectorType:
    return ir.VectorType(ty, n)


# ---- one instruction per group: x86 vpdpbusd, Arm sdot/udot ------------------------------------------------------
def _vpdpbusd(B: ir.IRBuilder, kind: str, acc: ir.Value, a: ir.Value, b: ir.Value) -> ir.Value:
    # u8 x s8 products summed per lane into acc, exactly (no saturation: the non-"s" form)
    w = a.type.count
    return _intrinsic(B, "llvm.x86.avx512.vpdpbusd.%d" % (32 * w), a.type, [acc, a, b])


def _arm_dot(B: ir.IRBuilder, kind: str, acc: ir.Value, a: ir.Value, b: ir.Value) -> ir.Value:
    w = a.type.count
    op = "sdot" if kind == "s8s8" else "udot"
    return _intrinsic(B, "llvm.aarch64.neon.%s.v%di32.v%di8" % (op, w, 4 * w), a.type,
                      [acc, _as_bytes(B, a), _as_bytes(B, b)])


def _load_time(variant: Optional[str], kind: str) -> Optional[Tuple[Tuple[int, ...], GroupFn]]:
    """The group code of a kernel version for a CPU feature chosen at load time (``ctx.cpu_variant``)."""
    if variant == "asimddp" and kind in ("s8s8", "u8u8"):
        return (4, 2), _arm_dot
    return None


def _native(target: Any, kind: str) -> Optional[Tuple[Tuple[int, ...], GroupFn]]:
    """(group widths, group function) of the target's dot-product instruction for ``kind``, if it has one."""
    if kind not in int8_dot_native(target):
        return None
    if target.arch == "x86_64":
        wide = target.has_feature("avx512vnni") and target.has_feature("avx512f")
        narrow = target.has_feature("avxvnni") or (target.has_feature("avx512vnni") and target.has_feature("avx512vl"))
        widths = ((16,) if wide else ()) + ((8, 4) if narrow else ())
        return (widths, _vpdpbusd) if widths else None
    return (4, 2), _arm_dot


# ---- widening multiply and pairwise add (targets without the instruction) ----------------------------------------
# (prefix, widening multiply s8s8, u8u8, pairwise add long signed, unsigned) of the NEON intrinsics
_NEON = {"aarch64": ("llvm.aarch64.neon.", "smull", "umull", "saddlp", "uaddlp"),
         "armv7": ("llvm.arm.neon.", "vmulls", "vmullu", "vpaddls", "vpaddlu")}


def _neon_pair_sums(B: ir.IRBuilder, arch: str, kind: str, a: ir.Value, b: ir.Value) -> List[ir.Value]:
    """For 4 lanes: per 8-byte half, the byte products widened to i16 (smull/umull, vmull; u8s8: zext/sext and a
    16-bit mul, exact as every u8*s8 product fits int16) and added in pairs to <4 x i32> (saddlp/uaddlp, vpaddl)."""
    prefix, smull, umull, saddlp, uaddlp = _NEON[arch]
    (x0, x1), (y0, y1) = _split8(B, _as_bytes(B, a)), _split8(B, _as_bytes(B, b))
    sums = []
    for x, y in ((x0, y0), (x1, y1)):
        if kind == "u8s8":
            p = B.mul(B.zext(x, _vec(I16, 8)), B.sext(y, _vec(I16, 8)))
        else:
            p = _intrinsic(B, prefix + "%s.v8i16" % (smull if kind == "s8s8" else umull), _vec(I16, 8), [x, y])
        pair = uaddlp if kind == "u8u8" else saddlp
        sums.append(_intrinsic(B, prefix + "%s.v4i32.v8i16" % pair, _vec(I32, 4), [p]))
    return sums


def _arm64_widening(B: ir.IRBuilder, kind: str, acc: ir.Value, a: ir.Value, b: ir.Value) -> ir.Value:
    """4 lanes: the pair sums of both halves added pairwise once more (addp)."""
    sums = _neon_pair_sums(B, "aarch64", kind, a, b)
    return B.add(acc, _intrinsic(B, "llvm.aarch64.neon.addp.v4i32", _vec(I32, 4), sums))


def _armv7_widening(B: ir.IRBuilder, kind: str, acc: ir.Value, a: ir.Value, b: ir.Value) -> ir.Value:
    """4 lanes: the pair sums of each half added pairwise once more (vpadd on its two d registers)."""
    lanes = [_intrinsic(B, "llvm.arm.neon.vpadd.v2i32", _vec(I32, 2), [_pick(B, q, [0, 1]), _pick(B, q, [2, 3])])
             for q in _neon_pair_sums(B, "armv7", kind, a, b)]
    return B.add(acc, B.shuffle_vector(lanes[0], lanes[1], ir.Constant(_vec(I32, 4), [0, 1, 2, 3])))


def _x86_widening(B: ir.IRBuilder, kind: str, acc: ir.Value, a: ir.Value, b: ir.Value) -> ir.Value:
    """w lanes: the bytes widened to i16 (each fits signed i16, so every kind is exact), pmaddwd (i16 products
    summed in pairs into i32, exact: |sum| <= 2 * 255 * 255), then the two pairs of each lane added."""
    w = a.type.count
    sa, sb = _SIGNED[kind]
    x, y = _extend(B, _as_bytes(B, a), sa, I16), _extend(B, _as_bytes(B, b), sb, I16)
    name = {2: "llvm.x86.sse2.pmadd.wd", 4: "llvm.x86.avx2.pmadd.wd", 8: "llvm.x86.avx512.pmaddw.d.512"}[w]
    pairs = _intrinsic(B, name, _vec(I32, 2 * w), [x, y])
    return B.add(acc, B.add(_pick(B, pairs, list(range(0, 2 * w, 2))), _pick(B, pairs, list(range(1, 2 * w, 2)))))


def _wasm_widening(B: ir.IRBuilder, kind: str, acc: ir.Value, a: ir.Value, b: ir.Value) -> ir.Value:
    """4 lanes: each 8-byte half widened to <8 x i16> (every kind is exact in i16), i32x4.dot_i16x8_s (products
    summed in pairs, exact as for pmaddwd), then the two pair sums of each lane added."""
    sa, sb = _SIGNED[kind]
    (x0, x1), (y0, y1) = _split8(B, _as_bytes(B, a)), _split8(B, _as_bytes(B, b))
    d0, d1 = (_intrinsic(B, "llvm.wasm.dot", _vec(I32, 4), [_extend(B, x, sa, I16), _extend(B, y, sb, I16)])
              for x, y in ((x0, y0), (x1, y1)))
    even = B.shuffle_vector(d0, d1, ir.Constant(_vec(I32, 4), [0, 2, 4, 6]))
    odd = B.shuffle_vector(d0, d1, ir.Constant(_vec(I32, 4), [1, 3, 5, 7]))
    return B.add(acc, B.add(even, odd))


def _split8(B: ir.IRBuilder, v: ir.Value) -> Tuple[ir.Value, ir.Value]:
    return _pick(B, v, list(range(8))), _pick(B, v, list(range(8, 16)))


def _widening(target: Any) -> Optional[Tuple[Tuple[int, ...], GroupFn]]:
    """The widening sequence of the target: x86 pmaddwd (SSE2, AVX2 or AVX512BW wide), Arm NEON; None on
    targets without SIMD (armv7 without NEON)."""
    have = target.available_features
    if target.arch == "x86_64":
        widths = ((8,) if "avx512bw" in have else ()) + ((4,) if "avx2" in have else ()) + (2,)
        return widths, _x86_widening
    if target.arch == "aarch64" and "asimd" in have:
        return (4,), _arm64_widening
    if target.arch == "armv7" and "neon" in have:
        return (4,), _armv7_widening
    if target.arch == "wasm32" and "simd128" in have:
        return (4,), _wasm_widening
    return None


def _lanes(v: ir.Value) -> int:
    return v.type.count if is_vec(v) else 1


def _as_bytes(B: ir.IRBuilder, v: ir.Value) -> ir.Value:
    """An i32 or <n x i32> as its <4n x i8> bytes (every target is little-endian: byte t of a lane is element t)."""
    return B.bitcast(v, ir.VectorType(I8, 4 * _lanes(v)))


def _extend(B: ir.IRBuilder, v: ir.Value, signed: bool, ty: ir.Type) -> ir.Value:
    return (B.sext if signed else B.zext)(v, ir.VectorType(ty, v.type.count))


def _pick(B: ir.IRBuilder, v: ir.Value, indices: List[int]) -> ir.Value:
    mask = ir.Constant(ir.VectorType(I32, len(indices)), indices)
    return B.shuffle_vector(v, ir.Constant(v.type, ir.Undefined), mask)


def _generic(B: ir.IRBuilder, kind: str, a: ir.Value, b: ir.Value) -> ir.Value:
    """Exact on every target: widen the bytes to i32, multiply, add the four products of each lane."""
    n = _lanes(a)
    sa, sb = _SIGNED[kind]
    prod = B.mul(_extend(B, _as_bytes(B, a), sa, I32), _extend(B, _as_bytes(B, b), sb, I32))
    out = None
    for t in range(4):
        part = _pick(B, prod, [4 * i + t for i in range(n)])
        out = part if out is None else B.add(out, part)
    return out if is_vec(a) else B.extract_element(out, ir.Constant(I32, 0))
