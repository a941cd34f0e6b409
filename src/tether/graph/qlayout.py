"""The channels-last int8 depthwise graph op ``qdepthwise2d_nhwc`` (issue 12), written by
graph/passes/int8_layout.py for the depthwise convs between int8 kernels that keep their activations channels last.

``qdepthwise2d_nhwc(x, w, bias) {strides, pads, pad_value}``: x (1, H, W, C) uint8/int8, w (KH, KW, C) and bias
(C,) float32 holding integers -> (1, OH, OW, C) float32, ``bias[c] + sum_taps (x - pad_value) * w`` read as
``pad_value`` outside the image: graph/qconv.py's qdepthwise2d with the channel axis last (ops/qdepthwise_nhwc.py).
Importing this module registers the op (``graph.ops``) and its lowering (``graph.to_te``).
"""
from __future__ import annotations

import numpy as np

from tether.graph import ops, to_te
from tether.graph import qconv  # noqa: F401  (registers qdepthwise2d, whose shape rule and reference this reuses)
from tether.graph.ir import TensorType
from tether.ops.qdepthwise_nhwc import qdepthwise2d_nhwc

_NCHW = (0, 3, 1, 2)
_NHWC = (0, 2, 3, 1)


def _infer(attrs, x, w, bias):
    nchw = TensorType(tuple(x.shape[i] for i in _NCHW), x.dtype)
    weight = TensorType((w.shape[2], w.shape[0], w.shape[1]), "float32")
    (t,) = ops.OPS["qdepthwise2d"].infer(attrs, nchw, weight, bias)
    return [TensorType(tuple(t.shape[i] for i in _NHWC), "float32")]


def _ref(attrs, x, w, bias):
    (acc,) = ops.OPS["qdepthwise2d"].ref(attrs, np.ascontiguousarray(x.transpose(_NCHW)),
                                         np.ascontiguousarray(w.transpose(2, 0, 1)), bias)
    return [np.ascontiguousarray(acc.transpose(_NHWC))]


ops._register("qdepthwise2d_nhwc", "complex", _infer, _ref)
to_te.LOWER["qdepthwise2d_nhwc"] = lambda attrs, x, w, bias: qdepthwise2d_nhwc(
    x, w, bias, tuple(attrs["strides"]), tuple(attrs["pads"]), attrs["pad_value"])
