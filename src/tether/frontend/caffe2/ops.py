"""Each Caffe2 operator of a predict net as ONNX nodes, with Caffe2's argument conventions: kernel/kernels/
kernel_h, pads as [top, left, bottom, right], FC and Softmax coercing their input to 2-D at ``axis``, the legacy
``broadcast``/``axis`` of the arithmetic ops, Slice's inclusive negative ends.

Values are tracked with their rank only (Caffe2 files hold no shapes): the net's inputs are 4-D (NCHW images)
unless a shape is given. An op function returns its outputs' (value, rank) list, or None after ``t.refuse``.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from tether.frontend.onnx_builder import OnnxBuilder

Val = Tuple[str, int]           # ONNX value name, rank
INT_MAX = 2 ** 63 - 1


class Translator:
    def __init__(self, name: str, path: str, weights: Dict[str, np.ndarray]) -> None:
        self.b = OnnxBuilder(name, "tether caffe2 frontend")
        self.path = path
        self.weights = weights
        self.refused: List[Tuple[str, str, str]] = []     # (op type, op name or #index, why)

    def refuse(self, op: Any, label: str, why: str = "") -> None:
        self.refused.append((op.type, label, why))


class Args:
    """An OperatorDef's arguments by name."""

    def __init__(self, op: Any) -> None:
        self._args = {a.name: a for a in op.arg}

    def __contains__(self, name: str) -> bool:
        return name in self._args

    def i(self, name: str, default: Optional[int] = None) -> Optional[int]:
        return int(self._args[name].i) if name in self._args else default

    def f(self, name: str, default: Optional[float] = None) -> Optional[float]:
        return float(self._args[name].f) if name in self._args else default

    def s(self, name: str, default: str = "") -> str:
        return self._args[name].s.decode() if name in self._args else default

    def ints(self, name: str) -> Optional[List[int]]:
        return [int(v) for v in self._args[name].ints] if name in self._args else None


def _spatial(a: Args, single: str, plural: str, h: str, w: str, default: int) -> List[int]:
    if plural in a:
        return a.ints(plural)
    if h in a or w in a:
        return [a.i(h, default), a.i(w, default)]
    return [a.i(single, default)] * 2


def _pads(a: Args) -> List[int]:
    """ONNX pads [top, left, bottom, right] from Caffe2's pad, pads (t, l, b, r) or pad_t/pad_l/pad_b/pad_r."""
    if "pads" in a:
        return a.ints("pads")
    if any(k in a for k in ("pad_t", "pad_l", "pad_b", "pad_r")):
        return [a.i("pad_t", 0), a.i("pad_l", 0), a.i("pad_b", 0), a.i("pad_r", 0)]
    return [a.i("pad", 0)] * 4


def _nchw(t: Translator, op: Any, label: str, a: Args) -> bool:
    if a.s("order", "NCHW") != "NCHW":
        t.refuse(op, label, "order %s (tether reads NCHW nets)" % a.s("order"))
        return False
    return True


def _conv(t: Translator, op: Any, label: str, a: Args, ins: List[Val]) -> Optional[List[Val]]:
    if not _nchw(t, op, label, a):
        return None
    transposed = op.type == "ConvTranspose"
    w = t.weights.get(op.input[1])
    kernel = _spatial(a, "kernel", "kernels", "kernel_h", "kernel_w", 0)
    if w is not None and not kernel[0]:
        kernel = list(w.shape[2:])
    attrs = dict(kernel_shape=kernel, strides=_spatial(a, "stride", "strides", "stride_h", "stride_w", 1),
                 pads=_pads(a), group=a.i("group", 1))
    if transposed:
        adj = _spatial(a, "adj", "adjs", "adj_h", "adj_w", 0)
        if any(adj):
            attrs["output_padding"] = adj
    else:
        attrs["dilations"] = _spatial(a, "dilation", "dilations", "dilation_h", "dilation_w", 1)
    y = t.b.node("ConvTranspose" if transposed else "Conv", [v for v, _ in ins], label, **attrs)
    return [(y, 4)]


def _pool(t: Translator, op: Any, label: str, a: Args, ins: List[Val]) -> Optional[List[Val]]:
    if not _nchw(t, op, label, a):
        return None
    is_max = op.type.startswith("MaxPool")
    x = ins[0][0]
    if a.i("global_pooling", 0):
        return [(t.b.node("GlobalMaxPool" if is_max else "GlobalAveragePool", [x], label), 4)]
    legacy = a.i("legacy_pad", 0)
    if legacy not in (0, 1, 2):      # CAFFE_LEGACY_POOLING rounds up as Caffe does
        t.refuse(op, label, "legacy_pad=%d (Caffe's rounding up)" % legacy)
        return None
    attrs: Dict[str, Any] = dict(kernel_shape=_spatial(a, "kernel", "kernels", "kernel_h", "kernel_w", 1),
                                 strides=_spatial(a, "stride", "strides", "stride_h", "stride_w", 1))
    if legacy == 1:
        attrs["auto_pad"] = "VALID"
    elif legacy == 2:
        attrs["auto_pad"] = "SAME_UPPER"
    else:
        attrs["pads"] = _pads(a)
    if not is_max:
        attrs["count_include_pad"] = a.i("count_include_pad", 0)
    return [(t.b.node("MaxPool" if is_max else "AveragePool", [x], label, **attrs), 4)]


def _fc(t: Translator, op: Any, label: str, a: Args, ins: List[Val]) -> Optional[List[Val]]:
    if a.i("axis", 1) != 1 or a.i("axis_w", 1) != 1:
        t.refuse(op, label, "axis=%d axis_w=%d (tether reads 1)" % (a.i("axis", 1), a.i("axis_w", 1)))
        return None
    x, rank = ins[0]
    flat = x if rank == 2 else t.b.node("Flatten", [x], label + "_flat", axis=1)
    args = [flat] + [v for v, _ in ins[1:]]
    return [(t.b.node("Gemm", args, label, transB=0 if op.type == "FCTransposed" else 1), 2)]


def _softmax(t: Translator, op: Any, label: str, a: Args, ins: List[Val]) -> Optional[List[Val]]:
    x, rank = ins[0]
    axis = a.i("axis", 1) % rank
    if axis == rank - 1:
        return [(t.b.node("Softmax", [x], label, axis=-1), rank)]
    # Caffe2 normalises over everything from axis on (the input seen as 2-D), as ONNX did before opset 13
    flat = t.b.node("Flatten", [x], label + "_2d", axis=axis)
    y = t.b.node("Softmax", [flat], label + "_softmax", axis=1)
    return [(t.b.node("Reshape", [y, t.b.node("Shape", [x], label + "_shape")], label), rank)]


def _spatial_bn(t: Translator, op: Any, label: str, a: Args, ins: List[Val]) -> Optional[List[Val]]:
    if not _nchw(t, op, label, a):
        return None
    if not a.i("is_test", 1) and len(op.output) > 1:
        t.refuse(op, label, "training mode (is_test=0)")
        return None
    return [(t.b.node("BatchNormalization", [v for v, _ in ins[:5]], label, epsilon=a.f("epsilon", 1e-5)),
             ins[0][1])]


def _binary(onnx_op: str) -> Callable:
    def convert(t: Translator, op: Any, label: str, a: Args, ins: List[Val]) -> Optional[List[Val]]:
        (x, xr), (y, yr) = ins[0], ins[1]
        axis = a.i("axis", -1)
        if a.i("broadcast", 0) and axis != -1:
            # legacy broadcast: B's dimensions line up with A's from axis on (numpy lines them up at the end)
            axis %= xr
            trailing = xr - axis - yr
            if trailing > 0:
                y = t.b.node("Unsqueeze", [y, t.b.ints(label + "_axes", list(range(yr, yr + trailing)))],
                             label + "_aligned")
        return [(t.b.node(onnx_op, [x, y], label), max(xr, yr))]
    return convert


def _variadic(onnx_op: str) -> Callable:
    def convert(t: Translator, op: Any, label: str, a: Args, ins: List[Val]) -> Optional[List[Val]]:
        return [(t.b.node(onnx_op, [v for v, _ in ins], label), max(r for _, r in ins))]
    return convert


def _unary(onnx_op: str, **defaults: Any) -> Callable:
    def convert(t: Translator, op: Any, label: str, a: Args, ins: List[Val]) -> Optional[List[Val]]:
        attrs = {k: a.f(k, v) for k, v in defaults.items()}
        return [(t.b.node(onnx_op, [ins[0][0]], label, **attrs), ins[0][1])]
    return convert


def _prelu(t: Translator, op: Any, label: str, a: Args, ins: List[Val]) -> Optional[List[Val]]:
    (x, rank), (slope, _) = ins
    w = t.weights.get(op.input[1])
    if w is not None and w.size > 1 and rank > 2:    # one slope per channel of NCHW
        slope = t.b.const(label + "_slope", w.reshape([-1] + [1] * (rank - 2)))
    return [(t.b.node("PRelu", [x, slope], label), rank)]


def _identity(t: Translator, op: Any, label: str, a: Args, ins: List[Val]) -> Optional[List[Val]]:
    return [ins[0]]


def _concat(t: Translator, op: Any, label: str, a: Args, ins: List[Val]) -> Optional[List[Val]]:
    rank = ins[0][1]
    axis = a.i("axis", 1 if a.s("order", "NCHW") == "NCHW" else rank - 1)
    if a.i("add_axis", 0):
        t.refuse(op, label, "add_axis=1")
        return None
    return [(t.b.node("Concat", [v for v, _ in ins], label, axis=axis % rank), rank)]


def _flatten(t: Translator, op: Any, label: str, a: Args, ins: List[Val]) -> Optional[List[Val]]:
    if op.type == "FlattenToVec":
        return [(t.b.node("Reshape", [ins[0][0], t.b.ints(label + "_shape", [-1])], label), 1)]
    return [(t.b.node("Flatten", [ins[0][0]], label, axis=a.i("axis", 1)), 2)]


def _reshape(t: Translator, op: Any, label: str, a: Args, ins: List[Val]) -> Optional[List[Val]]:
    shape = a.ints("shape")
    if shape is None:
        given = t.weights.get(op.input[1]) if len(op.input) > 1 else None
        if given is None:
            t.refuse(op, label, "a shape computed at run time")
            return None
        shape = [int(v) for v in given.reshape(-1)]
    return [(t.b.node("Reshape", [ins[0][0], t.b.ints(label + "_shape", shape)], label), len(shape))]


def _transpose(t: Translator, op: Any, label: str, a: Args, ins: List[Val]) -> Optional[List[Val]]:
    x, rank = ins[0]
    axes = a.ints("axes") or list(reversed(range(rank)))
    return [(t.b.node("Transpose", [x], label, perm=axes), rank)]


def _clip(t: Translator, op: Any, label: str, a: Args, ins: List[Val]) -> Optional[List[Val]]:
    x, rank = ins[0]
    lo = t.b.const(label + "_min", np.float32(a.f("min", float(np.finfo(np.float32).min))))
    hi = t.b.const(label + "_max", np.float32(a.f("max", float(np.finfo(np.float32).max))))
    return [(t.b.node("Clip", [x, lo, hi], label), rank)]


def _lrn(t: Translator, op: Any, label: str, a: Args, ins: List[Val]) -> Optional[List[Val]]:
    if not _nchw(t, op, label, a):
        return None
    y = t.b.node("LRN", [ins[0][0]], label, size=a.i("size"), alpha=a.f("alpha", 0.0), beta=a.f("beta", 0.0),
                 bias=a.f("bias", 1.0))
    return [(y, 4)]


def _squeeze(t: Translator, op: Any, label: str, a: Args, ins: List[Val]) -> Optional[List[Val]]:
    x, rank = ins[0]
    dims = a.ints("dims") or []
    if op.type == "Squeeze":
        return [(t.b.node("Squeeze", [x, t.b.ints(label + "_axes", dims)], label), rank - len(dims))]
    return [(t.b.node("Unsqueeze", [x, t.b.ints(label + "_axes", dims)], label), rank + len(dims))]


def _slice(t: Translator, op: Any, label: str, a: Args, ins: List[Val]) -> Optional[List[Val]]:
    x, rank = ins[0]
    starts, ends = a.ints("starts"), a.ints("ends")
    if starts is None or ends is None:
        t.refuse(op, label, "starts/ends given as inputs")
        return None
    # Caffe2's negative end counts from one past the end: -1 is the whole dimension
    onnx_ends = [INT_MAX if e == -1 else e + 1 if e < 0 else e for e in ends]
    y = t.b.node("Slice", [x, t.b.ints(label + "_starts", starts), t.b.ints(label + "_ends", onnx_ends),
                           t.b.ints(label + "_axes", list(range(len(starts))))], label)
    return [(y, rank)]


def _scale(t: Translator, op: Any, label: str, a: Args, ins: List[Val]) -> Optional[List[Val]]:
    x, rank = ins[0]
    return [(t.b.node("Mul", [x, t.b.const(label + "_scale", np.float32(a.f("scale", 1.0)))], label), rank)]


def _affine_channel(t: Translator, op: Any, label: str, a: Args, ins: List[Val]) -> Optional[List[Val]]:
    (x, rank), (scale, _), (bias, _) = ins[:3]
    shape = t.b.ints(label + "_cshape", [-1] + [1] * (rank - 2))
    s = t.b.node("Reshape", [scale, shape], label + "_scale")
    b = t.b.node("Reshape", [bias, shape], label + "_bias")
    return [(t.b.node("Add", [t.b.node("Mul", [x, s], label + "_mul"), b], label), rank)]


OpFn = Callable[[Translator, Any, str, Args, List[Val]], Optional[List[Val]]]
OPS: Dict[str, OpFn] = {}
for _type, _fn in (
        ("Conv", _conv), ("Conv2D", _conv), ("ConvTranspose", _conv),
        ("MaxPool", _pool), ("MaxPool2D", _pool), ("AveragePool", _pool), ("AveragePool2D", _pool),
        ("FC", _fc), ("FCTransposed", _fc),
        ("Softmax", _softmax), ("SpatialBN", _spatial_bn),
        ("Add", _binary("Add")), ("Sub", _binary("Sub")), ("Mul", _binary("Mul")), ("Div", _binary("Div")),
        ("Sum", _variadic("Sum")), ("Max", _variadic("Max")), ("Min", _variadic("Min")),
        ("Relu", _unary("Relu")), ("Sigmoid", _unary("Sigmoid")), ("Tanh", _unary("Tanh")),
        ("Softplus", _unary("Softplus")), ("Exp", _unary("Exp")), ("Log", _unary("Log")),
        ("Sqrt", _unary("Sqrt")), ("Abs", _unary("Abs")), ("Negative", _unary("Neg")),
        ("Elu", _unary("Elu", alpha=1.0)), ("LeakyRelu", _unary("LeakyRelu", alpha=0.01)),
        ("PRelu", _prelu),
        ("Dropout", _identity), ("Copy", _identity), ("Alias", _identity), ("StopGradient", _identity),
        ("Concat", _concat), ("Flatten", _flatten), ("FlattenToVec", _flatten), ("Reshape", _reshape),
        ("Transpose", _transpose), ("Clip", _clip), ("LRN", _lrn),
        ("Squeeze", _squeeze), ("ExpandDims", _squeeze), ("Slice", _slice), ("Scale", _scale),
        ("AffineChannel", _affine_channel),
):
    if _type in OPS:
        raise ValueError("Caffe2 op %r is registered twice" % _type)
    OPS[_type] = _fn

# the ops of an init net that hold trained values, and how each gives them
FILLS = {"GivenTensorFill": np.float32, "GivenTensorDoubleFill": np.float64, "GivenTensorIntFill": np.int32,
         "GivenTensorInt64Fill": np.int64, "GivenTensorBoolFill": np.bool_, "ConstantFill": None}
