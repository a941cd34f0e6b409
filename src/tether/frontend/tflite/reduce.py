"""Reductions over constant axes (MEAN, SUM, REDUCE_MAX/MIN/PROD), kept NCHW when the result's dims come out in
the same order either way (always with keep_dims, or a reduction over H and W or over C)."""
from __future__ import annotations

import numpy as np

from tether.frontend.tflite.state import NATIVE, NCHW, TO_NCHW, nchw_axis
from tether.frontend.tflite.table import ConverterTable

CONVERTERS = ConverterTable("tflite reduce")

_REDUCE = {"MEAN": "ReduceMean", "SUM": "ReduceSum", "REDUCE_MAX": "ReduceMax", "REDUCE_MIN": "ReduceMin",
           "REDUCE_PROD": "ReduceProd"}


def _reduce(ctx, op) -> None:
    x = op.inputs[0]
    rank = ctx.rank(x)
    axes = sorted({a + rank if a < 0 else a for a in ctx.int_list(op.inputs[1], "axes")})
    keep = bool(op.options.get("keep_dims", False))
    layout = ctx.layout(x)
    if not axes:            # nothing to reduce: TFLite returns the input (ONNX would reduce every axis)
        held, layout = ctx.held(x)
        ctx.set_output(op.outputs[0], ctx.emit1("Identity", [held]), layout)
        return
    if layout == NCHW and rank == 4:
        kept_nhwc = [a for a in range(4) if a not in axes]
        kept_nchw = [a for a in TO_NCHW if a not in axes]
        if keep or kept_nhwc == kept_nchw:
            name = ctx.emit1(_REDUCE[op.op], [ctx.nchw(x), ctx.add_const(
                np.array(sorted(nchw_axis(a) for a in axes), np.int64), "axes")], keepdims=int(keep))
            ctx.set_output(op.outputs[0], name, NCHW if keep else NATIVE)
            return
    name = ctx.emit1(_REDUCE[op.op], [ctx.nhwc(x), ctx.add_const(np.array(axes, np.int64), "axes")],
                     keepdims=int(keep))
    ctx.set_output(op.outputs[0], name)


for _op in _REDUCE:
    CONVERTERS.add(_op, _reduce)
