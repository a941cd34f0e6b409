"""Math intrinsics on scalar expressions (te.exp, te.pow, ...): Call nodes the code generator implements."""
from __future__ import annotations

from typing import Any, Callable

from tether.tir.dtype import is_float
from tether.tir.expr import Call, Expr, convert, promote


def _float_arg(x: Any) -> Expr:
    x = convert(x)
    return x if is_float(x.dtype) else x.astype("float32")


def _unary_math(name: str) -> Callable[[Any], Expr]:
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
round_even = _unary_math("round_even")   # half to even (int8 requantization)
# trigonometry (codegen/mathlib.py: exact range reduction, no libm)
sin = _unary_math("sin")
cos = _unary_math("cos")
tan = _unary_math("tan")
asin = _unary_math("asin")
acos = _unary_math("acos")
atan = _unary_math("atan")


def abs(x: Any) -> Expr:  # noqa: A001 - te.abs
    x = convert(x)
    return Call("abs", [x], x.dtype)


def pow(a: Any, b: Any) -> Expr:  # noqa: A001 - te.pow
    a, b = promote(a, b)
    if not is_float(a.dtype):
        a, b = a.astype("float32"), b.astype("float32")
    return Call("pow", [a, b], a.dtype)


def power(a: Any, b: Any) -> Expr:
    return pow(a, b)
