"""Each Darknet layer type as ONNX nodes, with darknet's arithmetic: its padding rules, its weight order, its
batch-norm epsilon, its activations, and the [yolo]/[region] decoding OpenCV's dnn module outputs for them.

A layer function takes the translator and its section and returns its output :class:`Value`; what it cannot
express it reports with ``t.refuse`` and returns None, and the layers fed by it are skipped without a second
report, so one pass names every unsupported layer of the file.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np

from tether.errors import InvalidInput
from tether.frontend.darknet.cfg import Network, Section
from tether.frontend.darknet.weights import WeightsFile
from tether.frontend.onnx_builder import OnnxBuilder

BN_EPSILON = 1e-6          # darknet's normalize_cpu adds .000001 to the variance (OpenCV uses the same)


@dataclasses.dataclass
class Value:
    """A layer's output: its ONNX value name and per-image shape (channels, height, width); ``flat`` for the 2-D
    [N, C] output of a fully connected layer."""

    name: str
    c: int
    h: int
    w: int
    flat: bool = False


class Translator:
    """One .cfg (+ .weights) becoming one ONNX graph; ``weights`` None reads all weights as zeros (for --check)."""

    def __init__(self, net: Network, weights: Optional[WeightsFile], cfg_path: str, name: str) -> None:
        self.net = net
        self.weights = weights
        self.cfg_path = cfg_path
        self.b = OnnxBuilder(name, "tether darknet frontend")
        self.refused: List[Tuple[str, Section, str]] = []
        self.outputs: List[Optional[Value]] = []
        self.consumed: set = set()
        self.input_hw: Tuple[int, int] = (0, 0)

    # -- helpers the layer functions share ---------------------------------------------------------------
    def refuse(self, op: str, s: Section, why: str = "") -> None:
        self.refused.append((op, s, why))

    def take(self, count: int, s: Section, what: str) -> np.ndarray:
        if self.weights is None:
            return np.zeros(count, np.float32)
        return self.weights.take(count, "the %s of layer %d ([%s] at line %d of %s)"
                                 % (what, s.index, s.type, s.line, self.cfg_path))

    def layer_ref(self, s: Section, ref: int) -> int:
        """A layer number as [route]/[shortcut] write it: negative counts back from this layer."""
        idx = ref if ref >= 0 else s.index + ref
        if not 0 <= idx < s.index:
            raise InvalidInput("%s: [%s] at line %d refers to layer %d, expected one of the layers before it (0..%d)"
                               % (self.cfg_path, s.type, s.line, ref, s.index - 1))
        self.consumed.add(idx)
        return idx

    def spatial(self, v: Value, s: Section) -> str:
        """``v`` as a 4-D NCHW tensor (a fully connected output becomes [N, C, 1, 1])."""
        if not v.flat:
            return v.name
        return self.b.node("Reshape", [v.name, self.b.ints("shape", [0, v.c, 1, 1])], "%s_nchw" % _base(s))

    def activation(self, x: str, s: Section, key: str = "activation", default: str = "linear") -> Optional[str]:
        act = s.str(key, default).lower()
        fn = ACTIVATIONS.get(act)
        if fn is None:
            self.refuse("activation=%s" % act, s)
            return None
        return fn(self.b, x, "%s_%s" % (act, s.index))

    def bn_fold(self, s: Section, filters: int) -> Tuple[np.ndarray, np.ndarray]:
        """The (scale, shift) of darknet's inference batch norm, read in its order: scales, means, variances."""
        gamma = self.take(filters, s, "batch-norm scales")
        mean = self.take(filters, s, "batch-norm means")
        var = self.take(filters, s, "batch-norm variances")
        k = gamma.astype(np.float64) / np.sqrt(var.astype(np.float64) + BN_EPSILON)
        return k, -mean * k


def _base(s: Section) -> str:
    return "%s_%d" % (s.type, s.index)


def _conv(t: Translator, s: Section, x: Value) -> Optional[Value]:
    p = t.cfg_path
    filters, size = s.int("filters", 1, p), s.int("size", 1, p)
    stride = s.int("stride", 1, p)
    sy, sx = s.int("stride_y", stride, p), s.int("stride_x", stride, p)
    pad = size // 2 if s.int("pad", 0, p) else s.int("padding", 0, p)
    groups, dilation = s.int("groups", 1, p), s.int("dilation", 1, p)
    for key in ("binary", "xnor", "antialiasing", "deform", "flipped", "share_index"):
        if key in s.options and (key == "share_index" or s.int(key, 0, p)):
            t.refuse("convolutional %s=%s" % (key, s.options[key]), s)
            return None
    if groups < 1 or x.c % groups or filters % groups:
        t.refuse("convolutional groups=%d" % groups, s, "with %d input channels and %d filters" % (x.c, filters))
        return None
    bias = t.take(filters, s, "biases").astype(np.float64)
    scale = np.ones(filters)
    if s.int("batch_normalize", 0, p):
        scale, shift = t.bn_fold(s, filters)
        bias = bias + shift
    w = t.take(filters * (x.c // groups) * size * size, s, "weights").reshape(filters, x.c // groups, size, size)
    w = w * scale.reshape(-1, 1, 1, 1)
    name = _base(s)
    y = t.b.node("Conv", [t.spatial(x, s), t.b.const(name + "_w", w), t.b.const(name + "_b", bias)], name,
                 kernel_shape=[size, size], strides=[sy, sx], pads=[pad, pad, pad, pad], group=groups,
                 dilations=[dilation, dilation])
    y = t.activation(y, s, default="logistic")     # darknet's default for this layer
    eff = dilation * (size - 1) + 1
    return None if y is None else Value(y, filters, (x.h + 2 * pad - eff) // sy + 1, (x.w + 2 * pad - eff) // sx + 1)


def _connected(t: Translator, s: Section, x: Value) -> Optional[Value]:
    p = t.cfg_path
    out, n_in = s.int("output", 1, p), x.c * x.h * x.w
    bias = t.take(out, s, "biases").astype(np.float64)
    w = t.take(out * n_in, s, "weights")
    w = w.reshape(n_in, out).T if t.weights is not None and t.weights.transposed else w.reshape(out, n_in)
    if s.int("batch_normalize", 0, p):          # darknet stores a connected layer's batch norm after its weights
        scale, shift = t.bn_fold(s, out)
        w, bias = w * scale.reshape(-1, 1), bias * scale + shift
    name = _base(s)
    flat = x.name if x.flat else t.b.node("Flatten", [x.name], name + "_flat", axis=1)
    y = t.b.node("Gemm", [flat, t.b.const(name + "_w", w), t.b.const(name + "_b", bias)], name, transB=1)
    y = t.activation(y, s, default="logistic")     # darknet's default for this layer
    return None if y is None else Value(y, out, 1, 1, flat=True)


def _maxpool(t: Translator, s: Section, x: Value) -> Optional[Value]:
    p = t.cfg_path
    stride = s.int("stride", 1, p)
    sy, sx = s.int("stride_y", stride, p), s.int("stride_x", stride, p)
    size = s.int("size", stride, p)
    pad = s.int("padding", size - 1, p)
    for key in ("maxpool_depth", "antialiasing"):
        if s.int(key, 0, p):
            t.refuse("maxpool %s=%s" % (key, s.options[key]), s)
            return None
    # darknet starts the windows pad/2 before the image and counts (size + pad - size) / stride + 1 of them, so
    # the rest of the padding falls at the end; out-of-image cells never win the max
    y = t.b.node("MaxPool", [t.spatial(x, s)], _base(s), kernel_shape=[size, size], strides=[sy, sx],
                 pads=[pad // 2, pad // 2, pad - pad // 2, pad - pad // 2])
    return Value(y, x.c, (x.h + pad - size) // sy + 1, (x.w + pad - size) // sx + 1)


def _avgpool(t: Translator, s: Section, x: Value) -> Optional[Value]:
    return Value(t.b.node("GlobalAveragePool", [t.spatial(x, s)], _base(s)), x.c, 1, 1)


def _softmax(t: Translator, s: Section, x: Value) -> Optional[Value]:
    p = t.cfg_path
    if s.int("groups", 1, p) != 1 or s.str("tree", ""):
        t.refuse("softmax %s" % ("tree" if s.str("tree", "") else "groups=%s" % s.options["groups"]), s)
        return None
    name, y = _base(s), x.name
    temperature = s.float("temperature", 1.0, p)
    if temperature != 1.0:
        y = t.b.node("Div", [y, t.b.const(name + "_temperature", np.float32(temperature))], name + "_scaled")
    if x.flat or (x.h, x.w) == (1, 1):
        y = t.b.node("Softmax", [y], name, axis=1)
    else:       # darknet normalises each image's whole output (groups=1), not each position's channels
        y = t.b.node("Flatten", [y], name + "_flat", axis=1)
        y = t.b.node("Softmax", [y], name + "_flat_softmax", axis=1)
        y = t.b.node("Reshape", [y, t.b.ints("shape", [0, x.c, x.h, x.w])], name)
    return Value(y, x.c, x.h, x.w, x.flat)


def _route(t: Translator, s: Section, x: Optional[Value]) -> Optional[Value]:
    p = t.cfg_path
    refs = [t.layer_ref(s, r) for r in s.ints("layers", p)]
    groups, group_id = s.int("groups", 1, p), s.int("group_id", 0, p)
    if not refs:
        raise InvalidInput("%s: [route] at line %d has no layers=, expected the layers it joins" % (p, s.line))
    ins = [t.outputs[r] for r in refs]
    if any(v is None for v in ins):
        return None
    name, parts, c = _base(s), [], 0
    for r, v in zip(refs, ins):
        if v.c % groups or not 0 <= group_id < groups:
            t.refuse("route groups=%d group_id=%d" % (groups, group_id), s, "of layer %d's %d channels" % (r, v.c))
            return None
        part = v.c // groups
        y = t.spatial(v, s)
        if groups > 1:    # each joined layer gives its group_id-th channel group
            y = t.b.node("Slice", [y, t.b.ints("starts", [part * group_id]), t.b.ints("ends", [part * (group_id + 1)]),
                                   t.b.ints("axes", [1])], "%s_group" % name)
        parts.append(y)
        c += part
    if len({(v.h, v.w) for v in ins}) != 1:
        t.refuse("route of layers of different sizes", s, ", ".join("%dx%d" % (v.h, v.w) for v in ins))
        return None
    y = parts[0] if len(parts) == 1 else t.b.node("Concat", parts, name, axis=1)
    return Value(y, c, ins[0].h, ins[0].w)


def _shortcut(t: Translator, s: Section, x: Value) -> Optional[Value]:
    p = t.cfg_path
    refs = [t.layer_ref(s, r) for r in s.ints("from", p)]
    if len(refs) != 1 or s.str("weights_type", "none") != "none":
        t.refuse("shortcut %s" % ("weights_type=" + s.str("weights_type", "") if len(refs) == 1
                                  else "from=%s" % s.str("from", "")), s)
        return None
    other = t.outputs[refs[0]]
    if other is None:
        return None
    if (other.h, other.w) != (x.h, x.w):
        t.refuse("shortcut of layers of different sizes", s, "%dx%d and %dx%d" % (x.h, x.w, other.h, other.w))
        return None
    name = _base(s)
    a, b = t.spatial(x, s), t.spatial(other, s)
    alpha, beta = s.float("alpha", 1.0, p), s.float("beta", 1.0, p)
    if alpha != 1.0:
        a = t.b.node("Mul", [a, t.b.const(name + "_alpha", np.float32(alpha))], name + "_alpha")
    if beta != 1.0:
        b = t.b.node("Mul", [b, t.b.const(name + "_beta", np.float32(beta))], name + "_beta")
    if other.c != x.c:      # darknet adds the channels both have; the output keeps the previous layer's
        n = min(other.c, x.c)
        b = t.b.node("Slice", [b, t.b.ints("starts", [0]), t.b.ints("ends", [n]), t.b.ints("axes", [1])],
                     name + "_common")
        if n < x.c:
            b = t.b.node("Pad", [b, t.b.ints("pads", [0, 0, 0, 0, 0, x.c - n, 0, 0])], name + "_padded")
    y = t.activation(t.b.node("Add", [a, b], name), s)
    return None if y is None else Value(y, x.c, x.h, x.w)


def _upsample(t: Translator, s: Section, x: Value) -> Optional[Value]:
    p = t.cfg_path
    stride = s.int("stride", 2, p)
    if stride < 1:
        t.refuse("upsample stride=%d" % stride, s, "a negative stride downsamples")
        return None
    name = _base(s)
    y = t.b.node("Resize", [t.spatial(x, s), "", t.b.const(name + "_scales", np.array([1, 1, stride, stride],
                                                                                      np.float32))],
                 name, mode="nearest", coordinate_transformation_mode="asymmetric", nearest_mode="floor")
    scale = s.float("scale", 1.0, p)
    if scale != 1.0:
        y = t.b.node("Mul", [y, t.b.const(name + "_scale", np.float32(scale))], name + "_scaled")
    return Value(y, x.c, x.h * stride, x.w * stride)


def _reorg(t: Translator, s: Section, x: Value) -> Optional[Value]:
    """darknet's reorg (YOLOv2's passthrough), which is not a space-to-depth: its loop reads the input as if it
    were [C/s^2, H*s, W*s] and writes the output in the input's [C, H, W] order, viewed as [C*s^2, H/s, W/s]."""
    p = t.cfg_path
    st = s.int("stride", 1, p)
    if s.int("reverse", 0, p) or st < 1 or x.c % (st * st) or x.h % st or x.w % st:
        t.refuse("reorg reverse=1" if s.int("reverse", 0, p) else "reorg stride=%d" % st, s,
                 "" if s.int("reverse", 0, p) else "of a %dx%dx%d input" % (x.c, x.h, x.w))
        return None
    b, name, oc = t.b, _base(s), x.c // (st * st)
    y = b.node("Reshape", [t.spatial(x, s), b.ints("shape", [0, oc, x.h, st, x.w, st])], name + "_view")
    y = b.node("Transpose", [y], name + "_gather", perm=[0, 3, 5, 1, 2, 4])
    y = b.node("Reshape", [y, b.ints("shape", [0, x.c * st * st, x.h // st, x.w // st])], name)
    return Value(y, x.c * st * st, x.h // st, x.w // st)


def _identity(t: Translator, s: Section, x: Value) -> Optional[Value]:
    return x


def _scale_channels(t: Translator, s: Section, x: Value) -> Optional[Value]:
    p = t.cfg_path
    refs = [t.layer_ref(s, r) for r in s.ints("from", p)]
    if len(refs) != 1 or s.int("scale_wh", 0, p):
        t.refuse("scale_channels scale_wh=1" if s.int("scale_wh", 0, p) else "scale_channels from=%s"
                 % s.str("from", ""), s)
        return None
    other = t.outputs[refs[0]]
    if other is None:
        return None
    y = t.b.node("Mul", [t.spatial(other, s), t.spatial(x, s)], _base(s))
    y = t.activation(y, s)
    return None if y is None else Value(y, other.c, other.h, other.w)


def _sam(t: Translator, s: Section, x: Value) -> Optional[Value]:
    refs = [t.layer_ref(s, r) for r in s.ints("from", t.cfg_path)]
    other = t.outputs[refs[0]] if len(refs) == 1 else None
    if other is None:
        if len(refs) != 1:
            t.refuse("sam from=%s" % s.str("from", ""), s)
        return None
    y = t.activation(t.b.node("Mul", [t.spatial(other, s), t.spatial(x, s)], _base(s)), s)
    return None if y is None else Value(y, other.c, other.h, other.w)


# -- detection heads ---------------------------------------------------------------------------------------

def _yolo(t: Translator, s: Section, x: Value) -> Optional[Value]:
    """[yolo]: the boxes of every cell and anchor as OpenCV's Region layer gives them, one row each in (y, x,
    anchor) order: centre x, y and width, height relative to the image, objectness, then per class objectness
    times the class probability, zero where it is not above ``thresh``. OpenCV suppresses overlapping boxes in
    the layer only when the .cfg sets ``nms_threshold``; tether refuses that (the suppression has a data-dependent
    result its kernels do not compute), and the boxes go to the caller's NMS as with the stock .cfg files."""
    p = t.cfg_path
    classes, num = s.int("classes", 20, p), s.int("num", 1, p)
    mask = s.ints("mask", p) or list(range(num))
    anchors = np.array(s.floats("anchors", p), np.float32).reshape(-1, 2) if s.str("anchors", "") else \
        np.zeros((num, 2), np.float32)
    if any(not 0 <= m < len(anchors) for m in mask):
        raise InvalidInput("%s: [yolo] at line %d has mask=%s, expected indices of its %d anchors"
                           % (p, s.line, s.str("mask", ""), len(anchors)))
    if x.c != len(mask) * (5 + classes):
        t.refuse("yolo", s, "its input has %d channels, expected %d anchors x (5 + %d classes)"
                 % (x.c, len(mask), classes))
        return None
    net_h, net_w = t.input_hw
    return _decode(t, s, x, anchors[mask] / np.array([net_w, net_h], np.float32), classes,
                   logistic_xy=not s.int("new_coords", 0, p), scale_xy=s.float("scale_x_y", 1.0, p),
                   thresh=s.float("thresh", 0.2, p), softmax=False)


def _region(t: Translator, s: Section, x: Value) -> Optional[Value]:
    """[region] (YOLOv2): as [yolo], with anchors in grid cells and, with softmax=1, class probabilities that a
    softmax over the classes gives. The scores are those before any suppression, as darknet's layer gives them
    (OpenCV's Region layer always suppresses at IoU 0.4 here; darknet leaves that to its detector code)."""
    p = t.cfg_path
    classes, num, coords = s.int("classes", 20, p), s.int("num", 1, p), s.int("coords", 4, p)
    anchors = s.floats("anchors", p)
    if coords != 4 or s.str("tree", "") or s.str("map", "") or len(anchors) != 2 * num:
        t.refuse("region" + (" coords=%d" % coords if coords != 4 else " tree" if s.str("tree", "") else
                             " map" if s.str("map", "") else ""), s,
                 "" if len(anchors) == 2 * num else "it has %d anchor values for num=%d" % (len(anchors), num))
        return None
    if x.c != num * (5 + classes):
        t.refuse("region", s, "its input has %d channels, expected %d anchors x (5 + %d classes)"
                 % (x.c, num, classes))
        return None
    rel = np.array(anchors, np.float32).reshape(-1, 2) / np.array([x.w, x.h], np.float32)
    return _decode(t, s, x, rel, classes, logistic_xy=True, scale_xy=1.0, thresh=s.float("thresh", 0.001, p),
                   softmax=bool(s.int("softmax", 0, p)), classfix=s.int("classfix", 0, p))


def _decode(t: Translator, s: Section, x: Value, anchors_rel: np.ndarray, classes: int, *, logistic_xy: bool,
            scale_xy: float, thresh: float, softmax: bool, classfix: int = 0) -> Optional[Value]:
    if s.type == "yolo" and s.float("nms_threshold", 0.0, t.cfg_path) > 0:
        t.refuse("%s nms_threshold=%s" % (s.type, s.options["nms_threshold"]), s,
                 "non-maximum suppression inside the layer; remove nms_threshold and suppress the boxes it outputs "
                 "(e.g. cv2.dnn.NMSBoxes)")
        return None
    b, name = t.b, _base(s)
    n_anchor, cell = len(anchors_rel), 5 + classes
    # [N, A*cell, H, W] -> [N, H, W, A, cell]: OpenCV's row order
    y = b.node("Reshape", [t.spatial(x, s), b.ints("shape", [0, n_anchor, cell, x.h, x.w])], name + "_split")
    y = b.node("Transpose", [y], name + "_cells", perm=[0, 3, 4, 1, 2])

    def part(lo: int, hi: int, what: str) -> str:
        return b.node("Slice", [y, b.ints("starts", [lo]), b.ints("ends", [hi]), b.ints("axes", [4])],
                      "%s_%s" % (name, what))

    txy, twh, tobj, tcls = part(0, 2, "xy"), part(2, 4, "wh"), part(4, 5, "obj"), part(5, cell, "cls")
    gy, gx = np.meshgrid(np.arange(x.h, dtype=np.float32), np.arange(x.w, dtype=np.float32), indexing="ij")
    grid = np.stack([gx, gy], -1).reshape(1, x.h, x.w, 1, 2)
    size = np.array([x.w, x.h], np.float32)
    if logistic_xy:
        xy = b.node("Sigmoid", [txy], name + "_xy_sigmoid")
        # darknet's scale_x_y stretches the offset around the cell centre: (sigmoid - 0.5) * scale + 0.5
        k, c = scale_xy, 0.5 - 0.5 * scale_xy
        wh = b.node("Mul", [b.node("Exp", [twh], name + "_wh_exp"), b.const(name + "_anchors", anchors_rel)],
                    name + "_wh_rel")
        obj = b.node("Sigmoid", [tobj], name + "_obj_sigmoid")
        cls = b.node("Softmax", [tcls], name + "_cls_softmax", axis=-1) if softmax else \
            b.node("Sigmoid", [tcls], name + "_cls_sigmoid")
    else:   # new_coords: the layer before applied the logistic already; sizes are (2 * t)^2 anchors
        xy, k, c = txy, scale_xy, -0.5 * (scale_xy - 1)
        wh = b.node("Mul", [b.node("Mul", [twh, twh], name + "_wh_sq"),
                            b.const(name + "_anchors", 4 * anchors_rel)], name + "_wh_rel")
        obj, cls = tobj, tcls
    xy = b.node("Mul", [xy, b.const(name + "_xy_k", np.float32(k))], name + "_xy_scaled")
    xy = b.node("Add", [xy, b.const(name + "_grid", grid + c)], name + "_xy_cell")
    xy = b.node("Div", [xy, b.const(name + "_grid_size", size)], name + "_xy_rel")
    if classfix == -1:     # darknet's region drops boxes whose objectness is below one half
        obj_k = b.node("Where", [b.node("Less", [obj, b.const(name + "_half", np.float32(0.5))], name + "_weak"),
                                 b.const(name + "_zero_obj", np.float32(0)), obj], name + "_obj_fixed")
    else:
        obj_k = obj
    prob = b.node("Mul", [cls, obj_k], name + "_prob")
    keep = b.node("Greater", [prob, b.const(name + "_thresh", np.float32(thresh))], name + "_above")
    prob = b.node("Where", [keep, prob, b.const(name + "_zero_prob", np.float32(0))], name + "_scores")
    box = b.node("Concat", [xy, wh], name + "_box", axis=-1)
    box = b.node("Reshape", [box, b.ints("shape", [-1, 4])], name + "_boxes")
    obj = b.node("Reshape", [obj, b.ints("shape", [-1, 1])], name + "_objectness")
    prob = b.node("Reshape", [prob, b.ints("shape", [-1, classes])], name + "_class_scores")
    out = b.node("Concat", [box, obj, prob], name, axis=1)
    return Value(out, cell, 0, 0, flat=True)


# -- activations: darknet's formulas, with its constants ---------------------------------------------------

def _unary(op: str, **attrs) -> Callable[[OnnxBuilder, str, str], str]:
    return lambda b, x, name: b.node(op, [x], name, **attrs)


def _swish(b: OnnxBuilder, x: str, name: str) -> str:
    return b.node("Mul", [x, b.node("Sigmoid", [x], name + "_sigmoid")], name)


def _mish(b: OnnxBuilder, x: str, name: str) -> str:
    soft = b.node("Softplus", [x], name + "_softplus")
    return b.node("Mul", [x, b.node("Tanh", [soft], name + "_tanh")], name)


def _gelu(b: OnnxBuilder, x: str, name: str) -> str:
    # darknet's tanh approximation: 0.5 x (1 + tanh(0.797885 x + 0.035677 x^3))
    x3 = b.node("Mul", [b.node("Mul", [x, x], name + "_x2"), x], name + "_x3")
    inner = b.node("Add", [b.node("Mul", [x, b.const(name + "_a", np.float32(0.797885))], name + "_ax"),
                           b.node("Mul", [x3, b.const(name + "_b", np.float32(0.035677))], name + "_bx3")],
                   name + "_inner")
    th = b.node("Add", [b.node("Tanh", [inner], name + "_tanh"), b.const(name + "_one", np.float32(1))],
                name + "_1p")
    return b.node("Mul", [b.node("Mul", [x, th], name + "_xt"), b.const(name + "_half", np.float32(0.5))], name)


def _loggy(b: OnnxBuilder, x: str, name: str) -> str:
    s = b.node("Mul", [b.node("Sigmoid", [x], name + "_sigmoid"), b.const(name + "_two", np.float32(2))],
               name + "_2s")
    return b.node("Sub", [s, b.const(name + "_one", np.float32(1))], name)


def _clip(lo: float, hi: float) -> Callable[[OnnxBuilder, str, str], str]:
    return lambda b, x, name: b.node("Clip", [x, b.const(name + "_lo", np.float32(lo)),
                                              b.const(name + "_hi", np.float32(hi))], name)


ACTIVATIONS: Dict[str, Callable[[OnnxBuilder, str, str], str]] = {}
for _name, _fn in (
        ("linear", lambda b, x, name: x),
        ("leaky", _unary("LeakyRelu", alpha=0.1)),
        ("relu", _unary("Relu")),
        ("relu6", _clip(0.0, 6.0)),
        ("logistic", _unary("Sigmoid")),
        ("tanh", _unary("Tanh")),
        ("elu", _unary("Elu", alpha=1.0)),
        ("selu", _unary("Selu", alpha=1.6732, gamma=1.0507)),
        ("hardtan", _clip(-1.0, 1.0)),
        ("loggy", _loggy),
        ("swish", _swish),
        ("mish", _mish),
        ("gelu", _gelu),
):
    if _name in ACTIVATIONS:
        raise ValueError("activation %r is registered twice" % _name)
    ACTIVATIONS[_name] = _fn

LayerFn = Callable[[Translator, Section, Optional[Value]], Optional[Value]]
LAYERS: Dict[str, LayerFn] = {}
for _name, _fn in (
        ("convolutional", _conv), ("conv", _conv),
        ("connected", _connected),
        ("maxpool", _maxpool), ("max", _maxpool),
        ("avgpool", _avgpool), ("avg", _avgpool),
        ("softmax", _softmax), ("soft", _softmax),
        ("route", _route),
        ("shortcut", _shortcut),
        ("upsample", _upsample),
        ("reorg", _reorg),
        ("scale_channels", _scale_channels),
        ("sam", _sam),
        ("dropout", _identity), ("cost", _identity),
        ("yolo", _yolo),
        ("region", _region),
):
    if _name in LAYERS:
        raise ValueError("layer type %r is registered twice" % _name)
    LAYERS[_name] = _fn

# the layer types that read their own inputs (layers=, from=) rather than only the layer before them
JOINS = {"route"}
