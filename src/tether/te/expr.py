"""Scalar expression nodes shared by tensor expressions (te) and the loop IR (tir).

Nodes are immutable and compared by identity (``__hash__`` is the object's id). Arithmetic and comparison
operators build new nodes, so ``a == b`` is an ``EQ`` node, not a bool; its truth value is identity (like TVM),
which keeps ``x in list_of_vars`` working.
"""
from __future__ import annotations

import builtins as _builtins
from typing import Any, Sequence

# Promotion order for mixed-dtype arithmetic: later wins.
_RANK = {"bool": 0, "int8": 1, "uint8": 2, "int16": 3, "int32": 4, "int64": 5, "float32": 6, "float64": 7}
DTYPES = tuple(_RANK)


def check_dtype(dtype: str) -> str:
    dtype = str(dtype)
    if dtype not in _RANK:
        raise TypeError(f"unsupported dtype {dtype!r}; tether supports {', '.join(DTYPES)}")
    return dtype


def is_float(dtype: str) -> bool:
    return dtype.startswith("float")


def is_int(dtype: str) -> bool:
    return dtype.startswith("int") or dtype.startswith("uint")


def is_bool(dtype: str) -> bool:
    return dtype == "bool"


def bits(dtype: str) -> int:
    return 8 if dtype == "bool" else int(dtype.lstrip("uintfloat"))


class Expr:
    """Base of every scalar expression; ``dtype`` is a tether dtype string."""

    __slots__ = ("dtype",)
    __hash__ = object.__hash__

    # arithmetic -------------------------------------------------------------------------------------------
    def __add__(self, o): return _arith("add", self, o)
    def __radd__(self, o): return _arith("add", o, self)
    def __sub__(self, o): return _arith("sub", self, o)
    def __rsub__(self, o): return _arith("sub", o, self)
    def __mul__(self, o): return _arith("mul", self, o)
    def __rmul__(self, o): return _arith("mul", o, self)
    def __truediv__(self, o): return _div(self, o)
    def __rtruediv__(self, o): return _div(o, self)
    def __floordiv__(self, o): return _floordiv(self, o)
    def __rfloordiv__(self, o): return _floordiv(o, self)
    def __mod__(self, o): return _floormod(self, o)
    def __rmod__(self, o): return _floormod(o, self)
    def __neg__(self): return _arith("sub", const(0, self.dtype), self)
    def __pos__(self): return self
    def __abs__(self): return Call("abs", [self], self.dtype)

    # comparison -------------------------------------------------------------------------------------------
    def __lt__(self, o): return _compare("lt", self, o)
    def __le__(self, o): return _compare("le", self, o)
    def __gt__(self, o): return _compare("gt", self, o)
    def __ge__(self, o): return _compare("ge", self, o)
    def __eq__(self, o): return _compare("eq", self, o)  # type: ignore[override]
    def __ne__(self, o): return _compare("ne", self, o)  # type: ignore[override]

    # logical (bool exprs) ---------------------------------------------------------------------------------
    def __and__(self, o): return logical_and(self, o)
    def __rand__(self, o): return logical_and(o, self)
    def __or__(self, o): return logical_or(self, o)
    def __ror__(self, o): return logical_or(o, self)
    def __invert__(self): return logical_not(self)

    def __bool__(self):
        raise TypeError(f"cannot use the symbolic expression {self} as a Python bool; use te.if_then_else, "
                        "te.all/te.any or the & | ~ operators")

    def astype(self, dtype: str) -> "Expr":
        dtype = check_dtype(dtype)
        return self if dtype == self.dtype else Cast(dtype, self)

    def equal(self, other: "Expr") -> "Expr":
        return _compare("eq", self, other)

    def __repr__(self) -> str:
        from tether.tir.printer import expr_str
        return expr_str(self)

    __str__ = __repr__


class Const(Expr):
    __slots__ = ("value",)

    def __init__(self, value, dtype: str):
        self.dtype = check_dtype(dtype)
        if is_float(dtype):
            self.value = float(value)
        elif is_bool(dtype):
            self.value = bool(value)
        else:
            self.value = int(value)


class Var(Expr):
    __slots__ = ("name",)

    def __init__(self, name: str = "v", dtype: str = "int32"):
        self.name = name
        self.dtype = check_dtype(dtype)


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


class Binary(Expr):
    """Arithmetic/logical binary op: add sub mul div (float) floordiv floormod (int) min max and or."""

    __slots__ = ("op", "a", "b")

    def __init__(self, op: str, a: Expr, b: Expr, dtype: str | None = None):
        self.op, self.a, self.b = op, a, b
        self.dtype = dtype or a.dtype


class Compare(Expr):
    __slots__ = ("op", "a", "b")

    def __init__(self, op: str, a: Expr, b: Expr):
        self.op, self.a, self.b = op, a, b
        self.dtype = "bool"

    def __bool__(self):
        # Identity semantics (like TVM) so that `var in [vars]` and dict lookups work.
        if self.op == "eq":
            return self.a is self.b
        if self.op == "ne":
            return self.a is not self.b
        return Expr.__bool__(self)


class Not(Expr):
    __slots__ = ("a",)

    def __init__(self, a: Expr):
        self.a = a
        self.dtype = "bool"


class Select(Expr):
    __slots__ = ("cond", "t", "f")

    def __init__(self, cond: Expr, t: Expr, f: Expr):
        self.cond, self.t, self.f = cond, t, f
        self.dtype = t.dtype


class Cast(Expr):
    __slots__ = ("value",)

    def __init__(self, dtype: str, value: Expr):
        self.dtype = check_dtype(dtype)
        self.value = value


class Call(Expr):
    """A math intrinsic: exp log sqrt rsqrt tanh sigmoid erf pow floor ceil abs."""

    __slots__ = ("name", "args")

    def __init__(self, name: str, args: Sequence[Expr], dtype: str):
        self.name = name
        self.args = list(args)
        self.dtype = dtype


class TensorLoad(Expr):
    """``tensor[indices]`` inside a te expression."""

    __slots__ = ("tensor", "indices")

    def __init__(self, tensor, indices: Sequence[Expr]):
        self.tensor = tensor
        self.indices = list(indices)
        self.dtype = tensor.dtype


class Reduce(Expr):
    """A commutative reduction of ``source`` over ``axis`` (reduce IterVars); only valid at the top of a compute."""

    __slots__ = ("combiner", "source", "axis", "identity")

    def __init__(self, combiner: str, source: Expr, axis: Sequence[IterVar], identity: Expr):
        self.combiner = combiner
        self.source = source
        self.axis = list(axis)
        self.identity = identity
        self.dtype = source.dtype


# --------------------------------------------------------------------------------------------------------------
# construction helpers


def const(value: Any, dtype: str | None = None) -> Const:
    if dtype is None:
        dtype = "bool" if isinstance(value, bool) else "int32" if isinstance(value, int) else "float32"
    return Const(value, dtype)


def convert(x: Any, like: str | None = None) -> Expr:
    """Turn a Python number into a Const (of dtype ``like`` when given and compatible)."""
    if isinstance(x, Expr):
        return x
    if isinstance(x, bool):
        return Const(x, "bool")
    if isinstance(x, int):
        if like is None or is_bool(like):
            return Const(x, "int32" if -2**31 <= x < 2**31 else "int64")
        if is_int(like) and not (min_value(like).value <= x <= max_value(like).value):
            return convert(x)   # does not fit the expression's type: promotion widens the expression instead
        return Const(x, like)
    if isinstance(x, float):
        return Const(x, like if like is not None and is_float(like) else "float32")
    if hasattr(x, "dtype") and hasattr(x, "item"):  # numpy scalar: a literal, like the Python number
        return convert(x.item(), like) if like is not None else Const(x.item(), str(x.dtype))
    raise TypeError(f"cannot use {x!r} ({type(x).__name__}) in a tensor expression")


def _promote(a: Any, b: Any) -> tuple[Expr, Expr]:
    """Make both operands Exprs of one dtype: literals adopt the expression's dtype (a float literal with an
    integer expression makes both float32); two expressions promote to the wider dtype."""
    if not isinstance(a, Expr) and isinstance(b, Expr):
        a = convert(a, b.dtype)
    elif isinstance(a, Expr) and not isinstance(b, Expr):
        b = convert(b, a.dtype)
    a, b = convert(a), convert(b)
    if a.dtype != b.dtype:
        target = a.dtype if _RANK[a.dtype] > _RANK[b.dtype] else b.dtype
        a, b = a.astype(target), b.astype(target)
    return a, b


def _arith(op: str, a: Any, b: Any) -> Expr:
    a, b = _promote(a, b)
    if is_bool(a.dtype) and op in ("add", "sub", "mul"):
        a, b = a.astype("int32"), b.astype("int32")
    return Binary(op, a, b)


def _div(a: Any, b: Any) -> Expr:
    a, b = _promote(a, b)
    if is_float(a.dtype):
        return Binary("div", a, b)
    return _floordiv(a, b)


def _floordiv(a: Any, b: Any) -> Expr:
    a, b = _promote(a, b)
    if is_float(a.dtype):
        return Call("floor", [Binary("div", a, b)], a.dtype)
    if is_bool(a.dtype):
        a, b = a.astype("int32"), b.astype("int32")
    return Binary("floordiv", a, b)


def _floormod(a: Any, b: Any) -> Expr:
    a, b = _promote(a, b)
    if is_float(a.dtype):
        return a - Call("floor", [Binary("div", a, b)], a.dtype) * b
    if is_bool(a.dtype):
        a, b = a.astype("int32"), b.astype("int32")
    return Binary("floormod", a, b)


def floordiv(a: Any, b: Any) -> Expr:
    return _floordiv(a, b)


def floormod(a: Any, b: Any) -> Expr:
    return _floormod(a, b)


def _compare(op: str, a: Any, b: Any) -> Expr:
    a, b = _promote(a, b)
    return Compare(op, a, b)


def _as_bool(x: Any) -> Expr:
    x = convert(x)
    return x if is_bool(x.dtype) else Compare("ne", x, Const(0, x.dtype))


def logical_and(a: Any, b: Any) -> Expr:
    return Binary("and", _as_bool(a), _as_bool(b), "bool")


def logical_or(a: Any, b: Any) -> Expr:
    return Binary("or", _as_bool(a), _as_bool(b), "bool")


def logical_not(a: Any) -> Expr:
    return Not(_as_bool(a))


def _fold_conditions(conds: tuple, empty: bool, combine: Any) -> Expr:
    """Fold conditions (given as arguments or one list) with ``combine``; ``empty`` is the value of no conditions."""
    if len(conds) == 1 and isinstance(conds[0], (list, tuple)):
        conds = tuple(conds[0])
    if not conds:
        return Const(empty, "bool")
    out = _as_bool(conds[0])
    for c in conds[1:]:
        out = combine(out, c)
    return out


def all(*conds: Any) -> Expr:  # noqa: A001 - te.all, TVM spelling
    return _fold_conditions(conds, True, logical_and)


def any(*conds: Any) -> Expr:  # noqa: A001 - te.any, TVM spelling
    return _fold_conditions(conds, False, logical_or)


def if_then_else(cond: Any, t: Any, f: Any) -> Expr:
    t, f = _promote(t, f)
    return Select(_as_bool(cond), t, f)


def cast(x: Any, dtype: str) -> Expr:
    return convert(x).astype(dtype)


def max_value(dtype: str) -> Const:
    dtype = check_dtype(dtype)
    if dtype == "float32":
        return Const(3.4028234663852886e38, dtype)
    if dtype == "float64":
        return Const(1.7976931348623157e308, dtype)
    if dtype == "bool":
        return Const(True, dtype)
    if dtype.startswith("uint"):
        return Const((1 << bits(dtype)) - 1, dtype)
    return Const((1 << (bits(dtype) - 1)) - 1, dtype)


def min_value(dtype: str) -> Const:
    dtype = check_dtype(dtype)
    if is_float(dtype):
        return Const(-max_value(dtype).value, dtype)
    if dtype == "bool":
        return Const(False, dtype)
    if dtype.startswith("uint"):
        return Const(0, dtype)
    return Const(-(1 << (bits(dtype) - 1)), dtype)


# math ---------------------------------------------------------------------------------------------------------

FLOAT_MATH = ("exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "erf", "floor", "ceil")


def _float_arg(x: Any) -> Expr:
    x = convert(x)
    return x if is_float(x.dtype) else x.astype("float32")


def _unary_math(name: str):
    def fn(x: Any) -> Expr:
        x = _float_arg(x)
        return Call(name, [x], x.dtype)
    fn.__name__ = name
    fn.__doc__ = f"Elementwise {name} (float; ints are cast to float32)."
    return fn


exp = _unary_math("exp")
log = _unary_math("log")
sqrt = _unary_math("sqrt")
rsqrt = _unary_math("rsqrt")
tanh = _unary_math("tanh")
sigmoid = _unary_math("sigmoid")
erf = _unary_math("erf")
floor = _unary_math("floor")
ceil = _unary_math("ceil")


def abs(x: Any) -> Expr:  # noqa: A001 - te.abs
    x = convert(x)
    return Call("abs", [x], x.dtype)


def pow(a: Any, b: Any) -> Expr:  # noqa: A001 - te.pow
    a, b = _promote(a, b)
    if not is_float(a.dtype):
        a, b = a.astype("float32"), b.astype("float32")
    return Call("pow", [a, b], a.dtype)


def power(a: Any, b: Any) -> Expr:
    return pow(a, b)


def _minmax(op: str, a: Any, b: Any) -> Expr:
    a, b = _promote(a, b)
    return Binary(op, a, b)


# reductions ---------------------------------------------------------------------------------------------------

_COMBINERS = {
    "sum": lambda dt: Const(0, dt),
    "prod": lambda dt: Const(1, dt),
    "max": min_value,
    "min": max_value,
}


def _is_reduce_axis(x: Any) -> bool:
    if isinstance(x, IterVar):
        return x.kind == "reduce"
    return isinstance(x, (list, tuple)) and len(x) > 0 and builtins_all(isinstance(a, IterVar) for a in x)


builtins_all = _builtins.all  # te.all shadows the builtin in this module


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
        source = Select(_as_bool(where), source, _COMBINERS[combiner](dt))
    return Reduce(combiner, source, axes, identity)


def sum(expr: Any, axis: Any, where: Any = None, init: Any = None) -> Reduce:  # noqa: A001
    return _reduce("sum", expr, axis, where, init)


def prod(expr: Any, axis: Any, where: Any = None, init: Any = None) -> Reduce:
    return _reduce("prod", expr, axis, where, init)


def max(a: Any, b: Any = None, axis: Any = None, where: Any = None, init: Any = None) -> Expr:  # noqa: A001
    """``te.max(expr, axis=k)`` reduces; ``te.max(a, b)`` is the elementwise maximum."""
    if axis is None and b is not None and _is_reduce_axis(b):
        axis, b = b, None
    if axis is not None:
        return _reduce("max", a, axis, where, init)
    if b is None:
        raise TypeError("te.max needs either axis= (reduction) or two operands (elementwise)")
    return _minmax("max", a, b)


def min(a: Any, b: Any = None, axis: Any = None, where: Any = None, init: Any = None) -> Expr:  # noqa: A001
    """``te.min(expr, axis=k)`` reduces; ``te.min(a, b)`` is the elementwise minimum."""
    if axis is None and b is not None and _is_reduce_axis(b):
        axis, b = b, None
    if axis is not None:
        return _reduce("min", a, axis, where, init)
    if b is None:
        raise TypeError("te.min needs either axis= (reduction) or two operands (elementwise)")
    return _minmax("min", a, b)


def reduce_axis(dom: Any, name: str = "k") -> IterVar:
    """A reduction axis over ``range(dom)`` or ``range(lo, hi)`` when dom is a (lo, hi) pair."""
    if isinstance(dom, (list, tuple)):
        lo, hi = (int(d) for d in dom)
    else:
        lo, hi = 0, int(dom)
    if hi <= lo:
        raise ValueError(f"reduce_axis {name!r}: empty range [{lo}, {hi})")
    return IterVar(name, hi - lo, "reduce", lo)


def thread_axis(*_a, **_k):  # pragma: no cover - GPUs are out of scope
    raise NotImplementedError("tether targets CPUs only; there are no thread axes")


def is_const_int(e: Any, value: int | None = None) -> bool:
    ok = isinstance(e, Const) and not is_float(e.dtype)
    return ok and (value is None or e.value == value)
