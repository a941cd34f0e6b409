"""Converters of the ONNX reductions: Reduce* and ArgMax/ArgMin."""
from __future__ import annotations

import numpy as np

from tether.errors import UnsupportedOpError
from tether.frontend.onnx.importer import ConverterTable, emit_reshape, node_output, norm_axis

CONVERTERS = ConverterTable(__name__)


_REDUCE_KINDS = {"ReduceSum": "sum", "ReduceMean": "mean", "ReduceMax": "max", "ReduceMin": "min",
                 "ReduceProd": "prod", "ReduceL1": "l1", "ReduceL2": "l2", "ReduceSumSquare": "sum_square",
                 "ReduceLogSum": "log_sum", "ReduceLogSumExp": "log_sum_exp"}
_INT_DTYPES = ("int32", "int64")
_FLOAT_DTYPES = ("float32", "float64")
# kinds whose integer result would need rounding rules (mean) or a float function (sqrt, log): floats only
_FLOAT_ONLY_KINDS = ("mean", "l2", "log_sum", "log_sum_exp")


def _reduce_identity(kind: str, dtype: str):
    """The value a reduction over an empty set yields (ONNX opset 18 'empty set' semantics)."""
    if dtype == "bool":
        lo, hi = False, True
    else:
        lo = -np.inf if dtype in _FLOAT_DTYPES else np.iinfo(dtype).min
        hi = np.inf if dtype in _FLOAT_DTYPES else np.iinfo(dtype).max
    return {"sum": 0, "l1": 0, "l2": 0, "sum_square": 0, "prod": 1, "max": lo, "min": hi,
            "log_sum": -np.inf, "log_sum_exp": -np.inf}[kind]


@CONVERTERS.register(*_REDUCE_KINDS)
def _reduce_conv(im, node, ins, a):
    kind = _REDUCE_KINDS[node.op_type]
    t = im.type(ins[0])
    nd = len(t.shape)
    allowed = _FLOAT_DTYPES if kind in _FLOAT_ONLY_KINDS else _FLOAT_DTYPES + _INT_DTYPES
    if kind in ("max", "min"):
        allowed = allowed + ("bool",)     # any / all (opset 20)
    if t.dtype not in allowed:
        raise UnsupportedOpError("node %s: %s on %s tensors (supported: %s)"
                                 % (node.name, node.op_type, t.dtype, ", ".join(allowed)))
    axes_as_input = im.opset >= (13 if node.op_type == "ReduceSum" else 18)
    if axes_as_input:
        axes = None
        if len(ins) > 1 and ins[1]:
            axes = [int(v) for v in im.require_const(ins[1], node.op_type + " axes", node.name).reshape(-1)]
    else:
        axes = list(a["axes"]) if "axes" in a else None
    keepdims = bool(a.get("keepdims", 1))
    if not axes:
        # absent or empty axes: every axis, or none at all with noop_with_empty_axes
        axes = [] if (axes_as_input and a.get("noop_with_empty_axes", 0)) else list(range(nd))
    axes = sorted({norm_axis(int(x), nd) for x in axes})
    for x in axes:
        if not 0 <= x < nd:
            raise UnsupportedOpError("node %s: %s axis out of range for rank %d" % (node.name, node.op_type, nd))
    out_shape = tuple(1 if i in axes else d for i, d in enumerate(t.shape)) if keepdims else \
        tuple(d for i, d in enumerate(t.shape) if i not in axes)
    if axes and any(t.shape[i] == 0 for i in axes):
        if kind == "mean":
            raise UnsupportedOpError("node %s: ReduceMean over an empty axis (the mean of nothing)" % node.name)
        im.add_const(np.full(out_shape, _reduce_identity(kind, t.dtype), dtype=t.dtype), name=node.output[0])
        return
    if t.size == 0:
        im.add_const(np.zeros(out_shape, dtype=t.dtype), name=node.output[0])
        return
    if kind in ("mean", "max") and nd >= 3 and axes == list(range(2, nd)) and t.dtype == "float32":
        # torch's dynamo exporter writes adaptive average pooling as ReduceMean over the spatial axes: run it
        # as the global-pool kernel (one channel per task, parallel over channels)
        op = "global_avg_pool" if kind == "mean" else "global_max_pool"
        y = im.emit(op, [ins[0]], {}, node.name, node_output(node) if keepdims else None)
        if not keepdims:
            emit_reshape(im, y, out_shape, node.name + "_squeeze", node.output[0])
        return
    if not out_shape:   # kernels never write rank-0 tensors: reduce keeping dims, then reshape to a scalar
        y = im.emit("reduce", [ins[0]], {"kind": kind, "axes": axes, "keepdims": True}, node.name)
        emit_reshape(im, y, (), node.name + "_scalar", node.output[0])
        return
    im.emit("reduce", [ins[0]], {"kind": kind, "axes": axes, "keepdims": keepdims}, node.name, node_output(node))


@CONVERTERS.register("ArgMax", "ArgMin")
def _arg_reduce_conv(im, node, ins, a):
    t = im.type(ins[0])
    nd = len(t.shape)
    if t.dtype not in _FLOAT_DTYPES + _INT_DTYPES:
        raise UnsupportedOpError("node %s: %s on %s tensors" % (node.name, node.op_type, t.dtype))
    axis = norm_axis(int(a.get("axis", 0)), nd)
    if t.shape[axis] == 0:
        raise UnsupportedOpError("node %s: %s over an empty axis" % (node.name, node.op_type))
    keepdims = bool(a.get("keepdims", 1))
    scalar = nd == 1 and not keepdims     # kernels never write rank-0 tensors
    y = im.emit("arg_reduce", [ins[0]], {"kind": "max" if node.op_type == "ArgMax" else "min", "axis": axis,
                                         "keepdims": keepdims or scalar,
                                         "select_last_index": int(a.get("select_last_index", 0))},
                node.name, None if scalar else node_output(node))
    if scalar:
        emit_reshape(im, y, (), node.name + "_scalar", node.output[0])
