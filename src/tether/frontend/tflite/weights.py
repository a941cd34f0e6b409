"""Ops that only unpack stored weights, folded to float32 constants at translation time: DEQUANTIZE of float16
(MediaPipe ships float16 weights) and DENSIFY of sparse weights (the tensor's sparsity parameters)."""
from __future__ import annotations

from typing import List

import numpy as np

from tether.errors import UnsupportedOpError
from tether.frontend.tflite.flatbuffer import Sparsity
from tether.frontend.tflite.state import onnx_dtype
from tether.frontend.tflite.table import ConverterTable

CONVERTERS = ConverterTable("tflite weights")


@CONVERTERS.register("DEQUANTIZE")
def _dequantize(ctx, op) -> None:
    x = op.inputs[0]
    dtype = ctx.tensor(x).dtype
    if dtype not in ("float16", "bfloat16", "float32"):
        raise UnsupportedOpError("%s: dequantizing %s without quantization parameters is not defined"
                                 % (ctx.where(), dtype))
    const = ctx.const(x)
    if const is not None:
        ctx.set_const(op.outputs[0], np.asarray(const, np.float32))
        return
    held, layout = ctx.held(x)
    ctx.set_output(op.outputs[0], ctx.emit1("Cast", [held], to=onnx_dtype("float32")), layout)


def densify(values: np.ndarray, shape: List[int], sparsity: Sparsity) -> np.ndarray:
    """The dense tensor of ``shape`` that TFLite's sparse storage describes.

    Storage levels follow ``traversal_order`` (the original dims permuted, then the block dims); a DENSE level
    enumerates ``dense_size`` positions, a SPARSE_CSR level the stored indices of the current segment. Values are
    stored in traversal order; a block dim ``b`` refines original dim ``block_map[b]``.
    """
    order, levels, rank = sparsity.traversal_order, sparsity.dim_metadata, len(shape)
    if len(levels) != len(order) or sorted(order) != list(range(len(order))):
        raise ValueError("sparsity parameters do not match: %d levels, traversal order %s" % (len(levels), order))
    prev = np.zeros(1, np.int64)                    # each path's position in the level's segments
    coords = np.zeros((1, 0), np.int64)             # each path's index at every level so far
    for md in levels:
        if md.dense:
            n = md.dense_size
            prev = (prev[:, None] * n + np.arange(n)[None, :]).reshape(-1)
            coords = np.concatenate([np.repeat(coords, n, axis=0),
                                     np.tile(np.arange(n), len(coords))[:, None]], axis=1)
        else:
            seg, idx = md.segments, md.indices
            starts, counts = seg[prev], seg[prev + 1] - seg[prev]
            first = np.repeat(np.cumsum(counts) - counts, counts)
            prev = np.arange(int(counts.sum())) - first + np.repeat(starts, counts)
            coords = np.concatenate([np.repeat(coords, counts, axis=0), idx[prev][:, None]], axis=1)
    if len(coords) != values.size:
        raise ValueError("sparse tensor stores %d values for %d positions" % (values.size, len(coords)))
    orig = np.zeros((len(coords), rank), np.int64)
    for level, dim in enumerate(order):
        if dim < rank:
            orig[:, dim] = coords[:, level]
    for level, dim in enumerate(order):
        if dim >= rank:
            target = sparsity.block_map[dim - rank]
            orig[:, target] = orig[:, target] * levels[level].dense_size + coords[:, level]
    dense = np.zeros(int(np.prod(shape)), values.dtype)
    dense[np.ravel_multi_index(tuple(orig.T), tuple(shape))] = values.reshape(-1)
    return dense.reshape(shape)


@CONVERTERS.register("DENSIFY")
def _densify(ctx, op) -> None:
    t = ctx.tensor(op.inputs[0])
    if t.data is None or t.sparsity is None:
        raise UnsupportedOpError("%s: its input %r is not a constant sparse tensor" % (ctx.where(), t.name))
    try:
        dense = densify(t.data, ctx.shape(op.outputs[0]) or t.shape, t.sparsity)
    except (ValueError, IndexError) as exc:
        raise UnsupportedOpError("%s: the sparse tensor %r does not unpack: %s" % (ctx.where(), t.name, exc)) \
            from None
    ctx.set_const(op.outputs[0], dense)
