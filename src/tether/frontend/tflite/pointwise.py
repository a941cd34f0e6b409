"""Elementwise math, comparisons, logic and selection: unary ops keep their input's layout, broadcasting ops
take their inputs in one common layout (``Context.aligned``), so none of them adds a Transpose.

Semantics follow LiteRT's kernels where ONNX differs: FLOOR_DIV and FLOOR_MOD round toward negative infinity
(ONNX's integer Div truncates, and its float Mod needs fmod=1), ROUND is half to even (ONNX Round), RSQRT is
1 / sqrt(x), SELECT with a rank-1 condition picks whole rows of higher-rank operands, ATAN2 is atan(y / x) moved by
+-pi into the quadrant, FAKE_QUANT rounds onto TensorFlow's nudged grid (narrow range refused, as LiteRT does).
"""
from __future__ import annotations

import numpy as np

from tether.errors import UnsupportedOpError
from tether.frontend.tflite.state import NATIVE, onnx_dtype
from tether.frontend.tflite.table import ConverterTable

CONVERTERS = ConverterTable("tflite pointwise")

_UNARY = {"ABS": "Abs", "EXP": "Exp", "LOG": "Log", "SQRT": "Sqrt", "NEG": "Neg", "SIN": "Sin", "COS": "Cos",
          "FLOOR": "Floor", "CEIL": "Ceil", "ROUND": "Round", "SIGN": "Sign", "LOGICAL_NOT": "Not"}


def _unary(ctx, op) -> None:
    x, layout = ctx.held(op.inputs[0])
    ctx.set_output(op.outputs[0], ctx.emit1(_UNARY[op.op], [x]), layout)


for _op in _UNARY:
    CONVERTERS.add(_op, _unary)


@CONVERTERS.register("RSQRT")
def _rsqrt(ctx, op) -> None:
    x, layout = ctx.held(op.inputs[0])
    ctx.set_output(op.outputs[0], ctx.emit1("Reciprocal", [ctx.emit1("Sqrt", [x])]), layout)


@CONVERTERS.register("SQUARE")
def _square(ctx, op) -> None:
    x, layout = ctx.held(op.inputs[0])
    ctx.set_output(op.outputs[0], ctx.emit1("Mul", [x, x]), layout)


@CONVERTERS.register("ZEROS_LIKE", "ONES_LIKE")
def _fill_like(ctx, op) -> None:
    x, layout = ctx.held(op.inputs[0])
    dtype = ctx.tensor(op.outputs[0]).dtype
    value = np.array([0 if op.op == "ZEROS_LIKE" else 1], dtype)
    from onnx import numpy_helper

    y = ctx.emit1("ConstantOfShape", [ctx.emit1("Shape", [x])], value=numpy_helper.from_array(value))
    ctx.set_output(op.outputs[0], y, layout)


_BINARY = {"POW": "Pow", "MAXIMUM": "Max", "MINIMUM": "Min", "EQUAL": "Equal", "LESS": "Less",
           "LESS_EQUAL": "LessOrEqual", "GREATER": "Greater", "GREATER_EQUAL": "GreaterOrEqual",
           "LOGICAL_AND": "And", "LOGICAL_OR": "Or"}


def _binary(ctx, op) -> None:
    names, layout = ctx.aligned(op.inputs[:2])
    ctx.set_output(op.outputs[0], ctx.emit1(_BINARY[op.op], names), layout)


for _op in _BINARY:
    CONVERTERS.add(_op, _binary)


@CONVERTERS.register("NOT_EQUAL")
def _not_equal(ctx, op) -> None:
    names, layout = ctx.aligned(op.inputs[:2])
    ctx.set_output(op.outputs[0], ctx.emit1("Not", [ctx.emit1("Equal", names)]), layout)


@CONVERTERS.register("SQUARED_DIFFERENCE")
def _squared_difference(ctx, op) -> None:
    names, layout = ctx.aligned(op.inputs[:2])
    d = ctx.emit1("Sub", names)
    ctx.set_output(op.outputs[0], ctx.emit1("Mul", [d, d]), layout)


def _zero(ctx, dtype: str) -> str:
    return ctx.add_const(np.array(0, dtype), "zero")


def _is_float(dtype: str) -> bool:
    return np.dtype(dtype).kind == "f"


@CONVERTERS.register("FLOOR_DIV")
def _floor_div(ctx, op) -> None:
    names, layout = ctx.aligned(op.inputs[:2])
    a, b = names
    dtype = ctx.tensor(op.outputs[0]).dtype
    if _is_float(dtype):
        ctx.set_output(op.outputs[0], ctx.emit1("Floor", [ctx.emit1("Div", [a, b])]), layout)
        return
    ctx.set_output(op.outputs[0], _int_floor_div(ctx, a, b, dtype), layout)


def _int_floor_div(ctx, a: str, b: str, dtype: str) -> str:
    # integer Div truncates toward zero: step down by one where the remainder is nonzero and its sign differs
    # from the divisor's
    q = ctx.emit1("Div", [a, b])
    r = ctx.emit1("Sub", [a, ctx.emit1("Mul", [q, b])])
    zero = _zero(ctx, dtype)
    fix = ctx.emit1("And", [ctx.emit1("Not", [ctx.emit1("Equal", [r, zero])]),
                            ctx.emit1("Xor", [ctx.emit1("Less", [r, zero]), ctx.emit1("Less", [b, zero])])])
    one = ctx.add_const(np.array(1, dtype), "one")
    return ctx.emit1("Sub", [q, ctx.emit1("Where", [fix, one, zero])])


@CONVERTERS.register("RIGHT_SHIFT")
def _right_shift(ctx, op) -> None:
    """x >> y, the shift clamped to the type's width less one as LiteRT clamps it: ONNX BitShift for unsigned types;
    for signed ones the arithmetic shift, floor(x / 2**y), in int64."""
    names, layout = ctx.aligned(op.inputs[:2])
    x, y = names
    dtype = ctx.tensor(op.outputs[0]).dtype
    ydtype = ctx.tensor(op.inputs[1]).dtype
    y = ctx.emit1("Min", [y, ctx.add_const(np.array(np.dtype(dtype).itemsize * 8 - 1, ydtype), "widest_shift")])
    if np.dtype(dtype).kind == "u":
        if ydtype != dtype:
            y = ctx.emit1("Cast", [y], to=onnx_dtype(dtype))
        ctx.set_output(op.outputs[0], ctx.emit1("BitShift", [x, y], direction="RIGHT"), layout)
        return
    power = ctx.emit1("BitShift", [ctx.add_const(np.array(1, np.uint64), "one"),
                                   ctx.emit1("Cast", [y], to=onnx_dtype("uint64"))], direction="LEFT")
    q = _int_floor_div(ctx, ctx.emit1("Cast", [x], to=onnx_dtype("int64")),
                       ctx.emit1("Cast", [power], to=onnx_dtype("int64")), "int64")
    ctx.set_output(op.outputs[0], q if dtype == "int64" else ctx.emit1("Cast", [q], to=onnx_dtype(dtype)), layout)


@CONVERTERS.register("FLOOR_MOD")
def _floor_mod(ctx, op) -> None:
    names, layout = ctx.aligned(op.inputs[:2])
    a, b = names
    dtype = ctx.tensor(op.outputs[0]).dtype
    if not _is_float(dtype):
        # integer Mod with fmod=0 takes the divisor's sign, as floor division's remainder does
        ctx.set_output(op.outputs[0], ctx.emit1("Mod", [a, b], fmod=0), layout)
        return
    # LiteRT: fmod, then moved into the divisor's sign when nonzero and of the other sign
    m = ctx.emit1("Mod", [a, b], fmod=1)
    zero = _zero(ctx, dtype)
    fix = ctx.emit1("And", [ctx.emit1("Not", [ctx.emit1("Equal", [m, zero])]),
                            ctx.emit1("Xor", [ctx.emit1("Less", [m, zero]), ctx.emit1("Less", [b, zero])])])
    ctx.set_output(op.outputs[0], ctx.emit1("Where", [fix, ctx.emit1("Add", [m, b]), m]), layout)


@CONVERTERS.register("ADD_N")
def _add_n(ctx, op) -> None:
    names, layout = ctx.aligned(list(op.inputs))
    ctx.set_output(op.outputs[0], ctx.emit1("Sum", names) if len(names) > 1 else ctx.emit1("Identity", names),
                   layout)


@CONVERTERS.register("SELECT", "SELECT_V2")
def _select(ctx, op) -> None:
    cond, x, y = op.inputs[:3]
    if op.op == "SELECT" and ctx.rank(cond) == 1 and ctx.rank(x) > 1:
        # a rank-1 condition chooses rows: it runs along axis 0, not broadcast against the last axis
        c = ctx.emit1("Reshape", [ctx.nhwc(cond), ctx.add_const(
            np.array([-1] + [1] * (ctx.rank(x) - 1), np.int64), "rows")])
        ctx.set_output(op.outputs[0], ctx.emit1("Where", [c, ctx.nhwc(x), ctx.nhwc(y)]), NATIVE)
        return
    names, layout = ctx.aligned([cond, x, y])
    ctx.set_output(op.outputs[0], ctx.emit1("Where", names), layout)


@CONVERTERS.register("FILL")
def _fill(ctx, op) -> None:
    dims, value = op.inputs[:2]
    shape = ctx.emit1("Cast", [ctx.nhwc(dims)], to=onnx_dtype("int64"))
    ctx.set_output(op.outputs[0], ctx.emit1("Expand", [ctx.nhwc(value), shape]))


@CONVERTERS.register("RANGE")
def _range(ctx, op) -> None:
    dtype = ctx.tensor(op.outputs[0]).dtype
    args = []
    for i in op.inputs[:3]:
        v = ctx.emit1("Reshape", [ctx.nhwc(i), ctx.add_const(np.zeros((0,), np.int64), "scalar")])
        if ctx.tensor(i).dtype != dtype:
            v = ctx.emit1("Cast", [v], to=onnx_dtype(dtype))
        args.append(v)
    ctx.set_output(op.outputs[0], ctx.emit1("Range", args))


@CONVERTERS.register("ATAN2")
def _atan2(ctx, op) -> None:
    # atan(y / x), moved by +-pi into the left half-plane; x == 0 gives +-pi/2 by y's sign (0 for y == 0)
    names, layout = ctx.aligned(op.inputs[:2])
    y, x = names
    dtype = ctx.tensor(op.outputs[0]).dtype
    zero = _zero(ctx, dtype)
    pi = ctx.add_const(np.array(np.pi, dtype), "pi")
    half_pi = ctx.add_const(np.array(np.pi / 2, dtype), "half_pi")
    x_zero = ctx.emit1("Equal", [x, zero])
    safe_x = ctx.emit1("Where", [x_zero, ctx.add_const(np.array(1, dtype), "one"), x])
    base = ctx.emit1("Atan", [ctx.emit1("Div", [y, safe_x])])
    turn = ctx.emit1("Where", [ctx.emit1("Less", [y, zero]), ctx.emit1("Neg", [pi]), pi])
    left = ctx.emit1("Where", [ctx.emit1("Less", [x, zero]), ctx.emit1("Add", [base, turn]), base])
    axis = ctx.emit1("Mul", [ctx.emit1("Sign", [y]), half_pi])
    ctx.set_output(op.outputs[0], ctx.emit1("Where", [x_zero, axis, left]), layout)


@CONVERTERS.register("BITWISE_XOR")
def _bitwise_xor(ctx, op) -> None:
    names, layout = ctx.aligned(op.inputs[:2])
    ctx.set_output(op.outputs[0], ctx.emit1("BitwiseXor", names), layout)


def fake_quant_range(lo: float, hi: float, bits: int, narrow: bool):
    """(nudged min, nudged max, scale) of TensorFlow's fake quantization: the zero point moved onto the integer
    grid (rounded half away from zero), the range shifted with it."""
    qmin, qmax = (1 if narrow else 0), (1 << bits) - 1
    lo32, hi32 = np.float32(lo), np.float32(hi)
    scale = np.float32((hi32 - lo32) / np.float32(qmax - qmin))
    zp_from_min = np.float32(qmin) - lo32 / scale
    if zp_from_min < qmin:
        zp = np.float32(qmin)
    elif zp_from_min > qmax:
        zp = np.float32(qmax)
    else:
        zp = np.float32(np.sign(zp_from_min) * np.floor(np.abs(zp_from_min) + 0.5))
    return np.float32((qmin - zp) * scale), np.float32((qmax - zp) * scale), scale


@CONVERTERS.register("FAKE_QUANT")
def _fake_quant(ctx, op) -> None:
    o = op.options
    if o.get("narrow_range"):
        # LiteRT refuses it too: narrow range is meant for weights, which a converted model holds quantized
        raise UnsupportedOpError("%s: FAKE_QUANT with narrow_range on activations" % ctx.where())
    lo, hi, scale = fake_quant_range(float(o.get("min", 0.0)), float(o.get("max", 0.0)),
                                     int(o.get("num_bits", 8) or 8), bool(o.get("narrow_range", False)))
    x, layout = ctx.held(op.inputs[0])
    const = lambda v, hint: ctx.add_const(np.array(v, np.float32), hint)       # noqa: E731
    clamped = ctx.emit1("Clip", [x, const(lo, "fq_min"), const(hi, "fq_max")])
    steps = ctx.emit1("Mul", [ctx.emit1("Sub", [clamped, const(lo, "fq_min")]), const(np.float32(1) / scale,
                                                                                      "fq_inv_scale")])
    # the shifted value is >= 0: half away from zero is floor(v + 0.5)
    rounded = ctx.emit1("Floor", [ctx.emit1("Add", [steps, const(0.5, "half")])])
    y = ctx.emit1("Add", [ctx.emit1("Mul", [rounded, const(scale, "fq_scale")]), const(lo, "fq_min")])
    ctx.set_output(op.outputs[0], y, layout)


@CONVERTERS.register("BUCKETIZE")
def _bucketize(ctx, op) -> None:
    """LiteRT's index is ``upper_bound(boundaries, x)``: the count of boundaries <= x (all of them for a NaN, as
    ``x < b`` is false), compared as C++ compares the value with a float boundary (an integer becomes a float)."""
    bounds = [float(b) for b in op.options.get("boundaries") or []]
    if any(b > a for a, b in zip(bounds[1:], bounds)):
        raise UnsupportedOpError("%s: boundaries %s are not sorted (LiteRT expects sorted ones)"
                                 % (ctx.where(), bounds))
    dtype = ctx.tensor(op.inputs[0]).dtype
    if dtype not in ("float32", "float64", "int32", "int64"):
        raise UnsupportedOpError("%s: a %s input (expected float32, float64, int32 or int64)" % (ctx.where(), dtype))
    x, layout = ctx.held(op.inputs[0])
    if not bounds:
        from onnx import numpy_helper

        zeros = ctx.emit1("ConstantOfShape", [ctx.emit1("Shape", [x])],
                          value=numpy_helper.from_array(np.array([0], np.int32)))
        ctx.set_output(op.outputs[0], zeros, layout)
        return
    compare = "float64" if dtype == "float64" else "float32"
    if dtype != compare:
        x = ctx.emit1("Cast", [x], to=onnx_dtype(compare))
    column = ctx.emit1("Unsqueeze", [x, ctx.add_const(np.array([-1], np.int64), "axes")])
    below = ctx.emit1("Not", [ctx.emit1("Less", [column, ctx.add_const(np.array(bounds, compare), "boundaries")])])
    count = ctx.emit1("ReduceSum", [ctx.emit1("Cast", [below], to=onnx_dtype("int32")),
                                    ctx.add_const(np.array([-1], np.int64), "axes")], keepdims=0)
    ctx.set_output(op.outputs[0], count, layout)
