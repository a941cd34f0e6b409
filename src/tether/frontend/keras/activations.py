"""Keras activation functions (the ``activation=`` of a layer, the Activation layer) as ONNX nodes, by their
Keras 3 definitions (keras.activations): hard_sigmoid is relu6(x + 3) / 6 in Keras 3 and 0.2 x + 0.5 in Keras 2,
gelu is exact unless ``approximate``, softmax and log_softmax act on the last Keras axis.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Dict, Optional

from tether.errors import UnsupportedOpError
from tether.frontend.keras.builder import Builder, Value

Activation = Callable[[Builder, Value, str, str], str]     # (builder, value, keras version, hint) -> ONNX value


def _unary(op: str, **attrs) -> Activation:
    return lambda b, v, version, hint: b.op(op, [v.name], hint, **attrs)


def _linear(b: Builder, v: Value, version: str, hint: str) -> str:
    return v.name


def _relu6(b: Builder, v: Value, version: str, hint: str) -> str:
    return b.op("Clip", [v.name, b.const(0.0, hint + "_lo"), b.const(6.0, hint + "_hi")], hint)


def _hard_sigmoid(b: Builder, v: Value, version: str, hint: str) -> str:
    alpha = 0.2 if version.startswith(("1.", "2.")) else 1.0 / 6.0
    return b.op("HardSigmoid", [v.name], hint, alpha=alpha, beta=0.5)


def _swish(b: Builder, v: Value, version: str, hint: str) -> str:
    return b.op("Mul", [v.name, b.op("Sigmoid", [v.name], hint)], hint)


def _gelu(approximate: bool) -> Activation:
    def gelu(b: Builder, v: Value, version: str, hint: str) -> str:
        if approximate:         # 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
            cube = b.op("Mul", [b.op("Mul", [v.name, v.name], hint), v.name], hint)
            inner = b.op("Add", [v.name, b.op("Mul", [cube, b.const(0.044715, hint + "_c")], hint)], hint)
            t = b.op("Tanh", [b.op("Mul", [inner, b.const(math.sqrt(2 / math.pi), hint + "_k")], hint)], hint)
        else:                   # 0.5 x (1 + erf(x / sqrt(2)))
            t = b.op("Erf", [b.op("Mul", [v.name, b.const(1 / math.sqrt(2), hint + "_k")], hint)], hint)
        half = b.op("Mul", [v.name, b.const(0.5, hint + "_half")], hint)
        return b.op("Mul", [half, b.op("Add", [t, b.const(1.0, hint + "_one")], hint)], hint)
    return gelu


def _mish(b: Builder, v: Value, version: str, hint: str) -> str:
    return b.op("Mul", [v.name, b.op("Tanh", [b.op("Softplus", [v.name], hint)], hint)], hint)


def _softmax(op: str) -> Activation:
    return lambda b, v, version, hint: b.op(op, [v.name], hint, axis=v.onnx_axis(-1))


def _leaky_relu(b: Builder, v: Value, version: str, hint: str) -> str:
    return b.op("LeakyRelu", [v.name], hint, alpha=0.2)


def _hard_tanh(b: Builder, v: Value, version: str, hint: str) -> str:
    return b.op("Clip", [v.name, b.const(-1.0, hint + "_lo"), b.const(1.0, hint + "_hi")], hint)


def _log_sigmoid(b: Builder, v: Value, version: str, hint: str) -> str:
    return b.op("Neg", [b.op("Softplus", [b.op("Neg", [v.name], hint)], hint)], hint)


def _tanh_shrink(b: Builder, v: Value, version: str, hint: str) -> str:
    return b.op("Sub", [v.name, b.op("Tanh", [v.name], hint)], hint)


ACTIVATIONS: Dict[str, Activation] = {
    "linear": _linear, "relu": _unary("Relu"), "relu6": _relu6, "sigmoid": _unary("Sigmoid"),
    "hard_sigmoid": _hard_sigmoid, "tanh": _unary("Tanh"), "softmax": _softmax("Softmax"),
    "log_softmax": _softmax("LogSoftmax"), "swish": _swish, "silu": _swish, "gelu": _gelu(False),
    "elu": _unary("Elu", alpha=1.0), "selu": _unary("Selu"), "softplus": _unary("Softplus"),
    "softsign": _unary("Softsign"), "exponential": _unary("Exp"), "mish": _mish,
    "hard_swish": _unary("HardSwish"), "hard_silu": _unary("HardSwish"), "leaky_relu": _leaky_relu,
    "hard_tanh": _hard_tanh, "log_sigmoid": _log_sigmoid, "celu": _unary("Celu", alpha=1.0),
    "tanh_shrink": _tanh_shrink,
}


def activation_name(spec: Any) -> Optional[str]:
    """The function a layer's ``activation`` config names (a string, or Keras 3's serialized function dict);
    None for no activation."""
    if spec is None:
        return None
    if isinstance(spec, dict):
        inner = spec.get("config")
        spec = inner if isinstance(inner, str) else spec.get("class_name")
    return str(spec)


def is_covered(spec: Any) -> bool:
    name = activation_name(spec)
    return name is None or name in ACTIVATIONS


def apply(b: Builder, v: Value, spec: Any, version: str, hint: str) -> Value:
    """``v`` through the activation ``spec``, in ``v``'s layout."""
    name = activation_name(spec)
    if name is None or name == "linear":
        return v
    if name not in ACTIVATIONS:
        raise UnsupportedOpError("activation %r (Keras %s) is not one tether converts (%s)"
                                 % (name, version, ", ".join(sorted(ACTIVATIONS))))
    return Value(ACTIVATIONS[name](b, v, version, hint + "_" + name), v.rank, v.cf, v.shape)


def apply_gelu(b: Builder, v: Value, approximate: bool, hint: str) -> Value:
    return Value(_gelu(approximate)(b, v, "3", hint + "_gelu"), v.rank, v.cf, v.shape)
