"""Core ML ML Program (``.mlpackage``, MIL) operations as ONNX nodes.

The ``main`` function's block is translated op by op. ``const`` values (immediate or in the package's weight
file) and the ``constexpr_*`` decompressions are computed here and become initializers where a tensor is needed;
parameters that MIL requires to be constant (strides, axes, shapes...) are read from them directly.

Precision: an fp16 program (coremltools' default compute precision) is computed in float32. Its fp16 weights are
widened exactly and its fp16 casts become identities, so tether's result is the fp32 evaluation of the fp16
weights: closer to the source model than Core ML's own fp16 arithmetic. Inputs and outputs declared fp16 are
float32 tensors.
"""
from __future__ import annotations

import math
import os
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
from onnx import TensorProto

from tether.errors import InvalidInput, UnsupportedOpError
from tether.frontend.coreml import neuralnetwork as nn
from tether.frontend.coreml.blob import BlobFile
from tether.frontend.coreml.onnx_graph import OnnxGraph

Refused = nn.Refused
_MISSING = object()

# MIL.proto DataType -> numpy dtype of a value held here (fp16 and bf16 are computed as float32)
_NP_TYPES = {1: np.bool_, 2: np.str_, 10: np.float32, 11: np.float32, 12: np.float32, 13: np.float32,
             21: np.int8, 22: np.int16, 23: np.int32, 24: np.int64, 25: np.int8, 31: np.uint8, 32: np.uint16,
             33: np.uint32, 34: np.uint64, 35: np.uint8, 36: np.uint8, 37: np.uint8, 38: np.uint8, 39: np.uint8}
_ONNX_TYPES = {np.dtype(np.bool_): TensorProto.BOOL, np.dtype(np.float32): TensorProto.FLOAT,
               np.dtype(np.int8): TensorProto.INT8, np.dtype(np.int16): TensorProto.INT16,
               np.dtype(np.int32): TensorProto.INT32, np.dtype(np.int64): TensorProto.INT64,
               np.dtype(np.uint8): TensorProto.UINT8, np.dtype(np.uint16): TensorProto.UINT16,
               np.dtype(np.uint32): TensorProto.UINT32, np.dtype(np.uint64): TensorProto.UINT64}
# cast's dtype names -> ONNX element type (None: a float width, computed as float32)
_CAST_TYPES = {"fp16": None, "fp32": None, "fp64": None, "bf16": None, "int32": TensorProto.INT32,
               "int64": TensorProto.INT64, "int16": TensorProto.INT16, "int8": TensorProto.INT8,
               "uint8": TensorProto.UINT8, "uint16": TensorProto.UINT16, "bool": TensorProto.BOOL}


class Program:
    """The translation state: the graph, each MIL variable as an ONNX name or a constant, the weight files."""

    def __init__(self, graph: OnnxGraph, model_dir: str):
        self.g = graph
        self.names: Dict[str, str] = {}
        self.consts: Dict[str, np.ndarray] = {}
        self.model_dir = model_dir
        self._blobs: Dict[str, BlobFile] = {}

    # -- values ----------------------------------------------------------------------------------------------------

    def blob(self, file_name: str) -> BlobFile:
        rel = file_name.replace("@model_path/", "", 1) if file_name.startswith("@model_path/") else file_name
        path = os.path.join(self.model_dir, rel)
        if path not in self._blobs:
            self._blobs[path] = BlobFile(path)
        return self._blobs[path]

    def decode(self, value) -> object:
        """A MIL ``Value`` (immediate or blob file) as a numpy array, a string, or a list of those."""
        which = value.WhichOneof("value")
        vtype = value.type
        if which == "blobFileValue":
            dims = _dims(vtype)
            if dims is None:
                raise InvalidInput("a weight in %s has no static shape" % value.blobFileValue.fileName)
            arr = self.blob(value.blobFileValue.fileName).read(int(value.blobFileValue.offset), dims)
            return _widen(arr)
        if which != "immediateValue":
            raise Refused("a value without data")
        imm = value.immediateValue
        kind = imm.WhichOneof("value")
        if kind == "tensor":
            return _tensor_value(imm.tensor, vtype)
        if kind in ("tuple", "list"):
            seq = getattr(imm, kind)
            return [self.decode(v) for v in seq.values]
        raise Refused("an immediate %s value" % kind)

    def tensor(self, op, key: str) -> str:
        return self.tensor_of(_binding(op, key))

    def tensor_of(self, binding) -> str:
        """The ONNX name of an argument, materialising a constant as an initializer."""
        if binding.WhichOneof("binding") == "value":
            return self.g.const(_as_onnx_array(self.decode(binding.value)), "imm")
        return self.variable(binding.name)

    def variable(self, name: str) -> str:
        """The ONNX name of MIL variable ``name`` (KeyError when no op produced it)."""
        if name in self.names:
            return self.names[name]
        if name in self.consts:
            value = self.consts[name]
            self.names[name] = self.g.const(_as_onnx_array(value), _safe(name))
            return self.names[name]
        raise KeyError(name)

    def tensors(self, op, key: str) -> List[str]:
        return [self.tensor_of(b) for b in op.inputs[key].arguments]

    def const(self, op, key: str, default=_MISSING):
        """The constant value of input or attribute ``key`` (``default`` when the op does not give it)."""
        if key in op.inputs and op.inputs[key].arguments:
            args = op.inputs[key].arguments
            values = [self.const_of(b, key) for b in args]
            return values[0] if len(values) == 1 else values
        if key in op.attributes:
            return self.decode(op.attributes[key])
        if default is _MISSING:
            raise Refused("needs its %r" % key)
        return default

    def const_of(self, binding, key: str = "input"):
        if binding.WhichOneof("binding") == "value":
            return self.decode(binding.value)
        if binding.name in self.consts:
            return self.consts[binding.name]
        v = self.g.value(self.names.get(binding.name, ""))
        if v is not None:
            return v
        raise Refused("needs a constant %r (got the computed tensor %s)" % (key, binding.name))

    def is_const(self, op, key: str) -> bool:
        if key in op.attributes:
            return True
        if key not in op.inputs or not op.inputs[key].arguments:
            return False
        b = op.inputs[key].arguments[0]
        return b.WhichOneof("binding") == "value" or b.name in self.consts

    def has(self, op, key: str) -> bool:
        return (key in op.inputs and len(op.inputs[key].arguments) > 0) or key in op.attributes

    def ints(self, op, key: str, default=_MISSING) -> List[int]:
        v = self.const(op, key, default)
        return [int(i) for i in np.asarray(v).reshape(-1)] if v is not None else v

    def scalar(self, op, key: str, default=_MISSING):
        v = self.const(op, key, default)
        if isinstance(v, np.ndarray):
            v = v.reshape(-1)[0].item()
        elif isinstance(v, (np.generic,)):
            v = v.item()
        return v

    def rank(self, x: str) -> int:
        r = self.g.rank(x)
        if r is None:
            raise Refused("needs the rank of its input")
        return r

    def shape(self, x: str, why: str) -> Tuple[int, ...]:
        s = self.g.shape(x)
        if s is None:
            raise Refused("needs the static shape of its input for %s" % why)
        return s


def _safe(name: str) -> str:
    return name or "v"


def _binding(op, key: str):
    if key not in op.inputs or not op.inputs[key].arguments:
        raise Refused("needs its input %r" % key)
    return op.inputs[key].arguments[0]


def _dims(vtype) -> Optional[List[int]]:
    if not vtype.HasField("tensorType"):
        return None
    t = vtype.tensorType
    dims = []
    for d in t.dimensions:
        if d.WhichOneof("dimension") != "constant":
            return None
        dims.append(int(d.constant.size))
    return dims


def _widen(arr: np.ndarray) -> np.ndarray:
    if arr.dtype in (np.float16, np.float64):
        return arr.astype(np.float32)
    return arr


def _tensor_value(tv, vtype) -> object:
    dims = _dims(vtype) or []
    dtype = vtype.tensorType.dataType if vtype.HasField("tensorType") else 0
    kind = tv.WhichOneof("value")
    if kind == "strings":
        vals = list(tv.strings.values)
        return vals[0] if not dims and len(vals) == 1 else vals
    if kind == "floats":
        arr = np.asarray(tv.floats.values, np.float32)
    elif kind == "doubles":
        arr = np.asarray(tv.doubles.values, np.float64)
    elif kind == "ints":
        arr = np.asarray(tv.ints.values, np.int32)
    elif kind == "longInts":
        arr = np.asarray(tv.longInts.values, np.int64)
    elif kind == "bools":
        arr = np.asarray(tv.bools.values, np.bool_)
    elif kind == "bytes":
        raw = tv.bytes.values
        arr = np.frombuffer(raw, dtype={10: "<f2", 11: "<f4", 12: "<f8", 13: "<u2", 21: np.int8, 22: "<i2",
                                        23: "<i4", 24: "<i8", 31: np.uint8, 32: "<u2", 33: "<u4",
                                        34: "<u8"}.get(dtype, np.uint8))
        if dtype == 13:
            arr = (arr.astype(np.uint32) << 16).view(np.float32)
    else:
        arr = np.zeros(0, np.float32)
    target = _NP_TYPES.get(dtype)
    if target is not None and target is not np.str_:
        arr = arr.astype(target)
    arr = _widen(arr)
    count = int(np.prod(dims)) if dims else 1
    if arr.size == count:
        return arr.reshape(dims)
    if arr.size == 1:                 # a splat
        return np.full(dims, arr.reshape(-1)[0], arr.dtype)
    return arr


def _as_onnx_array(v) -> np.ndarray:
    arr = np.asarray(v)
    if arr.dtype.kind == "U":
        raise Refused("a string used as a tensor")
    if arr.dtype == np.float64 or arr.dtype == np.float16:
        arr = arr.astype(np.float32)
    return arr


OpConverter = Callable[[Program, object], List[str]]


# -- helpers -----------------------------------------------------------------------------------------------------

def _pads(p: Program, op, x: str, kernel: Sequence[int], strides: Sequence[int], dilations: Sequence[int],
          ceil_mode: bool = False) -> List[int]:
    """ONNX begin-then-end pads of a conv or pool from MIL's pad_type (valid, same, same_lower, custom) and pad."""
    kind = p.scalar(op, "pad_type", "valid")
    n = len(kernel)
    if kind == "custom":
        pad = p.ints(op, "pad", [0] * (2 * n))
        return pad[0::2] + pad[1::2]
    if kind == "valid":
        return [0] * (2 * n)
    if kind not in ("same", "same_lower"):
        raise Refused("pad_type %r" % kind)
    spatial = p.shape(x, "SAME padding")[-n:]
    pairs = [nn._same_pads(size, k, s, d, kind == "same_lower")
             for size, k, s, d in zip(spatial, kernel, strides, dilations)]
    return [b for b, _ in pairs] + [e for _, e in pairs]


def _conv(p: Program, op) -> List[str]:
    g = p.g
    x = p.tensor(op, "x")
    w = p.tensor(op, "weight")
    wshape = p.shape(w, "the kernel size")
    k = list(wshape[2:])
    n = len(k)
    strides = p.ints(op, "strides", [1] * n)
    dil = p.ints(op, "dilations", [1] * n)
    inputs = [x, w] + ([p.tensor(op, "bias")] if p.has(op, "bias") else [])
    return [g.node("Conv", inputs, "conv", kernel_shape=k, strides=strides, dilations=dil,
                   group=int(p.scalar(op, "groups", 1)), pads=_pads(p, op, x, k, strides, dil))]


def _conv_transpose(p: Program, op) -> List[str]:
    g = p.g
    x = p.tensor(op, "x")
    w = p.tensor(op, "weight")
    wshape = p.shape(w, "the kernel size")
    k = list(wshape[2:])
    n = len(k)
    strides = p.ints(op, "strides", [1] * n)
    dil = p.ints(op, "dilations", [1] * n)
    groups = int(p.scalar(op, "groups", 1))
    kind = p.scalar(op, "pad_type", "valid")
    pad = p.ints(op, "pad", [0] * (2 * n)) if kind == "custom" else [0] * (2 * n)
    spatial = p.shape(x, "a transposed convolution's output size")[-n:]
    given = p.ints(op, "output_shape", None) if p.has(op, "output_shape") else None
    begins, ends, out_pad = [], [], []
    for i, (size, kk, s, d) in enumerate(zip(spatial, k, strides, dil)):
        full = (size - 1) * s + (kk - 1) * d + 1
        if given is not None:
            target = given[len(given) - n + i]
        elif kind in ("same", "same_lower"):
            target = size * s
        else:
            target = full - pad[2 * i] - pad[2 * i + 1]
        crop = full - target
        if kind == "custom":
            begin = min(pad[2 * i], max(crop, 0))
        elif kind == "same_lower":
            begin = crop - crop // 2
        else:
            begin = crop // 2 if kind == "same" else 0
        end = crop - begin
        begins.append(begin)
        ends.append(max(end, 0))
        out_pad.append(max(-end, 0))
    inputs = [x, w] + ([p.tensor(op, "bias")] if p.has(op, "bias") else [])
    return [g.node("ConvTranspose", inputs, "conv_transpose", kernel_shape=k, strides=strides, dilations=dil,
                   group=groups, pads=begins + ends, output_padding=out_pad if any(out_pad) else None)]


def _pool(kind: str) -> OpConverter:
    def convert(p: Program, op) -> List[str]:
        g = p.g
        x = p.tensor(op, "x")
        k = p.ints(op, "kernel_sizes")
        strides = p.ints(op, "strides", [1] * len(k))
        ceil = bool(p.scalar(op, "ceil_mode", False))
        pads = _pads(p, op, x, k, strides, [1] * len(k))
        if kind == "max":
            return [g.node("MaxPool", [x], "max_pool", kernel_shape=k, strides=strides, pads=pads, ceil_mode=int(ceil))]
        if kind == "l2":
            return [g.node("LpPool", [x], "l2_pool", kernel_shape=k, strides=strides, pads=pads, p=2)]
        exclude = bool(p.scalar(op, "exclude_padding_from_average", False))
        return [g.node("AveragePool", [x], "avg_pool", kernel_shape=k, strides=strides, pads=pads,
                       ceil_mode=int(ceil), count_include_pad=0 if exclude else 1)]
    return convert


def _linear(p: Program, op) -> List[str]:
    g = p.g
    x = p.tensor(op, "x")
    if p.is_const(op, "weight"):
        w = np.asarray(p.const(op, "weight"), np.float32)
        y = g.node("MatMul", [x, g.const(np.ascontiguousarray(w.T), "linear_W")], "linear")
    else:
        w = p.tensor(op, "weight")
        y = g.node("MatMul", [x, g.transpose(w, [1, 0])], "linear")
    if p.has(op, "bias"):
        y = g.node("Add", [y, p.tensor(op, "bias")], "linear_bias")
    return [y]


def _matmul(p: Program, op) -> List[str]:
    g = p.g
    x, y = p.tensor(op, "x"), p.tensor(op, "y")
    if p.scalar(op, "transpose_x", False):
        x = g.transpose(x, nn._swap_last(p.rank(x)))
    if p.scalar(op, "transpose_y", False):
        y = g.transpose(y, nn._swap_last(p.rank(y)))
    return [g.node("MatMul", [x, y], "matmul")]


def _binary(onnx_op: str) -> OpConverter:
    def convert(p: Program, op) -> List[str]:
        return [p.g.node(onnx_op, [p.tensor(op, "x"), p.tensor(op, "y")], onnx_op.lower())]
    return convert


def _not_equal(p: Program, op) -> List[str]:
    g = p.g
    return [g.node("Not", [g.node("Equal", [p.tensor(op, "x"), p.tensor(op, "y")])], "not_equal")]


def _floor_div(p: Program, op) -> List[str]:
    g = p.g
    x, y = p.tensor(op, "x"), p.tensor(op, "y")
    if g.elem_type(x) == TensorProto.FLOAT:
        return [g.node("Floor", [g.node("Div", [x, y])], "floor_div")]
    # integers: round toward negative infinity, as the float path does
    xf = g.node("Cast", [x], to=TensorProto.FLOAT)
    yf = g.node("Cast", [y], to=TensorProto.FLOAT)
    return [g.node("Cast", [g.node("Floor", [g.node("Div", [xf, yf])])], "floor_div", to=g.elem_type(x))]


def _mod(p: Program, op) -> List[str]:
    g = p.g
    x, y = p.tensor(op, "x"), p.tensor(op, "y")
    if g.elem_type(x) != TensorProto.FLOAT:
        return [g.node("Mod", [x, y], "mod", fmod=0)]
    q = g.node("Floor", [g.node("Div", [x, y])])
    return [g.node("Sub", [x, g.node("Mul", [q, y])], "mod")]


def _unary(onnx_op: str, **attrs) -> OpConverter:
    def convert(p: Program, op) -> List[str]:
        return [p.g.node(onnx_op, [p.tensor(op, "x")], onnx_op.lower(), **attrs)]
    return convert


def _with_alpha(onnx_op: str, default_alpha: float) -> OpConverter:
    def convert(p: Program, op) -> List[str]:
        return [p.g.node(onnx_op, [p.tensor(op, "x")], onnx_op.lower(),
                         alpha=float(p.scalar(op, "alpha", default_alpha)))]
    return convert


def _eps_unary(kind: str, default_eps: float) -> OpConverter:
    """inverse 1/(x+eps), log log(x+eps), rsqrt 1/sqrt(x+eps)."""
    def convert(p: Program, op) -> List[str]:
        g = p.g
        x = g.node("Add", [p.tensor(op, "x"), g.scalar(float(p.scalar(op, "epsilon", default_eps)))])
        if kind == "inverse":
            return [g.node("Reciprocal", [x], "inverse")]
        if kind == "log":
            return [g.node("Log", [x], "log")]
        return [g.node("Reciprocal", [g.node("Sqrt", [x])], "rsqrt")]
    return convert


def _silu(p: Program, op) -> List[str]:
    g = p.g
    x = p.tensor(op, "x")
    return [g.node("Mul", [x, g.node("Sigmoid", [x])], "silu")]


def _relu6(p: Program, op) -> List[str]:
    g = p.g
    return [g.node("Clip", [p.tensor(op, "x"), g.scalar(0.0), g.scalar(6.0)], "relu6")]


def _gelu(p: Program, op) -> List[str]:
    mode = {"EXACT": 0, "TANH_APPROXIMATION": 1, "SIGMOID_APPROXIMATION": 2}[p.scalar(op, "mode", "EXACT")]
    return [nn.gelu(p.g, p.tensor(op, "x"), mode, "gelu")]


def _softmax(p: Program, op) -> List[str]:
    return [p.g.node("Softmax", [p.tensor(op, "x")], "softmax", axis=int(p.scalar(op, "axis", -1)))]


def _clip(p: Program, op) -> List[str]:
    g = p.g
    return [g.node("Clip", [p.tensor(op, "x"), p.tensor(op, "alpha"), p.tensor(op, "beta")], "clip")]


def _threshold(p: Program, op) -> List[str]:
    return [p.g.node("Max", [p.tensor(op, "x"), p.tensor(op, "alpha")], "threshold")]


def _square(p: Program, op) -> List[str]:
    x = p.tensor(op, "x")
    return [p.g.node("Mul", [x, x], "square")]


def _exp2(p: Program, op) -> List[str]:
    return [p.g.node("Pow", [p.g.scalar(2.0), p.tensor(op, "x")], "exp2")]


def _sigmoid_hard(p: Program, op) -> List[str]:
    return [p.g.node("HardSigmoid", [p.tensor(op, "x")], "sigmoid_hard", alpha=float(p.scalar(op, "alpha", 0.2)),
                     beta=float(p.scalar(op, "beta", 0.5)))]


def _scaled_tanh(p: Program, op) -> List[str]:
    g = p.g
    y = g.node("Tanh", [g.node("Mul", [p.tensor(op, "x"), g.scalar(float(p.scalar(op, "beta", 1.0)))])])
    return [g.node("Mul", [y, g.scalar(float(p.scalar(op, "alpha", 1.0)))], "scaled_tanh")]


def _linear_activation(p: Program, op) -> List[str]:
    g = p.g
    y = g.node("Mul", [p.tensor(op, "x"), g.scalar(float(p.scalar(op, "alpha")))])
    return [g.node("Add", [y, g.scalar(float(p.scalar(op, "beta", 0.0)))], "linear_activation")]


def _clamped_relu(p: Program, op) -> List[str]:
    g = p.g
    y = g.node("LeakyRelu", [p.tensor(op, "x")], alpha=float(p.scalar(op, "alpha", 0.0)))
    return [g.node("Min", [y, g.scalar(float(p.scalar(op, "beta", 6.0)))], "clamped_relu")]


def _channel_param(p: Program, op, key: str, x: str) -> str:
    """A per-channel (axis 1) parameter shaped to broadcast over ``x``."""
    v = np.asarray(p.const(op, key), np.float32).reshape(-1)
    return p.g.const(v.reshape([-1] + [1] * (p.rank(x) - 2)), key)


def _prelu(p: Program, op) -> List[str]:
    x = p.tensor(op, "x")
    return [p.g.node("PRelu", [x, _channel_param(p, op, "alpha", x)], "prelu")]


def _softplus_parametric(p: Program, op) -> List[str]:
    g = p.g
    x = p.tensor(op, "x")
    y = g.node("Softplus", [g.node("Mul", [x, _channel_param(p, op, "beta", x)])])
    return [g.node("Mul", [y, _channel_param(p, op, "alpha", x)], "softplus_parametric")]


def _batch_norm(p: Program, op) -> List[str]:
    g = p.g
    x = p.tensor(op, "x")
    mean = np.asarray(p.const(op, "mean"), np.float32).reshape(-1)
    var = np.asarray(p.const(op, "variance"), np.float32).reshape(-1)
    c = mean.size
    gamma = np.asarray(p.const(op, "gamma", np.ones(c, np.float32)), np.float32).reshape(-1)
    beta = np.asarray(p.const(op, "beta", np.zeros(c, np.float32)), np.float32).reshape(-1)
    eps = float(p.scalar(op, "epsilon", 1e-5))
    scale = gamma / np.sqrt(var + eps)
    shift = beta - mean * scale
    shape = [c] + [1] * (p.rank(x) - 2)
    y = g.node("Mul", [x, g.const(scale.reshape(shape), "bn_scale")])
    return [g.node("Add", [y, g.const(shift.reshape(shape), "bn_shift")], "batch_norm")]


def _instance_norm(p: Program, op) -> List[str]:
    g = p.g
    x = p.tensor(op, "x")
    c = p.shape(x, "instance_norm")[1]
    gamma = np.asarray(p.const(op, "gamma", np.ones(c, np.float32)), np.float32).reshape(-1)
    beta = np.asarray(p.const(op, "beta", np.zeros(c, np.float32)), np.float32).reshape(-1)
    return [g.node("InstanceNormalization", [x, g.const(gamma, "in_gamma"), g.const(beta, "in_beta")],
                   "instance_norm", epsilon=float(p.scalar(op, "epsilon", 1e-5)))]


def _layer_norm(p: Program, op) -> List[str]:
    g = p.g
    x = p.tensor(op, "x")
    r = p.rank(x)
    axes = sorted(a % r for a in p.ints(op, "axes", list(range(r))))
    eps = float(p.scalar(op, "epsilon", 1e-5))
    s = p.shape(x, "layer_norm")
    norm_shape = [s[a] for a in axes]
    gamma = np.asarray(p.const(op, "gamma", np.ones(norm_shape, np.float32)), np.float32).reshape(norm_shape)
    beta = np.asarray(p.const(op, "beta", np.zeros(norm_shape, np.float32)), np.float32).reshape(norm_shape)
    if axes == list(range(r - len(axes), r)):
        return [g.node("LayerNormalization", [x, g.const(gamma, "ln_gamma"), g.const(beta, "ln_beta")],
                       "layer_norm", axis=r - len(axes), epsilon=eps)]
    mean = g.node("ReduceMean", [x], axes=axes, keepdims=1)
    d = g.node("Sub", [x, mean])
    var = g.node("ReduceMean", [g.node("Mul", [d, d])], axes=axes, keepdims=1)
    y = g.node("Div", [d, g.node("Sqrt", [g.node("Add", [var, g.scalar(eps)])])])
    bshape = [s[i] if i in axes else 1 for i in range(r)]
    y = g.node("Mul", [y, g.const(gamma.reshape(bshape), "ln_gamma")])
    return [g.node("Add", [y, g.const(beta.reshape(bshape), "ln_beta")], "layer_norm")]


def _l2_norm(p: Program, op) -> List[str]:
    g = p.g
    x = p.tensor(op, "x")
    ss = g.node("ReduceSumSquare", [x], axes=[-3, -2, -1], keepdims=1)
    norm = g.node("Sqrt", [g.node("Add", [ss, g.scalar(float(p.scalar(op, "epsilon", 1e-6)))])])
    return [g.node("Div", [x, norm], "l2_norm")]


def _lrn(p: Program, op) -> List[str]:
    return [p.g.node("LRN", [p.tensor(op, "x")], "local_response_norm", size=int(p.scalar(op, "size")),
                     alpha=float(p.scalar(op, "alpha", 1e-4)), beta=float(p.scalar(op, "beta", 0.75)),
                     bias=float(p.scalar(op, "k", 1.0)))]


_REDUCE = {"reduce_mean": "ReduceMean", "reduce_sum": "ReduceSum", "reduce_max": "ReduceMax",
           "reduce_min": "ReduceMin", "reduce_prod": "ReduceProd", "reduce_l1_norm": "ReduceL1",
           "reduce_l2_norm": "ReduceL2", "reduce_log_sum": "ReduceLogSum", "reduce_log_sum_exp": "ReduceLogSumExp",
           "reduce_sum_square": "ReduceSumSquare"}


def _reduce(onnx_op: str) -> OpConverter:
    def convert(p: Program, op) -> List[str]:
        axes = p.ints(op, "axes", None) if p.has(op, "axes") else None
        return [nn._reduce_node(p.g, onnx_op, p.tensor(op, "x"), axes, bool(p.scalar(op, "keep_dims", False)),
                                onnx_op.lower())]
    return convert


def _arg(onnx_op: str) -> OpConverter:
    def convert(p: Program, op) -> List[str]:
        g = p.g
        y = g.node(onnx_op, [p.tensor(op, "x")], axis=int(p.scalar(op, "axis", -1)),
                   keepdims=int(bool(p.scalar(op, "keep_dims", False))))
        return [g.node("Cast", [y], onnx_op.lower(), to=TensorProto.INT32)]
    return convert


def _reshape(p: Program, op) -> List[str]:
    g = p.g
    x = p.tensor(op, "x")
    if p.is_const(op, "shape"):
        return [g.reshape(x, p.ints(op, "shape"), "reshape")]
    shape = g.node("Cast", [p.tensor(op, "shape")], to=TensorProto.INT64)
    return [g.node("Reshape", [x, shape], "reshape")]


def _transpose(p: Program, op) -> List[str]:
    return [p.g.transpose(p.tensor(op, "x"), p.ints(op, "perm"), "transpose")]


def _concat(p: Program, op) -> List[str]:
    if p.scalar(op, "interleave", False):
        raise Refused("an interleaving concat")
    return [p.g.node("Concat", p.tensors(op, "values"), "concat", axis=int(p.scalar(op, "axis")))]


def _split(p: Program, op) -> List[str]:
    g = p.g
    x = p.tensor(op, "x")
    axis = int(p.scalar(op, "axis"))
    n = len(op.outputs)
    if p.has(op, "split_sizes"):
        sizes = p.ints(op, "split_sizes")
    else:
        sizes = nn._split_sizes(p, x, axis, n)     # Program offers shape() as the layer context does
    if n == 1:
        return [g.node("Identity", [x], "split")]
    return g.node("Split", [x, g.ints(sizes, "split_sizes")], "split", outputs=n, axis=axis)


def _slice_by_index(p: Program, op) -> List[str]:
    x = p.tensor(op, "x")
    r = p.rank(x)
    begin = p.ints(op, "begin")
    end = p.ints(op, "end")
    stride = p.ints(op, "stride", [1] * r)
    masks = [[bool(v) for v in np.asarray(p.const(op, k, np.zeros(r, np.bool_))).reshape(-1)]
             for k in ("begin_mask", "end_mask", "squeeze_mask")]
    return [nn.strided_slice(p.g, x, begin, end, stride, masks[0], masks[1], masks[2], "slice_by_index")]


def _slice_by_size(p: Program, op) -> List[str]:
    g = p.g
    x = p.tensor(op, "x")
    begin = p.ints(op, "begin")
    size = p.ints(op, "size")
    ends = [nn.INT64_MAX if s == -1 else b + s for b, s in zip(begin, size)]
    return [g.node("Slice", [x, g.ints(begin), g.ints(ends), g.ints(list(range(len(begin))))], "slice_by_size")]


def _squeeze(p: Program, op) -> List[str]:
    g = p.g
    x = p.tensor(op, "x")
    if p.has(op, "axes"):
        axes = p.ints(op, "axes")
    else:
        axes = [i for i, d in enumerate(p.shape(x, "squeezing every axis of size 1")) if d == 1]
    return [g.squeeze(x, axes, "squeeze") if axes else g.node("Identity", [x], "squeeze")]


def _expand_dims(p: Program, op) -> List[str]:
    return [p.g.unsqueeze(p.tensor(op, "x"), p.ints(op, "axes"), "expand_dims")]


def _pad(p: Program, op) -> List[str]:
    g = p.g
    x = p.tensor(op, "x")
    r = p.rank(x)
    amounts = p.ints(op, "pad")
    amounts = [0] * (2 * r - len(amounts)) + amounts          # (begin, end) pairs for the last axes
    pads = amounts[0::2] + amounts[1::2]
    mode = {"constant": "constant", "reflect": "reflect", "replicate": "edge"}[p.scalar(op, "mode", "constant")]
    inputs = [x, g.ints(pads, "pads")]
    if mode == "constant":
        inputs.append(g.scalar(float(p.scalar(op, "constant_val", 0.0))))
    return [g.node("Pad", inputs, "pad", mode=mode)]


def _coord_align(out_sizes: Sequence[int]) -> str:
    # Core ML's ALIGN_CORNERS samples the centre when an axis resizes to 1, which is what half_pixel gives there
    return "half_pixel" if all(s == 1 for s in out_sizes) else "align_corners"


def _upsample_nearest(p: Program, op) -> List[str]:
    x = p.tensor(op, "x")
    s = p.shape(x, "upsample")
    fh = float(p.scalar(op, "scale_factor_height", 1))
    fw = float(p.scalar(op, "scale_factor_width", 1))
    sizes = list(s[:-2]) + [int(math.floor(s[-2] * fh)), int(math.floor(s[-1] * fw))]
    return [nn._resize(p.g, x, sizes, "nearest", "asymmetric", "upsample_nearest_neighbor")]


def _upsample_bilinear(p: Program, op) -> List[str]:
    x = p.tensor(op, "x")
    s = p.shape(x, "upsample")
    fh = float(p.scalar(op, "scale_factor_height", 1))
    fw = float(p.scalar(op, "scale_factor_width", 1))
    sizes = list(s[:-2]) + [int(math.floor(s[-2] * fh)), int(math.floor(s[-1] * fw))]
    align = bool(p.scalar(op, "align_corners", True))
    half = bool(p.scalar(op, "half_pixel_centers", not align))
    coord = _coord_align(sizes[-2:]) if align else ("half_pixel" if half else "asymmetric")
    return [nn._resize(p.g, x, sizes, "linear", coord, "upsample_bilinear")]


def _resize_bilinear(p: Program, op) -> List[str]:
    x = p.tensor(op, "x")
    s = p.shape(x, "resize")
    sizes = list(s[:-2]) + [int(p.scalar(op, "target_size_height", 1)), int(p.scalar(op, "target_size_width", 1))]
    mode = p.scalar(op, "sampling_mode", "DEFAULT")
    coord = {"STRICT_ALIGN_CORNERS": "align_corners", "ALIGN_CORNERS": _coord_align(sizes[-2:]),
             "DEFAULT": "asymmetric", "UNALIGN_CORNERS": "half_pixel"}.get(mode)
    if coord is None:
        raise Refused("sampling_mode %s" % mode)
    return [nn._resize(p.g, x, sizes, "linear", coord, "resize_bilinear")]


def _resize_nearest(p: Program, op) -> List[str]:
    x = p.tensor(op, "x")
    s = p.shape(x, "resize")
    sizes = list(s[:-2]) + [int(p.scalar(op, "target_size_height", 1)), int(p.scalar(op, "target_size_width", 1))]
    return [nn._resize(p.g, x, sizes, "nearest", "asymmetric", "resize_nearest_neighbor")]


def _cast(p: Program, op) -> List[str]:
    g = p.g
    x = p.tensor(op, "x")
    dtype = p.scalar(op, "dtype")
    if dtype not in _CAST_TYPES:
        raise Refused("cast to %s" % dtype)
    to = _CAST_TYPES[dtype] or TensorProto.FLOAT
    if g.elem_type(x) == to:            # fp16 <-> fp32 included: both are float32 here
        return [g.node("Identity", [x], "cast")]
    return [g.node("Cast", [x], "cast", to=to)]         # float to integer truncates, in MIL as in ONNX


def _identity(p: Program, op) -> List[str]:
    return [p.g.node("Identity", [p.tensor(op, "x")], "identity")]


def _gather(p: Program, op) -> List[str]:
    if int(p.scalar(op, "batch_dims", 0)):
        raise Refused("gather with batch_dims")
    return [p.g.node("Gather", [p.tensor(op, "x"), p.tensor(op, "indices")], "gather",
                     axis=int(p.scalar(op, "axis", 0)))]


def _gather_along_axis(p: Program, op) -> List[str]:
    return [p.g.node("GatherElements", [p.tensor(op, "x"), p.tensor(op, "indices")], "gather_along_axis",
                     axis=int(p.scalar(op, "axis", 0)))]


def _gather_nd(p: Program, op) -> List[str]:
    g = p.g
    idx = g.node("Cast", [p.tensor(op, "indices")], to=TensorProto.INT64)
    return [g.node("GatherND", [p.tensor(op, "x"), idx], "gather_nd", batch_dims=int(p.scalar(op, "batch_dims", 0)))]


def _tile(p: Program, op) -> List[str]:
    return [p.g.node("Tile", [p.tensor(op, "x"), p.g.ints(p.ints(op, "reps"))], "tile")]


def _stack(p: Program, op) -> List[str]:
    g = p.g
    axis = int(p.scalar(op, "axis"))
    return [g.node("Concat", [g.unsqueeze(v, [axis]) for v in p.tensors(op, "values")], "stack", axis=axis)]


def _select(p: Program, op) -> List[str]:
    g = p.g
    cond = p.tensor(op, "cond")
    if g.elem_type(cond) != TensorProto.BOOL:
        cond = g.node("Cast", [cond], to=TensorProto.BOOL)
    return [g.node("Where", [cond, p.tensor(op, "a"), p.tensor(op, "b")], "select")]


def _shape(p: Program, op) -> List[str]:
    g = p.g
    return [g.node("Cast", [g.node("Shape", [p.tensor(op, "x")])], "shape", to=TensorProto.INT32)]


def _fill(p: Program, op) -> List[str]:
    g = p.g
    shape = p.ints(op, "shape")
    return [g.node("Identity", [g.const(np.full(shape, p.scalar(op, "value", 0.0), np.float32), "fill")], "fill")]


def _range_1d(p: Program, op) -> List[str]:
    start, end, step = (p.const(op, k) for k in ("start", "end", "step"))
    values = np.arange(np.asarray(start).item(), np.asarray(end).item(), np.asarray(step).item())
    dtype = np.int32 if np.asarray(start).dtype.kind in "iu" else np.float32
    return [p.g.node("Identity", [p.g.const(values.astype(dtype), "range", dtype=dtype)], "range_1d")]


def _cumsum(p: Program, op) -> List[str]:
    g = p.g
    axis = g.const(np.asarray(int(p.scalar(op, "axis", 0)), np.int64), "axis")
    return [g.node("CumSum", [p.tensor(op, "x"), axis], "cumsum", exclusive=int(bool(p.scalar(op, "exclusive", False))),
                   reverse=int(bool(p.scalar(op, "reverse", False))))]


def _topk(p: Program, op) -> List[str]:
    g = p.g
    vals, idx = g.node("TopK", [p.tensor(op, "x"), g.ints([int(p.scalar(op, "k", 1))])], "topk", outputs=2,
                       axis=int(p.scalar(op, "axis", -1)), largest=0 if p.scalar(op, "ascending", False) else 1)
    return [vals, g.node("Cast", [idx], "topk_indices", to=TensorProto.INT32)]


def _band_part(p: Program, op) -> List[str]:
    g = p.g
    x = p.tensor(op, "x")
    s = p.shape(x, "band_part")
    lower, upper = int(p.scalar(op, "lower", -1)), int(p.scalar(op, "upper", -1))
    rows, cols = s[-2], s[-1]
    i, j = np.arange(rows)[:, None], np.arange(cols)[None, :]
    mask = ((i - j <= (lower if lower >= 0 else rows)) & (j - i <= (upper if upper >= 0 else cols)))
    return [g.node("Mul", [x, g.const(mask.astype(np.float32), "band")], "band_part")]


def _space_depth(kind: str) -> OpConverter:
    def convert(p: Program, op) -> List[str]:
        g = p.g
        x = p.tensor(op, "x")
        if kind == "space_to_depth":
            return [g.node("SpaceToDepth", [x], kind, blocksize=int(p.scalar(op, "block_size")))]
        if kind == "depth_to_space":
            return [g.node("DepthToSpace", [x], kind, blocksize=int(p.scalar(op, "block_size")), mode="DCR")]
        return [g.node("DepthToSpace", [x], kind, blocksize=int(p.scalar(op, "upscale_factor")), mode="CRD")]
    return convert


def _attention(p: Program, op) -> List[str]:
    """softmax(Q K^T / sqrt(E) + mask) V; a bool mask keeps the scores where it is true (-inf elsewhere)."""
    g = p.g
    q, k, v = p.tensor(op, "query"), p.tensor(op, "key"), p.tensor(op, "value")
    e = p.shape(q, "the attention scale")[-1]
    scores = g.node("MatMul", [q, g.transpose(k, nn._swap_last(p.rank(k)))])
    scores = g.node("Mul", [scores, g.scalar(1.0 / math.sqrt(e))])
    if p.has(op, "attn_mask"):
        mask = p.tensor(op, "attn_mask")
        if g.elem_type(mask) == TensorProto.BOOL:
            scores = g.node("Where", [mask, scores, g.scalar(-np.inf)])
        else:
            scores = g.node("Add", [scores, mask])
    return [g.node("MatMul", [g.node("Softmax", [scores], axis=-1), v], "attention")]


def _einsum(p: Program, op) -> List[str]:
    return [p.g.node("Einsum", p.tensors(op, "values"), "einsum", equation=str(p.scalar(op, "equation")))]


def _one_hot(p: Program, op) -> List[str]:
    g = p.g
    size = int(p.scalar(op, "one_hot_vector_size"))
    idx = g.node("Cast", [p.tensor(op, "indices")], to=TensorProto.INT64)
    # like Core ML's NeuralNetwork layer, an index outside [0, size) gives off values, not one counted from the end
    idx = g.node("Where", [g.node("Less", [idx, g.ints([0])]), g.ints([size]), idx])
    on, off = float(p.scalar(op, "on_value", 1.0)), float(p.scalar(op, "off_value", 0.0))
    return [g.node("OneHot", [idx, g.ints([size]), g.const(np.asarray([off, on], np.float32))], "one_hot",
                   axis=int(p.scalar(op, "axis", -1)))]


def _crop(p: Program, op) -> List[str]:
    g = p.g
    x = p.tensor(op, "x")
    s = p.shape(x, "crop")
    (top, bottom), (left, right) = p.ints(op, "crop_height"), p.ints(op, "crop_width")
    return [g.node("Slice", [x, g.ints([top, left]), g.ints([s[-2] - bottom, s[-1] - right]), g.ints([-2, -1])],
                   "crop")]


def _argsort(p: Program, op) -> List[str]:
    g = p.g
    x = p.tensor(op, "x")
    axis = int(p.scalar(op, "axis", -1))
    n = p.shape(x, "argsort")[axis]
    _, idx = g.node("TopK", [x, g.ints([n])], "argsort_topk", outputs=2, axis=axis,
                    largest=0 if p.scalar(op, "ascending", False) else 1)
    return [g.node("Cast", [idx], "argsort", to=TensorProto.INT32)]


_RNN_ACTIVATIONS = {"sigmoid": "Sigmoid", "tanh": "Tanh", "relu": "Relu", "hard_sigmoid": "HardSigmoid"}


def _rnn_common(p: Program, op, gates: int, order: Sequence[int], names: Sequence[str]):
    """ONNX W, R, B (gate rows reordered from MIL's to ONNX's), the direction and the activations of an lstm or
    gru op. MIL writes one bias per gate (input and recurrent biases summed): it becomes ONNX's input bias."""
    direction = p.scalar(op, "direction", "forward")
    if direction not in ("forward", "bidirectional"):
        # a reverse-only MIL RNN lists its outputs in processing order, unlike ONNX's: not translated
        raise Refused("direction %r" % direction)
    if p.has(op, "clip") and p.scalar(op, "clip", None) is not None:
        raise Refused("clip (Core ML clips the cell state, ONNX the gate inputs)")
    suffixes = ("", "_back") if direction == "bidirectional" else ("",)
    ws, rs, bs = [], [], []
    for suffix in suffixes:
        w = np.asarray(p.const(op, "weight_ih" + suffix), np.float32)
        r = np.asarray(p.const(op, "weight_hh" + suffix), np.float32)
        hidden = r.shape[1]
        b = np.asarray(p.const(op, "bias" + suffix, np.zeros(gates * hidden, np.float32)), np.float32)

        def reorder(a):
            return np.concatenate([a[i * hidden:(i + 1) * hidden] for i in order], axis=0)
        ws.append(reorder(w))
        rs.append(reorder(r))
        bs.append(np.concatenate([reorder(b), np.zeros(gates * hidden, np.float32)]))
    acts = []
    for key, default in names:
        name = p.scalar(op, key, default)
        if name not in _RNN_ACTIVATIONS:
            raise Refused("%s %r" % (key, name))
        acts.append(_RNN_ACTIVATIONS[name])
    g = p.g
    return (g.const(np.stack(ws), "rnn_W"), g.const(np.stack(rs), "rnn_R"), g.const(np.stack(bs), "rnn_B"), hidden,
            direction, acts * len(suffixes), len(suffixes))


def _rnn_state(p: Program, op, key: str, dirs: int, hidden: int) -> str:
    """MIL's state [b, D*H] as ONNX's [D, b, H]."""
    g = p.g
    x = p.tensor(op, key)
    b = p.shape(x, "an RNN state")[0]
    return g.transpose(g.reshape(x, [b, dirs, hidden]), [1, 0, 2])


def _rnn_outputs(p: Program, op, y: str, y_h: str, dirs: int, hidden: int) -> List[str]:
    """ONNX's Y [s, D, b, H] and Y_h [D, b, H] as MIL's sequence output and final state."""
    g = p.g
    s, _, b, _ = p.shape(y, "an RNN output")
    if p.scalar(op, "output_sequence", False):
        seq = g.reshape(g.transpose(y, [0, 2, 1, 3]), [s, b, dirs * hidden])
    else:
        seq = g.reshape(g.transpose(y_h, [1, 0, 2]), [1, b, dirs * hidden])
    return [seq, g.reshape(g.transpose(y_h, [1, 0, 2]), [b, dirs * hidden])]


def _lstm(p: Program, op) -> List[str]:
    g = p.g
    # MIL gate rows: input, forget, output, cell; ONNX: input, output, forget, cell
    w, r, b, hidden, direction, acts, dirs = _rnn_common(
        p, op, 4, [0, 2, 1, 3], (("recurrent_activation", "sigmoid"), ("cell_activation", "tanh"),
                                 ("activation", "tanh")))
    inputs = [p.tensor(op, "x"), w, r, b, "", _rnn_state(p, op, "initial_h", dirs, hidden),
              _rnn_state(p, op, "initial_c", dirs, hidden)]
    peep = [np.asarray(p.const(op, "peephole" + sfx, np.zeros(3 * hidden, np.float32)), np.float32)
            for sfx in (("", "_back") if dirs == 2 else ("",))]
    if any(v.any() for v in peep):    # MIL: input, forget, output; ONNX: input, output, forget
        inputs.append(g.const(np.stack([np.concatenate([v[:hidden], v[2 * hidden:], v[hidden:2 * hidden]])
                                        for v in peep]), "lstm_P"))
    y, y_h, y_c = g.node("LSTM", inputs, "lstm", outputs=3, hidden_size=hidden, direction=direction,
                         activations=acts)
    seq, h = _rnn_outputs(p, op, y, y_h, dirs, hidden)
    b_size = p.shape(h, "an RNN state")[0]
    return [seq, h, g.reshape(g.transpose(y_c, [1, 0, 2]), [b_size, dirs * hidden])]


def _gru(p: Program, op) -> List[str]:
    g = p.g
    # MIL gate rows: reset, output (new), update; ONNX: update, reset, new. The reset gate scales the state before
    # its matmul (ONNX linear_before_reset=0), as Core ML computes it
    w, r, b, hidden, direction, acts, dirs = _rnn_common(
        p, op, 3, [2, 0, 1], (("recurrent_activation", "sigmoid"), ("activation", "tanh")))
    y, y_h = g.node("GRU", [p.tensor(op, "x"), w, r, b, "", _rnn_state(p, op, "initial_h", dirs, hidden)], "gru",
                    outputs=2, hidden_size=hidden, direction=direction, activations=acts, linear_before_reset=0)
    return _rnn_outputs(p, op, y, y_h, dirs, hidden)


def _classify(p: Program, op) -> List[Optional[str]]:
    """A classifier's outputs (label, probabilities by label): the probabilities tensor stands for the
    dictionary; the label is not an output (see :mod:`tether.frontend.coreml.model`)."""
    return [None, p.g.node("Identity", [p.tensor(op, "probabilities")], "classify")]


def _flatten2d(p: Program, op) -> List[str]:
    return [p.g.node("Flatten", [p.tensor(op, "x")], "flatten2d", axis=int(p.scalar(op, "axis", 1)))]


# -- constants and decompression ------------------------------------------------------------------------------------

def _const_value(p: Program, op) -> object:
    return p.const(op, "val")


def _affine_dequantize(p: Program, op) -> object:
    q = np.asarray(p.const(op, "quantized_data")).astype(np.float32)
    zp = np.asarray(p.const(op, "zero_point")).astype(np.float32)
    scale = np.asarray(p.const(op, "scale")).astype(np.float32)
    axis = int(p.scalar(op, "axis", 0)) % q.ndim
    shape = [1] * q.ndim
    if zp.size > 1:
        zp = zp.reshape([zp.size if i == axis else 1 for i in range(q.ndim)])
    if scale.size > 1:
        shape[axis] = scale.size
        scale = scale.reshape(shape)
    return (q - zp) * scale


def _blockwise_shift_scale(p: Program, op) -> object:
    data = np.asarray(p.const(op, "data")).astype(np.float32)
    scale = np.asarray(p.const(op, "scale")).astype(np.float32)

    def expand(v: np.ndarray) -> np.ndarray:
        v = v.reshape([1] * (data.ndim - v.ndim) + list(v.shape))
        for axis, (n, m) in enumerate(zip(data.shape, v.shape)):
            if m != n:
                v = np.repeat(v, n // m, axis=axis)
        return v
    if p.has(op, "offset"):
        data = data - expand(np.asarray(p.const(op, "offset")).astype(np.float32))
    return data * expand(scale)


def _lut_to_dense(p: Program, op) -> object:
    lut = np.asarray(p.const(op, "lut"))
    indices = np.asarray(p.const(op, "indices"))
    if p.has(op, "shape"):             # iOS16: a flat table and indices packed into bytes, low bits first
        shape = p.ints(op, "shape")
        count = int(np.prod(shape))
        bits = int(math.log2(lut.size))
        stream = np.unpackbits(indices.astype(np.uint8).reshape(-1), bitorder="little")[:count * bits]
        idx = (stream.reshape(-1, bits).astype(np.int64) << np.arange(bits)).sum(axis=1)
        return lut.reshape(-1)[idx].reshape(shape).astype(np.float32)
    # iOS18: per-block tables [*blocks, 2^bits, vector]; each index picks from its block's table
    if lut.shape[-1] != 1:
        raise Refused("a vector lookup table")
    table = lut[..., 0]
    blocks = table.shape[:-1]
    out = np.empty(indices.shape, np.float32)
    for block in np.ndindex(*blocks):
        sl = tuple(slice(b * (n // m), (b + 1) * (n // m)) for b, n, m in zip(block, indices.shape, blocks))
        out[sl] = table[block][indices[sl].astype(np.int64)]
    return out


def _constexpr_cast(p: Program, op) -> object:
    return np.asarray(p.const(op, "source_val")).astype(np.float32)


CONSTANTS: Dict[str, Callable[[Program, object], object]] = {
    "const": _const_value, "constexpr_affine_dequantize": _affine_dequantize,
    "constexpr_blockwise_shift_scale": _blockwise_shift_scale, "constexpr_lut_to_dense": _lut_to_dense,
    "constexpr_cast": _constexpr_cast,
}

OPS: Dict[str, OpConverter] = {
    "conv": _conv, "conv_transpose": _conv_transpose, "linear": _linear, "matmul": _matmul,
    "max_pool": _pool("max"), "avg_pool": _pool("avg"), "l2_pool": _pool("l2"),
    "add": _binary("Add"), "sub": _binary("Sub"), "mul": _binary("Mul"), "real_div": _binary("Div"),
    "pow": _binary("Pow"), "maximum": _binary("Max"), "minimum": _binary("Min"), "floor_div": _floor_div,
    "mod": _mod, "equal": _binary("Equal"), "not_equal": _not_equal, "less": _binary("Less"),
    "less_equal": _binary("LessOrEqual"), "greater": _binary("Greater"), "greater_equal": _binary("GreaterOrEqual"),
    "logical_and": _binary("And"), "logical_or": _binary("Or"), "logical_xor": _binary("Xor"),
    "logical_not": _unary("Not"),
    "relu": _unary("Relu"), "relu6": _relu6, "sigmoid": _unary("Sigmoid"), "tanh": _unary("Tanh"), "silu": _silu,
    "gelu": _gelu, "softmax": _softmax, "softplus": _unary("Softplus"), "softsign": _unary("Softsign"),
    "elu": _with_alpha("Elu", 1.0), "leaky_relu": _with_alpha("LeakyRelu", 0.01),
    "thresholded_relu": _with_alpha("ThresholdedRelu", 1.0), "prelu": _prelu, "sigmoid_hard": _sigmoid_hard,
    "scaled_tanh": _scaled_tanh, "linear_activation": _linear_activation, "clamped_relu": _clamped_relu,
    "softplus_parametric": _softplus_parametric, "clip": _clip, "threshold": _threshold,
    "abs": _unary("Abs"), "acos": _unary("Acos"), "asin": _unary("Asin"), "atan": _unary("Atan"),
    "atanh": _unary("Atanh"), "ceil": _unary("Ceil"), "cos": _unary("Cos"), "cosh": _unary("Cosh"),
    "erf": _unary("Erf"), "exp": _unary("Exp"), "exp2": _exp2, "floor": _unary("Floor"), "round": _unary("Round"),
    "sign": _unary("Sign"), "sin": _unary("Sin"), "sinh": _unary("Sinh"), "sqrt": _unary("Sqrt"),
    "square": _square, "tan": _unary("Tan"), "inverse": _eps_unary("inverse", 1e-4),
    "log": _eps_unary("log", 1e-45), "rsqrt": _eps_unary("rsqrt", 1e-12),
    "batch_norm": _batch_norm, "instance_norm": _instance_norm, "layer_norm": _layer_norm, "l2_norm": _l2_norm,
    "local_response_norm": _lrn,
    "reduce_argmax": _arg("ArgMax"), "reduce_argmin": _arg("ArgMin"),
    "reshape": _reshape, "transpose": _transpose, "concat": _concat, "split": _split,
    "slice_by_index": _slice_by_index, "slice_by_size": _slice_by_size, "squeeze": _squeeze,
    "expand_dims": _expand_dims, "pad": _pad, "upsample_nearest_neighbor": _upsample_nearest,
    "upsample_bilinear": _upsample_bilinear, "resize_bilinear": _resize_bilinear,
    "resize_nearest_neighbor": _resize_nearest, "cast": _cast, "identity": _identity, "gather": _gather,
    "gather_along_axis": _gather_along_axis, "gather_nd": _gather_nd, "tile": _tile, "stack": _stack,
    "select": _select, "shape": _shape, "fill": _fill, "range_1d": _range_1d, "cumsum": _cumsum, "topk": _topk,
    "band_part": _band_part, "space_to_depth": _space_depth("space_to_depth"),
    "depth_to_space": _space_depth("depth_to_space"), "pixel_shuffle": _space_depth("pixel_shuffle"),
    "flatten2d": _flatten2d, "classify": _classify, "scaled_dot_product_attention": _attention,
    "einsum": _einsum, "one_hot": _one_hot, "crop": _crop, "argsort": _argsort, "lstm": _lstm, "gru": _gru,
}
OPS.update({name: _reduce(onnx_op) for name, onnx_op in _REDUCE.items()})


# -- the program ------------------------------------------------------------------------------------------------

def _main(spec):
    program = spec.mlProgram
    if "main" not in program.functions:
        raise InvalidInput("the ML Program has no main function (it has %s)" % sorted(program.functions))
    fn = program.functions["main"]
    block = fn.block_specializations.get(fn.opset)
    if block is None:
        block = next(iter(fn.block_specializations.values()))
    return fn, block


def op_list(src) -> List[Tuple[str, str, str, bool]]:
    """(op type, node, opset, covered) of each operation of the main function."""
    fn, block = _main(src.spec)
    out = []
    for i, op in enumerate(block.operations):
        out.append((op.type, _op_name(op, i), fn.opset, op.type in OPS or op.type in CONSTANTS))
    return out


def _op_name(op, i: int) -> str:
    if "name" in op.attributes:
        v = op.attributes["name"].immediateValue.tensor.strings.values
        if v:
            return v[0]
    return op.outputs[0].name if op.outputs else "#%d" % i


def translate(src, shape) -> Tuple[OnnxGraph, List[str]]:
    from tether.frontend.coreml.features import input_feature

    spec = src.spec
    fn, block = _main(spec)
    g = OnnxGraph("coreml_program")
    described = {f.name: f for f in spec.description.input}
    g.reserve([i.name for i in fn.inputs] + [f.name for f in spec.description.output] + list(block.outputs))
    p = Program(g, src.model_dir)
    for inp in fn.inputs:
        if inp.name in described:
            _, elem, dims = input_feature(described[inp.name], shape)
            dtype = inp.type.tensorType.dataType if inp.type.HasField("tensorType") else 11
            np_type = np.dtype(_NP_TYPES.get(dtype, np.float32))
            if elem != TensorProto.FLOAT or np_type != np.float32:
                elem = _ONNX_TYPES.get(np_type, elem)
        else:
            dims = (shape or {}).get(inp.name) or _dims(inp.type)
            elem = _ONNX_TYPES.get(np.dtype(_NP_TYPES.get(inp.type.tensorType.dataType, np.float32)),
                                   TensorProto.FLOAT)
            if dims is None:
                raise InvalidInput("ML Program input %r has no static shape; give one with shape={%r: [...]}"
                                   % (inp.name, inp.name))
        p.names[inp.name] = g.add_input(inp.name, elem, list(dims))
    errors: List[str] = []
    for i, op in enumerate(block.operations):
        node = _op_name(op, i)
        try:
            if op.type in CONSTANTS:
                value = CONSTANTS[op.type](p, op)
                p.consts[op.outputs[0].name] = value
                continue
            convert = OPS.get(op.type)
            if convert is None:
                errors.append("%s (op %s, opset %s)" % (op.type, node, fn.opset))
                continue
            outs = convert(p, op)
        except KeyError:
            continue                    # reads the output of an op already reported
        except UnsupportedOpError as exc:
            errors.append("%s (op %s, opset %s): %s" % (op.type, node, fn.opset, exc))
            continue
        for var, name in zip(op.outputs, outs):
            if name is not None:
                p.names[var.name] = name
    for out in block.outputs:
        try:
            y = p.variable(out)
        except KeyError:
            continue
        g.node("Identity", [y], outputs=[out])
        g.add_output(out)
    return g, errors
