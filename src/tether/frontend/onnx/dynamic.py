"""Converters of the ONNX ops tether runs as numpy on the device (graph/numpy_nodes.py): NonZero, Compress,
Unique and NonMaxSuppression, whose output shapes depend on the values, and Det. With constant inputs they fold
at import time like any op; otherwise they become numpy nodes, and their data-dependent outputs may only be graph
outputs or feed other numpy nodes."""
from __future__ import annotations

import numpy as np

from tether.errors import UnsupportedOpError
from tether.frontend.onnx.importer import FLOATS, KERNEL_DTYPES, ConverterTable, norm_axis

CONVERTERS = ConverterTable(__name__)


def _dtype(im, node, value: str, allowed) -> str:
    dt = str(im.types[value].dtype)        # .types: the input may itself be data-dependent
    if dt not in allowed:
        raise UnsupportedOpError("node %s: %s on %s tensors (tether implements %s)"
                                 % (node.name, node.op_type, dt, ", ".join(allowed)))
    return dt


def _outputs(im, node, n: int):
    return [node.output[k] if k < len(node.output) and node.output[k] else im.fresh(node.name + "_unused")
            for k in range(n)]


@CONVERTERS.register("NonZero")
def _nonzero(im, node, ins, a):
    _dtype(im, node, ins[0], KERNEL_DTYPES)
    im.emit("nonzero", ins[:1], {}, node.name, _outputs(im, node, 1))


@CONVERTERS.register("Compress")
def _compress(im, node, ins, a):
    _dtype(im, node, ins[0], KERNEL_DTYPES)
    _dtype(im, node, ins[1], ("bool",))
    axis = None
    if "axis" in a:
        axis = norm_axis(int(a["axis"]), len(im.types[ins[0]].shape))
    im.emit("compress", ins[:2], {"axis": axis}, node.name, _outputs(im, node, 1))


@CONVERTERS.register("Unique")
def _unique(im, node, ins, a):
    _dtype(im, node, ins[0], KERNEL_DTYPES)
    axis = None
    if "axis" in a:
        axis = norm_axis(int(a["axis"]), len(im.types[ins[0]].shape))
    im.emit("unique", ins[:1], {"axis": axis, "sorted": int(a.get("sorted", 1))}, node.name,
            _outputs(im, node, 4))


@CONVERTERS.register("NonMaxSuppression")
def _nms(im, node, ins, a):
    _dtype(im, node, ins[0], FLOATS)
    _dtype(im, node, ins[1], FLOATS)
    b, s = im.types[ins[0]].shape, im.types[ins[1]].shape
    if len(b) != 3 or b[2] != 4 or len(s) != 3 or s[0] != b[0] or s[2] != b[1]:
        raise UnsupportedOpError("node %s: NonMaxSuppression boxes %s and scores %s" % (node.name, b, s))
    cpb = int(a.get("center_point_box", 0))
    if cpb not in (0, 1):
        raise UnsupportedOpError("node %s: NonMaxSuppression center_point_box=%d (0 or 1)" % (node.name, cpb))

    def arg(k: int, default, dtype):
        return ins[k] if len(ins) > k and ins[k] else im.add_const(np.array([default], dtype))
    max_out, iou, score = arg(2, 0, np.int64), arg(3, 0.0, np.float32), arg(4, 0.0, np.float32)
    attrs = {"center_point_box": cpb, "has_score_threshold": int(len(ins) > 4 and bool(ins[4]))}
    limit = im.const(max_out)
    if limit is not None and limit.size:
        attrs["max_per_class"] = max(int(limit.reshape(-1)[0]), 0)
    im.emit("non_max_suppression", [ins[0], ins[1], max_out, iou, score], attrs, node.name, _outputs(im, node, 1))


@CONVERTERS.register("Det")
def _det(im, node, ins, a):
    _dtype(im, node, ins[0], FLOATS)
    t = im.types[ins[0]]
    if len(t.shape) < 2 or t.shape[-1] != t.shape[-2]:
        raise UnsupportedOpError("node %s: Det of a %s tensor (square matrices in the last two axes)"
                                 % (node.name, t.shape))
    im.emit("det", ins[:1], {}, node.name, _outputs(im, node, 1))
