"""The int8 convolution graph op ``qconv2d`` and its per-target choice of dot-product instruction.

``qconv2d(x, wp, bias) {kernel, strides, pads, dilations, channels, out_channels, pad_value, kind, flip}`` ->
``(out_channels, OH*OW)`` int32: ``bias[o] + sum_k X[p, k] * W[o, k]`` with the weights packed by ops.qconv
(``pack_weights``: x is the image (1, C, H, W); ``pack_rows``, a pointwise conv: x is viewed as (C, H*W)); the
input is read as ``pad_value`` outside the image. graph/passes/quantize_dot.py writes it (with the requantize
that follows it fused into its kernel) for the int8 convs of both ONNX forms.

``kind`` (a te.dot4 kind, "" for the one that reads x's bytes as they are) and ``flip`` (x's bytes xor 0x80) are
chosen for the target at build time by ``for_target``: every kernel computes the same integers, so only speed
depends on it. With ``flip`` the bias stored in params carries the correction (ops.qconv.flip_correction).
``DEFINITIONS`` and ``CPU_STRATEGIES`` hold the ops and their lowerings for ``tether.kernels.table``.
"""
from __future__ import annotations

import logging
from typing import Dict, Tuple

import numpy as np

from tether.graph.ir import Graph, Node, TensorType
from tether.kernels.core import DEFINITIONS as CORE, conv_out_size
from tether.kernels.registry import OpDef, Strategy, TeLowering
from tether.ops import qconv as qops
from tether.ops.qdepthwise import qdepthwise2d
from tether.target import int8_dot_native, int8_load_time_features, int8_widened

log = logging.getLogger(__name__)


def out_pixels(attrs: dict, h: int, w: int) -> int:
    (kh, kw), s, d, p = attrs["kernel"], attrs["strides"], attrs["dilations"], attrs["pads"]
    return conv_out_size(h, kh, s[0], d[0], p[0], p[2]) * conv_out_size(w, kw, s[1], d[1], p[1], p[3])


def _image_hw(attrs: dict, x) -> Tuple[int, int]:
    if attrs.get("channels_last_in"):
        return x.shape[1], x.shape[2]
    return tuple(attrs["image"]) if len(x.shape) == 2 else (x.shape[2], x.shape[3])


def _infer(attrs, x, wp, bias):
    h, w = _image_hw(attrs, x)
    shape = (attrs["out_channels"], out_pixels(attrs, h, w))
    return [TensorType(shape[::-1] if attrs.get("channels_last_out") else shape, "int32")]


def _ref(attrs, x, wp, bias):
    """numpy: the int64 convolution of the (flipped) activations, plus the bias, as int32."""
    h, w = _image_hw(attrs, x)
    ch, oc = attrs["channels"], attrs["out_channels"]
    if attrs.get("channels_last_in"):   # (1, H, W, C): graph/passes/int8_layout.py
        x = np.ascontiguousarray(x.transpose(0, 3, 1, 2))
    img = x.reshape(1, ch, h, w).astype(np.int64)
    pad = int(attrs["pad_value"])
    if attrs.get("flip"):
        shift = qops.flip_correction(str(x.dtype), attrs["kind"])
        img, pad = img - shift, pad - shift
    wt = qops.unpack_weights(wp, oc, ch, tuple(attrs["kernel"])).astype(np.int64)
    conv_attrs = {"strides": attrs["strides"], "dilations": attrs["dilations"], "pads": [0, 0, 0, 0], "groups": 1}
    p = attrs["pads"]
    img = np.pad(img, ((0, 0), (0, 0), (p[0], p[2]), (p[1], p[3])), constant_values=pad)
    (acc,) = CORE["conv2d"].ref(conv_attrs, img.astype(np.float64), wt.astype(np.float64))
    acc = np.rint(acc).astype(np.int64).reshape(oc, -1) + bias[:oc].reshape(oc, 1)     # (a padded bias: the panels')
    if attrs.get("channels_last_out"):
        acc = np.ascontiguousarray(acc.T)
    return [acc.astype(np.int32)]


def _lower(attrs, x, wp, bias, bias_start: bool = True):
    return qops.qconv2d(x, wp, bias, tuple(attrs["kernel"]), tuple(attrs["strides"]), tuple(attrs["pads"]),
                        tuple(attrs["dilations"]), attrs["out_channels"], attrs["pad_value"], attrs["kind"],
                        bool(attrs["flip"]), channels_last_in=bool(attrs.get("channels_last_in")),
                        channels_last_out=bool(attrs.get("channels_last_out")), bias_start=bias_start)



# ---- qdepthwise2d(x, w, bias) {strides, pads, pad_value} -> (1, C, OH, OW) float32: the depthwise int8 conv,
# exact in float32 (ops/qdepthwise.py); w (C, KH, KW) and bias (C,) hold integers as float32
def _dw_infer(attrs, x, w, bias):
    (t,) = CORE["conv2d"].infer(dict(attrs, dilations=[1, 1]), x, TensorType((w.shape[0], 1) + w.shape[1:],
                                                                                "float32"))
    return [TensorType(t.shape, "float32")]


def _dw_ref(attrs, x, w, bias):
    p = attrs["pads"]
    img = np.pad(x.astype(np.float64) - attrs["pad_value"], ((0, 0), (0, 0), (p[0], p[2]), (p[1], p[3])))
    conv_attrs = {"strides": attrs["strides"], "dilations": [1, 1], "pads": [0, 0, 0, 0], "groups": x.shape[1]}
    (acc,) = CORE["conv2d"].ref(conv_attrs, img, w.astype(np.float64)[:, None])
    return [(acc + bias.reshape(1, -1, 1, 1)).astype(np.float32)]


DEFINITIONS: Dict[str, OpDef] = {d.name: d for d in (OpDef("qconv2d", "complex", _infer, _ref),
                                                       OpDef("qdepthwise2d", "complex", _dw_infer, _dw_ref))}

CPU_STRATEGIES: Dict[str, Strategy] = {
    "qconv2d": TeLowering(_lower),
    "qdepthwise2d": TeLowering(lambda attrs, x, w, bias: qdepthwise2d(
        x, w, bias, tuple(attrs["strides"]), tuple(attrs["pads"]), attrs["pad_value"])),
}
# GPU kernels: the sums start at zero (the GPU lowering takes constant reduction inits only)
GPU_STRATEGIES: Dict[str, Strategy] = dict(
    CPU_STRATEGIES, qconv2d=TeLowering(lambda attrs, x, wp, bias: _lower(attrs, x, wp, bias, bias_start=False)))


def _choice(x_dtype: str, native: Tuple[str, ...]) -> Tuple[str, bool]:
    """(kind, flip) for activations of x_dtype given the target's native kinds (weights are always int8)."""
    plain = qops.default_kind(x_dtype)
    if plain in native:
        return plain, False
    signed_weights = [k for k in native if k.endswith("s8")]
    if signed_weights:
        return signed_weights[0], True
    return plain, False


_CONVS = ("qconv2d", "qdepthwise2d_nhwc")


def _widen_depthwise(params: Dict[str, np.ndarray], graph: Graph, wname: str) -> None:
    """A channels-last depthwise conv's float32 weights (integers) as int16, for its widened form
    (ops/qdepthwise_nhwc.py), where they fit."""
    w = params[wname]
    if w.dtype != np.float32 or not np.all(np.abs(w) <= 32767) or not np.array_equal(w, np.rint(w)):
        return
    params[wname] = w.astype(np.int16)
    graph.types[wname] = TensorType(w.shape, "int16")


# the pairs form from this many input channels: below, each output's lane sums (3 addp per 4 outputs) cost what its
# products save (MobileNetV2 int8 on the A72, in its kernels: from 32 channels 115.9 M, from 64 115.4 M, from 128
# 115.4 M)
PAIRS_MIN_CHANNELS = 128


def _flipped_bias(bias: np.ndarray, wp: np.ndarray, x_dtype: str, kind: str, out_channels: int):
    """The int32 bias corrected for flipped activation bytes (ops.qconv.flip_correction), None if it leaves int32."""
    fixed = bias.astype(np.int64) + qops.flip_correction(x_dtype, kind) * qops.weight_sums(wp, out_channels)
    if fixed.min() < -2 ** 31 or fixed.max() >= 2 ** 31:
        return None
    return fixed.astype(np.int32)


def _pair_form(b: Node, graph: Graph, wp: np.ndarray, bias: np.ndarray, x_dtype: str):
    """(pair weights, bias, kind, flip) for a pixel-form qconv2d that the pairs form computes (ops/qconv.py:
    pointwise, on channels-last pixels or one pixel, every weight within [-127, 127], at least PAIRS_MIN_CHANNELS
    input channels), the bias corrected for flipped uint8 bytes; None otherwise."""
    a = b.attrs
    one_pixel = tuple(graph.types[b.inputs[0]].shape[2:]) == (1, 1)
    if tuple(a["kernel"]) != (1, 1) or list(a["strides"]) != [1, 1] or any(a["pads"]) or \
            a["channels"] < PAIRS_MIN_CHANNELS or not (a.get("channels_last_in") or one_pixel):
        return None
    w = qops.unpack_weights(wp, a["out_channels"], a["channels"], (1, 1))
    if w.min(initial=0) < -127:
        return None
    pairs = qops.pair_weights(w)
    kind, flip = _choice(x_dtype, ("s8s8",))
    if flip:
        bias = _flipped_bias(bias, pairs, x_dtype, kind, a["out_channels"])
    return None if bias is None else (pairs, bias, kind, flip)


def for_target(graph: Graph, params: Dict[str, np.ndarray], target) -> Tuple[Graph, Dict[str, np.ndarray]]:
    """Every qconv2d set to the target's dot-product instruction (its kind, and flip with the bias corrected),
    in copies of the nodes and of the params that change. Where the target multiplies widened operands
    (target.int8_widened), the pixel-form convs' and the channels-last depthwise convs' weights become int16: pointwise
    convs that the pairs form computes take pair weights (``_pair_form``), the others widened ones."""
    native = int8_dot_native(target)
    if not native and "asimddp" in int8_load_time_features(target):
        # android-arm64: s8s8/u8u8 dot4 kernels are built twice and the device's hwcaps pick one at load time
        native = ("s8s8", "u8u8")
    widened = int8_widened(target)
    if widened:     # the widened form reads the bytes as they are, signed or not (ops/qconv.py)
        native = ("u8s8", "s8s8")
    if not native or not any(b.op in _CONVS for n in graph.nodes for b in n.body()):
        return graph, params
    params = dict(params)
    out = graph.copy()

    def update(b: Node) -> Node:
        if b.op == "qdepthwise2d_nhwc":
            if widened:
                _widen_depthwise(params, out, b.inputs[1])
            return b
        if b.op != "qconv2d" or b.attrs.get("flip"):
            return b
        wname, bname = b.inputs[1], b.inputs[2]
        x_dtype = str(graph.types[b.inputs[0]].dtype)
        pad_bias = False
        if widened:
            if params[wname].ndim != 3:     # the pointwise matmul form keeps dot4
                return b
            if params[wname].dtype == np.int32:
                pairs = _pair_form(b, graph, params[wname], params[bname], x_dtype)
                if pairs is not None:   # the pairs form multiplies signed bytes: uint8 is flipped
                    params[wname], params[bname], kind, flip = pairs
                    out.types[wname] = TensorType(params[wname].shape, "int16")
                    return Node(b.op, b.name, list(b.inputs), list(b.outputs), dict(b.attrs, kind=kind, flip=int(flip)))
                # the pixel form's packed words, widened once
                params[wname] = qops.widen_weights(params[wname], b.attrs["out_channels"])
                out.types[wname] = TensorType(params[wname].shape, "int16")
                pad_bias = True
        kind, flip = _choice(x_dtype, native)
        if flip:
            fixed = _flipped_bias(params[bname], params[wname], x_dtype, kind, b.attrs["out_channels"])
            if fixed is None:
                return b        # the corrected bias would not fit int32: keep the plain kind
            params[bname] = fixed
        if pad_bias:    # the sums start at the bias, one per panel lane (ops.qconv.qconv2d)
            wp = params[wname]
            lanes = wp.shape[0] * wp.shape[2]
            params[bname] = np.concatenate([params[bname], np.zeros(lanes - params[bname].size, np.int32)])
            out.types[bname] = TensorType(params[bname].shape, "int32")
        return Node(b.op, b.name, list(b.inputs), list(b.outputs), dict(b.attrs, kind=kind, flip=int(flip)))

    nodes = []
    for n in graph.nodes:
        if n.op == "fused":
            n = Node(n.op, n.name, list(n.inputs), list(n.outputs), dict(n.attrs, body=[update(b) for b in n.body()]))
        else:
            n = update(n)
        nodes.append(n)
    out.nodes = nodes
    return out, params
