"""Code for ``dot4(a, b, kind)`` (tether.tir.int8): four byte products summed into an int32, per lane.

In a vectorized loop ``acc + dot4(a, b)`` (either order) is one dot-product instruction accumulating into ``acc``
where the target has one for the kind (tether.target.int8_dot_native): x86 vpdpbusd (u8s8; 16, 8 or 4 lanes),
aarch64 sdot/udot (s8s8/u8u8; 4 lanes). Lane counts that are not the instruction's width are split into
instruction-wide pieces (the last one padded with zero lanes) and joined again.

Elsewhere the bytes are widened and multiplied exactly, then the four products of a lane are added pairwise; the
pieces are written so that LLVM selects the target's widening instructions (x86 pmaddwd, Arm smull/saddlp or
vmull/vpaddl). Products of two bytes fit int16 except 255*255 (u8u8), which fits uint16; the sum of two never
needs more than int32. pmaddubsw (u8*s8 pairs summed with int16 saturation) is not used: two products can
exceed int16 (2 * 255 * 127), so it is not exact.
"""
from __future__ import annotations

from typing import Any, List, Optional, Tuple

from llvmlite import ir

from tether.codegen.types import I8, I32, is_vec
from tether.tir import Binary, Call, Expr, dot4_kind

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
    a, b = em.match(em.ev(call.args[0]), em.ev(call.args[1]))
    acc_v = None
    if acc is not None:
        acc_v = em.ev(acc)
        a, acc_v = em.match(a, acc_v)
        b, acc_v = em.match(b, acc_v)
    out = _generic(em.b, kind, a, b)
    if acc_v is None:
        return out
    out, acc_v = em.match(out, acc_v)
    return em.b.add(acc_v, out)


def _lanes(v: ir.Value) -> int:
    return v.type.count if is_vec(v) else 1


def _as_bytes(B: ir.IRBuilder, v: ir.Value) -> ir.Value:
    """An i32 or <n x i32> as its <4n x i8> bytes (every target is little-endian: byte t of a lane is element t)."""
    return B.bitcast(v, ir.VectorType(I8, 4 * _lanes(v)))


def _extend(B: ir.IRBuilder, v: ir.Value, signed: bool, ty: ir.Type) -> ir.Value:
    return (B.sext if signed else B.zext)(v, ir.VectorType(ty, v.type.count))


def _pick(B: ir.IRBuilder, v: ir.Value, indices: List[int]) -> ir.Value:
    return B.shuffle_vector(v, ir.Constant(v.type, ir.Undefined), ir.Constant(ir.VectorType(I32, len(indices)), indices))


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
