"""Integer index arithmetic emitted once per basic block: constant folding and common subexpressions.

A scheduled kernel's loop IR computes every buffer index from the loop variables, and an unrolled body repeats the
same sub-expressions once per unrolled iteration (``urem fused, 134`` and its products, ``mul 0, 32``...): in the
detectors of model_kinds half of all instructions were ``add``/``mul`` of indices. LLVM removes them again, but
every one costs Python time to build and print, and LLVM time to parse and simplify. Here an integer
``add``/``sub``/``mul`` (and ``udiv``/``urem`` by a constant) whose operands are the same IR values as an earlier
one in the same basic block reuses that instruction, one of two integer constants is folded, and ``x + 0``,
``x - 0`` and ``x * 1`` are ``x``.

Sound because the builder only appends (every ``position_*`` in codegen is ``position_at_end``): an instruction
earlier in the block dominates the rest of the block. Constants are compared by type and value, other operands
by identity; they are kept alive with the memo, so their ``id()`` cannot be reused by another value while an
entry exists. The memo lives for one function (FunctionEmitter).
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Optional, Tuple

from llvmlite import ir

# Folding a constant add/sub/mul wraps to the type's width: the nsw flag makes an overflow poison, of which any
# value is a refinement.
_FOLD: Dict[str, Callable[[int, int], int]] = {"add": lambda x, y: x + y, "sub": lambda x, y: x - y,
                                                "mul": lambda x, y: x * y}


def _fold(op: str, a: ir.Value, b: ir.Value) -> Optional[ir.Constant]:
    if op not in _FOLD or not (isinstance(a, ir.Constant) and isinstance(b, ir.Constant)):
        return None
    ty = a.type
    if not isinstance(ty, ir.IntType) or b.type != ty or not isinstance(a.constant, int) \
            or not isinstance(b.constant, int):
        return None
    bits = ty.width
    v = _FOLD[op](a.constant, b.constant) & ((1 << bits) - 1)
    if v >= 1 << (bits - 1):
        v -= 1 << bits
    return ir.Constant(ty, v)


def _identity(op: str, a: ir.Value, b: ir.Value) -> Optional[ir.Value]:
    """``a`` for ``a + 0``, ``a - 0`` and ``a * 1`` (``b`` for ``0 + b`` and ``1 * b``), else None: an unrolled
    iteration's offset 0 and a unit stride are most of them."""
    def is_const(v: ir.Value, k: int) -> bool:
        return isinstance(v, ir.Constant) and isinstance(v.constant, int) and v.constant == k and v.type == \
            (b.type if v is a else a.type)

    unit = 1 if op == "mul" else 0
    if op in ("add", "sub", "mul") and is_const(b, unit):
        return a
    if op in ("add", "mul") and is_const(a, unit):
        return b
    return None


def _operand_key(v: ir.Value) -> Any:
    """A constant by its type and value (codegen makes a new one per use), anything else by identity."""
    if isinstance(v, ir.Constant) and isinstance(v.constant, int):
        return ("const", str(v.type), v.constant)
    return id(v)


class IntCSE:
    """Per-function memo of integer instructions by (block, opcode, flags, operands)."""

    def __init__(self) -> None:
        self._memo: Dict[Tuple[Any, ...], Tuple[ir.Value, ir.Value, ir.Value]] = {}

    def emit(self, B: ir.IRBuilder, op: str, a: ir.Value, b: ir.Value, flags: tuple,
             build: Callable[[], ir.Value]) -> ir.Value:
        """The value of ``a <op> b``: folded, an earlier identical instruction of this block, or ``build()``."""
        folded = _fold(op, a, b)
        if folded is not None:
            return folded
        same = _identity(op, a, b)
        if same is not None:
            return same
        key = (id(B.block), op, flags, _operand_key(a), _operand_key(b))
        hit = self._memo.get(key)
        if hit is not None:
            return hit[2]
        value = build()
        if getattr(value, "parent", None) is B.block:   # the block holds the instruction, which keeps it alive
            self._memo[key] = (a, b, value)
        return value
