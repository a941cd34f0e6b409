"""Converter of ONNX LpPool: (sum over each window of |x|**p) ** (1/p), from existing graph ops: |x|**p, an average
pool that counts the zero padding (so times the window size it is the window's sum), then the p-th root."""
from __future__ import annotations

import numpy as np

from tether.errors import UnsupportedOpError
from tether.frontend.onnx.importer import FLOATS, ConverterTable, require_dtype
from tether.frontend.onnx.nn import spatial_pads

CONVERTERS = ConverterTable(__name__)


@CONVERTERS.register("LpPool")
def _lp_pool(im, node, ins, a):
    dt = require_dtype(im, node, ins[0], FLOATS)
    xt = im.type(ins[0])
    nd = len(xt.shape) - 2
    p = int(a.get("p", 2))
    if p < 1 or int(a.get("ceil_mode", 0)):
        raise UnsupportedOpError("node %s: LpPool with p=%d, ceil_mode=%d (p >= 1, ceil_mode 0)"
                                 % (node.name, p, int(a.get("ceil_mode", 0))))
    k = list(a["kernel_shape"])
    s = list(a.get("strides", [1] * nd))
    d = list(a.get("dilations", [1] * nd))
    x = ins[0]
    if p == 1:
        t = im.emit("abs", [x], {}, node.name + "_abs")
    elif p == 2:
        t = im.emit("mul", [x, x], {}, node.name + "_square")
    else:
        t = im.emit("pow", [im.emit("abs", [x], {}, node.name + "_abs"), im.add_const(np.array([p], dt))], {},
                    node.name + "_pow")
    avg = im.emit("avg_pool", [t], {"kernel": k, "strides": s, "dilations": d,
                                     "pads": spatial_pads(a, xt.shape[2:], k, s, d), "ceil_mode": 0,
                                     "count_include_pad": 1}, node.name + "_avg")
    total = im.emit("scale_shift", [avg], {"scale": float(np.prod(k)), "shift": 0.0}, node.name + "_sum",
                    [node.output[0]] if p == 1 else None)
    if p == 2:
        im.emit("sqrt", [total], {}, node.name, [node.output[0]])
    elif p > 2:
        im.emit("pow", [total, im.add_const(np.array([1.0 / p], dt))], {}, node.name, [node.output[0]])
