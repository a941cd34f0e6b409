"""Convolutions, pooling, padding, cropping and upsampling: the layers ONNX computes channels-first.

A channels_last layer (Keras' default) takes its input channels-first (one Transpose at the first of a chain,
none after) and leaves its output channels-first; a channels_first layer works in the Keras axis order. Padding
"same" is TensorFlow's (the odd unit at the end: ONNX SAME_UPPER), "causal" pads the start of a Conv1D by the
dilated kernel. A transposed convolution crops like TensorFlow's conv_transpose for Keras' output size.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from tether.frontend.keras import activations
from tether.frontend.keras.builder import Value
from tether.frontend.keras.layer import Call, LayerTable, pair

LAYERS = LayerTable(__name__)


def _spatial(c: Call) -> Tuple[str, bool]:
    """The input in the layer's layout, and whether that layout is channels-first-of-channels-last (cf)."""
    if (c.get("data_format") or "channels_last") == "channels_first":
        return c.b.keras_order(c.x), False
    return c.b.channels_first(c.x), True


def _nd(c: Call) -> int:
    nd = c.x.rank - 2
    if nd < 1:
        raise c.refuse("an input of rank %d (expected a batch, spatial axes and channels)" % c.x.rank)
    return nd


def _spatial_sizes(c: Call) -> Optional[List[Optional[int]]]:
    """The input's spatial sizes where the file records them."""
    shape = c.x.shape
    if shape is None:
        return None
    if (c.get("data_format") or "channels_last") == "channels_first":
        return list(shape[2:])
    return list(shape[1:-1])


def _padding_attrs(c: Call, nd: int, k: List[int], s: List[int], d: List[int]) -> Dict[str, Any]:
    padding = str(c.get("padding", "valid")).lower()
    if padding == "valid":
        return {"pads": [0] * (2 * nd)}
    if padding == "same":
        # TensorFlow's SAME: the total pad makes ceil(in / s) outputs, its odd unit at the end. Explicit pads
        # where the sizes are known (any size for stride 1), since runtimes differ on SAME_UPPER with dilation
        sizes = _spatial_sizes(c)
        pads = []
        for i in range(nd):
            size = sizes[i] if sizes else None
            if s[i] != 1 and size is None:
                return {"auto_pad": "SAME_UPPER"}
            k_eff = (k[i] - 1) * d[i] + 1
            total = k_eff - 1 if s[i] == 1 else max((-(-size // s[i]) - 1) * s[i] + k_eff - size, 0)
            pads.append((total // 2, total - total // 2))
        return {"pads": [p[0] for p in pads] + [p[1] for p in pads]}
    if padding == "causal" and nd == 1:
        return {"pads": [(k[0] - 1) * d[0], 0]}
    raise c.refuse("padding %r" % padding)


def _out(c: Call, name: str, cf: bool, activation: Any = None) -> List[Value]:
    v = Value(name, c.x.rank, cf)
    return [activations.apply(c.b, v, activation, c.version, c.hint()) if activation is not None else v]


def _kernel_to_onnx(kernel: np.ndarray, nd: int) -> np.ndarray:
    """Keras (*k, in, out) -> ONNX (out, in, *k); also a transposed conv's (*k, out, in) -> (in, out, *k)."""
    return np.ascontiguousarray(np.transpose(kernel, [nd + 1, nd] + list(range(nd))))


def _depthwise_to_onnx(kernel: np.ndarray, nd: int) -> np.ndarray:
    """Keras (*k, in, multiplier) -> ONNX (in * multiplier, 1, *k): output channel c * multiplier + m."""
    k = kernel.shape[:nd]
    flat = kernel.reshape(k + (-1,))
    return np.ascontiguousarray(np.transpose(flat, [nd] + list(range(nd))).reshape((-1, 1) + k))


def _window(c: Call, nd: int, size_key: str) -> Tuple[List[int], List[int], List[int]]:
    k = pair(c.get(size_key), nd)
    s = pair(c.get("strides") or 1, nd)
    d = pair(c.get("dilation_rate") or 1, nd)
    return k, s, d


@LAYERS.register("Conv1D", "Conv2D", "Conv3D")
def _conv(c: Call) -> List[Value]:
    nd = _nd(c)
    x, cf = _spatial(c)
    w = c.weights((1, 2) if c.get("use_bias", True) else (1,))
    k, s, d = _window(c, nd, "kernel_size")
    inputs = [x, c.b.const(_kernel_to_onnx(w[0], nd), c.hint("_W"))] + \
        ([c.b.const(w[1], c.hint("_B"))] if len(w) > 1 else [])
    y = c.b.op("Conv", inputs, c.hint(), kernel_shape=k, strides=s, dilations=d, group=int(c.get("groups", 1)),
               **_padding_attrs(c, nd, k, s, d))
    return _out(c, y, cf, c.get("activation"))


@LAYERS.register("DepthwiseConv1D", "DepthwiseConv2D")
def _depthwise(c: Call) -> List[Value]:
    nd = _nd(c)
    x, cf = _spatial(c)
    w = c.weights((1, 2) if c.get("use_bias", True) else (1,))
    k, s, d = _window(c, nd, "kernel_size")
    kernel = _depthwise_to_onnx(w[0], nd)
    inputs = [x, c.b.const(kernel, c.hint("_W"))] + ([c.b.const(w[1], c.hint("_B"))] if len(w) > 1 else [])
    y = c.b.op("Conv", inputs, c.hint(), kernel_shape=k, strides=s, dilations=d, group=int(w[0].shape[nd]),
               **_padding_attrs(c, nd, k, s, d))
    return _out(c, y, cf, c.get("activation"))


@LAYERS.register("SeparableConv1D", "SeparableConv2D")
def _separable(c: Call) -> List[Value]:
    nd = _nd(c)
    x, cf = _spatial(c)
    w = c.weights((2, 3) if c.get("use_bias", True) else (2,))
    k, s, d = _window(c, nd, "kernel_size")
    dw = c.b.op("Conv", [x, c.b.const(_depthwise_to_onnx(w[0], nd), c.hint("_dW"))], c.hint("_depthwise"),
                kernel_shape=k, strides=s, dilations=d, group=int(w[0].shape[nd]), **_padding_attrs(c, nd, k, s, d))
    inputs = [dw, c.b.const(_kernel_to_onnx(w[1], nd), c.hint("_pW"))] + \
        ([c.b.const(w[2], c.hint("_B"))] if len(w) > 2 else [])
    y = c.b.op("Conv", inputs, c.hint("_pointwise"), kernel_shape=[1] * nd)
    return _out(c, y, cf, c.get("activation"))


def transpose_pads(c: Call, k: int, s: int, d: int, output_padding: Optional[int]) -> Tuple[int, int, int]:
    """(begin, end, output_padding) of an ONNX ConvTranspose giving Keras' output size: Keras picks the size
    (keras' deconv_output_length), TensorFlow crops the full result by the SAME padding of the forward conv from
    that size. ``(in - 1) s + k_eff - out`` does not depend on ``in``, so neither do the pads."""
    padding = str(c.get("padding", "valid")).lower()
    if padding not in ("same", "valid"):
        raise c.refuse("padding %r" % padding)
    k_eff = (k - 1) * d + 1
    if output_padding is None:
        excess = k_eff - s if padding == "same" else k_eff - max(k_eff, s)
    else:
        excess = 2 * (k_eff // 2 if padding == "same" else 0) - output_padding
    begin = max(excess, 0) // 2 if padding == "same" else 0
    end = excess - begin
    return begin, max(end, 0), max(-end, 0)


@LAYERS.register("Conv1DTranspose", "Conv2DTranspose", "Conv3DTranspose")
def _conv_transpose(c: Call) -> List[Value]:
    nd = _nd(c)
    x, cf = _spatial(c)
    w = c.weights((1, 2) if c.get("use_bias", True) else (1,))
    k, s, d = _window(c, nd, "kernel_size")
    op_cfg = c.get("output_padding")
    ops = [None] * nd if op_cfg is None else pair(op_cfg, nd)
    pads = [transpose_pads(c, k[i], s[i], d[i], ops[i]) for i in range(nd)]
    inputs = [x, c.b.const(_kernel_to_onnx(w[0], nd), c.hint("_W"))] + \
        ([c.b.const(w[1], c.hint("_B"))] if len(w) > 1 else [])
    y = c.b.op("ConvTranspose", inputs, c.hint(), kernel_shape=k, strides=s, dilations=d,
               pads=[p[0] for p in pads] + [p[1] for p in pads], output_padding=[p[2] for p in pads])
    return _out(c, y, cf, c.get("activation"))


def _pool(op: str):
    def pool(c: Call) -> List[Value]:
        nd = _nd(c)
        x, cf = _spatial(c)
        k = pair(c.get("pool_size"), nd)
        s = pair(c.get("strides") or k, nd)
        y = c.b.op(op, [x], c.hint(), kernel_shape=k, strides=s, **_padding_attrs(c, nd, k, s, [1] * nd))
        return _out(c, y, cf)
    return pool


for _op, _names in (("MaxPool", ("MaxPooling1D", "MaxPooling2D", "MaxPooling3D", "MaxPool1D", "MaxPool2D",
                              "MaxPool3D")),
                    ("AveragePool", ("AveragePooling1D", "AveragePooling2D", "AveragePooling3D", "AvgPool1D",
                                  "AvgPool2D", "AvgPool3D"))):
    LAYERS.register(*_names)(_pool(_op))


def _global_pool(op: str):
    def pool(c: Call) -> List[Value]:
        _nd(c)
        x, cf = _spatial(c)
        keep = bool(c.get("keepdims", False))
        y = c.b.op(op, [x], c.hint(), axes=list(range(2, c.x.rank)), keepdims=int(keep))
        return [Value(y, c.x.rank, cf)] if keep else [Value(y, 2)]
    return pool


for _op, _names in (("ReduceMean", ("GlobalAveragePooling1D", "GlobalAveragePooling2D", "GlobalAveragePooling3D",
                                    "GlobalAvgPool1D", "GlobalAvgPool2D", "GlobalAvgPool3D")),
                    ("ReduceMax", ("GlobalMaxPooling1D", "GlobalMaxPooling2D", "GlobalMaxPooling3D",
                                   "GlobalMaxPool1D", "GlobalMaxPool2D", "GlobalMaxPool3D"))):
    LAYERS.register(*_names)(_global_pool(_op))


def _pairs(value: Any, nd: int) -> List[Tuple[int, int]]:
    """ZeroPadding/Cropping amounts as (begin, end) per spatial axis."""
    if isinstance(value, int):
        return [(value, value)] * nd
    value = list(value)
    if nd == 1:
        return [(int(value[0]), int(value[1]))] if len(value) == 2 else [(int(value[0]),) * 2]
    return [(int(v), int(v)) if isinstance(v, int) else (int(v[0]), int(v[1])) for v in value]


@LAYERS.register("ZeroPadding1D", "ZeroPadding2D", "ZeroPadding3D")
def _zero_padding(c: Call) -> List[Value]:
    nd = _nd(c)
    x, cf = _spatial(c)
    p = _pairs(c.get("padding", 1), nd)
    pads = [0, 0] + [b for b, _ in p] + [0, 0] + [e for _, e in p]
    return _out(c, c.b.op("Pad", [x, c.b.ints(pads, c.hint("_pads"))], c.hint(), mode="constant"), cf)


@LAYERS.register("Cropping1D", "Cropping2D", "Cropping3D")
def _cropping(c: Call) -> List[Value]:
    nd = _nd(c)
    x, cf = _spatial(c)
    p = _pairs(c.get("cropping", 1), nd)
    starts = [b for b, _ in p]
    ends = [-e if e else np.iinfo(np.int64).max for _, e in p]
    y = c.b.op("Slice", [x, c.b.ints(starts, c.hint("_starts")), c.b.ints(ends, c.hint("_ends")),
                         c.b.ints(range(2, 2 + nd), c.hint("_axes"))], c.hint())
    return _out(c, y, cf)


RESIZE_MODES = {
    # Keras 3 repeats rows and columns for nearest, and resizes with TensorFlow's half-pixel centres otherwise
    "nearest": {"mode": "nearest", "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"},
    "bilinear": {"mode": "linear", "coordinate_transformation_mode": "half_pixel"},
    # TensorFlow's bicubic is Keys' kernel (a = -0.5) with the taps outside the image dropped and renormalised
    "bicubic": {"mode": "cubic", "coordinate_transformation_mode": "half_pixel", "cubic_coeff_a": -0.5,
                "exclude_outside": 1},
}


@LAYERS.register("UpSampling1D", "UpSampling2D", "UpSampling3D")
def _upsampling(c: Call) -> List[Value]:
    nd = _nd(c)
    x, cf = _spatial(c)
    size = pair(c.get("size", 2), nd)
    mode = str(c.get("interpolation", "nearest"))
    if mode not in RESIZE_MODES:
        raise c.refuse("interpolation %r (tether converts %s)" % (mode, ", ".join(RESIZE_MODES)))
    scales = c.b.const(np.asarray([1.0, 1.0] + [float(v) for v in size], np.float32), c.hint("_scales"))
    y = c.b.op("Resize", [x, "", scales], c.hint(), **RESIZE_MODES[mode])
    return _out(c, y, cf)


# TensorFlow's resize (half-pixel centres; nearest takes floor((y + 0.5) / scale), which is ONNX's half-pixel
# coordinate rounded half up)
RESIZING_MODES = {
    "nearest": {"mode": "nearest", "coordinate_transformation_mode": "half_pixel",
                "nearest_mode": "round_prefer_ceil"},
    "bilinear": RESIZE_MODES["bilinear"],
    "bicubic": RESIZE_MODES["bicubic"],
}


@LAYERS.register("Resizing")
def _resizing(c: Call) -> List[Value]:
    _nd(c)
    if c.x.rank != 4:
        raise c.refuse("an input of rank %d (expected images: batch, height, width, channels)" % c.x.rank)
    for flag in ("crop_to_aspect_ratio", "pad_to_aspect_ratio", "antialias"):
        if c.get(flag, False):
            raise c.refuse("%s=True" % flag)
    mode = str(c.get("interpolation", "bilinear"))
    if mode not in RESIZING_MODES:
        raise c.refuse("interpolation %r (tether converts %s)" % (mode, ", ".join(RESIZING_MODES)))
    x, cf = _spatial(c)
    b = c.b
    # the output size as `sizes` (batch and channels from the input's shape, which folds once shapes are fixed)
    lead = b.op("Slice", [b.op("Shape", [x], c.hint()), b.ints([0], c.hint("_s")), b.ints([2], c.hint("_e"))],
                c.hint())
    sizes = b.op("Concat", [lead, b.ints([int(c.get("height")), int(c.get("width"))], c.hint("_hw"))], c.hint(),
                 axis=0)
    return _out(c, b.op("Resize", [x, "", "", sizes], c.hint(), **RESIZING_MODES[mode]), cf)


@LAYERS.register("CenterCrop")
def _center_crop(c: Call) -> List[Value]:
    sizes = _spatial_sizes(c)
    if c.x.rank != 4 or not sizes or None in sizes:
        raise c.refuse("an input without static height and width")
    target = [int(c.get("height")), int(c.get("width"))]
    if any(t > s for t, s in zip(target, sizes)):
        raise c.refuse("a crop larger than its input %s (Keras resizes then)" % sizes)
    x, cf = _spatial(c)
    starts = [(s - t) // 2 for s, t in zip(sizes, target)]
    y = c.b.op("Slice", [x, c.b.ints(starts, c.hint("_starts")),
                         c.b.ints([s + t for s, t in zip(starts, target)], c.hint("_ends")),
                         c.b.ints([2, 3], c.hint("_axes"))], c.hint())
    return _out(c, y, cf)
