"""Scalar loads of consecutive elements across an unrolled loop, loaded once as a vector (Arm).

In an unrolled loop over ``v``, a scalar load ``B[base + v]`` that a vectorized body broadcasts (a matmul's A
element, one per reduction step) is loaded once per group of GROUP copies as a vector, and each copy takes its lane.
AArch64 then multiplies by element (``fmla v.4s, v.4s, v.s[lane]``; float16 where the target computes in half:
``fmla v.8h, v.8h, v.h[lane]``): one ``ldr q`` (``ldr d``) where there were four ``ldr s`` (``ldr h``); a dense
micro-kernel of 6 rows x 16 columns loaded A with 6 of its 32 instructions per reduction step. armv7 takes the
groups too (a transformer's dense layers counted 35-40% fewer instructions on the emulated Cortex-A7). Elsewhere a
broadcast load from memory is as cheap as a lane, so x86 and wasm32 keep their scalar loads.

A group is formed only where it is safe and equivalent: every copy of the loop's body runs straight through (no
conditions, no loops but full unrolled or vectorized ones, so the vector loaded in the group's first copy
dominates the later ones), the buffer is not stored to in the body, the index moves by exactly one element per
iteration and does not depend on a vector lane, and all GROUP elements of a group are loaded by its copies anyway.
"""
from __future__ import annotations

from typing import Any, Dict, Optional, Set, Tuple

from llvmlite import ir

from tether.codegen.types import I32, native_half
from tether.tir import Binary, Const, Expr, For, IfThenElse, Load, Select, Stmt, Store, Var, substitute, walk
from tether.tir.simplify import simplify

GROUP = 4
_ARCHS = ("aarch64", "armv7")


class LaneGroups:
    """The grouped loads of one unrolled loop while its copies are emitted (``copy``: the copy being emitted)."""

    def __init__(self, var: Var, extent: int, loads: Set[int]):
        self.var = var
        self.extent = extent
        self.loads = loads
        self.copy = 0
        self.vectors: Dict[Tuple, ir.Value] = {}

    def load(self, em: Any, e: Load, ptr_of: Any, ety: ir.Type, align: int) -> Optional[ir.Value]:
        """The element of load ``e`` in the current copy, from its group's vector; None when ``e`` is not grouped
        or its group is a partial one at the loop's end."""
        if id(e) not in self.loads:
            return None
        first = self.copy - self.copy % GROUP
        if first + GROUP > self.extent:
            return None
        key = (id(e),) + tuple(em.unroll_copy.get(v, id(em.env.get(v))) for v in _vars(e.index) if v is not self.var)
        if self.copy == first:
            self.vectors[key] = em.b.load(ptr_of(e), typ=ir.VectorType(ety, GROUP), align=align)
        vec = self.vectors.get(key)
        if vec is None:
            return None
        return em.b.extract_element(vec, ir.Constant(I32, self.copy - first))


def plan(target: Any, s: For) -> Optional[LaneGroups]:
    """The lane groups of unrolled loop ``s`` on ``target``, or None when it has none."""
    extent = s.max_extent
    if getattr(target, "arch", None) not in _ARCHS or extent < GROUP or not isinstance(s.min, Const):
        return None
    if not _straight(s.body):
        return None
    stored = {id(st.buffer) for st in walk(s.body) if isinstance(st, Store)}
    lane_vars = [f.var for f in walk(s.body) if isinstance(f, For) and f.kind == "vectorized"]
    loads = set()
    for e in _exprs(s.body):
        for ld in (n for n in walk(e) if isinstance(n, Load)):
            wanted = ld.buffer.dtype == "float32" or native_half(ld.buffer.dtype)
            if (wanted and id(ld.buffer) not in stored and _steps_by_one(ld.index, s.var)
                    and not any(_uses(ld.index, v) for v in lane_vars)):
                loads.add(id(ld))
    return LaneGroups(s.var, extent, loads) if loads else None


def _straight(body: Stmt) -> bool:
    """Whether every statement of ``body`` runs unconditionally, in one basic block sequence."""
    for st in walk(body):
        if isinstance(st, IfThenElse):
            return False
        if isinstance(st, For) and (st.kind not in ("unrolled", "vectorized") or not isinstance(st.extent, Const)
                                    or st.extent.value != st.max_extent):
            return False
    return not any(isinstance(n, Select) for e in _exprs(body) for n in walk(e))


def _exprs(body: Stmt):
    for st in walk(body):
        if isinstance(st, Store):
            yield st.value
            yield st.index


def _steps_by_one(index: Expr, var: Var) -> bool:
    if not _uses(index, var):
        return False
    moved = substitute(index, {var: Binary("add", var, Const(1, var.dtype), var.dtype)})
    step = simplify(Binary("sub", moved, index, index.dtype))
    return isinstance(step, Const) and step.value == 1


def _uses(e: Expr, var: Var) -> bool:
    return any(n is var for n in walk(e))


def _vars(e: Expr):
    seen = []
    for n in walk(e):
        if isinstance(n, Var) and all(n is not s for s in seen):
            seen.append(n)
    return seen
