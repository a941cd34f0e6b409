"""Quantized TFLite tensors as ONNX's QDQ form, which tether's graph passes run on its int8 kernels.

A TFLite tensor of type int8, uint8 or int16 with a scale and zero point holds ``real = scale * (q - zero_point)``
(per tensor, or along ``quantized_dimension`` for weights). The translation keeps such a tensor's integers as its
ONNX value and gives every op that reads it a ``DequantizeLinear`` of its own; the op itself is the float op's
translation (the float converter, unchanged), and its quantized output is a ``QuantizeLinear`` of the float result.
``graph/passes/quantize.py`` then turns each ``DQ -> op -> Q`` group it knows (convolutions and dense layers with
per-channel weights and int32 biases, pooling, concat, sigmoid, moves) into integer kernels; a group it does not
know computes the float op between the two roundings, which is LiteRT's result within one quantization step.

Where LiteRT's integer kernels define the arithmetic, the translation follows them:

- biases: int32 in the accumulator's units; their DQ scale is written as ``float32(s_x) * s_w`` (what the pass
  requires to fold them into the integer conv), whatever scale the file records;
- fused activations: LiteRT clamps the requantized integers to the activation's range (``zero_point +
  round(bound / scale)``, rounding half away from zero), so the translation does the same on the integers after
  QuantizeLinear (a ``Clip``, left out where the range is the whole type's);
- ADD of two per-tensor int8/uint8 tensors: onnxruntime's ``QLinearAdd`` (the graph's integer ``qadd``), since
  the QDQ pass leaves int8 additions in float;
- QUANTIZE: QuantizeLinear of a float tensor; from a quantized tensor it requantizes (DQ then Q, nothing when the
  parameters agree); DEQUANTIZE: DequantizeLinear (a constant folds to float32 now).

Dynamic-range models (int8 weights, float activations: LiteRT's hybrid kernels) run CONV_2D, DEPTHWISE_CONV_2D and
FULLY_CONNECTED as the hybrid kernel computes: the input quantized at run time (asymmetric int8 per batch for
convolutions and for FULLY_CONNECTED with ``asymmetric_quantize_inputs``, symmetric per row otherwise), the integer
product (ConvInteger, MatMulInteger), scaled back by ``s_x * s_w`` and the float bias added. ``HYBRID`` chooses
between this (``"emulate"``) and dequantizing the weights (``"dequantize"``: the float op on the stored weights);
the emulation is the closer of the two to LiteRT. Other ops with quantized weights and float activations read
the weights dequantized.
"""
from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from tether.errors import UnsupportedOpError
from tether.frontend.tflite import fused
from tether.frontend.tflite.flatbuffer import Operator, Quantization, Tensor
from tether.frontend.tflite.state import NCHW, nchw_axis, onnx_dtype
from tether.frontend.tflite.table import ConverterTable

QUANTIZED = ConverterTable("tflite quantized")

INT_TYPES = ("int8", "uint8", "int16")
RANGES = {"int8": (-128, 127), "uint8": (0, 255), "int16": (-32768, 32767)}
MS = "com.microsoft"

# product op -> (input, weights, bias) positions
PRODUCTS = {"CONV_2D": (0, 1, 2), "DEPTHWISE_CONV_2D": (0, 1, 2), "FULLY_CONNECTED": (0, 1, 2),
            "TRANSPOSE_CONV": (2, 1, 3)}

HYBRID = "emulate"          # or "dequantize": how dynamic-range products run (see the module's docstring)

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
    "SPACE_TO_BATCH_ND", "SHAPE", "CAST", "TRANSPOSE_CONV", "EMBEDDING_LOOKUP", "CUMSUM", "TOPK_V2", "REVERSE_V2",
    "ZEROS_LIKE", "ONES_LIKE", "FILL", "TFLite_Detection_PostProcess",
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


def _params(ctx, t: Tensor, scale: Optional[np.ndarray] = None) -> Tuple[str, str, bool]:
    """ONNX initializers for a tensor's scale and zero point: (scale, zero point, per_channel)."""
    q = t.quantization
    s = np.asarray(q.scale if scale is None else scale, np.float32)
    zp_dtype = t.dtype if t.dtype in INT_TYPES else "int32"
    zp = q.zero_point if q.zero_point.size == s.size else np.zeros(s.size, np.int64)
    if s.size == 1:
        return (ctx.add_const(s.reshape(()), "%s_scale" % _hint(t)),
                ctx.add_const(zp.reshape(()).astype(zp_dtype), "%s_zero_point" % _hint(t)), False)
    return (ctx.add_const(s.reshape(-1), "%s_scale" % _hint(t)),
            ctx.add_const(zp.reshape(-1).astype(zp_dtype), "%s_zero_point" % _hint(t)), True)


def _hint(t: Tensor) -> str:
    return t.name or "t%d" % t.index


def dequantize(ctx, value: str, t: Tensor, axis: Optional[int] = None, scale: Optional[np.ndarray] = None) -> str:
    """``DequantizeLinear`` of ``value`` holding ``t``'s integers; ``axis``: the per-channel axis as held."""
    s, z, per_channel = _params(ctx, t, scale)
    attrs = {"axis": int(t.quantization.axis if axis is None else axis)} if per_channel else {}
    return ctx.emit1("DequantizeLinear", [value, s, z], _hint(t) + "_dq", **attrs)


def quantize(ctx, value: str, t: Tensor, axis: Optional[int] = None) -> str:
    """``QuantizeLinear`` of a float ``value`` into ``t``'s integers."""
    s, z, per_channel = _params(ctx, t)
    attrs = {"axis": int(t.quantization.axis if axis is None else axis)} if per_channel else {}
    return ctx.emit1("QuantizeLinear", [value, s, z], _hint(t), **attrs)


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
                              ctx.add_const(np.array(hi, t.dtype), "act_max")], _hint(t) + "_act")


# ---------------------------------------------------------------- the float converters' view
class FloatView:
    """The translation state as a float converter sees it: a quantized input reads as a DequantizeLinear of its
    integers (one per read, so that each op's group stands alone for the QDQ pass), a quantized constant as its
    reals, and binding a quantized output quantizes the float result, then clamps it to the op's fused activation
    (which the float converter does not see: ``op`` here has none). Everything else is the Context's."""

    def __init__(self, ctx, op: Operator, scales: Optional[Dict[int, np.ndarray]] = None,
                 raw: Optional[str] = None) -> None:
        self._ctx = ctx
        self._scales = dict(scales or {})       # tensor -> the scale its DQ uses instead of the file's
        self._raw = raw                         # None, or how the raw integers' float result rounds (RAW_ROUNDING)
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
            return self._ctx.emit1("Cast", [value], _hint(self._ctx.tensor(index)) + "_raw", to=onnx_dtype("float32"))
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
            return self._ctx.add_const(self.const(index), _hint(self._ctx.tensor(index)) + "_reals")
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
        y = _integer_add(self, name, t) if not self._raw else RAW_ROUNDING[self._raw](self._ctx, name, t)
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
    return ctx.emit1("Cast", [ctx.emit1("Mul", [ctx.emit1("Sign", [value]), mag])], _hint(t), to=onnx_dtype(t.dtype))


def _round_half_up(ctx, value: str, t: Tensor) -> str:
    half = ctx.add_const(np.array(0.5, np.float32), "half")
    return ctx.emit1("Cast", [ctx.emit1("Floor", [ctx.emit1("Add", [value, half])])], _hint(t), to=onnx_dtype(t.dtype))


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
        sc, zp, _ = _params(view._ctx, s)
        ins += [value, sc, zp]
    sy, zy, _ = _params(view._ctx, t)
    return view._ctx.emit("QLinearAdd", ins + [sy, zy], _hint(t), domain=MS)[0]


def _float_converter(op: Operator):
    from tether.frontend.tflite.converters import CONVERTERS
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


def _same_params(ctx, op: Operator) -> bool:
    """Whether the op's first input and its output are quantized alike (per tensor)."""
    a, b = ctx.tensor(op.inputs[0]), ctx.tensor(op.outputs[0])
    return is_quantized(a) and is_quantized(b) and a.dtype == b.dtype and a.quantization.scale.size == 1 and \
        np.array_equal(a.quantization.scale, b.quantization.scale) and \
        np.array_equal(a.quantization.zero_point, b.quantization.zero_point)


def through_float(ctx, op: Operator, scales: Optional[Dict[int, np.ndarray]] = None) -> None:
    """``op`` by its float converter, between dequantized inputs and quantized outputs (or, for the ``RAW_OPS``
    with equal input and output parameters, on the raw integers with their own rounding)."""
    refuse_packed(ctx, op)
    fn = _float_converter(op)
    raw = RAW_OPS.get(op.op) if _same_params(ctx, op) else None
    view = FloatView(ctx, op, scales, raw)
    saved = ctx.op
    ctx.op = view.op
    try:
        fn(view, view.op)
    finally:
        ctx.op = saved


def float_wrappers(float_table) -> ConverterTable:
    """The quantized table's entries for the ``QDQ_OPS`` that ``float_table`` converts and this module does
    not convert itself."""
    table = ConverterTable("tflite quantized (float ops between DQ and Q)")
    for name in QDQ_OPS:
        if name in float_table and name not in QUANTIZED:
            table.add(name, through_float)
    return table


# ---------------------------------------------------------------- LiteRT's integer arithmetic, as tables
def quantize_multiplier(real: float) -> Tuple[int, int]:
    """LiteRT's QuantizeMultiplier: ``real = q * 2**(shift - 31)`` with q a 31-bit integer."""
    if real == 0.0:
        return 0, 0
    m, shift = np.frexp(np.float64(real))
    q = int(np.round(np.float64(m) * (1 << 31)))
    if q == 1 << 31:
        q, shift = q // 2, shift + 1
    return q, int(shift)


def multiply_by_quantized_multiplier(x: np.ndarray, real: float) -> np.ndarray:
    """LiteRT's MultiplyByQuantizedMultiplier (double rounding: the high half of the doubled product rounded,
    then a rounding right shift; both round half away from zero), on int64 arrays."""
    q, shift = quantize_multiplier(real)
    x = np.asarray(x, np.int64) * (1 << max(shift, 0))
    ab = x * q
    nudge = np.where(ab >= 0, 1 << 30, 1 - (1 << 30))
    hi = (ab + nudge)
    hi = np.where(hi >= 0, hi >> 31, -((-hi) >> 31))          # C's division by 2**31: toward zero
    right = max(-shift, 0)
    if right == 0:
        return hi
    mask = (1 << right) - 1
    threshold = (mask >> 1) + (hi < 0)
    return (hi >> right) + ((hi & mask) > threshold)


def _xnn_scaled(d: np.ndarray, ratio: np.float32) -> np.ndarray:
    """The CPU delegate's 8-bit rescale (its convert and leaky-relu kernels): ``(d * round(256 * ratio) + 128)
    >> 8``."""
    m = int(np.rint(np.float32(256.0) * np.float32(ratio)))
    return (np.asarray(d, np.int64) * m + 128) >> 8


def _delegate_ratio_ok(ratio: float) -> bool:
    """The rescale ratios the CPU delegate takes (others run on LiteRT's own kernels)."""
    return 2.0 ** -8 <= abs(ratio) <= 2.0 ** 7


def _unary_table(ctx, op: Operator, fn) -> None:
    """A one-input op whose LiteRT result is a function of the input's integer alone: ``fn(values) -> integers``
    over every value of the type, read by ``Gather`` (an 8-bit table; tether's gather, as the QDQ pass's tables)."""
    src, dst = ctx.tensor(op.inputs[0]), ctx.tensor(op.outputs[0])
    lo, hi = RANGES[src.dtype]
    values = np.arange(lo, hi + 1, dtype=np.int64)
    olo, ohi = RANGES[dst.dtype]
    table = np.clip(fn(values), olo, ohi).astype(dst.dtype)
    x, layout = ctx.held(op.inputs[0])
    idx = ctx.emit1("Cast", [x], _hint(src) + "_index", to=onnx_dtype("int32"))
    if lo:
        idx = ctx.emit1("Sub", [idx, ctx.add_const(np.array(lo, np.int32), "table_base")], _hint(src) + "_index")
    y = ctx.emit1("Gather", [ctx.add_const(table, _hint(dst) + "_table"), idx], _hint(dst), axis=0)
    ctx.set_output(op.outputs[0], y, layout)


def _params_of(t: Tensor) -> Tuple[float, int]:
    return float(t.quantization.scale.reshape(-1)[0]), int(t.quantization.zero_point.reshape(-1)[0])


def _per_tensor(ctx, op: Operator) -> bool:
    return all(is_quantized(ctx.tensor(i)) and ctx.tensor(i).quantization.scale.size == 1
               and ctx.tensor(i).dtype in ("int8", "uint8") for i in (op.inputs[0], op.outputs[0]))


_RELU_BOUNDS = {"RELU": (0.0, None), "RELU6": (0.0, 6.0), "RELU_N1_TO_1": (-1.0, 1.0), "RELU_0_TO_1": (0.0, 1.0)}


@QUANTIZED.register(*_RELU_BOUNDS)
def _relu(ctx, op: Operator) -> None:
    """LiteRT's quantized ReluX: the input rescaled to the output's scale (its fixed-point multiplier), then
    clamped to the bounds quantized (an identity rescale when the parameters agree: the delegate's clamp)."""
    if not _per_tensor(ctx, op):
        return through_float(ctx, op)
    (sx, zx), (sy, zy) = _params_of(ctx.tensor(op.inputs[0])), _params_of(ctx.tensor(op.outputs[0]))
    lo_real, hi_real = _RELU_BOUNDS[op.op]
    olo, ohi = RANGES[ctx.tensor(op.outputs[0]).dtype]
    lo = max(olo, zy + int(round_away(np.float32(lo_real) / np.float32(sy))))
    hi = ohi if hi_real is None else min(ohi, zy + int(round_away(np.float32(hi_real) / np.float32(sy))))
    _unary_table(ctx, op, lambda v: np.clip(zy + multiply_by_quantized_multiplier(v - zx, sx / sy), lo, hi))


@QUANTIZED.register("LEAKY_RELU")
def _leaky_relu(ctx, op: Operator) -> None:
    if not _per_tensor(ctx, op):
        return through_float(ctx, op)
    (sx, zx), (sy, zy) = _params_of(ctx.tensor(op.inputs[0])), _params_of(ctx.tensor(op.outputs[0]))
    alpha = np.float32(op.options.get("alpha", 0.2))
    ratio = np.float32(np.float32(sx) / np.float32(sy))
    neg = np.float32(ratio * alpha)
    if _delegate_ratio_ok(ratio) and _delegate_ratio_ok(neg):
        _unary_table(ctx, op, lambda v: zy + np.where(v >= zx, _xnn_scaled(v - zx, ratio), _xnn_scaled(v - zx, neg)))
        return
    _unary_table(ctx, op, lambda v: zy + np.where(v >= zx, multiply_by_quantized_multiplier(v - zx, sx / sy),
                                                  multiply_by_quantized_multiplier(v - zx, float(alpha) * sx / sy)))


def _q11_axis(n_in: int, n_out: int, align_corners: bool, half_pixel: bool):
    """The CPU delegate's bilinear taps along one axis: (first, second, weight of the second in 1/2048ths)."""
    adjust = 1 if align_corners and n_out != 1 else 0
    scale = np.float32(n_in - adjust) / np.float32(n_out - adjust)
    first, second, weight = [], [], []
    for o in range(n_out):
        if align_corners or not half_pixel:
            pos = np.float32(o) * scale
        else:
            pos = np.float32(o) * scale + (np.float32(0.5) * scale - np.float32(0.5))
            pos = min(max(pos, np.float32(0.0)), np.float32(n_in - 1))
        top = int(pos)
        first.append(top)
        second.append(min(top + 1, n_in - 1))
        weight.append(int(np.rint(np.float32(pos - np.float32(top)) * np.float32(2048.0))))
    return np.array(first, np.int64), np.array(second, np.int64), np.array(weight, np.int32)


@QUANTIZED.register("RESIZE_BILINEAR")
def _resize_bilinear(ctx, op: Operator) -> None:
    """With equal input and output parameters, the CPU delegate's integer resize: 11-bit weights from its
    float positions, ``((top << 11) + (bottom - top) * a_y)`` of the rows ``(left << 11) + (right - left) * a_x``,
    rounded half up at ``>> 22``; computed here exactly in int32."""
    x, out = op.inputs[0], op.outputs[0]
    if not (_same_params(ctx, op) and ctx.rank(x) == 4 and ctx.tensor(x).dtype in ("int8", "uint8")):
        return through_float(ctx, op)
    _, h, w, _ = ctx.shape(x)
    _, oh, ow, _ = ctx.shape(out)
    align, half = bool(op.options.get("align_corners")), bool(op.options.get("half_pixel_centers"))
    ty, by, ay = _q11_axis(h, oh, align, half)
    lx, rx, ax = _q11_axis(w, ow, align, half)
    i32 = onnx_dtype("int32")
    channels = ctx.shape(x)[3]
    flat = ctx.emit1("Reshape", [ctx.nchw(x), ctx.add_const(np.array([1, channels, h * w], np.int64), "hw")],
                     "resize_flat")

    def corner(rows: np.ndarray, cols: np.ndarray) -> str:
        """The pixels at (rows[i], cols[j]) for every output (i, j), as int32 (1, C, OH, OW): one gather."""
        idx = ctx.add_const((rows[:, None] * w + cols[None, :]).astype(np.int64), "resize_taps")
        return ctx.emit1("Cast", [ctx.emit1("Gather", [flat, idx], "resize_tap", axis=2)], "resize_tap", to=i32)

    def blend(a: str, b: str, weight: np.ndarray, shape) -> str:
        # a * (2048 - w) + b * w: the delegate's a * 2048 + (b - a) * w, each operand read once
        wa = ctx.add_const((2048 - weight).astype(np.int32).reshape(shape), "resize_w")
        wb = ctx.add_const(weight.astype(np.int32).reshape(shape), "resize_w")
        return ctx.emit1("Add", [ctx.emit1("Mul", [a, wa]), ctx.emit1("Mul", [b, wb])], "resize_blend")

    cols = (1, 1, 1, -1)
    top = blend(corner(ty, lx), corner(ty, rx), ax, cols)
    bottom = blend(corner(by, lx), corner(by, rx), ax, cols)
    acc = blend(top, bottom, ay, (1, 1, -1, 1))
    # floor((acc + 2**21) / 2**22), in float64, which holds every such sum (|acc| < 2**30) exactly
    f64 = onnx_dtype("float64")
    y = ctx.emit1("Add", [ctx.emit1("Cast", [acc], "resize_acc", to=f64),
                          ctx.add_const(np.array(1 << 21, np.float64), "resize_round")], "resize_acc")
    y = ctx.emit1("Floor", [ctx.emit1("Mul", [y, ctx.add_const(np.array(2.0 ** -22, np.float64), "resize_q22")])])
    y = ctx.emit1("Cast", [y], _hint(ctx.tensor(out)), to=onnx_dtype(ctx.tensor(out).dtype))
    ctx.set_output(out, y, NCHW)


def _q31_to_q15(m: int) -> int:
    """LiteRT's DownScaleInt32ToInt16Multiplier."""
    if m >= (1 << 31) - 1 - (1 << 15):
        return (1 << 15) - 1
    return (m + (1 << 15)) >> 16


def _sat16(v: np.ndarray) -> np.ndarray:
    return np.clip(v, -(1 << 15), (1 << 15) - 1)


def _rounding_high_mul16(a: np.ndarray, b: int) -> np.ndarray:
    """gemmlowp's SaturatingRoundingDoublingHighMul on int16 values (a == b == -32768 saturates)."""
    ab = np.asarray(a, np.int64) * b
    nudge = np.where(ab >= 0, 1 << 14, 1 - (1 << 14))
    v = ab + nudge
    q = np.where(v >= 0, v >> 15, -((-v) >> 15))            # C's division by 2**15: toward zero
    return np.where((np.asarray(a) == b) & (b == -(1 << 15)), (1 << 15) - 1, q)


def _rounding_divide_by_pot(x: np.ndarray, exponent: int) -> np.ndarray:
    if exponent <= 0:
        return x
    mask = (1 << exponent) - 1
    return (x >> exponent) + ((x & mask) > ((mask >> 1) + (x < 0)))


def _hard_swish_values(v: np.ndarray, sx: float, zx: int, sy: float, zy: int) -> np.ndarray:
    """LiteRT's int8/uint8 HARD_SWISH kernel: 16-bit fixed point on a 2**7 finer input scale, the relu-ish factor
    on a [-3, 3] -> [0, 1] scale, its rounding and non-rounding high multiplies and shifts, in that order."""
    hires = np.float32(np.float32(1.0 / 128.0) * np.float32(sx))
    out_q, out_exp = quantize_multiplier(float(np.float32(hires / np.float32(sy))))
    relu_q, relu_exp = quantize_multiplier(float(np.float32(hires / np.float32(3.0 / 32768.0))))
    out_m, relu_m = _q31_to_q15(out_q), _q31_to_q15(relu_q)
    x = (np.asarray(v, np.int64) - zx) * 128
    pre_out = _rounding_high_mul16(x, out_m)
    r = x
    if relu_exp > 0:
        r = _sat16(r * (1 << (relu_exp - 1)))
    r = _rounding_high_mul16(r, relu_m)
    if relu_exp > 0:
        r = _sat16(r * 2)
    if relu_exp < 0:
        r = _rounding_divide_by_pot(r, -relu_exp)
    r = (r + (1 << 15)) >> 1
    prod = r * pre_out
    pre = np.where(prod >= 0, prod >> 15, -((-prod) >> 15))     # SaturatingDoublingHighMul: truncating
    return _rounding_divide_by_pot(pre, -out_exp) + zy


@QUANTIZED.register("HARD_SWISH")
def _hard_swish(ctx, op: Operator) -> None:
    if not _per_tensor(ctx, op):
        return through_float(ctx, op)
    (sx, zx), (sy, zy) = _params_of(ctx.tensor(op.inputs[0])), _params_of(ctx.tensor(op.outputs[0]))
    if quantize_multiplier(float(np.float32(np.float32(np.float32(1.0 / 128.0) * np.float32(sx)) /
                                            np.float32(sy))))[1] > 0:
        return through_float(ctx, op)       # a rescale LiteRT's kernel refuses: the float op
    _unary_table(ctx, op, lambda v: _hard_swish_values(v, sx, zx, sy, zy))


@QUANTIZED.register("PRELU")
def _prelu(ctx, op: Operator) -> None:
    """LiteRT's quantized PRELU with a constant alpha: ``zy + M1(d)`` for ``d = x - zx >= 0``, else
    ``zy + M2(d * (alpha - za))`` (its fixed-point multipliers ``s_x / s_y`` and ``s_x * s_alpha / s_y``): one
    table row per alpha value, indexed by ``(alpha position, x)``."""
    x, al, out = op.inputs[0], op.inputs[1], op.outputs[0]
    alpha = ctx.const(al)
    ta = ctx.tensor(al)
    if alpha is None or not _per_tensor(ctx, op) or not is_quantized(ta) or ta.quantization.scale.size != 1 or \
            ctx.rank(x) != 4 or alpha.ndim > 4:
        return through_float(ctx, op)
    (sx, zx), (sa, za), (sy, zy) = (_params_of(ctx.tensor(i)) for i in (x, al, out))
    lo, hi = RANGES[ctx.tensor(x).dtype]
    olo, ohi = RANGES[ctx.tensor(out).dtype]
    d = np.arange(lo, hi + 1, dtype=np.int64) - zx
    rows = [np.where(d >= 0, multiply_by_quantized_multiplier(d, sx / sy),
                     multiply_by_quantized_multiplier(d * (int(a) - za), sx * sa / sy)) + zy
            for a in np.asarray(alpha).reshape(-1)]
    table = np.clip(np.stack(rows), olo, ohi).astype(ctx.tensor(out).dtype).reshape(-1)
    position = (np.arange(alpha.size, dtype=np.int32) * (hi - lo + 1)).reshape((1,) * (4 - alpha.ndim) + alpha.shape)
    if ctx.layout(x) == NCHW:
        value, layout = ctx.nchw(x), NCHW
        position = np.transpose(position, (0, 3, 1, 2))
    else:
        value, layout = ctx.nhwc(x), "native"
    idx = ctx.emit1("Cast", [value], "prelu_index", to=onnx_dtype("int32"))
    idx = ctx.emit1("Add", [idx, ctx.add_const(np.ascontiguousarray(position - lo), "prelu_rows")], "prelu_index")
    y = ctx.emit1("Gather", [ctx.add_const(table, _hint(ctx.tensor(out)) + "_table"), idx], _hint(ctx.tensor(out)),
                  axis=0)
    ctx.set_output(out, y, layout)


def _binary_params(ctx, op: Operator) -> Optional[List[Tuple[float, int]]]:
    """(scale, zero point) of the two inputs and the output of an 8-bit per-tensor binary op, or None."""
    ts = [ctx.tensor(i) for i in (op.inputs[0], op.inputs[1], op.outputs[0])]
    if any(not is_quantized(t) or t.quantization.scale.size != 1 or t.dtype != ts[2].dtype for t in ts) or \
            ts[2].dtype not in ("int8", "uint8"):
        return None
    return [_params_of(t) for t in ts]


def _integer_operands(ctx, op: Operator, zero_points: Sequence[int]) -> Tuple[List[str], str]:
    """The two inputs in one layout (broadcast as TFLite does) as int32 minus their zero points."""
    names, layout = ctx.aligned(op.inputs[:2])
    out = []
    for name, z in zip(names, zero_points):
        v = ctx.emit1("Cast", [name], "int_operand", to=onnx_dtype("int32"))
        out.append(ctx.emit1("Sub", [v, ctx.add_const(np.array(z, np.int32), "zero_point")], "int_operand")
                   if z else v)
    return out, layout


def _finish_integer(ctx, op: Operator, value: str, layout: str, zy: int, dt: str) -> None:
    """``value`` (integral, of float type ``dt``, before the zero point) into the output's type, saturated, then
    clamped to the fused activation."""
    t = ctx.tensor(op.outputs[0])
    lo, hi = RANGES[t.dtype]
    y = ctx.emit1("Add", [value, ctx.add_const(np.array(zy, dt), "zero_point")], _hint(t) + "_acc")
    y = ctx.emit1("Clip", [y, ctx.add_const(np.array(lo, dt), "qmin"), ctx.add_const(np.array(hi, dt), "qmax")])
    y = ctx.emit1("Cast", [y], _hint(t), to=onnx_dtype(t.dtype))
    ctx.set_output(op.outputs[0], clamp(ctx, y, t, int(op.options.get("fused_activation_function", 0) or 0)),
                   layout)


@QUANTIZED.register("SUB")
def _sub(ctx, op: Operator) -> None:
    """The CPU delegate's 8-bit subtraction: 21-bit multipliers ``a = round(s_a / s_y * 2**shift)`` (and b's),
    ``(d_a * a - d_b * b + 2**(shift - 1)) >> shift``, shift making the larger multiplier 21 bits; int32 sums,
    the shift in float64 (exact). Outside the delegate's scale range: the float op between DQ and Q."""
    p = _binary_params(ctx, op)
    if p is None:
        return through_float(ctx, op)
    (sa, za), (sb, zb), (sy, zy) = p
    ra, rb = np.float32(np.float32(sa) / np.float32(sy)), np.float32(np.float32(sb) / np.float32(sy))
    if not all(2.0 ** -10 <= r < 2.0 ** 8 for r in (ra, rb)):
        return through_float(ctx, op)
    shift = 20 - (int(np.float32(max(ra, rb)).view(np.uint32) >> 23) - 127)
    ma, mb = (int(np.rint(np.float64(r) * 2.0 ** shift)) for r in (ra, rb))
    (a, b), layout = _integer_operands(ctx, op, (za, zb))
    acc = ctx.emit1("Sub", [ctx.emit1("Mul", [a, ctx.add_const(np.array(ma, np.int32), "mult_a")]),
                            ctx.emit1("Mul", [b, ctx.add_const(np.array(mb, np.int32), "mult_b")])], "sub_acc")
    acc = ctx.emit1("Add", [acc, ctx.add_const(np.array(1 << (shift - 1), np.int32), "rounding")], "sub_acc")
    f = ctx.emit1("Cast", [acc], "sub_acc_f64", to=onnx_dtype("float64"))
    f = ctx.emit1("Floor", [ctx.emit1("Mul", [f, ctx.add_const(np.array(2.0 ** -shift), "shift")])], "sub_f64")
    _finish_integer(ctx, op, f, layout, zy, "float64")


@QUANTIZED.register("MUL")
def _mul(ctx, op: Operator) -> None:
    """The CPU delegate's 8-bit product: ``d_a * d_b`` (exact in float32) times ``s_a * s_b / s_y`` (float32, in
    that order), rounded half to even. Outside its scale range: the float op between DQ and Q."""
    p = _binary_params(ctx, op)
    if p is None:
        return through_float(ctx, op)
    (sa, za), (sb, zb), (sy, zy) = p
    scale = np.float32(np.float32(np.float32(sa) * np.float32(sb)) / np.float32(sy))
    if not 2.0 ** -16 <= scale < 2.0 ** 8:
        return through_float(ctx, op)
    (a, b), layout = _integer_operands(ctx, op, (za, zb))
    prod = ctx.emit1("Cast", [ctx.emit1("Mul", [a, b], "mul_prod")], "mul_prod", to=onnx_dtype("float32"))
    v = ctx.emit1("Round", [ctx.emit1("Mul", [prod, ctx.add_const(np.array(scale, np.float32), "mul_scale")])],
                  "mul_round")
    _finish_integer(ctx, op, v, layout, zy, "float32")


@QUANTIZED.register("MEAN")
def _mean(ctx, op: Operator) -> None:
    """A mean over H and W of an 8-bit image: ``Q(GlobalAveragePool(DQ(x)))``, the group the QDQ pass runs as an
    integer sum and one requantize, then the integers reshaped (no keep_dims). Other means: the float one."""
    x, out = op.inputs[0], op.outputs[0]
    axes = None
    if ctx.rank(x) == 4 and ctx.const(op.inputs[1]) is not None:
        axes = sorted({a % 4 for a in ctx.int_list(op.inputs[1], "axes")})
    if axes != [1, 2] or not _per_tensor(ctx, op):
        return through_float(ctx, op)
    t = ctx.tensor(x)
    pooled = ctx.emit1("GlobalAveragePool", [dequantize(ctx, ctx.nchw(x), t)], _hint(ctx.tensor(out)) + "_pool")
    y = quantize(ctx, pooled, ctx.tensor(out))
    if op.options.get("keep_dims"):
        ctx.set_output(out, y, NCHW)
        return
    shape = ctx.add_const(np.array(ctx.shape(out), np.int64), "mean_shape")
    ctx.set_output(out, ctx.emit1("Reshape", [y, shape], _hint(ctx.tensor(out))))


# ---------------------------------------------------------------- ops of their own
@QUANTIZED.register("QUANTIZE")
def _quantize(ctx, op: Operator) -> None:
    refuse_packed(ctx, op)
    src, dst = ctx.tensor(op.inputs[0]), ctx.tensor(op.outputs[0])
    if not is_quantized(dst):
        raise UnsupportedOpError("%s: QUANTIZE into %s without a scale and zero point" % (ctx.where(), dst.dtype))
    const = ctx.const(op.inputs[0])
    if const is not None:
        reals = dequantized(src.quantization, np.asarray(const)) if is_quantized(src) else const
        ctx.set_const(op.outputs[0], quantized_values(dst.quantization, reals, dst.dtype))
        return
    value, layout = ctx.held(op.inputs[0])
    if is_quantized(src):
        same = src.dtype == dst.dtype and np.array_equal(src.quantization.scale, dst.quantization.scale) and \
            np.array_equal(src.quantization.zero_point, dst.quantization.zero_point)
        if same:
            ctx.set_output(op.outputs[0], value, layout)
            return
        if _per_tensor(ctx, op):
            (sx, zx), (sy, zy) = _params_of(src), _params_of(dst)
            ratio = np.float32(np.float32(sx) / np.float32(sy))
            if _delegate_ratio_ok(ratio):
                _unary_table(ctx, op, lambda v: zy + _xnn_scaled(v - zx, ratio))
            else:
                _unary_table(ctx, op, lambda v: zy + multiply_by_quantized_multiplier(v - zx, sx / sy))
            return
        ctx.set_output(op.outputs[0], quantize(ctx, dequantize(ctx, value, src), dst), layout)
        return
    if src.dtype != "float32":
        value = ctx.emit1("Cast", [value], to=onnx_dtype("float32"))
    ctx.set_output(op.outputs[0], quantize_input(ctx, value, dst), layout)


def quantize_input(ctx, value: str, t: Tensor) -> str:
    """Float reals into ``t``'s integers as LiteRT's CPU delegate (XNNPACK) converts them: times the reciprocal of
    the scale, rounded half to even. ``x / scale`` differs from it next to halves, and one step at a model's input
    can grow to several at its output."""
    q = t.quantization
    if q.scale.size != 1:
        return quantize(ctx, value, t)
    inv = ctx.add_const(np.array(np.float32(1.0) / np.float32(q.scale.reshape(-1)[0]), np.float32), "inv_scale")
    one = dataclasses.replace(t, quantization=dataclasses.replace(q, scale=np.ones(1, np.float32)))
    return quantize(ctx, ctx.emit1("Mul", [value, inv], _hint(t) + "_scaled"), one)


@QUANTIZED.register("DEQUANTIZE")
def _dequantize(ctx, op: Operator) -> None:
    refuse_packed(ctx, op)
    src = ctx.tensor(op.inputs[0])
    if not is_quantized(src):
        return _float_converter(op)(ctx, op)
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


def _bias_scales(ctx, op: Operator) -> Dict[int, np.ndarray]:
    """The bias's DQ scale, ``float32(s_x) * s_w``: LiteRT adds the int32 bias to the accumulator as it is."""
    x, w, b = PRODUCTS[op.op]
    if len(op.inputs) <= b or op.inputs[b] < 0:
        return {}
    tx, tw, tb = (ctx.tensor(op.inputs[k]) for k in (x, w, b))
    if not (is_quantized(tx) and is_quantized(tw)) or tb.dtype not in ("int32", "int64"):
        return {}
    return {op.inputs[b]: (np.float32(tx.quantization.scale.reshape(-1)[0]) * tw.quantization.scale).astype(
        np.float32)}


@QUANTIZED.register(*PRODUCTS)
def _product(ctx, op: Operator) -> None:
    refuse_packed(ctx, op)
    x_pos, w_pos, _ = PRODUCTS[op.op]
    tx, tw = ctx.tensor(op.inputs[x_pos]), ctx.tensor(op.inputs[w_pos])
    if not is_quantized(tx) and is_quantized(tw) and HYBRID == "emulate" and op.op != "TRANSPOSE_CONV" and \
            ctx.const(op.inputs[w_pos]) is not None and tw.dtype == "int8":
        _hybrid(ctx, op)
        return
    through_float(ctx, op, _bias_scales(ctx, op))


# ---------------------------------------------------------------- dynamic-range (hybrid) products
class HybridView(FloatView):
    """A float converter's view for a hybrid op: its weights read as their int8 constant, and the ``Conv`` or
    ``Gemm`` it emits on them becomes the hybrid kernel's integer product."""

    def __init__(self, ctx, op: Operator) -> None:
        super().__init__(ctx, op)
        self._weights: Dict[str, Tuple[np.ndarray, np.ndarray, int]] = {}  # name -> (int8 values, scales, axis)
        self._w = op.inputs[PRODUCTS[op.op][1]]
        self._asymmetric = op.op != "FULLY_CONNECTED" or bool(op.options.get("asymmetric_quantize_inputs"))

    def _int_weights(self, perm: Sequence[int], hint: str) -> str:
        t = self._ctx.tensor(self._w)
        values = np.transpose(np.asarray(self._ctx.const(self._w)), perm)
        name = self._ctx.add_const(values, hint or _hint(t))
        self._weights[name] = (values, t.quantization.scale.astype(np.float32), list(perm).index(t.quantization.axis))
        return name

    def transposed_const(self, index: int, perm: Sequence[int], hint: str = "") -> str:
        if index == self._w:
            return self._int_weights(perm, hint)
        return super().transposed_const(index, perm, hint)

    def nhwc(self, index: int) -> str:
        if index == self._w:
            return self._int_weights(list(range(self._ctx.rank(index))), "")
        return super().nhwc(index)

    def emit1(self, op_type: str, inputs: Sequence[str], hint: str = "", **attrs) -> str:
        if op_type in ("Conv", "Gemm") and len(inputs) > 1 and inputs[1] in self._weights:
            return _hybrid_product(self._ctx, op_type, list(inputs), self._weights[inputs[1]], self._asymmetric,
                                   attrs)
        return self._ctx.emit1(op_type, inputs, hint, **attrs)


def _hybrid(ctx, op: Operator) -> None:
    fn = _float_converter(op)
    view = HybridView(ctx, op)      # its float output keeps the fused activation (the float converter's)
    fn(view, op)


def _c(ctx, value, hint: str, dtype=np.float32) -> str:
    return ctx.add_const(np.asarray(value, dtype), hint)


def _hybrid_product(ctx, op_type: str, ins: List[str], weights: Tuple[np.ndarray, np.ndarray, int],
                    asymmetric: bool, attrs: dict) -> str:
    """The hybrid kernel on the float input ``ins[0]`` and the int8 weights ``ins[1]`` (scales along their
    output axis), plus the float bias ``ins[2]`` if any."""
    w, sw, _ = weights
    f32 = onnx_dtype("float32")
    x = ins[0]
    if op_type == "Conv":
        # asymmetric int8 per batch (uint8 here, the same integers moved by 128: DynamicQuantizeLinear)
        xq, sx, zx = ctx.emit("DynamicQuantizeLinear", [x], "hybrid_x", outputs=3)
        acc = ctx.emit1("ConvInteger", [xq, ins[1], zx], "hybrid_acc", **attrs)
        scale = ctx.emit1("Mul", [sx, _c(ctx, sw.reshape(1, -1, 1, 1), "hybrid_w_scale")], "hybrid_scale")
        y = ctx.emit1("Mul", [ctx.emit1("Cast", [acc], "hybrid_accf", to=f32), scale], "hybrid_y")
        if len(ins) > 2:
            bias = ctx.emit1("Reshape", [ins[2], _c(ctx, [1, -1, 1, 1], "bias_shape", np.int64)], "hybrid_bias")
            y = ctx.emit1("Add", [y, bias], "hybrid_y")
        return y
    # Gemm(x (M, K), w (N, K), transB=1): one scale (and offset) per row of x
    if attrs.get("transA") or not attrs.get("transB", 0) or attrs.get("alpha", 1.0) != 1.0 or \
            attrs.get("beta", 1.0) != 1.0:
        raise UnsupportedOpError("hybrid FULLY_CONNECTED: Gemm attributes %s" % attrs)
    wt = ctx.add_const(np.ascontiguousarray(w.T), "hybrid_w_t")
    axes = _c(ctx, [1], "axes", np.int64)
    tiny = _c(ctx, np.finfo(np.float32).tiny, "tiny")
    if asymmetric:
        zero = _c(ctx, 0.0, "zero")
        lo = ctx.emit1("Min", [ctx.emit1("ReduceMin", [x, axes], "hybrid_min", keepdims=1), zero], "hybrid_rmin")
        hi = ctx.emit1("Max", [ctx.emit1("ReduceMax", [x, axes], "hybrid_max", keepdims=1), zero], "hybrid_rmax")
        sx = ctx.emit1("Max", [ctx.emit1("Div", [ctx.emit1("Sub", [hi, lo]), _c(ctx, 255.0, "levels")]), tiny],
                       "hybrid_sx")
        zx = ctx.emit1("Round", [ctx.emit1("Sub", [_c(ctx, -128.0, "qmin"), ctx.emit1("Div", [lo, sx])])], "hybrid_zx")
        zx = ctx.emit1("Clip", [zx, _c(ctx, -128.0, "qmin"), _c(ctx, 127.0, "qmax")], "hybrid_zx")
    else:
        amax = ctx.emit1("ReduceMax", [ctx.emit1("Abs", [x]), axes], "hybrid_absmax", keepdims=1)
        sx = ctx.emit1("Div", [ctx.emit1("Max", [amax, tiny]), _c(ctx, 127.0, "levels")], "hybrid_sx")
        zx = None
    q = ctx.emit1("Round", [ctx.emit1("Div", [x, sx])], "hybrid_q")
    if zx is not None:
        q = ctx.emit1("Add", [q, zx], "hybrid_q")
    q = ctx.emit1("Clip", [q, _c(ctx, -128.0, "qmin"), _c(ctx, 127.0, "qmax")], "hybrid_q")
    q = ctx.emit1("Cast", [q], "hybrid_q8", to=onnx_dtype("int8"))
    acc = ctx.emit1("Cast", [ctx.emit1("MatMulInteger", [q, wt], "hybrid_acc")], "hybrid_accf", to=f32)
    if zx is not None:      # the offset's share: zx * (sum of each output's weights)
        rows = _c(ctx, w.astype(np.int64).sum(axis=1).astype(np.float32), "hybrid_w_sums")
        acc = ctx.emit1("Sub", [acc, ctx.emit1("Mul", [zx, rows])], "hybrid_acc")
    y = ctx.emit1("Mul", [ctx.emit1("Mul", [acc, sx]), _c(ctx, sw.reshape(-1), "hybrid_w_scale")], "hybrid_y")
    if len(ins) > 2:
        y = ctx.emit1("Add", [y, ins[2]], "hybrid_y")
    return y
