"""Moving pixels between space, depth and batch (SPACE_TO_DEPTH, SPACE_TO_BATCH_ND, BATCH_TO_SPACE_ND) and the
per-pixel normalizations over channels (LOCAL_RESPONSE_NORMALIZATION, L2_NORMALIZATION).

SPACE_TO_DEPTH is ONNX's SpaceToDepth on the NCHW value (TensorFlow's channel order: block row, block column,
channel). SPACE_TO_BATCH_ND and BATCH_TO_SPACE_ND are pad/reshape/transpose/reshape (and crop) in TFLite's layout,
for any number of block dimensions. LRN sums squares over ``2 * radius + 1`` channels and divides by
``(bias + alpha * sum) ** beta`` (ONNX LRN's alpha is that alpha times the window size). L2_NORMALIZATION divides
by ``max(sqrt(sum of squares), 1e-6)`` over the last axis, as LiteRT's float kernel.
"""
from __future__ import annotations

from typing import List

import numpy as np

from tether.errors import UnsupportedOpError
from tether.frontend.tflite import fused
from tether.frontend.tflite.state import NCHW
from tether.frontend.tflite.table import ConverterTable

CONVERTERS = ConverterTable("tflite spatial")

L2_EPSILON = 1e-6


def _i64(ctx, values, hint: str) -> str:
    return ctx.add_const(np.array(list(values), np.int64), hint)


@CONVERTERS.register("SPACE_TO_DEPTH")
def _space_to_depth(ctx, op) -> None:
    y = ctx.emit1("SpaceToDepth", [ctx.nchw(op.inputs[0])], blocksize=int(op.options["block_size"]))
    ctx.set_output(op.outputs[0], y, NCHW)


def _blocks(ctx, op, x: int, pads_index: int, what: str):
    block = ctx.int_list(op.inputs[1], "block_shape")
    pads = np.array(ctx.int_list(op.inputs[pads_index], what), np.int64).reshape(-1, 2)
    shape = ctx.shape(x)
    m = len(block)
    if pads.shape[0] != m or len(shape) < m + 1:
        raise UnsupportedOpError("%s: block_shape %s and %s %s for an input of shape %s"
                                 % (ctx.where(), block, what, pads.tolist(), shape))
    return block, pads, shape, m


@CONVERTERS.register("SPACE_TO_BATCH_ND")
def _space_to_batch(ctx, op) -> None:
    x = op.inputs[0]
    block, pads, shape, m = _blocks(ctx, op, x, 2, "paddings")
    rank = len(shape)
    y = ctx.nhwc(x)
    if pads.any():
        onnx_pads = [0] * (2 * rank)
        for k in range(m):
            onnx_pads[1 + k], onnx_pads[rank + 1 + k] = int(pads[k, 0]), int(pads[k, 1])
        y = ctx.emit1("Pad", [y, _i64(ctx, onnx_pads, "pads")])
    padded = [shape[1 + k] + int(pads[k].sum()) for k in range(m)]
    if any(p % b for p, b in zip(padded, block)):
        raise UnsupportedOpError("%s: padded spatial size %s is not a multiple of block_shape %s"
                                 % (ctx.where(), padded, block))
    rest = shape[1 + m:]
    # the batch is read from the input (0) or inferred (-1), so a model with a dynamic batch keeps it
    split: List[int] = [0]
    for p, b in zip(padded, block):
        split += [p // b, b]
    y = ctx.emit1("Reshape", [y, _i64(ctx, split + rest, "shape")])
    # (N, P1/b1, b1, ..., PM/bM, bM, rest) -> (b1, ..., bM, N, P1/b1, ..., PM/bM, rest)
    perm = [2 + 2 * k for k in range(m)] + [0] + [1 + 2 * k for k in range(m)] + list(range(1 + 2 * m, 1 + 2 * m
                                                                                                + len(rest)))
    y = ctx.emit1("Transpose", [y], perm=perm)
    out = [-1] + [p // b for p, b in zip(padded, block)] + rest
    ctx.set_output(op.outputs[0], ctx.emit1("Reshape", [y, _i64(ctx, out, "shape")]))


@CONVERTERS.register("BATCH_TO_SPACE_ND")
def _batch_to_space(ctx, op) -> None:
    x = op.inputs[0]
    block, crops, shape, m = _blocks(ctx, op, x, 2, "crops")
    prod = int(np.prod(block))
    if shape[0] % prod:
        raise UnsupportedOpError("%s: batch %d is not a multiple of the block size %d" % (ctx.where(), shape[0], prod))
    spatial, rest = shape[1:1 + m], shape[1 + m:]
    y = ctx.emit1("Reshape", [ctx.nhwc(x), _i64(ctx, list(block) + [-1] + spatial + rest, "shape")])
    # (b1, ..., bM, N, S1, ..., SM, rest) -> (N, S1, b1, ..., SM, bM, rest)
    perm = [m]
    for k in range(m):
        perm += [m + 1 + k, k]
    perm += list(range(2 * m + 1, 2 * m + 1 + len(rest)))
    y = ctx.emit1("Transpose", [y], perm=perm)
    full = [s * b for s, b in zip(spatial, block)]
    y = ctx.emit1("Reshape", [y, _i64(ctx, [-1] + full + rest, "shape")])
    if crops.any():
        y = ctx.emit1("Slice", [y, _i64(ctx, crops[:, 0], "starts"),
                                _i64(ctx, [f - int(c) for f, c in zip(full, crops[:, 1])], "ends"),
                                _i64(ctx, range(1, 1 + m), "axes")])
    ctx.set_output(op.outputs[0], y)


@CONVERTERS.register("LOCAL_RESPONSE_NORMALIZATION")
def _lrn(ctx, op) -> None:
    o = op.options
    size = 2 * int(o.get("radius", 5)) + 1
    y = ctx.emit1("LRN", [ctx.nchw(op.inputs[0])], size=size, alpha=float(o.get("alpha", 1.0)) * size,
                  beta=float(o.get("beta", 0.5)), bias=float(o.get("bias", 1.0)))
    ctx.set_output(op.outputs[0], y, NCHW)


@CONVERTERS.register("L2_NORMALIZATION")
def _l2_normalization(ctx, op) -> None:
    x, layout = ctx.held(op.inputs[0])
    axis = 1 if layout == NCHW else -1
    ss = ctx.emit1("ReduceSumSquare", [x, _i64(ctx, [axis], "axes")], keepdims=1)
    norm = ctx.emit1("Max", [ctx.emit1("Sqrt", [ss]), ctx.add_const(np.array(L2_EPSILON, np.float32), "eps")])
    ctx.set_output(op.outputs[0], fused.apply_from(ctx, ctx.emit1("Div", [x, norm])), layout)
