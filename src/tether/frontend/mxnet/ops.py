"""Each MXNet symbol op as ONNX nodes, with MXNet's defaults (BatchNorm's eps 1e-3 and fix_gamma, Pooling's
"valid"/"full" conventions and count_include_pad, Deconvolution without bias, FullyConnected flattening) and its
attribute strings ("(3, 3)", "True", "relu").

An op function takes the translator, the node (its op, name and attributes) and its inputs' ONNX values, and
returns its output value, or None after ``t.refuse``.
"""
from __future__ import annotations

import ast
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from tether.frontend.onnx_builder import OnnxBuilder


class Translator:
    def __init__(self, name: str, path: str, params: Dict[str, np.ndarray]) -> None:
        self.b = OnnxBuilder(name, "tether mxnet frontend")
        self.path = path
        self.params = params
        self.refused: List[Tuple[str, str, str]] = []

    def refuse(self, node: "Node", why: str = "") -> None:
        self.refused.append((node.op, node.name, why))


class Node:
    """A symbol JSON node: op, name and attributes (under "attrs", "attr" or, before MXNet 0.9, "param")."""

    def __init__(self, doc: Dict[str, Any]) -> None:
        self.op = doc.get("op", "null")
        self.name = doc.get("name", "")
        self.attrs: Dict[str, str] = dict(doc.get("attrs") or doc.get("attr") or doc.get("param") or {})
        self.inputs: List[List[int]] = doc.get("inputs", [])
        self.input_names: List[str] = []          # the names of the nodes it reads, set by the translator

    def get(self, key: str, default: Any) -> Any:
        """The attribute parsed as a Python literal ("(3, 3)" -> (3, 3), "True" -> True), else as text."""
        if key not in self.attrs:
            return default
        text = self.attrs[key]
        try:
            return ast.literal_eval(text)
        except (ValueError, SyntaxError):
            low = text.lower()
            return True if low == "true" else False if low == "false" else None if low == "none" else text

    def pair(self, key: str, default: int) -> List[int]:
        v = self.get(key, ())
        v = [v] if isinstance(v, int) else list(v)
        return [int(x) for x in v] if v else [default, default]


def _conv(t: Translator, n: Node, ins: List[str]) -> Optional[str]:
    if n.get("layout", None) not in (None, "NCHW") or len(n.pair("kernel", 1)) != 2:
        t.refuse(n, "only 2-D NCHW convolutions")
        return None
    deconv = n.op == "Deconvolution"
    no_bias = n.get("no_bias", deconv)                 # Deconvolution has no bias unless asked
    pad = n.pair("pad", 0)
    attrs: Dict[str, Any] = dict(kernel_shape=n.pair("kernel", 1), strides=n.pair("stride", 1),
                                 dilations=n.pair("dilate", 1), pads=pad + pad, group=int(n.get("num_group", 1)))
    if deconv:
        if n.get("target_shape", ()):
            t.refuse(n, "target_shape")
            return None
        adj = n.pair("adj", 0)
        if any(adj):
            attrs["output_padding"] = adj
    args = ins[:2] if no_bias else ins[:3]
    return t.b.node("ConvTranspose" if deconv else "Conv", args, n.name, **attrs)


def _batch_norm(t: Translator, n: Node, ins: List[str]) -> Optional[str]:
    if int(n.get("axis", 1)) != 1:
        t.refuse(n, "axis=%s" % n.attrs["axis"])
        return None
    x, gamma = ins[0], ins[1]
    if n.get("fix_gamma", True):                       # MXNet's default: gamma is taken as 1 at inference
        gamma = t.b.node("Mul", [ins[1], t.b.const(n.name + "_zero", np.float32(0))], n.name + "_g0")
        gamma = t.b.node("Add", [gamma, t.b.const(n.name + "_one", np.float32(1))], n.name + "_gamma")
    return t.b.node("BatchNormalization", [x, gamma, ins[2], ins[3], ins[4]], n.name,
                    epsilon=float(n.get("eps", 1e-3)))


_ACTS = {"relu": "Relu", "sigmoid": "Sigmoid", "tanh": "Tanh", "softrelu": "Softplus", "softsign": "Softsign"}


def _activation(t: Translator, n: Node, ins: List[str]) -> Optional[str]:
    op = _ACTS.get(str(n.get("act_type", "relu")))
    if op is None:
        t.refuse(n, "act_type=%s" % n.attrs.get("act_type"))
        return None
    return t.b.node(op, ins[:1], n.name)


def _leaky_relu(t: Translator, n: Node, ins: List[str]) -> Optional[str]:
    act, slope = str(n.get("act_type", "leaky")), float(n.get("slope", 0.25))
    if act == "leaky":
        return t.b.node("LeakyRelu", ins[:1], n.name, alpha=slope)
    if act == "elu":
        return t.b.node("Elu", ins[:1], n.name, alpha=slope)
    if act == "selu":
        return t.b.node("Selu", ins[:1], n.name)
    if act == "rrelu":                                 # at inference the slope is the middle of its range
        lo, hi = float(n.get("lower_bound", 0.125)), float(n.get("upper_bound", 0.334))
        return t.b.node("LeakyRelu", ins[:1], n.name, alpha=(lo + hi) / 2)
    if act == "prelu":
        slope_v = ins[1]
        w = t.params.get(_param_name(t, n, 1))
        if w is not None and w.size > 1:
            slope_v = t.b.const(n.name + "_slope", w.reshape(-1, 1, 1))
        return t.b.node("PRelu", [ins[0], slope_v], n.name)
    if act == "gelu":
        half = t.b.node("Mul", [ins[0], t.b.const(n.name + "_inv_sqrt2", np.float32(1 / np.sqrt(2)))],
                        n.name + "_scaled")
        erf = t.b.node("Add", [t.b.node("Erf", [half], n.name + "_erf"), t.b.const(n.name + "_one", np.float32(1))],
                       n.name + "_1p")
        return t.b.node("Mul", [t.b.node("Mul", [ins[0], erf], n.name + "_x"),
                                t.b.const(n.name + "_half", np.float32(0.5))], n.name)
    t.refuse(n, "act_type=%s" % act)
    return None


def _param_name(t: Translator, n: Node, k: int) -> str:
    return n.input_names[k] if k < len(n.input_names) else ""


def _pool(t: Translator, n: Node, ins: List[str]) -> Optional[str]:
    kind = str(n.get("pool_type", "max"))
    if kind not in ("max", "avg", "sum") or n.get("layout", None) not in (None, "NCHW"):
        t.refuse(n, "pool_type=%s" % kind if kind not in ("max", "avg", "sum") else "layout %s" % n.attrs["layout"])
        return None
    if n.get("global_pool", False):
        y = t.b.node("GlobalMaxPool" if kind == "max" else "GlobalAveragePool", ins[:1], n.name +
                     ("_mean" if kind == "sum" else ""))
        if kind == "sum":
            area = t.b.node("ReduceProd", [t.b.node("Slice", [t.b.node("Shape", ins[:1], n.name + "_shape"),
                                                              t.b.ints(n.name + "_s", [2]),
                                                              t.b.ints(n.name + "_e", [4])], n.name + "_hw")],
                            n.name + "_area", keepdims=1)
            y = t.b.node("Mul", [y, t.b.node("Cast", [area], n.name + "_areaf", to=1)], n.name)
        return y
    kernel, pad = n.pair("kernel", 1), n.pair("pad", 0)
    attrs: Dict[str, Any] = dict(kernel_shape=kernel, strides=n.pair("stride", 1), pads=pad + pad,
                                 ceil_mode=int(str(n.get("pooling_convention", "valid")) == "full"))
    if kind == "max":
        return t.b.node("MaxPool", ins[:1], n.name, **attrs)
    attrs["count_include_pad"] = int(bool(n.get("count_include_pad", True)))
    y = t.b.node("AveragePool", ins[:1], n.name + ("_mean" if kind == "sum" else ""), **attrs)
    if kind == "sum":
        y = t.b.node("Mul", [y, t.b.const(n.name + "_area", np.float32(kernel[0] * kernel[1]))], n.name)
    return y


def _fully_connected(t: Translator, n: Node, ins: List[str]) -> Optional[str]:
    no_bias = n.get("no_bias", False)
    if n.get("flatten", True):
        flat = t.b.node("Flatten", ins[:1], n.name + "_flat", axis=1)
        return t.b.node("Gemm", [flat] + ins[1:2] + ([] if no_bias else ins[2:3]), n.name, transB=1)
    wt = t.b.node("Transpose", [ins[1]], n.name + "_wt", perm=[1, 0])
    y = t.b.node("MatMul", [ins[0], wt], n.name + ("" if no_bias else "_mm"))
    return y if no_bias else t.b.node("Add", [y, ins[2]], n.name)


def _softmax(t: Translator, n: Node, ins: List[str]) -> Optional[str]:
    x = ins[0]
    if n.op in ("SoftmaxOutput", "Softmax"):
        if n.get("multi_output", False):
            return t.b.node("Softmax", [x], n.name, axis=1)
        # the input seen as [batch, everything else]
        flat = t.b.node("Flatten", [x], n.name + "_2d", axis=1)
        y = t.b.node("Softmax", [flat], n.name + "_softmax", axis=1)
        return t.b.node("Reshape", [y, t.b.node("Shape", [x], n.name + "_shape")], n.name)
    if n.op == "SoftmaxActivation":
        if str(n.get("mode", "instance")) == "channel":
            return t.b.node("Softmax", [x], n.name, axis=1)
        flat = t.b.node("Flatten", [x], n.name + "_2d", axis=1)
        y = t.b.node("Softmax", [flat], n.name + "_softmax", axis=1)
        return t.b.node("Reshape", [y, t.b.node("Shape", [x], n.name + "_shape")], n.name)
    temperature = n.get("temperature", None)
    if temperature not in (None, 1, 1.0):
        x = t.b.node("Div", [x, t.b.const(n.name + "_t", np.float32(temperature))], n.name + "_scaled")
    return t.b.node("LogSoftmax" if n.op == "log_softmax" else "Softmax", [x], n.name, axis=int(n.get("axis", -1)))


def _binary(op: str) -> Callable:
    return lambda t, n, ins: t.b.node(op, ins[:2], n.name)


def _scalar(op: str, reverse: bool = False) -> Callable:
    def convert(t: Translator, n: Node, ins: List[str]) -> Optional[str]:
        c = t.b.const(n.name + "_scalar", np.float32(float(n.get("scalar", 0.0))))
        return t.b.node(op, [c, ins[0]] if reverse else [ins[0], c], n.name)
    return convert


def _unary(op: str) -> Callable:
    return lambda t, n, ins: t.b.node(op, ins[:1], n.name)


def _concat(t: Translator, n: Node, ins: List[str]) -> Optional[str]:
    return t.b.node("Concat", ins, n.name, axis=int(n.get("dim", 1)))


def _flatten(t: Translator, n: Node, ins: List[str]) -> Optional[str]:
    return t.b.node("Flatten", ins[:1], n.name, axis=1)


def _reshape(t: Translator, n: Node, ins: List[str]) -> Optional[str]:
    shape = list(n.get("shape", ()))
    if any(d < -1 for d in shape) or n.get("reverse", False):
        t.refuse(n, "shape codes -2/-3/-4 or reverse")
        return None
    return t.b.node("Reshape", [ins[0], t.b.ints(n.name + "_shape", shape)], n.name)


def _transpose(t: Translator, n: Node, ins: List[str]) -> Optional[str]:
    axes = list(n.get("axes", ()))
    return t.b.node("Transpose", ins[:1], n.name, **({"perm": axes} if axes else {}))


def _expand_dims(t: Translator, n: Node, ins: List[str]) -> Optional[str]:
    return t.b.node("Unsqueeze", [ins[0], t.b.ints(n.name + "_axes", [int(n.get("axis", 0))])], n.name)


def _clip(t: Translator, n: Node, ins: List[str]) -> Optional[str]:
    return t.b.node("Clip", [ins[0], t.b.const(n.name + "_min", np.float32(n.get("a_min", 0.0))),
                             t.b.const(n.name + "_max", np.float32(n.get("a_max", 0.0)))], n.name)


def _upsampling(t: Translator, n: Node, ins: List[str]) -> Optional[str]:
    if str(n.get("sample_type", "nearest")) != "nearest" or len(ins) > 1:
        t.refuse(n, "sample_type=%s" % n.attrs.get("sample_type"))
        return None
    s = float(n.get("scale", 1))
    return t.b.node("Resize", [ins[0], "", t.b.const(n.name + "_scales", np.array([1, 1, s, s], np.float32))],
                    n.name, mode="nearest", coordinate_transformation_mode="asymmetric", nearest_mode="floor")


def _identity(t: Translator, n: Node, ins: List[str]) -> Optional[str]:
    return t.b.node("Identity", ins[:1], n.name)


def _sum(t: Translator, n: Node, ins: List[str]) -> Optional[str]:
    return t.b.node("Sum", ins, n.name)


OpFn = Callable[[Translator, Node, List[str]], Optional[str]]
OPS: Dict[str, OpFn] = {}
for _names, _fn in (
        (("Convolution", "Deconvolution"), _conv),
        (("BatchNorm",), _batch_norm),
        (("Activation",), _activation),
        (("LeakyReLU",), _leaky_relu),
        (("Pooling",), _pool),
        (("FullyConnected",), _fully_connected),
        (("SoftmaxOutput", "Softmax", "SoftmaxActivation", "softmax", "log_softmax"), _softmax),
        (("elemwise_add", "_plus", "_Plus", "broadcast_add", "broadcast_plus", "_add"), _binary("Add")),
        (("elemwise_sub", "_minus", "_Minus", "broadcast_sub", "broadcast_minus", "_sub"), _binary("Sub")),
        (("elemwise_mul", "_mul", "_Mul", "broadcast_mul"), _binary("Mul")),
        (("elemwise_div", "_div", "_Div", "broadcast_div"), _binary("Div")),
        (("broadcast_maximum", "_maximum"), _binary("Max")), (("broadcast_minimum", "_minimum"), _binary("Min")),
        (("_plus_scalar", "_PlusScalar"), _scalar("Add")), (("_minus_scalar", "_MinusScalar"), _scalar("Sub")),
        (("_mul_scalar", "_MulScalar"), _scalar("Mul")), (("_div_scalar", "_DivScalar"), _scalar("Div")),
        (("_rminus_scalar", "_RMinusScalar"), _scalar("Sub", True)),
        (("_rdiv_scalar", "_RDivScalar"), _scalar("Div", True)),
        (("relu",), _unary("Relu")), (("sigmoid",), _unary("Sigmoid")), (("tanh",), _unary("Tanh")),
        (("exp",), _unary("Exp")), (("log",), _unary("Log")), (("sqrt",), _unary("Sqrt")),
        (("abs",), _unary("Abs")), (("negative",), _unary("Neg")),
        (("Concat", "concat"), _concat),
        (("Flatten", "flatten"), _flatten), (("Reshape", "reshape"), _reshape),
        (("transpose",), _transpose), (("expand_dims",), _expand_dims), (("clip",), _clip),
        (("UpSampling",), _upsampling),
        (("Dropout", "_copy", "identity", "BlockGrad", "stop_gradient"), _identity),
        (("ElementWiseSum", "add_n"), _sum),
):
    for _name in _names:
        if _name in OPS:
            raise ValueError("MXNet op %r is registered twice" % _name)
        OPS[_name] = _fn

# ops whose inputs after the first are training labels, not model inputs
LABELLED = {"SoftmaxOutput", "Softmax", "LinearRegressionOutput", "LogisticRegressionOutput", "MAERegressionOutput",
            "SVMOutput"}
