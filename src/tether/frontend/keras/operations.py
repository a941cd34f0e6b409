"""keras.ops operations saved in a functional model (``x + 3.0``, ``ops.mean(x, axis=...)`` on Keras tensors):
each is a node whose arguments mix tensors and Python constants, with its own parameters in its config.

Elementwise operations keep their tensor's layout (constants broadcast in Keras order, so an array constant is
laid out like the tensor); operations that name axes map them to the ONNX layout or take Keras order.
"""
from __future__ import annotations

from typing import Any, List

import numpy as np

from tether.frontend.keras import activations
from tether.frontend.keras.builder import Value
from tether.frontend.keras.layer import Call, LayerTable

LAYERS = LayerTable(__name__)

BINARY = {"Add": "Add", "Subtract": "Sub", "Multiply": "Mul", "Divide": "Div", "TrueDivide": "Div",
          "Power": "Pow", "Maximum": "Max", "Minimum": "Min"}
UNARY = {"Negative": "Neg", "Abs": "Abs", "Absolute": "Abs", "Exp": "Exp", "Log": "Log", "Sqrt": "Sqrt",
         "Tanh": "Tanh", "Sigmoid": "Sigmoid", "Relu": "Relu", "Softplus": "Softplus", "Erf": "Erf",
         "Floor": "Floor", "Ceil": "Ceil", "Sin": "Sin", "Cos": "Cos", "Reciprocal": "Reciprocal",
         "Softsign": "Softsign", "Elu": "Elu", "Selu": "Selu"}
# keras.ops activations with a Keras activation of the same meaning
ACTIVATION_OPS = {"Relu6": "relu6", "Silu": "silu", "Swish": "silu", "HardSigmoid": "hard_sigmoid",
                  "HardSilu": "hard_silu", "HardSwish": "hard_silu", "Mish": "mish", "LogSigmoid": "log_sigmoid",
                  "LeakyRelu": "leaky_relu"}


def _operand(c: Call, like: Value, x: Any, hint: str) -> Value:
    """A tensor operand as is, a constant as a broadcastable constant in ``like``'s layout."""
    if isinstance(x, Value):
        return x
    arr = np.asarray(x, np.float32)
    return Value(c.b.keras_const(like, arr, hint), like.rank, like.cf)


def _binary(op: str):
    def convert(c: Call) -> List[Value]:
        if len(c.operands) != 2:
            raise c.refuse("%d operands, expected two" % len(c.operands))
        tensors = [o for o in c.operands if isinstance(o, Value)]
        if not tensors:
            raise c.refuse("no tensor operand")
        if len(tensors) == 2:
            a, b = tensors
            cf = a.rank == b.rank and a.rank >= 3 and (a.cf or b.cf)
            ins = [c.b.in_layout(a, cf), c.b.in_layout(b, cf)]
            top = max(tensors, key=lambda v: v.rank)
            return [Value(c.b.op(op, ins, c.hint()), top.rank, cf and top.rank >= 3)]
        like = tensors[0]
        ins = [_operand(c, like, o, c.hint("_const")).name for o in c.operands]
        return [Value(c.b.op(op, ins, c.hint()), like.rank, like.cf, like.shape)]
    return convert


def _unary(op: str):
    def convert(c: Call) -> List[Value]:
        extra = {"alpha": 1.0} if op == "Elu" else {}
        return [Value(c.b.op(op, [c.x.name], c.hint(), **extra), c.x.rank, c.x.cf, c.x.shape)]
    return convert


def _activation(name: str):
    def convert(c: Call) -> List[Value]:
        return [activations.apply(c.b, c.x, name, c.version, c.hint())]
    return convert


for _name, _op in BINARY.items():
    LAYERS.register("ops." + _name)(_binary(_op))
for _name, _op in UNARY.items():
    LAYERS.register("ops." + _name)(_unary(_op))
for _name, _act in ACTIVATION_OPS.items():
    LAYERS.register("ops." + _name)(_activation(_act))


@LAYERS.register("ops.Square")
def _square(c: Call) -> List[Value]:
    return [Value(c.b.op("Mul", [c.x.name, c.x.name], c.hint()), c.x.rank, c.x.cf, c.x.shape)]


@LAYERS.register("ops.Rsqrt")
def _rsqrt(c: Call) -> List[Value]:
    y = c.b.op("Reciprocal", [c.b.op("Sqrt", [c.x.name], c.hint())], c.hint())
    return [Value(y, c.x.rank, c.x.cf, c.x.shape)]


@LAYERS.register("ops.Gelu")
def _gelu(c: Call) -> List[Value]:
    return [activations.apply_gelu(c.b, c.x, bool(c.get("approximate", True)), c.hint())]


@LAYERS.register("ops.Softmax", "ops.LogSoftmax")
def _softmax(c: Call) -> List[Value]:
    axis = c.get("axis", -1)
    if isinstance(axis, (list, tuple)):
        if len(axis) != 1:
            raise c.refuse("softmax over several axes %s" % (axis,))
        axis = axis[0]
    op = "Softmax" if c.class_name == "ops.Softmax" else "LogSoftmax"
    return [Value(c.b.op(op, [c.x.name], c.hint(), axis=c.x.onnx_axis(int(axis))), c.x.rank, c.x.cf, c.x.shape)]


@LAYERS.register("ops.Clip")
def _clip(c: Call) -> List[Value]:
    lo, hi = c.get("x_min"), c.get("x_max")
    ins = [c.x.name, c.b.const(np.float32(-np.inf if lo is None else lo), c.hint("_lo")),
           c.b.const(np.float32(np.inf if hi is None else hi), c.hint("_hi"))]
    return [Value(c.b.op("Clip", ins, c.hint()), c.x.rank, c.x.cf, c.x.shape)]


def _axes(c: Call, rank: int) -> List[int]:
    axis = c.get("axis")
    if axis is None:
        return list(range(rank))
    return sorted(int(a) % rank for a in (axis if isinstance(axis, (list, tuple)) else [axis]))


@LAYERS.register("ops.Mean", "ops.Sum", "ops.Max", "ops.Min")
def _reduce(c: Call) -> List[Value]:
    op = {"ops.Mean": "ReduceMean", "ops.Sum": "ReduceSum", "ops.Max": "ReduceMax", "ops.Min": "ReduceMin"}[
        c.class_name]
    keep = bool(c.get("keepdims", False))
    x = c.x if keep else Value(c.b.keras_order(c.x), c.x.rank)     # dropped axes renumber the Keras ones
    axes = sorted(x.onnx_axis(a) for a in _axes(c, c.x.rank))
    if op == "ReduceSum":
        y = c.b.op(op, [x.name, c.b.ints(axes, c.hint("_axes"))], c.hint(), keepdims=int(keep))
    else:
        y = c.b.op(op, [x.name], c.hint(), axes=axes, keepdims=int(keep))
    return [Value(y, c.x.rank, x.cf) if keep else Value(y, c.x.rank - len(axes))]


@LAYERS.register("ops.Reshape")
def _reshape(c: Call) -> List[Value]:
    shape = [-1 if d is None else int(d) for d in c.get("newshape")]
    return [Value(c.b.op("Reshape", [c.b.keras_order(c.x), c.b.ints(shape, c.hint("_shape"))], c.hint()),
                  len(shape))]


@LAYERS.register("ops.Transpose")
def _transpose(c: Call) -> List[Value]:
    axes = c.get("axes")
    perm = list(range(c.x.rank))[::-1] if axes is None else [int(a) % c.x.rank for a in axes]
    return [Value(c.b.transpose(c.b.keras_order(c.x), perm, c.hint()), c.x.rank)]


@LAYERS.register("ops.Matmul")
def _matmul(c: Call) -> List[Value]:
    tensors = [o for o in c.operands if isinstance(o, Value)]
    if len(tensors) != 2:
        raise c.refuse("a product of %d tensors (and constants)" % len(tensors))
    a, b = tensors
    y = c.b.op("MatMul", [c.b.keras_order(a), c.b.keras_order(b)], c.hint())
    return [Value(y, max(a.rank, b.rank))]


@LAYERS.register("ops.Concatenate")
def _concatenate(c: Call) -> List[Value]:
    vs = c.inputs
    ranks = {v.rank for v in vs}
    cf = len(ranks) == 1 and min(ranks) >= 3 and any(v.cf for v in vs)
    axis = int(c.get("axis", 0) or 0)
    vs = [Value(c.b.in_layout(v, cf), v.rank, cf) for v in vs]
    return [Value(c.b.op("Concat", [v.name for v in vs], c.hint(), axis=vs[0].onnx_axis(axis)), vs[0].rank, cf)]


@LAYERS.register("ops.ExpandDims")
def _expand_dims(c: Call) -> List[Value]:
    axis = int(c.get("axis")) % (c.x.rank + 1)
    y = c.b.op("Unsqueeze", [c.b.keras_order(c.x), c.b.ints([axis], c.hint("_axis"))], c.hint())
    return [Value(y, c.x.rank + 1)]


@LAYERS.register("ops.Squeeze")
def _squeeze(c: Call) -> List[Value]:
    axis = c.get("axis")
    if axis is None:
        raise c.refuse("a squeeze of every unit axis (tether needs the axes)")
    axes = [int(a) % c.x.rank for a in (axis if isinstance(axis, (list, tuple)) else [axis])]
    y = c.b.op("Squeeze", [c.b.keras_order(c.x), c.b.ints(axes, c.hint("_axes"))], c.hint())
    return [Value(y, c.x.rank - len(axes))]
