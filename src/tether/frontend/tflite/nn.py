"""Convolutions, fully connected layers and pools, computed NCHW.

TFLite states padding as SAME or VALID. TensorFlow's SAME pads ``max((out - 1) * stride + effective_filter - in,
0)`` in all, the odd one at the end (bottom/right), worked out here from the file's input size (ONNX's auto_pad
SAME_UPPER where that size is dynamic). TRANSPOSE_CONV's cropping comes from its explicit output shape.
Filters are OHWI (CONV_2D, TRANSPOSE_CONV) and 1HW(C*M) (DEPTHWISE_CONV_2D); they are permuted as data into
ONNX's OIHW.
"""
from __future__ import annotations

from typing import Any, Dict, List, Tuple

import numpy as np

from tether.errors import UnsupportedOpError
from tether.frontend.tflite import fused
from tether.frontend.tflite.state import NCHW
from tether.frontend.tflite.table import ConverterTable

CONVERTERS = ConverterTable("tflite nn")

SAME, VALID = 0, 1


def padding_1d(ctx, in_size: int, kernel: int, stride: int, dilation: int = 1) -> Tuple[int, int]:
    """(begin, end) padding of one spatial dimension, as TensorFlow computes it."""
    mode = int(ctx.op.options.get("padding", SAME))
    if mode == VALID:
        return 0, 0
    if mode != SAME:
        raise UnsupportedOpError("%s: padding mode %d is not SAME or VALID" % (ctx.where(), mode))
    effective = (kernel - 1) * dilation + 1
    out = -(-in_size // stride)
    total = max((out - 1) * stride + effective - in_size, 0)
    return total // 2, total - total // 2


def _padding(ctx, x: int, kh: int, kw: int, sh: int, sw: int, dh: int = 1, dw: int = 1) -> Dict[str, Any]:
    """The ONNX padding attribute of a window op on input ``x``: explicit pads when its height and width are
    fixed in the file, else auto_pad (SAME_UPPER is TensorFlow's SAME), worked out at import from the input
    size it is given. Explicit pads keep the graph portable: onnxruntime takes no auto_pad with dilation."""
    t = ctx.tensor(x)
    sig = t.shape_signature if t.shape_signature else t.shape
    if len(t.shape) == 4 and len(sig) == 4 and sig[1] >= 0 and sig[2] >= 0:
        _, h, w, _ = t.shape
        top, bottom = padding_1d(ctx, h, kh, sh, dh)
        left, right = padding_1d(ctx, w, kw, sw, dw)
        return {"pads": [top, left, bottom, right]}
    mode = int(ctx.op.options.get("padding", SAME))
    if mode not in (SAME, VALID):
        raise UnsupportedOpError("%s: padding mode %d is not SAME or VALID" % (ctx.where(), mode))
    return {"auto_pad": "SAME_UPPER" if mode == SAME else "VALID"}


def _strides(op) -> Tuple[int, int]:
    return int(op.options.get("stride_h", 1) or 1), int(op.options.get("stride_w", 1) or 1)


def _bias(ctx, op, position: int) -> List[str]:
    if len(op.inputs) > position and op.inputs[position] >= 0:
        return [ctx.nhwc(op.inputs[position])]
    return []


def _finish(ctx, op, value: str) -> None:
    ctx.set_output(op.outputs[0], fused.apply_from(ctx, value), NCHW)


@CONVERTERS.register("CONV_2D")
def _conv2d(ctx, op) -> None:
    x, w = op.inputs[0], op.inputs[1]
    o, kh, kw, i = ctx.shape(w) if ctx.const(w) is None else ctx.const(w).shape
    channels = ctx.shape(x)[3]
    if channels % i:
        raise UnsupportedOpError("%s: %d input channels are not a multiple of the filter's %d"
                                 % (ctx.where(), channels, i))
    sh, sw = _strides(op)
    dh, dw = int(op.options.get("dilation_h_factor", 1) or 1), int(op.options.get("dilation_w_factor", 1) or 1)
    weights = ctx.transposed_const(w, (0, 3, 1, 2))
    y = ctx.emit1("Conv", [ctx.nchw(x), weights] + _bias(ctx, op, 2), kernel_shape=[kh, kw], strides=[sh, sw],
                  dilations=[dh, dw], group=channels // i, **_padding(ctx, x, kh, kw, sh, sw, dh, dw))
    _finish(ctx, op, y)


@CONVERTERS.register("DEPTHWISE_CONV_2D")
def _depthwise(ctx, op) -> None:
    x, w = op.inputs[0], op.inputs[1]
    _, kh, kw, cm = ctx.shape(w) if ctx.const(w) is None else ctx.const(w).shape
    channels = ctx.shape(x)[3]
    if cm % channels:
        raise UnsupportedOpError("%s: the filter's %d channels are not a multiple of the %d input channels"
                                 % (ctx.where(), cm, channels))
    sh, sw = _strides(op)
    dh, dw = int(op.options.get("dilation_h_factor", 1) or 1), int(op.options.get("dilation_w_factor", 1) or 1)
    # output channel c * M + m reads input channel c: ONNX's grouped conv with C groups of M filters each
    weights = ctx.transposed_const(w, (3, 0, 1, 2))
    y = ctx.emit1("Conv", [ctx.nchw(x), weights] + _bias(ctx, op, 2), kernel_shape=[kh, kw], strides=[sh, sw],
                  dilations=[dh, dw], group=channels, **_padding(ctx, x, kh, kw, sh, sw, dh, dw))
    _finish(ctx, op, y)


@CONVERTERS.register("TRANSPOSE_CONV")
def _transpose_conv(ctx, op) -> None:
    out_shape = ctx.int_list(op.inputs[0], "output shape")
    w, x = op.inputs[1], op.inputs[2]
    o, kh, kw, i = ctx.shape(w) if ctx.const(w) is None else ctx.const(w).shape
    _, in_h, in_w, _ = ctx.shape(x)
    sh, sw = _strides(op)
    pads, out_pad = [0, 0, 0, 0], [0, 0]
    for d, (n_in, n_out, k, s) in enumerate(((in_h, out_shape[1], kh, sh), (in_w, out_shape[2], kw, sw))):
        # the forward conv maps the output (n_out) back to the input (n_in): its padding is this op's cropping
        full = (n_in - 1) * s + k
        begin = padding_1d(ctx, n_out, k, s)[0]
        end = full - begin - n_out
        if end < 0:                 # the output reaches past the last full window: ONNX's output_padding
            out_pad[d], end = -end, 0
        pads[d], pads[d + 2] = begin, end
    weights = ctx.transposed_const(w, (3, 0, 1, 2))
    y = ctx.emit1("ConvTranspose", [ctx.nchw(x), weights] + _bias(ctx, op, 3), kernel_shape=[kh, kw],
                  strides=[sh, sw], pads=pads, output_padding=out_pad)
    _finish(ctx, op, y)


@CONVERTERS.register("FULLY_CONNECTED")
def _fully_connected(ctx, op) -> None:
    if int(op.options.get("weights_format", 0)):
        raise UnsupportedOpError("%s: shuffled weights (weights_format %d) are not supported"
                                 % (ctx.where(), op.options["weights_format"]))
    if int(op.options.get("fused_activation_function", 0)) in (fused.TANH, fused.SIGN_BIT):
        raise UnsupportedOpError("%s: fused activation %d (LiteRT refuses it on FULLY_CONNECTED too)"
                                 % (ctx.where(), op.options["fused_activation_function"]))
    x, w = op.inputs[0], op.inputs[1]
    n, k = ctx.shape(w) if ctx.const(w) is None else ctx.const(w).shape
    in_shape = ctx.shape(x)
    flat = ctx.nhwc(x)
    if len(in_shape) != 2:
        flat = ctx.emit1("Reshape", [flat, ctx.add_const(np.array([-1, k], np.int64), "fc_shape")])
    weights = ctx.nhwc(w)
    y = ctx.emit1("Gemm", [flat, weights] + _bias(ctx, op, 2), transB=1)
    y = fused.apply_from(ctx, y)
    if op.options.get("keep_num_dims") and len(in_shape) != 2:
        shape = [-1] + list(in_shape[1:-1]) + [n]
        y = ctx.emit1("Reshape", [y, ctx.add_const(np.array(shape, np.int64), "fc_out_shape")])
    ctx.set_output(op.outputs[0], y)


def _pool(ctx, op, onnx_op: str) -> str:
    x = op.inputs[0]
    kh, kw = int(op.options.get("filter_height", 1)), int(op.options.get("filter_width", 1))
    sh, sw = _strides(op)
    attrs = dict(kernel_shape=[kh, kw], strides=[sh, sw], **_padding(ctx, x, kh, kw, sh, sw))
    if onnx_op == "AveragePool":
        attrs["count_include_pad"] = 0       # TFLite divides by the number of taps inside the input
    return ctx.emit1(onnx_op, [ctx.nchw(x)], **attrs)


@CONVERTERS.register("MAX_POOL_2D")
def _max_pool(ctx, op) -> None:
    _finish(ctx, op, _pool(ctx, op, "MaxPool"))


@CONVERTERS.register("AVERAGE_POOL_2D")
def _avg_pool(ctx, op) -> None:
    _finish(ctx, op, _pool(ctx, op, "AveragePool"))


@CONVERTERS.register("L2_POOL_2D")
def _l2_pool(ctx, op) -> None:
    # TFLite: sqrt of the mean of the squares over the taps inside the input (ONNX's LpPool sums, not averages)
    x = op.inputs[0]
    kh, kw = int(op.options.get("filter_height", 1)), int(op.options.get("filter_width", 1))
    sh, sw = _strides(op)
    xc = ctx.nchw(x)
    sq = ctx.emit1("Mul", [xc, xc])
    mean = ctx.emit1("AveragePool", [sq], kernel_shape=[kh, kw], strides=[sh, sw],
                     count_include_pad=0, **_padding(ctx, x, kh, kw, sh, sw))
    _finish(ctx, op, ctx.emit1("Sqrt", [mean]))
