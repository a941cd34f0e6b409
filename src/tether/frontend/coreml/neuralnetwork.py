"""Core ML NeuralNetwork layers (``.mlmodel`` NeuralNetwork, classifier, regressor) as ONNX nodes.

Tensors keep the rank they have in the model. The legacy layers (convolution, pooling, batchnorm, ...) work on the
last three axes ``[..., C, H, W]`` whatever the rank, as Core ML's do; the "ND" layers the converters emit for
transformers work on any axis. Every value is float32, as in Core ML's NeuralNetwork: comparisons, argmax, shapes
and indices are floats, cast where ONNX needs integers. ``LAYERS`` maps the layer's oneof field name to its
converter ``(ctx, layer, params) -> [output names]``.
"""
from __future__ import annotations

import math
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
from onnx import TensorProto

from tether.errors import UnsupportedOpError
from tether.frontend.coreml.onnx_graph import OnnxGraph
from tether.frontend.coreml.weights import weight_array

INT64_MAX = np.iinfo(np.int64).max
INT64_MIN = np.iinfo(np.int64).min


class Refused(UnsupportedOpError):
    """A covered layer with a parameter value the translation does not handle (said in the message)."""


class Context:
    """What a layer converter reads and writes: the graph, and the current ONNX name of each Core ML blob."""

    def __init__(self, graph: OnnxGraph, rank5: bool = False):
        self.g = graph
        self.env: Dict[str, str] = {}
        # the legacy shape mapping: a rank-3 [C, H, W] blob stands for Core ML's rank-5 [1, 1, C, H, W]
        self.rank5 = rank5

    def inp(self, layer, i: int = 0) -> str:
        return self.env[layer.input[i]]

    def shape(self, x: str, why: str) -> Tuple[int, ...]:
        s = self.g.shape(x)
        if s is None:
            raise Refused("needs the static shape of its input for %s" % why)
        return s

    def rank(self, x: str) -> int:
        r = self.g.rank(x)
        if r is None:
            raise Refused("needs the rank of its input")
        return r


Converter = Callable[[Context, object, object], List[str]]


def _floats(values, default: Sequence[float]) -> List[float]:
    return list(values) if len(values) else list(default)


def _ints(values, default: Sequence[int]) -> List[int]:
    return [int(v) for v in values] if len(values) else list(default)


def _as4d(ctx: Context, x: str) -> Tuple[str, Callable[[str], str]]:
    """``x`` (rank 3 to 5, ``[..., C, H, W]``) as a rank-4 NCHW tensor, and the function that gives a rank-4
    result the leading axes ``x`` had."""
    g = ctx.g
    r = ctx.rank(x)
    if r == 4:
        return x, lambda y: y
    if r == 3:
        return g.unsqueeze(x, [0]), lambda y: g.squeeze(y, [0])
    if r == 5:
        s = ctx.shape(x, "folding its leading axes")
        x4 = g.reshape(x, [s[0] * s[1], s[2], s[3], s[4]])

        def back(y: str) -> str:
            ys = ctx.shape(y, "restoring its leading axes")
            return g.reshape(y, [s[0], s[1]] + list(ys[1:]))
        return x4, back
    raise Refused("needs an input of rank 3 to 5 ([..., C, H, W]), got rank %d" % r)


def _channel_shape(ctx: Context, x: str, n: int) -> List[int]:
    """The shape a per-channel vector of ``n`` values takes to broadcast over ``x`` (``[C, 1, 1]`` for legacy
    layers on rank 3+, ``[C]`` below)."""
    return [n, 1, 1] if ctx.rank(x) >= 3 else [n]


def _same_pads(size: int, k: int, s: int, d: int, top_left_heavy: bool) -> Tuple[int, int]:
    out = -(-size // s)
    total = max((out - 1) * s + (k - 1) * d + 1 - size, 0)
    small = total // 2
    return (total - small, small) if top_left_heavy else (small, total - small)


def _border(amounts) -> List[Tuple[int, int]]:
    """``paddingAmounts.borderAmounts`` as (begin, end) for H and W."""
    b = [(int(a.startEdgeSize), int(a.endEdgeSize)) for a in amounts.borderAmounts]
    return (b + [(0, 0), (0, 0)])[:2]


# -- convolution and pooling ------------------------------------------------------------------------------------

def _convolution(ctx: Context, layer, p) -> List[str]:
    g = ctx.g
    x4, back = _as4d(ctx, ctx.inp(layer))
    kh, kw = _ints(p.kernelSize, [3, 3])
    sh, sw = _ints(p.stride, [1, 1])
    dh, dw = _ints(p.dilationFactor, [1, 1])
    groups = int(p.nGroups) or 1
    cout, kc = int(p.outputChannels), int(p.kernelChannels)
    if len(layer.input) > 1:
        if p.isDeconvolution:
            raise Refused("a deconvolution with its weights as an input")
        w = ctx.inp(layer, 1)
    elif p.isDeconvolution:
        w = g.const(weight_array(p.weights, kc * (cout // groups) * kh * kw, "deconvolution weights")
                    .reshape(kc, cout // groups, kh, kw), layer.name + "_W")
    else:
        w = g.const(weight_array(p.weights, cout * kc * kh * kw, "convolution weights").reshape(cout, kc, kh, kw),
                    layer.name + "_W")
    inputs = [x4, w]
    if p.hasBias:
        inputs.append(g.const(weight_array(p.bias, cout, "bias"), layer.name + "_B"))
    padding = p.WhichOneof("ConvolutionPaddingType") or "valid"
    top_left = padding == "same" and p.same.asymmetryMode == 1
    if not p.isDeconvolution:
        if padding == "valid":
            (hb, he), (wb, we) = _border(p.valid.paddingAmounts)
        else:
            _, _, h, wd = ctx.shape(x4, "SAME padding")
            hb, he = _same_pads(h, kh, sh, dh, top_left)
            wb, we = _same_pads(wd, kw, sw, dw, top_left)
        y = g.node("Conv", inputs, layer.name, kernel_shape=[kh, kw], strides=[sh, sw], dilations=[dh, dw],
                   group=groups, pads=[hb, wb, he, we])
        return [back(y)]
    # a deconvolution computes the full transposed output, then crops it to the output size it declares
    _, _, h, wd = ctx.shape(x4, "a deconvolution's output size")
    pads: List[List[int]] = []
    out_pad: List[int] = []
    given = [int(v) for v in p.outputShape] if len(p.outputShape) else None
    borders = _border(p.valid.paddingAmounts) if padding == "valid" else [(0, 0), (0, 0)]
    for i, (size, k, s, d) in enumerate(((h, kh, sh, dh), (wd, kw, sw, dw))):
        full = (size - 1) * s + (k - 1) * d + 1
        if given is not None:
            target = given[i]
        elif padding == "same":
            target = size * s
        else:
            target = full - sum(borders[i])
        crop = full - target
        if padding == "same":
            begin = crop - crop // 2 if top_left else crop // 2
        else:
            begin = min(borders[i][0], max(crop, 0))
        end = crop - begin
        out_pad.append(max(-end, 0))
        pads.append([begin, max(end, 0)])
    y = g.node("ConvTranspose", inputs, layer.name, kernel_shape=[kh, kw], strides=[sh, sw], dilations=[dh, dw],
               group=groups, pads=[pads[0][0], pads[1][0], pads[0][1], pads[1][1]],
               output_padding=out_pad if any(out_pad) else None)
    return [back(y)]


def _pooling(ctx: Context, layer, p) -> List[str]:
    g = ctx.g
    x4, back = _as4d(ctx, ctx.inp(layer))
    kind = p.type        # MAX 0, AVERAGE 1, L2 2
    if p.globalPooling:
        op = ("GlobalMaxPool", "GlobalAveragePool", "GlobalLpPool")[kind]
        return [back(g.node(op, [x4], layer.name, p=2 if kind == 2 else None))]
    kh, kw = _ints(p.kernelSize, [3, 3])
    sh, sw = _ints(p.stride, [1, 1])
    padding = p.WhichOneof("PoolingPaddingType") or "valid"
    exclude = bool(p.avgPoolExcludePadding)
    if padding == "valid":
        (hb, he), (wb, we) = _border(p.valid.paddingAmounts)
    elif padding == "same":
        _, _, h, wd = ctx.shape(x4, "SAME padding")
        top_left = p.same.asymmetryMode == 1
        hb, he = _same_pads(h, kh, sh, 1, top_left)
        wb, we = _same_pads(wd, kw, sw, 1, top_left)
    else:
        # includeLastPixel: Caffe's rule, the output size rounds up but the last window must start inside the
        # input or its leading padding; the extra end padding never counts in an average
        _, _, h, wd = ctx.shape(x4, "includeLastPixel padding")
        ph, pw = (_ints(p.includeLastPixel.paddingAmounts, [0, 0]) + [0, 0])[:2]
        ends = []
        for size, k, s, pad in ((h, kh, sh, ph), (wd, kw, sw, pw)):
            out = int(math.ceil((size + 2 * pad - k) / s)) + 1
            if pad and (out - 1) * s >= size + pad:
                out -= 1
            ends.append(max((out - 1) * s + k - size - pad, 0))
        hb, wb = ph, pw
        he, we = ends
        if kind == 1 and not exclude and (ph or pw):
            x4 = g.node("Pad", [x4, g.ints([0, 0, ph, pw, 0, 0, ph, pw], layer.name + "_pads")], layer.name + "_pad")
            hb, wb, he, we = 0, 0, he - ph, we - pw
            exclude = True
    pads = [hb, wb, he, we]
    if kind == 0:
        y = g.node("MaxPool", [x4], layer.name, kernel_shape=[kh, kw], strides=[sh, sw], pads=pads)
    elif kind == 1:
        y = g.node("AveragePool", [x4], layer.name, kernel_shape=[kh, kw], strides=[sh, sw], pads=pads,
                   count_include_pad=0 if exclude else 1)
    else:
        y = g.node("LpPool", [x4], layer.name, kernel_shape=[kh, kw], strides=[sh, sw], pads=pads, p=2)
    return [back(y)]


def _padding3d(ctx: Context, x: str, p, k: List[int], st: List[int], dl: List[int]) -> List[int]:
    """ONNX begin-then-end pads of a 3-D conv or pool: CUSTOM (front/back, top/bottom, left/right), VALID, or SAME
    (the odd unit at the end)."""
    if p.paddingType == 0:
        return [int(p.customPaddingFront), int(p.customPaddingTop), int(p.customPaddingLeft),
                int(p.customPaddingBack), int(p.customPaddingBottom), int(p.customPaddingRight)]
    if p.paddingType == 1:
        return [0] * 6
    sizes = ctx.shape(x, "SAME padding")[-3:]
    pairs = [_same_pads(size, ki, si, di, False) for size, ki, si, di in zip(sizes, k, st, dl)]
    return [b for b, _ in pairs] + [e for _, e in pairs]


def _convolution3d(ctx: Context, layer, p) -> List[str]:
    g = ctx.g
    x = ctx.inp(layer)
    if ctx.rank(x) != 5:
        raise Refused("needs an input of rank 5 ([N, C, D, H, W]), got rank %d" % ctx.rank(x))
    k = [int(p.kernelDepth) or 3, int(p.kernelHeight) or 3, int(p.kernelWidth) or 3]
    st = [int(p.strideDepth) or 1, int(p.strideHeight) or 1, int(p.strideWidth) or 1]
    dl = [int(p.dilationDepth) or 1, int(p.dilationHeight) or 1, int(p.dilationWidth) or 1]
    groups = int(p.nGroups) or 1
    cin, cout = int(p.inputChannels), int(p.outputChannels)
    if p.isDeconvolution:     # weights (input channels, output channels / groups, kD, kH, kW)
        w = weight_array(p.weights, cin * (cout // groups) * int(np.prod(k)), "deconvolution weights")
        w = g.const(w.reshape([cin, cout // groups] + k), layer.name + "_W")
    else:                     # weights (output channels, input channels / groups, kD, kH, kW)
        w = weight_array(p.weights, cout * (cin // groups) * int(np.prod(k)), "convolution weights")
        w = g.const(w.reshape([cout, cin // groups] + k), layer.name + "_W")
    inputs = [x, w]
    if p.hasBias:
        inputs.append(g.const(weight_array(p.bias, cout, "bias"), layer.name + "_B"))
    if not p.isDeconvolution:
        return [g.node("Conv", inputs, layer.name, kernel_shape=k, strides=st, dilations=dl, group=groups,
                       pads=_padding3d(ctx, x, p, k, st, dl))]
    # the full transposed output, cropped to the declared output size (or as its padding type sizes it)
    sizes = ctx.shape(x, "a deconvolution's output size")[-3:]
    given = [int(v) for v in p.outputShape] if len(p.outputShape) else None
    custom = _padding3d(ctx, x, p, k, st, dl) if p.paddingType == 0 else [0] * 6
    begins, ends, out_pad = [], [], []
    for i, (size, ki, si, di) in enumerate(zip(sizes, k, st, dl)):
        full = (size - 1) * si + (ki - 1) * di + 1
        if given is not None:
            target = given[i]
        elif p.paddingType == 2:
            target = size * si
        else:
            target = full - custom[i] - custom[i + 3]
        crop = full - target
        begin = crop // 2 if p.paddingType == 2 else min(custom[i], max(crop, 0))
        end = crop - begin
        begins.append(begin)
        ends.append(max(end, 0))
        out_pad.append(max(-end, 0))
    return [g.node("ConvTranspose", inputs, layer.name, kernel_shape=k, strides=st, dilations=dl, group=groups,
                   pads=begins + ends, output_padding=out_pad if any(out_pad) else None)]


def _pooling3d(ctx: Context, layer, p) -> List[str]:
    x = ctx.inp(layer)
    if ctx.rank(x) != 5:
        raise Refused("needs an input of rank 5 ([N, C, D, H, W]), got rank %d" % ctx.rank(x))
    k = [int(p.kernelDepth) or 1, int(p.kernelHeight) or 1, int(p.kernelWidth) or 1]
    st = [int(p.strideDepth) or 1, int(p.strideHeight) or 1, int(p.strideWidth) or 1]
    pads = _padding3d(ctx, x, p, k, st, [1, 1, 1])
    if p.type == 0:
        return [ctx.g.node("MaxPool", [x], layer.name, kernel_shape=k, strides=st, pads=pads)]
    return [ctx.g.node("AveragePool", [x], layer.name, kernel_shape=k, strides=st, pads=pads,
                       count_include_pad=0 if p.countExcludePadding else 1)]


def _global_pooling3d(ctx: Context, layer, p) -> List[str]:
    x = ctx.inp(layer)
    if ctx.rank(x) != 5:
        raise Refused("needs an input of rank 5 ([N, C, D, H, W]), got rank %d" % ctx.rank(x))
    return [ctx.g.node("GlobalMaxPool" if p.type == 0 else "GlobalAveragePool", [x], layer.name)]


# -- activations ------------------------------------------------------------------------------------------------

def _activation(ctx: Context, layer, p) -> List[str]:
    return [activate(ctx, ctx.inp(layer), p, layer.name)]


def activate(ctx: Context, x: str, p, n: str) -> str:
    """``ActivationParams`` ``p`` applied to ``x`` (the activation layer's, and the recurrent layers' gates)."""
    g = ctx.g
    kind = p.WhichOneof("NonlinearityType")
    if kind == "ReLU":
        return g.node("Relu", [x], n)
    if kind == "leakyReLU":
        return g.node("LeakyRelu", [x], n, alpha=p.leakyReLU.alpha)
    if kind == "thresholdedReLU":
        return g.node("ThresholdedRelu", [x], n, alpha=p.thresholdedReLU.alpha)
    if kind == "tanh":
        return g.node("Tanh", [x], n)
    if kind == "sigmoid":
        return g.node("Sigmoid", [x], n)
    if kind == "sigmoidHard":
        return g.node("HardSigmoid", [x], n, alpha=p.sigmoidHard.alpha, beta=p.sigmoidHard.beta)
    if kind == "ELU":
        return g.node("Elu", [x], n, alpha=p.ELU.alpha)
    if kind == "softsign":
        return g.node("Softsign", [x], n)
    if kind == "softplus":
        return g.node("Softplus", [x], n)
    if kind == "linear":
        y = g.node("Mul", [x, g.scalar(p.linear.alpha)], n + "_scale")
        return g.node("Add", [y, g.scalar(p.linear.beta)], n)
    if kind == "scaledTanh":
        y = g.node("Mul", [x, g.scalar(p.scaledTanh.beta)], n + "_in")
        return g.node("Mul", [g.node("Tanh", [y], n + "_tanh"), g.scalar(p.scaledTanh.alpha)], n)
    if kind == "PReLU":
        alpha = weight_array(p.PReLU.alpha, what="PReLU slopes")
        slope = alpha.reshape(_channel_shape(ctx, x, alpha.size)) if alpha.size > 1 else alpha.reshape([])
        return g.node("PRelu", [x, g.const(slope, n + "_slope")], n)
    if kind == "parametricSoftplus":
        alpha = weight_array(p.parametricSoftplus.alpha, what="softplus alpha")
        beta = weight_array(p.parametricSoftplus.beta, what="softplus beta")
        shape = lambda v: v.reshape(_channel_shape(ctx, x, v.size)) if v.size > 1 else v.reshape([])  # noqa: E731
        y = g.node("Mul", [x, g.const(shape(beta), n + "_beta")], n + "_in")
        return g.node("Mul", [g.node("Softplus", [y], n + "_sp"), g.const(shape(alpha), n + "_alpha")], n)
    raise Refused("activation %s" % kind)


def _unary(ctx: Context, layer, p) -> List[str]:
    """``f(scale * x + shift)``; epsilon guards the inverse, reciprocal square root and log."""
    g = ctx.g
    x = ctx.inp(layer)
    n = layer.name
    scale = p.scale or 1.0
    eps = p.epsilon or 1e-6
    if scale != 1.0:
        x = g.node("Mul", [x, g.scalar(scale)], n + "_scale")
    if p.shift:
        x = g.node("Add", [x, g.scalar(p.shift)], n + "_shift")
    kind = p.type   # SQRT 0, RSQRT 1, INVERSE 2, POWER 3, EXP 4, LOG 5, ABS 6, THRESHOLD 7
    if kind == 0:
        return [g.node("Sqrt", [x], n)]
    if kind == 1:
        return [g.node("Reciprocal", [g.node("Sqrt", [g.node("Add", [x, g.scalar(eps)], n + "_eps")], n + "_s")], n)]
    if kind == 2:
        return [g.node("Reciprocal", [g.node("Add", [x, g.scalar(eps)], n + "_eps")], n)]
    if kind == 3:
        return [g.node("Pow", [x, g.scalar(p.alpha)], n)]
    if kind == 4:
        return [g.node("Exp", [x], n)]
    if kind == 5:
        return [g.node("Log", [g.node("Add", [x, g.scalar(eps)], n + "_eps")], n)]
    if kind == 6:
        return [g.node("Abs", [x], n)]
    if kind == 7:
        return [g.node("Max", [x, g.scalar(p.alpha)], n)]
    raise Refused("unary operation %d" % kind)


# -- dense, normalization -----------------------------------------------------------------------------------------

def _inner_product(ctx: Context, layer, p) -> List[str]:
    g = ctx.g
    x = ctx.inp(layer)
    cin, cout = int(p.inputChannels), int(p.outputChannels)
    w = weight_array(p.weights, cin * cout, "inner product weights").reshape(cout, cin)
    wt = g.const(np.ascontiguousarray(w.T), layer.name + "_W")
    r = ctx.rank(x)
    chw = r >= 4 or (r == 3 and ctx.rank5)     # [..., C, H, W] flattens to [batch, C * H * W]
    if chw:
        s = ctx.shape(x, "flattening [..., C, H, W]")
        lead = list(s[:r - 3])
        x = g.reshape(x, [int(np.prod(lead)), int(np.prod(s[r - 3:]))], layer.name + "_flat")
    y = g.node("MatMul", [x, wt], layer.name + "_mm")
    if p.hasBias:
        y = g.node("Add", [y, g.const(weight_array(p.bias, cout, "bias"), layer.name + "_B")], layer.name + "_b")
    if chw:
        y = g.reshape(y, lead + [cout, 1, 1], layer.name)
    return [y]


def _batched_matmul(ctx: Context, layer, p) -> List[str]:
    g = ctx.g
    a = ctx.inp(layer)
    if len(layer.input) > 1:
        b = ctx.inp(layer, 1)
        if p.transposeA:
            a = g.transpose(a, _swap_last(ctx.rank(a)))
        if p.transposeB:
            b = g.transpose(b, _swap_last(ctx.rank(b)))
        return [g.node("MatMul", [a, b], layer.name)]
    x1, x2 = int(p.weightMatrixFirstDimension), int(p.weightMatrixSecondDimension)
    # the [X1, X2] matrix is stored column-major, that is as its transpose [X2, X1] row-major
    w = weight_array(p.weights, x1 * x2, "matmul weights").reshape(x2, x1).T
    y = g.node("MatMul", [a, g.const(np.ascontiguousarray(w), layer.name + "_W")], layer.name + "_mm")
    if p.hasBias:
        y = g.node("Add", [y, g.const(weight_array(p.bias, x2, "bias"), layer.name + "_B")], layer.name)
    return [y]


def _swap_last(rank: int) -> List[int]:
    perm = list(range(rank))
    perm[-1], perm[-2] = perm[-2], perm[-1]
    return perm


def _batchnorm(ctx: Context, layer, p) -> List[str]:
    g = ctx.g
    x = ctx.inp(layer)
    c = int(p.channels)
    eps = p.epsilon or 1e-5
    gamma = weight_array(p.gamma, c, "gamma")
    beta = weight_array(p.beta, c, "beta")
    cs = _channel_shape(ctx, x, c)
    if p.computeMeanVar:
        x4, back = _as4d(ctx, x)
        if p.instanceNormalization:
            affine = [g.const(gamma, layer.name + "_g"), g.const(beta, layer.name + "_b")]
            y = g.node("InstanceNormalization", [x4] + affine, layer.name, epsilon=eps)
            return [back(y)]
        mean = g.node("ReduceMean", [x4], layer.name + "_mean", axes=[0, 2, 3], keepdims=1)
        d = g.node("Sub", [x4, mean], layer.name + "_centered")
        var = g.node("ReduceMean", [g.node("Mul", [d, d], layer.name + "_sq")], layer.name + "_var", axes=[0, 2, 3],
                     keepdims=1)
        inv = g.node("Reciprocal", [g.node("Sqrt", [g.node("Add", [var, g.scalar(eps)], layer.name + "_ve")])])
        y = g.node("Mul", [d, inv], layer.name + "_norm")
        y = g.node("Mul", [y, g.const(gamma.reshape(c, 1, 1), layer.name + "_g")])
        return [back(g.node("Add", [y, g.const(beta.reshape(c, 1, 1), layer.name + "_b")], layer.name))]
    mean = weight_array(p.mean, c, "mean")
    var = weight_array(p.variance, c, "variance")
    scale = gamma / np.sqrt(var + eps)
    shift = beta - mean * scale
    y = g.node("Mul", [x, g.const(scale.reshape(cs), layer.name + "_scale")], layer.name + "_mul")
    return [g.node("Add", [y, g.const(shift.reshape(cs), layer.name + "_shift")], layer.name)]


def _mvn(ctx: Context, layer, p) -> List[str]:
    g = ctx.g
    x = ctx.inp(layer)
    axes = [-3, -2, -1] if p.acrossChannels else [-2, -1]
    mean = g.node("ReduceMean", [x], layer.name + "_mean", axes=axes, keepdims=1)
    y = g.node("Sub", [x, mean], layer.name + ("_centered" if p.normalizeVariance else ""))
    if not p.normalizeVariance:
        return [y]
    var = g.node("ReduceMean", [g.node("Mul", [y, y])], layer.name + "_var", axes=axes, keepdims=1)
    std = g.node("Sqrt", [g.node("Add", [var, g.scalar(p.epsilon or 1e-6)])])
    return [g.node("Div", [y, std], layer.name)]


def _l2normalize(ctx: Context, layer, p) -> List[str]:
    g = ctx.g
    x = ctx.inp(layer)
    ss = g.node("ReduceSumSquare", [x], layer.name + "_ss", axes=[-3, -2, -1], keepdims=1)
    norm = g.node("Sqrt", [g.node("Add", [ss, g.scalar(p.epsilon or 1e-6)])])
    return [g.node("Div", [x, norm], layer.name)]


def _lrn(ctx: Context, layer, p) -> List[str]:
    x4, back = _as4d(ctx, ctx.inp(layer))
    return [back(ctx.g.node("LRN", [x4], layer.name, alpha=p.alpha, beta=p.beta, size=int(p.localSize),
                            bias=p.k or 1.0))]


def _layer_norm(ctx: Context, layer, p) -> List[str]:
    g = ctx.g
    shape = [int(v) for v in p.normalizedShape]
    n = int(np.prod(shape))
    gamma = weight_array(p.gamma, n, "gamma").reshape(shape) if len(p.gamma.floatValue) or len(
        p.gamma.float16Value) or len(p.gamma.rawValue) else np.ones(shape, np.float32)
    beta = weight_array(p.beta, n, "beta").reshape(shape) if len(p.beta.floatValue) or len(
        p.beta.float16Value) or len(p.beta.rawValue) else np.zeros(shape, np.float32)
    return [g.node("LayerNormalization", [ctx.inp(layer), g.const(gamma, layer.name + "_g"),
                                          g.const(beta, layer.name + "_b")], layer.name, axis=-len(shape),
                   epsilon=p.eps or 1e-5)]


def _softmax(ctx: Context, layer, p) -> List[str]:
    return [ctx.g.node("Softmax", [ctx.inp(layer)], layer.name, axis=-3 if ctx.rank(ctx.inp(layer)) >= 3 else -1)]


def _softmax_nd(ctx: Context, layer, p) -> List[str]:
    return [ctx.g.node("Softmax", [ctx.inp(layer)], layer.name, axis=int(p.axis))]


# -- elementwise ------------------------------------------------------------------------------------------------

def _variadic(op: str, identity_alpha: bool) -> Converter:
    """add / multiply / max / min over any number of inputs (numpy broadcasting); with one input, ``alpha`` is the
    other operand."""
    def convert(ctx: Context, layer, p) -> List[str]:
        g = ctx.g
        xs = [ctx.env[i] for i in layer.input]
        if len(xs) == 1:
            if not identity_alpha:
                return [g.node("Identity", xs, layer.name)]
            xs.append(g.scalar(p.alpha))
        y = xs[0]
        for i, x in enumerate(xs[1:]):
            y = g.node(op, [y, x], layer.name if i == len(xs) - 2 else layer.name + "_part")
        return [y]
    return convert


def _average(ctx: Context, layer, p) -> List[str]:
    g = ctx.g
    xs = [ctx.env[i] for i in layer.input]
    return [g.node("Mean", xs, layer.name)]


def _scale(ctx: Context, layer, p) -> List[str]:
    g = ctx.g
    x = ctx.inp(layer)
    scale = weight_array(p.scale, what="scale").reshape(_param_shape(p.shapeScale))
    y = g.node("Mul", [x, g.const(scale, layer.name + "_scale")], layer.name + ("_mul" if p.hasBias else ""))
    if p.hasBias:
        bias = weight_array(p.bias, what="bias").reshape(_param_shape(p.shapeBias))
        y = g.node("Add", [y, g.const(bias, layer.name + "_bias")], layer.name)
    return [y]


def _bias(ctx: Context, layer, p) -> List[str]:
    bias = weight_array(p.bias, what="bias").reshape(_param_shape(p.shape))
    return [ctx.g.node("Add", [ctx.inp(layer), ctx.g.const(bias, layer.name + "_bias")], layer.name)]


def _param_shape(shape) -> List[int]:
    """A legacy scale/bias shape: ``[1]`` (scalar), ``[C]`` (per channel) or ``[C, H, W]``."""
    s = [int(v) for v in shape]
    if len(s) == 1:
        return [] if s[0] == 1 else [s[0], 1, 1]
    return s


def _binary(op: str) -> Converter:
    def convert(ctx: Context, layer, p) -> List[str]:
        return [ctx.g.node(op, [ctx.inp(layer), ctx.inp(layer, 1)], layer.name)]
    return convert


def _compare(op: str, negate: bool = False) -> Converter:
    """A comparison whose result is 1.0 or 0.0; with one input, ``alpha`` is the right operand."""
    def convert(ctx: Context, layer, p) -> List[str]:
        g = ctx.g
        b = ctx.inp(layer, 1) if len(layer.input) > 1 else g.scalar(p.alpha)
        y = g.node(op, [ctx.inp(layer), b], layer.name + "_b")
        if negate:
            y = g.node("Not", [y], layer.name + "_not")
        return [g.node("Cast", [y], layer.name, to=TensorProto.FLOAT)]
    return convert


def _logical(op: str) -> Converter:
    def convert(ctx: Context, layer, p) -> List[str]:
        g = ctx.g
        xs = [g.node("Cast", [ctx.env[i]], layer.name + "_bool", to=TensorProto.BOOL) for i in layer.input]
        return [g.node("Cast", [g.node(op, xs, layer.name + "_b")], layer.name, to=TensorProto.FLOAT)]
    return convert


def _floor_mod(ctx: Context, layer, p) -> List[str]:
    g = ctx.g
    a, b = ctx.inp(layer), ctx.inp(layer, 1)
    q = g.node("Floor", [g.node("Div", [a, b], layer.name + "_div")], layer.name + "_floor")
    return [g.node("Sub", [a, g.node("Mul", [q, b])], layer.name)]


def _floor_div(ctx: Context, layer, p) -> List[str]:
    g = ctx.g
    return [g.node("Floor", [g.node("Div", [ctx.inp(layer), ctx.inp(layer, 1)], layer.name + "_div")], layer.name)]


def _simple(op: str, **attrs) -> Converter:
    def convert(ctx: Context, layer, p) -> List[str]:
        return [ctx.g.node(op, [ctx.inp(layer)], layer.name, **attrs)]
    return convert


def _exp2(ctx: Context, layer, p) -> List[str]:
    return [ctx.g.node("Pow", [ctx.g.scalar(2.0), ctx.inp(layer)], layer.name)]


def gelu(g: OnnxGraph, x: str, mode: int, name: str) -> str:
    """GELU exact (0), tanh approximation (1) or sigmoid approximation x * sigmoid(1.702 x) (2)."""
    if mode == 2:
        return g.node("Mul", [x, g.node("Sigmoid", [g.node("Mul", [x, g.scalar(1.702)])])], name)
    if mode == 1:
        x3 = g.node("Mul", [g.node("Mul", [x, x]), x])
        inner = g.node("Mul", [g.node("Add", [x, g.node("Mul", [x3, g.scalar(0.044715)])]),
                               g.scalar(math.sqrt(2.0 / math.pi))])
        half = g.node("Mul", [x, g.scalar(0.5)])
        return g.node("Mul", [half, g.node("Add", [g.node("Tanh", [inner]), g.scalar(1.0)])], name)
    erf = g.node("Erf", [g.node("Mul", [x, g.scalar(1.0 / math.sqrt(2.0))])])
    return g.node("Mul", [g.node("Mul", [x, g.scalar(0.5)]), g.node("Add", [erf, g.scalar(1.0)])], name)


def _gelu(ctx: Context, layer, p) -> List[str]:
    return [gelu(ctx.g, ctx.inp(layer), int(p.mode), layer.name)]


def _clip(ctx: Context, layer, p) -> List[str]:
    g = ctx.g
    return [g.node("Clip", [ctx.inp(layer), g.scalar(p.minVal), g.scalar(p.maxVal)], layer.name)]


def _clamped_relu(ctx: Context, layer, p) -> List[str]:
    """min(beta, x if x >= 0 else alpha * x)."""
    g = ctx.g
    y = g.node("LeakyRelu", [ctx.inp(layer)], layer.name + "_lr", alpha=p.alpha)
    return [g.node("Min", [y, g.scalar(p.beta)], layer.name)]


def _where(ctx: Context, layer, p) -> List[str]:
    g = ctx.g
    cond = g.node("Cast", [ctx.inp(layer)], layer.name + "_cond", to=TensorProto.BOOL)
    return [g.node("Where", [cond, ctx.inp(layer, 1), ctx.inp(layer, 2)], layer.name)]


# -- reductions ---------------------------------------------------------------------------------------------------

_LEGACY_REDUCE_AXES = {0: [-3, -2, -1], 1: [-2, -1], 2: [-3], 3: [-2], 4: [-1]}
_LEGACY_REDUCE_OPS = {0: "ReduceSum", 1: "ReduceMean", 2: "ReduceProd", 4: "ReduceSumSquare", 5: "ReduceL1",
                      6: "ReduceL2", 7: "ReduceMax", 8: "ReduceMin"}


def _reduce_node(g: OnnxGraph, op: str, x: str, axes: Optional[List[int]], keep: bool, name: str) -> str:
    # opset 17: ReduceSum takes its axes as an input, the other reductions as an attribute
    if op == "ReduceSum":
        inputs = [x] + ([g.ints(axes, name + "_axes")] if axes is not None else [])
        return g.node(op, inputs, name, keepdims=int(keep))
    return g.node(op, [x], name, axes=axes, keepdims=int(keep))


def _reduce(ctx: Context, layer, p) -> List[str]:
    g = ctx.g
    x = ctx.inp(layer)
    axes = _LEGACY_REDUCE_AXES[p.axis]
    if p.mode == 9:
        if len(axes) != 1:
            raise Refused("ARGMAX over more than one axis")
        y = g.node("ArgMax", [x], layer.name + "_i", axis=axes[0], keepdims=1)
        return [g.node("Cast", [y], layer.name, to=TensorProto.FLOAT)]
    if p.mode not in _LEGACY_REDUCE_OPS:
        raise Refused("reduce mode LOGSUM")
    return [_reduce_node(g, _LEGACY_REDUCE_OPS[p.mode], x, axes, True, layer.name)]


def _reduce_nd(op: str) -> Converter:
    def convert(ctx: Context, layer, p) -> List[str]:
        axes = None if p.reduceAll else [int(a) for a in p.axes]
        return [_reduce_node(ctx.g, op, ctx.inp(layer), axes, bool(p.keepDims), layer.name)]
    return convert


def _arg(op: str) -> Converter:
    def convert(ctx: Context, layer, p) -> List[str]:
        g = ctx.g
        y = g.node(op, [ctx.inp(layer)], layer.name + "_i", axis=int(p.axis), keepdims=0 if p.removeDim else 1)
        return [g.node("Cast", [y], layer.name, to=TensorProto.FLOAT)]
    return convert


# -- shape and data movement ------------------------------------------------------------------------------------

def _flatten(ctx: Context, layer, p) -> List[str]:
    g = ctx.g
    x = ctx.inp(layer)
    s = ctx.shape(x, "flatten")
    r = len(s)
    if r < 3:
        raise Refused("flatten of a rank-%d input (needs [..., C, H, W])" % r)
    if p.mode == 1:                 # CHANNEL_LAST: H, W, C order
        x = g.transpose(x, list(range(r - 3)) + [r - 2, r - 1, r - 3], layer.name + "_hwc")
    return [g.reshape(x, list(s[:r - 3]) + [int(np.prod(s[r - 3:])), 1, 1], layer.name)]


def _flatten_2d(ctx: Context, layer, p) -> List[str]:
    return [ctx.g.node("Flatten", [ctx.inp(layer)], layer.name, axis=int(p.axis))]


def _reshape(ctx: Context, layer, p) -> List[str]:
    g = ctx.g
    x = ctx.inp(layer)
    s = ctx.shape(x, "reshape")
    target = [int(v) for v in p.targetShape]
    r = len(s)
    lead = list(s[:max(r - 3, 0)])
    if len(target) == 4:            # [Seq, C, H, W]: the sequence axis leads, a batch axis stays
        out = ([target[0]] if target[0] != 1 or r == 5 else []) + lead[-1:] * (r >= 4) + target[1:]
    elif len(target) == 3:
        out = lead + target
    else:
        raise Refused("a reshape to %d dimensions (needs 3 or 4)" % len(target))
    if p.mode == 1:                 # CHANNEL_LAST: reshape in H, W, C order
        x = g.transpose(x, list(range(r - 3)) + [r - 2, r - 1, r - 3], layer.name + "_hwc")
        k = len(out)
        y = g.reshape(x, out[:k - 3] + [out[k - 2], out[k - 1], out[k - 3]], layer.name + "_r")
        return [g.transpose(y, list(range(k - 3)) + [k - 1, k - 3, k - 2], layer.name)]
    return [g.reshape(x, out, layer.name)]


def _reshape_static(ctx: Context, layer, p) -> List[str]:
    return [ctx.g.reshape(ctx.inp(layer), [int(v) for v in p.targetShape], layer.name)]


def _reshape_like(ctx: Context, layer, p) -> List[str]:
    g = ctx.g
    return [g.node("Reshape", [ctx.inp(layer), g.node("Shape", [ctx.inp(layer, 1)])], layer.name)]


def _reshape_dynamic(ctx: Context, layer, p) -> List[str]:
    g = ctx.g
    shape = g.node("Cast", [ctx.inp(layer, 1)], layer.name + "_shape", to=TensorProto.INT64)
    return [g.node("Reshape", [ctx.inp(layer), shape], layer.name)]


def _permute(ctx: Context, layer, p) -> List[str]:
    axes = [int(a) for a in p.axis]
    x = ctx.inp(layer)
    r = ctx.rank(x)
    if len(axes) != 4 or axes[0] != 0 or r < 3:
        raise Refused("a permute that moves the sequence axis (axis %s)" % axes)
    perm = list(range(r - 3)) + [r - 4 + a for a in axes[1:]]
    return [ctx.g.transpose(x, perm, layer.name)]


def _transpose(ctx: Context, layer, p) -> List[str]:
    return [ctx.g.transpose(ctx.inp(layer), [int(a) for a in p.axes], layer.name)]


def _concat(ctx: Context, layer, p) -> List[str]:
    if p.sequenceConcat:
        return [ctx.g.node("Concat", [ctx.env[i] for i in layer.input], layer.name, axis=-5)]
    return [ctx.g.node("Concat", [ctx.env[i] for i in layer.input], layer.name, axis=-3)]


def _concat_nd(ctx: Context, layer, p) -> List[str]:
    if p.interleave:
        raise Refused("an interleaving concatND")
    return [ctx.g.node("Concat", [ctx.env[i] for i in layer.input], layer.name, axis=int(p.axis))]


def _split_sizes(ctx: Context, x: str, axis: int, n: int) -> List[int]:
    size = ctx.shape(x, "split")[axis]
    if size % n:
        raise Refused("a split of %d into %d equal parts" % (size, n))
    return [size // n] * n


def _split(ctx: Context, layer, p) -> List[str]:
    g = ctx.g
    x = ctx.inp(layer)
    n = len(layer.output)
    sizes = _split_sizes(ctx, x, -3, n)
    return g.node("Split", [x, g.ints(sizes, layer.name + "_sizes")], layer.name, outputs=n, axis=-3) \
        if n > 1 else [g.node("Identity", [x], layer.name)]


def _split_nd(ctx: Context, layer, p) -> List[str]:
    g = ctx.g
    x = ctx.inp(layer)
    n = len(layer.output)
    axis = int(p.axis)
    sizes = [int(v) for v in p.splitSizes] if len(p.splitSizes) else _split_sizes(ctx, x, axis, n)
    if n == 1:
        return [g.node("Identity", [x], layer.name)]
    return g.node("Split", [x, g.ints(sizes, layer.name + "_sizes")], layer.name, outputs=n, axis=axis)


def _slice(ctx: Context, layer, p) -> List[str]:
    g = ctx.g
    axis = (-3, -2, -1)[p.axis]
    end = int(p.endIndex)
    return [g.node("Slice", [ctx.inp(layer), g.ints([int(p.startIndex)], layer.name + "_b"),
                             g.ints([end], layer.name + "_e"), g.ints([axis], layer.name + "_a"),
                             g.ints([int(p.stride) or 1], layer.name + "_s")], layer.name)]


def strided_slice(g: OnnxGraph, x: str, begin: Sequence[int], end: Sequence[int], stride: Sequence[int],
                  begin_mask: Sequence[bool], end_mask: Sequence[bool], squeeze_mask: Sequence[bool],
                  name: str) -> str:
    """numpy-style ``x[b0:e0:s0, ...]`` with TensorFlow's masks: a begin (end) mask means "from the start (to the
    end)" in the stride's direction; a squeeze mask takes the single index ``begin`` and drops the axis."""
    starts, ends, steps, squeeze = [], [], [], []
    for i in range(len(begin)):
        s = int(stride[i]) if i < len(stride) and stride[i] else 1
        b, e = int(begin[i]), int(end[i])
        if i < len(squeeze_mask) and squeeze_mask[i]:
            starts.append(b)
            ends.append(b + 1 if b != -1 else INT64_MAX)
            steps.append(1)
            squeeze.append(i)
            continue
        if i < len(begin_mask) and begin_mask[i]:
            b = 0 if s > 0 else INT64_MAX
        if i < len(end_mask) and end_mask[i]:
            e = INT64_MAX if s > 0 else INT64_MIN
        starts.append(b)
        ends.append(e)
        steps.append(s)
    axes = list(range(len(starts)))
    y = g.node("Slice", [x, g.ints(starts, name + "_b"), g.ints(ends, name + "_e"), g.ints(axes, name + "_a"),
                         g.ints(steps, name + "_s")], name + ("_sl" if squeeze else ""))
    return g.squeeze(y, squeeze, name) if squeeze else y


def _slice_static(ctx: Context, layer, p) -> List[str]:
    return [strided_slice(ctx.g, ctx.inp(layer), p.beginIds, p.endIds, p.strides, p.beginMasks, p.endMasks,
                          p.squeezeMasks, layer.name)]


def _squeeze(ctx: Context, layer, p) -> List[str]:
    g = ctx.g
    x = ctx.inp(layer)
    if p.squeezeAll:
        s = ctx.shape(x, "squeezing every axis of size 1")
        axes = [i for i, d in enumerate(s) if d == 1]
    else:
        axes = [int(a) for a in p.axes]
    return [g.squeeze(x, axes, layer.name) if axes else g.node("Identity", [x], layer.name)]


def _expand_dims(ctx: Context, layer, p) -> List[str]:
    return [ctx.g.unsqueeze(ctx.inp(layer), [int(a) for a in p.axes], layer.name)]


def _padding(ctx: Context, layer, p) -> List[str]:
    g = ctx.g
    x = ctx.inp(layer)
    r = ctx.rank(x)
    (hb, he), (wb, we) = _border(p.paddingAmounts)
    pads = [0] * (2 * r)
    pads[r - 2], pads[r - 1], pads[2 * r - 2], pads[2 * r - 1] = hb, wb, he, we
    kind = p.WhichOneof("PaddingType") or "constant"
    mode = {"constant": "constant", "reflection": "reflect", "replication": "edge"}[kind]
    inputs = [x, g.ints(pads, layer.name + "_pads")]
    if kind == "constant":
        inputs.append(g.scalar(p.constant.value))
    return [g.node("Pad", inputs, layer.name, mode=mode)]


def _constant_pad(ctx: Context, layer, p) -> List[str]:
    g = ctx.g
    x = ctx.inp(layer)
    amounts = [int(v) for v in p.padAmounts]
    r = ctx.rank(x)
    if p.padToGivenOutputSizeMode:
        s = ctx.shape(x, "padding to a given output size")
        amounts = [a - s[i // 2] if a and i % 2 else a for i, a in enumerate(amounts)]
        amounts = [max(a, 0) for a in amounts]
    amounts = [0] * (2 * r - len(amounts)) + amounts     # pairs for the last axes
    pads = amounts[0::2] + amounts[1::2]
    return [g.node("Pad", [x, g.ints(pads, layer.name + "_pads"), g.scalar(p.value)], layer.name, mode="constant")]


def _crop(ctx: Context, layer, p) -> List[str]:
    g = ctx.g
    x = ctx.inp(layer)
    s = ctx.shape(x, "crop")
    if len(layer.input) > 1:
        ref = ctx.shape(ctx.inp(layer, 1), "crop to another blob's size")
        oh, ow = (_ints(p.offset, [0, 0]) + [0, 0])[:2]
        starts, ends = [oh, ow], [oh + ref[-2], ow + ref[-1]]
    else:
        (hb, he), (wb, we) = _border(p.cropAmounts)
        starts, ends = [hb, wb], [s[-2] - he, s[-1] - we]
    return [g.node("Slice", [x, g.ints(starts, layer.name + "_b"), g.ints(ends, layer.name + "_e"),
                             g.ints([-2, -1], layer.name + "_a")], layer.name)]


def _resize(g: OnnxGraph, x: str, sizes: Sequence[int], mode: str, coord: str, name: str) -> str:
    return g.node("Resize", [x, "", "", g.ints(sizes, name + "_sizes")], name, mode=mode,
                  coordinate_transformation_mode=coord, nearest_mode="floor" if mode == "nearest" else None)


def _upsample(ctx: Context, layer, p) -> List[str]:
    x = ctx.inp(layer)
    s = ctx.shape(x, "upsample")
    if len(p.fractionalScalingFactor):
        fh, fw = [float(v) for v in p.fractionalScalingFactor]
    else:
        fh, fw = [float(v) for v in _ints(p.scalingFactor, [1, 1])]
    sizes = list(s[:-2]) + [int(math.floor(s[-2] * fh)), int(math.floor(s[-1] * fw))]
    if p.mode == 0:
        return [_resize(ctx.g, x, sizes, "nearest", "asymmetric", layer.name)]
    coord = {0: "asymmetric", 1: "align_corners", 2: "half_pixel"}[p.linearUpsampleMode]
    return [_resize(ctx.g, x, sizes, "linear", coord, layer.name)]


def _resize_bilinear(ctx: Context, layer, p) -> List[str]:
    x = ctx.inp(layer)
    s = ctx.shape(x, "resize")
    th, tw = _ints(p.targetSize, [1, 1])
    method = p.mode.samplingMethod if p.HasField("mode") else 0
    coord = {0: "align_corners", 1: "align_corners", 2: "asymmetric", 3: "half_pixel"}[method]
    return [_resize(ctx.g, x, list(s[:-2]) + [th, tw], "linear", coord, layer.name)]


def _reorganize(ctx: Context, layer, p) -> List[str]:
    g = ctx.g
    x4, back = _as4d(ctx, ctx.inp(layer))
    b = int(p.blockSize)
    if p.mode == 0:
        y = g.node("SpaceToDepth", [x4], layer.name, blocksize=b)
    else:
        y = g.node("DepthToSpace", [x4], layer.name, blocksize=b, mode="DCR" if p.mode == 1 else "CRD")
    return [back(y)]


def _load_constant(ctx: Context, layer, p) -> List[str]:
    shape = [int(v) for v in p.shape]
    data = weight_array(p.data, int(np.prod(shape)), "constant").reshape(shape)
    return [ctx.g.node("Identity", [ctx.g.const(data, layer.name + "_value")], layer.name)]


def _fill_static(ctx: Context, layer, p) -> List[str]:
    shape = [int(v) for v in p.targetShape]
    return [ctx.g.node("Identity", [ctx.g.const(np.full(shape, p.value, np.float32), layer.name + "_v")],
                       layer.name)]


def _fill_like(ctx: Context, layer, p) -> List[str]:
    g = ctx.g
    shape = g.node("Shape", [ctx.inp(layer)], layer.name + "_shape")
    from onnx import helper
    return [g.node("ConstantOfShape", [shape], layer.name,
                   value=helper.make_tensor("v", TensorProto.FLOAT, [1], [p.value]))]


def _broadcast_static(ctx: Context, layer, p) -> List[str]:
    g = ctx.g
    return [g.node("Expand", [ctx.inp(layer), g.ints([int(v) for v in p.targetShape], layer.name + "_s")],
                   layer.name)]


def _broadcast_like(ctx: Context, layer, p) -> List[str]:
    g = ctx.g
    return [g.node("Expand", [ctx.inp(layer), g.node("Shape", [ctx.inp(layer, 1)])], layer.name)]


def _get_shape(ctx: Context, layer, p) -> List[str]:
    g = ctx.g
    return [g.node("Cast", [g.node("Shape", [ctx.inp(layer)], layer.name + "_s")], layer.name, to=TensorProto.FLOAT)]


def _tile(ctx: Context, layer, p) -> List[str]:
    g = ctx.g
    return [g.node("Tile", [ctx.inp(layer), g.ints([int(v) for v in p.reps], layer.name + "_reps")], layer.name)]


def _stack(ctx: Context, layer, p) -> List[str]:
    g = ctx.g
    xs = [g.unsqueeze(ctx.env[i], [int(p.axis)]) for i in layer.input]
    return [g.node("Concat", xs, layer.name, axis=int(p.axis))]


def _indices(ctx: Context, name: str, layer) -> str:
    return ctx.g.node("Cast", [name], layer.name + "_idx", to=TensorProto.INT64)


def _gather(ctx: Context, layer, p) -> List[str]:
    return [ctx.g.node("Gather", [ctx.inp(layer), _indices(ctx, ctx.inp(layer, 1), layer)], layer.name,
                       axis=int(p.axis))]


def _gather_nd(ctx: Context, layer, p) -> List[str]:
    return [ctx.g.node("GatherND", [ctx.inp(layer), _indices(ctx, ctx.inp(layer, 1), layer)], layer.name)]


def _gather_along_axis(ctx: Context, layer, p) -> List[str]:
    return [ctx.g.node("GatherElements", [ctx.inp(layer), _indices(ctx, ctx.inp(layer, 1), layer)], layer.name,
                       axis=int(p.axis))]


def _embedding_nd(ctx: Context, layer, p) -> List[str]:
    g = ctx.g
    vocab, size = int(p.vocabSize), int(p.embeddingSize)
    w = weight_array(p.weights, vocab * size, "embedding weights").reshape(size, vocab).T
    idx = g.squeeze(_indices(ctx, ctx.inp(layer), layer), [-1], layer.name + "_sq")
    y = g.node("Gather", [g.const(np.ascontiguousarray(w), layer.name + "_W"), idx], layer.name + "_g", axis=0)
    if p.hasBias:
        y = g.node("Add", [y, g.const(weight_array(p.bias, size, "bias"), layer.name + "_B")], layer.name + "_b")
    return [g.node("Identity", [y], layer.name)]


def _embedding(ctx: Context, layer, p) -> List[str]:
    """Legacy embedding: indices ``[..., 1, 1, 1]`` -> ``[..., C_out, 1, 1]``."""
    g = ctx.g
    n_in, cout = int(p.inputDim), int(p.outputChannels)
    w = weight_array(p.weights, n_in * cout, "embedding weights").reshape(cout, n_in).T
    idx = g.squeeze(_indices(ctx, ctx.inp(layer), layer), [-3, -2, -1], layer.name + "_sq")
    y = g.node("Gather", [g.const(np.ascontiguousarray(w), layer.name + "_W"), idx], layer.name + "_g", axis=0)
    if p.hasBias:
        y = g.node("Add", [y, g.const(weight_array(p.bias, cout, "bias"), layer.name + "_B")], layer.name + "_b")
    return [g.unsqueeze(y, [-1, -2], layer.name)]


def _topk(ctx: Context, layer, p) -> List[str]:
    g = ctx.g
    k = g.node("Cast", [ctx.inp(layer, 1)], layer.name + "_k", to=TensorProto.INT64) if len(layer.input) > 1 \
        else g.ints([int(p.K)], layer.name + "_k")
    if len(layer.input) > 1:
        k = g.reshape(k, [1], layer.name + "_k1")
    vals, idx = g.node("TopK", [ctx.inp(layer), k], layer.name, outputs=2, axis=int(p.axis),
                       largest=0 if p.useBottomK else 1)
    return [vals, g.node("Cast", [idx], layer.name + "_indices", to=TensorProto.FLOAT)]


def _range_static(ctx: Context, layer, p) -> List[str]:
    values = np.arange(p.startValue, p.endValue, p.stepSizeValue or 1.0, dtype=np.float32)
    return [ctx.g.node("Identity", [ctx.g.const(values, layer.name + "_v")], layer.name)]


def _cumsum(ctx: Context, layer, p) -> List[str]:
    g = ctx.g
    axis = g.const(np.asarray(int(p.axis), np.int64), layer.name + "_axis")
    return [g.node("CumSum", [ctx.inp(layer), axis], layer.name, exclusive=int(p.excludeFinalSum),
                   reverse=int(p.reverse))]


def _one_hot(ctx: Context, layer, p) -> List[str]:
    """Core ML gives an index outside [0, size) a vector of off values; ONNX counts negative ones from the end, so
    those are moved past the end first."""
    g = ctx.g
    size = int(p.oneHotVectorSize)
    if len(layer.input) > 1:
        given = g.value(ctx.inp(layer, 1))
        if given is None:
            raise Refused("a one-hot size given as a computed input")
        size = int(np.asarray(given).reshape(-1)[0])
    idx = _indices(ctx, ctx.inp(layer), layer)
    past_end = g.const(np.asarray(size, np.int64), layer.name + "_size")
    idx = g.node("Where", [g.node("Less", [idx, g.const(np.asarray(0, np.int64))]), past_end, idx])
    values = g.const(np.asarray([p.offValue, p.onValue], np.float32), layer.name + "_values")
    depth = g.const(np.asarray([size], np.int64), layer.name + "_depth")
    return [g.node("OneHot", [idx, depth, values], layer.name, axis=int(p.axis))]


def _reverse(ctx: Context, layer, p) -> List[str]:
    g = ctx.g
    axes = [i for i, r in enumerate(p.reverseDim) if r]
    if not axes:
        return [g.node("Identity", [ctx.inp(layer)], layer.name)]
    n = len(axes)
    return [g.node("Slice", [ctx.inp(layer), g.ints([-1] * n, layer.name + "_b"), g.ints([INT64_MIN] * n),
                             g.ints(axes), g.ints([-1] * n)], layer.name)]


def _triangular(upper: bool) -> Converter:
    def convert(ctx: Context, layer, p) -> List[str]:
        g = ctx.g
        k = g.const(np.asarray(int(p.k), np.int64), layer.name + "_k")
        return [g.node("Trilu", [ctx.inp(layer), k], layer.name, upper=int(upper))]
    return convert


def _band_part(ctx: Context, layer, p) -> List[str]:
    g = ctx.g
    x = ctx.inp(layer)
    s = ctx.shape(x, "matrixBandPart")
    rows, cols = s[-2], s[-1]
    lower = int(p.numLower) if p.numLower >= 0 else rows
    upper = int(p.numUpper) if p.numUpper >= 0 else cols
    i, j = np.arange(rows)[:, None], np.arange(cols)[None, :]
    mask = ((i - j <= lower) & (j - i <= upper)).astype(np.float32)
    return [g.node("Mul", [x, g.const(mask, layer.name + "_mask")], layer.name)]


def _copy(ctx: Context, layer, p) -> List[str]:
    return [ctx.g.node("Identity", [ctx.inp(layer)], layer.name)]


def _dot(ctx: Context, layer, p) -> List[str]:
    g = ctx.g
    a, b = ctx.inp(layer), ctx.inp(layer, 1)
    if p.cosineSimilarity:
        a = g.node("Div", [a, g.node("ReduceL2", [a], axes=[-3], keepdims=1)])
        b = g.node("Div", [b, g.node("ReduceL2", [b], axes=[-3], keepdims=1)])
    return [_reduce_node(g, "ReduceSum", g.node("Mul", [a, b]), [-3], True, layer.name)]


LAYERS: Dict[str, Converter] = {
    "convolution": _convolution, "pooling": _pooling, "activation": _activation, "innerProduct": _inner_product,
    "convolution3d": _convolution3d, "pooling3d": _pooling3d, "globalPooling3d": _global_pooling3d,
    "batchnorm": _batchnorm, "mvn": _mvn, "l2normalize": _l2normalize, "softmax": _softmax, "lrn": _lrn,
    "crop": _crop, "padding": _padding, "upsample": _upsample, "resizeBilinear": _resize_bilinear,
    "unary": _unary, "add": _variadic("Add", True), "multiply": _variadic("Mul", True), "average": _average,
    "scale": _scale, "bias": _bias, "max": _variadic("Max", False), "min": _variadic("Min", False), "dot": _dot,
    "reduce": _reduce, "loadConstant": _load_constant, "reshape": _reshape, "flatten": _flatten,
    "permute": _permute, "concat": _concat, "split": _split, "reorganizeData": _reorganize, "slice": _slice,
    "embedding": _embedding, "copy": _copy,
    # the ND layers
    "batchedMatmul": _batched_matmul, "addBroadcastable": _binary("Add"),
    "subtractBroadcastable": _binary("Sub"), "multiplyBroadcastable": _binary("Mul"),
    "divideBroadcastable": _binary("Div"), "maxBroadcastable": _binary("Max"), "minBroadcastable": _binary("Min"),
    "powBroadcastable": _binary("Pow"), "modBroadcastable": _floor_mod, "floorDivBroadcastable": _floor_div,
    "equal": _compare("Equal"), "notEqual": _compare("Equal", negate=True), "lessThan": _compare("Less"),
    "lessEqual": _compare("LessOrEqual"), "greaterThan": _compare("Greater"),
    "greaterEqual": _compare("GreaterOrEqual"), "logicalAnd": _logical("And"), "logicalOr": _logical("Or"),
    "logicalXor": _logical("Xor"), "logicalNot": _logical("Not"),
    "clip": _clip, "ceil": _simple("Ceil"), "floor": _simple("Floor"), "sign": _simple("Sign"),
    "round": _simple("Round"), "exp2": _exp2, "sin": _simple("Sin"), "cos": _simple("Cos"), "tan": _simple("Tan"),
    "asin": _simple("Asin"),
    "acos": _simple("Acos"), "atan": _simple("Atan"), "sinh": _simple("Sinh"), "cosh": _simple("Cosh"),
    "tanh": _simple("Tanh"), "asinh": _simple("Asinh"), "acosh": _simple("Acosh"), "atanh": _simple("Atanh"),
    "erf": _simple("Erf"), "gelu": _gelu, "clampedReLU": _clamped_relu, "whereBroadcastable": _where,
    "softmaxND": _softmax_nd, "layerNormalization": _layer_norm, "concatND": _concat_nd, "splitND": _split_nd,
    "sliceStatic": _slice_static, "transpose": _transpose, "reshapeStatic": _reshape_static,
    "reshapeLike": _reshape_like, "reshapeDynamic": _reshape_dynamic, "rankPreservingReshape": _reshape_static,
    "flattenTo2D": _flatten_2d, "squeeze": _squeeze, "expandDims": _expand_dims, "constantPad": _constant_pad,
    "reduceL1": _reduce_nd("ReduceL1"), "reduceL2": _reduce_nd("ReduceL2"), "reduceMax": _reduce_nd("ReduceMax"),
    "reduceMin": _reduce_nd("ReduceMin"), "reduceSum": _reduce_nd("ReduceSum"),
    "reduceProd": _reduce_nd("ReduceProd"), "reduceMean": _reduce_nd("ReduceMean"),
    "reduceLogSum": _reduce_nd("ReduceLogSum"), "reduceSumSquare": _reduce_nd("ReduceSumSquare"),
    "reduceLogSumExp": _reduce_nd("ReduceLogSumExp"), "argMax": _arg("ArgMax"), "argMin": _arg("ArgMin"),
    "tile": _tile, "stack": _stack, "gather": _gather, "gatherND": _gather_nd,
    "gatherAlongAxis": _gather_along_axis, "embeddingND": _embedding_nd, "topK": _topk,
    "loadConstantND": _load_constant, "fillStatic": _fill_static, "fillLike": _fill_like,
    "broadcastToStatic": _broadcast_static, "broadcastToLike": _broadcast_like, "getShape": _get_shape,
    "rangeStatic": _range_static, "cumSum": _cumsum, "oneHot": _one_hot, "reverse": _reverse,
    "lowerTriangular": _triangular(False), "upperTriangular": _triangular(True), "matrixBandPart": _band_part,
}
