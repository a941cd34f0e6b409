"""Loop IR: flat buffers, loads/stores with one linear index, loops with a kind, allocations and guards.

Scalar expressions are the te expression nodes (tether.te.expr) plus ``Load``; lowering replaces every
``TensorLoad`` with a ``Load`` from a buffer.
"""
from __future__ import annotations

from typing import Callable, Sequence

from tether.te.expr import Expr, Var


class Buffer:
    """A flat array: a kernel parameter ("param"), or an internal buffer ("local" scratch)."""

    __hash__ = object.__hash__

    def __init__(self, name: str, shape: Sequence[int], dtype: str, scope: str = "param"):
        self.name = name
        self.shape = tuple(int(d) for d in shape)
        self.dtype = dtype
        self.scope = scope

    @property
    def size(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    def __repr__(self) -> str:
        return f"Buffer({self.name}, {self.shape}, {self.dtype}, {self.scope})"


class Load(Expr):
    __slots__ = ("buffer", "index")

    def __init__(self, buffer: Buffer, index: Expr):
        self.buffer = buffer
        self.index = index
        self.dtype = buffer.dtype

    def children(self) -> list[Expr]:
        return [self.index]

    def rebuild(self, fn: Callable[[Expr], Expr]) -> "Load":
        idx = fn(self.index)
        return self if idx is self.index else Load(self.buffer, idx)


class Stmt:
    __hash__ = object.__hash__

    def __str__(self) -> str:
        from tether.tir.printer import stmt_str
        return stmt_str(self)

    __repr__ = __str__


class For(Stmt):
    """``for var in [min, min + extent)``; kind: serial | vectorized | unrolled | parallel.

    ``extent`` may be an expression of enclosing loop variables (a clamped tail); ``max_extent`` is then the
    constant upper bound that vectorized/unrolled loops are specialised for.
    """

    def __init__(self, var: Var, min: Expr, extent: Expr, kind: str, body: Stmt, max_extent: int | None = None):
        self.var, self.min, self.extent, self.kind, self.body = var, min, extent, kind, body
        self.max_extent = max_extent
        self.tail = False   # set on remainder loops split off by loop partitioning
        # On the full-tile side of a partition the extent is the constant max_extent, which equals this clamp
        # expression there; codegen uses it to prove that accesses stay in bounds.
        self.bound_extent: Expr | None = None


class Store(Stmt):
    """``buffer[index] = value``; ``reduction`` names the combiner when this is a reduction's update."""

    def __init__(self, buffer: Buffer, index: Expr, value: Expr, reduction: str | None = None):
        self.buffer, self.index, self.value = buffer, index, value
        self.reduction = reduction


class Allocate(Stmt):
    def __init__(self, buffer: Buffer, body: Stmt):
        self.buffer, self.body = buffer, body


class IfThenElse(Stmt):
    def __init__(self, cond: Expr, then_case: Stmt, else_case: Stmt | None = None):
        self.cond, self.then_case, self.else_case = cond, then_case, else_case


class SeqStmt(Stmt):
    def __init__(self, stmts: Sequence[Stmt]):
        flat: list[Stmt] = []
        for s in stmts:
            if isinstance(s, SeqStmt):
                flat.extend(s.stmts)
            elif s is not None:
                flat.append(s)
        self.stmts = flat


def seq(*stmts: Stmt | None) -> Stmt:
    s = SeqStmt([x for x in stmts if x is not None])
    return s.stmts[0] if len(s.stmts) == 1 else s


class PrimFunc:
    """A lowered kernel: ``params`` are the te Tensors (inputs then outputs) bound to ``param_buffers``."""

    def __init__(self, name: str, params: Sequence, param_buffers: Sequence[Buffer], body: Stmt):
        self.name = name
        self.params = list(params)
        self.param_buffers = list(param_buffers)
        self.body = body

    @property
    def has_parallel(self) -> bool:
        return any(isinstance(s, For) and s.kind == "parallel" for s in walk_stmts(self.body))

    @property
    def parallel(self) -> bool:  # read by ModuleBuilder for the metadata's "parallel" flag
        return self.has_parallel

    def __str__(self) -> str:
        from tether.tir.printer import func_str
        return func_str(self)

    __repr__ = __str__


def stmt_children(s: Stmt) -> list[Stmt]:
    if isinstance(s, (For, Allocate)):
        return [s.body]
    if isinstance(s, IfThenElse):
        return [s.then_case] + ([s.else_case] if s.else_case is not None else [])
    if isinstance(s, SeqStmt):
        return list(s.stmts)
    return []


def walk_stmts(s: Stmt):
    stack = [s]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(reversed(stmt_children(node)))
