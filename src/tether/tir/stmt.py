"""Loop IR statements: loops with a kind, stores with one linear index, allocations, guards, and the lowered
kernel (PrimFunc) they form; with their text form (TVM-TIR-like nested loops annotated with their kind).

Like expressions, each statement class lists its child statements in ``_fields`` (see tether.tir.visit).
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence

from tether.tir.buffer import Buffer
from tether.tir.expr import Const, Expr, Var, parenthesized, var_names
from tether.tir.visit import walk


class Stmt:
    __hash__ = object.__hash__
    _fields: tuple = ()

    def _lines(self, pad: str, out: List[str]) -> None:
        out.append(f"{pad}<{type(self).__name__}>")

    def __str__(self) -> str:
        out: List[str] = []
        self._lines("", out)
        return "\n".join(out)

    __repr__ = __str__


class For(Stmt):
    """``for var in [min, min + extent)``; kind: serial | vectorized | unrolled | parallel | thread.

    ``extent`` may be an expression of enclosing loop variables (a clamped tail); ``max_extent`` is then the
    constant upper bound that vectorized/unrolled loops are specialised for. A ``"thread"`` loop runs its
    iterations as the GPU thread index ``thread_tag`` (one of tether.tir.device.THREAD_TAGS); the host/device
    split (tether.tir.device_split) turns it into a launch dimension.
    """

    _fields = ("body",)

    def __init__(self, var: Var, min: Expr, extent: Expr, kind: str, body: Stmt, max_extent: int | None = None,
                 thread_tag: str | None = None):
        self.var, self.min, self.extent, self.kind, self.body = var, min, extent, kind, body
        self.max_extent = max_extent
        self.thread_tag = thread_tag
        self.tail = False   # set on remainder loops split off by loop partitioning
        # On the full-tile side of a partition the extent is the constant max_extent, which equals this clamp
        # expression there; codegen uses it to prove that accesses stay in bounds.
        self.bound_extent: Expr | None = None

    def _lines(self, pad: str, out: List[str]) -> None:
        kind = "" if self.kind == "serial" else f" {self.kind}"
        if self.kind == "thread":
            kind = f" thread({self.thread_tag})"
        if isinstance(self.min, Const) and self.min.value == 0:
            rng = str(self.extent)
        else:
            rng = f"{self.min}, {self.min} + {parenthesized(self.extent, 5)}"
        out.append(f"{pad}for {self.var} in range({rng}){kind}:")
        self.body._lines(pad + "  ", out)


class Store(Stmt):
    """``buffer[index] = value``; ``reduction`` names the combiner when this is a reduction's update."""

    def __init__(self, buffer: Buffer, index: Expr, value: Expr, reduction: str | None = None):
        self.buffer, self.index, self.value = buffer, index, value
        self.reduction = reduction

    def _lines(self, pad: str, out: List[str]) -> None:
        out.append(f"{pad}{self.buffer.name}[{self.index}] = {self.value}")


class Prefetch(Stmt):
    """A hint that ``buffer[index]`` is read soon: the CPU code generator issues a cache prefetch of its line (never
    a fault, whatever the address: an index past the buffer's end is allowed), others nothing. Results never
    depend on it."""

    def __init__(self, buffer: Buffer, index: Expr):
        self.buffer, self.index = buffer, index

    def _lines(self, pad: str, out: List[str]) -> None:
        out.append(f"{pad}prefetch {self.buffer.name}[{self.index}]")


class Allocate(Stmt):
    _fields = ("body",)

    def __init__(self, buffer: Buffer, body: Stmt):
        self.buffer, self.body = buffer, body

    def _lines(self, pad: str, out: List[str]) -> None:
        b = self.buffer
        out.append(f"{pad}allocate {b.name}: {b.dtype}[{b.size}]  # {b.scope}")
        self.body._lines(pad, out)


class IfThenElse(Stmt):
    _fields = ("then_case", "else_case")

    def __init__(self, cond: Expr, then_case: Stmt, else_case: Stmt | None = None):
        self.cond, self.then_case, self.else_case = cond, then_case, else_case

    def _lines(self, pad: str, out: List[str]) -> None:
        out.append(f"{pad}if {self.cond}:")
        self.then_case._lines(pad + "  ", out)
        if self.else_case is not None:
            out.append(f"{pad}else:")
            self.else_case._lines(pad + "  ", out)


class SeqStmt(Stmt):
    """Statements in order; always flat (a SeqStmt never holds another one, nor None)."""

    _fields = ("stmts",)

    def __init__(self, stmts: Sequence[Stmt]):
        self.stmts = stmts

    @property
    def stmts(self) -> List[Stmt]:
        return self._stmts

    @stmts.setter
    def stmts(self, stmts: Sequence[Stmt]) -> None:
        flat: List[Stmt] = []
        for s in stmts:
            if isinstance(s, SeqStmt):
                flat.extend(s.stmts)
            elif s is not None:
                flat.append(s)
        self._stmts = flat

    def _lines(self, pad: str, out: List[str]) -> None:
        for s in self.stmts:
            s._lines(pad, out)


def seq(*stmts: Optional[Stmt]) -> Stmt:
    s = SeqStmt([x for x in stmts if x is not None])
    return s.stmts[0] if len(s.stmts) == 1 else s


class PrimFunc:
    """A lowered kernel: ``params`` are the te Tensors (inputs then outputs; each has ``.name``, ``.shape`` and
    ``.dtype``) bound to ``param_buffers``."""

    def __init__(self, name: str, params: Sequence, param_buffers: Sequence[Buffer], body: Stmt):
        self.name = name
        self.params = list(params)
        self.param_buffers = list(param_buffers)
        self.body = body

    @property
    def has_parallel(self) -> bool:
        return any(isinstance(s, For) and s.kind == "parallel" for s in walk(self.body))

    @property
    def parallel(self) -> bool:  # read by ModuleBuilder for the metadata's "parallel" flag
        return self.has_parallel

    def __str__(self) -> str:
        params = ", ".join(f"{b.name}: {b.dtype}[{', '.join(str(d) for d in b.shape)}]" for b in self.param_buffers)
        out = [f"def {self.name}({params}):"]
        with var_names(_loop_var_names(self.body)):
            self.body._lines("  ", out)
        return "\n".join(out)

    __repr__ = __str__


def _loop_var_names(body: Stmt) -> Dict[int, str]:
    """Printing names for the loop variables: a name used by several loops gets a numeric suffix."""
    names: Dict[int, str] = {}
    used: Dict[str, int] = {}
    for s in walk(body):
        if isinstance(s, For) and id(s.var) not in names:
            base = s.var.name
            n = used.get(base, 0)
            names[id(s.var)] = base if n == 0 else f"{base}_{n}"
            used[base] = n + 1
    return names
