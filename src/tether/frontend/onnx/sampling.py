"""Converters of the ONNX spatial sampling ops: AffineGrid (a batched matmul of theta with a constant grid of
normalised coordinates), GridSample (ops/grid_sample.py) and DeformConv (ops/deform_conv.py)."""
from __future__ import annotations

import numpy as np

from tether.errors import UnsupportedOpError
from tether.frontend.onnx.importer import FLOATS, ConverterTable, emit_reshape, require_dtype, str_attr

CONVERTERS = ConverterTable(__name__)


def base_grid(sizes, align_corners: bool) -> np.ndarray:
    """(prod(sizes), nd + 1): each position's normalised coordinates, fastest axis first (x, y[, z]), then 1."""
    axes = []
    for n in sizes:
        i = np.arange(n, dtype=np.float64)
        axes.append(-1 + i * (2.0 / (n - 1)) if align_corners and n > 1 else
                    (np.full(n, -1.0) if align_corners else -1 + (2 * i + 1) / n))
    mesh = np.meshgrid(*axes, indexing="ij")
    cols = [m.reshape(-1) for m in reversed(mesh)] + [np.ones(int(np.prod(sizes)))]
    return np.stack(cols, axis=1)


@CONVERTERS.register("AffineGrid")
def _affine_grid(im, node, ins, a):
    dt = require_dtype(im, node, ins[0], FLOATS)
    size = [int(v) for v in im.require_const(ins[1], "AffineGrid size", node.name).reshape(-1)]
    theta = im.type(ins[0]).shape
    nd = len(size) - 2
    if nd not in (2, 3) or tuple(theta) != (size[0], nd, nd + 1) or min(size) < 1:
        raise UnsupportedOpError("node %s: AffineGrid theta %s for size %s" % (node.name, theta, size))
    spatial = size[2:]
    grid = base_grid(spatial, bool(int(a.get("align_corners", 0)))).T.astype(dt)     # (nd + 1, P)
    tiled = im.add_const(np.ascontiguousarray(np.broadcast_to(grid, (size[0],) + grid.shape)), node.name + "_grid")
    y = im.emit("batch_matmul", [ins[0], tiled], {}, node.name + "_matmul")            # (N, nd, P)
    y = im.emit("transpose", [y], {"axes": [0, 2, 1]}, node.name + "_transpose")
    emit_reshape(im, y, [size[0]] + spatial + [nd], node.name + "_shape", node.output[0])


_MODE_NAMES = {"bilinear": "linear", "linear": "linear", "nearest": "nearest", "bicubic": "cubic", "cubic": "cubic"}


@CONVERTERS.register("GridSample")
def _grid_sample(im, node, ins, a):
    dt = require_dtype(im, node, ins[0], FLOATS)
    require_dtype(im, node, ins[1], (dt,))
    xt, gt = im.type(ins[0]), im.type(ins[1])
    nd = len(xt.shape) - 2
    default = "bilinear" if im.opset < 20 else "linear"
    mode = _MODE_NAMES.get(str_attr(a, "mode", default))
    padding = str_attr(a, "padding_mode", "zeros")
    if mode is None or padding not in ("zeros", "border", "reflection"):
        raise UnsupportedOpError("node %s: GridSample mode %r, padding_mode %r" % (node.name, a.get("mode"),
                                                                                   padding))
    if nd not in (2, 3) or (mode == "cubic" and nd != 2) or len(gt.shape) != nd + 2 or gt.shape[-1] != nd \
            or gt.shape[0] != xt.shape[0]:
        raise UnsupportedOpError("node %s: GridSample %s of X %s with a grid %s (2-D or 3-D; cubic 2-D only)"
                                 % (node.name, mode, xt.shape, gt.shape))
    im.emit("grid_sample", ins[:2], {"mode": mode, "padding_mode": padding,
                                     "align_corners": int(a.get("align_corners", 0))}, node.name, [node.output[0]])


@CONVERTERS.register("DeformConv")
def _deform_conv(im, node, ins, a):
    dt = require_dtype(im, node, ins[0], FLOATS)
    for v in ins[1:]:
        if v:
            require_dtype(im, node, v, (dt,))
    xt, wt, ot = im.type(ins[0]), im.type(ins[1]), im.type(ins[2])
    if len(xt.shape) != 4:
        raise UnsupportedOpError("node %s: DeformConv of a rank-%d input (2-D only)" % (node.name, len(xt.shape)))
    kh, kw = list(a.get("kernel_shape", wt.shape[2:]))
    s = list(a.get("strides", [1, 1]))
    p = list(a.get("pads", [0, 0, 0, 0]))
    d = list(a.get("dilations", [1, 1]))
    group, og = int(a.get("group", 1)), int(a.get("offset_group", 1))
    oh = (xt.shape[2] + p[0] + p[2] - (kh - 1) * d[0] - 1) // s[0] + 1
    ow = (xt.shape[3] + p[1] + p[3] - (kw - 1) * d[1] - 1) // s[1] + 1
    if (kh, kw) != tuple(wt.shape[2:]) or tuple(ot.shape) != (xt.shape[0], og * 2 * kh * kw, oh, ow) \
            or xt.shape[1] != wt.shape[1] * group or xt.shape[1] % og or wt.shape[0] % group:
        raise UnsupportedOpError("node %s: DeformConv X %s, W %s, offset %s (group %d, offset_group %d)"
                                 % (node.name, xt.shape, wt.shape, ot.shape, group, og))
    inputs = list(ins[:3])
    attrs = {"strides": s, "pads": p, "dilations": d, "group": group, "offset_group": og, "mask_at": 0,
             "bias_at": 0}
    if len(ins) > 4 and ins[4]:
        attrs["mask_at"] = len(inputs)
        inputs.append(emit_reshape(im, ins[4], (xt.shape[0], og * kh * kw, oh, ow), node.name + "_mask"))
    if len(ins) > 3 and ins[3]:
        attrs["bias_at"] = len(inputs)
        inputs.append(emit_reshape(im, ins[3], (wt.shape[0],), node.name + "_bias"))
    im.emit("deform_conv2d", inputs, attrs, node.name, [node.output[0]])
