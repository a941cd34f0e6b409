"""Converters of the ONNX indexing ops: GatherElements, GatherND, OneHot, Trilu, EyeLike."""
from __future__ import annotations

import numpy as np

from tether.errors import UnsupportedOpError
from tether.frontend.onnx.importer import ONNX_DTYPES, ConverterTable, emit_reshape, node_output, norm_axis

CONVERTERS = ConverterTable(__name__)


_INDEX_DTYPES = ("int32", "int64")


def _check_index_dtype(im, node, name: str) -> None:
    dt = im.type(name).dtype
    if dt not in _INDEX_DTYPES:
        raise UnsupportedOpError("node %s: %s indices of type %s (int32 or int64)" % (node.name, node.op_type, dt))


def gather_general(im, node, ins, a) -> None:
    _check_index_dtype(im, node, ins[1])
    t, it = im.type(ins[0]), im.type(ins[1])
    axis = norm_axis(int(a.get("axis", 0)), len(t.shape))
    shape = tuple(t.shape[:axis]) + tuple(it.shape) + tuple(t.shape[axis + 1:])
    if not shape:     # kernels never write rank-0 tensors
        y = im.emit("gather", [ins[0], emit_reshape(im, ins[1], (1,))], {"axis": axis, "shape": [1]}, node.name)
        emit_reshape(im, y, (), node.name + "_scalar", node.output[0])
        return
    im.emit("gather", [ins[0], ins[1]], {"axis": axis, "shape": list(shape)}, node.name, node_output(node))


@CONVERTERS.register("GatherElements")
def _gather_elements(im, node, ins, a):
    _check_index_dtype(im, node, ins[1])
    axis = norm_axis(int(a.get("axis", 0)), len(im.type(ins[0]).shape))
    im.emit("gather_elements", [ins[0], ins[1]], {"axis": axis}, node.name, node_output(node))


@CONVERTERS.register("GatherND")
def _gather_nd(im, node, ins, a):
    _check_index_dtype(im, node, ins[1])
    t, it = im.type(ins[0]), im.type(ins[1])
    b = int(a.get("batch_dims", 0))
    k = it.shape[-1]
    if b + k > len(t.shape) or tuple(it.shape[:b]) != tuple(t.shape[:b]):
        raise UnsupportedOpError("node %s: GatherND indices %s with batch_dims %d on data %s"
                                 % (node.name, it.shape, b, t.shape))
    shape = tuple(it.shape[:-1]) + tuple(t.shape[b + k:])
    if not shape:
        raise UnsupportedOpError("node %s: GatherND to a scalar" % node.name)
    im.emit("gather_nd", [ins[0], ins[1]], {"batch_dims": b, "shape": list(shape)}, node.name, node_output(node))


@CONVERTERS.register("OneHot")
def _one_hot_conv(im, node, ins, a):
    it = im.type(ins[0])
    if it.dtype not in _INDEX_DTYPES + ("float32",):
        raise UnsupportedOpError("node %s: OneHot indices of type %s" % (node.name, it.dtype))
    depth_v = im.require_const(ins[1], "OneHot depth", node.name).reshape(-1)[0]
    depth = int(depth_v)
    values = ins[2]
    if im.type(values).size != 2:
        raise UnsupportedOpError("node %s: OneHot values must hold [off, on]" % node.name)
    values = emit_reshape(im, values, (2,))
    nd = len(it.shape) + 1
    axis = norm_axis(int(a.get("axis", -1)), nd)
    shape = list(it.shape)
    shape.insert(axis, depth)
    im.emit("one_hot", [ins[0], values], {"depth": depth, "axis": axis, "shape": shape}, node.name, node_output(node))


@CONVERTERS.register("Trilu")
def _trilu_conv(im, node, ins, a):
    t = im.type(ins[0])
    if len(t.shape) < 2:
        raise UnsupportedOpError("node %s: Trilu of a rank-%d tensor" % (node.name, len(t.shape)))
    upper = int(a.get("upper", 1))
    if len(ins) > 1 and ins[1] and im.const(ins[1]) is None:
        # k computed at run time: keep where column - row >= k (upper) or <= k (lower), a mask of a constant grid
        rows, cols = t.shape[-2:]
        diagonal = im.add_const(np.arange(cols, dtype=np.int64)[None, :] - np.arange(rows, dtype=np.int64)[:, None],
                                node.name + "_diagonal")
        k = im.emit("reshape", [ins[1]], {"shape": ()}, node.name + "_k") if im.type(ins[1]).shape else ins[1]
        if im.type(k).dtype != "int64":
            raise UnsupportedOpError("node %s: Trilu k of type %s (int64)" % (node.name, im.type(k).dtype))
        keep = im.emit("greater_equal" if upper else "less_equal", [diagonal, k], {}, node.name + "_keep")
        im.emit("where", [keep, ins[0], im.add_const(np.zeros((), t.dtype), node.name + "_zero")], {}, node.name,
                node_output(node))
        return
    k = int(im.require_const(ins[1], "Trilu k", node.name).reshape(-1)[0]) if len(ins) > 1 and ins[1] else 0
    im.emit("trilu", [ins[0]], {"k": k, "upper": upper}, node.name, node_output(node))


@CONVERTERS.register("EyeLike")
def _eye_like(im, node, ins, a):
    t = im.type(ins[0])
    if len(t.shape) != 2:
        raise UnsupportedOpError("node %s: EyeLike of a rank-%d tensor (2-D only)" % (node.name, len(t.shape)))
    dt = ONNX_DTYPES[a["dtype"]] if "dtype" in a else t.dtype
    im.add_const(np.eye(t.shape[0], t.shape[1], k=int(a.get("k", 0)), dtype=dt), name=node.output[0])
