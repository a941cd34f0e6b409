"""Tensor expressions: describe what a kernel computes (placeholder/compute/reduce) and how (schedules)."""
from tether.te.expr import IterVar, max, min, prod, reduce_axis, sum  # noqa: F401
from tether.te.schedule import Schedule, Stage, create_schedule  # noqa: F401
from tether.te.thread import ThreadAxis, thread_axis  # noqa: F401
from tether.te.tensor import ComputeOp, Operation, PlaceholderOp, Tensor, compute, placeholder  # noqa: F401
from tether.tir.expr import (Const, Expr, Var, all, any, bitwise, call_packed, cast, const, convert, floordiv,  # noqa: F401
                             floormod, if_then_else, logical_and, logical_not, logical_or, max_value, min_value)
from tether.tir.op import abs, ceil, erf, exp, floor, log, pow, power, rsqrt, sigmoid, sqrt, tanh  # noqa: F401
from tether.tir.op import round_even  # noqa: F401,E402  half to even
from tether.tir.op import acos, asin, atan, cos, sin, tan  # noqa: F401
from tether.tir.int8 import byte_of, dot4, pair_dot, quad_sum  # noqa: F401


def var(name: str = "v", dtype: str = "int32") -> Var:
    return Var(name, dtype)
