"""Tensor expressions: describe what a kernel computes (placeholder/compute/reduce) and how (schedules)."""
from tether.te.expr import (Expr, Var, IterVar, Const, const, convert, cast, if_then_else, all, any,  # noqa: F401
                            logical_and, logical_or, logical_not, max_value, min_value, floordiv, floormod,
                            exp, log, sqrt, rsqrt, tanh, sigmoid, erf, pow, power, floor, ceil, abs,
                            sum, prod, max, min, reduce_axis)
from tether.te.tensor import Tensor, Operation, PlaceholderOp, ComputeOp, placeholder, compute  # noqa: F401
from tether.te.schedule import Schedule, Stage, create_schedule  # noqa: F401


def var(name: str = "v", dtype: str = "int32") -> Var:
    return Var(name, dtype)
