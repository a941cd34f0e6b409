"""Converters of the ONNX ops whose data movement is fixed once their index inputs are constants: every output
element reads (or accumulates) input positions known at import time. Scatter, ScatterElements, ScatterND,
TensorScatter, Col2Im, MaxUnpool (scatters) and ReverseSequence, CenterCropPad, Pad mode 'wrap' (gathers).
ScatterElements, ScatterND and MaxUnpool with indices computed at run time take the ``scatter_flat`` kernel instead,
at flat positions computed by graph ops (TensorScatter with run-time write indices too); ReverseSequence with
run-time lengths a ``gather_elements``.

Each becomes a table of flat positions and existing graph ops: a ``gather`` through a constant index table and a
``where`` with a constant mask. A scatter with a reduction (add, mul, max, min) or with duplicate targets takes
one gather/combine/where round per duplicate depth, applied in the order the updates come, which is the order
ONNX's reference and onnxruntime apply them in (for reduction 'none' the last update of a position wins).
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from tether.errors import UnsupportedOpError
from tether.frontend.onnx.importer import ConverterTable, emit_reshape, node_output, norm_axis, str_attr

CONVERTERS = ConverterTable(__name__)

_COMBINE = {"add": "add", "mul": "mul", "max": "maximum", "min": "minimum"}


def _flat(im, x: str, name: str) -> str:
    return emit_reshape(im, x, (max(1, im.type(x).size),), name + "_flat")


def gather_map(im, x: str, src: np.ndarray, name: str, out: Optional[str] = None, fill: float = 0) -> str:
    """A tensor of src's shape whose element i is x.flat[src.flat[i]], or ``fill`` where src is negative."""
    flat = _flat(im, x, name)
    s = src.reshape(-1).astype(np.int64)
    y = im.emit("gather", [flat, im.add_const(np.maximum(s, 0), name + "_index")], {"axis": 0, "shape": [s.size]},
                name + "_gather")
    if (s < 0).any():
        dt = im.type(x).dtype
        y = im.emit("where", [im.add_const(s >= 0, name + "_mask"), y, im.add_const(np.full((1,), fill, dt))],
                    {}, name + "_fill")
    return emit_reshape(im, y, src.shape, name + "_shape", out)


def _check_reduction(node, reduction: str, dtype: str) -> None:
    if reduction not in ("none",) + tuple(_COMBINE):
        raise UnsupportedOpError("node %s: %s reduction %r (tether implements none, add, mul, max, min)"
                                 % (node.name, node.op_type, reduction))
    if reduction != "none" and dtype == "bool":
        raise UnsupportedOpError("node %s: %s reduction %r on bool tensors" % (node.name, node.op_type, reduction))


def scatter_map(im, node, data: str, updates: str, dst: np.ndarray, reduction: str, out: Optional[str]) -> str:
    """data with updates.flat[j] written to (or combined with) data.flat[dst.flat[j]]; dst < 0 drops update j."""
    dt = im.type(data)
    _check_reduction(node, reduction, dt.dtype)
    n = max(1, dt.size)
    d = dst.reshape(-1).astype(np.int64)
    keep = np.nonzero(d >= 0)[0]
    d = d[keep]
    upd = _flat(im, updates, node.name + "_updates")
    cur = _flat(im, data, node.name + "_data")
    if reduction == "none":
        src = np.full(n, -1, np.int64)
        np.maximum.at(src, d, keep)                 # the last update of a position wins
        layers = [src]
    else:
        order = np.argsort(d, kind="stable")
        ds = d[order]
        first = np.searchsorted(ds, ds, side="left")
        rank = np.arange(ds.size) - first           # how many earlier updates hit the same position
        layers = []
        for k in range(int(rank.max()) + 1 if ds.size else 0):
            src = np.full(n, -1, np.int64)
            sel = rank == k
            src[ds[sel]] = keep[order[sel]]
            layers.append(src)
    for k, src in enumerate(layers):
        name = "%s_l%d" % (node.name, k)
        g = im.emit("gather", [upd, im.add_const(np.maximum(src, 0), name + "_index")], {"axis": 0, "shape": [n]},
                    name + "_gather")
        if reduction != "none":
            g = im.emit(_COMBINE[reduction], [cur, g], {}, name + "_combine")
        cur = im.emit("where", [im.add_const(src >= 0, name + "_mask"), g, cur], {}, name + "_where")
    return emit_reshape(im, cur, dt.shape, node.name + "_shape", out)


def _indices(im, node, value: str, what: str) -> np.ndarray:
    c = im.require_const(value, "%s %s" % (node.op_type, what), node.name)
    if c.dtype.kind not in "iu":
        raise UnsupportedOpError("node %s: %s %s of type %s (int32 or int64)" % (node.name, node.op_type, what,
                                                                                 c.dtype))
    return c.astype(np.int64)


def _in_range(node, idx: np.ndarray, n: int, what: str) -> np.ndarray:
    idx = np.where(idx < 0, idx + n, idx)
    if idx.size and (idx.min() < 0 or idx.max() >= n):
        raise UnsupportedOpError("node %s: %s %s out of range for a dimension of %d"
                                 % (node.name, node.op_type, what, n))
    return idx


def _reduction(node, a) -> str:
    return str_attr(a, "reduction", "none")


def _runtime_scatter(im, node, data, dst: str, updates: str, reduction: str) -> str:
    """The scatter of indices computed at run time: the ``scatter_flat`` kernel (kernels/scatter_kernel.py) at the
    flat positions ``dst`` (a graph value, one per update); ``data`` a value, or a shape to scatter into zeros."""
    _check_reduction(node, reduction, im.type(updates).dtype)
    if isinstance(data, str):
        return im.emit("scatter_flat", [data, dst, updates], {"reduction": reduction}, node.name,
                       outputs=node_output(node, 0))
    return im.emit("scatter_flat", [dst, updates], {"reduction": reduction, "shape": [int(d) for d in data]},
                   node.name, outputs=node_output(node, 0))


def _as_int64(im, node, value: str, what: str) -> str:
    """A run-time integer input as int64 (one cast from int32); another dtype is refused, naming ``what``."""
    dtype = im.type(value).dtype
    if dtype not in ("int32", "int64"):
        raise UnsupportedOpError("node %s: %s %s of type %s (int32 or int64)" % (node.name, node.op_type, what,
                                                                                dtype))
    return value if dtype == "int64" else im.emit("cast", [value], {"to": "int64"}, node.name + "_" + what)


def _within(im, value: str, length: str, name: str) -> str:
    """Whether each int64 ``value`` lies in [0, length)."""
    zero = im.add_const(np.zeros((), np.int64), name + "_zero")
    return im.emit("logical_and", [im.emit("greater_equal", [value, zero], {}, name + "_ge"),
                                   im.emit("less", [value, length], {}, name + "_lt")], {}, name + "_inside")


def _normalized(im, node, idx: str, size, name: str) -> tuple:
    """(int64 indices with negative ones counted from the end of a dimension of ``size`` (a scalar, or a vector
    along the last axis), whether each lies inside it): an index outside its own dimension must not land on
    another row's element once flattened."""
    i64 = _as_int64(im, node, idx, "indices")
    n = im.add_const(np.asarray(size, np.int64), name + "_size")
    neg = im.emit("less", [i64, im.add_const(np.zeros((), np.int64))], {}, name + "_neg")
    norm = im.emit("where", [neg, im.emit("add", [i64, n], {}, name + "_wrapped"), i64], {}, name + "_norm")
    return norm, _within(im, norm, n, name)


def _dropped_outside(im, name: str, dst: str, inside: str) -> str:
    """``dst`` where ``inside``, else -1 (the kernel skips a negative position)."""
    return im.emit("where", [inside, dst, im.add_const(np.array(-1, np.int64), name + "_skip")], {}, name + "_kept")


@CONVERTERS.register("ScatterElements", "Scatter")
def _scatter_elements(im, node, ins, a):
    dshape = im.type(ins[0]).shape
    axis = norm_axis(int(a.get("axis", 0)), len(dshape))
    if im.const(ins[1]) is None:
        ishape = tuple(im.type(ins[1]).shape)
        if tuple(im.type(ins[2]).shape) != ishape:
            raise UnsupportedOpError("node %s: %s updates %s and indices %s differ in shape"
                                     % (node.name, node.op_type, im.type(ins[2]).shape, ishape))
        # flat position = the other coordinates' part (a constant) + the run-time index times the axis' stride
        coords = list(np.indices(ishape)) if ishape else []
        coords[axis] = np.zeros(ishape, np.int64)
        fixed = np.ravel_multi_index(tuple(coords), dshape) if coords else np.zeros((), np.int64)
        stride = int(np.prod(dshape[axis + 1:], dtype=np.int64))
        idx, inside = _normalized(im, node, ins[1], dshape[axis], node.name + "_indices")
        dst = im.emit("add", [im.emit("mul", [idx, im.add_const(np.array(stride, np.int64))], {}),
                              im.add_const(fixed.astype(np.int64), node.name + "_fixed")], {}, node.name + "_dst")
        dst = _dropped_outside(im, node.name, dst, inside)
        _runtime_scatter(im, node, ins[0], dst, ins[2], _reduction(node, a))
        return
    idx = _in_range(node, _indices(im, node, ins[1], "indices"), dshape[axis], "indices")
    if tuple(im.type(ins[2]).shape) != idx.shape:
        raise UnsupportedOpError("node %s: %s updates %s and indices %s differ in shape"
                                 % (node.name, node.op_type, im.type(ins[2]).shape, idx.shape))
    coords = list(np.indices(idx.shape)) if idx.ndim else []
    coords[axis] = idx
    dst = np.ravel_multi_index(tuple(coords), dshape) if idx.size else np.zeros(0, np.int64)
    scatter_map(im, node, ins[0], ins[2], dst, _reduction(node, a), node.output[0])


@CONVERTERS.register("ScatterND")
def _scatter_nd(im, node, ins, a):
    dshape = tuple(im.type(ins[0]).shape)
    if im.const(ins[1]) is None:
        ishape = tuple(im.type(ins[1]).shape)
        k = ishape[-1] if ishape else 0
        if not ishape or k > len(dshape):
            raise UnsupportedOpError("node %s: ScatterND index tuples of shape %s on rank-%d data"
                                     % (node.name, ishape, len(dshape)))
        q = ishape[:-1]
        if tuple(im.type(ins[2]).shape) != tuple(q) + dshape[k:]:
            raise UnsupportedOpError("node %s: ScatterND updates of shape %s (expected %s)"
                                     % (node.name, im.type(ins[2]).shape, tuple(q) + dshape[k:]))
        inner = int(np.prod(dshape[k:], dtype=np.int64))
        # each index tuple's flat start (sum of its coordinates times their strides), then the slice it writes
        strides = np.array([int(np.prod(dshape[j + 1:], dtype=np.int64)) for j in range(k)], np.int64)
        idx, inside = _normalized(im, node, ins[1], np.array(dshape[:k], np.int64), node.name + "_indices")
        start = im.emit("reduce", [im.emit("mul", [idx, im.add_const(strides, node.name + "_strides")], {})],
                        {"kind": "sum", "axes": [len(ishape) - 1], "keepdims": True}, node.name + "_start")
        # a tuple with any coordinate outside its dimension writes nothing
        outside = im.emit("reduce", [im.emit("cast", [im.emit("logical_not", [inside], {})], {"to": "int64"})],
                          {"kind": "sum", "axes": [len(ishape) - 1], "keepdims": True}, node.name + "_outside")
        dst = im.emit("add", [start, im.add_const(np.arange(inner, dtype=np.int64), node.name + "_inner")], {},
                      node.name + "_dst")
        dst = _dropped_outside(im, node.name, dst,
                               im.emit("equal", [outside, im.add_const(np.zeros((), np.int64))], {}))
        _runtime_scatter(im, node, ins[0], dst, ins[2], _reduction(node, a))
        return
    idx = _indices(im, node, ins[1], "indices")
    k = idx.shape[-1]
    if k > len(dshape):
        raise UnsupportedOpError("node %s: ScatterND index tuples of %d on rank-%d data" % (node.name, k,
                                                                                            len(dshape)))
    q = idx.shape[:-1]
    if tuple(im.type(ins[2]).shape) != tuple(q) + dshape[k:]:
        raise UnsupportedOpError("node %s: ScatterND updates of shape %s (expected %s)"
                                 % (node.name, im.type(ins[2]).shape, tuple(q) + dshape[k:]))
    cols = [_in_range(node, idx[..., j], dshape[j], "indices") for j in range(k)]
    base = np.ravel_multi_index(tuple(cols), dshape[:k]) if k else np.zeros(q, np.int64)
    inner = int(np.prod(dshape[k:], dtype=np.int64))
    dst = base.reshape(tuple(q) + (1,)) * inner + np.arange(inner)
    scatter_map(im, node, ins[0], ins[2], dst, _reduction(node, a), node.output[0])


@CONVERTERS.register("TensorScatter")
def _tensor_scatter(im, node, ins, a):
    cshape = tuple(im.type(ins[0]).shape)
    ushape = tuple(im.type(ins[1]).shape)
    axis = norm_axis(int(a.get("axis", -2)), len(cshape))
    if axis == 0 or len(ushape) != len(cshape) or any(u != c for i, (u, c) in enumerate(zip(ushape, cshape))
                                                      if i != axis):
        raise UnsupportedOpError("node %s: TensorScatter update %s on cache %s along axis %d"
                                 % (node.name, ushape, cshape, axis))
    mode = str_attr(a, "mode", "linear")
    if mode not in ("linear", "circular"):
        raise UnsupportedOpError("node %s: TensorScatter mode %r (linear or circular)" % (node.name, mode))
    if len(ins) > 2 and ins[2] and im.const(ins[2]) is None:
        _tensor_scatter_at_run_time(im, node, ins, cshape, ushape, axis, mode)
        return
    write = (_indices(im, node, ins[2], "write_indices").reshape(-1) if len(ins) > 2 and ins[2]
             else np.zeros(cshape[0], np.int64))
    if write.size != cshape[0]:
        raise UnsupportedOpError("node %s: TensorScatter write_indices of %d for a batch of %d"
                                 % (node.name, write.size, cshape[0]))
    coords = list(np.indices(ushape))
    seq = write[coords[0]] + coords[axis]
    if mode == "circular":
        seq = seq % cshape[axis]
    elif seq.size and (seq.min() < 0 or seq.max() >= cshape[axis]):
        raise UnsupportedOpError("node %s: TensorScatter writes past the cache's %d positions (mode linear)"
                                 % (node.name, cshape[axis]))
    coords[axis] = seq
    scatter_map(im, node, ins[0], ins[1], np.ravel_multi_index(tuple(coords), cshape), "none", node.output[0])


def _tensor_scatter_at_run_time(im, node, ins, cshape, ushape, axis: int, mode: str) -> None:
    """Write positions computed at run time (a KV cache's per-batch lengths): update element (b, ..., s, ...) goes to
    cache position ``write[b] + s`` along ``axis`` (modulo its length in circular mode); in linear mode one past
    the cache writes nothing (onnxruntime raises on it). Then the ``scatter_flat`` kernel."""
    if tuple(im.type(ins[2]).shape) != (cshape[0],):
        raise UnsupportedOpError("node %s: TensorScatter write_indices of shape %s for a batch of %d"
                                 % (node.name, im.type(ins[2]).shape, cshape[0]))
    write = emit_reshape(im, _as_int64(im, node, ins[2], "write_indices"), (cshape[0],) + (1,) * (len(cshape) - 1),
                         node.name + "_write")
    coords = list(np.indices(ushape))
    steps = coords[axis].astype(np.int64)
    coords[axis] = np.zeros(ushape, np.int64)
    fixed = np.ravel_multi_index(tuple(coords), cshape).astype(np.int64)
    length = im.add_const(np.array(cshape[axis], np.int64), node.name + "_length")
    seq = im.emit("add", [write, im.add_const(steps, node.name + "_steps")], {}, node.name + "_seq")
    stride = int(np.prod(cshape[axis + 1:], dtype=np.int64))
    if mode == "circular":
        seq = im.emit("mod", [seq, length], {"fmod": 0}, node.name + "_wrapped")
    dst = im.emit("add", [im.emit("mul", [seq, im.add_const(np.array(stride, np.int64))], {}),
                          im.add_const(fixed, node.name + "_fixed")], {}, node.name + "_dst")
    if mode == "linear":
        dst = _dropped_outside(im, node.name, dst, _within(im, seq, length, node.name))
    _runtime_scatter(im, node, ins[0], dst, ins[1], "none")


def _zeros(im, shape: Sequence[int], dtype) -> str:
    return im.add_const(np.zeros(tuple(shape), dtype))


@CONVERTERS.register("Col2Im")
def _col2im(im, node, ins, a):
    t = im.type(ins[0])
    img = [int(v) for v in _indices(im, node, ins[1], "image_shape").reshape(-1)]
    blk = [int(v) for v in _indices(im, node, ins[2], "block_shape").reshape(-1)]
    nd = len(img)
    dil = list(a.get("dilations", [1] * nd))
    pads = list(a.get("pads", [0] * 2 * nd))
    strides = list(a.get("strides", [1] * nd))
    nblocks = [(img[d] + pads[d] + pads[d + nd] - dil[d] * (blk[d] - 1) - 1) // strides[d] + 1 for d in range(nd)]
    kprod, lprod = int(np.prod(blk)), int(np.prod(nblocks))
    if len(t.shape) != 3 or t.shape[1] % kprod or t.shape[2] != lprod:
        raise UnsupportedOpError("node %s: Col2Im input %s for blocks %s over %s" % (node.name, t.shape, blk, img))
    n, c = t.shape[0], t.shape[1] // kprod
    ko = np.indices(blk).reshape(nd, -1)                 # block offsets, row-major
    bo = np.indices(nblocks).reshape(nd, -1)             # block positions, row-major
    pos = [bo[d][None, :] * strides[d] + ko[d][:, None] * dil[d] - pads[d] for d in range(nd)]   # (K, L) each
    inside = np.all([(p >= 0) & (p < img[d]) for d, p in enumerate(pos)], axis=0)
    spatial = np.ravel_multi_index(tuple(np.clip(p, 0, img[d] - 1) for d, p in enumerate(pos)), img)
    spatial = np.where(inside, spatial, -1)
    plane = int(np.prod(img))
    nc = np.arange(n * c).reshape(n, c, 1, 1) * plane
    dst = np.where(spatial[None, None] >= 0, nc + spatial[None, None], -1).reshape(t.shape)
    scatter_map(im, node, _zeros(im, (n, c) + tuple(img), t.dtype), ins[0], dst, "add", node.output[0])


@CONVERTERS.register("MaxUnpool")
def _max_unpool(im, node, ins, a):
    t = im.type(ins[0])
    runtime = im.const(ins[1]) is None        # (a MaxPool's indices: computed from the model's input)
    idx = None if runtime else _indices(im, node, ins[1], "indices")
    nd = len(t.shape) - 2
    k = list(a["kernel_shape"])
    pads = list(a.get("pads", [0] * 2 * nd))
    strides = list(a.get("strides", [1] * nd))
    shape = tuple(t.shape[:2]) + tuple((t.shape[2 + d] - 1) * strides[d] + k[d] - pads[d] - pads[d + nd]
                                       for d in range(nd))
    if len(ins) > 2 and ins[2]:
        given = tuple(int(v) for v in _indices(im, node, ins[2], "output_shape").reshape(-1))
        if given != shape:
            # ONNX's reference scatters into the inferred shape and pads that; onnxruntime reads the indices in
            # the given shape: the two disagree, so neither is implemented
            raise UnsupportedOpError("node %s: MaxUnpool output_shape %s other than the inferred %s"
                                     % (node.name, given, shape))
    total = int(np.prod(shape))
    if runtime:
        if tuple(im.type(ins[1]).shape) != tuple(t.shape) or im.type(ins[1]).dtype != "int64":
            raise UnsupportedOpError("node %s: MaxUnpool indices %s %s for values %s (int64 of the same shape)"
                                     % (node.name, im.type(ins[1]).dtype, im.type(ins[1]).shape, t.shape))
        # the indices are flat positions in the whole output already; one outside it writes nothing
        _runtime_scatter(im, node, shape, ins[1], ins[0], "none")
        return
    if idx.shape != tuple(t.shape) or (idx.size and (idx.min() < 0 or idx.max() >= total)):
        raise UnsupportedOpError("node %s: MaxUnpool indices %s out of range for output %s"
                                 % (node.name, idx.shape, shape))
    scatter_map(im, node, _zeros(im, shape, t.dtype), ins[0], idx, "none", node.output[0])


@CONVERTERS.register("ReverseSequence")
def _reverse_sequence(im, node, ins, a):
    shape = tuple(im.type(ins[0]).shape)
    bax = norm_axis(int(a.get("batch_axis", 1)), len(shape))
    tax = norm_axis(int(a.get("time_axis", 0)), len(shape))
    if im.const(ins[1]) is None:
        _reverse_sequence_at_run_time(im, node, ins, shape, bax, tax)
        return
    lens = _indices(im, node, ins[1], "sequence_lens").reshape(-1)
    if lens.size != shape[bax] or (lens.size and (lens.min() < 0 or lens.max() > shape[tax])):
        raise UnsupportedOpError("node %s: ReverseSequence lengths %s for shape %s" % (node.name, lens, shape))
    coords = list(np.indices(shape))
    ln, tt = lens[coords[bax]], coords[tax]
    coords[tax] = np.where(tt < ln, ln - 1 - tt, tt)
    gather_map(im, ins[0], np.ravel_multi_index(tuple(coords), shape), node.name, node.output[0])


def _reverse_sequence_at_run_time(im, node, ins, shape, bax: int, tax: int) -> None:
    """Lengths computed at run time (an RNN's batch of sequences): each element reads time ``L - 1 - t`` of its
    batch entry where ``t < L``, itself elsewhere, through a gather_elements along the time axis. Lengths are
    clamped to [0, T] (onnxruntime raises outside it) so that no read leaves the input."""
    t_len = shape[tax]
    if tuple(im.type(ins[1]).shape) != (shape[bax],):
        raise UnsupportedOpError("node %s: ReverseSequence sequence_lens of shape %s for a batch of %d"
                                 % (node.name, im.type(ins[1]).shape, shape[bax]))
    lens = _as_int64(im, node, ins[1], "sequence_lens")
    lens = im.emit("minimum", [im.emit("maximum", [lens, im.add_const(np.zeros((), np.int64))], {}),
                               im.add_const(np.array(t_len, np.int64))], {}, node.name + "_lens")
    # lens along the batch axis and t along the time axis, each broadcast over the other axes
    bshape = [1] * len(shape)
    bshape[bax] = shape[bax]
    tshape = [1] * len(shape)
    tshape[tax] = t_len
    ln = emit_reshape(im, lens, bshape, node.name + "_lens_b")
    t = im.add_const(np.arange(t_len, dtype=np.int64).reshape(tshape), node.name + "_time")
    reversed_t = im.emit("sub", [im.emit("sub", [ln, im.add_const(np.ones((), np.int64))], {}), t], {})
    src = im.emit("where", [im.emit("less", [t, ln], {}), reversed_t, t], {}, node.name + "_source")
    src = im.emit("broadcast_to", [src], {"shape": list(shape)}, node.name + "_source_full")
    im.emit("gather_elements", [ins[0], src], {"axis": tax}, node.name, node_output(node))


def crop_pad_map(in_shape: Sequence[int], out_shape: Sequence[int], before: Sequence[int]) -> np.ndarray:
    """Flat source positions (-1: padding) of an output whose axis d starts ``before[d]`` elements before the
    input's (negative: a crop)."""
    coords = list(np.indices(tuple(out_shape)))
    src = [cd - b for cd, b in zip(coords, before)]
    inside = np.all([(s >= 0) & (s < n) for s, n in zip(src, in_shape)], axis=0)
    flat = np.ravel_multi_index(tuple(np.clip(s, 0, n - 1) for s, n in zip(src, in_shape)), tuple(in_shape))
    return np.where(inside, flat, -1)


@CONVERTERS.register("CenterCropPad")
def _center_crop_pad(im, node, ins, a):
    shape = tuple(im.type(ins[0]).shape)
    target = [int(v) for v in _indices(im, node, ins[1], "shape").reshape(-1)]
    axes = [norm_axis(int(x), len(shape)) for x in a.get("axes", range(len(shape)))]
    if len(axes) != len(target) or min(target, default=1) < 1:
        raise UnsupportedOpError("node %s: CenterCropPad shape %s for axes %s" % (node.name, target, axes))
    out, before = list(shape), [0] * len(shape)
    for ax, n in zip(axes, target):
        out[ax] = n
        before[ax] = (n - shape[ax]) // 2 if n >= shape[ax] else -((shape[ax] - n) // 2)
    gather_map(im, ins[0], crop_pad_map(shape, out, before), node.name, node.output[0])


def pad_wrap(im, node, x: str, pads: Sequence[int]) -> None:
    """ONNX Pad mode 'wrap' (numpy's): the padding repeats the tensor periodically."""
    shape = tuple(im.type(x).shape)
    nd = len(shape)
    if min(pads, default=0) < 0:
        raise UnsupportedOpError("node %s: Pad mode 'wrap' with negative pads %s" % (node.name, list(pads)))
    out = [shape[d] + pads[d] + pads[d + nd] for d in range(nd)]
    coords = [(c - pads[d]) % shape[d] for d, c in enumerate(np.indices(out))]
    gather_map(im, x, np.ravel_multi_index(tuple(coords), shape), node.name, node_output(node)[0])
