"""CONV_3D and CONV_3D_TRANSPOSE: 3-D convolutions on NDHWC activations, as the ONNX 3-D Conv and ConvTranspose
(channels-first: one Transpose in, one out).

CONV_3D's filter is DHWIO, grouped when the input has a multiple of the filter's input channels; padding SAME/VALID
as TensorFlow computes it per spatial axis (the odd pad at the end). CONV_3D_TRANSPOSE (inputs: the output shape,
the filter as DHWOI, the input, an optional bias) is the gradient of that conv for the given output size: the
forward conv's padding of the output is the transpose's cropping, and an output that reaches past the last full
window is ONNX's output_padding.
"""
from __future__ import annotations

import numpy as np

from tether.errors import UnsupportedOpError
from tether.frontend.tflite import fused
from tether.frontend.tflite.nn import padding_1d
from tether.frontend.tflite.table import ConverterTable

CONVERTERS = ConverterTable("tflite conv3d")


_TO_NCDHW, _TO_NDHWC = [0, 4, 1, 2, 3], [0, 2, 3, 4, 1]


def _options(op) -> tuple:
    o = op.options
    strides = [int(o.get(k, 1) or 1) for k in ("stride_d", "stride_h", "stride_w")]
    dilations = [int(o.get(k, 1) or 1) for k in ("dilation_d_factor", "dilation_h_factor", "dilation_w_factor")]
    return strides, dilations


def _weights(ctx, index: int) -> np.ndarray:
    weights = ctx.const(index)
    if weights is None:
        raise UnsupportedOpError("%s: a filter computed at run time (tether needs constant weights)" % ctx.where())
    return weights


def _bias(ctx, op, position: int) -> list:
    return [ctx.nhwc(op.inputs[position])] if len(op.inputs) > position and op.inputs[position] >= 0 else []


def _finish(ctx, op, y: str) -> None:
    y = fused.apply_from(ctx, y)
    ctx.set_output(op.outputs[0], ctx.emit1("Transpose", [y], perm=_TO_NDHWC))


@CONVERTERS.register("CONV_3D")
def _conv3d(ctx, op) -> None:
    x, w = op.inputs[:2]
    weights = _weights(ctx, w)
    kd, kh, kw, cin, cout = weights.shape
    n, d, h, wd, channels = ctx.shape(x)
    if channels % cin:
        raise UnsupportedOpError("%s: %d input channels are not a multiple of the filter's %d"
                                 % (ctx.where(), channels, cin))
    strides, dilations = _options(op)
    pads = [padding_1d(ctx, size, k, s, dl) for size, k, s, dl in zip((d, h, wd), (kd, kh, kw), strides, dilations)]
    if (d + sum(pads[0]) - (kd - 1) * dilations[0] - 1) // strides[0] + 1 <= 0:
        raise UnsupportedOpError("%s: the filter's depth %d exceeds the input's %d" % (ctx.where(), kd, d))
    x_cf = ctx.emit1("Transpose", [ctx.nhwc(x)], perm=_TO_NCDHW)
    filt = ctx.add_const(np.ascontiguousarray(np.transpose(weights, (4, 3, 0, 1, 2))), "conv3d_filter")
    y = ctx.emit1("Conv", [x_cf, filt] + _bias(ctx, op, 2), kernel_shape=[kd, kh, kw], strides=strides,
                  dilations=dilations, pads=[p[0] for p in pads] + [p[1] for p in pads], group=channels // cin)
    _finish(ctx, op, y)


@CONVERTERS.register("CONV_3D_TRANSPOSE")
def _conv3d_transpose(ctx, op) -> None:
    out_shape = ctx.int_list(op.inputs[0], "output shape")
    w, x = op.inputs[1], op.inputs[2]
    weights = _weights(ctx, w)
    kd, kh, kw, cout, cin = weights.shape
    in_sizes = ctx.shape(x)[1:4]
    if ctx.shape(x)[4] != cin or len(out_shape) != 5 or out_shape[4] != cout:
        raise UnsupportedOpError("%s: filter %s for input %s and output shape %s; expected (depth, height, width, "
                                 "output channels, input channels)" % (ctx.where(), tuple(weights.shape),
                                                                       tuple(ctx.shape(x)), tuple(out_shape)))
    strides, dilations = _options(op)
    begins, ends, out_pad = [], [], []
    for n_in, n_out, k, s, dl in zip(in_sizes, out_shape[1:4], (kd, kh, kw), strides, dilations):
        full = (n_in - 1) * s + (k - 1) * dl + 1
        begin = padding_1d(ctx, n_out, k, s, dl)[0]
        end = full - begin - n_out
        begins.append(begin)
        ends.append(max(end, 0))
        out_pad.append(max(-end, 0))
    x_cf = ctx.emit1("Transpose", [ctx.nhwc(x)], perm=_TO_NCDHW)
    filt = ctx.add_const(np.ascontiguousarray(np.transpose(weights, (4, 3, 0, 1, 2))), "conv3d_transpose_filter")
    y = ctx.emit1("ConvTranspose", [x_cf, filt] + _bias(ctx, op, 3), kernel_shape=[kd, kh, kw], strides=strides,
                  dilations=dilations, pads=begins + ends, output_padding=out_pad)
    _finish(ctx, op, y)
