"""The channels-last int8 graph ops ``qdepthwise2d_nhwc`` and ``max_pool_nhwc``, written by
graph/passes/int8_layout.py for the depthwise convs and max pools between int8 kernels that keep their activations
channels last.

``qdepthwise2d_nhwc(x, w, bias) {strides, pads, pad_value}``: x (1, H, W, C) uint8/int8, w (KH, KW, C) and bias
(C,) float32 holding integers -> (1, OH, OW, C) float32, ``bias[c] + sum_taps (x - pad_value) * w`` read as
``pad_value`` outside the image: kernels/qconv_ops.py's qdepthwise2d with the channel axis last
(ops/qdepthwise_nhwc.py).
``max_pool_nhwc(x) {kernel, strides, pads}``: 2-D max pooling of x (1, H, W, C) uint8/int8 (no dilation, no
ceil_mode), on the integers (ops/qpool_nhwc.py); float32 too, for graph/passes/float_layout.py.
``DEFINITIONS`` and ``CPU_STRATEGIES`` hold the ops and their lowerings for ``tether.kernels.table``.
"""
from __future__ import annotations

import numpy as np

from typing import Dict

from tether.graph.ir import TensorType
from tether.kernels.core import DEFINITIONS as CORE
from tether.kernels.qconv_ops import DEFINITIONS as QCONV
from tether.kernels.registry import OpDef, Strategy, TeLowering
from tether.ops.qdepthwise_nhwc import qdepthwise2d_nhwc
from tether.ops.qpool_nhwc import max_pool2d_nhwc

_NCHW = (0, 3, 1, 2)
_NHWC = (0, 2, 3, 1)


def _infer(attrs, x, w, bias):
    nchw = TensorType(tuple(x.shape[i] for i in _NCHW), x.dtype)
    weight = TensorType((w.shape[2], w.shape[0], w.shape[1]), "float32")
    (t,) = QCONV["qdepthwise2d"].infer(attrs, nchw, weight, bias)
    return [TensorType(tuple(t.shape[i] for i in _NHWC), "float32")]


def _ref(attrs, x, w, bias):
    (acc,) = QCONV["qdepthwise2d"].ref(attrs, np.ascontiguousarray(x.transpose(_NCHW)),
                                         np.ascontiguousarray(w.transpose(2, 0, 1)), bias)
    return [np.ascontiguousarray(acc.transpose(_NHWC))]


def _pool_attrs(attrs) -> dict:
    return {"kernel": list(attrs["kernel"]), "strides": list(attrs["strides"]), "pads": list(attrs["pads"]),
            "dilations": [1, 1], "ceil_mode": 0}


def _pool_infer(attrs, x):
    (t,) = CORE["max_pool"].infer(_pool_attrs(attrs), TensorType(tuple(x.shape[i] for i in _NCHW), x.dtype))
    return [TensorType(tuple(t.shape[i] for i in _NHWC), x.dtype)]


def _pool_ref(attrs, x):
    (y,) = CORE["max_pool"].ref(_pool_attrs(attrs), np.ascontiguousarray(x.transpose(_NCHW)))
    return [np.ascontiguousarray(y.transpose(_NHWC))]


DEFINITIONS: Dict[str, OpDef] = {d.name: d for d in (OpDef("qdepthwise2d_nhwc", "complex", _infer, _ref),
                                                       OpDef("max_pool_nhwc", "complex", _pool_infer, _pool_ref))}

CPU_STRATEGIES: Dict[str, Strategy] = {
    "qdepthwise2d_nhwc": TeLowering(lambda attrs, x, w, bias: qdepthwise2d_nhwc(
        x, w, bias, tuple(attrs["strides"]), tuple(attrs["pads"]), attrs["pad_value"])),
    "max_pool_nhwc": TeLowering(lambda attrs, x: max_pool2d_nhwc(x, tuple(attrs["kernel"]), tuple(attrs["strides"]),
                                                                 tuple(attrs["pads"]))),
}
