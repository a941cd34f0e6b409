"""CONV_3D: a 3-D convolution on NDHWC activations with DHWIO filters.

tether's convolutions are 1-D and 2-D, so the 3-D one is a sum over the filter's depth taps: tap ``t`` reads the
depth frames ``t * dilation_d + k * stride_d`` (k: output frame) of the depth-padded input, folded into the batch,
and convolves them in 2-D with that tap's HWIO slice; the taps' results add up, then the bias and the fused
activation. Padding SAME/VALID as TensorFlow computes it per spatial axis (the odd pad at the end); grouped when
the input has a multiple of the filter's input channels.
"""
from __future__ import annotations

import numpy as np

from tether.errors import UnsupportedOpError
from tether.frontend.tflite import fused
from tether.frontend.tflite.nn import padding_1d
from tether.frontend.tflite.table import ConverterTable

CONVERTERS = ConverterTable("tflite conv3d")


def _i64(ctx, values, hint: str) -> str:
    return ctx.add_const(np.array(list(values), np.int64), hint)


@CONVERTERS.register("CONV_3D")
def _conv3d(ctx, op) -> None:
    x, w = op.inputs[:2]
    weights = ctx.const(w)
    if weights is None:
        raise UnsupportedOpError("%s: a filter computed at run time (tether needs constant weights)" % ctx.where())
    kd, kh, kw, cin, cout = weights.shape
    n, d, h, wd, channels = ctx.shape(x)
    if channels % cin:
        raise UnsupportedOpError("%s: %d input channels are not a multiple of the filter's %d"
                                 % (ctx.where(), channels, cin))
    o = op.options
    sd, sh, sw = (int(o.get(k, 1) or 1) for k in ("stride_d", "stride_h", "stride_w"))
    dd, dh, dw = (int(o.get(k, 1) or 1) for k in ("dilation_d_factor", "dilation_h_factor", "dilation_w_factor"))
    front, back = padding_1d(ctx, d, kd, sd, dd)
    top, bottom = padding_1d(ctx, h, kh, sh, dh)
    left, right = padding_1d(ctx, wd, kw, sw, dw)
    out_d = (d + front + back - (kd - 1) * dd - 1) // sd + 1
    if out_d <= 0:
        raise UnsupportedOpError("%s: the filter's depth %d exceeds the input's %d" % (ctx.where(), kd, d))
    value = ctx.nhwc(x)
    if front or back:
        value = ctx.emit1("Pad", [value, _i64(ctx, [0, front, 0, 0, 0, 0, back, 0, 0, 0], "pads")])
    total = None
    for t in range(kd):
        frames = ctx.emit1("Slice", [value, _i64(ctx, [t * dd], "starts"), _i64(ctx, [t * dd + (out_d - 1) * sd + 1],
                                                                               "ends"),
                                     _i64(ctx, [1], "axes"), _i64(ctx, [sd], "steps")])
        flat = ctx.emit1("Reshape", [frames, _i64(ctx, [-1, h, wd, channels], "shape")])
        nchw = ctx.emit1("Transpose", [flat], perm=[0, 3, 1, 2])
        tap = ctx.add_const(np.ascontiguousarray(np.transpose(weights[t], (3, 2, 0, 1))), "conv3d_tap")
        y = ctx.emit1("Conv", [nchw, tap], kernel_shape=[kh, kw], strides=[sh, sw], dilations=[dh, dw],
                      pads=[top, left, bottom, right], group=channels // cin)
        total = y if total is None else ctx.emit1("Add", [total, y])
    if len(op.inputs) > 2 and op.inputs[2] >= 0:
        bias = ctx.emit1("Reshape", [ctx.nhwc(op.inputs[2]), _i64(ctx, [1, cout, 1, 1], "shape")])
        total = ctx.emit1("Add", [total, bias])
    total = fused.apply_from(ctx, total)
    # (N * D', C', H', W') -> (N, D', H', W', C')
    y = ctx.emit1("Transpose", [total], perm=[0, 2, 3, 1])
    oh, ow = ctx.shape(op.outputs[0])[2:4]
    ctx.set_output(op.outputs[0], ctx.emit1("Reshape", [y, _i64(ctx, [-1, out_d, oh, ow, cout], "shape")]))
