"""Convolutions and dense layers with quantized weights (CONV_2D, DEPTHWISE_CONV_2D, FULLY_CONNECTED,
TRANSPOSE_CONV).

Full-integer: the float converter between DQ and Q (``quantized.through_float``), the bias's DQ scale written as
``float32(s_x) * s_w``: LiteRT adds the int32 bias to the accumulator as it is, whatever scale the file records,
and that scale is what the QDQ pass needs to fold the group into an integer conv or dense kernel.

Dynamic-range (int8 weights, float activations: LiteRT's hybrid kernels): CONV_2D, DEPTHWISE_CONV_2D and
FULLY_CONNECTED run as the hybrid kernel computes: the input quantized at run time (asymmetric int8 per batch for
convolutions and for FULLY_CONNECTED with ``asymmetric_quantize_inputs``, symmetric per row otherwise), the integer
product (ConvInteger, MatMulInteger), scaled back by ``s_x * s_w`` and the float bias added. ``HYBRID`` chooses
between this (``"emulate"``) and dequantizing the weights (``"dequantize"``: the float op on the stored weights);
the emulation is the closer of the two to LiteRT (float32 rounding against about one input step). TRANSPOSE_CONV
and other ops with quantized weights and float activations read the weights dequantized.
"""
from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

import numpy as np

from tether.errors import UnsupportedOpError
from tether.frontend.tflite.flatbuffer import Operator
from tether.frontend.tflite.quantized import (FloatView, float_converter, tensor_hint, is_quantized, refuse_packed,
                                              through_float)
from tether.frontend.tflite.state import onnx_dtype
from tether.frontend.tflite.table import ConverterTable

QUANTIZED = ConverterTable("tflite quantized products")

# product op -> (input, weights, bias) positions
PRODUCTS = {"CONV_2D": (0, 1, 2), "DEPTHWISE_CONV_2D": (0, 1, 2), "FULLY_CONNECTED": (0, 1, 2),
            "TRANSPOSE_CONV": (2, 1, 3)}

HYBRID = "emulate"          # or "dequantize": how dynamic-range products run (see the module's docstring)


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
        name = self._ctx.add_const(values, hint or tensor_hint(t))
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
    fn = float_converter(op)
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
