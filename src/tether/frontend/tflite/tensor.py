"""Shape and data-movement ops. Those that read positions (reshape, squeeze, expand_dims, transpose, shape) take
TFLite's layout (``ctx.nhwc``); concatenation and padding work in the layout their inputs are held, with the axis
or padding rows remapped."""
from __future__ import annotations

from typing import List

import numpy as np

from tether.errors import UnsupportedOpError
from tether.frontend.tflite import fused
from tether.frontend.tflite.state import NCHW, TO_NCHW, TO_NHWC, nchw_axis
from tether.frontend.tflite.table import ConverterTable

CONVERTERS = ConverterTable("tflite tensor")

INT64_MIN = np.iinfo(np.int64).min


def _i64(ctx, values, hint: str) -> str:
    return ctx.add_const(np.asarray(values, np.int64).reshape(-1), hint)


@CONVERTERS.register("RESHAPE")
def _reshape(ctx, op) -> None:
    x = ctx.nhwc(op.inputs[0])
    if len(op.inputs) > 1 and op.inputs[1] >= 0 and ctx.const(op.inputs[1]) is None:
        shape = ctx.emit1("Cast", [ctx.nhwc(op.inputs[1])], to=7)      # a shape computed at run time
    else:
        if len(op.inputs) > 1 and op.inputs[1] >= 0:
            dims = ctx.int_list(op.inputs[1], "new shape")
        else:
            dims = list(op.options.get("new_shape", []))
        if not dims and ctx.shape(op.outputs[0]):
            dims = ctx.shape(op.outputs[0])
        shape = _i64(ctx, dims, "shape")
    ctx.set_output(op.outputs[0], ctx.emit1("Reshape", [x, shape]))


@CONVERTERS.register("SQUEEZE")
def _squeeze(ctx, op) -> None:
    rank = ctx.rank(op.inputs[0])
    axes = [a % rank for a in op.options.get("squeeze_dims", [])] if rank else []
    if not axes:            # every dim of size 1 (a dynamic dim, -1 in the signature, is none of them)
        t = ctx.tensor(op.inputs[0])
        sig = t.shape_signature if t.shape_signature and len(t.shape_signature) == len(t.shape) else t.shape
        axes = [a for a, (d, s) in enumerate(zip(t.shape, sig)) if d == 1 and s == 1]
    ctx.set_output(op.outputs[0], ctx.emit1("Squeeze", [ctx.nhwc(op.inputs[0]), _i64(ctx, axes, "axes")]))


@CONVERTERS.register("EXPAND_DIMS")
def _expand_dims(ctx, op) -> None:
    axis = ctx.int_list(op.inputs[1], "axis")[0]
    rank = ctx.rank(op.inputs[0])
    axis = axis + rank + 1 if axis < 0 else axis
    ctx.set_output(op.outputs[0], ctx.emit1("Unsqueeze", [ctx.nhwc(op.inputs[0]), _i64(ctx, [axis], "axes")]))


@CONVERTERS.register("CONCATENATION")
def _concat(ctx, op) -> None:
    axis = int(op.options.get("axis", 0))
    names, layout = ctx.aligned(op.inputs)
    rank = ctx.rank(op.outputs[0]) if ctx.shape(op.outputs[0]) else ctx.rank(op.inputs[0])
    axis = axis + rank if axis < 0 else axis
    if layout == NCHW:
        axis = nchw_axis(axis)
    y = ctx.emit1("Concat", names, axis=axis)
    ctx.set_output(op.outputs[0], fused.apply_from(ctx, y), layout)


def _pad_amounts(ctx, op) -> List[List[int]]:
    flat = ctx.int_list(op.inputs[1], "paddings")
    rank = ctx.rank(op.inputs[0])
    if len(flat) != 2 * rank:
        raise UnsupportedOpError("%s: %d padding values for a rank-%d input" % (ctx.where(), len(flat), rank))
    return [flat[2 * i:2 * i + 2] for i in range(rank)]


def _held_padded(ctx, op):
    """The input as held (NCHW stays NCHW) and its padding rows in that layout."""
    rows = _pad_amounts(ctx, op)
    x, layout = ctx.held(op.inputs[0])
    if layout == NCHW:
        rows = [rows[a] for a in TO_NCHW]
    return x, layout, rows


@CONVERTERS.register("PAD", "PADV2")
def _pad(ctx, op) -> None:
    x, layout, rows = _held_padded(ctx, op)
    pads = _i64(ctx, [r[0] for r in rows] + [r[1] for r in rows], "pads")
    inputs = [x, pads]
    if op.op == "PADV2" and len(op.inputs) > 2 and op.inputs[2] >= 0:
        value = ctx.const(op.inputs[2])
        inputs.append(ctx.add_const(np.asarray(value).reshape(()), "pad_value") if value is not None
                      else ctx.emit1("Reshape", [ctx.nhwc(op.inputs[2]), _i64(ctx, [], "scalar")]))
    ctx.set_output(op.outputs[0], ctx.emit1("Pad", inputs, mode="constant"), layout)


@CONVERTERS.register("MIRROR_PAD")
def _mirror_pad(ctx, op) -> None:
    x, layout, rows = _held_padded(ctx, op)
    mode = int(op.options.get("mode", 0))        # REFLECT 0: edge not repeated; SYMMETRIC 1: edge repeated
    if mode == 0:
        pads = _i64(ctx, [r[0] for r in rows] + [r[1] for r in rows], "pads")
        ctx.set_output(op.outputs[0], ctx.emit1("Pad", [x, pads], mode="reflect"), layout)
        return
    if mode != 1:
        raise UnsupportedOpError("%s: mirror pad mode %d is not REFLECT or SYMMETRIC" % (ctx.where(), mode))
    # SYMMETRIC has no ONNX Pad mode: concatenate the mirrored edge slices, one axis at a time
    for axis, (begin, end) in enumerate(rows):
        parts = []
        if begin:
            parts.append(ctx.emit1("Slice", [x, _i64(ctx, [begin - 1], "starts"), _i64(ctx, [INT64_MIN], "ends"),
                                             _i64(ctx, [axis], "axes"), _i64(ctx, [-1], "steps")]))
        parts.append(x)
        if end:
            parts.append(ctx.emit1("Slice", [x, _i64(ctx, [-1], "starts"), _i64(ctx, [-end - 1], "ends"),
                                             _i64(ctx, [axis], "axes"), _i64(ctx, [-1], "steps")]))
        if len(parts) > 1:
            x = ctx.emit1("Concat", parts, axis=axis)
    ctx.set_output(op.outputs[0], x, layout)


@CONVERTERS.register("TRANSPOSE")
def _transpose(ctx, op) -> None:
    perm = ctx.int_list(op.inputs[1], "permutation")
    x, layout = ctx.held(op.inputs[0])
    if layout == NCHW:          # one Transpose from the NCHW value: compose the two permutations
        perm = [TO_NHWC[p] for p in perm]
    ctx.set_output(op.outputs[0], ctx.emit1("Transpose", [x], perm=perm))


@CONVERTERS.register("SHAPE")
def _shape(ctx, op) -> None:
    shape = ctx.emit1("Shape", [ctx.nhwc(op.inputs[0])])
    dtype = ctx.tensor(op.outputs[0]).dtype
    if dtype != "int64":
        shape = ctx.emit1("Cast", [shape], to=6 if dtype == "int32" else 7)
    ctx.set_output(op.outputs[0], shape)


@CONVERTERS.register("DEPTH_TO_SPACE")
def _depth_to_space(ctx, op) -> None:
    # TensorFlow's channel order (block row, block column, channel) is ONNX's DCR mode
    y = ctx.emit1("DepthToSpace", [ctx.nchw(op.inputs[0])], blocksize=int(op.options["block_size"]), mode="DCR")
    ctx.set_output(op.outputs[0], y, NCHW)


@CONVERTERS.register("DILATE")
def _dilate(ctx, op) -> None:
    """Each axis with dilation ``d`` gets ``d - 1`` padding values between neighbours: the input with a block of
    padding values after every element along the axis, flattened into it, less the trailing block."""
    x = ctx.nhwc(op.inputs[0])
    shape = ctx.shape(op.inputs[0])
    dilations = ctx.int_list(op.inputs[1], "dilations")
    if len(dilations) != len(shape) or min(dilations, default=1) < 1:
        raise UnsupportedOpError("%s: dilations %s (expected one >= 1 per axis of its rank-%d input)"
                                 % (ctx.where(), dilations, len(shape)))
    pad = ctx.nhwc(op.inputs[2])
    for axis, d in enumerate(dilations):
        if d == 1 or shape[axis] == 0:
            continue
        block = shape[:axis + 1] + [d - 1] + shape[axis + 1:]
        filler = ctx.emit1("Expand", [pad, _i64(ctx, block, "block")])
        spread = ctx.emit1("Concat", [ctx.emit1("Unsqueeze", [x, _i64(ctx, [axis + 1], "axes")]), filler],
                           axis=axis + 1)
        flat = shape[:axis] + [shape[axis] * d] + shape[axis + 1:]
        x = ctx.emit1("Slice", [ctx.emit1("Reshape", [spread, _i64(ctx, flat, "shape")]), _i64(ctx, [0], "starts"),
                                _i64(ctx, [(shape[axis] - 1) * d + 1], "ends"), _i64(ctx, [axis], "axes")])
        shape = shape[:axis] + [(shape[axis] - 1) * d + 1] + shape[axis + 1:]
    ctx.set_output(op.outputs[0], x)
