"""MediaPipe's three custom ops of the face mesh with attention (``face_landmark_with_attention.tflite``), which
crops a region of a feature map around a landmark subset, refines the region's landmarks, and maps them back:
``Landmarks2TransformMatrix``, ``TransformTensorBilinear`` and ``TransformLandmarks``. Only MediaPipe runs them
(its CPU op resolver registers version 2 of each; its GPU delegate takes versions 1 and 2): LiteRT cannot.

Their custom options are FlexBuffer maps; a key the map lacks reads as 0 (FlexBuffers' null), as in MediaPipe's
parser. The semantics are MediaPipe's kernels' (mediapipe/util/tflite/operations, options parsed by
tensorflow/lite/delegates/gpu/common/mediapipe), on batch 1 (the kernels read and write the first batch only):

- ``Landmarks2TransformMatrix`` reads landmarks ``i`` at flat float ``3 i`` (x, y) of its input and gives the 4x4
  matrix mapping a crop's pixel (x, y, 0, 1) to the input's coordinates. v2 (options ``left_rotation_idx``,
  ``right_rotation_idx``, ``target_rotation_radians``, ``subset_idxs``, ``output_height/width``, ``scale_x/y``):
  the crop is rotated by ``target - atan2`` of the two rotation landmarks, centered on the middle of the rotated
  subset's bounding box and as large as that box times the scales. v1 (``left/right_rotation_idx``, ``subset``,
  ``bbox_size_multiplier``, ``landmarks_range``, ``dimensions`` = 3, ``input_hw``, ``output_hw``): the rotation is
  ``-atan(dy / dx)``, the box starts from +-100000, and the matrix maps normalised crop coordinates.
- ``TransformTensorBilinear`` samples its NHWC input at each output pixel (x, y) mapped by the first two rows of
  the matrix: bilinear between the four neighbours, 0 where the point falls outside ``[0, w - 1] x [0, h - 1]``.
  v2 maps pixel centres (``T -> S (T A)``, shifts by half a pixel), v1 pixel corners. The output size is the
  output tensor's (the options' ``output_height/width``, or v1's ``output_size``, must agree with it).
- ``TransformLandmarks`` maps each landmark's (x, y) by the matrix's first two rows and keeps z. v2: landmarks
  ``(1, n, d)``, d (2 or 3) from the shape; v1: ``(1, h, w, c)`` with options ``dimensions`` (default 3, c a
  multiple of it) and ``scale`` (default 1, multiplies the translation).
"""
from __future__ import annotations

import math
from typing import Any, Dict, List, Sequence

import numpy as np

from tether.errors import UnsupportedOpError
from tether.frontend.tflite.table import ConverterTable

CONVERTERS = ConverterTable("tflite mediapipe transforms")

LANDMARKS_TO_MATRIX = "Landmarks2TransformMatrix"
TRANSFORM_TENSOR = "TransformTensorBilinear"
TRANSFORM_LANDMARKS = "TransformLandmarks"
VERSIONS = (1, 2)


def _check_op(ctx, op, n_inputs: int) -> None:
    if op.version not in VERSIONS:
        raise UnsupportedOpError("%s: %s version %d; MediaPipe's kernels are versions 1 and 2"
                                 % (ctx.where(), op.custom_code, op.version))
    if len(op.inputs) != n_inputs or min(op.inputs) < 0 or len(op.outputs) != 1:
        raise UnsupportedOpError("%s: %s takes %d input(s) and gives one output; got %d and %d"
                                 % (ctx.where(), op.custom_code, n_inputs, len(op.inputs), len(op.outputs)))
    for t in list(op.inputs) + list(op.outputs):
        if ctx.tensor(t).dtype != "float32":
            raise UnsupportedOpError("%s: %s on a %s tensor (%r); MediaPipe's kernel takes float32 only"
                                     % (ctx.where(), op.custom_code, ctx.tensor(t).dtype, ctx.tensor(t).name))


def options(ctx, op) -> Dict[str, Any]:
    """The op's FlexBuffer options map ({} when it has none)."""
    try:
        return op.custom_options_map()
    except ValueError as exc:
        raise UnsupportedOpError("%s: %s" % (ctx.where(), exc)) from None


def _number(ctx, op, opts: Dict[str, Any], key: str, kind=int):
    value = opts.get(key, 0)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UnsupportedOpError("%s: %s option %r is %r; expected a number"
                                 % (ctx.where(), op.custom_code, key, value))
    return kind(value)


def _int_list(ctx, op, opts: Dict[str, Any], key: str) -> List[int]:
    value = opts.get(key, [])
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, int) and not isinstance(v, bool)
                                                        for v in value):
        raise UnsupportedOpError("%s: %s option %r is %r; expected a vector of integers"
                                 % (ctx.where(), op.custom_code, key, value))
    return list(value)


def _batch_one(ctx, op, index: int, rank: int) -> List[int]:
    shape = ctx.shape(index)
    if len(shape) != rank or shape[0] != 1:
        raise UnsupportedOpError("%s: %s input %r of shape %s; expected rank %d with batch 1 (the kernel reads the "
                                 "first batch only)" % (ctx.where(), op.custom_code, ctx.tensor(index).name, shape,
                                                        rank))
    return shape


def _matrix_rows(ctx, op, index: int) -> List[str]:
    """The matrix input's entries 0, 1, 3, 4, 5, 7 as (1,) values: the two rows the kernels read, less the z
    column, which multiplies a 0."""
    if int(np.prod(ctx.shape(index))) < 8:
        raise UnsupportedOpError("%s: %s matrix %r of shape %s; expected a 4x4 matrix"
                                 % (ctx.where(), op.custom_code, ctx.tensor(index).name, ctx.shape(index)))
    flat = _flat(ctx, index)
    return [ctx.emit1("Gather", [flat, _i64(ctx, [k], "entry")]) for k in (0, 1, 3, 4, 5, 7)]


def _flat(ctx, index: int) -> str:
    return ctx.emit1("Reshape", [ctx.nhwc(index), _i64(ctx, [-1], "flat")])


def _i64(ctx, values: Sequence[int], hint: str) -> str:
    return ctx.add_const(np.asarray(values, np.int64), hint)


def _f32(ctx, value, hint: str) -> str:
    return ctx.add_const(np.asarray(value, np.float32), hint)


def _ops(ctx):
    """Binary arithmetic on ONNX names, to write the kernels' formulas as they read."""
    def binary(op_type):
        return lambda a, b: ctx.emit1(op_type, [a, b])
    return binary("Add"), binary("Sub"), binary("Mul"), binary("Div")


# ---- Landmarks2TransformMatrix -------------------------------------------------------------------------------

@CONVERTERS.register(LANDMARKS_TO_MATRIX)
def _landmarks_to_matrix(ctx, op) -> None:
    _check_op(ctx, op, 1)
    x = op.inputs[0]
    opts = options(ctx, op)
    rank = 3 if op.version == 2 else 4
    if ctx.rank(x) != rank or (op.version == 1 and ctx.shape(x)[:3] != [1, 1, 1]):
        raise UnsupportedOpError("%s: %s v%d landmarks %r of shape %s; expected %s"
                                 % (ctx.where(), op.custom_code, op.version, ctx.tensor(x).name, ctx.shape(x),
                                    "rank 3" if rank == 3 else "(1, 1, 1, n)"))
    out_shape = ctx.shape(op.outputs[0])
    if int(np.prod(out_shape)) != 16:
        raise UnsupportedOpError("%s: %s output of shape %s; expected a 4x4 matrix (1, 4, 4)"
                                 % (ctx.where(), op.custom_code, out_shape))
    left = _number(ctx, op, opts, "left_rotation_idx")
    right = _number(ctx, op, opts, "right_rotation_idx")
    subset = _int_list(ctx, op, opts, "subset_idxs" if op.version == 2 else "subset")
    # (the parser pairs the indices, an odd last one with itself: the same set of points)
    count = int(np.prod(ctx.shape(x))) // 3
    for key, idx in [("left_rotation_idx", [left]), ("right_rotation_idx", [right]),
                     ("subset_idxs" if op.version == 2 else "subset", subset)]:
        if not idx or min(idx) < 0 or max(idx) >= count:
            raise UnsupportedOpError("%s: %s option %r is %s; expected landmark indices in [0, %d)"
                                     % (ctx.where(), op.custom_code, key, idx if len(idx) < 8 else
                                        "%d indices from %d to %d" % (len(idx), min(idx), max(idx)), count))
    flat = _flat(ctx, x)

    def coords(indices, offset):
        return ctx.emit1("Gather", [flat, _i64(ctx, [3 * i + offset for i in indices], "landmark")])

    lx, ly, rx, ry = coords([left], 0), coords([left], 1), coords([right], 0), coords([right], 1)
    xs, ys = coords(subset, 0), coords(subset, 1)
    if op.version == 2:
        m = _matrix_v2(ctx, op, opts, lx, ly, rx, ry, xs, ys)
    else:
        m = _matrix_v1(ctx, op, opts, lx, ly, rx, ry, xs, ys)
    ctx.set_output(op.outputs[0], ctx.emit1("Reshape", [m, _i64(ctx, out_shape, "shape")]))


def _extent(ctx, values: str, initial=None):
    """(min, max) of a (k,) value as (1,) values; with ``initial``, as a loop starting from (+v, -v) finds them."""
    axes = _i64(ctx, [0], "axes")
    lo = ctx.emit1("ReduceMin", [values, axes], keepdims=1)
    hi = ctx.emit1("ReduceMax", [values, axes], keepdims=1)
    if initial is not None:
        lo = ctx.emit1("Min", [lo, _f32(ctx, [initial], "box_start")])
        hi = ctx.emit1("Max", [hi, _f32(ctx, [-initial], "box_start")])
    return lo, hi


def _matrix_v2(ctx, op, opts, lx, ly, rx, ry, xs, ys) -> str:
    add, sub, mul, div = _ops(ctx)
    out_h = _number(ctx, op, opts, "output_height")
    out_w = _number(ctx, op, opts, "output_width")
    scale_x = _number(ctx, op, opts, "scale_x", float)
    scale_y = _number(ctx, op, opts, "scale_y", float)
    target = np.float32(_number(ctx, op, opts, "target_rotation_radians", float))
    if min(out_h, out_w) <= 0 or min(scale_x, scale_y) <= 0:
        raise UnsupportedOpError("%s: %s options output_height=%d output_width=%d scale_x=%g scale_y=%g; expected "
                                 "positive sizes and scales" % (ctx.where(), op.custom_code, out_h, out_w, scale_x,
                                                                scale_y))
    # rotation r = target - atan2(dy, dx): its cosine and sine from the direction's, atan2(0, 0) being 0
    dx, dy = sub(rx, lx), sub(ry, ly)
    length = ctx.emit1("Sqrt", [add(mul(dx, dx), mul(dy, dy))])
    still = ctx.emit1("Equal", [length, _f32(ctx, 0.0, "zero")])
    cos_d = ctx.emit1("Where", [still, _f32(ctx, 1.0, "one"), div(dx, length)])
    sin_d = ctx.emit1("Where", [still, _f32(ctx, 0.0, "zero"), div(dy, length)])
    cos_t = _f32(ctx, math.cos(float(target)), "cos_target")
    sin_t = _f32(ctx, math.sin(float(target)), "sin_target")
    c = add(mul(cos_t, cos_d), mul(sin_t, sin_d))
    s = sub(mul(sin_t, cos_d), mul(cos_t, sin_d))
    x_lo, x_hi = _extent(ctx, sub(mul(c, xs), mul(s, ys)))
    y_lo, y_hi = _extent(ctx, add(mul(s, xs), mul(c, ys)))
    half = _f32(ctx, 2.0, "two")
    mid_x, mid_y = div(add(x_lo, x_hi), half), div(add(y_lo, y_hi), half)
    # the box centre rotated back by -r
    cx = add(mul(c, mid_x), mul(s, mid_y))
    cy = add(mul(ctx.emit1("Neg", [s]), mid_x), mul(c, mid_y))
    sx = div(mul(_f32(ctx, [scale_x], "scale_x"), sub(x_hi, x_lo)), _f32(ctx, [out_w], "output_width"))
    sy = div(mul(_f32(ctx, [scale_y], "scale_y"), sub(y_hi, y_lo)), _f32(ctx, [out_h], "output_height"))
    # shift(centre) . rotate(-r) . scale . shift(-output / 2), multiplied out
    m00, m01 = mul(c, sx), mul(s, sy)
    m10, m11 = mul(ctx.emit1("Neg", [s]), sx), mul(c, sy)
    shift_x, shift_y = _f32(ctx, [-(out_w / 2.0)], "shift_x"), _f32(ctx, [-(out_h / 2.0)], "shift_y")
    m03 = add(add(mul(m00, shift_x), mul(m01, shift_y)), cx)
    m13 = add(add(mul(m10, shift_x), mul(m11, shift_y)), cy)
    return _rows(ctx, [m00, m01, m03, m10, m11, m13])


def _matrix_v1(ctx, op, opts, lx, ly, rx, ry, xs, ys) -> str:
    add, sub, mul, div = _ops(ctx)
    dims = _number(ctx, op, opts, "dimensions")
    span = _number(ctx, op, opts, "landmarks_range")
    multiplier = _number(ctx, op, opts, "bbox_size_multiplier", float)
    in_hw, out_hw = _int_list(ctx, op, opts, "input_hw"), _int_list(ctx, op, opts, "output_hw")
    if dims != 3 or span <= 0 or multiplier == 0 or len(in_hw) != 2 or len(out_hw) != 2 or min(in_hw) <= 0 \
            or min(out_hw) <= 1:
        raise UnsupportedOpError("%s: %s options dimensions=%d landmarks_range=%d bbox_size_multiplier=%g "
                                 "input_hw=%s output_hw=%s; expected dimensions 3, a positive range, a nonzero "
                                 "multiplier, a positive input_hw and an output_hw over 1 (the kernel divides by "
                                 "size - 1)" % (ctx.where(), op.custom_code, dims, span, multiplier, in_hw, out_hw))
    alpha = ctx.emit1("Neg", [ctx.emit1("Atan", [div(sub(ry, ly), sub(rx, lx))])])
    ca, sa = ctx.emit1("Cos", [alpha]), ctx.emit1("Sin", [alpha])
    x_lo, x_hi = _extent(ctx, sub(mul(xs, ca), mul(ys, sa)), 100000.0)
    y_lo, y_hi = _extent(ctx, add(mul(xs, sa), mul(ys, ca)), 100000.0)
    mult, rng = _f32(ctx, [multiplier], "bbox_size_multiplier"), _f32(ctx, [span], "landmarks_range")
    scale_x, scale_y = div(mul(sub(x_hi, x_lo), mult), rng), div(mul(sub(y_hi, y_lo), mult), rng)
    half = _f32(ctx, 2.0, "two")
    mid_x, mid_y = div(add(x_hi, x_lo), half), div(add(y_hi, y_lo), half)
    # the middle rotated back by -alpha, as a translation in [-1, 1]
    one = _f32(ctx, 1.0, "one")
    tx = sub(mul(div(add(mul(mid_x, ca), mul(mid_y, sa)), rng), half), one)
    ty = sub(mul(div(add(ctx.emit1("Neg", [mul(mid_x, sa)]), mul(mid_y, ca)), rng), half), one)
    # to_absolute . rotation . scale . to_relative, multiplied out
    a = _f32(ctx, [(in_hw[1] - 1.0) / 2.0], "half_width")
    b = _f32(ctx, [(in_hw[0] - 1.0) / 2.0], "half_height")
    rel_x = _f32(ctx, [2.0 / (out_hw[1] - 1.0)], "to_relative_x")
    rel_y = _f32(ctx, [2.0 / (out_hw[0] - 1.0)], "to_relative_y")
    s00, s01, s02 = mul(mul(a, ca), scale_x), mul(mul(a, sa), scale_y), add(mul(a, tx), a)
    s10 = mul(mul(b, ctx.emit1("Neg", [sa])), scale_x)
    s11, s12 = mul(mul(b, ca), scale_y), add(mul(b, ty), b)
    i02 = add(sub(ctx.emit1("Neg", [s00]), s01), s02)
    i12 = add(sub(ctx.emit1("Neg", [s10]), s11), s12)
    return _rows(ctx, [mul(s00, rel_x), mul(s01, rel_y), i02, mul(s10, rel_x), mul(s11, rel_y), i12])


def _rows(ctx, entries: Sequence[str]) -> str:
    """The (16,) matrix whose first two rows are (e0, e1, 0, e2) and (e3, e4, 0, e5), the others (0, 0, 1, 0)
    and (0, 0, 0, 1)."""
    zero = _f32(ctx, [0.0], "zero")
    rest = _f32(ctx, [0, 0, 1, 0, 0, 0, 0, 1], "identity_rows")
    e = list(entries)
    return ctx.emit1("Concat", [e[0], e[1], zero, e[2], e[3], e[4], zero, e[5], rest], axis=0)


# ---- TransformTensorBilinear ---------------------------------------------------------------------------------

@CONVERTERS.register(TRANSFORM_TENSOR)
def _transform_tensor(ctx, op) -> None:
    _check_op(ctx, op, 2)
    x, matrix = op.inputs
    opts = options(ctx, op)
    _, h, w, c = _batch_one(ctx, op, x, 4)
    out = ctx.shape(op.outputs[0])
    if len(out) != 4 or out[0] != 1 or out[3] != c:
        raise UnsupportedOpError("%s: %s output of shape %s for an input of shape %s; expected (1, h, w, %d)"
                                 % (ctx.where(), op.custom_code, out, ctx.shape(x), c))
    if op.version == 2:
        # (the CPU kernel sizes its output from the tensor alone; the GPU delegate from these options)
        size = [_number(ctx, op, opts, key) if key in opts else n
                for key, n in (("output_height", out[1]), ("output_width", out[2]))]
    else:
        mode = opts.get("mode", "bilinear")
        if mode != "bilinear":
            raise UnsupportedOpError("%s: %s mode %r; MediaPipe's kernel is bilinear only"
                                     % (ctx.where(), op.custom_code, mode))
        size = _int_list(ctx, op, opts, "output_size") if "output_size" in opts else out[1:3]
    if list(size) != out[1:3]:
        raise UnsupportedOpError("%s: %s options give an output of %s, the output tensor is %s; expected the same "
                                 "size" % (ctx.where(), op.custom_code, list(size), out[1:3]))
    add, sub, mul, _ = _ops(ctx)
    m0, m1, m3, m4, m5, m7 = _matrix_rows(ctx, op, matrix)
    if op.version == 2:
        # pixel centres: the translation gains (m0 + m1 - 1) / 2
        half = _f32(ctx, [0.5], "half")
        m3 = add(m3, sub(add(mul(m0, half), mul(m1, half)), half))
        m7 = add(m7, sub(add(mul(m4, half), mul(m5, half)), half))
    oh, ow = out[1], out[2]
    grid_x = _f32(ctx, np.tile(np.arange(ow, dtype=np.float32), oh), "out_x")
    grid_y = _f32(ctx, np.repeat(np.arange(oh, dtype=np.float32), ow), "out_y")
    tx = add(add(mul(m0, grid_x), mul(m1, grid_y)), m3)             # (oh * ow,)
    ty = add(add(mul(m4, grid_x), mul(m5, grid_y)), m7)
    zero = _f32(ctx, 0.0, "zero")
    inside = ctx.emit1("And", [
        ctx.emit1("And", [ctx.emit1("GreaterOrEqual", [tx, zero]),
                          ctx.emit1("LessOrEqual", [tx, _f32(ctx, w - 1.0, "last_x")])]),
        ctx.emit1("And", [ctx.emit1("GreaterOrEqual", [ty, zero]),
                          ctx.emit1("LessOrEqual", [ty, _f32(ctx, h - 1.0, "last_y")])])])
    # outside points read nothing: clamping them keeps every index in range, and their result is replaced by 0
    tx = ctx.emit1("Clip", [tx, zero, _f32(ctx, w - 1.0, "last_x")])
    ty = ctx.emit1("Clip", [ty, zero, _f32(ctx, h - 1.0, "last_y")])
    fx, fy = ctx.emit1("Floor", [tx]), ctx.emit1("Floor", [ty])
    right = ctx.emit1("Unsqueeze", [sub(tx, fx), _i64(ctx, [1], "axis")])          # (oh * ow, 1)
    lower = ctx.emit1("Unsqueeze", [sub(ty, fy), _i64(ctx, [1], "axis")])
    ix, iy = ctx.emit1("Cast", [fx], to=7), ctx.emit1("Cast", [fy], to=7)
    table = ctx.emit1("Reshape", [ctx.nhwc(x), _i64(ctx, [h * w, c], "pixels")])
    # a neighbour past the last row or column reads 0 (its weight is 0 there, but 0 * inf is not 0)
    has_right = ctx.emit1("Unsqueeze", [ctx.emit1("Less", [ix, _i64(ctx, w - 1, "last_col")]),
                                        _i64(ctx, [1], "axis")])
    has_lower = ctx.emit1("Unsqueeze", [ctx.emit1("Less", [iy, _i64(ctx, h - 1, "last_row")]),
                                        _i64(ctx, [1], "axis")])
    base = add(mul(iy, _i64(ctx, w, "width")), ix)

    def read(offset: int, valid: List[str]) -> str:
        at = base if offset == 0 else add(base, _i64(ctx, offset, "neighbour"))
        if valid:   # clamp the index itself as well, so that the Gather stays in range
            at = ctx.emit1("Min", [at, _i64(ctx, h * w - 1, "last_pixel")])
        value = ctx.emit1("Gather", [table, at], axis=0)
        for v in valid:
            value = ctx.emit1("Where", [v, value, _f32(ctx, 0.0, "zero")])
        return value

    q11, q21 = read(0, []), read(1, [has_right])
    q12, q22 = read(w, [has_lower]), read(w + 1, [has_right, has_lower])
    one = _f32(ctx, 1.0, "one")
    keep_x, keep_y = sub(one, right), sub(one, lower)
    upper = add(mul(keep_x, q11), mul(right, q21))
    below = add(mul(keep_x, q12), mul(right, q22))
    y = add(mul(lower, below), mul(keep_y, upper))
    inside = ctx.emit1("Unsqueeze", [inside, _i64(ctx, [1], "axis")])
    y = ctx.emit1("Where", [inside, y, _f32(ctx, 0.0, "zero")])
    ctx.set_output(op.outputs[0], ctx.emit1("Reshape", [y, _i64(ctx, out, "shape")]))


# ---- TransformLandmarks --------------------------------------------------------------------------------------

@CONVERTERS.register(TRANSFORM_LANDMARKS)
def _transform_landmarks(ctx, op) -> None:
    _check_op(ctx, op, 2)
    x, matrix = op.inputs
    opts = options(ctx, op)
    if op.version == 2:
        shape = _batch_one(ctx, op, x, 3)
        dims, scale = shape[2], 1.0
    else:
        shape = _batch_one(ctx, op, x, 4)
        dims, scale = _number(ctx, op, opts, "dimensions") if "dimensions" in opts else 3, \
            _number(ctx, op, opts, "scale", float) if "scale" in opts else 1.0
        if scale == 0 or dims not in (2, 3) or shape[3] % dims:
            raise UnsupportedOpError("%s: %s options dimensions=%d scale=%g for landmarks of shape %s; expected "
                                     "dimensions 2 or 3 dividing the channels and a nonzero scale"
                                     % (ctx.where(), op.custom_code, dims, scale, shape))
    if dims not in (2, 3):
        raise UnsupportedOpError("%s: %s landmarks of shape %s; expected 2 or 3 coordinates each"
                                 % (ctx.where(), op.custom_code, shape))
    if list(ctx.shape(op.outputs[0])) != list(shape):
        raise UnsupportedOpError("%s: %s output of shape %s for landmarks of shape %s; expected the same"
                                 % (ctx.where(), op.custom_code, ctx.shape(op.outputs[0]), shape))
    add, _, mul, _ = _ops(ctx)
    m0, m1, m3, m4, m5, m7 = _matrix_rows(ctx, op, matrix)
    if op.version == 1:
        m3, m7 = mul(m3, _f32(ctx, [scale], "scale")), mul(m7, _f32(ctx, [scale], "scale"))
    points = ctx.emit1("Reshape", [ctx.nhwc(x), _i64(ctx, [-1, dims], "points")])
    parts = ctx.emit("Split", [points, _i64(ctx, [1] * dims, "split")], outputs=dims, axis=1)
    px, py = parts[0], parts[1]
    moved = [add(add(mul(m0, px), mul(m1, py)), m3), add(add(mul(m4, px), mul(m5, py)), m7)] + parts[2:]
    y = ctx.emit1("Concat", moved, axis=1)
    ctx.set_output(op.outputs[0], ctx.emit1("Reshape", [y, _i64(ctx, shape, "shape")]))


__all__ = ["CONVERTERS", "LANDMARKS_TO_MATRIX", "TRANSFORM_TENSOR", "TRANSFORM_LANDMARKS", "VERSIONS", "options"]
