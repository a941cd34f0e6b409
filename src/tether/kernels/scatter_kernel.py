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


def _infer(attrs, *ins: TensorType):
    """(data, dst, updates), or (dst, updates) with ``attrs["shape"]``: a scatter into zeros of that shape (no
    constant as large as the output in the params)."""
    data, dst, updates = ins if len(ins) == 3 else (TensorType(tuple(attrs["shape"]), ins[1].dtype),) + ins
    if attrs.get("reduction", "none") not in REDUCTIONS:
        raise ValueError("scatter_flat reduction %r (expected one of %s)" % (attrs.get("reduction"),
                                                                              ", ".join(REDUCTIONS)))
    if dst.size != updates.size or dst.dtype not in ("int64", "int32"):
        raise ValueError("scatter_flat takes one int32/int64 position per update: %d %s positions for %d updates"
                         % (dst.size, dst.dtype, updates.size))
    return [TensorType(tuple(data.shape), data.dtype)]


_COMBINE_NP = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


def _ref(attrs, *ins: np.ndarray):
    data, dst, updates = ins if len(ins) == 3 else (np.zeros(tuple(attrs["shape"]), ins[1].dtype),) + ins
    out = data.copy().reshape(-1)
    how = attrs.get("reduction", "none")
    for d, u in zip(dst.reshape(-1).tolist(), updates.reshape(-1).tolist()):
        if 0 <= d < out.size:
            out[d] = u if how == "none" else _COMBINE_NP[how](out[d], u)
    return [out.reshape(data.shape)]


DEFINITIONS: Dict[str, OpDef] = {"scatter_flat": OpDef("scatter_flat", "opaque", _infer, _ref)}


def scatter_kernel(node: Node, types: Dict[str, TensorType], name: str) -> PrimFunc:
    """The PrimFunc of one ``scatter_flat`` node: arguments data (absent for a scatter into zeros), positions,
    updates, then the output."""
    zeros = len(node.inputs) == 2
    ti, tu = types[node.inputs[-2]], types[node.inputs[-1]]
    td = TensorType(tuple(node.attrs["shape"]), tu.dtype) if zeros else types[node.inputs[0]]
    how = node.attrs.get("reduction", "none")
    n, m = max(1, td.size), tu.size
    args = [(td, "data")] * (not zeros) + [(ti, "dst"), (tu, "updates"), (td, "out")]
    placeholders = [te.placeholder(kernel_shape(t.shape), t.dtype, name=nm) for t, nm in args]
    buffers = [Buffer(nm, kernel_shape(t.shape), t.dtype, "param") for t, nm in args]
    dst, upd, out = buffers[-3:]
    i, j = Var("i"), Var("j")
    first = Const(0, td.dtype) if zeros else Load(buffers[0], i)
    copy = For(i, Const(0, "int32"), Const(n, "int32"), "serial", Store(out, i, first))
    pos = Load(dst, j)
    inside = Binary("and", Compare("ge", pos, Const(0, ti.dtype)), Compare("lt", pos, Const(n, ti.dtype)), "bool")
    at = Cast("int32", pos)
    value = Load(upd, j)
    if how != "none":
        value = Binary(how, Load(out, at), value, td.dtype)     # tir's add/mul/max/min are the reductions' names
    scatter = For(j, Const(0, "int32"), Const(m, "int32"), "serial", IfThenElse(inside, Store(out, at, value)))
    return PrimFunc(name, placeholders, buffers, seq(copy, scatter))


CPU_STRATEGIES: Dict[str, Strategy] = {
    "scatter_flat": LoopKernel(lambda node, types, target, name, compile_body: scatter_kernel(node, types, name)),
}

__all__ = ["DEFINITIONS", "CPU_STRATEGIES", "REDUCTIONS", "scatter_kernel"]
