"""Converters of the ONNX ops that run along one axis: CumSum, CumProd (ops/scan.py) and TopK with a constant k
(ops/topk.py: the positions, then a gather_elements for the values; a run-time k is a numpy node)."""
from __future__ import annotations

from tether.errors import UnsupportedOpError
from tether.frontend.onnx.importer import NUMERIC, ConverterTable, norm_axis, require_dtype

CONVERTERS = ConverterTable(__name__)


def _scalar_int(im, node, value: str, what: str) -> int:
    c = im.require_const(value, "%s %s" % (node.op_type, what), node.name)
    if c.size != 1 or c.dtype.kind not in "iu":
        raise UnsupportedOpError("node %s: %s %s must be one integer, got %s of %s"
                                 % (node.name, node.op_type, what, c.dtype, c.shape))
    return int(c.reshape(-1)[0])


@CONVERTERS.register("CumSum", "CumProd")
def _cumulative(im, node, ins, a):
    require_dtype(im, node, ins[0], NUMERIC)
    t = im.type(ins[0])
    if not t.shape:
        raise UnsupportedOpError("node %s: %s of a scalar" % (node.name, node.op_type))
    axis = _scalar_int(im, node, ins[1], "axis")
    if not -len(t.shape) <= axis < len(t.shape):
        raise UnsupportedOpError("node %s: %s axis %d of a rank-%d tensor" % (node.name, node.op_type, axis,
                                                                              len(t.shape)))
    im.emit("cumulative", ins[:1], {"axis": norm_axis(axis, len(t.shape)),
                                    "kind": "sum" if node.op_type == "CumSum" else "prod",
                                    "exclusive": int(a.get("exclusive", 0)), "reverse": int(a.get("reverse", 0))},
            node.name, [node.output[0]])


@CONVERTERS.register("TopK")
def _topk(im, node, ins, a):
    require_dtype(im, node, ins[0], NUMERIC)
    t = im.type(ins[0])
    axis = norm_axis(int(a.get("axis", -1)), len(t.shape))
    if im.opset >= 10 and im.const(ins[1]) is None:
        # a run-time k: a numpy node on the device (graph/numpy_nodes.py); both outputs are data-dependent
        im.emit("topk", ins[:2], {"axis": axis, "largest": int(a.get("largest", 1))}, node.name,
                [o if o else im.fresh(node.name + "_unused") for o in (list(node.output) + ["", ""])[:2]])
        return
    k = int(a["k"]) if im.opset < 10 else _scalar_int(im, node, ins[1], "K")
    if not t.shape or not 1 <= k <= t.shape[axis]:
        raise UnsupportedOpError("node %s: TopK k=%d along an axis of %s (1 <= k <= the axis; k=0 would be an "
                                 "empty tensor)" % (node.name, k, t.shape[axis] if t.shape else "a scalar"))
    largest = int(a.get("largest", 1))
    outs = list(node.output) + ["", ""]
    idx = im.emit("topk_indices", ins[:1], {"k": k, "axis": axis, "largest": largest}, node.name + "_indices",
                  [outs[1]] if outs[1] else None)
    if outs[0]:
        im.emit("gather_elements", [ins[0], idx], {"axis": axis}, node.name, [outs[0]])
