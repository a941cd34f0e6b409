"""Converters of the onnxruntime contrib ops (domain ``com.microsoft``) that ``quantize_static`` writes in the
QOperator form: QLinearAdd, QLinearMul, QLinearGlobalAveragePool, QGemm, QLinearConcat and
QLinearSigmoid, computed as onnxruntime's CPU kernels do:

- QLinearAdd: ``round(float(a - za) * (sa / sc) + float(b - zb) * (sb / sc)) + zc`` (MLAS QLinearAdd);
- QLinearGlobalAveragePool: ``requantize(sum(x) - zx * HW, sx / (sy * HW), zy)`` over int32 sums;
- QGemm: the integer product plus the int32 bias, requantized with ``alpha * sa * sb / sy`` (or scaled to float
  when there is no ``y_scale``);
- QLinearMul, QLinearConcat and QLinearSigmoid: dequantize, the float op, quantize (onnxruntime's lookup tables
  are built the same way);
- MatMulIntegerToFloat and DynamicQuantizeMatMul (what onnxruntime fuses quantize_dynamic's MatMuls into):
  ``float(acc) * (sa * sb) + bias``, A quantized as DynamicQuantizeLinear does for the latter.
"""
from __future__ import annotations

import types

import numpy as np

from tether.errors import UnsupportedOpError
from tether.frontend.onnx import quantized
from tether.frontend.onnx.importer import ConverterTable, emit_reshape, node_output, norm_axis
from tether.frontend.onnx.quantized import (PRODUCT_DTYPES, check_dtype, check_scale, int_matmul, minus_zero_point,
                                            optional_input, zero_point_const)
from tether.kernels.quantize_ops import qadd_constants, qadd_fixed_point_constants

CONVERTERS = ConverterTable(__name__)

MS = "com.microsoft."


def scalar_param(im, node, v: str, what: str) -> str:
    """``v`` reshaped to a scalar; UnsupportedOpError when it has more than one value."""
    if int(np.prod(im.type(v).shape, dtype=np.int64)) != 1:
        raise UnsupportedOpError("node %s: %s with a per-channel %s (onnxruntime takes one value)"
                                 % (node.name, node.op_type, what))
    return emit_reshape(im, v, ())


def zero_point_or_zero(im, node, zp, like: str) -> str:
    """The scalar zero point ``zp``, or a zero of ``like``'s dtype when it is omitted."""
    return scalar_param(im, node, zp, "zero point") if zp else zero_point_const(im, str(im.type(like).dtype))


def _f32(im, value: float) -> str:
    return im.add_const(np.array(value, np.float32))


def dequantize_per_tensor(im, node, x: str, s: str, z) -> str:
    """float ``x`` from int8/uint8 ``x`` with one scale ``s`` and zero point ``z`` (optional)."""
    check_dtype(im, node, x, PRODUCT_DTYPES, "an input")
    check_scale(im, node, s)
    return im.emit("dequantize", [x, scalar_param(im, node, s, "scale"), zero_point_or_zero(im, node, z, x)])


def quantize_per_tensor(im, node, v: str, s: str, z, like: str, out_dtype: str = "") -> str:
    """Float ``v`` quantized with one scale and zero point into the node's output, of ``like``'s dtype unless
    ``out_dtype`` is given."""
    check_scale(im, node, s)
    dt = out_dtype or str(im.type(like).dtype)
    return im.emit("quantize", [v, scalar_param(im, node, s, "scale"), zero_point_or_zero(im, node, z, like)],
                   {"dtype": dt}, node.name, node_output(node))


def _qlinear_add(im, node, ins, a):
    A, sa, za, B, sb, zb, sc = ins[:7]
    zc = optional_input(ins, 7)
    for x in (A, B):
        check_dtype(im, node, x, PRODUCT_DTYPES, "an input")
    for s in (sa, sb, sc):
        check_scale(im, node, s)
    sa, sb, sc = (scalar_param(im, node, s, "scale") for s in (sa, sb, sc))
    za, zb, zc = (zero_point_or_zero(im, node, za, A), zero_point_or_zero(im, node, zb, B),
                  zero_point_or_zero(im, node, zc, A))
    rounding = a.get("rounding", "mlas")
    rounding = rounding.decode() if isinstance(rounding, bytes) else str(rounding)
    if rounding == "xnnpack":
        emit_fixed_point_qadd(im, node, A, B, sa, za, sb, zb, sc, zc)
        return
    if rounding != "mlas":
        raise UnsupportedOpError("node %s: QLinearAdd rounding %r (tether reads 'mlas', onnxruntime's, and 'xnnpack', "
                                 "XNNPACK's fixed-point sum)" % (node.name, rounding))
    emit_qadd(im, A, B, sa, za, sb, zb, sc, zc, node.name, node_output(node))


def emit_fixed_point_qadd(im, node, A: str, B: str, sa: str, za: str, sb: str, zb: str, sc: str, zc: str) -> str:
    """QLinearAdd rounded as XNNPACK's 8-bit addition (LiteRT's default CPU path), which the TFLite frontend asks
    for with ``rounding="xnnpack"``: its parameters need constant scales and zero points in its ratio range."""
    values = [im.const(v) for v in (sa, za, sb, zb, sc, zc)]
    consts = qadd_fixed_point_constants(*values) if all(v is not None for v in values) else None
    if consts is None:
        raise UnsupportedOpError("node %s: QLinearAdd with rounding='xnnpack' needs constant scales and zero points "
                                 "with input/output scale ratios in [2**-10, 2**8)" % node.name)
    ra, rb, fixed, shift = consts
    return im.emit("qadd", [A, B, im.add_const(ra), im.add_const(rb), im.add_const(fixed)],
                   {"dtype": str(im.type(A).dtype), "shift": shift, "zero_point": int(values[5])}, node.name,
                   node_output(node))


def emit_qadd(im, A: str, B: str, sa: str, za: str, sb: str, zb: str, sc: str, zc: str, name: str = "",
              out=None) -> str:
    """QLinearAdd as MLAS computes it: ra = sa / sc, rb = sb / sc, fixed = zc - (ra * za + rb * zb) (with constant
    scales and zero points, the last multiply-add fused as the compiled MLAS does)."""
    values = [im.const(v) for v in (sa, za, sb, zb, sc, zc)]
    if all(v is not None for v in values):
        ra, rb, fixed = (im.add_const(v) for v in qadd_constants(*values))
    else:
        ra, rb = im.emit("div", [sa, sc]), im.emit("div", [sb, sc])
        f = lambda z: im.emit("cast", [z], {"to": "float32"})    # noqa: E731
        fixed = im.emit("sub", [f(zc), im.emit("add", [im.emit("mul", [ra, f(za)]), im.emit("mul", [rb, f(zb)])])])
    return im.emit("qadd", [A, B, ra, rb, fixed], {"dtype": str(im.type(A).dtype)}, name, out)


def _qlinear_mul(im, node, ins, a):
    A, sa, za, B, sb, zb, sc = ins[:7]
    v = im.emit("mul", [dequantize_per_tensor(im, node, A, sa, za), dequantize_per_tensor(im, node, B, sb, zb)])
    quantize_per_tensor(im, node, v, sc, optional_input(ins, 7), A)


def _qlinear_gap(im, node, ins, a):
    x, sx, zx, sy, zy = ins[:5]
    if int(a.get("channels_last", 0)):
        raise UnsupportedOpError("node %s: QLinearGlobalAveragePool with channels_last=1 (tether takes NCHW)"
                                 % node.name)
    check_dtype(im, node, x, PRODUCT_DTYPES, "an input")
    for s in (sx, sy):
        check_scale(im, node, s)
    shape = im.type(x).shape
    hw = int(np.prod(shape[2:], dtype=np.int64))
    acc = im.emit("reduce", [im.emit("cast", [x], {"to": "int32"})],
                  {"kind": "sum", "axes": list(range(2, len(shape))), "keepdims": True})
    zx32 = im.emit("cast", [zero_point_or_zero(im, node, zx, x)], {"to": "int32"})
    acc = im.emit("sub", [acc, im.emit("mul", [zx32, im.add_const(np.array(hw, np.int32))])])
    sx1, sy1 = scalar_param(im, node, sx, "scale"), scalar_param(im, node, sy, "scale")
    mult = im.emit("div", [sx1, im.emit("mul", [sy1, _f32(im, float(hw))])])
    im.emit("requantize", [acc, mult, zero_point_or_zero(im, node, zy, x)], {"dtype": str(im.type(x).dtype)}, node.name,
            node_output(node))


def _qgemm(im, node, ins, a):
    A, sa, za, B, sb, zb = ins[:6]
    C, sy, zy = optional_input(ins, 6), optional_input(ins, 7), optional_input(ins, 8)
    alpha = float(a.get("alpha", 1.0))
    check_dtype(im, node, A, PRODUCT_DTYPES, "an A operand")
    check_dtype(im, node, B, PRODUCT_DTYPES, "a B operand")
    a32 = minus_zero_point(im, node, A, scalar_param(im, node, za, "A zero point"), 0, "A zero point")
    if int(a.get("transA", 0)):
        a32 = im.emit("transpose", [a32], {"axes": [1, 0]})
    trans_b = int(a.get("transB", 0))
    b32 = minus_zero_point(im, node, B, zb, 0 if trans_b else 1, "B zero point")
    if not trans_b:
        b32 = im.emit("transpose", [b32], {"axes": [1, 0]})
    acc = im.emit("dense", [a32, b32], {}, node.name + "_acc")
    if C:
        check_dtype(im, node, C, ("int32",), "a bias")
        acc = im.emit("add", [acc, C])
    n = im.type(acc).shape[1]
    check_scale(im, node, sa)
    check_scale(im, node, sb)
    sbv = sb if im.type(sb).shape == (n,) else scalar_param(im, node, sb, "B scale")
    scale = im.emit("mul", [im.emit("mul", [_f32(im, alpha), scalar_param(im, node, sa, "A scale")]), sbv])
    if sy is None:
        im.emit("mul", [im.emit("cast", [acc], {"to": "float32"}), scale], {}, node.name, node_output(node))
        return
    check_scale(im, node, sy)
    mult = im.emit("div", [scale, scalar_param(im, node, sy, "Y scale")])
    im.emit("requantize", [acc, mult, zero_point_or_zero(im, node, zy, A)], {"dtype": str(im.type(A).dtype)}, node.name,
            node_output(node))


def _qlinear_concat(im, node, ins, a):
    sy, zy = ins[0], ins[1]
    triples = [ins[k:k + 3] for k in range(2, len(ins), 3)]
    if not triples or any(len(t) != 3 for t in triples):
        raise UnsupportedOpError("node %s: QLinearConcat takes (tensor, scale, zero point) triples" % node.name)
    first = triples[0][0]
    dt = check_dtype(im, node, zy, PRODUCT_DTYPES, "an output zero point")
    sy1, zy1 = scalar_param(im, node, sy, "scale"), scalar_param(im, node, zy, "zero point")
    parts = [im.emit("quantize", [dequantize_per_tensor(im, node, x, s, z), sy1, zy1], {"dtype": dt})
             for x, s, z in triples]
    axis = norm_axis(int(a["axis"]), len(im.type(first).shape))
    im.emit("concat", parts, {"axis": axis}, node.name, node_output(node))


def _qlinear_sigmoid(im, node, ins, a):
    X, sx, zx, sy = ins[:4]
    v = im.emit("sigmoid", [dequantize_per_tensor(im, node, X, sx, zx)])
    quantize_per_tensor(im, node, v, sy, optional_input(ins, 4), X)


def _to_float(im, node, acc: str, scales, bias) -> str:
    """float(acc) * (a_scale * b_scale) [+ bias]: MatMulIntegerToFloat's and DynamicQuantizeMatMul's output."""
    n = im.type(acc).shape[-1]
    sa = scalar_param(im, node, scales[0], "A scale")
    sb = scales[1] if im.type(scales[1]).shape == (n,) else scalar_param(im, node, scales[1], "B scale")
    for s in scales:
        check_scale(im, node, s)
    last = bias is None
    y = im.emit("mul", [im.emit("cast", [acc], {"to": "float32"}), im.emit("mul", [sa, sb])], {}, node.name,
                node_output(node) if last else None)
    if not last:
        check_dtype(im, node, bias, ("float32",), "a bias")
        y = im.emit("add", [y, bias], {}, node.name + "_bias", node_output(node))
    return y


def _matmul_integer_to_float(im, node, ins, a):
    A, B, sa, sb = ins[:4]
    za, zb, bias = optional_input(ins, 4), optional_input(ins, 5), optional_input(ins, 6)
    acc = int_matmul(im, node, A, B, za, zb, im.fresh(node.name + "_acc"))
    _to_float(im, node, acc, (sa, sb), bias)


def _dynamic_quantize_matmul(im, node, ins, a):
    A, B, sb = ins[:3]
    zb, bias = optional_input(ins, 3), optional_input(ins, 4)
    check_dtype(im, node, A, ("float32",), "an A operand")
    q, sa, za = (im.fresh(node.name + suffix) for suffix in ("_a_quantized", "_a_scale", "_a_zero_point"))
    dql = types.SimpleNamespace(name=node.name + "_quantize_a", op_type="DynamicQuantizeLinear", output=[q, sa, za],
                                input=[A])
    quantized.CONVERTERS["DynamicQuantizeLinear"](im, dql, [A], {})
    acc = int_matmul(im, node, q, B, za, zb, im.fresh(node.name + "_acc"))
    _to_float(im, node, acc, (sa, sb), bias)


for _op, _fn in {"QLinearAdd": _qlinear_add, "QLinearMul": _qlinear_mul,
                 "QLinearGlobalAveragePool": _qlinear_gap, "QGemm": _qgemm, "QLinearConcat": _qlinear_concat,
                 "QLinearSigmoid": _qlinear_sigmoid, "MatMulIntegerToFloat": _matmul_integer_to_float,
                 "DynamicQuantizeMatMul": _dynamic_quantize_matmul}.items():
    CONVERTERS.add(MS + _op, _fn)
