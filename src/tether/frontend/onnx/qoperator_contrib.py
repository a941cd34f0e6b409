"""More com.microsoft ops of quantize_static's QOperator form (issue 12): QLinearLeakyRelu, QLinearAveragePool
and QLinearWhere, as onnxruntime's CPU kernels compute them (contrib_ops/cpu/quantization):

- QLinearLeakyRelu: onnxruntime's 256-entry table is ``Q(leaky_relu(DQ(v)))``, which tether computes as that
  chain (the same arithmetic for every element);
- QLinearAveragePool: the graph's ``qavg_pool`` over ``DQ(x)`` (graph/qpool.py: float window sum, divided by the
  count, ``nearbyint(y / sy + zy)``); 2-D NCHW without ceil_mode or dilations, ``auto_pad`` NOTSET;
- QLinearWhere: X and Y each requantized to Z's scale and zero point (``Q(DQ(v))``, onnxruntime's tables), then
  the select.

Refused with an ``UnsupportedOpError``: per-channel scales or zero points, channels_last, other pooling options.
QLinearSoftmax stays refused: its integer kernel sums a float table in an order tether's kernels do not promise.
"""
from __future__ import annotations

from tether.errors import UnsupportedOpError
from tether.frontend.onnx.importer import CONVERTERS, node_output
from tether.frontend.onnx.quantized import PRODUCT_DTYPES, _dtype
from tether.frontend.onnx.quantized_contrib import MS, _dequant, _requant_float, _scalar, _zp
from tether.graph import qpool  # noqa: F401  (registers qavg_pool)


def _qlinear_leaky_relu(im, node, ins, a):
    X, sx, zx, sy = ins[:4]
    zy = ins[4] if len(ins) > 4 and ins[4] else None
    v = im.emit("leaky_relu", [_dequant(im, node, X, sx, zx)], {"alpha": float(a.get("alpha", 0.01))})
    _requant_float(im, node, v, sy, zy, X)


def _qlinear_average_pool(im, node, ins, a):
    X, sx, zx, sy = ins[:4]
    zy = ins[4] if len(ins) > 4 and ins[4] else None
    dt = _dtype(im, node, X, PRODUCT_DTYPES, "an input")
    shape = im.type(X).shape
    k = [int(v) for v in a.get("kernel_shape", [])]
    auto_pad = a.get("auto_pad", b"NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
    if len(shape) != 4 or len(k) != 2 or int(a.get("channels_last", 0)) or int(a.get("ceil_mode", 0)) or \
            auto_pad not in ("NOTSET", "VALID") or any(int(d) != 1 for d in a.get("dilations", [1, 1])):
        raise UnsupportedOpError("node %s: QLinearAveragePool other than 2-D NCHW with explicit pads, no ceil_mode "
                                 "and no dilations (input %s, kernel %s, auto_pad %s)" % (node.name, shape, k,
                                                                                        auto_pad))
    pads = [int(v) for v in a.get("pads", [0, 0, 0, 0])]
    strides = [int(v) for v in a.get("strides", [1, 1])]
    sy1 = im.const(_scalar(im, node, sy, "scale"))
    zy1 = im.const(_zp(im, node, zy, X))
    if sy1 is None or zy1 is None:
        raise UnsupportedOpError("node %s: QLinearAveragePool with a run-time output scale or zero point"
                                 % node.name)
    f = _dequant(im, node, X, sx, zx)
    im.emit("qavg_pool", [f], {"kernel": k, "strides": strides, "pads": pads,
                               "count_include_pad": int(a.get("count_include_pad", 0)), "dtype": dt,
                               "sy": float(sy1), "zy": int(zy1)}, node.name, node_output(node))


def _qlinear_where(im, node, ins, a):
    cond, X, sx, zx, Y, sy, zy, sz, zz = ins[:9]
    dt = _dtype(im, node, zz, PRODUCT_DTYPES, "an output zero point")
    sz1, zz1 = _scalar(im, node, sz, "scale"), _scalar(im, node, zz, "zero point")
    parts = [im.emit("quantize", [_dequant(im, node, v, s, z), sz1, zz1], {"dtype": dt})
             for v, s, z in ((X, sx, zx), (Y, sy, zy))]
    im.emit("where", [cond] + parts, {}, node.name, node_output(node))


for _op, _fn in {"QLinearLeakyRelu": _qlinear_leaky_relu, "QLinearAveragePool": _qlinear_average_pool,
                 "QLinearWhere": _qlinear_where}.items():
    CONVERTERS[MS + _op] = _fn
