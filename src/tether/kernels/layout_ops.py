"""The channels-last float graph op ``depthwise_conv2d_nhwc``, written by graph/passes/float_layout.py for the
depthwise convs between kernels that keep float activations channels last.

``depthwise_conv2d_nhwc(x, w, bias) {strides, pads}``: x (1, H, W, C) float32, w (KH, KW, C), bias (C,) ->
(1, OH, OW, C), ``bias[c] + sum_taps x * w`` with zeros outside the image: core's grouped conv2d (one filter per
channel, no dilation) with the channel axis last (ops/qdepthwise_nhwc.py ``depthwise2d_nhwc``).
``DEFINITIONS`` and ``CPU_STRATEGIES`` hold the op and its lowering for ``tether.kernels.table``.
"""
from __future__ import annotations

from typing import Dict

import numpy as np

from tether.graph.ir import TensorType
from tether.kernels.core import DEFINITIONS as CORE
from tether.kernels.registry import OpDef, Strategy, TeLowering
from tether.ops.qdepthwise_nhwc import depthwise2d_nhwc

_NCHW = (0, 3, 1, 2)
_NHWC = (0, 2, 3, 1)


def _conv_attrs(attrs, channels: int) -> dict:
    return {"strides": list(attrs["strides"]), "pads": list(attrs["pads"]), "dilations": [1, 1],
            "groups": channels}


def _infer(attrs, x, w, bias):
    if len(x.shape) != 4 or len(w.shape) != 3 or w.shape[2] != x.shape[3] or tuple(bias.shape) != (x.shape[3],):
        raise ValueError("depthwise_conv2d_nhwc: expected x (1, H, W, C), w (KH, KW, C) and bias (C,), got %s, %s, %s"
                         % (x.shape, w.shape, bias.shape))
    nchw = TensorType(tuple(x.shape[i] for i in _NCHW), x.dtype)
    weight = TensorType((w.shape[2], 1, w.shape[0], w.shape[1]), w.dtype)
    (t,) = CORE["conv2d"].infer(_conv_attrs(attrs, x.shape[3]), nchw, weight)
    return [TensorType(tuple(t.shape[i] for i in _NHWC), x.dtype)]


def _ref(attrs, x, w, bias):
    weight = np.ascontiguousarray(w.transpose(2, 0, 1)[:, None])
    (y,) = CORE["conv2d"].ref(_conv_attrs(attrs, x.shape[3]), np.ascontiguousarray(x.transpose(_NCHW)), weight)
    return [np.ascontiguousarray((y.transpose(_NHWC) + bias).astype(x.dtype))]


DEFINITIONS: Dict[str, OpDef] = {"depthwise_conv2d_nhwc": OpDef("depthwise_conv2d_nhwc", "complex", _infer, _ref)}

CPU_STRATEGIES: Dict[str, Strategy] = {
    "depthwise_conv2d_nhwc": TeLowering(lambda attrs, x, w, bias: depthwise2d_nhwc(
        x, w, bias, tuple(attrs["strides"]), tuple(attrs["pads"]))),
}
