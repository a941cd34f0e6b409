"""More com.microsoft ops of quantize_static's QOperator form: QLinearLeakyRelu, QLinearAveragePool
and QLinearWhere, as onnxruntime's CPU kernels compute them (contrib_ops/cpu/quantization):

- QLinearLeakyRelu: onnxruntime's 256-entry table is ``Q(leaky_relu(DQ(v)))``, which tether computes as that
  chain (the same arithmetic for every element);
- QLinearAveragePool: the graph's ``qavg_pool`` over ``DQ(x)`` (kernels/qpool_ops.py: float window sum, divided by the
  count, ``nearbyint(y / sy + zy)``); 2-D NCHW without ceil_mode or dilations, ``auto_pad`` NOTSET;
- QLinearWhere: X and Y each requantized to Z's scale and zero point (``Q(DQ(v))``, onnxruntime's tables), then
  the select.

- QLinearSoftmax (qlinear_softmax.cc): a 256-entry float table ``T[i] = exp((i - 255 + shift) * sx)`` (built
  in double, ``shift = max(0, log(FLT_MAX / D) - 5) / sx`` keeping the sum finite), read at ``x - max(x) + 255``;
  the row's sum in float32 in order (the row moved last, as onnxruntime transposes it, so the reduce kernel adds
  in order); ``nearbyint(T * floor(1 / sy) / sum) + zy``, saturated. The input zero point cancels. Bit for bit
  with onnxruntime 1.32 in the tests along the last axis; along another, one exact tie was seen rounding the
  other way there (one step).

Refused with an ``UnsupportedOpError``: per-channel scales or zero points, channels_last, other pooling options,
run-time scales where a table needs them.
"""
from __future__ import annotations

import numpy as np

from tether.errors import UnsupportedOpError
from tether.frontend.onnx.importer import ConverterTable, emit_reshape, node_output, norm_axis
from tether.frontend.onnx.quantized import PRODUCT_DTYPES, check_dtype
from tether.frontend.onnx.quantized_contrib import (MS, dequantize_per_tensor, quantize_per_tensor, scalar_param,
                                                    zero_point_or_zero)

CONVERTERS = ConverterTable(__name__)


def _qlinear_leaky_relu(im, node, ins, a):
    X, sx, zx, sy = ins[:4]
    zy = ins[4] if len(ins) > 4 and ins[4] else None
    v = im.emit("leaky_relu", [dequantize_per_tensor(im, node, X, sx, zx)], {"alpha": float(a.get("alpha", 0.01))})
    quantize_per_tensor(im, node, v, sy, zy, X)


def _qlinear_average_pool(im, node, ins, a):
    X, sx, zx, sy = ins[:4]
    zy = ins[4] if len(ins) > 4 and ins[4] else None
    dt = check_dtype(im, node, X, PRODUCT_DTYPES, "an input")
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
    sy1 = im.const(scalar_param(im, node, sy, "scale"))
    zy1 = im.const(zero_point_or_zero(im, node, zy, X))
    if sy1 is None or zy1 is None:
        raise UnsupportedOpError("node %s: QLinearAveragePool with a run-time output scale or zero point"
                                 % node.name)
    f = dequantize_per_tensor(im, node, X, sx, zx)
    im.emit("qavg_pool", [f], {"kernel": k, "strides": strides, "pads": pads,
                               "count_include_pad": int(a.get("count_include_pad", 0)), "dtype": dt,
                               "sy": float(sy1), "zy": int(zy1)}, node.name, node_output(node))


def _qlinear_where(im, node, ins, a):
    cond, X, sx, zx, Y, sy, zy, sz, zz = ins[:9]
    dt = check_dtype(im, node, zz, PRODUCT_DTYPES, "an output zero point")
    sz1, zz1 = scalar_param(im, node, sz, "scale"), scalar_param(im, node, zz, "zero point")
    parts = [im.emit("quantize", [dequantize_per_tensor(im, node, v, s, z), sz1, zz1], {"dtype": dt})
             for v, s, z in ((X, sx, zx), (Y, sy, zy))]
    im.emit("where", [cond] + parts, {}, node.name, node_output(node))


def _const_scalar(im, node, v: str, what: str) -> float:
    c = im.const(scalar_param(im, node, v, what))
    if c is None:
        raise UnsupportedOpError("node %s: %s with a run-time %s" % (node.name, node.op_type, what))
    return float(c)


def softmax_table(x_scale: float, reduce_len: int) -> np.ndarray:
    """onnxruntime's QlinearBuildLookupTableUint32 for a float table, indexed by ``x - max(x) + 255``."""
    xs = float(np.float32(x_scale))
    shift = max(0.0, float(np.log(np.float32(np.finfo(np.float32).max) / np.float32(reduce_len))) - 5.0) / xs
    i = np.arange(256, dtype=np.float64)
    return np.exp((i - 255.0 + shift) * xs).astype(np.float32)


def _qlinear_softmax(im, node, ins, a):
    X, sx, _zx, sy = ins[:4]
    zy = ins[4] if len(ins) > 4 and ins[4] else None
    dt = check_dtype(im, node, X, PRODUCT_DTYPES, "an input")
    if "opset" not in a:
        raise UnsupportedOpError("node %s: QLinearSoftmax without its opset attribute" % node.name)
    opset = int(a["opset"])
    shape = tuple(im.type(X).shape)
    axis = norm_axis(int(a.get("axis", 1 if opset < 13 else -1)), len(shape))
    x = X
    if opset < 13:      # softmax over the flattened dimensions from axis on
        x = emit_reshape(im, X, (int(np.prod(shape[:axis], dtype=np.int64)),
                                 int(np.prod(shape[axis:], dtype=np.int64))))
        axis = 1
    perm = None
    if axis != len(im.type(x).shape) - 1:     # the row last, as onnxruntime transposes it: the sum runs in order
        perm = list(range(len(im.type(x).shape)))
        perm[axis], perm[-1] = perm[-1], perm[axis]
        x = im.emit("transpose", [x], {"axes": perm})
        axis = len(perm) - 1
    xshape = tuple(im.type(x).shape)
    table = im.add_const(softmax_table(_const_scalar(im, node, sx, "input scale"), xshape[axis]),
                         node.name + "_exp_table")
    ys = np.float32(np.floor(np.float32(1.0) / np.float32(_const_scalar(im, node, sy, "output scale"))))
    red = {"axes": [axis], "keepdims": True}
    x32 = im.emit("cast", [x], {"to": "int32"})
    top = im.emit("reduce", [x32], dict(red, kind="max"))
    idx = im.emit("add", [im.emit("sub", [x32, top]), im.add_const(np.array(255, np.int32))])
    vt = im.emit("gather", [table, idx], {"axis": 0, "shape": list(xshape)})
    vsum = im.emit("reduce", [vt], dict(red, kind="sum"))
    v = im.emit("div", [im.emit("mul", [vt, im.add_const(np.array(ys, np.float32))]), vsum])
    y = im.emit("quantize", [v, im.add_const(np.array(1.0, np.float32)), zero_point_or_zero(im, node, zy, X)],
                {"dtype": dt})
    if perm is not None:
        y = im.emit("transpose", [y], {"axes": perm})
    emit_reshape(im, y, shape, node.name, node.output[0])


for _op, _fn in {"QLinearLeakyRelu": _qlinear_leaky_relu, "QLinearAveragePool": _qlinear_average_pool,
                 "QLinearWhere": _qlinear_where, "QLinearSoftmax": _qlinear_softmax}.items():
    CONVERTERS.add(MS + _op, _fn)
