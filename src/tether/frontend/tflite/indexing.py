"""Indexing and tensor rearrangement: gather/scatter, slices, splits, stacking, tiling, broadcasting, reversal,
diagonals, one-hot.

An op that keeps its input's rank works on a rank-4 value in the layout it is held in, with its axes remapped
(``nchw_axis``), so a slice or split between convolutions adds no Transpose; anything that changes the rank or
reads positions across axes takes TFLite's own layout (``ctx.nhwc``). Split sizes, axes and strided-slice bounds
must be constants once the file is read, as in converted models (shapes are static in tether); SLICE also takes
bounds computed in the graph (a loop counter), which fold when the ONNX importer unrolls the loop. UNIQUE's values
have a data-dependent count (a graph output only); WHERE with one input is converted only for a constant condition.
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import numpy as np

from tether.errors import UnsupportedOpError
from tether.frontend.tflite.state import NATIVE, NCHW, nchw_axis, onnx_dtype
from tether.frontend.tflite.table import ConverterTable

CONVERTERS = ConverterTable("tflite indexing")

INT_MAX = np.iinfo(np.int64).max
INT_MIN = np.iinfo(np.int64).min


def _i64(ctx, values: Sequence[int], hint: str) -> str:
    return ctx.add_const(np.array(list(values), np.int64), hint)


def _as_i64(ctx, index: int) -> str:
    """A run-time integer tensor as int64 (ONNX index inputs)."""
    name = ctx.nhwc(index)
    if ctx.tensor(index).dtype != "int64":
        name = ctx.emit1("Cast", [name], to=onnx_dtype("int64"))
    return name


def _axis(ctx, op, index: int, rank: int, what: str = "axis") -> int:
    (axis,) = ctx.int_list(index, what)
    return axis + rank if axis < 0 else axis


def _in_place(ctx, x: int) -> Tuple[str, str, int]:
    """(value, layout, rank) of an input read by a rank-preserving op: as held."""
    name, layout = ctx.held(x)
    return name, layout, ctx.rank(x)


def _held_axis(layout: str, axis: int, rank: int) -> int:
    return nchw_axis(axis) if layout == NCHW and rank == 4 else axis


# ---------------------------------------------------------------- gather / scatter
@CONVERTERS.register("GATHER")
def _gather(ctx, op) -> None:
    params, indices = op.inputs[:2]
    rank = ctx.rank(params)
    axis = int(op.options.get("axis", 0) or 0)
    axis = axis + rank if axis < 0 else axis
    batch_dims = int(op.options.get("batch_dims", 0) or 0)
    if batch_dims < 0:
        batch_dims += ctx.rank(indices)
    idx = _as_i64(ctx, indices)
    if batch_dims == 0:
        name, layout = ctx.held(params)
        if layout == NCHW and rank == 4 and ctx.rank(indices) == 1:     # the output keeps rank 4 and layout
            ctx.set_output(op.outputs[0], ctx.emit1("Gather", [name, idx], axis=nchw_axis(axis)), NCHW)
            return
        ctx.set_output(op.outputs[0], ctx.emit1("Gather", [ctx.nhwc(params), idx], axis=axis))
        return
    if axis != batch_dims:
        raise UnsupportedOpError("%s: GATHER with batch_dims=%d along axis %d (tether converts axis == batch_dims)"
                                 % (ctx.where(), batch_dims, axis))
    # a gather along the first non-batch axis is GatherND over one trailing index
    idx = ctx.emit1("Unsqueeze", [idx, _i64(ctx, [-1], "axes")])
    ctx.set_output(op.outputs[0], ctx.emit1("GatherND", [ctx.nhwc(params), idx], batch_dims=batch_dims))


@CONVERTERS.register("GATHER_ND")
def _gather_nd(ctx, op) -> None:
    params, indices = op.inputs[:2]
    ctx.set_output(op.outputs[0], ctx.emit1("GatherND", [ctx.nhwc(params), _as_i64(ctx, indices)]))


@CONVERTERS.register("EMBEDDING_LOOKUP")
def _embedding_lookup(ctx, op) -> None:
    ids, table = op.inputs[:2]
    ctx.set_output(op.outputs[0], ctx.emit1("Gather", [ctx.nhwc(table), _as_i64(ctx, ids)], axis=0))


@CONVERTERS.register("SCATTER_ND")
def _scatter_nd(ctx, op) -> None:
    indices, updates, shape = op.inputs[:3]
    dtype = ctx.tensor(op.outputs[0]).dtype
    from onnx import numpy_helper

    zeros = ctx.emit1("ConstantOfShape", [_as_i64(ctx, shape)],
                      value=numpy_helper.from_array(np.zeros((1,), dtype)))
    # LiteRT adds the updates of repeated indices
    ctx.set_output(op.outputs[0], ctx.emit1("ScatterND", [zeros, _as_i64(ctx, indices), ctx.nhwc(updates)],
                                            reduction="add"))


# ---------------------------------------------------------------- slices
def _slice(ctx, x: str, starts, ends, axes, steps) -> str:
    if not axes:
        return ctx.emit1("Identity", [x])
    return ctx.emit1("Slice", [x, _i64(ctx, starts, "starts"), _i64(ctx, ends, "ends"), _i64(ctx, axes, "axes"),
                               _i64(ctx, steps, "steps")])


@CONVERTERS.register("SLICE")
def _slice_op(ctx, op) -> None:
    x = op.inputs[0]
    if ctx.const(op.inputs[1]) is None or ctx.const(op.inputs[2]) is None:
        # bounds computed in the graph (a loop counter): ONNX Slice takes them as tensors, folded at import
        starts = _as_i64(ctx, op.inputs[1])
        size = _as_i64(ctx, op.inputs[2])
        ends = ctx.emit1("Where", [ctx.emit1("Equal", [size, _i64(ctx, [-1], "minus_one")]),
                                   _i64(ctx, [INT_MAX], "int_max"), ctx.emit1("Add", [starts, size])])
        n = ctx.shape(op.inputs[1])[0]
        y = ctx.emit1("Slice", [ctx.nhwc(x), starts, ends, _i64(ctx, range(n), "axes")])
        ctx.set_output(op.outputs[0], y)
        return
    begin = ctx.int_list(op.inputs[1], "begin")
    size = ctx.int_list(op.inputs[2], "size")
    name, layout, rank = _in_place(ctx, x)
    axes = [_held_axis(layout, a, rank) for a in range(len(begin))]
    ends = [INT_MAX if s < 0 else b + s for b, s in zip(begin, size)]
    ctx.set_output(op.outputs[0], _slice(ctx, name, begin, ends, axes, [1] * len(begin)), layout)


def strided_slice_spec(rank: int, begin: Sequence[int], end: Sequence[int], strides: Sequence[int], opts: dict):
    """TensorFlow's strided slice as ONNX pieces: per input axis (start, end, step) to slice (None: whole axis),
    then the output's rank changes: ``new_axes`` (positions in the output where a size-1 axis appears) and
    ``shrink`` (input axes dropped). ``offset``: ``end`` counts from ``begin``."""
    n = len(begin)
    bit = lambda mask, i: bool((int(opts.get(mask, 0) or 0) >> i) & 1)       # noqa: E731
    if opts.get("offset"):
        end = [b + e for b, e in zip(begin, end)]
    ellipsis = next((i for i in range(n) if bit("ellipsis_mask", i)), None)
    real = sum(1 for i in range(n) if i != ellipsis and not bit("new_axis_mask", i))
    cuts: List[Optional[Tuple[int, int, int]]] = []
    out_axes: List[str] = []          # per output axis before shrinking: "in" (an input axis) or "new"
    shrink: List[int] = []
    d = 0
    for i in range(n):
        if i == ellipsis:
            for _ in range(max(rank - real, 0)):
                cuts.append(None)
                out_axes.append("in")
                d += 1
            continue
        if bit("new_axis_mask", i):
            out_axes.append("new")
            continue
        s = int(strides[i])
        if s == 0:
            raise ValueError("a stride of 0")
        if bit("shrink_axis_mask", i):
            b = int(begin[i])
            cuts.append((b, b + 1 if b != -1 else INT_MAX, 1))
            shrink.append(d)
        else:
            b = (INT_MAX if s < 0 else 0) if bit("begin_mask", i) else int(begin[i])
            e = (INT_MIN if s < 0 else INT_MAX) if bit("end_mask", i) else int(end[i])
            cuts.append((b, e, s))
        out_axes.append("in")
        d += 1
    while d < rank:                   # no ellipsis: the remaining axes are whole
        cuts.append(None)
        out_axes.append("in")
        d += 1
    if d != rank:
        raise ValueError("%d slice dimensions for a rank-%d input" % (d, rank))
    new_axes = [k for k, a in enumerate(out_axes) if a == "new"]
    return cuts, new_axes, shrink


@CONVERTERS.register("STRIDED_SLICE")
def _strided_slice(ctx, op) -> None:
    x = op.inputs[0]
    begin = ctx.int_list(op.inputs[1], "begin")
    end = ctx.int_list(op.inputs[2], "end")
    strides = ctx.int_list(op.inputs[3], "strides") if len(op.inputs) > 3 and op.inputs[3] >= 0 else [1] * len(begin)
    rank = ctx.rank(x)
    try:
        cuts, new_axes, shrink = strided_slice_spec(rank, begin, end, strides, op.options)
    except ValueError as exc:
        raise UnsupportedOpError("%s: %s" % (ctx.where(), exc)) from None
    if not new_axes and not shrink:
        name, layout = ctx.held(x)
    else:
        name, layout = ctx.nhwc(x), NATIVE
    parts = [(_held_axis(layout, a, rank),) + c for a, c in enumerate(cuts) if c is not None]
    y = _slice(ctx, name, [p[1] for p in parts], [p[2] for p in parts], [p[0] for p in parts],
               [p[3] for p in parts])
    if shrink:
        y = ctx.emit1("Squeeze", [y, _i64(ctx, shrink, "axes")])
    if new_axes:
        # positions counted in the output before shrinking: shift each past the shrunk input axes before it
        final: List[str] = []
        positions: List[int] = []
        k_in = 0
        total = rank + len(new_axes)
        for k in range(total):
            if k in new_axes:
                positions.append(len(final))
                final.append("new")
            else:
                if k_in not in shrink:
                    final.append("in")
                k_in += 1
        y = ctx.emit1("Unsqueeze", [y, _i64(ctx, positions, "axes")])
    ctx.set_output(op.outputs[0], y, layout)


@CONVERTERS.register("REVERSE_V2")
def _reverse(ctx, op) -> None:
    name, layout, rank = _in_place(ctx, op.inputs[0])
    axes = sorted({a + rank if a < 0 else a for a in ctx.int_list(op.inputs[1], "axes")})
    held = [_held_axis(layout, a, rank) for a in axes]
    y = _slice(ctx, name, [-1] * len(held), [INT_MIN] * len(held), held, [-1] * len(held))
    ctx.set_output(op.outputs[0], y, layout)


# ---------------------------------------------------------------- split / stack
def _split(ctx, op, x: int, sizes: List[int], axis: int) -> None:
    name, layout, rank = _in_place(ctx, x)
    outs = ctx.emit("Split", [name, _i64(ctx, sizes, "split")], outputs=len(sizes),
                    axis=_held_axis(layout, axis, rank))
    for t, o in zip(op.outputs, outs):
        ctx.set_output(t, o, layout)


@CONVERTERS.register("SPLIT")
def _split_op(ctx, op) -> None:
    axis_t, x = op.inputs[:2]
    rank = ctx.rank(x)
    axis = _axis(ctx, op, axis_t, rank)
    n = int(op.options.get("num_splits", len(op.outputs)) or len(op.outputs))
    dim = ctx.shape(x)[axis]
    if dim % n:
        raise UnsupportedOpError("%s: SPLIT of an axis of %d into %d parts" % (ctx.where(), dim, n))
    _split(ctx, op, x, [dim // n] * n, axis)


@CONVERTERS.register("SPLIT_V")
def _split_v(ctx, op) -> None:
    x, sizes_t, axis_t = op.inputs[:3]
    rank = ctx.rank(x)
    axis = _axis(ctx, op, axis_t, rank)
    sizes = ctx.int_list(sizes_t, "size_splits")
    if sizes.count(-1) == 1:        # one size left to infer: what the others leave
        sizes[sizes.index(-1)] = ctx.shape(x)[axis] - sum(s for s in sizes if s != -1)
    _split(ctx, op, x, sizes, axis)


@CONVERTERS.register("PACK")
def _pack(ctx, op) -> None:
    rank = ctx.rank(op.inputs[0]) + 1
    axis = int(op.options.get("axis", 0) or 0)
    axis = axis + rank if axis < 0 else axis
    axes = _i64(ctx, [axis], "axes")
    parts = [ctx.emit1("Unsqueeze", [ctx.nhwc(i), axes]) for i in op.inputs]
    y = ctx.emit1("Concat", parts, axis=axis) if len(parts) > 1 else parts[0]
    ctx.set_output(op.outputs[0], y)


@CONVERTERS.register("UNPACK")
def _unpack(ctx, op) -> None:
    x = op.inputs[0]
    rank = ctx.rank(x)
    axis = int(op.options.get("axis", 0) or 0)
    axis = axis + rank if axis < 0 else axis
    n = ctx.shape(x)[axis]
    parts = ctx.emit("Split", [ctx.nhwc(x), _i64(ctx, [1] * n, "split")], outputs=n, axis=axis)
    axes = _i64(ctx, [axis], "axes")
    for t, p in zip(op.outputs, parts):
        ctx.set_output(t, ctx.emit1("Squeeze", [p, axes]))


# ---------------------------------------------------------------- tiling and broadcasting
@CONVERTERS.register("TILE")
def _tile(ctx, op) -> None:
    name, layout, rank = _in_place(ctx, op.inputs[0])
    reps = ctx.int_list(op.inputs[1], "multiples")
    if layout == NCHW and rank == 4:
        reps = [reps[a] for a in (0, 3, 1, 2)]
    ctx.set_output(op.outputs[0], ctx.emit1("Tile", [name, _i64(ctx, reps, "repeats")]), layout)


@CONVERTERS.register("BROADCAST_TO")
def _broadcast_to(ctx, op) -> None:
    x, shape = op.inputs[:2]
    ctx.set_output(op.outputs[0], ctx.emit1("Expand", [ctx.nhwc(x), _as_i64(ctx, shape)]))


# ---------------------------------------------------------------- diagonals, one-hot, where
def _eye(ctx, rows: int, cols: int) -> str:
    return ctx.add_const(np.eye(rows, cols, dtype=bool), "eye")


@CONVERTERS.register("MATRIX_DIAG")
def _matrix_diag(ctx, op) -> None:
    x = op.inputs[0]
    n = ctx.shape(x)[-1]
    col = ctx.emit1("Unsqueeze", [ctx.nhwc(x), _i64(ctx, [-1], "axes")])        # (..., n, 1)
    zero = ctx.add_const(np.zeros((), ctx.tensor(x).dtype), "zero")
    ctx.set_output(op.outputs[0], ctx.emit1("Where", [_eye(ctx, n, n), col, zero]))


@CONVERTERS.register("MATRIX_SET_DIAG")
def _matrix_set_diag(ctx, op) -> None:
    x, diag = op.inputs[:2]
    rows, cols = ctx.shape(x)[-2:]
    d = ctx.nhwc(diag)
    k = ctx.shape(diag)[-1]
    if k < cols:        # one value per column, so that row i reads its diagonal value at column i
        pads = [0] * (2 * ctx.rank(diag))
        pads[2 * ctx.rank(diag) - 1] = cols - k
        d = ctx.emit1("Pad", [d, _i64(ctx, pads, "pads")])
    row = ctx.emit1("Unsqueeze", [d, _i64(ctx, [-2], "axes")])                  # (..., 1, cols)
    ctx.set_output(op.outputs[0], ctx.emit1("Where", [_eye(ctx, rows, cols), row, ctx.nhwc(x)]))


@CONVERTERS.register("ONE_HOT")
def _one_hot(ctx, op) -> None:
    indices, depth, on, off = op.inputs[:4]
    axis = int(op.options.get("axis", -1))
    values = ctx.emit1("Concat", [ctx.emit1("Reshape", [ctx.nhwc(v), _i64(ctx, [1], "one")]) for v in (off, on)],
                       axis=0)
    d = ctx.emit1("Reshape", [_as_i64(ctx, depth), _i64(ctx, [1], "one")])
    ctx.set_output(op.outputs[0], ctx.emit1("OneHot", [_as_i64(ctx, indices), d, values], axis=axis))


@CONVERTERS.register("UNIQUE")
def _unique(ctx, op) -> None:
    """The distinct values in order of first appearance (a data-dependent count: only a graph output can take
    them) and, per element, the position of its value among them."""
    x = op.inputs[0]
    outs = ctx.emit("Unique", [ctx.nhwc(x)], outputs=4, sorted=0)
    ctx.set_output(op.outputs[0], outs[0])
    if len(op.outputs) > 1 and op.outputs[1] >= 0:
        dtype = ctx.tensor(op.outputs[1]).dtype
        idx = outs[2] if dtype == "int64" else ctx.emit1("Cast", [outs[2]], to=onnx_dtype(dtype))
        ctx.set_output(op.outputs[1], idx)


@CONVERTERS.register("WHERE")
def _where(ctx, op) -> None:
    # the coordinates of the true elements, one row each: a data-dependent count, so only a constant condition
    # (folded at import) has a static shape to compile for
    const = ctx.const(op.inputs[0])
    if const is None:
        raise UnsupportedOpError("%s: WHERE with one input returns as many rows as true elements, a shape known "
                                 "only at run time; tether compiles static shapes" % ctx.where())
    ctx.set_const(op.outputs[0], np.argwhere(const).astype(ctx.tensor(op.outputs[0]).dtype))


@CONVERTERS.register("REVERSE_SEQUENCE")
def _reverse_sequence(ctx, op) -> None:
    """Each batch row's first ``length`` steps reversed: constant lengths make ONNX's ReverseSequence; run-time
    ones a GatherElements along the time axis from positions computed in the graph."""
    x, lengths = op.inputs[:2]
    rank = ctx.rank(x)
    seq = int(op.options.get("seq_dim", 0) or 0) % rank
    batch = int(op.options.get("batch_dim", 0) or 0) % rank
    # batch and time axes first (ONNX takes them among the first two), and back after
    perm = [batch, seq] + [a for a in range(rank) if a not in (batch, seq)]
    inverse = [perm.index(a) for a in range(rank)]
    value = ctx.nhwc(x)
    if perm != list(range(rank)):
        value = ctx.emit1("Transpose", [value], perm=perm)
    lens = _as_i64(ctx, lengths)
    if ctx.const(lengths) is not None:
        y = ctx.emit1("ReverseSequence", [value, lens], batch_axis=0, time_axis=1)
    else:
        shape = [ctx.shape(x)[a] for a in perm]
        steps = ctx.add_const(np.arange(shape[1], dtype=np.int64)[None, :], "steps")           # (1, T)
        n = ctx.emit1("Reshape", [lens, _i64(ctx, [-1, 1], "column")])                        # (B, 1)
        flipped = ctx.emit1("Sub", [ctx.emit1("Sub", [n, ctx.add_const(np.array(1, np.int64), "one")]), steps])
        src = ctx.emit1("Where", [ctx.emit1("Less", [steps, n]), flipped, steps])              # (B, T)
        src = ctx.emit1("Reshape", [src, _i64(ctx, shape[:2] + [1] * (rank - 2), "shape")])
        src = ctx.emit1("Expand", [src, _i64(ctx, shape, "shape")])
        y = ctx.emit1("GatherElements", [value, src], axis=1)
    if perm != list(range(rank)):
        y = ctx.emit1("Transpose", [y], perm=inverse)
    ctx.set_output(op.outputs[0], y)


@CONVERTERS.register("SPARSE_TO_DENSE")
def _sparse_to_dense(ctx, op) -> None:
    indices_t, shape_t, values_t, default_t = op.inputs[:4]
    indices = ctx.const(indices_t)
    if indices is None:
        raise UnsupportedOpError("%s: indices computed at run time (tether needs them constant)" % ctx.where())
    shape = ctx.int_list(shape_t, "output_shape")
    # a scalar or a vector of indices addresses a 1-D output: one index per row
    indices = np.asarray(indices, np.int64)
    if indices.ndim < 2:
        indices = indices.reshape(-1, 1)
    base = ctx.emit1("Expand", [ctx.nhwc(default_t), _i64(ctx, shape, "shape")])
    values = ctx.nhwc(values_t)
    if ctx.rank(values_t) == 0 or ctx.shape(values_t) == [1] and indices.shape[0] != 1:
        values = ctx.emit1("Expand", [ctx.emit1("Reshape", [values, _i64(ctx, [1], "one")]),
                                      _i64(ctx, [indices.shape[0]], "count")])
    ctx.set_output(op.outputs[0], ctx.emit1("ScatterND", [base, ctx.add_const(indices, "indices"), values]))


@CONVERTERS.register("DYNAMIC_UPDATE_SLICE")
def _dynamic_update_slice(ctx, op) -> None:
    x, update, start_t = op.inputs[:3]
    shape, ushape = ctx.shape(x), ctx.shape(update)
    start = ctx.int_list(start_t, "start_indices")
    # as LiteRT: each start is clamped so that the update fits inside the operand
    start = [min(max(s, 0), d - u) for s, d, u in zip(start, shape, ushape)]
    grid = np.stack(np.meshgrid(*[np.arange(s, s + u) for s, u in zip(start, ushape)], indexing="ij"), -1)
    ctx.set_output(op.outputs[0], ctx.emit1("ScatterND", [ctx.nhwc(x), ctx.add_const(grid.astype(np.int64),
                                                                                      "indices"), ctx.nhwc(update)]))


@CONVERTERS.register("RANK")
def _rank(ctx, op) -> None:
    ctx.set_const(op.outputs[0], np.array(ctx.rank(op.inputs[0]), ctx.tensor(op.outputs[0]).dtype))


@CONVERTERS.register("BROADCAST_ARGS")
def _broadcast_args(ctx, op) -> None:
    a, b = (ctx.const(i) for i in op.inputs[:2])
    dtype = ctx.tensor(op.outputs[0]).dtype
    if a is not None and b is not None:
        ctx.set_const(op.outputs[0], np.array(np.broadcast_shapes(tuple(a.tolist()), tuple(b.tolist())), dtype))
        return
    # the shape of a zero tensor of each shape added together; it folds once the shapes are known
    from onnx import numpy_helper

    zero = numpy_helper.from_array(np.zeros((1,), np.float32))
    total = ctx.emit1("Add", [ctx.emit1("ConstantOfShape", [_as_i64(ctx, i)], value=zero) for i in op.inputs[:2]])
    y = ctx.emit1("Shape", [total])
    ctx.set_output(op.outputs[0], y if dtype == "int64" else ctx.emit1("Cast", [y], to=onnx_dtype(dtype)))
