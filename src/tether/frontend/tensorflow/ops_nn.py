"""Convolutions, pools, batch normalization, bias, resizing and depth/space moves.

TensorFlow's default layout is NHWC (``data_format``; NDHWC for the 3-D ops); these ops compute channels-first, so
their results are stored NCHW (perm (0, 3, 1, 2); NCDHW for 3-D) and the next layout-agnostic ops keep them so.
Padding ``SAME`` is TensorFlow's rule: the total padding of an axis is split with the odd unit at the end, which is
ONNX's ``SAME_UPPER``.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from tether.errors import UnsupportedOpError
from tether.frontend.tensorflow.graph import TFNode
from tether.frontend.tensorflow.translate import NCHW, Converter, Translator, Value, require_const

_CONV_OUT = (None, None, None, None)
NCDHW = (0, 4, 1, 2, 3)


def _window_shape(x: Value, nhwc: bool, kernel: Sequence[int], attrs: Dict, channels: Optional[int]) -> Tuple:
    """The TensorFlow shape of a window op's result (None where the input's size is unknown), 2-D or 3-D."""
    nd = len(kernel)
    dims: Tuple = (None,) * (nd + 2)
    if x.shape is not None and len(x.shape) == nd + 2:
        dims = tuple(x.shape) if nhwc else (x.shape[0],) + tuple(x.shape[2:]) + (x.shape[1],)
    sizes = []
    for i, size in enumerate(dims[1:-1]):
        if size is None:
            sizes.append(None)
            continue
        s, d = attrs["strides"][i], attrs.get("dilations", [1] * nd)[i]
        if "auto_pad" in attrs:
            sizes.append(-(-size // s))
        else:
            pads = attrs["pads"]
            sizes.append((size + pads[i] + pads[i + nd] - (kernel[i] - 1) * d - 1) // s + 1)
    c = channels if channels is not None else dims[-1]
    return (dims[0], *sizes, c) if nhwc else (dims[0], c, *sizes)


def _layout(node: TFNode) -> Tuple[bool, List[int]]:
    """(whether the op's data is channels-last, the indices of the spatial axes in its attribute lists); the 3-D
    ops' formats are NDHWC and NCDHW."""
    if node.op.endswith("3D") or node.op.endswith("3DBackpropInputV2"):
        fmt = node.attr("data_format", "NDHWC")
        if fmt not in ("NDHWC", "NCDHW"):
            raise UnsupportedOpError("node %s (%s): data_format %r (supported: NDHWC, NCDHW)"
                                     % (node.name, node.op, fmt))
        return fmt == "NDHWC", ([1, 2, 3] if fmt == "NDHWC" else [2, 3, 4])
    fmt = node.attr("data_format", "NHWC")
    if fmt not in ("NHWC", "NCHW"):
        raise UnsupportedOpError("node %s (%s): data_format %r (supported: NHWC, NCHW)" % (node.name, node.op, fmt))
    return fmt == "NHWC", ([1, 2] if fmt == "NHWC" else [2, 3])


def _spatial(node: TFNode, attr: str, default: int, axes: Sequence[int]) -> List[int]:
    vals = node.attr(attr) or [default] * 4
    return [int(vals[a]) for a in axes]


def _padding(node: TFNode, nhwc: bool, nd: int = 2) -> Dict:
    pad = node.attr("padding", "VALID")
    if pad == "SAME":
        return {"auto_pad": "SAME_UPPER"}
    if pad == "VALID":
        return {"pads": [0] * (2 * nd)}
    if nd != 2:
        raise UnsupportedOpError("node %s (%s): padding %r" % (node.name, node.op, pad))
    if pad == "EXPLICIT":
        p = [int(v) for v in node.attr("explicit_paddings")]
        h, w = ((2, 4) if nhwc else (4, 6))
        return {"pads": [p[h], p[w], p[h + 1], p[w + 1]]}
    raise UnsupportedOpError("node %s (%s): padding %r" % (node.name, node.op, pad))


def _input(t: Translator, x: Value, nhwc: bool, nd: int = 2) -> Tuple[str, object]:
    """The data channels-first and the layout of the op's result relative to TensorFlow's view of it."""
    if not nhwc:
        return t.tf(x), None
    return (t.nchw(x), NCHW) if nd == 2 else (t.view(x, NCDHW), NCDHW)


def _weights(t: Translator, w: Value, fold, perm: Sequence[int], reshape=None) -> str:
    if w.const is not None:
        return t.name(t.constant(np.array(fold(w.const), order="C")))
    out = t.emit1("Transpose", [t.tf(w)], perm=list(perm))
    return t.emit1("Reshape", [out, t.ints(reshape)]) if reshape is not None else out


def _dilation(t: Translator, node: TFNode, x: Value, nhwc: bool,
              sp: List[int]) -> Tuple[Value, Dict, Optional[List[int]]]:
    """The convolution's input, its window attributes, and the block shape a BatchToSpaceND must still undo.

    TensorFlow writes a dilated convolution as SpaceToBatchND, a VALID convolution, BatchToSpaceND: the same as
    one convolution with dilation = the block shape over the input padded by the SpaceToBatchND's paddings,
    before the BatchToSpaceND's crops."""
    attrs = dict(strides=_spatial(node, "strides", 1, sp), dilations=_spatial(node, "dilations", 1, sp),
                 **_padding(node, nhwc))
    if x.space_to_batch is None:
        return x, attrs, None
    src, block, pads = x.space_to_batch
    if not nhwc or node.attr("padding") != "VALID" or attrs["strides"] != [1, 1] or attrs["dilations"] != [1, 1]:
        raise UnsupportedOpError("node %s (%s): a SpaceToBatchND input with strides, dilations or padding other "
                                 "than a dilated convolution's" % (node.name, node.op))
    attrs = dict(strides=[1, 1], dilations=list(block), pads=[pads[0][0], pads[1][0], pads[0][1], pads[1][1]])
    return src, attrs, list(block)


def _conv2d(t: Translator, node: TFNode, ins: List[Value]) -> List[Value]:
    x, w = ins
    nhwc, sp = _layout(node)
    x, attrs, block = _dilation(t, node, x, nhwc, sp)
    xn, perm = _input(t, x, nhwc)
    group = 1
    c_axis = 3 if nhwc else 1
    if x.shape is not None and x.shape[c_axis] is not None and w.shape is not None and w.shape[2]:
        group = x.shape[c_axis] // w.shape[2]
    wn = _weights(t, w, lambda a: a.transpose(3, 2, 0, 1), (3, 2, 0, 1))
    shape = _window_shape(x, nhwc, w.shape[:2] if w.shape else (1, 1), attrs, w.shape[3] if w.shape else None)
    out = t.out(t.emit1("Conv", [xn, wn], group=group, **attrs), shape=shape, perm=perm, dtype=x.dtype)
    out.batch_to_space = block
    return [out]


def _depthwise(t: Translator, node: TFNode, ins: List[Value]) -> List[Value]:
    x, w = ins
    nhwc, sp = _layout(node)
    x, attrs, block = _dilation(t, node, x, nhwc, sp)
    xn, perm = _input(t, x, nhwc)
    if w.shape is None or None in w.shape:
        raise UnsupportedOpError("node %s (%s): the filter's shape must be known" % (node.name, node.op))
    kh, kw, cin, mult = w.shape
    # output channel c * mult + m is input channel c through filter[:, :, c, m]: ONNX groups of one channel
    wn = _weights(t, w, lambda a: a.transpose(2, 3, 0, 1).reshape(cin * mult, 1, kh, kw), (2, 3, 0, 1),
                  [cin * mult, 1, kh, kw])
    shape = _window_shape(x, nhwc, (kh, kw), attrs, cin * mult)
    out = t.out(t.emit1("Conv", [xn, wn], group=int(cin), **attrs), shape=shape, perm=perm, dtype=x.dtype)
    out.batch_to_space = block
    return [out]


def _conv3d(t: Translator, node: TFNode, ins: List[Value]) -> List[Value]:
    x, w = ins
    nhwc, sp = _layout(node)
    if w.shape is None or None in w.shape:
        raise UnsupportedOpError("node %s (%s): the filter's shape must be known" % (node.name, node.op))
    attrs = dict(strides=_spatial(node, "strides", 1, sp), dilations=_spatial(node, "dilations", 1, sp),
                 **_padding(node, nhwc, 3))
    xn, perm = _input(t, x, nhwc, 3)
    group = 1
    c_axis = 4 if nhwc else 1
    if x.shape is not None and x.shape[c_axis] is not None:
        group = x.shape[c_axis] // w.shape[3]
    # filter [kd, kh, kw, in / group, out] -> ONNX [out, in / group, kd, kh, kw]
    wn = _weights(t, w, lambda a: a.transpose(4, 3, 0, 1, 2), (4, 3, 0, 1, 2))
    shape = _window_shape(x, nhwc, w.shape[:3], attrs, w.shape[4])
    return [t.out(t.emit1("Conv", [xn, wn], group=group, **attrs), shape=shape, perm=perm, dtype=x.dtype)]


def _space_to_batch(t: Translator, node: TFNode, ins: List[Value]) -> List[Value]:
    x, block_v, pads_v = ins
    block = [int(b) for b in require_const(node, block_v, "block_shape").reshape(-1)]
    pads = np.asarray(require_const(node, pads_v, "paddings"), dtype=np.int64).reshape(-1, 2).tolist()
    if len(block) != 2:
        raise UnsupportedOpError("node %s (SpaceToBatchND): %d block dimensions (a 2-D dilation has 2)"
                                 % (node.name, len(block)))
    return [Value(None, None, x.shape, None, x.dtype, space_to_batch=(x, block, pads))]


def _batch_to_space(t: Translator, node: TFNode, ins: List[Value]) -> List[Value]:
    y, block_v, crops_v = ins
    block = [int(b) for b in require_const(node, block_v, "block_shape").reshape(-1)]
    crops = np.asarray(require_const(node, crops_v, "crops"), dtype=np.int64).reshape(-1, 2)
    if y.batch_to_space != block:
        raise UnsupportedOpError("node %s (BatchToSpaceND): its input is no dilated convolution of the same block "
                                 "shape (tether translates the pair around a convolution only)" % node.name)
    if not crops.any():
        return [Value(y.name, None, y.shape, y.perm, y.dtype)]
    axes = [t.onnx_axis(y, 1), t.onnx_axis(y, 2)]
    ends = [-int(c) if c else np.iinfo(np.int64).max for c in crops[:, 1]]
    out = t.emit1("Slice", [t.name(y), t.ints(crops[:, 0]), t.ints(ends), t.ints(axes)])
    shape = _CONV_OUT
    if y.shape is not None:
        shape = (y.shape[0],) + tuple(None if d is None else d - int(crops[i].sum())
                                      for i, d in enumerate(y.shape[1:3])) + (y.shape[3],)
    return [t.out(out, shape=shape, perm=y.perm, dtype=y.dtype)]


def _conv_backprop_input(t: Translator, node: TFNode, ins: List[Value]) -> List[Value]:
    sizes_v, w, dy = ins
    nhwc, sp = _layout(node)
    nd = len(sp)
    if sizes_v.const is not None:
        out_hw = [int(sizes_v.const.reshape(-1)[a]) for a in sp]
    elif sizes_v.elements is not None and all(sizes_v.elements[a] is not None for a in sp):
        out_hw = [int(sizes_v.elements[a]) for a in sp]       # a run-time batch size beside constant dims
    else:
        raise UnsupportedOpError("node %s (%s): the spatial sizes of its input_sizes must be constants (give the input "
                                 "shapes: shape={name: [...]})" % (node.name, node.op))
    if w.shape is None or None in w.shape:
        raise UnsupportedOpError("node %s (%s): the filter's shape must be known" % (node.name, node.op))
    strides, dil = _spatial(node, "strides", 1, sp), _spatial(node, "dilations", 1, sp)
    pad = node.attr("padding", "VALID")
    kernel = [(w.shape[i] - 1) * d + 1 for i, d in enumerate(dil)]
    pads_b, pads_e, out_pad = [], [], []
    for i in range(nd):
        # the forward convolution this op is the gradient of: input out_hw[i], output dy's size
        if pad == "SAME":
            fwd = -(-out_hw[i] // strides[i])
            total = max((fwd - 1) * strides[i] + kernel[i] - out_hw[i], 0)
            before = total // 2
        elif pad == "VALID":
            fwd = (out_hw[i] - kernel[i]) // strides[i] + 1
            total = before = 0
        elif pad == "EXPLICIT" and nd == 2:
            p = [int(v) for v in node.attr("explicit_paddings")]
            before, after = p[2 * sp[i]], p[2 * sp[i] + 1]
            total = before + after
            fwd = (out_hw[i] + total - kernel[i]) // strides[i] + 1
        else:
            raise UnsupportedOpError("node %s (%s): padding %r" % (node.name, node.op, pad))
        pads_b.append(before)
        pads_e.append(total - before)
        out_pad.append(out_hw[i] - ((fwd - 1) * strides[i] + kernel[i] - total))
    if min(out_pad) < 0:
        raise UnsupportedOpError("node %s (%s): input sizes %s do not fit its output gradient"
                                 % (node.name, node.op, out_hw))
    xn, perm = _input(t, dy, nhwc, nd)
    # filter [*k, out_channels, in_channels of dy] -> ConvTranspose weight [in of dy, out, *k]
    axes = (nd + 1, nd) + tuple(range(nd))
    wn = _weights(t, w, lambda a: a.transpose(axes), axes)
    out = t.emit1("ConvTranspose", [xn, wn], strides=strides, dilations=dil, pads=pads_b + pads_e,
                  output_padding=out_pad)
    n = dy.shape[0] if dy.shape is not None and len(dy.shape) == nd + 2 else None
    shape = (n, *out_hw, w.shape[nd]) if nhwc else (n, w.shape[nd], *out_hw)
    return [t.out(out, shape=shape, perm=perm, dtype=dy.dtype)]


def _pool(onnx_op: str) -> Converter:
    def convert(t: Translator, node: TFNode, ins: List[Value]) -> List[Value]:
        x = ins[0]
        nhwc, sp = _layout(node)
        if node.op.endswith("V2"):       # ksize and strides are inputs
            ksize = [int(v) for v in require_const(node, ins[1], "ksize")]
            strides = [int(v) for v in require_const(node, ins[2], "strides")]
        else:
            ksize, strides = node.attr("ksize"), node.attr("strides")
        xn, perm = _input(t, x, nhwc, len(sp))
        kernel = [int(ksize[a]) for a in sp]
        attrs = dict(strides=[int(strides[a]) for a in sp], **_padding(node, nhwc, len(sp)))
        out = t.emit1(onnx_op, [xn], kernel_shape=kernel, **attrs)
        return [t.out(out, shape=_window_shape(x, nhwc, kernel, attrs, None), perm=perm, dtype=x.dtype)]
    return convert


def _channel_axis(t: Translator, node: TFNode, x: Value) -> Tuple[int, int]:
    """(the stored position of the channel axis, the stored rank) of a data_format op's input."""
    nhwc, _ = _layout(node)
    rank = x.rank if x.rank is not None else 4
    tf_axis = rank - 1 if nhwc else 1
    return t.onnx_axis(x, tf_axis), rank


def _per_channel(t: Translator, v: Value, pos: int, rank: int) -> str:
    """A [C] vector shaped to broadcast against the channel axis at stored position ``pos``."""
    trail = rank - 1 - pos
    if trail == 0:
        return t.tf(v)
    if v.const is not None:
        return t.name(t.constant(v.const.reshape((-1,) + (1,) * trail)))
    return t.emit1("Reshape", [t.tf(v), t.ints([-1] + [1] * trail)])


def _bias_add(t: Translator, node: TFNode, ins: List[Value]) -> List[Value]:
    x, b = ins
    if x.const is not None and b.const is not None:
        nhwc, _ = _layout(node)
        shape = (-1,) if nhwc else (-1,) + (1,) * (x.const.ndim - 2)
        return [t.constant((x.const + b.const.reshape(shape)).astype(x.const.dtype))]
    pos, rank = _channel_axis(t, node, x)
    return [t.out(t.emit1("Add", [t.name(x), _per_channel(t, b, pos, rank)]), like=x, perm=x.perm)]


def _fused_batch_norm(t: Translator, node: TFNode, ins: List[Value]) -> List[Value]:
    x, scale, offset, mean, var = ins[:5]
    eps = float(node.attr("epsilon", 1e-4))
    nhwc, _ = _layout(node)
    xn, perm = _input(t, x, nhwc)
    pos = 1
    if node.attr("is_training", False):
        # statistics of this batch: mean and biased variance over every axis but the channel's
        axes = t.ints([0, 2, 3])
        m = t.emit1("ReduceMean", [xn, axes], keepdims=1)
        d = t.emit1("Sub", [xn, m])
        v = t.emit1("ReduceMean", [t.emit1("Mul", [d, d]), axes], keepdims=1)
        eps_c = t.name(t.constant(np.asarray(eps, dtype=np.float32)))
        norm = t.emit1("Div", [d, t.emit1("Sqrt", [t.emit1("Add", [v, eps_c])])])
        y = t.emit1("Add", [t.emit1("Mul", [norm, _per_channel(t, scale, pos, 4)]), _per_channel(t, offset, pos, 4)])
        return [t.out(y, like=x, perm=perm)]
    y = t.emit1("BatchNormalization", [xn, t.tf(scale), t.tf(offset), t.tf(mean), t.tf(var)], epsilon=eps)
    return [t.out(y, like=x, perm=perm), mean, var]


def _resize(kind: str) -> Converter:
    def convert(t: Translator, node: TFNode, ins: List[Value]) -> List[Value]:
        x, size_v = ins
        size = [int(s) for s in require_const(node, size_v, "size")]
        align, half = bool(node.attr("align_corners", False)), bool(node.attr("half_pixel_centers", False))
        if align and half:
            raise UnsupportedOpError("node %s (%s): align_corners and half_pixel_centers together"
                                     % (node.name, node.op))
        attrs = {"mode": kind}
        if kind == "cubic":
            # with half-pixel centers TensorFlow uses Keys' cubic (a = -0.5) and drops the taps outside the image,
            # renormalizing the rest; its legacy kernel (a = -0.75) repeats the edge pixels instead. TensorFlow
            # reads the weights from a table of 1024 steps of the fraction; they are computed exactly here.
            attrs["coordinate_transformation_mode"] = ("align_corners" if align else
                                                       "half_pixel" if half else "asymmetric")
            attrs["cubic_coeff_a"] = -0.5 if half else -0.75
            attrs["exclude_outside"] = int(half)
        elif kind == "linear":
            attrs["coordinate_transformation_mode"] = ("align_corners" if align else
                                                       "half_pixel" if half else "asymmetric")
        else:
            # TensorFlow: round(out * scale) with align_corners (half away from zero), else floor(out * scale),
            # or floor((out + 0.5) * scale) with half pixel centers, which is round-half-up of ONNX's half_pixel
            # coordinate (out + 0.5) * scale - 0.5
            attrs["coordinate_transformation_mode"] = ("align_corners" if align else
                                                       "half_pixel" if half else "asymmetric")
            attrs["nearest_mode"] = "round_prefer_ceil" if align or half else "floor"
        xn = t.name(x)
        if kind != "nearest" and x.dtype is not None and x.dtype != np.float32:
            xn = t.emit1("Cast", [xn], to=1)
        axes = [t.onnx_axis(x, 1), t.onnx_axis(x, 2)]
        out = t.emit1("Resize", [xn, "", "", t.ints(size)], axes=axes, **attrs)
        dtype = x.dtype if kind == "nearest" else np.dtype(np.float32)
        shape = (None, size[0], size[1], None)
        if x.shape is not None and len(x.shape) == 4:
            shape = (x.shape[0], size[0], size[1], x.shape[3])
        return [t.out(out, shape=shape, perm=x.perm, dtype=dtype)]
    return convert


def _lrn(t: Translator, node: TFNode, ins: List[Value]) -> List[Value]:
    x = ins[0]
    r = int(node.attr("depth_radius", 5))
    size = 2 * r + 1
    # TensorFlow sums the squares of 2r + 1 channels times alpha; ONNX divides its alpha by the window size
    out = t.emit1("LRN", [t.nchw(x)], size=size, alpha=float(node.attr("alpha", 1.0)) * size,
                  beta=float(node.attr("beta", 0.5)), bias=float(node.attr("bias", 1.0)))
    return [t.out(out, like=x, perm=NCHW)]


def _depth_space(onnx_op: str) -> Converter:
    def convert(t: Translator, node: TFNode, ins: List[Value]) -> List[Value]:
        x = ins[0]
        nhwc, _ = _layout(node)
        xn, perm = _input(t, x, nhwc)
        attrs = {"mode": "DCR"} if onnx_op == "DepthToSpace" else {}
        out = t.emit1(onnx_op, [xn], blocksize=int(node.attr("block_size")), **attrs)
        return [t.out(out, shape=_CONV_OUT, perm=perm, dtype=x.dtype)]
    return convert


CONVERTERS: Dict[str, Converter] = {
    "Conv2D": _conv2d,
    "DepthwiseConv2dNative": _depthwise,
    "Conv2DBackpropInput": _conv_backprop_input,
    "Conv3D": _conv3d,
    "Conv3DBackpropInputV2": _conv_backprop_input,
    "MaxPool": _pool("MaxPool"),
    "MaxPoolV2": _pool("MaxPool"),
    "AvgPool": _pool("AveragePool"),
    "MaxPool3D": _pool("MaxPool"),
    "AvgPool3D": _pool("AveragePool"),
    "BiasAdd": _bias_add,
    "BiasAddV1": _bias_add,
    "FusedBatchNorm": _fused_batch_norm,
    "FusedBatchNormV2": _fused_batch_norm,
    "FusedBatchNormV3": _fused_batch_norm,
    "ResizeBilinear": _resize("linear"),
    "ResizeNearestNeighbor": _resize("nearest"),
    "ResizeBicubic": _resize("cubic"),
    "LRN": _lrn,
    "SpaceToBatchND": _space_to_batch,
    "BatchToSpaceND": _batch_to_space,
    "DepthToSpace": _depth_space("DepthToSpace"),
    "SpaceToDepth": _depth_space("SpaceToDepth"),
}
