"""MediaPipe's custom ops that LiteRT's XNNPACK delegate runs itself, so that MediaPipe's models (selfie
segmentation, hair segmentation) run in LiteRT without MediaPipe: ``Convolution2DTransposeBias``.

Its custom options are not a FlexBuffer but the raw ``TfLiteTransposeConvParams`` struct MediaPipe's kernel
casts them to: three little-endian int32s, padding (1 SAME, 2 VALID), stride width, stride height. The kernel
(mediapipe/util/tflite/operations/transpose_conv_bias.cc) sizes its output from the input alone: SAME pads
``max(0, k - (n - 1) % s - 1)`` in all, half of it (rounded down) before, and the output is
``s * (n - 1) + k - pad``, the ONNX ConvTranspose with those pads exactly.
"""
from __future__ import annotations

import struct

from tether.errors import UnsupportedOpError
from tether.frontend.tflite.state import NCHW
from tether.frontend.tflite.table import ConverterTable

CONVERTERS = ConverterTable("tflite mediapipe")

TRANSPOSE_CONV_BIAS = "Convolution2DTransposeBias"
_SAME, _VALID = 1, 2


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
    if ctx.tensor(x).dtype != "float32":
        raise UnsupportedOpError("%s: %s on %s tensors; MediaPipe's kernel takes float32 only"
                                 % (ctx.where(), op.custom_code, ctx.tensor(x).dtype))
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


__all__ = ["CONVERTERS", "TRANSPOSE_CONV_BIAS", "transpose_conv_params"]
