"""Boolean reductions (REDUCE_ANY, REDUCE_ALL) and cumulative sums (CUMSUM, with exclusive and reverse).

ANY is a max and ALL a min over the booleans. Both keep NCHW where
the result's axes read the same (keep_dims, or a reduction over the channels or over H and W); CUMSUM keeps the
input's layout with its axis remapped.
"""
from __future__ import annotations

import numpy as np

from tether.frontend.tflite.state import NATIVE, NCHW, TO_NCHW, nchw_axis
from tether.frontend.tflite.table import ConverterTable

CONVERTERS = ConverterTable("tflite accumulate")


@CONVERTERS.register("REDUCE_ANY", "REDUCE_ALL")
def _reduce_bool(ctx, op) -> None:
    x = op.inputs[0]
    rank = ctx.rank(x)
    axes = sorted({a + rank if a < 0 else a for a in ctx.int_list(op.inputs[1], "axes")})
    keep = int(bool(op.options.get("keep_dims", False)))
    onnx_op = "ReduceMax" if op.op == "REDUCE_ANY" else "ReduceMin"
    name, layout = ctx.held(x)
    out_layout = NATIVE
    if layout == NCHW and rank == 4 and (keep or [a for a in range(4) if a not in axes]
                                         == [a for a in TO_NCHW if a not in axes]):
        axes = sorted(nchw_axis(a) for a in axes)
        out_layout = NCHW if keep else NATIVE
    else:
        name = ctx.nhwc(x)
    if not axes:
        ctx.set_output(op.outputs[0], ctx.emit1("Identity", [name]), layout)
        return
    r = ctx.emit1(onnx_op, [name, ctx.add_const(np.array(axes, np.int64), "axes")], keepdims=keep)
    ctx.set_output(op.outputs[0], r, out_layout)


@CONVERTERS.register("CUMSUM")
def _cumsum(ctx, op) -> None:
    x = op.inputs[0]
    rank = ctx.rank(x)
    (axis,) = ctx.int_list(op.inputs[1], "axis")
    axis = axis + rank if axis < 0 else axis
    name, layout = ctx.held(x)
    if layout == NCHW and rank == 4:
        axis = nchw_axis(axis)
    y = ctx.emit1("CumSum", [name, ctx.add_const(np.array(axis, np.int64), "axis")],
                  exclusive=int(bool(op.options.get("exclusive", False))),
                  reverse=int(bool(op.options.get("reverse", False))))
    ctx.set_output(op.outputs[0], y, layout)
