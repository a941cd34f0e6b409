"""Scalar expressions: the nodes both tensor expressions (te) and the loop IR are built of, their text form, and
the constructors behind the Python operators (``a + b``, ``a < b``, ``a & b``).

Nodes are immutable and compared by identity (``__hash__`` is the object's id). Arithmetic and comparison
operators build new nodes, so ``a == b`` is an ``EQ`` node, not a bool; its truth value is identity (like TVM),
which keeps ``x in list_of_vars`` working.

Each node class lists in ``_fields`` the attributes that hold its child expressions (a list attribute holds
several); tether.tir.visit walks and rebuilds every node through them.
"""
from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, ContextManager, Dict, Sequence

from tether.scoped import attribute_set
from tether.tir.dtype import bits, check_dtype, is_bool, is_float, is_int, is_unsigned, rank

if TYPE_CHECKING:
    from tether.tir.buffer import Buffer

_BIN = {"add": ("+", 4), "sub": ("-", 4), "mul": ("*", 5), "div": ("/", 5), "floordiv": ("//", 5),
        "floormod": ("%", 5), "and": ("&&", 1), "or": ("||", 0),
        "bitand": ("&", 3), "bitor": ("|", 2), "bitxor": ("^", 2), "shl": ("<<", 3), "shr": (">>", 3)}
_CMP = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}


class Expr:
    """Base of every scalar expression; ``dtype`` is a tether dtype string."""

    __slots__ = ("dtype",)
    __hash__ = object.__hash__
    _fields: tuple = ()
    _prec = 9           # binding strength in the text form: lower binds looser and gets parenthesised

    # arithmetic -------------------------------------------------------------------------------------------
    def __add__(self, o): return _arith("add", self, o)
    def __radd__(self, o): return _arith("add", o, self)
    def __sub__(self, o): return _arith("sub", self, o)
    def __rsub__(self, o): return _arith("sub", o, self)
    def __mul__(self, o): return _arith("mul", self, o)
    def __rmul__(self, o): return _arith("mul", o, self)
    def __truediv__(self, o): return _div(self, o)
    def __rtruediv__(self, o): return _div(o, self)
    def __floordiv__(self, o): return floordiv(self, o)
    def __rfloordiv__(self, o): return floordiv(o, self)
    def __mod__(self, o): return floormod(self, o)
    def __rmod__(self, o): return floormod(o, self)
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

    def _text(self) -> str:
        return f"<{type(self).__name__}>"

    def __repr__(self) -> str:
        return self._text()

    __str__ = __repr__


def parenthesized(e: Expr, prec: int) -> str:
    """The text of ``e``, in parentheses when it binds looser than ``prec``."""
    s = e._text()
    return f"({s})" if e._prec < prec else s


def _call_text(name: str, *args: Expr) -> str:
    return f"{name}({', '.join(a._text() for a in args)})"


# Printing names for the function being printed (per thread): distinct Vars that share a name (the same axis
# name in two stages) get a numeric suffix so the text is unambiguous.
_PRINTING = threading.local()


def var_names(names: Dict[int, str]) -> ContextManager[None]:
    """Print Vars (by id) under ``names`` while the block runs."""
    return attribute_set(_PRINTING, "names", names)


class Const(Expr):
    """A literal of ``dtype`` (``value`` is a Python float, int or bool to match)."""

    __slots__ = ("value",)

    def __init__(self, value, dtype: str):
        self.dtype = check_dtype(dtype)
        if is_float(dtype):
            self.value = float(value)
        elif is_bool(dtype):
            self.value = bool(value)
        else:
            self.value = int(value)

    @property
    def _prec(self) -> int:  # type: ignore[override]
        return 6 if not isinstance(self.value, bool) and self.value < 0 else 9

    def _text(self) -> str:
        if self.dtype == "bool":
            return "True" if self.value else "False"
        if is_float(self.dtype):
            s = repr(self.value)
            return s + "f" if self.dtype == "float32" else s
        return str(self.value) if self.dtype == "int32" else f"{self.dtype}({self.value})"


class Var(Expr):
    """A named scalar variable (a loop index, or a parameter of a te.compute), compared by identity."""

    __slots__ = ("name",)

    def __init__(self, name: str = "v", dtype: str = "int32"):
        self.name = name
        self.dtype = check_dtype(dtype)

    def _text(self) -> str:
        names = getattr(_PRINTING, "names", None)
        return names.get(id(self), self.name) if names else self.name


class Binary(Expr):
    """Arithmetic/logical binary op: add sub mul div (float) floordiv floormod (int) min max and or."""

    __slots__ = ("op", "a", "b")
    _fields = ("a", "b")

    def __init__(self, op: str, a: Expr, b: Expr, dtype: str | None = None):
        self.op, self.a, self.b = op, a, b
        self.dtype = dtype or a.dtype

    @property
    def _prec(self) -> int:  # type: ignore[override]
        return _BIN[self.op][1] if self.op in _BIN else 9

    def _text(self) -> str:
        if self.op in ("min", "max"):
            return _call_text(self.op, self.a, self.b)
        sym, p = _BIN[self.op]
        # left-associative: an equally strong right operand needs parentheses, a left one does not
        return f"{parenthesized(self.a, p)} {sym} {parenthesized(self.b, p + 1)}"


class Compare(Expr):
    """``a <op> b`` (lt le gt ge eq ne), a bool."""

    __slots__ = ("op", "a", "b")
    _fields = ("a", "b")
    _prec = 2

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

    def _text(self) -> str:
        return f"{parenthesized(self.a, 2)} {_CMP[self.op]} {parenthesized(self.b, 3)}"


class Not(Expr):
    """Logical negation of a bool expression."""

    __slots__ = ("a",)
    _fields = ("a",)

    def __init__(self, a: Expr):
        self.a = a
        self.dtype = "bool"

    def _text(self) -> str:
        return f"!{parenthesized(self.a, 8)}"


class Select(Expr):
    """``t if cond else f`` (codegen evaluates an arm that might fault only where it is selected)."""

    __slots__ = ("cond", "t", "f")
    _fields = ("cond", "t", "f")

    def __init__(self, cond: Expr, t: Expr, f: Expr):
        self.cond, self.t, self.f = cond, t, f
        self.dtype = t.dtype

    def _text(self) -> str:
        return _call_text("select", self.cond, self.t, self.f)


class Cast(Expr):
    """``value`` converted to ``dtype``."""

    __slots__ = ("value",)
    _fields = ("value",)

    def __init__(self, dtype: str, value: Expr):
        self.dtype = check_dtype(dtype)
        self.value = value

    def _text(self) -> str:
        return _call_text(self.dtype, self.value)


class Call(Expr):
    """A math intrinsic: exp log sqrt rsqrt tanh sigmoid erf pow floor ceil abs sin cos tan asin acos atan."""

    __slots__ = ("name", "args")
    _fields = ("args",)

    def __init__(self, name: str, args: Sequence[Expr], dtype: str):
        self.name = name
        self.args = list(args)
        self.dtype = dtype

    def _text(self) -> str:
        return _call_text(self.name, *self.args)


class PackedCall(Expr):
    """A call of the host function registered as ``name`` (TVM's call_packed): scalar arguments, one scalar
    result of ``dtype``. The module records ``name`` in its metadata; the runtime resolves it when the module
    loads and the call goes through the host-caller slot (docs/abi.md "Host callbacks")."""

    __slots__ = ("name", "args")
    _fields = ("args",)

    def __init__(self, name: str, args: Sequence[Expr], dtype: str):
        if not isinstance(name, str) or not name:
            raise ValueError("call_packed needs a function name, got %r" % (name,))
        self.name = name
        self.args = list(args)
        self.dtype = check_dtype(dtype)

    def _text(self) -> str:
        return "call_packed(%s)" % ", ".join([repr(self.name)] + [a._text() for a in self.args])


def call_packed(name: str, *args: Any, dtype: str = "float32") -> PackedCall:
    """``call_packed("f", x, y, dtype="float32")``: call host function ``f`` at run time (docs/abi.md)."""
    return PackedCall(name, [convert(a) for a in args], dtype)


class Load(Expr):
    """``buffer[index]``: one element of a flat buffer (what lowering turns every TensorLoad into)."""

    __slots__ = ("buffer", "index")
    _fields = ("index",)

    def __init__(self, buffer: "Buffer", index: Expr):
        self.buffer = buffer
        self.index = index
        self.dtype = buffer.dtype

    def _text(self) -> str:
        return f"{self.buffer.name}[{self.index._text()}]"


class TensorLoad(Expr):
    """``tensor[indices]`` in a tensor expression: an element of a te Tensor (anything with a name and a dtype),
    before lowering gives the tensor a buffer."""

    __slots__ = ("tensor", "indices")
    _fields = ("indices",)

    def __init__(self, tensor: Any, indices: Sequence[Expr]):
        self.tensor = tensor
        self.indices = list(indices)
        self.dtype = tensor.dtype

    def _text(self) -> str:
        return f"{self.tensor.name}[{', '.join(i._text() for i in self.indices)}]"


class Reduce(Expr):
    """A commutative reduction of ``source`` over ``axis`` (reduction loop Vars); only valid at the top of a
    te compute."""

    __slots__ = ("combiner", "source", "axis", "identity")
    _fields = ("source", "identity")

    def __init__(self, combiner: str, source: Expr, axis: Sequence[Var], identity: Expr):
        self.combiner = combiner
        self.source = source
        self.axis = list(axis)
        self.identity = identity
        self.dtype = source.dtype

    def _text(self) -> str:
        return f"reduce_{self.combiner}({self.source._text()}, axis=[{', '.join(a.name for a in self.axis)}])"


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


def promote(a: Any, b: Any) -> tuple[Expr, Expr]:
    """Make both operands Exprs of one dtype: literals adopt the expression's dtype (a float literal with an
    integer expression makes both float32); two expressions promote to the wider dtype."""
    if not isinstance(a, Expr) and isinstance(b, Expr):
        a = convert(a, b.dtype)
    elif isinstance(a, Expr) and not isinstance(b, Expr):
        b = convert(b, a.dtype)
    a, b = convert(a), convert(b)
    if a.dtype != b.dtype:
        target = a.dtype if rank(a.dtype) > rank(b.dtype) else b.dtype
        a, b = a.astype(target), b.astype(target)
    return a, b


def _arith(op: str, a: Any, b: Any) -> Expr:
    a, b = promote(a, b)
    if is_bool(a.dtype) and op in ("add", "sub", "mul"):
        a, b = a.astype("int32"), b.astype("int32")
    return Binary(op, a, b)


def _div(a: Any, b: Any) -> Expr:
    a, b = promote(a, b)
    if is_float(a.dtype):
        return Binary("div", a, b)
    return floordiv(a, b)


def floordiv(a: Any, b: Any) -> Expr:
    a, b = promote(a, b)
    if is_float(a.dtype):
        return Call("floor", [Binary("div", a, b)], a.dtype)
    if is_bool(a.dtype):
        a, b = a.astype("int32"), b.astype("int32")
    return Binary("floordiv", a, b)


def floormod(a: Any, b: Any) -> Expr:
    a, b = promote(a, b)
    if is_float(a.dtype):
        return a - Call("floor", [Binary("div", a, b)], a.dtype) * b
    if is_bool(a.dtype):
        a, b = a.astype("int32"), b.astype("int32")
    return Binary("floormod", a, b)


def minmax(op: str, a: Any, b: Any) -> Expr:
    """The elementwise ``min`` or ``max`` of two operands (promoted to one dtype)."""
    a, b = promote(a, b)
    return Binary(op, a, b)


def bitwise(op: str, a: Any, b: Any) -> Expr:
    """Integer bit operations: ``bitand``, ``bitor``, ``bitxor``, ``shl``, ``shr`` (logical for unsigned types,
    arithmetic for signed ones). A shift by the type's width or more is undefined: callers guard it."""
    if op not in ("bitand", "bitor", "bitxor", "shl", "shr"):
        raise ValueError(f"unknown bit operation {op!r}")
    a, b = promote(a, b)
    if not is_int(a.dtype):
        raise TypeError(f"{op} needs integer operands, got {a.dtype}")
    return Binary(op, a, b)


def _compare(op: str, a: Any, b: Any) -> Expr:
    a, b = promote(a, b)
    return Compare(op, a, b)


def as_bool(x: Any) -> Expr:
    """``x`` as a condition: bool expressions as they are, numbers compared with zero."""
    x = convert(x)
    return x if is_bool(x.dtype) else Compare("ne", x, Const(0, x.dtype))


def logical_and(a: Any, b: Any) -> Expr:
    return Binary("and", as_bool(a), as_bool(b), "bool")


def logical_or(a: Any, b: Any) -> Expr:
    return Binary("or", as_bool(a), as_bool(b), "bool")


def logical_not(a: Any) -> Expr:
    return Not(as_bool(a))


def _fold_conditions(conds: tuple, empty: bool, combine: Any) -> Expr:
    """Fold conditions (given as arguments or one list) with ``combine``; ``empty`` is the value of no conditions."""
    if len(conds) == 1 and isinstance(conds[0], (list, tuple)):
        conds = tuple(conds[0])
    if not conds:
        return Const(empty, "bool")
    out = as_bool(conds[0])
    for c in conds[1:]:
        out = combine(out, c)
    return out


def all(*conds: Any) -> Expr:  # noqa: A001 - te.all, TVM spelling
    return _fold_conditions(conds, True, logical_and)


def any(*conds: Any) -> Expr:  # noqa: A001 - te.any, TVM spelling
    return _fold_conditions(conds, False, logical_or)


def if_then_else(cond: Any, t: Any, f: Any) -> Expr:
    t, f = promote(t, f)
    return Select(as_bool(cond), t, f)


def cast(x: Any, dtype: str) -> Expr:
    return convert(x).astype(dtype)


def max_value(dtype: str) -> Const:
    dtype = check_dtype(dtype)
    if dtype == "float32":
        return Const(3.4028234663852886e38, dtype)
    if dtype == "float64":
        return Const(1.7976931348623157e308, dtype)
    if dtype == "float16":
        return Const(65504.0, dtype)
    if dtype == "bfloat16":
        return Const(3.3895313892515355e38, dtype)
    if dtype == "bool":
        return Const(True, dtype)
    if is_unsigned(dtype):
        return Const((1 << bits(dtype)) - 1, dtype)
    return Const((1 << (bits(dtype) - 1)) - 1, dtype)


def min_value(dtype: str) -> Const:
    dtype = check_dtype(dtype)
    if is_float(dtype):
        return Const(-max_value(dtype).value, dtype)
    if dtype == "bool":
        return Const(False, dtype)
    if is_unsigned(dtype):
        return Const(0, dtype)
    return Const(-(1 << (bits(dtype) - 1)), dtype)
