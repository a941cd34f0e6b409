"""``scatter_flat``: a copy of ``data`` with ``updates`` written at flat positions known only at run time, the
kernel of ONNX's ScatterElements and ScatterND when their indices are computed by the model (the frontend turns
the indices into flat positions with ordinary graph ops; constant indices need no kernel, see
frontend/onnx/indexmap.py).

Written as loop IR because a scatter is a loop over the updates, not a function of each output element: the data
is copied, then each update is stored (or combined: add, mul, max, min) in update order, so that of two updates
of one position the later wins, as in ONNX's reference and onnxruntime. A position outside the data skips its
update: the indices come from the model's input and must never address memory outside the output (onnxruntime
raises on them instead).
"""
from __future__ import annotations

from typing import Dict

import numpy as np

from tether import te
from tether.graph.ir import Node, TensorType
from tether.kernels.registry import LoopKernel, OpDef, Strategy, kernel_shape
from tether.tir import Buffer, Const, For, Load, PrimFunc, Store, Var, seq
from tether.tir.expr import Binary, Cast, Compare
from tether.tir.stmt import IfThenElse

REDUCTIONS = ("none", "add", "mul", "max", "min")


def _infer(attrs, data: TensorType, dst: TensorType, updates: TensorType):
    if attrs.get("reduction", "none") not in REDUCTIONS:
        raise ValueError("scatter_flat reduction %r (expected one of %s)" % (attrs.get("reduction"),
                                                                              ", ".join(REDUCTIONS)))
    if dst.size != updates.size or dst.dtype not in ("int64", "int32"):
        raise ValueError("scatter_flat takes one int32/int64 position per update: %d %s positions for %d updates"
                         % (dst.size, dst.dtype, updates.size))
    return [TensorType(tuple(data.shape), data.dtype)]


_COMBINE_NP = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


def _ref(attrs, data: np.ndarray, dst: np.ndarray, updates: np.ndarray):
    out = data.copy().reshape(-1)
    how = attrs.get("reduction", "none")
    for d, u in zip(dst.reshape(-1).tolist(), updates.reshape(-1).tolist()):
        if 0 <= d < out.size:
            out[d] = u if how == "none" else _COMBINE_NP[how](out[d], u)
    return [out.reshape(data.shape)]


DEFINITIONS: Dict[str, OpDef] = {"scatter_flat": OpDef("scatter_flat", "opaque", _infer, _ref)}


def scatter_kernel(node: Node, types: Dict[str, TensorType], name: str) -> PrimFunc:
    """The PrimFunc of one ``scatter_flat`` node: arguments data, positions, updates, then the output."""
    td, ti, tu = (types[i] for i in node.inputs)
    how = node.attrs.get("reduction", "none")
    n, m = max(1, td.size), tu.size
    shapes = [kernel_shape(t.shape) for t in (td, ti, tu, td)]
    dtypes = [td.dtype, ti.dtype, tu.dtype, td.dtype]
    names = ["data", "dst", "updates", "out"]
    placeholders = [te.placeholder(s, dt, name=nm) for s, dt, nm in zip(shapes, dtypes, names)]
    data, dst, upd, out = (Buffer(nm, s, dt, "param") for nm, s, dt in zip(names, shapes, dtypes))
    i, j = Var("i"), Var("j")
    copy = For(i, Const(0, "int32"), Const(n, "int32"), "serial", Store(out, i, Load(data, i)))
    pos = Load(dst, j)
    inside = Binary("and", Compare("ge", pos, Const(0, ti.dtype)), Compare("lt", pos, Const(n, ti.dtype)), "bool")
    at = Cast("int32", pos)
    value = Load(upd, j)
    if how != "none":
        value = Binary(how if how in ("max", "min") else how, Load(out, at), value, td.dtype)
    scatter = For(j, Const(0, "int32"), Const(m, "int32"), "serial", IfThenElse(inside, Store(out, at, value)))
    return PrimFunc(name, placeholders, [data, dst, upd, out], seq(copy, scatter))


CPU_STRATEGIES: Dict[str, Strategy] = {
    "scatter_flat": LoopKernel(lambda node, types, target, name, compile_body: scatter_kernel(node, types, name)),
}

__all__ = ["DEFINITIONS", "CPU_STRATEGIES", "REDUCTIONS", "scatter_kernel"]
