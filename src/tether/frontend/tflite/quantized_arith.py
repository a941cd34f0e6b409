"""Quantized ops written as LiteRT's own integer arithmetic, where it differs from the float op rounded once, so
that tether's integers are LiteRT's. The reference is LiteRT's default CPU path: its XNNPACK delegate where that
takes the op, its builtin kernels elsewhere.

- QUANTIZE of floats: ``x * (1 / scale)`` rounded half to even (the delegate's convert), not ``x / scale``;
  int->int requantization, RELU/RELU6/RELU_N1_TO_1/RELU_0_TO_1 (the builtin double-rounding fixed-point
  multiplier), LEAKY_RELU (the delegate's 8-bit multipliers), HARD_SWISH (the builtin 16-bit fixed-point kernel)
  and PRELU with a constant alpha (fixed point, a row per alpha value): 256-entry tables read by ``Gather``;
- SUB: the delegate's 21-bit fixed-point sum in int32; MUL: the exact integer product times ``s_a * s_b / s_y``
  in float32, rounded half to even;
- AVERAGE_POOL_2D: the window mean of the raw integers, rounded half away from zero (``quantized.RAW_OPS``);
  RESIZE_BILINEAR: the delegate's 11-bit weights and round-half-up shift, all in int32;
- MEAN over H and W: the QDQ global-pooling group (an integer sum and one requantize); over other axes: the sum
  of the raw integers less ``n * z_x`` times ``s_x / (s_y * n)``, rounded half to even.

An op outside the cases an arithmetic covers (per-channel tensors, scales the delegate refuses, run-time alphas)
goes through ``quantized.through_float``: the float op between DQ and Q, LiteRT's result within a step.
"""
from __future__ import annotations

import dataclasses
from typing import List, Optional, Sequence, Tuple

import numpy as np

from tether.errors import UnsupportedOpError
from tether.frontend.tflite.flatbuffer import Operator, Tensor
from tether.frontend.tflite.quantized import (RANGES, clamp, dequantize, dequantized, is_quantized, quantize,
                                              quantized_values, refuse_packed, round_away, same_params,
                                              tensor_hint, through_float)
from tether.frontend.tflite.state import NCHW, onnx_dtype
from tether.frontend.tflite.table import ConverterTable

QUANTIZED = ConverterTable("tflite quantized arithmetic")


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
    idx = ctx.emit1("Cast", [x], tensor_hint(src) + "_index", to=onnx_dtype("int32"))
    if lo:
        idx = ctx.emit1("Sub", [idx, ctx.add_const(np.array(lo, np.int32), "table_base")], tensor_hint(src) + "_index")
    y = ctx.emit1("Gather", [ctx.add_const(table, tensor_hint(dst) + "_table"), idx], tensor_hint(dst), axis=0)
    ctx.set_output(op.outputs[0], y, layout)


def params_of(t: Tensor) -> Tuple[float, int]:
    return float(t.quantization.scale.reshape(-1)[0]), int(t.quantization.zero_point.reshape(-1)[0])


def per_tensor_8bit(ctx, op: Operator) -> bool:
    return all(is_quantized(ctx.tensor(i)) and ctx.tensor(i).quantization.scale.size == 1
               and ctx.tensor(i).dtype in ("int8", "uint8") for i in (op.inputs[0], op.outputs[0]))


_RELU_BOUNDS = {"RELU": (0.0, None), "RELU6": (0.0, 6.0), "RELU_N1_TO_1": (-1.0, 1.0), "RELU_0_TO_1": (0.0, 1.0)}


@QUANTIZED.register(*_RELU_BOUNDS)
def _relu(ctx, op: Operator) -> None:
    """LiteRT's quantized ReluX: the input rescaled to the output's scale (its fixed-point multiplier), then
    clamped to the bounds quantized (an identity rescale when the parameters agree: the delegate's clamp)."""
    if not per_tensor_8bit(ctx, op):
        return through_float(ctx, op)
    (sx, zx), (sy, zy) = params_of(ctx.tensor(op.inputs[0])), params_of(ctx.tensor(op.outputs[0]))
    lo_real, hi_real = _RELU_BOUNDS[op.op]
    olo, ohi = RANGES[ctx.tensor(op.outputs[0]).dtype]
    lo = max(olo, zy + int(round_away(np.float32(lo_real) / np.float32(sy))))
    hi = ohi if hi_real is None else min(ohi, zy + int(round_away(np.float32(hi_real) / np.float32(sy))))
    _unary_table(ctx, op, lambda v: np.clip(zy + multiply_by_quantized_multiplier(v - zx, sx / sy), lo, hi))


@QUANTIZED.register("LEAKY_RELU")
def _leaky_relu(ctx, op: Operator) -> None:
    if not per_tensor_8bit(ctx, op):
        return through_float(ctx, op)
    (sx, zx), (sy, zy) = params_of(ctx.tensor(op.inputs[0])), params_of(ctx.tensor(op.outputs[0]))
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
    if not (same_params(ctx, op) and ctx.rank(x) == 4 and ctx.tensor(x).dtype in ("int8", "uint8")):
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
    # floor((acc + 2**21) / 2**22) in int32: |acc| <= 255 * 2**22 (a pixel times the two weights' product
    # 2**22), so acc + 2**21 + 2**30 lies in (0, 2**31), where a truncating division is the floor
    y = ctx.emit1("Add", [acc, ctx.add_const(np.array((1 << 21) + (1 << 30), np.int32), "resize_round")],
                  "resize_acc")
    y = ctx.emit1("Sub", [ctx.emit1("Div", [y, ctx.add_const(np.array(1 << 22, np.int32), "resize_q22")]),
                          ctx.add_const(np.array(1 << 8, np.int32), "resize_bias")], "resize_q")
    y = ctx.emit1("Cast", [y], tensor_hint(ctx.tensor(out)), to=onnx_dtype(ctx.tensor(out).dtype))
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
    if not per_tensor_8bit(ctx, op):
        return through_float(ctx, op)
    (sx, zx), (sy, zy) = params_of(ctx.tensor(op.inputs[0])), params_of(ctx.tensor(op.outputs[0]))
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
    if alpha is None or not per_tensor_8bit(ctx, op) or not is_quantized(ta) or ta.quantization.scale.size != 1 or \
            ctx.rank(x) != 4 or alpha.ndim > 4:
        return through_float(ctx, op)
    (sx, zx), (sa, za), (sy, zy) = (params_of(ctx.tensor(i)) for i in (x, al, out))
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
    name = tensor_hint(ctx.tensor(out))
    y = ctx.emit1("Gather", [ctx.add_const(table, name + "_table"), idx], name, axis=0)
    ctx.set_output(out, y, layout)


def _binary_params(ctx, op: Operator) -> Optional[List[Tuple[float, int]]]:
    """(scale, zero point) of the two inputs and the output of an 8-bit per-tensor binary op, or None."""
    ts = [ctx.tensor(i) for i in (op.inputs[0], op.inputs[1], op.outputs[0])]
    if any(not is_quantized(t) or t.quantization.scale.size != 1 or t.dtype != ts[2].dtype for t in ts) or \
            ts[2].dtype not in ("int8", "uint8"):
        return None
    return [params_of(t) for t in ts]


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
    y = ctx.emit1("Add", [value, ctx.add_const(np.array(zy, dt), "zero_point")], tensor_hint(t) + "_acc")
    y = ctx.emit1("Clip", [y, ctx.add_const(np.array(lo, dt), "qmin"), ctx.add_const(np.array(hi, dt), "qmax")])
    y = ctx.emit1("Cast", [y], tensor_hint(t), to=onnx_dtype(t.dtype))
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


def _mean_of_integers(ctx, op: Operator) -> None:
    """LiteRT's 8-bit mean over any axes: the sum of the integers less ``n * z_x`` (exact in float32), times
    ``s_x / (s_y * n)``, rounded half to even: the float converter's SUM on the raw integers, then that one
    multiply (no multiply-add a compiler could contract)."""
    x, out = op.inputs[0], op.outputs[0]
    (sx, zx), (sy, zy) = params_of(ctx.tensor(x)), params_of(ctx.tensor(out))
    shape = ctx.shape(x)
    axes = {a % len(shape) for a in ctx.int_list(op.inputs[1], "axes")} if shape else set()
    n = int(np.prod([shape[a] for a in axes])) if axes else 1
    m = np.float32(np.float32(sx) / (np.float32(sy) * np.float32(n)))

    def requantize(c, value: str, t: Tensor) -> str:
        v = c.emit1("Sub", [value, c.add_const(np.array(zx * n, np.float32), "mean_offset")], "mean_sum")
        v = c.emit1("Round", [c.emit1("Mul", [v, c.add_const(np.array(m, np.float32), "mean_scale")])])
        lo, hi = RANGES[t.dtype]
        v = c.emit1("Add", [v, c.add_const(np.array(zy, np.float32), "zero_point")], "mean_q")
        v = c.emit1("Clip", [v, c.add_const(np.array(lo, np.float32), "qmin"),
                             c.add_const(np.array(hi, np.float32), "qmax")])
        return c.emit1("Cast", [v], tensor_hint(t), to=onnx_dtype(t.dtype))

    through_float(ctx, dataclasses.replace(op, op="SUM"), raw=requantize)


@QUANTIZED.register("MEAN")
def _mean(ctx, op: Operator) -> None:
    """A mean over H and W of an 8-bit image: ``Q(GlobalAveragePool(DQ(x)))``, the group the QDQ pass runs as an
    integer sum and one requantize, then the integers reshaped (no keep_dims). Over other axes: see
    ``_mean_of_integers``."""
    x, out = op.inputs[0], op.outputs[0]
    axes = None
    if ctx.rank(x) == 4 and ctx.const(op.inputs[1]) is not None:
        axes = sorted({a % 4 for a in ctx.int_list(op.inputs[1], "axes")})
    if not per_tensor_8bit(ctx, op):
        return through_float(ctx, op)
    if axes != [1, 2]:
        _mean_of_integers(ctx, op)
        return
    t = ctx.tensor(x)
    pooled = ctx.emit1("GlobalAveragePool", [dequantize(ctx, ctx.nchw(x), t)], tensor_hint(ctx.tensor(out)) + "_pool")
    y = quantize(ctx, pooled, ctx.tensor(out))
    if op.options.get("keep_dims"):
        ctx.set_output(out, y, NCHW)
        return
    shape = ctx.add_const(np.array(ctx.shape(out), np.int64), "mean_shape")
    ctx.set_output(out, ctx.emit1("Reshape", [y, shape], tensor_hint(ctx.tensor(out))))


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
        if per_tensor_8bit(ctx, op):
            (sx, zx), (sy, zy) = params_of(src), params_of(dst)
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
    return quantize(ctx, ctx.emit1("Mul", [value, inv], tensor_hint(t) + "_scaled"), one)
