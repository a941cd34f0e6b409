"""The te-only parts of tensor expressions: loop axes (IterVar) and reductions (te.sum/prod/max/min).

Scalar expressions themselves are tir's (tether.tir.expr); a reduction is a tir Reduce over IterVars.
"""
from __future__ import annotations

import math
from typing import Any

from tether.tir.dtype import is_bool, is_float
from tether.tir.expr import Const, Expr, Reduce, Select, Var, as_bool, convert, max_value, min_value, minmax


class IterVar(Var):
    """A loop axis: a Var with a domain [dom_min, dom_min + extent) and a kind ("data" or "reduce").

    ``extent`` is None for axes created by schedule relations (split/fuse); lowering infers them.
    """

    __slots__ = ("dom_min", "extent", "kind")

    def __init__(self, name: str, extent: int | None, kind: str = "data", dom_min: int = 0):
        super().__init__(name, "int32")
        self.dom_min = dom_min
        self.extent = extent
        self.kind = kind

    @property
    def var(self) -> "IterVar":  # TVM spelling: iv.var
        return self

    @property
    def dom(self) -> "Range":
        return Range(self.dom_min, self.extent)


class Range:
    """An axis domain (TVM spelling): ``.min`` and ``.extent``; unpacks as ``lo, extent``."""

    __slots__ = ("min", "extent")

    def __init__(self, lo: int, extent: int | None):
        self.min, self.extent = lo, extent

    def __iter__(self):
        return iter((self.min, self.extent))

    def __repr__(self) -> str:
        return f"Range(min={self.min}, extent={self.extent})"


# The identity each reduction starts from. A float max starts at -inf, not at the lowest finite value: the max of
# a row that is all -inf (a fully masked attention row) must be -inf, as in numpy and onnxruntime.
_COMBINERS = {
    "sum": lambda dt: Const(0, dt),
    "prod": lambda dt: Const(1, dt),
    "max": lambda dt: Const(-math.inf, dt) if is_float(dt) else min_value(dt),
    "min": lambda dt: Const(math.inf, dt) if is_float(dt) else max_value(dt),
}


def combiner_identity(combiner: str, dtype: str) -> Expr:
    """The element ``combiner`` (sum, prod, max, min) leaves unchanged, in ``dtype``."""
    return _COMBINERS[combiner](dtype)


def _is_reduce_axis(x: Any) -> bool:
    if isinstance(x, IterVar):
        return x.kind == "reduce"
    return isinstance(x, (list, tuple)) and len(x) > 0 and all(isinstance(a, IterVar) for a in x)


def _reduce(combiner: str, source: Any, axis: Any, where: Any = None, init: Any = None) -> Reduce:
    source = convert(source)
    axes = list(axis) if isinstance(axis, (list, tuple)) else [axis]
    for ax in axes:
        if not isinstance(ax, IterVar) or ax.kind != "reduce":
            raise TypeError(f"te.{combiner}: axis must be te.reduce_axis(...) IterVars, got {ax!r}")
    dt = source.dtype
    if is_bool(dt):
        source = source.astype("int32")
        dt = "int32"
    identity = _COMBINERS[combiner](dt) if init is None else convert(init, dt).astype(dt)
    if where is not None:
        source = Select(as_bool(where), source, _COMBINERS[combiner](dt))
    return Reduce(combiner, source, axes, identity)


def sum(expr: Any, axis: Any, where: Any = None, init: Any = None) -> Reduce:  # noqa: A001
    return _reduce("sum", expr, axis, where, init)


def prod(expr: Any, axis: Any, where: Any = None, init: Any = None) -> Reduce:
    return _reduce("prod", expr, axis, where, init)


def _reduce_or_elementwise(op: str, a: Any, b: Any, axis: Any, where: Any, init: Any) -> Expr:
    if axis is None and b is not None and _is_reduce_axis(b):
        axis, b = b, None
    if axis is not None:
        return _reduce(op, a, axis, where, init)
    if b is None:
        raise TypeError(f"te.{op} needs either axis= (reduction) or two operands (elementwise)")
    return minmax(op, a, b)


def max(a: Any, b: Any = None, axis: Any = None, where: Any = None, init: Any = None) -> Expr:  # noqa: A001
    """``te.max(expr, axis=k)`` reduces; ``te.max(a, b)`` is the elementwise maximum."""
    return _reduce_or_elementwise("max", a, b, axis, where, init)


def min(a: Any, b: Any = None, axis: Any = None, where: Any = None, init: Any = None) -> Expr:  # noqa: A001
    """``te.min(expr, axis=k)`` reduces; ``te.min(a, b)`` is the elementwise minimum."""
    return _reduce_or_elementwise("min", a, b, axis, where, init)


def reduce_axis(dom: Any, name: str = "k") -> IterVar:
    """A reduction axis over ``range(dom)`` or ``range(lo, hi)`` when dom is a (lo, hi) pair."""
    if isinstance(dom, (list, tuple)):
        lo, hi = (int(d) for d in dom)
    else:
        lo, hi = 0, int(dom)
    if hi <= lo:
        raise ValueError(f"reduce_axis {name!r}: empty range [{lo}, {hi})")
    return IterVar(name, hi - lo, "reduce", lo)
