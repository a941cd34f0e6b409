"""Shapes, copies, slices, joins, gathers, casts and constants.

Ops that only move data along one axis (Split, Slice, Pad, Tile, Cast, Concat of same-layout values) keep an
NCHW-stored input so, addressing its axes where they lie; the others work on TensorFlow's layout.
"""
from __future__ import annotations

from typing import Dict, List, Optional

import numpy as np
from onnx import numpy_helper

from tether.errors import UnsupportedOpError
from tether.frontend.tensorflow.graph import TFNode
from tether.frontend.tensorflow.ops_math import broadcast_operands
from tether.frontend.tensorflow.tensors import tensor_value
from tether.frontend.tensorflow.translate import (NCHW, ONNX_TYPES, Converter, Translator, Value, inverse,
                                                  node_dtype, require_const)

_BIG = np.iinfo(np.int64).max


def _ints(node: TFNode, v: Value, what: str) -> List[int]:
    return [int(a) for a in np.asarray(require_const(node, v, what)).reshape(-1)]


def _passthrough(t: Translator, node: TFNode, ins: List[Value]) -> List[Value]:
    return list(ins)


def _const(t: Translator, node: TFNode, ins: List[Value]) -> List[Value]:
    if "value" not in node.tensors:
        raise UnsupportedOpError("node %s (Const): no value" % node.name)
    return [t.constant(tensor_value(node.tensors["value"], "node %s (Const)" % node.name))]


def _placeholder_with_default(t: Translator, node: TFNode, ins: List[Value]) -> List[Value]:
    return [ins[0]]


def _known(shape) -> bool:
    return shape is not None and all(d is not None for d in shape)


def _reshape(t: Translator, node: TFNode, ins: List[Value]) -> List[Value]:
    x, s = ins
    if s.const is not None:
        shape = [int(d) for d in s.const.reshape(-1)]
        if x.const is not None:
            return [t.constant(x.const.reshape(shape))]
        if 0 in shape:
            raise UnsupportedOpError("node %s (Reshape): a dimension of size 0" % node.name)
        out_shape = tuple(shape) if -1 not in shape else None
        if out_shape is None and _known(x.shape):
            out_shape = np.empty(x.shape, dtype=np.bool_).reshape(shape).shape
        out_shape = out_shape or tuple(None if d == -1 else d for d in shape)
        if len(shape) == 4 and shape[1] == shape[2] == 1:
            # [N, 1, 1, C] (a squeeze-and-excite vector on its way to a 1x1 convolution) has the same bytes as
            # [N, C, 1, 1]: stored NCHW at no cost, it needs no transpose before the convolution
            out = t.emit1("Reshape", [t.tf(x), t.ints([shape[0], shape[3], 1, 1])])
            return [t.out(out, shape=out_shape, perm=NCHW, dtype=x.dtype)]
        return [t.out(t.emit1("Reshape", [t.tf(x), t.ints(shape)]), shape=out_shape, dtype=x.dtype)]
    sn = t.emit1("Cast", [t.tf(s)], to=7)
    rank = s.shape[0] if s.shape is not None and len(s.shape) == 1 else None
    return [t.out(t.emit1("Reshape", [t.tf(x), sn]), shape=None if rank is None else (None,) * rank,
                  dtype=x.dtype)]


def _squeeze(t: Translator, node: TFNode, ins: List[Value]) -> List[Value]:
    x = ins[0]
    axes = [int(a) for a in (node.attr("squeeze_dims") or node.attr("axis") or [])]
    if x.const is not None:
        return [t.constant(np.squeeze(x.const, axis=tuple(axes)) if axes else np.squeeze(x.const))]
    shape = None
    if axes and x.shape is not None:
        drop = {a % len(x.shape) for a in axes}
        shape = tuple(d for i, d in enumerate(x.shape) if i not in drop)
    elif _known(x.shape):
        shape = tuple(d for d in x.shape if d != 1)
    inputs = [t.tf(x)] + ([t.ints(axes)] if axes else [])
    return [t.out(t.emit1("Squeeze", inputs), shape=shape, dtype=x.dtype)]


def _expand_dims(t: Translator, node: TFNode, ins: List[Value]) -> List[Value]:
    x, a = ins
    axis = _ints(node, a, "axis")[0]
    if x.const is not None:
        return [t.constant(np.expand_dims(x.const, axis))]
    shape = None
    if x.shape is not None:
        pos = axis if axis >= 0 else len(x.shape) + 1 + axis
        shape = x.shape[:pos] + (1,) + x.shape[pos:]
    return [t.out(t.emit1("Unsqueeze", [t.tf(x), t.ints([axis])]), shape=shape, dtype=x.dtype)]


def _concat(t: Translator, node: TFNode, ins: List[Value]) -> List[Value]:
    if node.op == "Concat":
        axis_v, values = ins[0], ins[1:]
    else:
        values, axis_v = ins[:-1], ins[-1]
    axis = _ints(node, axis_v, "axis")[0]
    values = [v for v in values if v.const is None or v.const.size or len(values) == 1]
    if all(v.const is not None for v in values):
        return [t.constant(np.concatenate([v.const for v in values], axis=axis))]
    if len(values) == 1:
        return values
    names, perm = broadcast_operands(t, values) if all(v.rank == values[0].rank for v in values) else \
        ([t.tf(v) for v in values], None)
    rank = next((v.rank for v in values if v.rank is not None), None)
    if perm is not None:
        axis = perm.index(axis % len(perm))
    shape = None
    if rank is not None and all(v.shape is not None for v in values):
        ax = axis if perm is None else perm[axis]
        dims = [v.shape[ax % rank] for v in values]
        shape = list(values[0].shape)
        shape[ax % rank] = None if None in dims else sum(dims)
        shape = tuple(shape)
    return [t.out(t.emit1("Concat", names, axis=axis), shape=shape, perm=perm, dtype=values[0].dtype)]


def _pack(t: Translator, node: TFNode, ins: List[Value]) -> List[Value]:
    axis = int(node.attr("axis", 0))
    if all(v.const is not None for v in ins):
        return [t.constant(np.stack([v.const for v in ins], axis=axis))]
    parts = [t.emit1("Unsqueeze", [t.tf(v), t.ints([axis])]) for v in ins]
    out = parts[0] if len(parts) == 1 else t.emit1("Concat", parts, axis=axis)
    shape = None
    if ins[0].shape is not None:
        pos = axis if axis >= 0 else len(ins[0].shape) + 1 + axis
        shape = ins[0].shape[:pos] + (len(ins),) + ins[0].shape[pos:]
    value = t.out(out, shape=shape, dtype=ins[0].dtype)
    if all(v.rank == 0 for v in ins) and value.dtype is not None and np.issubdtype(value.dtype, np.integer):
        value.elements = [None if v.const is None else int(v.const) for v in ins]
    return [value]


def _split_outputs(t: Translator, x: Value, axis: int, sizes: Optional[List[int]], n: int) -> List[Value]:
    onnx_axis = t.onnx_axis(x, axis) if x.perm is not None else axis
    inputs = [t.name(x)] + ([t.ints(sizes)] if sizes is not None else [])
    attrs = {} if sizes is not None else {"num_outputs": n}
    outs = t.emit("Split", inputs, n, axis=onnx_axis, **attrs)
    shapes: List[Optional[tuple]] = [None] * n
    if x.shape is not None:
        ax = axis % len(x.shape)
        for k in range(n):
            s = list(x.shape)
            s[ax] = sizes[k] if sizes is not None else (None if s[ax] is None else s[ax] // n)
            shapes[k] = tuple(s)
    return [t.out(o, shape=shapes[k], perm=x.perm, dtype=x.dtype) for k, o in enumerate(outs)]


def _split(t: Translator, node: TFNode, ins: List[Value]) -> List[Value]:
    axis_v, x = ins
    axis, n = _ints(node, axis_v, "split_dim")[0], int(node.attr("num_split"))
    if x.const is not None:
        return [t.constant(a) for a in np.split(x.const, n, axis=axis)]
    return _split_outputs(t, x, axis, None, n)


def _split_v(t: Translator, node: TFNode, ins: List[Value]) -> List[Value]:
    x, sizes_v, axis_v = ins
    sizes, axis = _ints(node, sizes_v, "size_splits"), _ints(node, axis_v, "split_dim")[0]
    if -1 in sizes:
        dim = None if x.shape is None else x.shape[axis % len(x.shape)]
        if dim is None:
            raise UnsupportedOpError("node %s (SplitV): a size of -1 on an axis of unknown length" % node.name)
        sizes[sizes.index(-1)] = dim - (sum(sizes) + 1)
    if x.const is not None:
        return [t.constant(a) for a in np.split(x.const, np.cumsum(sizes)[:-1], axis=axis)]
    return _split_outputs(t, x, axis, sizes, len(sizes))


def _unpack(t: Translator, node: TFNode, ins: List[Value]) -> List[Value]:
    x = ins[0]
    axis, n = int(node.attr("axis", 0)), int(node.attr("num"))
    if x.const is not None:
        return [t.constant(a) for a in np.moveaxis(x.const, axis, 0)]
    parts = _split_outputs(t, Value(t.tf(x), None, x.shape, None, x.dtype), axis, None, n)
    out = []
    for p in parts:
        shape = None
        if p.shape is not None:
            shape = tuple(d for i, d in enumerate(p.shape) if i != axis % len(p.shape))
        out.append(t.out(t.emit1("Squeeze", [p.name, t.ints([axis])]), shape=shape, dtype=x.dtype))
    return out


def _pad(t: Translator, node: TFNode, ins: List[Value]) -> List[Value]:
    x, p = ins[:2]
    pads = np.asarray(require_const(node, p, "paddings"), dtype=np.int64).reshape(-1, 2)
    mode = node.attr("mode", "CONSTANT").upper() if node.op == "MirrorPad" else "CONSTANT"
    value = ins[2] if node.op == "PadV2" else None
    if x.const is not None and (value is None or value.const is not None):
        kw = {"constant_values": value.const} if value is not None else {}
        return [t.constant(np.pad(x.const, pads, mode={"CONSTANT": "constant", "REFLECT": "reflect",
                                                        "SYMMETRIC": "symmetric"}[mode], **kw))]
    shape = None
    if x.shape is not None:
        shape = tuple(None if d is None else d + int(pads[i].sum()) for i, d in enumerate(x.shape))
    if mode == "SYMMETRIC":
        return [t.out(_symmetric_pad(t, t.tf(x), pads), shape=shape, dtype=x.dtype)]
    order = x.perm or tuple(range(len(pads)))
    onnx_pads = [int(pads[a, 0]) for a in order] + [int(pads[a, 1]) for a in order]
    inputs = [t.name(x), t.ints(onnx_pads)]
    if value is not None:
        inputs.append(t.tf(Value(None, np.asarray(value.const).reshape(()), (), None, value.const.dtype))
                      if value.const is not None else t.tf(value))
    mode_name = {"CONSTANT": "constant", "REFLECT": "reflect"}.get(mode)
    if mode_name is None:
        raise UnsupportedOpError("node %s (%s): mode %r" % (node.name, node.op, mode))
    return [t.out(t.emit1("Pad", inputs, mode=mode_name), shape=shape, perm=x.perm, dtype=x.dtype)]


def _symmetric_pad(t: Translator, x: str, pads: np.ndarray) -> str:
    """SYMMETRIC mirrors including the edge (ONNX has no such mode): reversed slices joined around each axis."""
    for axis, (before, after) in enumerate(pads):
        parts = []
        if before:
            parts.append(t.emit1("Slice", [x, t.ints([before - 1]), t.ints([-_BIG]), t.ints([axis]), t.ints([-1])]))
        parts.append(x)
        if after:
            parts.append(t.emit1("Slice", [x, t.ints([-1]), t.ints([-int(after) - 1]), t.ints([axis]),
                                           t.ints([-1])]))
        if len(parts) > 1:
            x = t.emit1("Concat", parts, axis=axis)
    return x


def _transpose(t: Translator, node: TFNode, ins: List[Value]) -> List[Value]:
    x, p = ins
    perm = tuple(_ints(node, p, "perm"))
    if x.const is not None:
        return [t.constant(np.transpose(x.const, perm))]
    have = x.perm or tuple(range(len(perm)))
    # stored = transpose(tf_x, have); wanted = transpose(tf_x, perm) = transpose(stored, inverse(have)[perm])
    inv = inverse(have)
    rel = [inv[q] for q in perm]
    shape = None if x.shape is None else tuple(x.shape[q] for q in perm)
    if rel == list(range(len(perm))):
        return [t.out(t.name(x), shape=shape, dtype=x.dtype)]
    return [t.out(t.emit1("Transpose", [t.name(x)], perm=rel), shape=shape, dtype=x.dtype)]


def _strided_slice(t: Translator, node: TFNode, ins: List[Value]) -> List[Value]:
    x = ins[0]
    begin, end, strides = (_ints(node, v, w) for v, w in zip(ins[1:4], ("begin", "end", "strides")))
    masks = {k: int(node.attr(k, 0)) for k in ("begin_mask", "end_mask", "ellipsis_mask", "new_axis_mask",
                                               "shrink_axis_mask")}
    n_sparse = len(begin)
    rank = x.rank
    if masks["ellipsis_mask"] and rank is None:
        raise UnsupportedOpError("node %s (StridedSlice): an ellipsis on a value of unknown rank" % node.name)
    # expand the sparse spec to one entry per input axis, plus the new axes
    spec = []        # (kind, begin, end, stride, begin_masked, end_masked); kind: "slice", "shrink", "new"
    real = sum(1 for i in range(n_sparse) if not (masks["new_axis_mask"] >> i) & 1
               and not (masks["ellipsis_mask"] >> i) & 1)
    for i in range(n_sparse):
        bit = 1 << i
        if masks["ellipsis_mask"] & bit:
            spec += [("slice", 0, 0, 1, True, True)] * (rank - real)
        elif masks["new_axis_mask"] & bit:
            spec.append(("new", 0, 0, 1, True, True))
        elif masks["shrink_axis_mask"] & bit:
            spec.append(("shrink", begin[i], 0, 1, False, False))
        else:
            spec.append(("slice", begin[i], end[i], strides[i], bool(masks["begin_mask"] & bit),
                         bool(masks["end_mask"] & bit)))
    starts, ends, axes, steps, shrink, out_new = [], [], [], [], [], []
    axis = 0
    out_pos = 0
    for kind, b, e, s, bm, em in spec:
        if kind == "new":
            out_new.append(out_pos)
            out_pos += 1
            continue
        if kind == "shrink":
            starts.append(b)
            ends.append(b + 1 if b != -1 else _BIG)
            steps.append(1)
            axes.append(axis)
            shrink.append(axis)
        else:
            if s == 0:
                raise UnsupportedOpError("node %s (StridedSlice): a stride of 0" % node.name)
            if not (bm and em and s == 1):
                starts.append((0 if s > 0 else _BIG) if bm else b)
                ends.append((_BIG if s > 0 else -_BIG) if em else e)
                steps.append(s)
                axes.append(axis)
            out_pos += 1
        axis += 1
    if x.const is not None:
        out = x.const
        idx = [slice(None)] * out.ndim
        for st, en, ax, sp in zip(starts, ends, axes, steps):
            idx[ax] = slice(st if abs(st) < _BIG else None, en if abs(en) < _BIG else None, sp)
        out = out[tuple(idx)]
        if shrink:
            out = out.reshape([d for i, d in enumerate(out.shape) if i not in shrink])
        for pos in out_new:
            out = np.expand_dims(out, pos)
        return [t.constant(out)]
    y = t.tf(x)
    if axes:
        y = t.emit1("Slice", [y, t.ints(starts), t.ints(ends), t.ints(axes), t.ints(steps)])
    if shrink:
        y = t.emit1("Squeeze", [y, t.ints(shrink)])
    if out_new:
        y = t.emit1("Unsqueeze", [y, t.ints(out_new)])
    # input axes past the spec are kept whole
    out_rank = None if rank is None else rank - len(shrink) + len(out_new)
    shape = None if out_rank is None else (None,) * out_rank
    if x.shape is not None:
        dims: List[Optional[int]] = list(x.shape)
        for st, en, ax, sp in zip(starts, ends, axes, steps):
            if dims[ax] is not None:
                dims[ax] = len(range(dims[ax])[slice(st if abs(st) < _BIG else None, en if abs(en) < _BIG else None,
                                                     sp)])
        dims = [d for i, d in enumerate(dims) if i not in shrink]
        for pos in out_new:
            dims.insert(pos, 1)
        shape = tuple(dims)
    return [t.out(y, shape=shape, dtype=x.dtype)]


def _slice(t: Translator, node: TFNode, ins: List[Value]) -> List[Value]:
    x = ins[0]
    begin, size = _ints(node, ins[1], "begin"), _ints(node, ins[2], "size")
    ends = [_BIG if s == -1 else b + s for b, s in zip(begin, size)]
    if x.const is not None:
        return [t.constant(x.const[tuple(slice(b, None if e == _BIG else e) for b, e in zip(begin, ends))])]
    axes = [t.onnx_axis(x, a) for a in range(len(begin))]
    shape = None
    if x.shape is not None:
        shape = tuple(d if s == -1 and d is None else (d - b if s == -1 else s)
                      for d, b, s in zip(x.shape, begin, size))
    out = t.emit1("Slice", [t.name(x), t.ints(begin), t.ints(ends), t.ints(axes)])
    return [t.out(out, shape=shape, perm=x.perm, dtype=x.dtype)]


def _gather(t: Translator, node: TFNode, ins: List[Value]) -> List[Value]:
    params, indices = ins[:2]
    axis = _ints(node, ins[2], "axis")[0] if len(ins) > 2 else 0
    if int(node.attr("batch_dims", 0)):
        raise UnsupportedOpError("node %s (%s): batch_dims=%d" % (node.name, node.op, node.attr("batch_dims")))
    if params.const is not None and indices.const is not None:
        return [t.constant(np.take(params.const, indices.const, axis=axis))]
    shape = None
    if params.shape is not None and indices.shape is not None:
        ax = axis % len(params.shape)
        shape = params.shape[:ax] + tuple(indices.shape) + params.shape[ax + 1:]
    return [t.out(t.emit1("Gather", [t.tf(params), t.tf(indices)], axis=axis), shape=shape, dtype=params.dtype)]


def _gather_nd(t: Translator, node: TFNode, ins: List[Value]) -> List[Value]:
    params, indices = ins
    idx = t.emit1("Cast", [t.tf(indices)], to=7)
    return [t.out(t.emit1("GatherND", [t.tf(params), idx]), dtype=params.dtype)]


def _shape(t: Translator, node: TFNode, ins: List[Value]) -> List[Value]:
    x = ins[0]
    dtype = node_dtype(node, "out_type") or np.dtype(np.int32)
    if _known(x.shape):
        return [t.constant(np.asarray(x.shape, dtype=dtype))]
    s = t.emit1("Shape", [t.name(x)])
    if x.perm is not None:
        s = t.emit1("Gather", [s, t.ints(inverse(x.perm))], axis=0)
    if dtype != np.int64:
        s = t.emit1("Cast", [s], to=ONNX_TYPES[dtype])
    return [t.out(s, shape=(x.rank,), dtype=dtype)]


def _rank(t: Translator, node: TFNode, ins: List[Value]) -> List[Value]:
    if ins[0].rank is None:
        raise UnsupportedOpError("node %s (Rank): the input's rank is unknown" % node.name)
    return [t.constant(np.asarray(ins[0].rank, dtype=np.int32))]


def _size(t: Translator, node: TFNode, ins: List[Value]) -> List[Value]:
    x = ins[0]
    dtype = node_dtype(node, "out_type") or np.dtype(np.int32)
    if _known(x.shape):
        return [t.constant(np.asarray(int(np.prod(x.shape, dtype=np.int64)), dtype=dtype))]
    s = t.emit1("ReduceProd", [t.emit1("Shape", [t.name(x)])], keepdims=0)
    return [t.out(t.emit1("Cast", [s], to=ONNX_TYPES[dtype]), shape=(), dtype=dtype)]


def _cast(t: Translator, node: TFNode, ins: List[Value]) -> List[Value]:
    x = ins[0]
    dtype = node_dtype(node, "DstT")
    if x.const is not None:
        return [t.constant(x.const.astype(dtype))]
    return [t.out(t.emit1("Cast", [t.name(x)], to=ONNX_TYPES[dtype]), like=x, perm=x.perm, dtype=dtype)]


def _fill(t: Translator, node: TFNode, ins: List[Value]) -> List[Value]:
    dims, value = ins
    if dims.const is not None and value.const is not None:
        return [t.constant(np.full([int(d) for d in dims.const], value.const, dtype=value.const.dtype))]
    d = t.emit1("Cast", [t.tf(dims)], to=7)
    return [t.out(t.emit1("Expand", [t.tf(value), d]), dtype=value.dtype)]


def _like(fill: int) -> Converter:
    def convert(t: Translator, node: TFNode, ins: List[Value]) -> List[Value]:
        x = ins[0]
        dtype = x.dtype or node_dtype(node) or np.dtype(np.float32)
        if _known(x.shape):
            return [t.constant(np.full(x.shape, fill, dtype=dtype))]
        value = numpy_helper.from_array(np.asarray([fill], dtype=dtype), "value")
        out = t.emit1("ConstantOfShape", [t.emit1("Shape", [t.name(x)])], value=value)
        return [t.out(out, like=x, perm=x.perm, dtype=dtype)]
    return convert


def _tile(t: Translator, node: TFNode, ins: List[Value]) -> List[Value]:
    x, m = ins
    if m.const is not None:
        mult = [int(v) for v in m.const.reshape(-1)]
        if x.const is not None:
            return [t.constant(np.tile(x.const, mult))]
        order = x.perm or tuple(range(len(mult)))
        shape = None if x.shape is None else tuple(None if d is None else d * k for d, k in zip(x.shape, mult))
        return [t.out(t.emit1("Tile", [t.name(x), t.ints([mult[a] for a in order])]), shape=shape, perm=x.perm,
                      dtype=x.dtype)]
    return [t.out(t.emit1("Tile", [t.tf(x), t.emit1("Cast", [t.tf(m)], to=7)]), dtype=x.dtype)]


def _range(t: Translator, node: TFNode, ins: List[Value]) -> List[Value]:
    dtype = node_dtype(node, "Tidx") or ins[0].dtype
    if all(v.const is not None for v in ins):
        return [t.constant(np.arange(ins[0].const, ins[1].const, ins[2].const).astype(dtype))]
    return [t.out(t.emit1("Range", [t.tf(v) for v in ins]), dtype=dtype)]


def _top_k(t: Translator, node: TFNode, ins: List[Value]) -> List[Value]:
    x, k = ins
    kk = t.emit1("Reshape", [t.emit1("Cast", [t.tf(k)], to=7), t.ints([1])])
    values, indices = t.emit("TopK", [t.tf(x), kk], 2, axis=-1, largest=1, sorted=1)
    idx_type = node_dtype(node, "index_type") or np.dtype(np.int32)
    if idx_type != np.int64:
        indices = t.emit1("Cast", [indices], to=ONNX_TYPES[idx_type])
    return [t.out(values, dtype=x.dtype), t.out(indices, dtype=idx_type)]


def _one_hot(t: Translator, node: TFNode, ins: List[Value]) -> List[Value]:
    indices, depth, on, off = ins
    axis = int(node.attr("axis", -1))
    values = t.emit1("Concat", [t.emit1("Reshape", [t.tf(off), t.ints([1])]),
                                t.emit1("Reshape", [t.tf(on), t.ints([1])])], axis=0)
    d = t.emit1("Reshape", [t.emit1("Cast", [t.tf(depth)], to=7), t.ints([1])])
    return [t.out(t.emit1("OneHot", [t.tf(indices), d, values], axis=axis), dtype=on.dtype)]


def _cumsum(t: Translator, node: TFNode, ins: List[Value]) -> List[Value]:
    x, axis_v = ins
    axis = _ints(node, axis_v, "axis")[0]
    exclusive, reverse = int(bool(node.attr("exclusive", False))), int(bool(node.attr("reverse", False)))
    onnx_axis = t.onnx_axis(x, axis) if x.perm is not None else axis
    out = t.emit1("CumSum", [t.name(x), t.ints([onnx_axis])], exclusive=exclusive, reverse=reverse)
    return [t.out(out, like=x, perm=x.perm)]


def _reverse(t: Translator, node: TFNode, ins: List[Value]) -> List[Value]:
    x, axes_v = ins
    axes = _ints(node, axes_v, "axis")
    if x.const is not None:
        return [t.constant(np.flip(x.const, axis=tuple(axes)) if axes else x.const)]
    if not axes:
        return [x]
    onnx_axes = [t.onnx_axis(x, a) for a in axes] if x.perm is not None else axes
    n = len(axes)
    out = t.emit1("Slice", [t.name(x), t.ints([-1] * n), t.ints([-_BIG] * n), t.ints(onnx_axes), t.ints([-1] * n)])
    return [t.out(out, like=x, perm=x.perm)]


def _broadcast_to(t: Translator, node: TFNode, ins: List[Value]) -> List[Value]:
    x, s = ins
    if x.const is not None and s.const is not None:
        return [t.constant(np.broadcast_to(x.const, [int(d) for d in s.const]).copy())]
    shape = t.ints([int(d) for d in s.const]) if s.const is not None else t.emit1("Cast", [t.tf(s)], to=7)
    out_shape = tuple(int(d) for d in s.const) if s.const is not None else None
    return [t.out(t.emit1("Expand", [t.tf(x), shape]), shape=out_shape, dtype=x.dtype)]


def _variable(t: Translator, node: TFNode, ins: List[Value]) -> List[Value]:
    value = t.resources.get(node.name)
    if value is None:
        raise UnsupportedOpError("node %s (%s): the variable has no value in the SavedModel's checkpoint"
                                 % (node.name, node.op))
    return [t.constant(value)]


def _read_variable(t: Translator, node: TFNode, ins: List[Value]) -> List[Value]:
    return [ins[0]]


CONVERTERS: Dict[str, Converter] = {
    "Identity": _passthrough,
    "IdentityN": _passthrough,
    "StopGradient": _passthrough,
    "PreventGradient": _passthrough,
    "Snapshot": _passthrough,
    "EnsureShape": _passthrough,
    "CheckNumerics": _passthrough,
    "Const": _const,
    "PlaceholderWithDefault": _placeholder_with_default,
    "Reshape": _reshape,
    "Squeeze": _squeeze,
    "ExpandDims": _expand_dims,
    "ConcatV2": _concat,
    "Concat": _concat,
    "Pack": _pack,
    "Unpack": _unpack,
    "Split": _split,
    "SplitV": _split_v,
    "Pad": _pad,
    "PadV2": _pad,
    "MirrorPad": _pad,
    "Transpose": _transpose,
    "StridedSlice": _strided_slice,
    "Slice": _slice,
    "Gather": _gather,
    "GatherV2": _gather,
    "GatherNd": _gather_nd,
    "Shape": _shape,
    "Rank": _rank,
    "Size": _size,
    "Cast": _cast,
    "Fill": _fill,
    "ZerosLike": _like(0),
    "OnesLike": _like(1),
    "Tile": _tile,
    "Range": _range,
    "TopKV2": _top_k,
    "OneHot": _one_hot,
    "Cumsum": _cumsum,
    "ReverseV2": _reverse,
    "BroadcastTo": _broadcast_to,
    "VarHandleOp": _variable,
    "VariableV2": _variable,
    "ReadVariableOp": _read_variable,
}
