"""Passes over lowered loop IR: the loop-nesting check and tail partitioning of clamped loops."""
from __future__ import annotations

from typing import Optional

from tether.errors import ScheduleError
from tether.tir.expr import Binary, Compare, Const, Expr
from tether.tir.simplify import Simplifier, simplify
from tether.tir.stmt import Allocate, For, IfThenElse, Stmt, seq
from tether.tir.visit import children, map_children, replace, substitute, var_ids, walk

MAX_VECTOR_LANES = 64
MAX_UNROLL = 1024


def _c(v: int) -> Const:
    return Const(v, "int32")


def check_loops(body: Stmt) -> None:
    """Reject loop-kind nestings the code generator cannot honour, naming the loops involved."""
    def visit(s: Stmt, vec: Optional[For], par: Optional[For]) -> None:
        if isinstance(s, For):
            if s.kind == "vectorized":
                if vec is not None:
                    raise ScheduleError(f"vectorized loop {s.var.name!r} is nested inside vectorized loop "
                                        f"{vec.var.name!r}; vectorize only one (the innermost) loop")
                if s.max_extent > MAX_VECTOR_LANES:
                    raise ScheduleError(f"vectorize {s.var.name!r}: extent {s.max_extent} is too wide (max "
                                        f"{MAX_VECTOR_LANES} lanes); split it and vectorize the inner part")
            if s.kind == "parallel":
                if vec is not None:
                    raise ScheduleError(f"parallel loop {s.var.name!r} is inside vectorized loop "
                                        f"{vec.var.name!r}; parallelize an outer loop")
                if par is not None:
                    raise ScheduleError(f"parallel loop {s.var.name!r} is nested inside parallel loop "
                                        f"{par.var.name!r}; mark only one loop of a nest parallel (fuse them)")
            if s.kind == "unrolled" and s.max_extent > MAX_UNROLL:
                raise ScheduleError(f"unroll {s.var.name!r}: extent {s.max_extent} is too large to unroll "
                                    f"(max {MAX_UNROLL}); split it first")
            visit(s.body, s if s.kind == "vectorized" else vec, s if s.kind == "parallel" else par)
            return
        if isinstance(s, Allocate) and vec is not None:
            raise ScheduleError(f"compute_at inside vectorized loop {vec.var.name!r} ({s.buffer.name!r}); "
                                "attach it at an outer loop")
        for c in children(s):
            visit(c, vec, par)
    visit(body, None, None)


def partition_tails(s: Stmt, bound: frozenset = frozenset()) -> Stmt:
    """Loop partitioning for clamped vectorized/unrolled loops.

    Inside the loop whose variable their tail clamp depends on, emit ``if all clamps are full: <body with
    constant extents> else: <body with those loops serial>``, so the hot path has no per-iteration tail checks
    and the code size stays linear in the number of clamped loops. ``bound`` holds the ids of the variables of
    the loops enclosing ``s``.
    """
    if not isinstance(s, For):
        return map_children(s, lambda c: partition_tails(c, bound))
    inner = bound | {id(s.var)}
    clamps = [f for f in walk(s.body)
              if isinstance(f, For) and f.kind in ("vectorized", "unrolled") and not isinstance(f.extent, Const)
              and id(s.var) in var_ids(f.extent) and var_ids(f.extent) <= inner]
    if not clamps:
        return map_children(s, lambda c: partition_tails(c, inner))
    ids = {id(f) for f in clamps}
    cond: Optional[Expr] = None
    seen_keys = set()
    keyer = Simplifier({})
    for f in clamps:
        c = Compare("eq", f.extent, _c(f.max_extent))
        k = keyer.key(c)
        if k in seen_keys:
            continue
        seen_keys.add(k)
        cond = c if cond is None else Binary("and", cond, c, "bool")
    full = partition_tails(_specialize(s.body, ids, full=True), inner)
    split = _full_prefix(s, cond)
    if split is not None:
        last = _one_partial_iteration(s, split, clamps)
        if last is not None:
            return _split_loop(s, split, full, partition_tails(_specialize_to(s.body, last), inner))
    generic = partition_tails(_specialize(s.body, ids, full=False), inner)
    if split is not None:
        return _split_loop(s, split, full, generic)
    return replace(s, body=IfThenElse(cond, full, generic))


def _specialize(s: Stmt, ids: set, full: bool) -> Stmt:
    """``s`` with the clamped loops in ``ids`` given their constant extent (``full``) or made serial tails."""
    clamped = id(s) in ids
    s = map_children(s, lambda c: _specialize(c, ids, full))
    if not clamped:
        if not full and isinstance(s, For) and s.kind == "unrolled" and _holds_tail(s.body):
            return _as_tail(s)
        return s
    if full:
        out = For(s.var, s.min, _c(s.max_extent), s.kind, s.body, s.max_extent)
        out.bound_extent = s.extent
        return out
    return _as_tail(s)


def _as_tail(s: For) -> For:
    tail = For(s.var, s.min, s.extent, "serial", s.body, s.max_extent)
    tail.tail = True    # a cold remainder: codegen keeps LLVM from vectorizing/unrolling it
    return tail


# In the remainder copy, an unrolled loop around a remainder loop only makes copies of that loop: the local
# buffers the two index are already indexed at run time there (nothing left for LLVM to keep in registers), and
# the copies were most of a conv's IR (conv2d_pixels' transposed write-back of a partial pixel block: 32 copies of
# a pixel loop, ~1,100 of densenet121's 3,900 lines per 1x1 conv, each compiled by every LLVM pass).
def _holds_tail(s: Stmt) -> bool:
    return any(isinstance(f, For) and f.tail for f in walk(s))


# ---- a single partial iteration (the usual tail of a split) gets constant extents too: a serial tail would
# index an unrolled block's local buffer (a matmul's MR x NR accumulators) by a run-time index, which keeps LLVM
# from promoting that buffer to registers (a 64x512x128 dense with MR=6 ran 3-4x slower than with MR=8)
def _one_partial_iteration(s: For, split: int, clamps: list) -> Optional[dict]:
    """{id(clamped loop): its constant extent} when ``s`` has exactly one partial iteration after ``split`` and
    every clamp is a constant there that the loop can keep its kind with (unrolled; vectorized: a power of two
    of at least 4 lanes); else None."""
    if int(s.extent.value) - split != 1:
        return None
    at = {s.var: _c(int(s.min.value) + split)}
    extents = {}
    for f in clamps:
        v = simplify(substitute(f.extent, at))
        if not isinstance(v, Const) or not 0 < int(v.value) < f.max_extent:
            return None
        n = int(v.value)
        if f.kind == "vectorized" and (n < 4 or n & (n - 1)):
            return None
        extents[id(f)] = n
    return extents


def _specialize_to(s: Stmt, extents: dict) -> Stmt:
    """``s`` with each clamped loop in ``extents`` given that constant extent, keeping its kind."""
    n = extents.get(id(s))
    s = map_children(s, lambda c: _specialize_to(c, extents))
    if n is None:
        return s
    out = For(s.var, s.min, _c(n), s.kind, s.body, n)
    out.bound_extent = s.extent
    return out


def _full_prefix(s: For, cond: Expr) -> Optional[int]:
    """How many leading iterations of constant loop ``s`` have every tail clamp full, when ``cond`` depends on
    ``s``'s variable alone and holds on a prefix of the iterations (clamps ``min(f, n - v*f)`` do); else None."""
    if not (isinstance(s.min, Const) and isinstance(s.extent, Const)) or var_ids(cond) != {id(s.var)}:
        return None
    lo, n = int(s.min.value), int(s.extent.value)

    def full_at(k: int) -> Optional[bool]:
        v = simplify(substitute(cond, {s.var: _c(lo + k)}))
        return bool(v.value) if isinstance(v, Const) else None

    if n <= 0 or full_at(0) is not True:
        return None if n <= 0 or full_at(0) is None else (0 if full_at(n - 1) is False else None)
    good, bad = 0, n        # full_at(good) holds; bad is the first iteration known not to (or n)
    if full_at(n - 1) is True:
        return n
    bad = n - 1
    while bad - good > 1:
        mid = (good + bad) // 2
        r = full_at(mid)
        if r is None:
            return None
        good, bad = (mid, bad) if r else (good, mid)
    # the clamps of one split are monotone in the loop variable, but a fused loop's are not (fuse(jo, io) with a
    # tail in io: full, partial, full, partial...): check every iteration before the split is full and every one
    # after it partial, else keep the per-iteration test
    if not all(full_at(k) is False for k in range(bad, n)) or not all(full_at(k) is True for k in range(1, good)):
        return None
    return bad


def _split_loop(s: For, k: int, full: Stmt, generic: Stmt) -> Stmt:
    """``s`` as its first ``k`` iterations over ``full`` (constant extents, no checks) followed by the remaining
    partial ones over ``generic``: the tail runs once, after the loop, instead of a test in every iteration."""
    lo, n = int(s.min.value), int(s.extent.value)
    parts = []
    if k > 0:
        head = For(s.var, _c(lo), _c(k), s.kind, full, k)
        parts.append(head)
    if k < n:
        tail = For(s.var, _c(lo + k), _c(n - k), "serial" if s.kind == "parallel" else s.kind, generic, n - k)
        parts.append(tail)
    return seq(*parts)
