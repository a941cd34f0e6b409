"""MediaPipe's custom ops that LiteRT's XNNPACK delegate runs itself, so that MediaPipe's models (selfie
segmentation, hair segmentation) run in LiteRT without MediaPipe: ``Convolution2DTransposeBias``,
``MaxPoolingWithArgmax2D`` and ``MaxUnpooling2D``.

Their custom options are not a FlexBuffer but the raw C struct MediaPipe's kernels cast them to, little-endian
int32s: ``TfLiteTransposeConvParams`` (padding: 1 SAME, 2 VALID; stride width; stride height) and
``TfLitePoolParams`` (padding, stride width and height, filter width and height, fused activation, then the
padding the kernel computes for itself). The semantics are MediaPipe's kernels' (mediapipe/util/tflite/operations):

- the transpose conv sizes its output from the input alone: SAME pads ``max(0, k - (n - 1) % s - 1)`` in all, half
  of it (rounded down) before, and the output is ``s * (n - 1) + k - pad``, the ONNX ConvTranspose with those pads;
- the argmax pooling is a max pool whose second output is the float ``window_y * filter_width + window_x + 0.1``
  of the first maximum in the window (row-major), the pooling window's own coordinates;
- the unpooling writes each value at its window position in an output of ``n * filter`` per spatial axis, zeros
  elsewhere; with strides equal to the filter (windows that tile the output, the models' case and the only one
  XNNPACK runs) that output needs no padding. Other strides are refused.

(XNNPACK keeps the argmax pooling's indices as integers in the float tensor's bits: a model that outputs them
reads other numbers from LiteRT than from MediaPipe's kernel; tether gives MediaPipe's.)

The face mesh with attention's custom ops, which only MediaPipe runs, are in ``mediapipe_transforms``.
"""
from __future__ import annotations

import struct

import numpy as np

from tether.errors import UnsupportedOpError
from tether.frontend.tflite.state import NCHW
from tether.frontend.tflite.table import ConverterTable

CONVERTERS = ConverterTable("tflite mediapipe")

TRANSPOSE_CONV_BIAS = "Convolution2DTransposeBias"
ARGMAX_POOL = "MaxPoolingWithArgmax2D"
UNPOOL = "MaxUnpooling2D"
_SAME, _VALID = 1, 2
# TfLiteFusedActivation -> the (min, max) clip it applies; the others are refused
_ACTIVATIONS = {0: None, 1: (0.0, None), 2: (-1.0, 1.0), 3: (0.0, 6.0)}


def transpose_conv_params(ctx, op) -> tuple:
    """(padding, stride_w, stride_h) from the op's raw TfLiteTransposeConvParams."""
    raw = op.custom_options
    if len(raw) < 12:
        raise UnsupportedOpError("%s: %s options hold %d bytes; expected TfLiteTransposeConvParams (padding, "
                                 "stride width, stride height: 12 bytes)" % (ctx.where(), op.custom_code, len(raw)))
    padding, sw, sh = struct.unpack_from("<3i", raw)
    if padding not in (_SAME, _VALID) or sw < 1 or sh < 1:
        raise UnsupportedOpError("%s: %s options padding=%d strides=(%d, %d); expected padding 1 (SAME) or 2 "
                                 "(VALID) and positive strides" % (ctx.where(), op.custom_code, padding, sh, sw))
    return padding, sw, sh


@CONVERTERS.register(TRANSPOSE_CONV_BIAS)
def _transpose_conv_bias(ctx, op) -> None:
    if len(op.inputs) != 3 or min(op.inputs) < 0:
        raise UnsupportedOpError("%s: %s takes input, weights and bias; got %d input(s)"
                                 % (ctx.where(), op.custom_code, sum(i >= 0 for i in op.inputs)))
    x, w, b = op.inputs
    _float_input(ctx, op, x)
    padding, sw, sh = transpose_conv_params(ctx, op)
    o, kh, kw, i = ctx.shape(w) if ctx.const(w) is None else ctx.const(w).shape
    _, in_h, in_w, channels = ctx.shape(x)
    if channels != i:
        raise UnsupportedOpError("%s: the input has %d channels, the OHWI weights %d"
                                 % (ctx.where(), channels, i))
    pads = [0, 0, 0, 0]
    if padding == _SAME:
        for d, (n, k, s) in enumerate(((in_h, kh, sh), (in_w, kw, sw))):
            total = max(0, k - (n - 1) % s - 1)
            pads[d], pads[d + 2] = total // 2, total - total // 2
    weights = ctx.transposed_const(w, (3, 0, 1, 2))      # OHWI -> ONNX's (in, out, kh, kw)
    y = ctx.emit1("ConvTranspose", [ctx.nchw(x), weights, ctx.nhwc(b)], kernel_shape=[kh, kw], strides=[sh, sw],
                  pads=pads)
    ctx.set_output(op.outputs[0], y, NCHW)


def pool_params(ctx, op) -> tuple:
    """(padding, stride_w, stride_h, filter_w, filter_h, activation) from the op's raw TfLitePoolParams."""
    raw = op.custom_options
    if len(raw) < 24:
        raise UnsupportedOpError("%s: %s options hold %d bytes; expected TfLitePoolParams (padding, strides, filter "
                                 "size, activation: at least 24 bytes)" % (ctx.where(), op.custom_code, len(raw)))
    padding, sw, sh, fw, fh, act = struct.unpack_from("<6i", raw)
    if padding not in (_SAME, _VALID) or min(sw, sh, fw, fh) < 1:
        raise UnsupportedOpError("%s: %s options padding=%d strides=(%d, %d) filter=(%d, %d); expected padding 1 "
                                 "(SAME) or 2 (VALID) and positive sizes" % (ctx.where(), op.custom_code, padding,
                                                                             sh, sw, fh, fw))
    if act not in _ACTIVATIONS:
        raise UnsupportedOpError("%s: %s fused activation %d; MediaPipe's kernels clip (none, RELU, RELU_N1_TO_1, "
                                 "RELU6)" % (ctx.where(), op.custom_code, act))
    return padding, sw, sh, fw, fh, act


def _float_input(ctx, op, index: int) -> None:
    if ctx.tensor(index).dtype != "float32" or len(ctx.shape(index)) != 4:
        raise UnsupportedOpError("%s: %s on a %s tensor of rank %d; MediaPipe's kernel takes float32 NHWC only"
                                 % (ctx.where(), op.custom_code, ctx.tensor(index).dtype, len(ctx.shape(index))))


def _grid(ctx, values, axis: int, hint: str) -> str:
    """An int64 constant holding ``values`` along NCHW ``axis`` (1 elsewhere), to broadcast against a map."""
    shape = [1, 1, 1, 1]
    shape[axis] = len(values)
    return ctx.add_const(np.asarray(values, np.int64).reshape(shape), hint)


def _int(ctx, value: int, hint: str) -> str:
    return ctx.add_const(np.array(value, np.int64), hint)


@CONVERTERS.register(ARGMAX_POOL)
def _max_pool_argmax(ctx, op) -> None:
    if len(op.inputs) != 1 or len(op.outputs) != 2:
        raise UnsupportedOpError("%s: %s takes one input and gives values and indices"
                                 % (ctx.where(), op.custom_code))
    x = op.inputs[0]
    _float_input(ctx, op, x)
    padding, sw, sh, fw, fh, act = pool_params(ctx, op)
    _, h, w, _ = ctx.shape(x)
    pads = [0, 0, 0, 0]
    out_hw = []
    for d, (n, k, s) in enumerate(((h, fh, sh), (w, fw, sw))):
        out = -(-n // s) if padding == _SAME else (n - k + s) // s
        total = max((out - 1) * s + k - n, 0)
        pads[d], pads[d + 2] = total // 2, total - total // 2
        out_hw.append(out)
    values, flat = ctx.emit("MaxPool", [ctx.nchw(x)], outputs=2, kernel_shape=[fh, fw], strides=[sh, sw], pads=pads)
    clip = _ACTIVATIONS[act]
    if clip is not None:
        bounds = [ctx.add_const(np.array(b, np.float32), "clip") if b is not None else "" for b in clip]
        values = ctx.emit1("Clip", [values] + bounds)
    # the input position of each maximum (ONNX's flat NCHW index), as the window's own row and column
    iy = ctx.emit1("Mod", [ctx.emit1("Div", [flat, _int(ctx, w, "width")]), _int(ctx, h, "height")])
    ix = ctx.emit1("Mod", [flat, _int(ctx, w, "width")])
    wy = ctx.emit1("Sub", [iy, _grid(ctx, [y * sh - pads[0] for y in range(out_hw[0])], 2, "window_top")])
    wx = ctx.emit1("Sub", [ix, _grid(ctx, [x * sw - pads[1] for x in range(out_hw[1])], 3, "window_left")])
    index = ctx.emit1("Add", [ctx.emit1("Mul", [wy, _int(ctx, fw, "filter_width")]), wx])
    index = ctx.emit1("Add", [ctx.emit1("Cast", [index], to=1), ctx.add_const(np.array(0.1, np.float32), "tenth")])
    ctx.set_output(op.outputs[0], values, NCHW)
    ctx.set_output(op.outputs[1], index, NCHW)


@CONVERTERS.register(UNPOOL)
def _max_unpooling(ctx, op) -> None:
    if len(op.inputs) != 2 or len(op.outputs) != 1:
        raise UnsupportedOpError("%s: %s takes values and indices and gives one output"
                                 % (ctx.where(), op.custom_code))
    x, i = op.inputs
    _float_input(ctx, op, x)
    _float_input(ctx, op, i)
    _, sw, sh, fw, fh, _ = pool_params(ctx, op)
    if (sh, sw) != (fh, fw):
        # (overlapping windows: several could write one output; XNNPACK refuses them as well)
        raise UnsupportedOpError("%s: %s with strides (%d, %d) other than its filter (%d, %d); expected windows "
                                 "that tile the output" % (ctx.where(), op.custom_code, sh, sw, fh, fw))
    n, h, w, c = ctx.shape(x)
    if tuple(ctx.shape(i)) != (n, h, w, c):
        raise UnsupportedOpError("%s: %s indices of shape %s for values of shape %s"
                                 % (ctx.where(), op.custom_code, list(ctx.shape(i)), [n, h, w, c]))
    oh, ow = h * fh, w * fw
    # Windows that tile the output (no padding then): output (y, x) belongs to window (y // fh, x // fw) alone
    # and holds its value where that window's maximum sat at (y % fh, x % fw), zero elsewhere.
    rows = ctx.add_const(np.arange(oh, dtype=np.int64) // fh, "window_rows")
    cols = ctx.add_const(np.arange(ow, dtype=np.int64) // fw, "window_cols")

    def spread(value: str) -> str:
        return ctx.emit1("Gather", [ctx.emit1("Gather", [value, rows], axis=2), cols], axis=3)

    position = (np.arange(oh) % fh)[:, None] * fw + (np.arange(ow) % fw)[None, :]
    here = ctx.emit1("Equal", [ctx.emit1("Floor", [spread(ctx.nchw(i))]),
                               ctx.add_const(position.astype(np.float32).reshape(1, 1, oh, ow), "window_position")])
    y = ctx.emit1("Where", [here, spread(ctx.nchw(x)), ctx.add_const(np.array(0.0, np.float32), "zero")])
    ctx.set_output(op.outputs[0], y, NCHW)


__all__ = ["CONVERTERS", "TRANSPOSE_CONV_BIAS", "ARGMAX_POOL", "UNPOOL", "transpose_conv_params", "pool_params"]
