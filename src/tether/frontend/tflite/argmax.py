"""ARG_MAX, ARG_MIN and TOPK_V2: positions of extreme values. Ties resolve to the lowest index, as LiteRT's
kernels do (and ONNX ArgMax/TopK)."""
from __future__ import annotations

import numpy as np

from tether.frontend.tflite.state import NCHW, onnx_dtype
from tether.frontend.tflite.table import ConverterTable

CONVERTERS = ConverterTable("tflite argmax")


def _cast_index(ctx, name: str, dtype: str) -> str:
    return name if dtype == "int64" else ctx.emit1("Cast", [name], to=onnx_dtype(dtype))


@CONVERTERS.register("ARG_MAX", "ARG_MIN")
def _arg(ctx, op) -> None:
    x = op.inputs[0]
    rank = ctx.rank(x)
    (axis,) = ctx.int_list(op.inputs[1], "axis")
    axis = axis + rank if axis < 0 else axis
    onnx_op = "ArgMax" if op.op == "ARG_MAX" else "ArgMin"
    name, layout = ctx.held(x)
    if layout == NCHW and rank == 4 and axis == 3:
        # over the channels: the (N, H, W) result reads the same from the NCHW value
        y = ctx.emit1(onnx_op, [name], axis=1, keepdims=0)
    else:
        y = ctx.emit1(onnx_op, [ctx.nhwc(x)], axis=axis, keepdims=0)
    ctx.set_output(op.outputs[0], _cast_index(ctx, y, ctx.tensor(op.outputs[0]).dtype))


@CONVERTERS.register("TOPK_V2")
def _topk(ctx, op) -> None:
    x, k = op.inputs[:2]
    kk = ctx.emit1("Reshape", [ctx.nhwc(k), ctx.add_const(np.array([1], np.int64), "one")])
    if ctx.tensor(k).dtype != "int64":
        kk = ctx.emit1("Cast", [kk], to=onnx_dtype("int64"))
    values, indices = ctx.emit("TopK", [ctx.nhwc(x), kk], outputs=2, axis=-1, largest=1, sorted=1)
    ctx.set_output(op.outputs[0], values)
    ctx.set_output(op.outputs[1], _cast_index(ctx, indices, ctx.tensor(op.outputs[1]).dtype))
