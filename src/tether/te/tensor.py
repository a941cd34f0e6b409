"""Tensors and the operations that produce them: placeholders (inputs) and computes (index -> expression)."""
from __future__ import annotations

import inspect
from typing import Any, Callable, Sequence

from tether.errors import CompileError
from tether.te.expr import IterVar
from tether.tir.dtype import check_dtype, is_int
from tether.tir.expr import Expr, Reduce, TensorLoad, convert
from tether.tir.visit import walk


class Tensor:
    """A multi-dimensional array value: the output of a PlaceholderOp or ComputeOp."""

    __hash__ = object.__hash__

    def __init__(self, op: "Operation", shape: Sequence[int], dtype: str, name: str):
        self.op = op
        self.shape = tuple(int(d) for d in shape)
        self.dtype = check_dtype(dtype)
        self.name = name

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __getitem__(self, indices: Any) -> TensorLoad:
        if not isinstance(indices, (tuple, list)):
            indices = (indices,)
        if len(indices) != len(self.shape):
            raise IndexError(f"tensor {self.name!r} has {len(self.shape)} dimensions, indexed with {len(indices)}")
        idx = []
        for x in indices:
            e = convert(x)
            if not is_int(e.dtype):
                raise TypeError(f"index into {self.name!r} must be an integer expression, got {e.dtype}")
            idx.append(e if e.dtype == "int32" else e.astype("int32"))
        return TensorLoad(self, idx)

    def __call__(self, *indices: Any) -> TensorLoad:
        return self[indices]

    def __repr__(self) -> str:
        return f"Tensor({self.name}, shape={self.shape}, dtype={self.dtype})"


class Operation:
    name: str
    tag: str = ""
    attrs: dict

    def output(self, i: int = 0) -> Tensor:
        if i != 0:
            raise IndexError(f"{self.name} has a single output")
        return self._output

    @property
    def num_outputs(self) -> int:
        return 1

    @property
    def input_tensors(self) -> list[Tensor]:
        return []

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name})"


class PlaceholderOp(Operation):
    def __init__(self, shape: Sequence[int], dtype: str, name: str):
        self.name = name
        self.tag = ""
        self.attrs = {}
        self.shape = tuple(int(d) for d in shape)
        self.dtype = dtype
        self._output = Tensor(self, shape, dtype, name)


class ComputeOp(Operation):
    """``out[axis] = body`` over ``axis`` (data IterVars); ``body`` may be a top-level Reduce over reduce_axis."""

    def __init__(self, name: str, tag: str, attrs: dict, axis: list[IterVar], body: Expr):
        self.name = name
        self.tag = tag
        self.attrs = dict(attrs or {})
        self.axis = list(axis)
        self.body = body
        self.reduce_axis = list(body.axis) if isinstance(body, Reduce) else []
        self.shape = tuple(iv.extent for iv in axis)
        self.dtype = body.dtype
        self._output = Tensor(self, self.shape, body.dtype, name)

    @property
    def input_tensors(self) -> list[Tensor]:
        return collect_tensors(self.body)


def placeholder(shape: Sequence[int] | int, dtype: str = "float32", name: str = "placeholder") -> Tensor:
    return PlaceholderOp(_shape(shape, "placeholder", name), check_dtype(dtype), name).output(0)


def _shape(shape: Sequence[int] | int, what: str, name: str) -> tuple:
    """``shape`` as a tuple of positive ints (an int is a 1-d shape)."""
    if isinstance(shape, int):
        shape = (shape,)
    shape = tuple(int(d) for d in shape)
    for d in shape:
        if d <= 0:
            raise ValueError(f"{what} {name!r}: every extent must be positive, got shape {shape}")
    return shape


def _arg_names(fcompute: Callable, ndim: int) -> list[str]:
    try:
        params = list(inspect.signature(fcompute).parameters.values())
    except (TypeError, ValueError):
        params = []
    if params and params[0].kind == inspect.Parameter.VAR_POSITIONAL:
        return [f"i{d}" for d in range(ndim)]
    names = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(names) != ndim:
        raise TypeError(f"te.compute: the function takes {len(names)} index arguments but the shape has {ndim} "
                        "dimensions")
    return names


def compute(shape: Sequence[int] | int, fcompute: Callable, name: str = "compute", tag: str = "",
            attrs: dict | None = None) -> Tensor:
    """``out[i, j, ...] = fcompute(i, j, ...)`` for every index of ``shape``."""
    shape = _shape(shape, "compute", name)
    axis = [IterVar(n, d, "data") for n, d in zip(_arg_names(fcompute, len(shape)), shape)]
    body = fcompute(*axis)
    if isinstance(body, (list, tuple)):
        raise CompileError(f"compute {name!r}: multiple outputs are not supported; use one compute per output")
    body = convert(body)
    _check_reduce_placement(body, name)
    return ComputeOp(name, tag, attrs or {}, axis, body).output(0)


def _check_reduce_placement(body: Expr, name: str) -> None:
    top = body.source if isinstance(body, Reduce) else body
    for node in walk(top):
        if isinstance(node, Reduce):
            raise CompileError(f"compute {name!r}: a reduction (te.sum/max/min) must be the whole body of its "
                               "compute; compute the reduction in its own te.compute and use it from another")


def collect_tensors(e: Expr) -> list[Tensor]:
    seen: dict[int, Tensor] = {}
    for node in walk(e):
        if isinstance(node, TensorLoad) and id(node.tensor) not in seen:
            seen[id(node.tensor)] = node.tensor
    return list(seen.values())
