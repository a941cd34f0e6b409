"""The int8 dot-product primitive: ``dot4(a, b, kind)``, the sum of four byte products packed in two int32s.

``a`` and ``b`` are int32 expressions each holding four bytes, little-endian (byte t is bits 8t..8t+7). The result
is the int32 ``sum(A_t * B_t for t in 0..3)`` where ``kind`` says how the bytes are read: "u8s8" (A unsigned, B
signed: x86's vpdpbusd), "s8s8" (both signed: Arm's sdot), "u8u8" (both unsigned: udot). It is exact: the sum of
four products is at most 4 * 255 * 255 < 2**31.

It is an ordinary scalar expression (a Call node): usable anywhere, also in a te.sum reduction and in vectorized
loops, where codegen/int8dot.py turns ``acc + dot4(a, b)`` into one dot-product instruction when the target has
one (tether.target.int8_dot_native) and into widening multiplies and pairwise adds otherwise.

``byte_of(word, t, signed)`` is the other int8 primitive: byte t of an int32 word as an int32, sign- or
zero-extended. Kernels for cores without a dot product multiply it by 16-bit weights (``int32(byte_of(x, t)) *
int32(w16)``), which codegen/int8dot.py emits so that a broadcast byte becomes one lane of a widened vector:
Arm's multiply-accumulate long by element (smlal v.4s, v.4h, v.h[t]), four products per instruction.

``pair_dot(a_lo, a_hi, b_lo, b_hi)`` multiplies bytes held two to an int16: for byte t (0, 1) of each operand,
``a_lo.t * b_lo.t + a_hi.t * b_hi.t`` is taken modulo 2**16 (an int16), and the two sums are added as an int32,
all bytes signed. It is what Arm's smull + smlal2 (eight int16 sums of two products) and sadalp (adjacent sums
added into int32 lanes) compute on 16 bytes: four products per instruction with nothing widened first. It is exact
when no sum of two products leaves int16, which holds when one side's bytes stay within [-127, 127] (2 * 128 *
127 = 32512); the caller guarantees that (ops/qconv.py's pairs form checks its weights).

``quad_sum(a0, a1, a2, a3)`` is the int32 ``a0 + a1 + a2 + a3``. Where the four are, in a vector loop, loads 0..3 of
groups of four consecutive elements (index 4 * lane + j: the pairs form's accumulators, four lanes per output),
codegen/int8dot.py adds each group's lanes pairwise (Arm's addp: 3 instructions per 4 groups), where four
strided loads became shuffles per lane.
"""
from __future__ import annotations

from typing import Any

from tether.tir.expr import Call, Expr, convert

DOT4_KINDS = ("u8s8", "s8s8", "u8u8")
_PREFIX = "dot4_"
_BYTE_PREFIX = "byte_of_"
_PAIR_DOT = "pair_dot_s8"
_QUAD_SUM = "quad_sum"


def dot4(a: Any, b: Any, kind: str = "u8s8") -> Expr:
    """``sum_t A_t * B_t`` over the four bytes of int32 ``a`` and ``b`` read as ``kind`` (see the module doc)."""
    if kind not in DOT4_KINDS:
        raise ValueError("dot4 kind must be one of %s, not %r" % (", ".join(DOT4_KINDS), kind))
    a, b = convert(a, "int32"), convert(b, "int32")
    for name, x in (("a", a), ("b", b)):
        if x.dtype != "int32":
            raise TypeError("dot4 operand %s must be an int32 holding four bytes, got %s (%s); bitcast or pack "
                            "the bytes into int32 first" % (name, x.dtype, x))
    return Call(_PREFIX + kind, [a, b], "int32")


def dot4_kind(e: Expr) -> str | None:
    """The kind of a dot4 node ("u8s8", ...), None for any other expression."""
    if isinstance(e, Call) and e.name.startswith(_PREFIX) and e.name[len(_PREFIX):] in DOT4_KINDS:
        return e.name[len(_PREFIX):]
    return None


def byte_of(word: Any, index: Any, signed: bool) -> Expr:
    """Byte ``index`` (0..3, little-endian; an int32 expression, e.g. an unrolled reduction axis) of the int32
    ``word`` as an int32: -128..127 if ``signed``, else 0..255. An index outside 0..3 is undefined."""
    if isinstance(index, int) and index not in (0, 1, 2, 3):
        raise ValueError("byte_of index must be 0, 1, 2 or 3, not %r" % (index,))
    word, index = convert(word, "int32"), convert(index, "int32")
    for name, x in (("word", word), ("index", index)):
        if x.dtype != "int32":
            raise TypeError("byte_of %s must be an int32, got %s (%s)" % (name, x.dtype, x))
    return Call(_BYTE_PREFIX + ("s8" if signed else "u8"), [word, index], "int32")


def byte_of_parts(e: Expr) -> bool | None:
    """Whether a byte_of node reads its byte signed; None for any other expression."""
    if isinstance(e, Call) and e.name in (_BYTE_PREFIX + "s8", _BYTE_PREFIX + "u8"):
        return e.name.endswith("s8")
    return None


def pair_dot(a_lo: Any, a_hi: Any, b_lo: Any, b_hi: Any) -> Expr:
    """``sum_t int16(a_lo.t * b_lo.t + a_hi.t * b_hi.t)`` over the two signed bytes t of four int16 operands, as
    an int32 (see the module doc: exact while each int16 sum fits)."""
    args = [convert(x, "int16") for x in (a_lo, a_hi, b_lo, b_hi)]
    for name, x in zip(("a_lo", "a_hi", "b_lo", "b_hi"), args):
        if x.dtype != "int16":
            raise TypeError("pair_dot operand %s must be an int16 holding two bytes, got %s (%s)" % (name, x.dtype, x))
    return Call(_PAIR_DOT, args, "int32")


def is_pair_dot(e: Expr) -> bool:
    return isinstance(e, Call) and e.name == _PAIR_DOT


def quad_sum(a0: Any, a1: Any, a2: Any, a3: Any) -> Expr:
    """``a0 + a1 + a2 + a3`` of four int32s (see the module doc for how it is emitted)."""
    args = [convert(x, "int32") for x in (a0, a1, a2, a3)]
    if any(x.dtype != "int32" for x in args):
        raise TypeError("quad_sum takes int32 operands, got %s" % ", ".join(x.dtype for x in args))
    return Call(_QUAD_SUM, args, "int32")


def is_quad_sum(e: Expr) -> bool:
    return isinstance(e, Call) and e.name == _QUAD_SUM
