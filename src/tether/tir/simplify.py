"""Arithmetic simplification of index expressions.

Integer add/sub/mul-by-constant trees are put in a linear normal form (sum of coeff * atom + const), which folds
constants, drops x*1 and x+0, cancels symbolic terms (so region extents like ``(i*4 + 3) - i*4 + 1`` become 4)
and splits ``(a*c + b) // c`` into ``a + b // c`` (then ``a`` when ``0 <= b < c`` is provable from loop ranges).
"""
from __future__ import annotations

import math
from typing import Dict, Optional, Tuple

from tether.tir.dtype import bits, is_float, is_int, is_unsigned
from tether.tir.expr import Binary, Call, Cast, Compare, Const, Expr, Load, Not, Select, Var
from tether.tir.visit import map_children

Range = Tuple[int, int]          # inclusive [lo, hi]


def simplify(e: Expr, ranges: Optional[Dict[Var, Range]] = None) -> Expr:
    """Simplify ``e``; ``ranges`` maps loop Vars to inclusive integer ranges used to prove facts."""
    return Simplifier(ranges or {}).visit(e)


def const_bound(e: Expr, ranges: Optional[Dict[Var, Range]] = None) -> Optional[Range]:
    """Numeric inclusive bounds of an integer expression, or None when unknown."""
    return Simplifier(ranges or {}).bound(e)


def _wrap_int(v: int, dtype: str) -> int:
    """``v`` wrapped to integer type ``dtype`` (two's complement), as a cast to it would."""
    if not is_int(dtype):
        return v
    if is_unsigned(dtype):
        return v & ((1 << bits(dtype)) - 1)
    half = 1 << (bits(dtype) - 1)
    return (v + half) % (2 * half) - half


class Simplifier:
    def __init__(self, ranges: Dict[Var, Range]):
        self.ranges = ranges
        self._keys: Dict[int, tuple] = {}

    # structural identity -----------------------------------------------------------------------------------
    def key(self, e: Expr) -> tuple:
        k = self._keys.get(id(e))
        if k is not None:
            return k
        if isinstance(e, Const):
            k = ("c", e.dtype, e.value)
        elif isinstance(e, Var):
            k = ("v", id(e))
        elif isinstance(e, (Binary, Compare)):
            k = (type(e).__name__, e.op, e.dtype, self.key(e.a), self.key(e.b))
        elif isinstance(e, Not):
            k = ("not", self.key(e.a))
        elif isinstance(e, Select):
            k = ("sel", self.key(e.cond), self.key(e.t), self.key(e.f))
        elif isinstance(e, Cast):
            k = ("cast", e.dtype, self.key(e.value))
        elif isinstance(e, Call):
            k = ("call", e.name, e.dtype) + tuple(self.key(a) for a in e.args)
        elif isinstance(e, Load):
            k = ("load", id(e.buffer), self.key(e.index))
        else:
            k = ("obj", id(e))
        self._keys[id(e)] = k
        self._keep = getattr(self, "_keep", [])
        self._keep.append(e)  # keep ids stable while cached
        return k

    # linear normal form -------------------------------------------------------------------------------------
    def linear(self, e: Expr) -> tuple[dict, int]:
        """(terms, const) with terms: key -> [atom, coeff] in first-seen order."""
        if isinstance(e, Const) and is_int(e.dtype):
            return {}, e.value
        if isinstance(e, Binary) and is_int(e.dtype):
            if e.op in ("add", "sub"):
                ta, ca = self.linear(e.a)
                tb, cb = self.linear(e.b)
                sign = 1 if e.op == "add" else -1
                out = {k: [a, c] for k, (a, c) in ta.items()}
                for k, (a, c) in tb.items():
                    if k in out:
                        out[k][1] += sign * c
                    else:
                        out[k] = [a, sign * c]
                out, extra = self._merge_divmod({k: v for k, v in out.items() if v[1] != 0})
                return out, ca + sign * cb + extra
            if e.op == "mul":
                ta, ca = self.linear(e.a)
                tb, cb = self.linear(e.b)
                if not ta:
                    return ({k: [a, c * ca] for k, (a, c) in tb.items() if c * ca != 0}, ca * cb)
                if not tb:
                    return ({k: [a, c * cb] for k, (a, c) in ta.items() if c * cb != 0}, ca * cb)
                atom = Binary("mul", self.from_linear(ta, ca, e.dtype), self.from_linear(tb, cb, e.dtype))
                return {self.key(atom): [atom, 1]}, 0
        s = self.visit_atom(e)
        if isinstance(s, Const) and is_int(s.dtype):
            return {}, s.value
        if isinstance(s, Binary) and s.op in ("add", "sub", "mul") and is_int(s.dtype) and s is not e:
            return self.linear(s)
        return {self.key(s): [s, 1]}, 0

    def _merge_divmod(self, terms: dict) -> tuple[dict, int]:
        """Rewrite ``k*c*(x // c) + k*(x % c)`` to ``k*x`` (what fuse-then-index produces)."""
        extra = 0
        mods = [(key, a, c) for key, (a, c) in terms.items()
                if isinstance(a, Binary) and a.op == "floormod" and isinstance(a.b, Const)]
        for key, a, k in mods:
            div_key = ("Binary", "floordiv", a.dtype, self.key(a.a), self.key(a.b))
            div = terms.get(div_key)
            if div is None or div[1] != k * a.b.value or key not in terms:
                continue
            del terms[key], terms[div_key]
            xt, xc = self.linear(a.a)
            extra += k * xc
            for xk, (xa, c) in xt.items():
                if xk in terms:
                    terms[xk][1] += k * c
                else:
                    terms[xk] = [xa, k * c]
        return {key: v for key, v in terms.items() if v[1] != 0}, extra

    def from_linear(self, terms: dict, const: int, dtype: str) -> Expr:
        pos = [(a, c) for a, c in terms.values() if c > 0]
        neg = [(a, -c) for a, c in terms.values() if c < 0]

        def term(a: Expr, c: int) -> Expr:
            return a if c == 1 else Binary("mul", a, Const(c, dtype))

        out: Optional[Expr] = None
        for a, c in pos:
            out = term(a, c) if out is None else Binary("add", out, term(a, c))
        if out is None:
            out = Const(const, dtype) if (const != 0 or not neg) else None
            const = 0
            if out is None and neg:
                a, c = neg.pop(0)
                out = Binary("sub", Const(0, dtype), term(a, c))
        for a, c in neg:
            out = Binary("sub", out, term(a, c))
        if const > 0:
            out = Binary("add", out, Const(const, dtype))
        elif const < 0:
            out = Binary("sub", out, Const(-const, dtype))
        return out

    # bounds -------------------------------------------------------------------------------------------------
    def bound(self, e: Expr) -> Optional[Range]:
        if isinstance(e, Const):
            return (int(e.value), int(e.value)) if not is_float(e.dtype) else None
        if isinstance(e, Var):
            return self.ranges.get(e)
        if not (isinstance(e, Binary) and not is_float(e.dtype)):
            if isinstance(e, Select):
                bt, bf = self.bound(e.t), self.bound(e.f)
                return None if bt is None or bf is None else (min(bt[0], bf[0]), max(bt[1], bf[1]))
            return None
        if e.op in ("add", "sub", "mul"):
            return self._linear_bound(*self.linear(e), e.dtype)
        ba, bb = self.bound(e.a), self.bound(e.b)
        if e.op in ("floordiv", "floormod") and bb is not None and bb[0] == bb[1] and bb[0] > 0:
            c = bb[0]
            if e.op == "floormod":
                if ba is not None and ba[0] // c == ba[1] // c:
                    return ba[0] % c, ba[1] % c
                return 0, c - 1
            if ba is None:
                return None
            return ba[0] // c, ba[1] // c
        if ba is None or bb is None:
            return None
        if e.op == "min":
            return min(ba[0], bb[0]), min(ba[1], bb[1])
        if e.op == "max":
            return max(ba[0], bb[0]), max(ba[1], bb[1])
        return None

    def _linear_bound(self, terms: dict, c: int, dtype: str) -> Optional[Range]:
        out: Optional[Range] = (c, c)
        for a, k in terms.values():
            # a product of two non-constant factors is an atom of the linear form: bound(a) would linearise it
            # back into the same atom and never end, so its bound is the product of its factors' bounds
            b = self._product_bound(a) if isinstance(a, Binary) and a.op == "mul" else self.bound(a)
            if b is None:
                out = None
                break
            x, y = b[0] * k, b[1] * k
            out = (out[0] + min(x, y), out[1] + max(x, y))
        # rest + k*min(a, b) == min(rest + k*a, rest + k*b) (max when k < 0): bounding the two sums keeps the
        # correlation between rest and a clamp such as min(8, n - 8*i), which proves tail accesses in bounds.
        for key, (atom, k) in terms.items():
            if not (isinstance(atom, Binary) and atom.op in ("min", "max")):
                continue
            rest = {kk: v for kk, v in terms.items() if kk != key}
            sides = []
            for side in (atom.a, atom.b):
                st, sc = self.linear(Binary("mul", side, Const(k, dtype), dtype))
                merged = {kk: [v[0], v[1]] for kk, v in rest.items()}
                for kk, (sa, sk) in st.items():
                    if kk in merged:
                        merged[kk][1] += sk
                    else:
                        merged[kk] = [sa, sk]
                sides.append(self._linear_bound({kk: v for kk, v in merged.items() if v[1]}, c + sc, dtype))
            if sides[0] is None or sides[1] is None:
                break
            take_min = (atom.op == "min") == (k > 0)
            pick = min if take_min else max
            alt = (pick(sides[0][0], sides[1][0]), pick(sides[0][1], sides[1][1]))
            out = alt if out is None else (max(out[0], alt[0]), min(out[1], alt[1]))
            break
        return out

    def _product_bound(self, e: Binary) -> Optional[Range]:
        ba, bb = self.bound(e.a), self.bound(e.b)
        if ba is None or bb is None:
            return None
        corners = [x * y for x in ba for y in bb]
        return min(corners), max(corners)

    def prove_le(self, a: Expr, b: Expr) -> Optional[bool]:
        """True if a <= b always, False if a > b always, None if unknown (integers)."""
        d = self.bound(self.visit(Binary("sub", a, b)))
        if d is None:
            return None
        if d[1] <= 0:
            return True
        if d[0] > 0:
            return False
        return None

    # rewriting ----------------------------------------------------------------------------------------------
    def visit(self, e: Expr) -> Expr:
        if isinstance(e, Binary) and is_int(e.dtype) and e.op in ("add", "sub", "mul"):
            terms, c = self.linear(e)
            return self.from_linear(terms, c, e.dtype)
        return self.visit_atom(e)

    def visit_atom(self, e: Expr) -> Expr:
        """Simplify a node outside the linear form (leaves and nodes without rules are kept as they are)."""
        rule = _RULES.get(type(e))
        return e if rule is None else rule(self, e)

    def _visit_children(self, e: Expr) -> Expr:
        return map_children(e, self.visit)

    def visit_not(self, e: Not) -> Expr:
        a = self.visit(e.a)
        if isinstance(a, Const):
            return Const(not a.value, "bool")
        return e if a is e.a else Not(a)

    def visit_select(self, e: Select) -> Expr:
        c = self.visit(e.cond)
        t, f = self.visit(e.t), self.visit(e.f)
        if isinstance(c, Const):
            return t if c.value else f
        return e if (c is e.cond and t is e.t and f is e.f) else Select(c, t, f)

    def visit_cast(self, e: Cast) -> Expr:
        v = self.visit(e.value)
        if v.dtype == e.dtype:
            return v
        if isinstance(v, Const):
            if is_float(e.dtype):
                return Const(float(v.value), e.dtype)
            if e.dtype == "bool":
                return Const(bool(v.value), e.dtype)
            if is_float(v.dtype) and not math.isfinite(v.value):
                return Cast(e.dtype, v)
            return Const(_wrap_int(int(v.value), e.dtype), e.dtype)
        return e if v is e.value else Cast(e.dtype, v)

    def visit_binary(self, e: Binary) -> Expr:
        op = e.op
        a, b = self.visit(e.a), self.visit(e.b)
        ca, cb = isinstance(a, Const), isinstance(b, Const)
        if op in ("and", "or"):
            if ca and cb:
                return Const((a.value and b.value) if op == "and" else (a.value or b.value), "bool")
            for x, y in ((a, b), (b, a)):
                if isinstance(x, Const):
                    if op == "and":
                        return y if x.value else Const(False, "bool")
                    return Const(True, "bool") if x.value else y
            return Binary(op, a, b, "bool")
        if is_float(e.dtype):
            if ca and cb:
                v = _fold_float(op, a.value, b.value)
                if v is not None:
                    return Const(v, e.dtype)
            if op == "mul" and cb and b.value == 1.0:
                return a
            if op == "mul" and ca and a.value == 1.0:
                return b
            if op == "div" and cb and b.value == 1.0:
                return a
            return e if (a is e.a and b is e.b) else Binary(op, a, b, e.dtype)
        # integers
        if op in ("floordiv", "floormod"):
            if cb and b.value != 0:
                c = b.value
                if ca:
                    return Const(a.value // c if op == "floordiv" else a.value % c, e.dtype)
                if c == 1:
                    return a if op == "floordiv" else Const(0, e.dtype)
                if c > 0:
                    return self._divmod_const(op, a, c, e.dtype)
            return Binary(op, a, b, e.dtype)
        if op in ("min", "max"):
            if ca and cb:
                return Const(min(a.value, b.value) if op == "min" else max(a.value, b.value), e.dtype)
            le = self.prove_le(a, b)
            if le is not None:
                return (a if le else b) if op == "min" else (b if le else a)
            return Binary(op, a, b, e.dtype)
        return Binary(op, a, b, e.dtype)

    def _divmod_const(self, op: str, a: Expr, c: int, dtype: str) -> Expr:
        terms, k = self.linear(a)
        q_terms = {key: [x, coef // c] for key, (x, coef) in terms.items() if coef % c == 0}
        r_terms = {key: [x, coef] for key, (x, coef) in terms.items() if coef % c != 0}
        qk, rk = divmod(k, c)
        r = self.from_linear(r_terms, rk, dtype)
        rb = self.bound(r)
        if op == "floormod":
            if rb is not None and rb[0] >= 0 and rb[1] < c:
                return r
            if rb is not None and rb[0] // c == rb[1] // c:
                return self.visit(Binary("sub", r, Const(rb[0] // c * c, dtype)))
            return Binary("floormod", r, Const(c, dtype), dtype)
        if rb is not None and rb[0] // c == rb[1] // c:
            return self.from_linear(q_terms, qk + rb[0] // c, dtype)
        if not q_terms and qk == 0:
            return Binary("floordiv", r, Const(c, dtype), dtype)
        q = self.from_linear(q_terms, qk, dtype)
        return Binary("add", q, Binary("floordiv", r, Const(c, dtype), dtype), dtype)

    def visit_compare(self, e: Compare) -> Expr:
        a, b = self.visit(e.a), self.visit(e.b)
        if isinstance(a, Const) and isinstance(b, Const):
            return Const(_CMP_FN[e.op](a.value, b.value), "bool")
        if is_int(a.dtype) and is_int(b.dtype) and e.op in ("lt", "le", "gt", "ge"):
            d = self.bound(self.visit(Binary("sub", a, b)))
            if d is not None:
                lo, hi = d
                verdict = {"lt": (hi < 0, lo >= 0), "le": (hi <= 0, lo > 0),
                           "gt": (lo > 0, hi <= 0), "ge": (lo >= 0, hi < 0)}[e.op]
                if verdict[0]:
                    return Const(True, "bool")
                if verdict[1]:
                    return Const(False, "bool")
        return e if (a is e.a and b is e.b) else Compare(e.op, a, b)


_RULES = {Binary: Simplifier.visit_binary, Compare: Simplifier.visit_compare, Not: Simplifier.visit_not,
          Select: Simplifier.visit_select, Cast: Simplifier.visit_cast, Call: Simplifier._visit_children,
          Load: Simplifier._visit_children}

_CMP_FN = {"lt": lambda x, y: x < y, "le": lambda x, y: x <= y, "gt": lambda x, y: x > y,
           "ge": lambda x, y: x >= y, "eq": lambda x, y: x == y, "ne": lambda x, y: x != y}


def _fold_float(op: str, x: float, y: float) -> Optional[float]:
    try:
        return {"add": lambda: x + y, "sub": lambda: x - y, "mul": lambda: x * y,
                "div": lambda: x / y, "min": lambda: min(x, y), "max": lambda: max(x, y)}[op]()
    except (ZeroDivisionError, KeyError, OverflowError):
        return None
