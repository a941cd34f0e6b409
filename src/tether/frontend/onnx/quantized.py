"""Converters of ONNX's quantized operators: QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear,
MatMulInteger, ConvInteger, QLinearMatMul and QLinearConv, as onnxruntime computes them.

Quantize and dequantize are the graph's ``quantize``/``dequantize`` ops (``tether.kernels.quantize_ops``), their
scale and zero point broadcast against the data: one element (per tensor), a vector along ``axis`` (per channel),
or blocks of ``block_size`` along ``axis`` (the data viewed with that axis split into (blocks, block_size)). An integer
product is the float op on int32 operands with the zero points subtracted (``int32(x) - zp``), so a QLinearConv is
``requantize(conv2d(x - zx, w - zw) + bias, sx * sw / sy, zy)``: the zero-point subtraction of a constant weight
folds at import, and the requantize joins the conv's kernel as its epilogue.

Element types: int8 and uint8 (int16 for Quantize/DequantizeLinear) with float32 scales. int4/uint4/int2,
uint16, the float8/float4 formats and float16/bfloat16 scales are refused with an ``UnsupportedOpError`` naming
the node and the type; so is a ``block_size`` that does not divide its axis.
"""
from __future__ import annotations

import types
from typing import Optional, Sequence, Tuple

import numpy as np

from tether.errors import UnsupportedOpError
from tether.frontend.onnx import nn
from tether.frontend.onnx.importer import ConverterTable, emit_reshape, node_output, norm_axis

CONVERTERS = ConverterTable(__name__)

QUANT_DTYPES = ("int8", "uint8", "int16")      # Quantize/DequantizeLinear
PRODUCT_DTYPES = ("int8", "uint8")             # the integer conv and matmul ops
# TensorProto element types an output_dtype attribute may name
_ONNX_INT = {2: "uint8", 3: "int8", 5: "int16"}


def _onnx_type_name(code: int) -> str:
    import onnx
    try:
        return onnx.TensorProto.DataType.Name(code).lower()
    except ValueError:
        return "elem_type_%d" % code


def check_dtype(im, node, value: str, allowed: Sequence[str], what: str) -> str:
    """The dtype of ``value``; UnsupportedOpError naming ``what`` when it is not one of ``allowed``."""
    dt = str(im.type(value).dtype)
    if dt not in allowed:
        raise UnsupportedOpError("node %s: %s with %s of type %s is not supported (tether implements %s)"
                                 % (node.name, node.op_type, what, dt, ", ".join(allowed)))
    return dt


def optional_input(ins: Sequence[str], k: int) -> Optional[str]:
    """Input ``k`` of a node, or None when it is absent or empty."""
    return ins[k] if len(ins) > k and ins[k] else None


def zero_point_const(im, dtype: str) -> str:
    """A constant zero point of ``dtype`` (for an op whose zero point is omitted)."""
    return im.add_const(np.zeros((), dtype), "zero_point")


def _broadcast_param(im, node, p: str, shape: Tuple[int, ...], axis: int, what: str) -> str:
    """A per-tensor (one element) or per-axis (a vector of shape[axis]) scale/zero point, shaped to broadcast
    against a tensor of ``shape``."""
    pt = im.type(p)
    if int(np.prod(pt.shape, dtype=np.int64)) == 1 and len(pt.shape) <= 1:
        return emit_reshape(im, p, ())
    if len(pt.shape) == 1 and pt.shape[0] == shape[axis]:
        return emit_reshape(im, p, (shape[axis],) + (1,) * (len(shape) - axis - 1))
    raise UnsupportedOpError("node %s: %s %s of shape %s neither one element nor a vector of the %d elements of "
                             "axis %d of the input %s" % (node.name, node.op_type, what, pt.shape,
                                                         shape[axis], axis, shape))


def _blocked(im, node, x: str, params: Sequence[str], axis: int, block: int):
    """Blocked quantization: x viewed as (..., D/block, block, ...), each scale/zp as (..., D/block, 1, ...)."""
    shape = im.type(x).shape
    d = shape[axis]
    if block <= 0 or d % block:
        raise UnsupportedOpError("node %s: %s with block_size %d on an axis of %d elements (tether implements "
                                 "block sizes that divide the axis)" % (node.name, node.op_type, block, d))
    split = tuple(shape[:axis]) + (d // block, block) + tuple(shape[axis + 1:])
    expect = tuple(shape[:axis]) + (d // block,) + tuple(shape[axis + 1:])
    out = [emit_reshape(im, x, split)]
    for p in params:
        if tuple(im.type(p).shape) != expect:
            raise UnsupportedOpError("node %s: %s block scale/zero point of shape %s; %s expected for block_size "
                                     "%d" % (node.name, node.op_type, im.type(p).shape, expect, block))
        out.append(emit_reshape(im, p, tuple(shape[:axis]) + (d // block, 1) + tuple(shape[axis + 1:])))
    return out


def check_scale(im, node, scale: str) -> None:
    """UnsupportedOpError unless ``scale`` is float32."""
    check_dtype(im, node, scale, ("float32",), "a scale")


def _emit_q_or_dq(im, node, op: str, x: str, scale: str, zp: str, attrs: dict, a: dict) -> None:
    shape = im.type(x).shape
    block = int(a.get("block_size", 0))
    axis = norm_axis(int(a.get("axis", 1)), len(shape)) if shape else 0
    if block:
        xb, *pb = _blocked(im, node, x, [scale] + ([zp] if im.type(zp).shape else []), axis, block)
        y = im.emit(op, [xb, pb[0], pb[1] if len(pb) > 1 else zp], attrs, node.name)
        emit_reshape(im, y, shape, node.name + "_unblock", node.output[0])
        return
    s = _broadcast_param(im, node, scale, shape, axis, "scale")
    z = _broadcast_param(im, node, zp, shape, axis, "zero point")
    if op == "dequantize" and im.const(x) is not None:
        _emit_unfolded(im, op, [x, s, z], attrs, node.name, node.output[0])
        return
    im.emit(op, [x, s, z], attrs, node.name, node_output(node))


def _emit_unfolded(im, op: str, inputs: Sequence[str], attrs: dict, name: str, out: str) -> None:
    """A node over constants kept as a node: the dequantized int8 weights and int32 biases of the QDQ form stay
    visible to the quantize pass (graph/passes/quantize.py), which runs their consumer as an integer kernel;
    constant folding folds whatever it leaves."""
    from tether.graph import op_info
    from tether.graph.ir import Node
    (t,) = op_info.infer(op, attrs, [im.type(i) for i in inputs])
    im.types[out] = t
    im.nodes.append(Node(op, name, list(inputs), [out], dict(attrs)))


@CONVERTERS.register("QuantizeLinear")
def _quantize_linear(im, node, ins, a):
    x, scale, zp = ins[0], ins[1], optional_input(ins, 2)
    check_dtype(im, node, x, ("float32",), "an input")
    check_scale(im, node, scale)
    if int(a.get("precision", 0)) not in (0, 1):
        raise UnsupportedOpError("node %s: QuantizeLinear precision %s (tether computes in float32)"
                                 % (node.name, _onnx_type_name(int(a["precision"]))))
    code = int(a.get("output_dtype", 0))
    if code and code not in _ONNX_INT:
        raise UnsupportedOpError("node %s: QuantizeLinear to %s is not supported (tether implements %s)"
                                 % (node.name, _onnx_type_name(code), ", ".join(QUANT_DTYPES)))
    if zp is not None:
        dt = check_dtype(im, node, zp, QUANT_DTYPES, "a zero point")
        if code and _ONNX_INT[code] != dt:
            raise UnsupportedOpError("node %s: QuantizeLinear output_dtype %s differs from its zero point's %s"
                                     % (node.name, _ONNX_INT[code], dt))
    else:
        dt = _ONNX_INT.get(code, "uint8")
        zp = zero_point_const(im, dt)
    # saturate only concerns float8 outputs, which are refused above
    _emit_q_or_dq(im, node, "quantize", x, scale, zp, {"dtype": dt}, a)


@CONVERTERS.register("DequantizeLinear")
def _dequantize_linear(im, node, ins, a):
    x, scale, zp = ins[0], ins[1], optional_input(ins, 2)
    dt = check_dtype(im, node, x, QUANT_DTYPES + ("int32",), "an input")
    check_scale(im, node, scale)
    code = int(a.get("output_dtype", 0))
    if code not in (0, 1):
        raise UnsupportedOpError("node %s: DequantizeLinear output_dtype %s (tether implements float)"
                                 % (node.name, _onnx_type_name(code)))
    if zp is None:
        zp = zero_point_const(im, dt)
    elif check_dtype(im, node, zp, QUANT_DTYPES + ("int32",), "a zero point") != dt:
        raise UnsupportedOpError("node %s: DequantizeLinear zero point of type %s for an input of type %s"
                                 % (node.name, im.type(zp).dtype, dt))
    _emit_q_or_dq(im, node, "dequantize", x, scale, zp, {}, a)


@CONVERTERS.register("DynamicQuantizeLinear")
def _dynamic_quantize_linear(im, node, ins, a):
    """uint8 with scale (max(x, 0) - min(x, 0)) / 255 (1 when that range is empty) and zero point
    round(clamp(-min / scale, 0, 255)), as onnxruntime's GetQuantizationParameter."""
    x = ins[0]
    check_dtype(im, node, x, ("float32",), "an input")
    nd = len(im.type(x).shape)
    f32 = lambda v: im.add_const(np.array(v, np.float32))    # noqa: E731
    # keepdims: a reduction to rank 0 has no kernel shape (kernels see scalars as (1,)); reshaped to () below
    red = {"axes": list(range(nd)), "keepdims": True}
    mn = im.emit("minimum", [im.emit("reduce", [x], dict(red, kind="min"), node.name + "_min"), f32(0.0)])
    mx = im.emit("maximum", [im.emit("reduce", [x], dict(red, kind="max"), node.name + "_max"), f32(0.0)])
    rng = im.emit("sub", [mx, mn])
    empty = im.emit("equal", [rng, f32(0.0)])
    scale = im.emit("where", [empty, f32(1.0), im.emit("div", [rng, f32(255.0)])], {}, node.name + "_scale")
    zp = im.emit("quantize", [im.emit("neg", [mn]), scale, zero_point_const(im, "uint8")], {"dtype": "uint8"},
                 node.name + "_zero_point")
    im.emit("quantize", [x, scale, zp], {"dtype": "uint8"}, node.name, node_output(node, 0))
    for k, v in ((1, scale), (2, zp)):
        if node_output(node, k):
            emit_reshape(im, v, (), node.name + "_scalar%d" % k, node.output[k])


# ---------------------------------------------------------------- integer products
def minus_zero_point(im, node, x: str, zp: Optional[str], axis_of_vector: int, what: str) -> str:
    """int32(x) - zp, zp one element or a vector along ``axis_of_vector`` of x."""
    x32 = im.emit("cast", [x], {"to": "int32"})
    if zp is None:
        return x32
    dt = check_dtype(im, node, zp, PRODUCT_DTYPES, what)
    if dt != str(im.type(x).dtype):
        raise UnsupportedOpError("node %s: %s %s of type %s for an operand of type %s"
                                 % (node.name, node.op_type, what, dt, im.type(x).dtype))
    shape = im.type(x).shape
    z = _broadcast_param(im, node, zp, shape, norm_axis(axis_of_vector, len(shape)), what)
    return im.emit("sub", [x32, im.emit("cast", [z], {"to": "int32"})])


def _as_node(node, op_type: str, output: str):
    """The node as another op type with one (possibly fresh) output, to reuse that op's converter."""
    return types.SimpleNamespace(name=node.name, op_type=op_type, output=[output], input=list(node.input))


def int_matmul(im, node, a: str, b: str, azp: Optional[str], bzp: Optional[str], out: str) -> str:
    """``out`` = (a - azp) @ (b - bzp) in int32, the zero points optional."""
    check_dtype(im, node, a, PRODUCT_DTYPES, "an A operand")
    check_dtype(im, node, b, PRODUCT_DTYPES, "a B operand")
    if len(im.type(a).shape) < 2 and azp is not None and im.type(azp).shape not in ((), (1,)):
        raise UnsupportedOpError("node %s: a per-row A zero point on a vector" % node.name)
    a32 = minus_zero_point(im, node, a, azp, -2 if len(im.type(a).shape) > 1 else 0, "A zero point")
    b32 = minus_zero_point(im, node, b, bzp, -1, "B zero point")
    nn.CONVERTERS["MatMul"](im, _as_node(node, "MatMul", out), [a32, b32], {})
    return out


def _int_conv(im, node, a: dict, x: str, w: str, xzp: Optional[str], wzp: Optional[str], out: str) -> str:
    check_dtype(im, node, x, PRODUCT_DTYPES, "an input")
    check_dtype(im, node, w, PRODUCT_DTYPES, "a weight")
    if xzp is not None and int(np.prod(im.type(xzp).shape, dtype=np.int64)) != 1:
        raise UnsupportedOpError("node %s: %s with a per-channel input zero point" % (node.name, node.op_type))
    x32 = minus_zero_point(im, node, x, xzp, 1, "input zero point")
    w32 = minus_zero_point(im, node, w, wzp, 0, "weight zero point")
    nn.CONVERTERS["Conv"](im, _as_node(node, "Conv", out), [x32, w32], a)
    return out


@CONVERTERS.register("MatMulInteger")
def _matmul_integer(im, node, ins, a):
    int_matmul(im, node, ins[0], ins[1], optional_input(ins, 2), optional_input(ins, 3), node.output[0])


@CONVERTERS.register("ConvInteger")
def _conv_integer(im, node, ins, a):
    _int_conv(im, node, a, ins[0], ins[1], optional_input(ins, 2), optional_input(ins, 3), node.output[0])


def _multiplier(im, node, scales: Sequence[str], y_scale: str) -> str:
    """sa * sb / sy in float32, in that order (onnxruntime's output scale); each scale checked."""
    for s in list(scales) + [y_scale]:
        check_scale(im, node, s)
    m = im.emit("mul", list(scales))
    return im.emit("div", [m, y_scale])


@CONVERTERS.register("QLinearMatMul")
def _qlinear_matmul(im, node, ins, a):
    A, sa, za, B, sb, zb, sy, zy = ins[:8]
    dt = check_dtype(im, node, zy, PRODUCT_DTYPES, "an output zero point")
    acc = int_matmul(im, node, A, B, za, zb, im.fresh(node.name + "_acc"))
    shape = im.type(acc).shape
    flat = lambda v: emit_reshape(im, v, ()) if int(np.prod(im.type(v).shape, dtype=np.int64)) == 1 \
        else v     # noqa: E731
    sa, sy, zy1 = flat(sa), flat(sy), flat(zy)
    mult = _multiplier(im, node, [sa, _broadcast_param(im, node, sb, shape, len(shape) - 1, "B scale")], sy)
    im.emit("requantize", [acc, mult, zy1], {"dtype": dt}, node.name, node_output(node))


@CONVERTERS.register("QLinearConv")
def _qlinear_conv(im, node, ins, a):
    x, sx, zx, w, sw, zw, sy, zy = ins[:8]
    bias = optional_input(ins, 8)
    dt = check_dtype(im, node, zy, PRODUCT_DTYPES, "an output zero point")
    acc = _int_conv(im, node, a, x, w, zx, zw, im.fresh(node.name + "_acc"))
    shape = im.type(acc).shape
    if bias is not None:
        check_dtype(im, node, bias, ("int32",), "a bias")
        acc = im.emit("add", [acc, _broadcast_param(im, node, bias, shape, 1, "bias")], {}, node.name + "_bias")
    sx1, sy1, zy1 = (emit_reshape(im, v, ()) for v in (sx, sy, zy))
    mult = _multiplier(im, node, [sx1, _broadcast_param(im, node, sw, shape, 1, "weight scale")], sy1)
    im.emit("requantize", [acc, mult, zy1], {"dtype": dt}, node.name, node_output(node))
