"""Core layers: Dense, activation layers, reshaping, merging, Embedding, Rescaling and Normalization, and the
layers that do nothing at inference (Dropout, noise, ActivityRegularization).

Per-element layers keep their input's layout; layers that read axes in Keras order take it in Keras order;
merges bring their inputs to one layout (channels-first when any of them is).
"""
from __future__ import annotations

from typing import Any, List

import numpy as np

from tether.frontend.keras import activations
from tether.frontend.keras.builder import Value, channels_last_perm
from tether.frontend.keras.layer import Call, LayerTable

LAYERS = LayerTable(__name__)


def _same(c: Call, name: str, v: Value = None) -> List[Value]:
    v = v or c.x
    return [Value(name, v.rank, v.cf, v.shape)]


@LAYERS.register("Dense")
def _dense(c: Call) -> List[Value]:
    w = c.weights((1, 2) if c.get("use_bias", True) else (1,))
    if c.x.cf:
        # over the channels of a channels-first value (ConvNeXt's pointwise layers): a 1x1 convolution, which
        # keeps the layout instead of transposing there and back
        kernel = w[0].T.reshape(w[0].shape[1], w[0].shape[0], *([1] * (c.x.rank - 2)))
        ins = [c.x.name, c.b.const(kernel, c.hint("_W"))] + ([c.b.const(w[1], c.hint("_B"))] if len(w) > 1 else [])
        y = c.b.op("Conv", ins, c.hint(), kernel_shape=[1] * (c.x.rank - 2))
        return [activations.apply(c.b, Value(y, c.x.rank, True), c.get("activation"), c.version, c.hint())]
    x = c.b.keras_order(c.x)
    y = c.b.op("MatMul", [x, c.b.const(w[0], c.hint("_W"))], c.hint())
    if len(w) > 1:
        y = c.b.op("Add", [y, c.b.const(w[1], c.hint("_B"))], c.hint("_bias"))
    return [activations.apply(c.b, Value(y, c.x.rank), c.get("activation"), c.version, c.hint())]


@LAYERS.register("Activation")
def _activation(c: Call) -> List[Value]:
    return [activations.apply(c.b, c.x, c.get("activation"), c.version, c.hint())]


@LAYERS.register("Dropout", "SpatialDropout1D", "SpatialDropout2D", "SpatialDropout3D", "GaussianNoise",
                 "GaussianDropout", "AlphaDropout", "ActivityRegularization", "Identity")
def _identity(c: Call) -> List[Value]:
    return [c.x]


@LAYERS.register("LayerScale")
def _layer_scale(c: Call) -> List[Value]:
    """keras.applications' ConvNeXt LayerScale: x times a learned per-channel gamma."""
    gamma = c.weights((1,))[0]
    return _same(c, c.b.op("Mul", [c.x.name, c.b.keras_const(c.x, gamma, c.hint("_gamma"))], c.hint()))


@LAYERS.register("ReLU")
def _relu(c: Call) -> List[Value]:
    """Keras' relu(x, negative_slope, max_value, threshold): x where x > threshold (else 0), clipped to max_value,
    minus negative_slope * relu(threshold - x)."""
    b, x = c.b, c.x
    slope = float(c.get("negative_slope") or 0.0)
    max_value = c.get("max_value")
    threshold = float(c.get("threshold") or 0.0)
    if slope and max_value is None and not threshold:
        return _same(c, b.op("LeakyRelu", [x.name], c.hint(), alpha=slope))
    if threshold:
        gate = b.op("Greater", [x.name, b.const(np.float32(threshold), c.hint("_t"))], c.hint())
        y = b.op("Where", [gate, x.name, b.const(np.float32(0), c.hint("_zero"))], c.hint())
    else:
        y = b.op("Relu", [x.name], c.hint())
    if max_value is not None:
        y = b.op("Clip", [y, b.const(np.float32(0), c.hint("_lo")), b.const(np.float32(max_value), c.hint("_hi"))],
                 c.hint())
    if slope:
        neg = b.op("Relu", [b.op("Sub", [b.const(np.float32(threshold), c.hint("_t")), x.name], c.hint())], c.hint())
        y = b.op("Sub", [y, b.op("Mul", [neg, b.const(np.float32(slope), c.hint("_slope"))], c.hint())], c.hint())
    return _same(c, y)


@LAYERS.register("LeakyReLU")
def _leaky_relu(c: Call) -> List[Value]:
    slope = c.get("negative_slope", c.get("alpha", 0.3))
    return _same(c, c.b.op("LeakyRelu", [c.x.name], c.hint(), alpha=float(0.3 if slope is None else slope)))


@LAYERS.register("PReLU")
def _prelu(c: Call) -> List[Value]:
    alpha = c.weights((1,))[0]
    return _same(c, c.b.op("PRelu", [c.x.name, c.b.keras_const(c.x, alpha, c.hint("_alpha"))], c.hint()))


@LAYERS.register("ELU")
def _elu(c: Call) -> List[Value]:
    return _same(c, c.b.op("Elu", [c.x.name], c.hint(), alpha=float(c.get("alpha", 1.0))))


@LAYERS.register("ThresholdedReLU")
def _thresholded_relu(c: Call) -> List[Value]:
    return _same(c, c.b.op("ThresholdedRelu", [c.x.name], c.hint(), alpha=float(c.get("theta", 1.0))))


@LAYERS.register("Softmax")
def _softmax(c: Call) -> List[Value]:
    axis = c.get("axis", -1)
    if isinstance(axis, (list, tuple)):
        if len(axis) != 1:
            raise c.refuse("softmax over several axes %s" % (axis,))
        axis = axis[0]
    if "mask" in c.tensor_kwargs:
        raise c.refuse("a mask tensor")
    return _same(c, c.b.op("Softmax", [c.x.name], c.hint(), axis=c.x.onnx_axis(int(axis))))


@LAYERS.register("Flatten")
def _flatten(c: Call) -> List[Value]:
    x = c.b.keras_order(c.x)
    if (c.get("data_format") or "channels_last") == "channels_first" and c.x.rank > 2:
        # Keras moves the channels last before flattening a channels_first tensor
        x = c.b.transpose(x, channels_last_perm(c.x.rank), c.hint("_nhwc"))
    return [Value(c.b.op("Flatten", [x], c.hint(), axis=1), 2)]


@LAYERS.register("Reshape")
def _reshape(c: Call) -> List[Value]:
    target = [int(d) for d in c.get("target_shape")]
    if c.x.rank == 2 and len(target) >= 2 and all(d == 1 for d in target[:-1]):
        # a vector to (1, ..., 1, C) (squeeze-and-excite) is already channels-first as (C, 1, ..., 1)
        y = c.b.op("Reshape", [c.x.name, c.b.ints([0, target[-1]] + [1] * (len(target) - 1), c.hint("_shape"))],
                   c.hint())
        return [Value(y, len(target) + 1, True)]
    y = c.b.op("Reshape", [c.b.keras_order(c.x), c.b.ints([0] + target, c.hint("_shape"))], c.hint())
    return [Value(y, len(target) + 1)]


@LAYERS.register("Permute")
def _permute(c: Call) -> List[Value]:
    dims = [int(d) for d in c.get("dims")]
    return [Value(c.b.transpose(c.b.keras_order(c.x), [0] + dims, c.hint()), c.x.rank)]


@LAYERS.register("RepeatVector")
def _repeat_vector(c: Call) -> List[Value]:
    n = int(c.get("n"))
    y = c.b.op("Unsqueeze", [c.b.keras_order(c.x), c.b.ints([1], c.hint("_axis"))], c.hint())
    return [Value(c.b.op("Expand", [y, c.b.ints([1, n, 1], c.hint("_shape"))], c.hint()), 3)]


@LAYERS.register("Rescaling")
def _rescaling(c: Call) -> List[Value]:
    scale, offset = c.get("scale", 1.0), c.get("offset", 0.0)
    scale = scale.get("config", {}).get("value", scale) if isinstance(scale, dict) else scale
    offset = offset.get("config", {}).get("value", offset) if isinstance(offset, dict) else offset
    y = c.b.op("Mul", [c.x.name, c.b.keras_const(c.x, np.asarray(scale, np.float32), c.hint("_scale"))], c.hint())
    y = c.b.op("Add", [y, c.b.keras_const(c.x, np.asarray(offset, np.float32), c.hint("_offset"))], c.hint())
    return _same(c, y)


def _axis_const(c: Call, array: np.ndarray, axis: Any) -> str:
    """A Normalization statistic of the Keras axes ``axis`` broadcast against the input."""
    arr = np.asarray(array, np.float32)
    if arr.size == 1:
        return c.b.const(arr.reshape(()), c.hint("_stat"))
    axes = [axis] if isinstance(axis, int) else list(axis or [])
    if len(axes) != 1:
        raise c.refuse("statistics over the axes %s" % (axes,))
    shape = [1] * c.x.rank
    shape[axes[0] % c.x.rank] = arr.size
    return c.b.keras_const(c.x, arr.reshape(shape), c.hint("_stat"))


@LAYERS.register("Normalization")
def _normalization(c: Call) -> List[Value]:
    """(x - mean) / max(sqrt(variance), 1e-7), or mean + x * max(sqrt(variance), 1e-7) when inverted."""
    if c.get("mean") is not None:
        mean, var = np.asarray(c.get("mean"), np.float32), np.asarray(c.get("variance"), np.float32)
    else:
        w = c.weights((2, 3))
        mean, var = w[0], w[1]
    axis = c.get("axis", -1)
    std = np.maximum(np.sqrt(var), 1e-7)
    if c.get("invert", False):
        y = c.b.op("Mul", [c.x.name, _axis_const(c, std, axis)], c.hint())
        return _same(c, c.b.op("Add", [y, _axis_const(c, mean, axis)], c.hint()))
    y = c.b.op("Sub", [c.x.name, _axis_const(c, mean, axis)], c.hint())
    return _same(c, c.b.op("Div", [y, _axis_const(c, std, axis)], c.hint()))


@LAYERS.register("Embedding")
def _embedding(c: Call) -> List[Value]:
    if c.get("mask_zero", False):
        raise c.refuse("mask_zero=True (the mask it passes to later layers is not converted)")
    table = c.weights((1,))[0]
    idx = c.b.op("Cast", [c.b.keras_order(c.x)], c.hint("_idx"), to=7)     # int64
    y = c.b.op("Gather", [c.b.const(table, c.hint("_table")), idx], c.hint(), axis=0)
    return [Value(y, c.x.rank + 1)]


# ---- merges
def _common_layout(c: Call) -> List[Value]:
    """The inputs in one layout: channels-first when they share a rank of 3 or more and one is channels-first."""
    ranks = {v.rank for v in c.inputs}
    cf = len(ranks) == 1 and min(ranks) >= 3 and any(v.cf for v in c.inputs)
    return [Value(c.b.in_layout(v, cf), v.rank, cf and v.rank >= 3) for v in c.inputs]


def _merge(op: str):
    def merge(c: Call) -> List[Value]:
        vs = _common_layout(c)
        if len(vs) < 2:
            raise c.refuse("called on %d tensor(s), expected a list of two or more" % len(vs))
        y = vs[0].name
        for k, v in enumerate(vs[1:]):
            y = c.b.op(op, [y, v.name], c.hint("_%d" % k))
        if c.class_name == "Average":
            y = c.b.op("Mul", [y, c.b.const(np.float32(1.0 / len(vs)), c.hint("_n"))], c.hint())
        top = max(vs, key=lambda v: v.rank)
        return [Value(y, top.rank, top.cf)]
    return merge


for _op, _name in (("Add", "Add"), ("Sub", "Subtract"), ("Mul", "Multiply"), ("Add", "Average"),
                   ("Max", "Maximum"), ("Min", "Minimum")):
    LAYERS.register(_name)(_merge(_op))


@LAYERS.register("Concatenate")
def _concatenate(c: Call) -> List[Value]:
    vs = _common_layout(c)
    axis = vs[0].onnx_axis(int(c.get("axis", -1)))
    return [Value(c.b.op("Concat", [v.name for v in vs], c.hint(), axis=axis), vs[0].rank, vs[0].cf)]


def _l2_normalize(c: Call, x: str, axis: int, hint: str) -> str:
    sq = c.b.op("ReduceSum", [c.b.op("Mul", [x, x], hint), c.b.ints([axis], hint + "_axes")], hint, keepdims=1)
    sq = c.b.op("Max", [sq, c.b.const(np.float32(1e-12), hint + "_eps")], hint)
    return c.b.op("Mul", [x, c.b.op("Reciprocal", [c.b.op("Sqrt", [sq], hint)], hint)], hint)


@LAYERS.register("Dot")
def _dot(c: Call) -> List[Value]:
    """Keras' batch_dot of two tensors of rank 2 or 3 along ``axes``."""
    if len(c.inputs) != 2:
        raise c.refuse("called on %d tensors, expected two" % len(c.inputs))
    a, b_ = c.inputs
    axes = c.get("axes")
    axes = [int(axes)] * 2 if isinstance(axes, int) else [int(v) for v in axes]
    axes = [axes[0] % a.rank, axes[1] % b_.rank]
    x, y = c.b.keras_order(a), c.b.keras_order(b_)
    if c.get("normalize", False):
        x = _l2_normalize(c, x, axes[0], c.hint("_norm0"))
        y = _l2_normalize(c, y, axes[1], c.hint("_norm1"))
    if a.rank == 2 and b_.rank == 2:
        prod = c.b.op("Mul", [x, y], c.hint())
        return [Value(c.b.op("ReduceSum", [prod, c.b.ints([1], c.hint("_axes"))], c.hint(), keepdims=1), 2)]
    if a.rank == 3 and b_.rank == 3 and 0 not in axes:
        if axes[0] == 1:
            x = c.b.transpose(x, [0, 2, 1], c.hint("_lhs"))
        if axes[1] == 2:
            y = c.b.transpose(y, [0, 2, 1], c.hint("_rhs"))
        return [Value(c.b.op("MatMul", [x, y], c.hint()), 3)]
    raise c.refuse("a dot of ranks %d and %d along axes %s (tether converts ranks 2x2 and 3x3)"
                   % (a.rank, b_.rank, axes))


@LAYERS.register("EinsumDense")
def _einsum_dense(c: Call) -> List[Value]:
    """``einsum(equation, x, kernel) + bias``: Keras stores the bias shaped for the output's trailing axes."""
    eq = str(c.get("equation")).replace(" ", "")
    lhs, _, out = eq.partition("->")
    if not out or "," not in lhs:
        raise c.refuse("equation %r (expected 'input,kernel->output')" % eq)
    w = c.weights((1, 2))
    x = c.b.keras_order(c.x)
    y = c.b.op("Einsum", [x, c.b.const(w[0], c.hint("_W"))], c.hint(), equation=eq)
    if len(w) > 1:
        y = c.b.op("Add", [y, c.b.const(w[1], c.hint("_B"))], c.hint("_bias"))
    term = lhs.split(",")[0]
    rank = c.x.rank - len(term.replace("...", "")) + len(out.replace("...", "")) if "..." in term else \
        len(out.replace("...", ""))
    return [activations.apply(c.b, Value(y, rank), c.get("activation"), c.version, c.hint())]
