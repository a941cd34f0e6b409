"""The channels-last int8 graph ops ``qdepthwise2d_nhwc`` and ``max_pool_nhwc`` (issue 12), written by
graph/passes/int8_layout.py for the depthwise convs and max pools between int8 kernels that keep their activations
channels last.

``qdepthwise2d_nhwc(x, w, bias) {strides, pads, pad_value}``: x (1, H, W, C) uint8/int8, w (KH, KW, C) and bias
(C,) float32 holding integers -> (1, OH, OW, C) float32, ``bias[c] + sum_taps (x - pad_value) * w`` read as
``pad_value`` outside the image: graph/qconv.py's qdepthwise2d with the channel axis last (ops/qdepthwise_nhwc.py).
``max_pool_nhwc(x) {kernel, strides, pads}``: 2-D max pooling of x (1, H, W, C) uint8/int8 (no dilation, no
ceil_mode), on the integers (ops/qpool_nhwc.py).
Importing this module registers the ops (``graph.ops``) and its lowering (``graph.to_te``).
"""
from __future__ import annotations

import numpy as np

from tether.graph import ops, to_te
from tether.graph import qconv  # noqa: F401  (registers qdepthwise2d, whose shape rule and reference this reuses)
from tether.graph.ir import TensorType
from tether.ops.qdepthwise_nhwc import qdepthwise2d_nhwc
from tether.ops.qpool_nhwc import max_pool2d_nhwc

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


def _pool_attrs(attrs) -> dict:
    return {"kernel": list(attrs["kernel"]), "strides": list(attrs["strides"]), "pads": list(attrs["pads"]),
            "dilations": [1, 1], "ceil_mode": 0}


def _pool_infer(attrs, x):
    (t,) = ops.OPS["max_pool"].infer(_pool_attrs(attrs), TensorType(tuple(x.shape[i] for i in _NCHW), x.dtype))
    return [TensorType(tuple(t.shape[i] for i in _NHWC), x.dtype)]


def _pool_ref(attrs, x):
    (y,) = ops.OPS["max_pool"].ref(_pool_attrs(attrs), np.ascontiguousarray(x.transpose(_NCHW)))
    return [np.ascontiguousarray(y.transpose(_NHWC))]


ops._register("max_pool_nhwc", "complex", _pool_infer, _pool_ref)
to_te.LOWER["max_pool_nhwc"] = lambda attrs, x: max_pool2d_nhwc(x, tuple(attrs["kernel"]), tuple(attrs["strides"]),
                                                                tuple(attrs["pads"]))
