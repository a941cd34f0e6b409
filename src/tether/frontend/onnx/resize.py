"""Converters of ONNX Resize and Upsample: the per-axis tap and weight tables are computed here."""
from __future__ import annotations

from typing import List, Optional, Tuple

import numpy as np

from tether.errors import UnsupportedOpError
from tether.frontend.onnx.importer import ConverterTable, node_output, norm_axis, reshape_alias, str_attr

CONVERTERS = ConverterTable(__name__)


# ---------------------------------------------------------------- resize (ONNX Resize, Upsample)
# Scales and sizes are constants once input shapes are fixed, so every output position's source taps and
# weights are computed here, per axis, exactly as ONNX's reference does it (edge-clamped neighbours, ratio 1 on
# integer coordinates), and the kernel only gathers and blends (ops/resize.py).
_RESIZE_COORD_MODES = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric",
                       "tf_crop_and_resize")
_NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


def _resize_source_coords(mode: str, out_int: int, in_w: int, scale: float, roi: Optional[Tuple[float, float]]):
    """Source coordinate of each output position along one axis, and a mask of positions outside the input
    (tf_crop_and_resize only, else None). As the spec and onnxruntime (not the ONNX reference, which uses the
    fractional in_w * scale there): align_corners, tf_crop_and_resize and pytorch_half_pixel's length test use
    the integer output length; and in float32 arithmetic as onnxruntime, so coordinates that land exactly on
    a rounding boundary (a scale of 0.6 maps output 1 to 2.0 in float32, 1.9999999 in float64) round alike."""
    f = np.float32
    y = np.arange(out_int, dtype=f)
    sc, n_in, half = f(scale), f(in_w), f(0.5)
    outside = None
    if mode == "align_corners":
        x = np.zeros(out_int, f) if out_int == 1 else y * (n_in - f(1)) / f(out_int - 1)
    elif mode == "asymmetric":
        x = y / sc
    elif mode == "tf_crop_and_resize":
        r0, r1 = f(roi[0]), f(roi[1])
        x = np.full(out_int, half * (r0 + r1) * (n_in - f(1)), f) if out_int == 1 else \
            r0 * (n_in - f(1)) + (y * (r1 - r0) * (n_in - f(1))) / f(out_int - 1)
        outside = (x < 0) | (x > in_w - 1)
    elif mode == "pytorch_half_pixel":
        x = np.zeros(out_int, f) if out_int == 1 else (y + half) / sc - half
    elif mode == "half_pixel":
        x = (y + half) / sc - half
    else:   # half_pixel_symmetric
        offset = n_in / f(2) * (f(1) - f(out_int) / (sc * n_in))
        x = offset + (y + half) / sc - half
    return x.astype(np.float64), outside


def _resize_coeffs(kind: str, r: float, scale: float, A: float, antialias: bool) -> np.ndarray:
    """Weights of the neighbours of a source coordinate whose distance past the lower neighbour is `r` in
    (0, 1]. With antialias (downscaling) the kernel is stretched by 1/scale, so more taps (ONNX reference)."""
    if antialias:
        s = min(scale, 1.0)
        if kind == "linear":
            lo = int(np.floor(-1 / s) + 1)
            args = (np.arange(lo, lo + 2 - 2 * lo) - r) * s
            c = np.clip(1 - np.abs(args), 0, 1)
        else:
            lo = int(np.floor(-2 / s) + 1)
            xs = np.abs(np.array([s * (i - r) for i in range(lo, 2 - lo)]))
            c = np.where(xs <= 1, (A + 2) * xs ** 3 - (A + 3) * xs ** 2 + 1,
                         np.where(xs < 2, A * xs ** 3 - 5 * A * xs ** 2 + 8 * A * xs - 4 * A, 0.0))
        return c / c.sum()
    if kind == "linear":
        return np.array([1 - r, r])
    return np.array([((A * (r + 1) - 5 * A) * (r + 1) + 8 * A) * (r + 1) - 4 * A,
                     ((A + 2) * r - (A + 3)) * r * r + 1,
                     ((A + 2) * (1 - r) - (A + 3)) * (1 - r) * (1 - r) + 1,
                     ((A * ((1 - r) + 1) - 5 * A) * ((1 - r) + 1) + 8 * A) * ((1 - r) + 1) - 4 * A])


def _resize_axis_tables(kind: str, x_src: np.ndarray, in_w: int, scale: float, nearest_mode: str,
                        cubic_a: float, exclude_outside: bool,
                        antialias: bool = False) -> Tuple[np.ndarray, np.ndarray]:
    """(int32 indices, float32 weights), both (out, taps), for one axis."""
    base = np.floor(x_src)
    integer = x_src == base
    ratio = np.where(integer, 1.0, x_src - base)
    if kind == "nearest":
        if nearest_mode == "simple":       # Resize-10 / Upsample (onnxruntime): floor, or ceil when shrinking
            src = np.ceil(x_src) if scale < 1 else np.floor(x_src)
            return np.clip(src, 0, in_w - 1).astype(np.int32)[:, None], np.ones((len(x_src), 1), np.float32)
        pick_second = {"round_prefer_floor": ratio > 0.5, "round_prefer_ceil": ratio >= 0.5,
                       "floor": np.zeros_like(ratio, dtype=bool), "ceil": np.ones_like(ratio, dtype=bool)}[nearest_mode]
        pick_second = pick_second | integer       # an integer coordinate is its own second neighbour
        # two neighbours: floor and floor+1 (or x-1 and x on integers)
        first = np.where(integer, x_src - 1, base)
        src = first + pick_second
        return np.clip(src, 0, in_w - 1).astype(np.int32)[:, None], np.ones((len(x_src), 1), np.float32)
    coeffs = np.stack([_resize_coeffs(kind, float(r), scale, cubic_a, antialias) for r in ratio])
    taps = coeffs.shape[1]
    # the `taps` neighbours nearest x, preferring lower ones (ONNX reference, edge-clamped below)
    pad = -(-taps // 2)
    xp = x_src + pad
    p = np.floor(xp)
    frac = xp - p
    if taps % 2 == 0:
        offset = np.where(frac == 0, -(taps // 2), -(taps // 2) + 1)
    else:
        offset = np.where(frac <= 0.5, -((taps - 1) // 2), -((taps - 1) // 2) + 1)
    start = p + offset - pad
    idx = start[:, None] + np.arange(taps)[None, :]
    if exclude_outside:
        coeffs = np.where((idx < 0) | (idx >= in_w), 0.0, coeffs)
        total = coeffs.sum(axis=1, keepdims=True)
        coeffs = coeffs / np.where(total == 0, 1.0, total)
    return np.clip(idx, 0, in_w - 1).astype(np.int32), coeffs.astype(np.float32)


def _resize_emit(im, node, x: str, kind: str, coord: str, nearest_mode: str, scales: List[float],
                 out_shape: List[int], roi: Optional[List[float]], cubic_a: float, exclude_outside: bool,
                 extrapolation: float, antialias: bool = False) -> None:
    t = im.type(x)
    nd = len(t.shape)
    if t.dtype != "float32":
        raise UnsupportedOpError("node %s: %s on %s tensors (float32 only)" % (node.name, node.op_type, t.dtype))
    if any(d <= 0 for d in out_shape):
        raise UnsupportedOpError("node %s: %s to an empty output %s" % (node.name, node.op_type, out_shape))
    axes_meta, tables = [], []
    for d in range(nd):
        axis_roi = (roi[d], roi[d + nd]) if roi is not None else (0.0, 1.0)
        if coord != "tf_crop_and_resize" or axis_roi == (0.0, 1.0):
            if out_shape[d] == t.shape[d] and np.isclose(scales[d], 1.0):
                continue          # an untouched axis (batch, channels)
        src, outside = _resize_source_coords(coord, out_shape[d], t.shape[d], scales[d], axis_roi)
        idx, w = _resize_axis_tables(kind, src, t.shape[d], scales[d], nearest_mode, cubic_a, exclude_outside,
                                     antialias)
        meta = {"axis": d, "taps": int(idx.shape[1]), "weights": kind != "nearest",
                "inside": outside is not None and bool(outside.any())}
        if meta["taps"] == 1 and not meta["inside"] and np.array_equal(idx[:, 0], np.arange(t.shape[d])):
            continue              # identity along this axis
        tables.append(im.add_const(idx, "resize_idx"))
        if meta["weights"]:
            tables.append(im.add_const(w, "resize_w"))
        if meta["inside"]:
            tables.append(im.add_const((~outside).astype(np.float32), "resize_inside"))
        axes_meta.append(meta)
    if not axes_meta:
        reshape_alias(im, x, node)
        return
    terms = int(np.prod([m["taps"] for m in axes_meta]))
    if terms > 256:
        raise UnsupportedOpError("node %s: %s reads %d input elements per output (antialiased downscale by a "
                                 "large factor); at most 256 are supported" % (node.name, node.op_type, terms))
    im.emit("resize", [x] + tables, {"shape": list(out_shape), "axes": axes_meta,
                                     "extrapolation": float(extrapolation)}, node.name, node_output(node))


def _resize_kind(node, a: dict, allowed=("nearest", "linear", "cubic")) -> str:
    mode = str_attr(a, "mode", "nearest")
    if mode in ("bilinear", "trilinear"):     # Upsample-7's spellings
        mode = "linear"
    if mode not in allowed:
        raise UnsupportedOpError("node %s: %s mode %r (supported: %s)" % (node.name, node.op_type, mode,
                                                                          ", ".join(allowed)))
    return mode


@CONVERTERS.register("Upsample")
def _upsample(im, node, ins, a):
    t = im.type(ins[0])
    kind = _resize_kind(node, a, ("nearest", "linear"))
    if im.opset >= 9 and len(ins) > 1:
        scales = [float(v) for v in im.require_const(ins[1], "Upsample scales", node.name).reshape(-1)]
    else:
        scales = [float(v) for v in a["scales"]]
    out_shape = [int(np.floor(d * s)) for d, s in zip(t.shape, scales)]
    _resize_emit(im, node, ins[0], kind, "asymmetric", "simple", scales, out_shape, None, -0.75, False, 0.0)


@CONVERTERS.register("Resize")
def _resize_conv(im, node, ins, a):
    t = im.type(ins[0])
    nd = len(t.shape)
    kind = _resize_kind(node, a, ("nearest", "linear") if im.opset < 11 else ("nearest", "linear", "cubic"))
    if im.opset < 11:     # Resize-10: X, scales; asymmetric coordinates, onnxruntime's "simple" nearest
        scales = [float(v) for v in im.require_const(ins[1], "Resize scales", node.name).reshape(-1)]
        out_shape = [int(np.floor(d * s)) for d, s in zip(t.shape, scales)]
        _resize_emit(im, node, ins[0], kind, "asymmetric", "simple", scales, out_shape, None, -0.75, False, 0.0)
        return
    coord = str_attr(a, "coordinate_transformation_mode", "half_pixel")
    if coord not in _RESIZE_COORD_MODES:
        raise UnsupportedOpError("node %s: Resize coordinate_transformation_mode %r (supported: %s)"
                                 % (node.name, coord, ", ".join(_RESIZE_COORD_MODES)))
    nearest_mode = str_attr(a, "nearest_mode", "round_prefer_floor")
    if kind == "nearest" and nearest_mode not in _NEAREST_MODES:
        raise UnsupportedOpError("node %s: Resize nearest_mode %r" % (node.name, nearest_mode))
    antialias = bool(int(a.get("antialias", 0)))
    if antialias and kind == "nearest":
        raise UnsupportedOpError("node %s: Resize antialias=1 with mode nearest (undefined)" % node.name)
    policy = str_attr(a, "keep_aspect_ratio_policy", "stretch")
    if policy not in ("stretch", "not_larger", "not_smaller"):
        raise UnsupportedOpError("node %s: Resize keep_aspect_ratio_policy %r" % (node.name, policy))
    axes = [norm_axis(int(v), nd) for v in a.get("axes", range(nd))]

    def opt(k, what):
        if len(ins) > k and ins[k]:
            v = im.require_const(ins[k], "Resize " + what, node.name).reshape(-1)
            return v if v.size else None
        return None
    roi_in, scales_in, sizes_in = opt(1, "roi"), opt(2, "scales"), opt(3, "sizes")
    if (scales_in is None) == (sizes_in is None):
        raise UnsupportedOpError("node %s: Resize needs exactly one of scales and sizes" % node.name)
    roi = None
    if coord == "tf_crop_and_resize":
        if roi_in is None:
            raise UnsupportedOpError("node %s: Resize tf_crop_and_resize without roi" % node.name)
        roi = [0.0] * nd + [1.0] * nd
        for k, d in enumerate(axes):
            roi[d], roi[d + nd] = float(roi_in[k]), float(roi_in[k + len(axes)])
    if scales_in is not None:
        if len(scales_in) != len(axes):
            raise UnsupportedOpError("node %s: Resize has %d scales for %d axes" % (node.name, len(scales_in),
                                                                                  len(axes)))
        scales = [1.0] * nd
        for k, d in enumerate(axes):
            scales[d] = float(scales_in[k])
        if any(s <= 0 for s in scales):
            raise UnsupportedOpError("node %s: Resize scales %s must be positive" % (node.name, scales))
        out_shape = []
        for d in range(nd):
            extent = t.shape[d] * (roi[d + nd] - roi[d] if roi is not None else 1.0)
            out_shape.append(int(np.floor(extent * scales[d])))
    else:
        if len(sizes_in) != len(axes):
            raise UnsupportedOpError("node %s: Resize has %d sizes for %d axes" % (node.name, len(sizes_in),
                                                                                 len(axes)))
        out_shape = list(t.shape)
        for k, d in enumerate(axes):
            out_shape[d] = int(sizes_in[k])
        scales = [out_shape[d] / t.shape[d] for d in range(nd)]
        if policy != "stretch":
            pick = min if policy == "not_larger" else max
            s = pick(scales[d] for d in axes)
            scales = [s if d in axes else 1.0 for d in range(nd)]
            out_shape = [int(s * t.shape[d] + 0.5) if d in axes else t.shape[d] for d in range(nd)]
    _resize_emit(im, node, ins[0], kind, coord, nearest_mode, scales, out_shape, roi,
                 float(a.get("cubic_coeff_a", -0.75)), bool(a.get("exclude_outside", 0)),
                 float(a.get("extrapolation_value", 0.0)), antialias)


# ---------------------------------------------------------------- ConvTranspose
# A transposed convolution is a stride-1 convolution of the input with zeros inserted between its elements
# (stride - 1 per gap), padded by dilation * (kernel - 1) - pad on each side (negative: cropped), with the kernel
# flipped and its in/out channels swapped per group. That reuses the conv2d kernels (and their GEMM paths); the
# weight rearrangement folds at import when the weight is a constant.
