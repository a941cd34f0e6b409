"""Normalization layers at inference: BatchNormalization with its moving statistics, LayerNormalization (also
RMS scaling) and GroupNormalization over the batch's own statistics, UnitNormalization.

Batch normalization folds to one scale and shift per channel; the others keep their input's layout, computing
over the ONNX axes that hold the Keras axes.
"""
from __future__ import annotations

from typing import List

import numpy as np

from tether.frontend.keras.builder import Value
from tether.frontend.keras.layer import Call, LayerTable

LAYERS = LayerTable(__name__)


def _axes(c: Call) -> List[int]:
    axis = c.get("axis", -1)
    axes = [axis] if isinstance(axis, int) else list(axis)
    return sorted(int(a) % c.x.rank for a in axes)


def _channel_const(c: Call, values: np.ndarray, axis: int, hint: str) -> str:
    shape = [1] * c.x.rank
    shape[axis] = values.size
    return c.b.keras_const(c.x, values.reshape(shape), hint)


@LAYERS.register("BatchNormalization")
def _batch_norm(c: Call) -> List[Value]:
    axes = _axes(c)
    if len(axes) != 1:
        raise c.refuse("normalization over several axes %s" % axes)
    scale, center = c.get("scale", True), c.get("center", True)
    w = c.weights((2 + int(scale) + int(center),))
    gamma = w.pop(0) if scale else None
    beta = w.pop(0) if center else None
    mean, var = w
    k = 1.0 / np.sqrt(var.astype(np.float64) + float(c.get("epsilon", 1e-3)))
    if gamma is not None:
        k = k * gamma
    shift = -mean * k + (beta if beta is not None else 0.0)
    if c.x.onnx_axis(axes[0]) == 1:
        ins = [c.x.name] + [c.b.const(np.asarray(a, np.float32), c.hint(h)) for a, h in (
            (k, "_scale"), (shift, "_shift"), (np.zeros_like(mean), "_mean"), (np.ones_like(var), "_var"))]
        y = c.b.op("BatchNormalization", ins, c.hint(), epsilon=0.0)
    else:
        y = c.b.op("Mul", [c.x.name, _channel_const(c, np.asarray(k, np.float32), axes[0], c.hint("_scale"))],
                   c.hint())
        y = c.b.op("Add", [y, _channel_const(c, np.asarray(shift, np.float32), axes[0], c.hint("_shift"))],
                   c.hint())
    return [Value(y, c.x.rank, c.x.cf, c.x.shape)]


def _affine(c: Call, y: str, gamma, beta, axes: List[int]) -> str:
    """``y * gamma + beta`` with the weights' shape of the Keras axes ``axes``, broadcast in the input's layout."""
    for arr, op, h in ((gamma, "Mul", "_gamma"), (beta, "Add", "_beta")):
        if arr is None:
            continue
        shape = [1] * c.x.rank
        for a, n in zip(axes, arr.shape if arr.ndim == len(axes) else [arr.size]):
            shape[a] = n
        y = c.b.op(op, [y, c.b.keras_const(c.x, arr.reshape(shape), c.hint(h))], c.hint())
    return y


@LAYERS.register("LayerNormalization")
def _layer_norm(c: Call) -> List[Value]:
    axes = _axes(c)
    rms = bool(c.get("rms_scaling", False))
    scale, center = c.get("scale", True), c.get("center", True) and not rms
    w = c.weights((int(scale) + int(center), int(scale) + int(c.get("center", True))))
    gamma = w[0] if scale else None
    beta = w[int(scale)] if center else None
    eps = float(c.get("epsilon", 1e-3))
    b = c.b
    onnx_axes = sorted(c.x.onnx_axis(a) for a in axes)
    trailing = onnx_axes == list(range(c.x.rank - len(axes), c.x.rank))
    if trailing and not rms and gamma is not None and beta is not None and not c.x.cf:
        y = b.op("LayerNormalization", [c.x.name, b.const(gamma, c.hint("_gamma")), b.const(beta, c.hint("_beta"))],
                 c.hint(), axis=onnx_axes[0], epsilon=eps)
        return [Value(y, c.x.rank, c.x.cf, c.x.shape)]
    if rms:      # x / sqrt(mean(x^2) + eps) * gamma
        d = c.x.name
        var = b.op("ReduceMean", [b.op("Mul", [d, d], c.hint())], c.hint(), axes=onnx_axes, keepdims=1)
    else:
        mean = b.op("ReduceMean", [c.x.name], c.hint(), axes=onnx_axes, keepdims=1)
        d = b.op("Sub", [c.x.name, mean], c.hint())
        var = b.op("ReduceMean", [b.op("Mul", [d, d], c.hint())], c.hint(), axes=onnx_axes, keepdims=1)
    inv = b.op("Reciprocal", [b.op("Sqrt", [b.op("Add", [var, b.const(np.float32(eps), c.hint("_eps"))],
                                                   c.hint())], c.hint())], c.hint())
    y = _affine(c, b.op("Mul", [d, inv], c.hint()), gamma, beta, axes)
    return [Value(y, c.x.rank, c.x.cf, c.x.shape)]


@LAYERS.register("GroupNormalization")
def _group_norm(c: Call) -> List[Value]:
    axes = _axes(c)
    if axes != [c.x.rank - 1]:
        raise c.refuse("groups along axis %s (tether converts the channel axis, -1)" % axes)
    groups = int(c.get("groups", 32))
    scale, center = c.get("scale", True), c.get("center", True)
    w = c.weights((int(scale) + int(center),))
    gamma = w[0] if scale else None
    beta = w[int(scale)] if center else None
    b = c.b
    x = b.channels_first(c.x)       # channels at axis 1 whatever the rank
    xs = Value(x, c.x.rank, c.x.rank >= 3)
    g = b.op("Reshape", [x, b.ints([0, groups, -1], c.hint("_groups"))], c.hint())
    mean = b.op("ReduceMean", [g], c.hint(), axes=[2], keepdims=1)
    d = b.op("Sub", [g, mean], c.hint())
    var = b.op("ReduceMean", [b.op("Mul", [d, d], c.hint())], c.hint(), axes=[2], keepdims=1)
    eps = b.const(np.float32(c.get("epsilon", 1e-3)), c.hint("_eps"))
    y = b.op("Mul", [d, b.op("Reciprocal", [b.op("Sqrt", [b.op("Add", [var, eps], c.hint())], c.hint())],
                             c.hint())], c.hint())
    y = b.op("Reshape", [y, b.op("Shape", [x], c.hint())], c.hint())
    for arr, op, h in ((gamma, "Mul", "_gamma"), (beta, "Add", "_beta")):
        if arr is not None:
            y = b.op(op, [y, b.keras_const(xs, arr, c.hint(h))], c.hint())
    return [Value(y, c.x.rank, xs.cf, c.x.shape)]


@LAYERS.register("UnitNormalization")
def _unit_norm(c: Call) -> List[Value]:
    """x / sqrt(max(sum(x^2), 1e-12)) over ``axis``."""
    b = c.b
    onnx_axes = sorted(c.x.onnx_axis(a) for a in _axes(c))
    sq = b.op("ReduceSum", [b.op("Mul", [c.x.name, c.x.name], c.hint()), b.ints(onnx_axes, c.hint("_axes"))],
              c.hint(), keepdims=1)
    sq = b.op("Max", [sq, b.const(np.float32(1e-12), c.hint("_eps"))], c.hint())
    y = b.op("Mul", [c.x.name, b.op("Reciprocal", [b.op("Sqrt", [sq], c.hint())], c.hint())], c.hint())
    return [Value(y, c.x.rank, c.x.cf, c.x.shape)]
