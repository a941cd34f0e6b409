"""A broadcasting n-ary elementwise map: the building block of the ONNX comparison, logic, selection and
unary-math ops (kernels/core_te.py writes each as a scalar function of its operands)."""
from __future__ import annotations

from typing import Callable, Sequence

from tether import te

from . import common as c


def elementwise(fn: Callable, inputs: Sequence["te.Tensor"], name: str = "elementwise") -> "te.Tensor":
    """``out[i] = fn(x0[i], x1[i], ...)`` with numpy broadcasting of the inputs; the output dtype is fn's."""
    shapes = [c.shape_of(x) for x in inputs]
    shape = c.broadcast_shape(*shapes)
    tag = c.ELEMWISE if all(s == shape for s in shapes) else c.BROADCAST
    return c.compute(shape, lambda *idx: fn(*[c.broadcast_load(x, idx, x.dtype) for x in inputs]), name, tag)
