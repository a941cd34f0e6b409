"""Converters of ONNX nodes that read a data-dependent value (the output of a NonZero, Compress, Unique, ...,
whose shape is known only at run time): the post-processing real exported models do with such values (boolean
indexing is NonZero -> Transpose -> GatherND, then Cast, Slice, Concat, arithmetic, Where ...). Each becomes a
numpy node (kernels/dynamic_op.py, run by tether_rpc/dynamic_ops.py) whose outputs are data-dependent too, with a
bound for a type. ``convert_node`` consults this table (``ON_DYNAMIC``) only for a node that reads such a value;
the ordinary converters handle the same ops on static values. Every axis, shape and index list must be a constant."""
from __future__ import annotations

from typing import Dict, List, Optional

import numpy as np

from tether.errors import UnsupportedOpError
from tether.frontend.onnx.importer import (FLOATS, KERNEL_DTYPES, ONNX_DTYPES, ConverterTable, Importer,
                                           node_output, no_legacy_broadcast, norm_axis)

# not a family of the merged table (converters.py): the same ops convert there for static values, and
# convert_node consults this one only for a node reading a data-dependent value
ON_DYNAMIC = ConverterTable(__name__ + " (nodes reading data-dependent values)")

_FLOATS = FLOATS + ("float16", "bfloat16")
_SIGNED = _FLOATS + ("int8", "int16", "int32", "int64")
_NUMERIC = KERNEL_DTYPES[1:]            # all but bool


def _dtype(im: Importer, node, value: str, allowed=KERNEL_DTYPES) -> str:
    dt = str(im.types[value].dtype)        # .types: the bound's dtype is the value's
    if dt not in allowed:
        raise UnsupportedOpError("node %s: %s of a data-dependent %s tensor (tether implements %s)"
                                 % (node.name, node.op_type, dt, ", ".join(allowed)))
    return dt


def _rank(im: Importer, value: str) -> int:
    return len(im.types[value].shape)


def _out(node) -> Optional[List[str]]:
    return node_output(node)


def _ints(im: Importer, node, value: str, what: str) -> List[int]:
    return [int(v) for v in im.require_const(value, "%s %s" % (node.op_type, what), node.name).reshape(-1)]


def _axes(im: Importer, node, ins: List[str], a: dict, as_input: bool) -> Optional[List[int]]:
    if not as_input:
        return list(a["axes"]) if "axes" in a else None
    return _ints(im, node, ins[1], "axes") if len(ins) > 1 and ins[1] else None


# ------------------------------------------------------------------------------------------ casts and layout
@ON_DYNAMIC.register("Identity")
def _identity(im, node, ins, a):
    dt = _dtype(im, node, ins[0])
    im.emit("dyn_cast", ins[:1], {"from": dt, "to": dt}, node.name, _out(node))


@ON_DYNAMIC.register("Cast")
def _cast(im, node, ins, a):
    src = _dtype(im, node, ins[0])
    to = ONNX_DTYPES.get(a["to"], "elem_type_%d" % a["to"])
    if to not in KERNEL_DTYPES:
        raise UnsupportedOpError("node %s: Cast to %s (tether casts between %s)" % (node.name, to,
                                                                                 ", ".join(KERNEL_DTYPES)))
    im.emit("dyn_cast", ins[:1], {"from": src, "to": to}, node.name, _out(node))


@ON_DYNAMIC.register("Transpose")
def _transpose(im, node, ins, a):
    nd = _rank(im, ins[0])
    perm = [norm_axis(int(p), nd) for p in a.get("perm", list(range(nd))[::-1])]
    if sorted(perm) != list(range(nd)):
        raise UnsupportedOpError("node %s: Transpose perm %s of a rank-%d tensor" % (node.name, perm, nd))
    im.emit("dyn_transpose", ins[:1], {"perm": perm}, node.name, _out(node))


@ON_DYNAMIC.register("Reshape")
def _reshape(im, node, ins, a):
    shape = _ints(im, node, ins[1], "shape") if im.opset >= 5 else [int(d) for d in a["shape"]]
    if a.get("allowzero", 0) and 0 in shape:
        raise UnsupportedOpError("node %s: Reshape with allowzero=1 of a data-dependent value" % node.name)
    if shape.count(-1) > 1 or any(d < -1 for d in shape):
        raise UnsupportedOpError("node %s: Reshape to %s (one -1 at most, no other negative)" % (node.name, shape))
    im.emit("dyn_reshape", ins[:1], {"mode": "reshape", "shape": shape}, node.name, _out(node))


@ON_DYNAMIC.register("Flatten")
def _flatten(im, node, ins, a):
    axis = norm_axis(int(a.get("axis", 1)), _rank(im, ins[0]))
    im.emit("dyn_reshape", ins[:1], {"mode": "flatten", "axis": axis}, node.name, _out(node))


@ON_DYNAMIC.register("Squeeze")
def _squeeze(im, node, ins, a):
    axes = _axes(im, node, ins, a, im.opset >= 13)
    if axes is None:
        # which extents are 1 is known only at run time, and so would be the rank
        raise UnsupportedOpError("node %s: Squeeze of a data-dependent value needs constant axes" % node.name)
    nd = _rank(im, ins[0])
    im.emit("dyn_reshape", ins[:1], {"mode": "squeeze", "axes": sorted({norm_axis(x, nd) for x in axes})},
            node.name, _out(node))


@ON_DYNAMIC.register("Unsqueeze")
def _unsqueeze(im, node, ins, a):
    axes = _axes(im, node, ins, a, im.opset >= 13) or []
    nd = _rank(im, ins[0]) + len(axes)
    im.emit("dyn_reshape", ins[:1], {"mode": "unsqueeze", "axes": sorted({norm_axis(x, nd) for x in axes})},
            node.name, _out(node))


@ON_DYNAMIC.register("Slice")
def _slice(im, node, ins, a):
    nd = _rank(im, ins[0])
    if im.opset < 10:
        starts, ends = [int(v) for v in a["starts"]], [int(v) for v in a["ends"]]
        axes = [int(v) for v in a.get("axes", range(len(starts)))]
        steps = [1] * len(starts)
    else:
        starts, ends = _ints(im, node, ins[1], "starts"), _ints(im, node, ins[2], "ends")
        axes = _ints(im, node, ins[3], "axes") if len(ins) > 3 and ins[3] else list(range(len(starts)))
        steps = _ints(im, node, ins[4], "steps") if len(ins) > 4 and ins[4] else [1] * len(starts)
    if 0 in steps:
        raise UnsupportedOpError("node %s: Slice with a step of 0" % node.name)
    im.emit("dyn_slice", ins[:1], {"starts": starts, "ends": ends, "axes": [norm_axis(x, nd) for x in axes],
                                   "steps": steps}, node.name, _out(node))


@ON_DYNAMIC.register("Concat")
def _concat(im, node, ins, a):
    parts = [i for i in ins if i]
    nd = _rank(im, parts[0])
    dts = {_dtype(im, node, p) for p in parts}
    if len(dts) > 1 or any(_rank(im, p) != nd for p in parts):
        raise UnsupportedOpError("node %s: Concat of tensors of different ranks or dtypes" % node.name)
    im.emit("dyn_concat", parts, {"axis": norm_axis(int(a["axis"]), nd)}, node.name, _out(node))


@ON_DYNAMIC.register("Shape")
def _shape(im, node, ins, a):
    nd = _rank(im, ins[0])
    start, end = int(a.get("start", 0)), int(a.get("end", nd))
    start, end = [min(max(v + nd if v < 0 else v, 0), nd) for v in (start, end)]
    im.emit("dyn_shape", ins[:1], {"start": start, "end": max(start, end)}, node.name, _out(node))


@ON_DYNAMIC.register("Size")
def _size(im, node, ins, a):
    im.emit("dyn_shape", ins[:1], {"size": 1}, node.name, _out(node))


# ------------------------------------------------------------------------------------------ indexing
@ON_DYNAMIC.register("Gather")
def _gather(im, node, ins, a):
    _dtype(im, node, ins[1], ("int32", "int64"))
    axis = norm_axis(int(a.get("axis", 0)), _rank(im, ins[0]))
    im.emit("dyn_gather", ins[:2], {"axis": axis}, node.name, _out(node))


@ON_DYNAMIC.register("GatherND")
def _gather_nd(im, node, ins, a):
    _dtype(im, node, ins[1], ("int64",))
    if int(a.get("batch_dims", 0)):
        raise UnsupportedOpError("node %s: GatherND with batch_dims=%d on a data-dependent value (0)"
                                 % (node.name, a["batch_dims"]))
    idx = im.types[ins[1]].shape
    if not idx or idx[-1] > _rank(im, ins[0]):
        raise UnsupportedOpError("node %s: GatherND indices of shape %s into a rank-%d tensor"
                                 % (node.name, idx, _rank(im, ins[0])))
    im.emit("dyn_gather_nd", ins[:2], {}, node.name, _out(node))


@ON_DYNAMIC.register("Where")
def _where(im, node, ins, a):
    _dtype(im, node, ins[0], ("bool",))
    if _dtype(im, node, ins[1]) != _dtype(im, node, ins[2]):
        raise UnsupportedOpError("node %s: Where of %s and %s values" % (node.name, im.types[ins[1]].dtype,
                                                                          im.types[ins[2]].dtype))
    im.emit("dyn_where", ins[:3], {}, node.name, _out(node))


@ON_DYNAMIC.register("TopK")
def _topk(im, node, ins, a):
    # the run-time-k numpy op: its bound (the input's) holds any k the real axis allows; a k beyond the real axis
    # is a run-time error, as in onnxruntime
    _dtype(im, node, ins[0], _NUMERIC)
    k = ins[1] if im.opset >= 10 else im.add_const(np.array([int(a["k"])], np.int64))
    axis = norm_axis(int(a.get("axis", -1)), _rank(im, ins[0]))
    im.emit("topk", [ins[0], k], {"axis": axis, "largest": int(a.get("largest", 1))}, node.name,
            [o if o else im.fresh(node.name + "_unused") for o in (list(node.output) + ["", ""])[:2]])


# ------------------------------------------------------------------------------------------ elementwise
_BINARY: Dict[str, tuple] = {
    "Add": ("add", _NUMERIC), "Sub": ("sub", _NUMERIC), "Mul": ("mul", _NUMERIC), "Div": ("div", _NUMERIC),
    "Max": ("max", _NUMERIC), "Min": ("min", _NUMERIC), "Equal": ("equal", KERNEL_DTYPES),
    "Greater": ("greater", _NUMERIC), "GreaterOrEqual": ("greater_equal", _NUMERIC), "Less": ("less", _NUMERIC),
    "LessOrEqual": ("less_equal", _NUMERIC), "And": ("and", ("bool",)), "Or": ("or", ("bool",)),
    "Xor": ("xor", ("bool",)),
}


def _binary(im, node, ins, a):
    no_legacy_broadcast(node, a)
    op, allowed = _BINARY[node.op_type]
    parts = [i for i in ins if i]
    if node.op_type in ("Max", "Min") and len(parts) != 2:
        raise UnsupportedOpError("node %s: %s of %d data-dependent inputs (2)" % (node.name, node.op_type,
                                                                                 len(parts)))
    dt = _dtype(im, node, parts[0], allowed)
    if _dtype(im, node, parts[1], allowed) != dt:
        raise UnsupportedOpError("node %s: %s of %s and %s" % (node.name, node.op_type, dt,
                                                              im.types[parts[1]].dtype))
    im.emit("dyn_binary", parts[:2], {"op": op, "dtype": dt}, node.name, _out(node))


ON_DYNAMIC.register(*_BINARY)(_binary)

_UNARY: Dict[str, tuple] = {
    "Neg": ("neg", _SIGNED), "Abs": ("abs", _NUMERIC), "Not": ("not", ("bool",)), "Sqrt": ("sqrt", _FLOATS),
    "Exp": ("exp", _FLOATS), "Log": ("log", _FLOATS), "Sigmoid": ("sigmoid", _FLOATS), "Relu": ("relu", _SIGNED),
    "Floor": ("floor", _FLOATS), "Ceil": ("ceil", _FLOATS),
}


def _unary(im, node, ins, a):
    op, allowed = _UNARY[node.op_type]
    dt = _dtype(im, node, ins[0], allowed)
    im.emit("dyn_unary", ins[:1], {"op": op, "dtype": dt}, node.name, _out(node))


ON_DYNAMIC.register(*_UNARY)(_unary)


# ------------------------------------------------------------------------------------------ reductions
_REDUCE = {"ReduceMax": "max", "ReduceMin": "min", "ReduceSum": "sum", "ReduceMean": "mean"}


def _reduce(im, node, ins, a):
    op = _REDUCE[node.op_type]
    dt = _dtype(im, node, ins[0], _FLOATS if op == "mean" else _NUMERIC)
    nd = _rank(im, ins[0])
    as_input = im.opset >= (13 if node.op_type == "ReduceSum" else 18)
    axes = _axes(im, node, ins, a, as_input)
    if not axes:
        if as_input and a.get("noop_with_empty_axes", 0):
            im.emit("dyn_cast", ins[:1], {"from": dt, "to": dt}, node.name, _out(node))
            return
        axes = list(range(nd))
    attrs = {"op": op, "axes": sorted({norm_axis(int(x), nd) for x in axes}), "keepdims": int(a.get("keepdims", 1)),
             "dtype": dt}
    im.emit("dyn_reduce", ins[:1], attrs, node.name, _out(node))


ON_DYNAMIC.register(*_REDUCE)(_reduce)

