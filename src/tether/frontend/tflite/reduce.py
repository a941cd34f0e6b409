"""Reductions over constant axes (MEAN, SUM, REDUCE_MAX/MIN/PROD), kept NCHW when the result's dims come out in
the same order either way (always with keep_dims, or a reduction over H and W or over C); REDUCE_WINDOW."""
from __future__ import annotations

import numpy as np

from tether.errors import UnsupportedOpError
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


# REDUCE_WINDOW's reduce_function -> (ONNX elementwise op, whether it takes bool tensors)
_WINDOW_FUNCTIONS = {1: ("Add", False), 2: ("Mul", False), 3: ("Min", False), 4: ("Max", False), 5: ("And", True),
                     6: ("Or", True)}


@CONVERTERS.register("REDUCE_WINDOW")
def _reduce_window(ctx, op) -> None:
    """A window (shape, strides, dilations; no padding) reduced to one element per position. The functions are
    associative and commutative, so the window is reduced one axis at a time: along an axis, each of its ``k``
    offsets is a strided slice, and the slices combine elementwise; then the init value joins in."""
    code = int(op.options.get("reduce_function", 0) or 0)
    dtype = ctx.tensor(op.inputs[0]).dtype
    if code not in _WINDOW_FUNCTIONS or _WINDOW_FUNCTIONS[code][1] != (dtype == "bool"):
        raise UnsupportedOpError("%s: reduce function %d on %s (expected ADD, MUL, MINIMUM or MAXIMUM on numbers, "
                                 "ALL or ANY on bool)" % (ctx.where(), code, dtype))
    combine = _WINDOW_FUNCTIONS[code][0]
    shape = ctx.shape(op.inputs[0])
    window, strides, dilations = (ctx.int_list(op.inputs[k], what) for k, what in
                                  ((2, "window shape"), (3, "window strides"), (4, "window dilations")))
    if not len(window) == len(strides) == len(dilations) == len(shape):
        raise UnsupportedOpError("%s: window %s, strides %s, dilations %s (expected one per axis of its rank-%d input)"
                                 % (ctx.where(), window, strides, dilations, len(shape)))
    x = ctx.nhwc(op.inputs[0])
    i64 = lambda v, hint: ctx.add_const(np.array(v, np.int64), hint)          # noqa: E731
    for axis, (n, k, s, d) in enumerate(zip(shape, window, strides, dilations)):
        span = (k - 1) * d + 1
        # LiteRT sizes the output as ceil((n - span) / s) + 1: a last window past the end would read beyond the
        # axis, so only windows that end inside it are converted
        if min(k, s, d) < 1 or span > n or (n - span) % s:
            raise UnsupportedOpError("%s: window %d, stride %d, dilation %d over %d elements on axis %d (expected "
                                     "windows that tile the axis to its end)" % (ctx.where(), k, s, d, n, axis))
        if k == 1 and s == 1:
            continue
        count = (n - span) // s + 1
        parts = [ctx.emit1("Slice", [x, i64([j * d], "starts"), i64([j * d + (count - 1) * s + 1], "ends"),
                                     i64([axis], "axes"), i64([s], "steps")]) for j in range(k)]
        x = parts[0]
        for part in parts[1:]:
            x = ctx.emit1(combine, [x, part])
    ctx.set_output(op.outputs[0], ctx.emit1(combine, [ctx.nhwc(op.inputs[1]), x]))
