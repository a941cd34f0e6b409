"""Quantized TFLite tensors (int8, uint8, int16 with a scale and zero point) on tether's integer kernels: the
QDQ form, and what every quantized op shares.

A quantized tensor holds ``real = scale * (q - zero_point)`` (per tensor, or along ``quantized_dimension`` for
weights). Its ONNX value is its integers, in the layout the Context holds it. Every op that reads it gets a
``DequantizeLinear`` of its own (so each group stands alone for the QDQ pass), the op is its float converter's
translation, unchanged (``FloatView``, ``through_float``), and a quantized output is a ``QuantizeLinear`` of the
float result; ``graph/passes/quantize.py`` turns the groups it knows (convolutions and dense layers with
per-channel int8 weights and int32 biases, global pooling, concat, max pooling, moves) into integer kernels. A
fused activation is LiteRT's clamp of the output integers to ``zero_point + round(bound / scale)`` (a ``Clip``
after the Q, none when it spans the type). ``float_wrappers`` puts the ``QDQ_OPS`` that have a float converter
into the quantized table.

Also here: DEQUANTIZE (DequantizeLinear; a constant folds to float32 now), ADD (onnxruntime's ``QLinearAdd``, the
graph's integer ``qadd``, which the QDQ pass does not make of int8 additions), int64 biases of 16x8 models
folded to reals. ``quantized_arith`` writes the ops whose LiteRT arithmetic differs from the float op rounded
once; ``quantized_products`` the convolutions and dense layers, full-integer and dynamic-range.
"""
from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from tether.errors import UnsupportedOpError
from tether.frontend.tflite import fused
from tether.frontend.tflite.converters import CONVERTERS
from tether.frontend.tflite.flatbuffer import Operator, Quantization, Tensor
from tether.frontend.tflite.state import NCHW, nchw_axis, onnx_dtype
from tether.frontend.tflite.table import ConverterTable
from tether.kernels.quantize_ops import qadd_fixed_point_constants

QUANTIZED = ConverterTable("tflite quantized")

INT_TYPES = ("int8", "uint8", "int16")
RANGES = {"int8": (-128, 127), "uint8": (0, 255), "int16": (-32768, 32767)}
MS = "com.microsoft"

# Ops whose float translation is right for quantized tensors between a DQ per input and a Q per output: LiteRT's
# int8/uint8 kernels of these compute the float op to within one step of their output. ``float_wrappers`` puts
# each one that has a float converter into the quantized table.
QDQ_OPS = (
    "SUB", "MUL", "DIV", "SQUARED_DIFFERENCE", "MAXIMUM", "MINIMUM", "ABS", "NEG", "RSQRT", "SQRT", "EXP", "LOG",
    "AVERAGE_POOL_2D", "MAX_POOL_2D", "L2_POOL_2D", "CONCATENATION", "RESHAPE", "SQUEEZE", "EXPAND_DIMS", "PAD",
    "PADV2", "MIRROR_PAD", "MEAN", "SUM", "REDUCE_MAX", "REDUCE_MIN", "REDUCE_PROD", "SOFTMAX", "LOG_SOFTMAX",
    "LOGISTIC", "TANH", "HARD_SWISH", "RELU", "RELU6", "RELU_N1_TO_1", "RELU_0_TO_1", "LEAKY_RELU", "PRELU", "ELU",
    "GELU", "RESIZE_BILINEAR", "RESIZE_NEAREST_NEIGHBOR", "TRANSPOSE", "DEPTH_TO_SPACE", "SPACE_TO_DEPTH",
    "STRIDED_SLICE", "SLICE", "GATHER", "GATHER_ND", "SPLIT", "SPLIT_V", "PACK", "UNPACK", "TILE", "BROADCAST_TO",
    "ARG_MAX", "ARG_MIN", "EQUAL", "NOT_EQUAL", "LESS", "LESS_EQUAL", "GREATER", "GREATER_EQUAL", "SELECT",
    "SELECT_V2", "BATCH_MATMUL", "L2_NORMALIZATION", "LOCAL_RESPONSE_NORMALIZATION", "BATCH_TO_SPACE_ND",
    "SPACE_TO_BATCH_ND", "TRANSPOSE_CONV", "EMBEDDING_LOOKUP", "CUMSUM", "TOPK_V2", "REVERSE_V2",
    "TFLite_Detection_PostProcess",
)


# ---------------------------------------------------------------- parameters
def is_quantized(t: Tensor) -> bool:
    """An integer tensor whose values stand for reals through a scale and zero point."""
    return t.dtype in INT_TYPES and t.quantization is not None and t.quantization.scale.size > 0


def touches_quantized(ctx, op: Operator) -> bool:
    """Whether any input or output of ``op`` is a quantized tensor: the op goes to the ``QUANTIZED`` table."""
    return any(i >= 0 and is_quantized(ctx.tensor(i)) for i in list(op.inputs) + list(op.outputs))


def dequantized(q: Quantization, values: np.ndarray, scale: Optional[np.ndarray] = None) -> np.ndarray:
    """The reals a quantized array stands for, in float32."""
    s = q.scale if scale is None else scale
    shape = [1] * values.ndim
    if s.size > 1:
        shape[q.axis] = s.size
    zp = q.zero_point if q.zero_point.size == s.size else np.zeros(s.size, np.int64)
    return ((values.astype(np.float32) - zp.reshape(shape).astype(np.float32)) * s.reshape(shape)).astype(np.float32)


def round_away(v: np.ndarray) -> np.ndarray:
    """TfLiteRound: to the nearest integer, halves away from zero."""
    v = np.asarray(v, np.float32)
    return np.sign(v) * np.floor(np.abs(v) + np.float32(0.5))


def quantized_values(q: Quantization, reals: np.ndarray, dtype: str) -> np.ndarray:
    """Reals as the integers of ``q`` (per tensor), rounded as LiteRT's QUANTIZE does."""
    lo, hi = RANGES[dtype]
    v = round_away(np.asarray(reals, np.float32) / np.float32(q.scale.reshape(-1)[0])) + q.zero_point.reshape(-1)[0]
    return np.clip(v, lo, hi).astype(dtype)


def param_consts(ctx, t: Tensor, scale: Optional[np.ndarray] = None) -> Tuple[str, str, bool]:
    """ONNX initializers for a tensor's scale and zero point: (scale, zero point, per_channel)."""
    q = t.quantization
    s = np.asarray(q.scale if scale is None else scale, np.float32)
    zp_dtype = t.dtype if t.dtype in INT_TYPES else "int32"
    zp = q.zero_point if q.zero_point.size == s.size else np.zeros(s.size, np.int64)
    if s.size == 1:
        return (ctx.add_const(s.reshape(()), "%s_scale" % tensor_hint(t)),
                ctx.add_const(zp.reshape(()).astype(zp_dtype), "%s_zero_point" % tensor_hint(t)), False)
    return (ctx.add_const(s.reshape(-1), "%s_scale" % tensor_hint(t)),
            ctx.add_const(zp.reshape(-1).astype(zp_dtype), "%s_zero_point" % tensor_hint(t)), True)


def tensor_hint(t: Tensor) -> str:
    return t.name or "t%d" % t.index


def dequantize(ctx, value: str, t: Tensor, axis: Optional[int] = None, scale: Optional[np.ndarray] = None) -> str:
    """``DequantizeLinear`` of ``value`` holding ``t``'s integers; ``axis``: the per-channel axis as held."""
    s, z, per_channel = param_consts(ctx, t, scale)
    attrs = {"axis": int(t.quantization.axis if axis is None else axis)} if per_channel else {}
    return ctx.emit1("DequantizeLinear", [value, s, z], tensor_hint(t) + "_dq", **attrs)


def quantize(ctx, value: str, t: Tensor, axis: Optional[int] = None) -> str:
    """``QuantizeLinear`` of a float ``value`` into ``t``'s integers."""
    s, z, per_channel = param_consts(ctx, t)
    attrs = {"axis": int(t.quantization.axis if axis is None else axis)} if per_channel else {}
    return ctx.emit1("QuantizeLinear", [value, s, z], tensor_hint(t), **attrs)


def activation_range(t: Tensor, code: int) -> Tuple[int, int]:
    """The integers a fused activation leaves in ``t`` (LiteRT's CalculateActivationRangeQuantized)."""
    lo, hi = RANGES[t.dtype]
    s = np.float32(t.quantization.scale.reshape(-1)[0])
    z = int(t.quantization.zero_point.reshape(-1)[0]) if t.quantization.zero_point.size else 0

    def q(v: float) -> int:
        return z + int(round_away(np.float32(v) / s))

    if code == fused.RELU:
        return max(lo, q(0.0)), hi
    if code == fused.RELU6:
        return max(lo, q(0.0)), min(hi, q(6.0))
    if code == fused.RELU_N1_TO_1:
        return max(lo, q(-1.0)), min(hi, q(1.0))
    return lo, hi


def clamp(ctx, value: str, t: Tensor, code: int) -> str:
    """The quantized ``value`` clamped to the fused activation's integers (nothing when that is the whole type)."""
    lo, hi = activation_range(t, code)
    if (lo, hi) == RANGES[t.dtype]:
        return value
    return ctx.emit1("Clip", [value, ctx.add_const(np.array(lo, t.dtype), "act_min"),
                              ctx.add_const(np.array(hi, t.dtype), "act_max")], tensor_hint(t) + "_act")


# ---------------------------------------------------------------- the float converters' view
class FloatView:
    """The translation state as a float converter sees it: a quantized input reads as a DequantizeLinear of its
    integers (one per read, so that each op's group stands alone for the QDQ pass), a quantized constant as its
    reals, and binding a quantized output quantizes the float result, then clamps it to the op's fused activation
    (which the float converter does not see: ``op`` here has none). Everything else is the Context's."""

    def __init__(self, ctx, op: Operator, scales: Optional[Dict[int, np.ndarray]] = None,
                 raw=None) -> None:
        self._ctx = ctx
        self._scales = dict(scales or {})       # tensor -> the scale its DQ uses instead of the file's
        # None, or how the float result on the raw integers becomes the output's: a name in RAW_ROUNDING or a
        # function (ctx, value, tensor) -> integer value
        self._raw = RAW_ROUNDING.get(raw, raw) if isinstance(raw, str) else raw
        self._activation = int(op.options.get("fused_activation_function", 0) or 0)
        options = dict(op.options)
        # a quantized output gets the activation as a clamp of its integers; a float one keeps it in float
        if "fused_activation_function" in options and op.outputs and is_quantized(ctx.tensor(op.outputs[0])):
            options["fused_activation_function"] = 0
        self.op = dataclasses.replace(op, options=options)
        self.dq_sources: Dict[str, Tuple[str, int]] = {}     # DQ output -> (integer value, tensor)

    def __getattr__(self, name):
        return getattr(self._ctx, name)

    def _real(self, index: int) -> bool:
        if index < 0:
            return False
        t = self._ctx.tensor(index)
        return is_quantized(t) or (index in self._scales and t.quantization is not None)

    def _dq(self, index: int, value: str, axis: Optional[int]) -> str:
        if self._raw:
            return self._ctx.emit1("Cast", [value], tensor_hint(self._ctx.tensor(index)) + "_raw",
                                   to=onnx_dtype("float32"))
        y = dequantize(self._ctx, value, self._ctx.tensor(index), axis, self._scales.get(index))
        self.dq_sources[y] = (value, index)
        return y

    # reading
    def tensor(self, index: int) -> Tensor:
        t = self._ctx.tensor(index)
        if not self._real(index):
            return t
        data = None if t.data is None else self._reals(index, t.data)
        return dataclasses.replace(t, dtype="float32", data=data, quantization=None)

    def const(self, index: int) -> Optional[np.ndarray]:
        c = self._ctx.const(index)
        if c is None or not self._real(index):
            return c
        return self._reals(index, np.asarray(c))

    def _reals(self, index: int, values: np.ndarray) -> np.ndarray:
        if self._raw:
            return values.astype(np.float32)
        return dequantized(self._ctx.tensor(index).quantization, values, self._scales.get(index))

    def held(self, index: int) -> Tuple[str, str]:
        value, layout = self._ctx.held(index)
        if not self._real(index):
            return value, layout
        axis = self._ctx.tensor(index).quantization.axis
        return self._dq(index, value, nchw_axis(axis, 4) if layout == NCHW else axis), layout

    def nhwc(self, index: int) -> str:
        if self._real(index) and self._ctx.tensor(index).dtype == "int64" and self._ctx.const(index) is not None:
            # the int64 biases of 16x8 models: ONNX dequantizes no int64, so they are folded to reals here
            return self._ctx.add_const(self.const(index), tensor_hint(self._ctx.tensor(index)) + "_reals")
        value = self._ctx.nhwc(index)
        return self._dq(index, value, None) if self._real(index) else value

    def nchw(self, index: int) -> str:
        value = self._ctx.nchw(index)
        if not self._real(index):
            return value
        return self._dq(index, value, nchw_axis(self._ctx.tensor(index).quantization.axis, 4))

    def aligned(self, indices: Sequence[int]) -> Tuple[List[str], str]:
        names, layout = self._ctx.aligned(indices)
        out = []
        for i, name in zip(indices, names):
            if not self._real(i):
                out.append(name)
                continue
            axis = self._ctx.tensor(i).quantization.axis
            if layout == NCHW:
                axis = nchw_axis(axis + 4 - max(self._ctx.rank(i), 1), 4) if self._ctx.rank(i) else 0
            out.append(self._dq(i, name, axis))
        return out, layout

    def transposed_const(self, index: int, perm: Sequence[int], hint: str = "") -> str:
        value = self._ctx.transposed_const(index, perm, hint)
        if not self._real(index):
            return value
        return self._dq(index, value, list(perm).index(self._ctx.tensor(index).quantization.axis))

    # writing
    def set_output(self, index: int, name: str, layout: str = "native") -> None:
        t = self._ctx.tensor(index)
        if not is_quantized(t):
            self._ctx.set_output(index, name, layout)
            return
        y = _integer_add(self, name, t) if not self._raw else self._raw(self._ctx, name, t)
        if y is None:
            axis = nchw_axis(t.quantization.axis, 4) if layout == NCHW else t.quantization.axis
            y = quantize(self._ctx, name, t, axis)
        if index == self.op.outputs[0]:
            y = clamp(self._ctx, y, t, self._activation)
        self._ctx.set_output(index, y, layout)

    def set_const(self, index: int, value: np.ndarray) -> None:
        t = self._ctx.tensor(index)
        if is_quantized(t) and self._raw:
            lo, hi = RANGES[t.dtype]
            value = np.clip(round_away(value), lo, hi).astype(t.dtype)
        elif is_quantized(t) and t.quantization.scale.size == 1:
            value = quantized_values(t.quantization, value, t.dtype)
        self._ctx.set_const(index, value)


def _round_away(ctx, value: str, t: Tensor) -> str:
    """``value`` (reals of integers) rounded half away from zero, as ``t``'s type."""
    half = ctx.add_const(np.array(0.5, np.float32), "half")
    mag = ctx.emit1("Floor", [ctx.emit1("Add", [ctx.emit1("Abs", [value]), half])])
    return ctx.emit1("Cast", [ctx.emit1("Mul", [ctx.emit1("Sign", [value]), mag])], tensor_hint(t),
                     to=onnx_dtype(t.dtype))


def _round_half_up(ctx, value: str, t: Tensor) -> str:
    half = ctx.add_const(np.array(0.5, np.float32), "half")
    return ctx.emit1("Cast", [ctx.emit1("Floor", [ctx.emit1("Add", [value, half])])], tensor_hint(t),
                     to=onnx_dtype(t.dtype))


# How the ops that LiteRT computes on the raw integers (input and output sharing scale and zero point) round:
# its AVERAGE_POOL_2D kernel divides the window's sum half away from zero; the CPU delegate's bilinear resize
# interpolates with 11-bit weights and rounds half up.
RAW_ROUNDING = {"away": _round_away, "half_up": _round_half_up}
RAW_OPS = {"AVERAGE_POOL_2D": "away", "RESIZE_BILINEAR": "half_up"}    # (the resize's 11-bit weights: below)


def _integer_add(view: FloatView, name: str, t: Tensor) -> Optional[str]:
    """An ADD whose float translation is ``Add(DQ(a), DQ(b))`` of per-tensor int8/uint8 tensors becomes
    ``QLinearAdd(a, b)`` (the graph's integer qadd): the Add and its two DQs leave the node list."""
    if view.op.op != "ADD" or t.dtype not in ("int8", "uint8") or t.quantization.scale.size != 1:
        return None
    nodes = view._ctx.nodes
    add = next((n for n in reversed(nodes) if name in n.output), None)
    if add is None or add.op_type != "Add" or any(i not in view.dq_sources for i in add.input):
        return None
    srcs = [view.dq_sources[i] for i in add.input]
    tensors = [view._ctx.tensor(k) for _, k in srcs]
    if any(s.dtype != t.dtype or s.quantization.scale.size != 1 for s in tensors):
        return None
    dqs = [n for n in nodes if n.op_type == "DequantizeLinear" and n.output[0] in add.input]
    for n in dqs + [add]:
        nodes.remove(n)
    dead = {i for n in dqs for i in n.input[1:]}     # their fresh scale and zero point initializers
    view._ctx.initializers[:] = [i for i in view._ctx.initializers if i.name not in dead]
    ins = []
    for (value, _), s in zip(srcs, tensors):
        sc, zp, _ = param_consts(view._ctx, s)
        ins += [value, sc, zp]
    sy, zy, _ = param_consts(view._ctx, t)
    # LiteRT's CPU delegate adds in fixed point where it takes the scales (else its builtin kernel, which the
    # float sum rounded once matches within a step)
    params = [float(x.quantization.scale[0]) if k % 2 == 0 else int(x.quantization.zero_point[0])
              for x in tensors + [t] for k in (0, 1)]
    xnn = qadd_fixed_point_constants(*params) is not None
    return view._ctx.emit("QLinearAdd", ins + [sy, zy], tensor_hint(t), domain=MS,
                          **({"rounding": "xnnpack"} if xnn else {}))[0]


def float_converter(op: Operator):
    key = op.custom_code if op.op == "CUSTOM" else op.op       # a custom op is keyed by its custom code
    fn = CONVERTERS.get(key)
    if fn is None:
        raise UnsupportedOpError("%s: no converter for this op (float or quantized)" % key)
    return fn


def refuse_packed(ctx, op: Operator) -> None:
    """int4 tensors (two values a byte) have no ONNX form here: refused naming the tensor."""
    for i in list(op.inputs) + list(op.outputs):
        if i >= 0 and ctx.tensor(i).dtype not in INT_TYPES + ("float32", "float16", "int32", "int64", "bool") and \
                ctx.tensor(i).quantization is not None:
            raise UnsupportedOpError("%s: quantized tensor %r of type %s is not supported (tether reads int8, uint8 "
                                     "and int16)" % (ctx.where(), ctx.tensor(i).name, ctx.tensor(i).dtype))


def same_params(ctx, op: Operator) -> bool:
    """Whether the op's first input and its output are quantized alike (per tensor)."""
    a, b = ctx.tensor(op.inputs[0]), ctx.tensor(op.outputs[0])
    return is_quantized(a) and is_quantized(b) and a.dtype == b.dtype and a.quantization.scale.size == 1 and \
        np.array_equal(a.quantization.scale, b.quantization.scale) and \
        np.array_equal(a.quantization.zero_point, b.quantization.zero_point)


def through_float(ctx, op: Operator, scales: Optional[Dict[int, np.ndarray]] = None, raw=None) -> None:
    """``op`` by its float converter, between dequantized inputs and quantized outputs (or, for the ``RAW_OPS``
    with equal input and output parameters, on the raw integers with their own rounding)."""
    refuse_packed(ctx, op)
    fn = float_converter(op)
    if raw is None and same_params(ctx, op):
        raw = RAW_OPS.get(op.op)
    view = FloatView(ctx, op, scales, raw)
    saved = ctx.op
    ctx.op = view.op
    try:
        fn(view, view.op)
    finally:
        ctx.op = saved


# Ops LiteRT runs on the stored integers whatever their scale (CAST converts the integers, ZEROS_LIKE writes
# integer zeros, not the zero point): their float converter on the integers as they are.
INTEGER_OPS = ("CAST", "SHAPE", "ZEROS_LIKE", "ONES_LIKE", "FILL")


def on_integers(ctx, op: Operator) -> None:
    refuse_packed(ctx, op)
    float_converter(op)(ctx, op)


def float_wrappers(float_table, taken) -> ConverterTable:
    """The quantized table's entries for the ``QDQ_OPS`` and ``INTEGER_OPS`` that ``float_table`` converts and
    ``taken`` (the quantized families' own table) does not."""
    table = ConverterTable("tflite quantized (float ops between DQ and Q, or on the integers)")
    for names, fn in ((QDQ_OPS, through_float), (INTEGER_OPS, on_integers)):
        for name in names:
            if name in float_table and name not in taken:
                table.add(name, fn)
    return table


# ---------------------------------------------------------------- ops of their own
@QUANTIZED.register("DEQUANTIZE")
def _dequantize(ctx, op: Operator) -> None:
    refuse_packed(ctx, op)
    src = ctx.tensor(op.inputs[0])
    if not is_quantized(src):
        return float_converter(op)(ctx, op)
    const = ctx.const(op.inputs[0])
    if const is not None:       # weights stored as integers, used as floats: dequantized once, as LiteRT does
        ctx.set_const(op.outputs[0], dequantized(src.quantization, np.asarray(const)))
        return
    value, layout = ctx.held(op.inputs[0])
    axis = src.quantization.axis
    ctx.set_output(op.outputs[0], dequantize(ctx, value, src, nchw_axis(axis, 4) if layout == NCHW else axis), layout)


@QUANTIZED.register("ADD")
def _add(ctx, op: Operator) -> None:
    through_float(ctx, op)
