"""Elementwise ops and activations: computed in whatever layout their inputs are held (see ``Context.aligned``);
softmax along TFLite's last axis, which is NCHW's axis 1 for a rank-4 value held NCHW."""
from __future__ import annotations

import numpy as np

from tether.errors import UnsupportedOpError
from tether.frontend.tflite import fused
from tether.frontend.tflite.state import NCHW, onnx_dtype
from tether.frontend.tflite.table import ConverterTable

CONVERTERS = ConverterTable("tflite elementwise")

_BINARY = {"ADD": "Add", "SUB": "Sub", "MUL": "Mul", "DIV": "Div"}


def _binary(ctx, op) -> None:
    names, layout = ctx.aligned(op.inputs[:2])
    y = ctx.emit1(_BINARY[op.op], names)
    ctx.set_output(op.outputs[0], fused.apply_from(ctx, y), layout)


for _op in _BINARY:
    CONVERTERS.add(_op, _binary)


def _unary(ctx, op, onnx_op: str, **attrs) -> None:
    x, layout = ctx.held(op.inputs[0])
    ctx.set_output(op.outputs[0], ctx.emit1(onnx_op, [x], **attrs), layout)


def _clipped(lo: float, hi: float):
    def convert(ctx, op) -> None:
        x, layout = ctx.held(op.inputs[0])
        ctx.set_output(op.outputs[0], fused.clip(ctx, x, lo, hi), layout)
    return convert


CONVERTERS.add("RELU", lambda ctx, op: _unary(ctx, op, "Relu"))
CONVERTERS.add("RELU6", _clipped(0.0, 6.0))
CONVERTERS.add("RELU_N1_TO_1", _clipped(-1.0, 1.0))
CONVERTERS.add("RELU_0_TO_1", _clipped(0.0, 1.0))
CONVERTERS.add("LOGISTIC", lambda ctx, op: _unary(ctx, op, "Sigmoid"))
CONVERTERS.add("TANH", lambda ctx, op: _unary(ctx, op, "Tanh"))
CONVERTERS.add("HARD_SWISH", lambda ctx, op: _unary(ctx, op, "HardSwish"))
CONVERTERS.add("ELU", lambda ctx, op: _unary(ctx, op, "Elu", alpha=1.0))


@CONVERTERS.register("LEAKY_RELU")
def _leaky_relu(ctx, op) -> None:
    _unary(ctx, op, "LeakyRelu", alpha=float(op.options.get("alpha", 0.2)))


@CONVERTERS.register("GELU")
def _gelu(ctx, op) -> None:
    _unary(ctx, op, "Gelu", approximate="tanh" if op.options.get("approximate") else "none")


@CONVERTERS.register("PRELU")
def _prelu(ctx, op) -> None:
    # y = x < 0 ? alpha * x : x, alpha broadcast against x as TFLite broadcasts it
    names, layout = ctx.aligned(op.inputs[:2])
    ctx.set_output(op.outputs[0], ctx.emit1("PRelu", names), layout)


def _softmax(ctx, op, onnx_op: str) -> None:
    x, layout = ctx.held(op.inputs[0])
    axis = 1 if layout == NCHW else -1
    beta = float(op.options.get("beta", 1.0) or 1.0) if onnx_op == "Softmax" else 1.0
    if beta != 1.0:
        x = ctx.emit1("Mul", [x, ctx.add_const(np.array(beta, np.float32), "beta")])
    ctx.set_output(op.outputs[0], ctx.emit1(onnx_op, [x], axis=axis), layout)


CONVERTERS.add("SOFTMAX", lambda ctx, op: _softmax(ctx, op, "Softmax"))
CONVERTERS.add("LOG_SOFTMAX", lambda ctx, op: _softmax(ctx, op, "LogSoftmax"))


@CONVERTERS.register("CAST")
def _cast(ctx, op) -> None:
    dtype = ctx.tensor(op.outputs[0]).dtype
    try:
        to = onnx_dtype(dtype)
    except TypeError:
        raise UnsupportedOpError("%s: a cast to %s is not supported" % (ctx.where(), dtype)) from None
    _unary(ctx, op, "Cast", to=to)
