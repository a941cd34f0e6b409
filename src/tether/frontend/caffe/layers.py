"""Each Caffe layer type as ONNX nodes, with Caffe's arithmetic: its pooling output size (rounded up, the last
window dropped when it would start in the padding), its average-pool divisor, BatchNorm's scale-factor blob,
Scale/Bias broadcasting from an axis, InnerProduct's flattening from an axis.

Blobs are tracked by name with their shapes (Caffe computes every shape at set-up; so does the translator, for
the layers whose attributes depend on it). A layer function returns its tops' (value, shape) list, or None after
``t.refuse`` so the pass goes on and names every unsupported layer at once.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from tether.errors import InvalidInput
from tether.frontend.onnx_builder import OnnxBuilder

Shape = Tuple[int, ...]
Top = Tuple[str, Shape]


class Translator:
    def __init__(self, name: str, path: str) -> None:
        self.b = OnnxBuilder(name, "tether caffe frontend")
        self.path = path
        self.refused: List[Tuple[str, str, str]] = []       # (layer type, layer name, why)
        self.v1_layers: set = set()                          # names of the layers written in the V1 format

    def refuse(self, layer: Any, why: str = "", op: Optional[str] = None) -> None:
        self.refused.append((op or layer.type, layer.name, why))


def blob_array(blob: Any) -> np.ndarray:
    """A BlobProto's values in its shape (the 4-D num/channels/height/width of old files, or shape.dim)."""
    data = np.asarray(blob.double_data if len(blob.double_data) else blob.data, np.float32)
    if blob.HasField("shape"):
        shape = tuple(int(d) for d in blob.shape.dim)
    else:       # old files: always 4-D, padded with leading 1s (the layers reshape what they read)
        shape = tuple(int(v) for v in (blob.num, blob.channels, blob.height, blob.width))
    if int(np.prod(shape)) != data.size:
        raise InvalidInput("a blob holds %d values, its shape %s expects %d" % (data.size, list(shape),
                                                                           int(np.prod(shape))))
    return data.reshape(shape)


def _pair(values: Sequence[int], h: Optional[int], w: Optional[int], default: int, what: str,
          layer: Any) -> Tuple[int, int]:
    """Caffe's 2-D spatial parameter: *_h/*_w when given, else one value for both or one per dimension."""
    if h is not None or w is not None:
        return int(h if h is not None else default), int(w if w is not None else default)
    vals = list(values)
    if not vals:
        return default, default
    if len(vals) == 1:
        return int(vals[0]), int(vals[0])
    if len(vals) == 2:
        return int(vals[0]), int(vals[1])
    raise InvalidInput("layer %r has %d %s values, expected 1 or 2 (2-D)" % (layer.name, len(vals), what))


def _opt(msg: Any, field: str) -> Optional[int]:
    return getattr(msg, field) if msg.HasField(field) else None


def _channel_shape(c: int, rank: int, axis: int = 1, n: int = 1) -> List[int]:
    return [c] + [1] * (rank - axis - n)


def _conv(t: Translator, layer: Any, ins: List[Top], blobs: List[np.ndarray], deconv: bool = False):
    p = layer.convolution_param
    x, shape = ins[0]
    if len(shape) != 4 or p.axis != 1:
        t.refuse(layer, "only 2-D convolutions over axis 1 (input shape %s)" % list(shape))
        return None
    kh, kw = _pair(p.kernel_size, _opt(p, "kernel_h"), _opt(p, "kernel_w"), 0, "kernel_size", layer)
    ph, pw = _pair(p.pad, _opt(p, "pad_h"), _opt(p, "pad_w"), 0, "pad", layer)
    sh, sw = _pair(p.stride, _opt(p, "stride_h"), _opt(p, "stride_w"), 1, "stride", layer)
    dh, dw = _pair(p.dilation, None, None, 1, "dilation", layer)
    group, n_out = p.group, p.num_output
    w = blobs[0]
    expect = (shape[1], n_out // group, kh, kw) if deconv else (n_out, shape[1] // group, kh, kw)
    if w.size != int(np.prod(expect)):
        raise InvalidInput("%s: layer %r has %d weights, expected %s" % (t.path, layer.name, w.size, list(expect)))
    name = layer.name
    args = [x, t.b.const(name + "_w", w.reshape(expect))]
    if p.bias_term:
        args.append(t.b.const(name + "_b", blobs[1].reshape(-1)))
    op = "ConvTranspose" if deconv else "Conv"
    y = t.b.node(op, args, name, kernel_shape=[kh, kw], strides=[sh, sw], pads=[ph, pw, ph, pw],
                 dilations=[dh, dw], group=group)
    ekh, ekw = dh * (kh - 1) + 1, dw * (kw - 1) + 1
    if deconv:
        oh, ow = sh * (shape[2] - 1) + ekh - 2 * ph, sw * (shape[3] - 1) + ekw - 2 * pw
    else:
        oh, ow = (shape[2] + 2 * ph - ekh) // sh + 1, (shape[3] + 2 * pw - ekw) // sw + 1
    return [(y, (shape[0], n_out, oh, ow))]


def _deconv(t, layer, ins, blobs):
    return _conv(t, layer, ins, blobs, deconv=True)


def _pool(t: Translator, layer: Any, ins: List[Top], blobs):
    p = layer.pooling_param
    x, shape = ins[0]
    if len(shape) != 4 or p.pool == 2:
        t.refuse(layer, "STOCHASTIC pooling" if p.pool == 2 else "only 2-D pooling (input shape %s)" % list(shape))
        return None
    name, (n, c, h, w) = layer.name, shape
    if p.global_pooling:
        return [(t.b.node("GlobalMaxPool" if p.pool == 0 else "GlobalAveragePool", [x], name), (n, c, 1, 1))]
    kh, kw = _pair(p.kernel_size, _opt(p, "kernel_h"), _opt(p, "kernel_w"), 0, "kernel_size", layer)
    ph, pw = _pair(p.pad, _opt(p, "pad_h"), _opt(p, "pad_w"), 0, "pad", layer)
    sh, sw = _pair(p.stride, _opt(p, "stride_h"), _opt(p, "stride_w"), 1, "stride", layer)

    def out(size: int, k: int, pad: int, s: int) -> int:
        # Caffe rounds up, then drops a last window that would start inside the bottom/right padding
        o = int(math.ceil((size + 2 * pad - k) / s)) + 1
        if pad and (o - 1) * s >= size + pad:
            o -= 1
        return o

    oh, ow = out(h, kh, ph, sh), out(w, kw, pw, sw)
    # the windows past the declared padding (from rounding up) become extra end padding
    eh, ew = max(0, (oh - 1) * sh + kh - h - 2 * ph), max(0, (ow - 1) * sw + kw - w - 2 * pw)
    if p.pool == 0:
        y = t.b.node("MaxPool", [x], name, kernel_shape=[kh, kw], strides=[sh, sw], pads=[ph, pw, ph + eh, pw + ew])
    else:
        # Caffe divides by the window's cells inside the declared padding, not those of the rounding-up region
        if ph or pw:
            x = t.b.node("Pad", [x, t.b.ints(name + "_pads", [0, 0, ph, pw, 0, 0, ph, pw])], name + "_padded")
        y = t.b.node("AveragePool", [x], name, kernel_shape=[kh, kw], strides=[sh, sw], pads=[0, 0, eh, ew],
                     count_include_pad=0)
    return [(y, (n, c, oh, ow))]


def _inner_product(t: Translator, layer: Any, ins: List[Top], blobs):
    p = layer.inner_product_param
    x, shape = ins[0]
    axis = p.axis % len(shape)
    k = int(np.prod(shape[axis:]))
    w = blobs[0].reshape(-1)
    if w.size != k * p.num_output:
        raise InvalidInput("%s: layer %r has %d weights, expected %d x %d" % (t.path, layer.name, w.size,
                                                                            p.num_output, k))
    w = w.reshape(k, p.num_output).T if p.transpose else w.reshape(p.num_output, k)
    name = layer.name
    lead = tuple(shape[:axis])
    if axis == 1:           # Flatten keeps the batch dimension free (a shape= override may change it)
        flat = x if len(shape) == 2 else t.b.node("Flatten", [x], name + "_flat", axis=1)
    else:
        flat = t.b.node("Reshape", [x, t.b.ints(name + "_rows", [-1, k])], name + "_flat")
    args = [flat, t.b.const(name + "_w", w)]
    if p.bias_term:
        args.append(t.b.const(name + "_b", blobs[1].reshape(-1)))
    y = t.b.node("Gemm", args, name if len(lead) == 1 else name + "_gemm", transB=1)
    if len(lead) != 1:
        y = t.b.node("Reshape", [y, t.b.ints(name + "_shape", list(lead) + [p.num_output])], name)
    return [(y, lead + (p.num_output,))]


def _unary(op: str, **attrs: Any) -> Callable:
    def convert(t: Translator, layer: Any, ins: List[Top], blobs):
        x, shape = ins[0]
        return [(t.b.node(op, [x], layer.name, **attrs), shape)]
    return convert


def _relu(t: Translator, layer: Any, ins: List[Top], blobs):
    slope = layer.relu_param.negative_slope
    x, shape = ins[0]
    y = t.b.node("LeakyRelu", [x], layer.name, alpha=slope) if slope else t.b.node("Relu", [x], layer.name)
    return [(y, shape)]


def _prelu(t: Translator, layer: Any, ins: List[Top], blobs):
    x, shape = ins[0]
    slope = blobs[0].reshape(-1)
    slope = slope.reshape(_channel_shape(slope.size, len(shape))) if slope.size > 1 else slope
    return [(t.b.node("PRelu", [x, t.b.const(layer.name + "_slope", slope)], layer.name), shape)]


def _elu(t: Translator, layer: Any, ins: List[Top], blobs):
    x, shape = ins[0]
    return [(t.b.node("Elu", [x], layer.name, alpha=layer.elu_param.alpha), shape)]


def _affine(t: Translator, name: str, x: str, scale: Optional[float], shift: Optional[float]) -> str:
    if scale is not None and scale != 1:
        x = t.b.node("Mul", [x, t.b.const(name + "_scale", np.float32(scale))], name + "_scaled")
    if shift:
        x = t.b.node("Add", [x, t.b.const(name + "_shift", np.float32(shift))], name + "_shifted")
    return x


def _power(t: Translator, layer: Any, ins: List[Top], blobs):
    p, (x, shape) = layer.power_param, ins[0]
    y = _affine(t, layer.name, x, p.scale, p.shift)
    if p.power != 1:
        y = t.b.node("Pow", [y, t.b.const(layer.name + "_power", np.float32(p.power))], layer.name)
    return [(y if y != x else t.b.node("Identity", [x], layer.name), shape)]


def _exp(t: Translator, layer: Any, ins: List[Top], blobs):
    p, (x, shape) = layer.exp_param, ins[0]
    ln_base = 1.0 if p.base == -1 else math.log(p.base)
    y = _affine(t, layer.name, x, p.scale * ln_base, p.shift * ln_base)
    return [(t.b.node("Exp", [y], layer.name), shape)]


def _log(t: Translator, layer: Any, ins: List[Top], blobs):
    p, (x, shape) = layer.log_param, ins[0]
    y = t.b.node("Log", [_affine(t, layer.name, x, p.scale, p.shift)], layer.name + ("_ln" if p.base != -1 else ""))
    if p.base != -1:
        y = t.b.node("Mul", [y, t.b.const(layer.name + "_inv_ln_base", np.float32(1 / math.log(p.base)))],
                     layer.name)
    return [(y, shape)]


def _threshold(t: Translator, layer: Any, ins: List[Top], blobs):
    x, shape = ins[0]
    above = t.b.node("Greater", [x, t.b.const(layer.name + "_t", np.float32(layer.threshold_param.threshold))],
                     layer.name + "_above")
    return [(t.b.node("Cast", [above], layer.name, to=1), shape)]


def _per_channel(t: Translator, name: str, x: str, shape: Shape, axis: int, values: np.ndarray, op: str) -> str:
    """``x op values``, ``values`` covering the axes from ``axis`` on (Caffe's Scale/Bias broadcasting)."""
    vshape = list(values.shape) + [1] * (len(shape) - axis - values.ndim) if values.ndim else []
    return t.b.node(op, [x, t.b.const(name + "_" + op.lower(), values.reshape(vshape))], name)


def _batch_norm(t: Translator, layer: Any, ins: List[Top], blobs):
    x, shape = ins[0]
    factor = float(blobs[2].reshape(-1)[0]) if len(blobs) > 2 else 1.0
    factor = 0.0 if factor == 0 else 1.0 / factor       # caffe's running sums are kept scaled by this blob
    mean, var = blobs[0].reshape(-1) * factor, blobs[1].reshape(-1) * factor
    inv = 1.0 / np.sqrt(var.astype(np.float64) + layer.batch_norm_param.eps)
    name = layer.name
    y = _per_channel(t, name + "_mul", x, shape, 1, inv.astype(np.float32), "Mul")
    y = _per_channel(t, name, y, shape, 1, (-mean * inv).astype(np.float32), "Add")
    return [(y, shape)]


def _scale(t: Translator, layer: Any, ins: List[Top], blobs, bias_only: bool = False):
    p = layer.bias_param if bias_only else layer.scale_param
    x, shape = ins[0]
    axis = p.axis % len(shape) if shape else 0
    name = layer.name
    if len(ins) > 1:              # the factors are the second bottom
        other, oshape = ins[1]
        if len(oshape) + axis < len(shape):
            other = t.b.node("Reshape", [other, t.b.ints(name + "_bshape", list(oshape) + [1] * (
                len(shape) - axis - len(oshape)))], name + "_factors")
        return [(t.b.node("Add" if bias_only else "Mul", [x, other], name), shape)]
    # the learned factors cover num_axes axes from axis (-1: all the rest); one value scales everything
    covered = tuple(shape[axis:] if p.num_axes == -1 else shape[axis:axis + p.num_axes])

    def fit(blob: np.ndarray) -> np.ndarray:
        if blob.size == 1:
            return blob.reshape(())
        if blob.size != int(np.prod(covered)):
            raise InvalidInput("%s: layer %r has %d values, expected %s (axes %d.. of its %s input)"
                               % (t.path, name, blob.size, list(covered), axis, list(shape)))
        return blob.reshape(covered)

    if bias_only:
        return [(_per_channel(t, name, x, shape, axis, fit(blobs[0]), "Add"), shape)]
    y = _per_channel(t, name + ("_mul" if p.bias_term else ""), x, shape, axis, fit(blobs[0]), "Mul")
    if p.bias_term:
        y = _per_channel(t, name, y, shape, axis, fit(blobs[1]), "Add")
    return [(y, shape)]


def _bias(t, layer, ins, blobs):
    return _scale(t, layer, ins, blobs, bias_only=True)


def _eltwise(t: Translator, layer: Any, ins: List[Top], blobs):
    p, name = layer.eltwise_param, layer.name
    values = [v for v, _ in ins]
    if p.operation == 1 and p.coeff:
        if len(p.coeff) != len(values):
            raise InvalidInput("%s: Eltwise layer %r has %d coeff for %d bottoms" % (t.path, name, len(p.coeff),
                                                                                  len(values)))
        values = [v if c == 1 else t.b.node("Mul", [v, t.b.const("%s_coeff%d" % (name, i), np.float32(c))],
                                            "%s_term%d" % (name, i)) for i, (v, c) in enumerate(zip(values, p.coeff))]
    op = {0: "Mul", 1: "Add", 2: "Max"}[p.operation]
    if op == "Max":
        return [(t.b.node("Max", values, name), ins[0][1])]
    y = values[0]
    for i, v in enumerate(values[1:]):
        y = t.b.node(op, [y, v], name if i == len(values) - 2 else "%s_%d" % (name, i))
    return [(y if len(values) > 1 else t.b.node("Identity", [y], name), ins[0][1])]


def _concat(t: Translator, layer: Any, ins: List[Top], blobs):
    p = layer.concat_param
    rank = len(ins[0][1])
    axis = (p.axis if p.HasField("axis") or not p.HasField("concat_dim") else p.concat_dim) % rank
    shape = list(ins[0][1])
    shape[axis] = sum(s[axis] for _, s in ins)
    return [(t.b.node("Concat", [v for v, _ in ins], layer.name, axis=axis), tuple(shape))]


def _softmax(t: Translator, layer: Any, ins: List[Top], blobs):
    x, shape = ins[0]
    axis = layer.softmax_param.axis % len(shape)
    if axis == len(shape) - 1:
        return [(t.b.node("Softmax", [x], layer.name, axis=axis), shape)]
    # Caffe normalises along one axis only; ONNX's Softmax (opset 13+) too, but over the last axis a kernel
    # needs no transpose: move the axis there and back
    perm = [i for i in range(len(shape)) if i != axis] + [axis]
    back = [perm.index(i) for i in range(len(shape))]
    y = t.b.node("Transpose", [x], layer.name + "_last", perm=perm)
    y = t.b.node("Softmax", [y], layer.name + "_softmax", axis=-1)
    return [(t.b.node("Transpose", [y], layer.name, perm=back), shape)]


def _lrn(t: Translator, layer: Any, ins: List[Top], blobs):
    p, (x, shape) = layer.lrn_param, ins[0]
    name = layer.name
    if p.norm_region == 0:
        return [(t.b.node("LRN", [x], name, size=p.local_size, alpha=p.alpha, beta=p.beta, bias=p.k), shape)]
    # WITHIN_CHANNEL: x / (1 + alpha * mean of x^2 over a size x size window, zero-padded) ^ beta
    pad = (p.local_size - 1) // 2
    sq = t.b.node("Mul", [x, x], name + "_sq")
    avg = t.b.node("AveragePool", [sq], name + "_avg", kernel_shape=[p.local_size] * 2, strides=[1, 1],
                   pads=[pad, pad, p.local_size - 1 - pad, p.local_size - 1 - pad], count_include_pad=1)
    den = _affine(t, name + "_den", avg, p.alpha, 1.0)
    den = t.b.node("Pow", [den, t.b.const(name + "_beta", np.float32(-p.beta))], name + "_pow")
    return [(t.b.node("Mul", [x, den], name), shape)]


def _identity(t: Translator, layer: Any, ins: List[Top], blobs):
    return [ins[0]]


def _split(t: Translator, layer: Any, ins: List[Top], blobs):
    return [ins[0]] * max(1, len(layer.top))


def _flatten(t: Translator, layer: Any, ins: List[Top], blobs):
    p, (x, shape) = layer.flatten_param, ins[0]
    a, e = p.axis % len(shape), p.end_axis % len(shape)
    out = tuple(shape[:a]) + (int(np.prod(shape[a:e + 1])),) + tuple(shape[e + 1:])
    onnx_shape = [0] * a + [-1] + list(shape[e + 1:])          # 0: the leading dimensions as they come
    return [(t.b.node("Reshape", [x, t.b.ints(layer.name + "_shape", onnx_shape)], layer.name), out)]


def _reshape(t: Translator, layer: Any, ins: List[Top], blobs):
    p, (x, shape) = layer.reshape_param, ins[0]
    axis = p.axis if p.axis >= 0 else len(shape) + 1 + p.axis
    end = len(shape) if p.num_axes == -1 else axis + p.num_axes
    dims = [int(d) for d in p.shape.dim]
    # 0 copies the bottom's dimension at that position of the replaced range; one -1 takes what is left
    mid = [shape[axis + i] if d == 0 else d for i, d in enumerate(dims)]
    out = list(shape[:axis]) + mid + list(shape[end:])
    if -1 in out:
        known = int(np.prod([d for d in out if d != -1]))
        out[out.index(-1)] = int(np.prod(shape)) // known
    if int(np.prod(out)) != int(np.prod(shape)):
        raise InvalidInput("%s: Reshape layer %r makes %s of a %s blob" % (t.path, layer.name, out, list(shape)))
    # Caffe's 0 copies the dimension at the same position, as ONNX's does: kept, with the untouched leading
    # dimensions, so a batch size given later still flows through
    onnx_shape = [0] * axis + dims + list(shape[end:])
    return [(t.b.node("Reshape", [x, t.b.ints(layer.name + "_shape", onnx_shape)], layer.name), tuple(out))]


def _slice(t: Translator, layer: Any, ins: List[Top], blobs):
    p, (x, shape) = layer.slice_param, ins[0]
    axis = (p.axis if p.HasField("axis") or not p.HasField("slice_dim") else p.slice_dim) % len(shape)
    n = len(layer.top)
    points = list(p.slice_point)
    if not points:
        if shape[axis] % n:
            raise InvalidInput("%s: Slice layer %r splits %d into %d equal parts" % (t.path, layer.name,
                                                                                  shape[axis], n))
        points = [shape[axis] // n * i for i in range(1, n)]
    bounds = [0] + points + [shape[axis]]
    if len(bounds) != n + 1:
        raise InvalidInput("%s: Slice layer %r has %d slice points for %d tops" % (t.path, layer.name,
                                                                                len(points), n))
    outs = []
    for i in range(n):
        s = list(shape)
        s[axis] = bounds[i + 1] - bounds[i]
        y = t.b.node("Slice", [x, t.b.ints("starts", [bounds[i]]), t.b.ints("ends", [bounds[i + 1]]),
                               t.b.ints("axes", [axis])], "%s_%d" % (layer.name, i))
        outs.append((y, tuple(s)))
    return outs


def _permute(t: Translator, layer: Any, ins: List[Top], blobs):
    x, shape = ins[0]
    order = [int(o) for o in layer.permute_param.order]
    order += [i for i in range(len(shape)) if i not in order]
    out = tuple(shape[i] for i in order)
    return [(t.b.node("Transpose", [x], layer.name, perm=order), out)]


def _crop(t: Translator, layer: Any, ins: List[Top], blobs):
    p, (x, shape), (_, ref) = layer.crop_param, ins[0], ins[1]
    axis = p.axis % len(shape)
    offsets = list(p.offset) or [0]
    if len(offsets) == 1:
        offsets = offsets * (len(shape) - axis)
    starts = [int(o) for o in offsets]
    ends = [s + ref[axis + i] for i, s in enumerate(starts)]
    out = tuple(shape[:axis]) + tuple(ref[axis:])
    y = t.b.node("Slice", [x, t.b.ints("starts", starts), t.b.ints("ends", ends),
                           t.b.ints("axes", list(range(axis, len(shape))))], layer.name)
    return [(y, out)]


def _tile(t: Translator, layer: Any, ins: List[Top], blobs):
    p, (x, shape) = layer.tile_param, ins[0]
    axis = p.axis % len(shape)
    reps = [1] * len(shape)
    reps[axis] = p.tiles
    out = tuple(d * r for d, r in zip(shape, reps))
    return [(t.b.node("Tile", [x, t.b.ints(layer.name + "_reps", reps)], layer.name), out)]


LayerFn = Callable[[Translator, Any, List[Top], List[np.ndarray]], Optional[List[Top]]]
LAYERS: Dict[str, LayerFn] = {}
# layer type -> (function, how many blobs it needs at least)
BLOBS: Dict[str, int] = {}
for _type, _fn, _blobs in (
        ("Convolution", _conv, 1), ("Deconvolution", _deconv, 1),
        ("Pooling", _pool, 0),
        ("InnerProduct", _inner_product, 1),
        ("ReLU", _relu, 0), ("PReLU", _prelu, 1), ("ELU", _elu, 0),
        ("Sigmoid", _unary("Sigmoid"), 0), ("TanH", _unary("Tanh"), 0), ("AbsVal", _unary("Abs"), 0),
        ("BNLL", _unary("Softplus"), 0),
        ("Power", _power, 0), ("Exp", _exp, 0), ("Log", _log, 0), ("Threshold", _threshold, 0),
        ("BatchNorm", _batch_norm, 2), ("Scale", _scale, 0), ("Bias", _bias, 0),
        ("Eltwise", _eltwise, 0), ("Concat", _concat, 0),
        ("Softmax", _softmax, 0), ("LRN", _lrn, 0),
        ("Dropout", _identity, 0), ("Split", _split, 0),
        ("Flatten", _flatten, 0), ("Reshape", _reshape, 0), ("Slice", _slice, 0),
        ("Permute", _permute, 0), ("Crop", _crop, 0), ("Tile", _tile, 0),
):
    if _type in LAYERS:
        raise ValueError("Caffe layer type %r is registered twice" % _type)
    LAYERS[_type], BLOBS[_type] = _fn, _blobs



def blobs_needed(layer: Any) -> int:
    """How many weight blobs ``layer`` reads: its type's count, or for Scale and Bias with one bottom, the factors
    (and Scale's bias_term)."""
    if layer.type in ("Scale", "Bias") and len(layer.bottom) == 1:
        return 1 + int(layer.type == "Scale" and layer.scale_param.bias_term)
    return BLOBS[layer.type]


# V1 (pre-2015) layer type enum names -> the type strings of today's LayerParameter
V1_TYPES = {"ABSVAL": "AbsVal", "BNLL": "BNLL", "CONCAT": "Concat", "CONVOLUTION": "Convolution",
            "DECONVOLUTION": "Deconvolution", "DROPOUT": "Dropout", "ELTWISE": "Eltwise", "EXP": "Exp",
            "FLATTEN": "Flatten", "INNER_PRODUCT": "InnerProduct", "LRN": "LRN", "POOLING": "Pooling",
            "POWER": "Power", "RELU": "ReLU", "SIGMOID": "Sigmoid", "SOFTMAX": "Softmax", "SPLIT": "Split",
            "SLICE": "Slice", "TANH": "TanH", "THRESHOLD": "Threshold", "DATA": "Data",
            "MEMORY_DATA": "MemoryData", "IMAGE_DATA": "ImageData", "HDF5_DATA": "HDF5Data",
            "SOFTMAX_LOSS": "SoftmaxWithLoss", "ACCURACY": "Accuracy", "SILENCE": "Silence", "ARGMAX": "ArgMax",
            "MVN": "MVN", "DUMMY_DATA": "DummyData", "WINDOW_DATA": "WindowData", "EUCLIDEAN_LOSS": "EuclideanLoss",
            "HINGE_LOSS": "HingeLoss", "INFOGAIN_LOSS": "InfogainLoss", "IM2COL": "Im2col",
            "MULTINOMIAL_LOGISTIC_LOSS": "MultinomialLogisticLoss", "CONTRASTIVE_LOSS": "ContrastiveLoss",
            "SIGMOID_CROSS_ENTROPY_LOSS": "SigmoidCrossEntropyLoss", "HDF5_OUTPUT": "HDF5Output"}
