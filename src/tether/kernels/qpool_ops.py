"""``qavg_pool``: onnxruntime's QLinearAveragePool over a dequantized input, the integer kernel a QDQ
``DequantizeLinear -> AveragePool -> QuantizeLinear`` group runs as (graph/passes/quantize.py).

``qavg_pool(f) {kernel, strides, pads, count_include_pad, dtype, sy, zy}`` over the float ``f = dequantize(x)``
(2-D, NCHW, no dilation, no ceil_mode), as contrib_ops/cpu/quantization/qlinear_pool.cc computes it:

- the window's dequantized values summed in float32 in row-major order, the taps in the padding left out;
- the sum divided (not multiplied by a reciprocal) by the window's count: the taps inside the input, or the
  kernel's size with ``count_include_pad``;
- ``clamp(nearbyint(y / sy + zy), lo, hi)``: the zero point is added before rounding (unlike QuantizeLinear's
  ``round(y / sy) + zy``, which differs on ties when ``zy`` is odd).

``DEFINITIONS`` (shape/dtype rule, numpy reference) and ``CPU_STRATEGIES`` (its lowering) hold it for
``tether.kernels.table``.
"""
from __future__ import annotations

from typing import Dict

import numpy as np

from tether import te
from tether.graph.ir import TensorType
from tether.kernels.registry import OpDef, Strategy, TeLowering
from tether.ops import common as c
from tether.ops.pooling import window_setup
from tether.ops.qnn import RANGES, round_half_even


def _geometry(attrs, h: int, w: int):
    (kh, kw), (sh, sw), p = attrs["kernel"], attrs["strides"], attrs["pads"]
    oh = (h + p[0] + p[2] - kh) // sh + 1
    ow = (w + p[1] + p[3] - kw) // sw + 1
    return kh, kw, sh, sw, p, oh, ow


def _infer(attrs, f):
    n, ch, h, w = f.shape
    *_, oh, ow = _geometry(attrs, h, w)
    return [TensorType((n, ch, oh, ow), attrs["dtype"])]


def _ref(attrs, f):
    sy, zy = attrs["sy"], attrs["zy"]
    n, ch, h, w = f.shape
    kh, kw, sh, sw, p, oh, ow = _geometry(attrs, h, w)
    lo, hi = RANGES[attrs["dtype"]]
    f32 = np.float32
    y = np.zeros((n, ch, oh, ow), f32)
    for i in range(oh):
        h0 = i * sh - p[0]
        for j in range(ow):
            w0 = j * sw - p[1]
            acc = np.zeros((n, ch), f32)
            for r in range(max(h0, 0), min(h0 + kh, h)):
                for q in range(max(w0, 0), min(w0 + kw, w)):
                    acc = (acc + f[:, :, r, q]).astype(f32)
            cnt = kh * kw if attrs["count_include_pad"] else \
                (min(h0 + kh, h) - max(h0, 0)) * (min(w0 + kw, w) - max(w0, 0))
            y[:, :, i, j] = acc / f32(cnt)
    v = np.rint((y / f32(sy) + f32(zy)).astype(f32))
    return [np.clip(v, lo, hi).astype(attrs["dtype"])]


def _lower(attrs, f):
    n, ch, h, w = c.shape_of(f)
    kh, kw, sh, sw, p, oh, ow = _geometry(attrs, h, w)
    read, g = window_setup(f, (kh, kw), (sh, sw), tuple(p), 1, False, 0.0, "qavg_pool")
    ry = te.reduce_axis((0, kh), name="ry")
    rx = te.reduce_axis((0, kw), name="rx")
    win = c.compute((n, ch, oh, ow), lambda b, o, y, x: te.sum(read(b, o, y * sh + ry, x, rx), axis=[ry, rx]),
                    "qavg_pool_sum", c.POOL)
    lo, hi = RANGES[attrs["dtype"]]

    def count(i, k: int, s: int, pad: int, size: int):
        start = i * s - pad
        return te.min(start + k, c.const(size, "int32")) - te.max(start, c.const(0, "int32"))

    def out(b, o, y, x):
        if attrs["count_include_pad"]:
            cnt = c.const(float(kh * kw), "float32")
        else:
            cnt = (count(y, kh, sh, p[0], h) * count(x, kw, sw, p[1], w)).astype("float32")
        v = round_half_even(win[b, o, y, x] / cnt / c.const(attrs["sy"], "float32")
                            + c.const(float(attrs["zy"]), "float32"))
        v = c.min2(c.max2(v, c.const(float(lo), "float32")), c.const(float(hi), "float32"))
        return v.astype("int32").astype(attrs["dtype"])
    return c.compute((n, ch, oh, ow), out, "qavg_pool", c.BROADCAST)


DEFINITIONS: Dict[str, OpDef] = {"qavg_pool": OpDef("qavg_pool", "complex", _infer, _ref)}
CPU_STRATEGIES: Dict[str, Strategy] = {"qavg_pool": TeLowering(_lower)}
