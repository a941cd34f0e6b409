"""Readable text for expressions and loop IR (TVM-TIR-like: nested for loops annotated with their kind)."""
from __future__ import annotations

import threading

from tether.te.expr import Binary, Call, Cast, Compare, Const, Expr, Not, Reduce, Select, TensorLoad, Var

_BIN = {"add": ("+", 4), "sub": ("-", 4), "mul": ("*", 5), "div": ("/", 5), "floordiv": ("//", 5),
        "floormod": ("%", 5), "and": ("&&", 1), "or": ("||", 0)}
_CMP = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}


def _prec(e: Expr) -> int:
    if isinstance(e, Binary) and e.op in _BIN:
        return _BIN[e.op][1]
    if isinstance(e, Compare):
        return 2
    if isinstance(e, Const) and not isinstance(e.value, bool) and e.value < 0:
        return 6
    return 9


# Printing names for the function being printed (per thread): distinct Vars that share a name (the same axis
# name in two stages) get a numeric suffix so the text is unambiguous.
_STATE = threading.local()


def _name(v: Var) -> str:
    names = getattr(_STATE, "names", None)
    return names.get(id(v), v.name) if names else v.name


def expr_str(e: Expr) -> str:
    from tether.tir.nodes import Load
    if isinstance(e, Const):
        if e.dtype == "bool":
            return "True" if e.value else "False"
        if e.dtype.startswith("float"):
            s = repr(e.value)
            return s + "f" if e.dtype == "float32" else s
        return str(e.value) if e.dtype == "int32" else f"{e.dtype}({e.value})"
    if isinstance(e, Var):
        return _name(e)
    if isinstance(e, Binary):
        if e.op in ("min", "max"):
            return f"{e.op}({expr_str(e.a)}, {expr_str(e.b)})"
        sym, p = _BIN[e.op]
        left = expr_str(e.a)
        right = expr_str(e.b)
        if _prec(e.a) < p:
            left = f"({left})"
        if _prec(e.b) <= p:
            right = f"({right})"
        return f"{left} {sym} {right}"
    if isinstance(e, Compare):
        return f"{_wrap(e.a, 2)} {_CMP[e.op]} {_wrap(e.b, 3)}"
    if isinstance(e, Not):
        return f"!{_wrap(e.a, 8)}"
    if isinstance(e, Select):
        return f"select({expr_str(e.cond)}, {expr_str(e.t)}, {expr_str(e.f)})"
    if isinstance(e, Cast):
        return f"{e.dtype}({expr_str(e.value)})"
    if isinstance(e, Call):
        return f"{e.name}({', '.join(expr_str(a) for a in e.args)})"
    if isinstance(e, TensorLoad):
        return f"{e.tensor.name}[{', '.join(expr_str(i) for i in e.indices)}]"
    if isinstance(e, Load):
        return f"{e.buffer.name}[{expr_str(e.index)}]"
    if isinstance(e, Reduce):
        return (f"reduce_{e.combiner}({expr_str(e.source)}, axis=[{', '.join(a.name for a in e.axis)}])")
    return f"<{type(e).__name__}>"


def _wrap(e: Expr, p: int) -> str:
    s = expr_str(e)
    return f"({s})" if _prec(e) < p else s


def stmt_lines(s, indent: int, out: list[str]) -> None:
    from tether.tir.nodes import Allocate, For, IfThenElse, SeqStmt, Store
    pad = "  " * indent
    if isinstance(s, SeqStmt):
        for x in s.stmts:
            stmt_lines(x, indent, out)
    elif isinstance(s, For):
        kind = "" if s.kind == "serial" else f" {s.kind}"
        rng = expr_str(s.extent) if isinstance(s.min, Const) and s.min.value == 0 else \
            f"{expr_str(s.min)}, {expr_str(s.min)} + {_wrap(s.extent, 5)}"
        out.append(f"{pad}for {_name(s.var)} in range({rng}){kind}:")
        stmt_lines(s.body, indent + 1, out)
    elif isinstance(s, Store):
        out.append(f"{pad}{s.buffer.name}[{expr_str(s.index)}] = {expr_str(s.value)}")
    elif isinstance(s, Allocate):
        out.append(f"{pad}allocate {s.buffer.name}: {s.buffer.dtype}[{s.buffer.size}]  # {s.buffer.scope}")
        stmt_lines(s.body, indent, out)
    elif isinstance(s, IfThenElse):
        out.append(f"{pad}if {expr_str(s.cond)}:")
        stmt_lines(s.then_case, indent + 1, out)
        if s.else_case is not None:
            out.append(f"{pad}else:")
            stmt_lines(s.else_case, indent + 1, out)
    else:
        out.append(f"{pad}<{type(s).__name__}>")


def stmt_str(s) -> str:
    out: list[str] = []
    stmt_lines(s, 0, out)
    return "\n".join(out)


def _unique_names(body) -> dict:
    from tether.tir.nodes import For, walk_stmts
    names: dict = {}
    used: dict = {}
    for s in walk_stmts(body):
        if isinstance(s, For) and id(s.var) not in names:
            base = s.var.name
            n = used.get(base, 0)
            names[id(s.var)] = base if n == 0 else f"{base}_{n}"
            used[base] = n + 1
    return names


def func_str(f) -> str:
    saved = getattr(_STATE, "names", None)
    _STATE.names = _unique_names(f.body)
    try:
        return _func_str(f)
    finally:
        _STATE.names = saved


def _func_str(f) -> str:
    params = ", ".join(f"{b.name}: {b.dtype}[{', '.join(str(d) for d in b.shape)}]" for b in f.param_buffers)
    out = [f"def {f.name}({params}):"]
    stmt_lines(f.body, 1, out)
    return "\n".join(out)
