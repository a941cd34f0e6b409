"""Elementwise math with numpy broadcasting: binary arithmetic and unary math functions."""
from __future__ import annotations

from typing import Callable

from tether import te

from . import common as c

def _divide(a, b):
    """a / b; integers truncate toward zero (C and ONNX ``Div``), where tir's ``/`` on integers floors."""
    a, b = te.convert(a, getattr(b, "dtype", None)), te.convert(b, getattr(a, "dtype", None))
    if "float" in a.dtype or "float" in b.dtype or a.dtype.startswith("uint") or a.dtype == "bool":
        return a / b
    q = a // b
    # floor and truncation differ by one when the division is inexact and the quotient negative
    return te.if_then_else(te.all(q * b != a, q < 0), q + 1, q)


_BINARY: dict[str, Callable] = {
    "add": lambda a, b: a + b,
    "subtract": lambda a, b: a - b,
    "multiply": lambda a, b: a * b,
    "divide": lambda a, b: _divide(a, b),
    "maximum": c.max2,
    "minimum": c.min2,
    "power": lambda a, b: te.pow(a, b),
}

_UNARY: dict[str, Callable] = {
    "exp": lambda x: te.exp(x),
    "log": lambda x: te.log(x),
    "sqrt": lambda x: te.sqrt(x),
    "rsqrt": lambda x: te.rsqrt(x),
    "abs": lambda x: te.abs(x),
    "floor": lambda x: te.floor(x),
    "ceil": lambda x: te.ceil(x),
    "erf": lambda x: te.erf(x),
    "negative": lambda x: -x,
}


def binary(kind: str, a, b, name: str | None = None):
    """Broadcasting binary op `kind` (a key of the table above) of tensors and/or Python scalars."""
    if not isinstance(a, te.Tensor) and not isinstance(b, te.Tensor):
        raise TypeError(f"{kind}: at least one operand must be a te.Tensor")
    fn = _BINARY[kind]
    dtype = c.dtype_of(a, b)
    shape = c.broadcast_shape(c.shape_of(a), c.shape_of(b))
    same = c.shape_of(a) == shape and c.shape_of(b) == shape
    tag = c.ELEMWISE if same else c.BROADCAST

    def f(*idx):
        return fn(c.broadcast_load(a, idx, dtype), c.broadcast_load(b, idx, dtype))

    return c.compute(shape, f, name or kind, tag)


def unary(kind: str, x, name: str | None = None):
    fn = _UNARY[kind]
    return c.compute(x.shape, lambda *idx: fn(x[idx]), name or kind, c.ELEMWISE)


def add(a, b, name: str | None = None):
    return binary("add", a, b, name)


def subtract(a, b, name: str | None = None):
    return binary("subtract", a, b, name)


def multiply(a, b, name: str | None = None):
    return binary("multiply", a, b, name)


def divide(a, b, name: str | None = None):
    return binary("divide", a, b, name)


def maximum(a, b, name: str | None = None):
    return binary("maximum", a, b, name)


def minimum(a, b, name: str | None = None):
    return binary("minimum", a, b, name)


def power(a, b, name: str | None = None):
    return binary("power", a, b, name)


def exp(x, name: str | None = None):
    return unary("exp", x, name)


def log(x, name: str | None = None):
    return unary("log", x, name)


def sqrt(x, name: str | None = None):
    return unary("sqrt", x, name)


def rsqrt(x, name: str | None = None):
    return unary("rsqrt", x, name)


def abs(x, name: str | None = None):  # noqa: A001 - mirrors numpy's name
    return unary("abs", x, name)


def floor(x, name: str | None = None):
    return unary("floor", x, name)


def ceil(x, name: str | None = None):
    return unary("ceil", x, name)


def erf(x, name: str | None = None):
    return unary("erf", x, name)


def negative(x, name: str | None = None):
    return unary("negative", x, name)
