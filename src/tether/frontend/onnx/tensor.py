"""Converters of ONNX ops that make, reshape or rearrange tensors: constants, shapes, slicing, concatenation,
padding, splitting, broadcasting, tiling, ranges and depth/space moves."""
from __future__ import annotations

from typing import List

import numpy as np

from tether.errors import UnsupportedOpError
from tether.frontend.onnx.importer import ConverterTable, emit_reshape, node_output, norm_axis, reshape_alias, str_attr
from tether.frontend.onnx.indexing import gather_general
from tether.graph import op_info

CONVERTERS = ConverterTable(__name__)


@CONVERTERS.register("Constant")
def _constant(im, node, ins, a):
    from onnx import numpy_helper
    if "value" in a:
        v = numpy_helper.to_array(a["value"])
    elif "value_float" in a:
        v = np.array(a["value_float"], dtype=np.float32)
    elif "value_floats" in a:
        v = np.array(a["value_floats"], dtype=np.float32)
    elif "value_int" in a:
        v = np.array(a["value_int"], dtype=np.int64)
    elif "value_ints" in a:
        v = np.array(a["value_ints"], dtype=np.int64)
    else:
        raise UnsupportedOpError("node %s: Constant with attributes %s" % (node.name, sorted(a)))
    im.add_const(v, name=node.output[0])


@CONVERTERS.register("ConstantOfShape")
def _const_of_shape(im, node, ins, a):
    from onnx import numpy_helper
    shape = im.require_const(ins[0], "ConstantOfShape shape", node.name)
    value = numpy_helper.to_array(a["value"]).reshape(-1)[0] if "value" in a else np.float32(0)
    im.add_const(np.full(tuple(int(d) for d in shape), value, dtype=np.asarray(value).dtype), name=node.output[0])


@CONVERTERS.register("Shape")
def _shape(im, node, ins, a):
    shape = np.array(im.type(ins[0]).shape, dtype=np.int64)
    start, end = a.get("start", 0), a.get("end", None)
    im.add_const(shape[start:end], name=node.output[0])


@CONVERTERS.register("Gather")
def _gather(im, node, ins, a):
    data = im.const(ins[0])
    idx = im.const(ins[1])
    axis = a.get("axis", 0)
    if idx is None:     # indices computed at run time (embedding lookups): the general gather kernel
        gather_general(im, node, ins, a)
        return
    if data is not None:
        im.add_const(np.take(data, idx.astype(np.int64), axis=axis), name=node.output[0])
        return
    t = im.type(ins[0])
    axis = norm_axis(axis, len(t.shape))
    if idx.ndim == 0:
        i = int(idx) % t.shape[axis]
        begin = [0] * len(t.shape)
        end = list(t.shape)
        begin[axis], end[axis] = i, i + 1
        y = im.emit("strided_slice", [ins[0]], {"begin": begin, "end": end, "step": [1] * len(t.shape)})
        shape = t.shape[:axis] + t.shape[axis + 1:]
        emit_reshape(im, y, shape, node.name, node.output[0])
        return
    gather_general(im, node, ins, a)


@CONVERTERS.register("Slice")
def _slice(im, node, ins, a):
    t = im.type(ins[0])
    nd = len(t.shape)
    if im.opset < 10:
        starts, ends = a["starts"], a["ends"]
        axes = a.get("axes", list(range(len(starts))))
        steps = [1] * len(starts)
    else:
        starts = im.require_const(ins[1], "Slice starts", node.name).tolist()
        ends = im.require_const(ins[2], "Slice ends", node.name).tolist()
        axes = im.require_const(ins[3], "Slice axes", node.name).tolist() if len(ins) > 3 and ins[3] \
            else list(range(len(starts)))
        steps = im.require_const(ins[4], "Slice steps", node.name).tolist() if len(ins) > 4 and ins[4] \
            else [1] * len(starts)
    begin, end, step = [0] * nd, list(t.shape), [1] * nd
    for s, e, ax, st in zip(starts, ends, axes, steps):
        ax = norm_axis(int(ax), nd)
        b, e2, _ = slice(int(s), int(e), int(st)).indices(t.shape[ax])
        begin[ax], end[ax], step[ax] = b, e2, int(st)
    c = im.const(ins[0])
    if c is not None:
        sl = tuple(slice(b, e if e >= 0 else None, s) for b, e, s in zip(begin, end, step))
        im.add_const(c[sl], name=node.output[0])
        return
    im.emit("strided_slice", [ins[0]], {"begin": begin, "end": end, "step": step}, node.name, node_output(node))


@CONVERTERS.register("Reshape")
def _reshape_conv(im, node, ins, a):
    t = im.type(ins[0])
    if im.opset >= 5:
        shape = [int(d) for d in im.require_const(ins[1], "Reshape shape", node.name)]
    else:
        shape = list(a["shape"])
    allowzero = a.get("allowzero", 0)
    out = []
    for i, d in enumerate(shape):
        out.append(t.shape[i] if d == 0 and not allowzero else d)
    if -1 in out:
        known = int(np.prod([d for d in out if d != -1], dtype=np.int64))
        out[out.index(-1)] = t.size // known if known else 0
    im.emit("reshape", [ins[0]], {"shape": tuple(out)}, node.name, node_output(node))


@CONVERTERS.register("Flatten")
def _flatten(im, node, ins, a):
    t = im.type(ins[0])
    axis = norm_axis(a.get("axis", 1), len(t.shape))
    lead = int(np.prod(t.shape[:axis], dtype=np.int64))
    im.emit("reshape", [ins[0]], {"shape": (lead, t.size // lead if lead else 0)}, node.name, node_output(node))


def _axes_arg(im, node, ins, a) -> List[int]:
    if "axes" in a:
        return list(a["axes"])
    if len(ins) > 1 and ins[1]:
        return [int(v) for v in im.require_const(ins[1], node.op_type + " axes", node.name).reshape(-1)]
    return []


@CONVERTERS.register("Squeeze")
def _squeeze(im, node, ins, a):
    t = im.type(ins[0])
    axes = [norm_axis(x, len(t.shape)) for x in _axes_arg(im, node, ins, a)]
    if not axes:
        axes = [i for i, d in enumerate(t.shape) if d == 1]
    shape = tuple(d for i, d in enumerate(t.shape) if i not in axes)
    im.emit("reshape", [ins[0]], {"shape": shape}, node.name, node_output(node))


@CONVERTERS.register("Unsqueeze")
def _unsqueeze(im, node, ins, a):
    t = im.type(ins[0])
    axes = _axes_arg(im, node, ins, a)
    nd = len(t.shape) + len(axes)
    axes = sorted(norm_axis(x, nd) for x in axes)
    shape = list(t.shape)
    for ax in axes:
        shape.insert(ax, 1)
    im.emit("reshape", [ins[0]], {"shape": tuple(shape)}, node.name, node_output(node))


@CONVERTERS.register("Transpose")
def _transpose(im, node, ins, a):
    nd = len(im.type(ins[0]).shape)
    perm = list(a.get("perm", list(range(nd))[::-1]))
    im.emit("transpose", [ins[0]], {"axes": perm}, node.name, node_output(node))


@CONVERTERS.register("Concat")
def _concat(im, node, ins, a):
    nd = len(im.type(ins[0]).shape)
    parts = [i for i in ins if i and (im.type(i).size > 0 or nd != 1)]
    im.emit("concat", parts, {"axis": norm_axis(a["axis"], nd)}, node.name, node_output(node))


@CONVERTERS.register("Pad")
def _pad(im, node, ins, a):
    t = im.type(ins[0])
    nd = len(t.shape)
    mode = a.get("mode", b"constant")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    if im.opset < 11:
        pads = list(a.get("pads", a.get("paddings")))
        value = float(a.get("value", 0.0))
    else:
        raw = [int(v) for v in im.require_const(ins[1], "Pad pads", node.name)]
        value = 0.0
        if len(ins) > 2 and ins[2]:
            c = im.const(ins[2])
            # a one-element constant_value of shape (1,) (exporters and onnx's own function bodies write one)
            value = float(c.reshape(-1)[0]) if c is not None and c.size == 1 else emit_reshape(im, ins[2], (1,))
        if len(ins) > 3 and ins[3]:
            axes = [norm_axis(int(x), nd) for x in im.require_const(ins[3], "Pad axes", node.name)]
        else:
            axes = list(range(nd))
        pads = [0] * (2 * nd)
        for k, ax in enumerate(axes):
            pads[ax] = raw[k]
            pads[ax + nd] = raw[k + len(axes)]
    if mode == "wrap":      # a constant index map (frontend/onnx/indexmap.py)
        from tether.frontend.onnx.indexmap import pad_wrap
        pad_wrap(im, node, ins[0], pads)
        return
    if mode not in ("constant", "reflect", "edge"):
        raise UnsupportedOpError("node %s: Pad mode %r" % (node.name, mode))
    if isinstance(value, str):   # a run-time pad value
        im.emit("pad", [ins[0], value], {"pads": pads, "mode": mode}, node.name, node_output(node))
    else:
        im.emit("pad", [ins[0]], {"pads": pads, "value": value, "mode": mode}, node.name, node_output(node))

@CONVERTERS.register("Split")
def _split(im, node, ins, a):
    t = im.type(ins[0])
    nd = len(t.shape)
    axis = norm_axis(int(a.get("axis", 0)), nd)
    dim = t.shape[axis]
    outs = list(node.output)
    if im.opset >= 13:
        sizes = None
        if len(ins) > 1 and ins[1]:
            sizes = [int(v) for v in im.require_const(ins[1], "Split split", node.name).reshape(-1)]
    else:
        sizes = list(a["split"]) if "split" in a else None
    if sizes is None:
        n = int(a["num_outputs"]) if "num_outputs" in a else len(outs)
        if "num_outputs" in a and n != len(outs):
            raise UnsupportedOpError("node %s: Split num_outputs=%d but %d outputs" % (node.name, n, len(outs)))
        if im.opset >= 18:
            # equal chunks of ceil(dim / n), the last one smaller
            chunk = -(-dim // n)
            sizes = [max(0, min(chunk, dim - k * chunk)) for k in range(n)]
        else:
            if dim % n:
                raise UnsupportedOpError("node %s: Split of extent %d into %d equal parts" % (node.name, dim, n))
            sizes = [dim // n] * n
    if len(sizes) != len(outs) or sum(sizes) != dim or any(v < 0 for v in sizes):
        raise UnsupportedOpError("node %s: Split sizes %s do not cover extent %d in %d outputs"
                                 % (node.name, sizes, dim, len(outs)))
    start = 0
    c = im.const(ins[0])
    for k, (o, size) in enumerate(zip(outs, sizes)):
        begin, end = [0] * nd, list(t.shape)
        begin[axis], end[axis] = start, start + size
        start += size
        if not o:
            continue
        if c is not None:
            im.add_const(np.ascontiguousarray(c[tuple(slice(b, e) for b, e in zip(begin, end))]), name=o)
        elif size == 0:
            im.add_const(np.zeros(tuple(e - b for b, e in zip(begin, end)), dtype=t.dtype), name=o)
        elif size == dim:
            im.emit("reshape", [ins[0]], {"shape": t.shape}, node.name, [o])
        else:
            im.emit("strided_slice", [ins[0]], {"begin": begin, "end": end, "step": [1] * nd},
                    node.name + "_%d" % k, [o])


@CONVERTERS.register("Expand")
def _expand(im, node, ins, a):
    t = im.type(ins[0])
    shape = [int(d) for d in im.require_const(ins[1], "Expand shape", node.name).reshape(-1)]
    out = tuple(op_info.broadcast_shapes(t.shape, shape))   # bidirectional: a 1 in `shape` keeps x's extent
    if out == tuple(t.shape):
        reshape_alias(im, ins[0], node)
        return
    im.emit("broadcast_to", [ins[0]], {"shape": list(out)}, node.name, node_output(node))


@CONVERTERS.register("Tile")
def _tile(im, node, ins, a):
    t = im.type(ins[0])
    reps = [int(v) for v in im.require_const(ins[1], "Tile repeats", node.name).reshape(-1)]
    if len(reps) != len(t.shape) or any(r < 0 for r in reps):
        raise UnsupportedOpError("node %s: Tile repeats %s for a rank-%d input" % (node.name, reps, len(t.shape)))
    c = im.const(ins[0])
    if c is not None:
        im.add_const(np.tile(c, reps), name=node.output[0])
        return
    if all(r == 1 for r in reps):
        reshape_alias(im, ins[0], node)
        return
    # x (d0, d1, ...) tiled (r0, r1, ...) is x viewed as (1, d0, 1, d1, ...) broadcast to (r0, d0, r1, d1, ...)
    inter = [v for d in t.shape for v in (1, d)]
    full = [v for r, d in zip(reps, t.shape) for v in (r, d)]
    y = im.emit("broadcast_to", [emit_reshape(im, ins[0], inter)], {"shape": full}, node.name)
    emit_reshape(im, y, [r * d for r, d in zip(reps, t.shape)], node.name + "_merge", node.output[0])


@CONVERTERS.register("Range")
def _range(im, node, ins, a):
    values = []
    for k, what in enumerate(("start", "limit", "delta")):
        v = np.asarray(im.require_const(ins[k], "Range " + what, node.name))
        if v.size != 1:     # a scalar, or (as onnxruntime takes it) a one-element tensor
            raise UnsupportedOpError("node %s: Range %s of shape %s; expected a scalar" % (node.name, what, v.shape))
        values.append(v.reshape(()))
    start, limit, delta = values
    if delta == 0:
        raise UnsupportedOpError("node %s: Range delta is 0; expected a non-zero step" % node.name)
    dt = start.dtype
    n = max(int(np.ceil((float(limit) - float(start)) / float(delta))), 0)
    im.add_const((np.asarray(start) + np.arange(n, dtype=dt) * np.asarray(delta)).astype(dt), name=node.output[0])


@CONVERTERS.register("Size")
def _size(im, node, ins, a):
    im.add_const(np.array(im.type(ins[0]).size, dtype=np.int64), name=node.output[0])

@CONVERTERS.register("DepthToSpace")
def _depth_to_space(im, node, ins, a):
    n, c, h, w = im.type(ins[0]).shape
    b = int(a["blocksize"])
    mode = str_attr(a, "mode", "DCR")
    if c % (b * b):
        raise UnsupportedOpError("node %s: DepthToSpace of %d channels by blocksize %d" % (node.name, c, b))
    if mode == "DCR":
        x6 = emit_reshape(im, ins[0], (n, b, b, c // (b * b), h, w))
        perm = [0, 3, 4, 1, 5, 2]
    elif mode == "CRD":
        x6 = emit_reshape(im, ins[0], (n, c // (b * b), b, b, h, w))
        perm = [0, 1, 4, 2, 5, 3]
    else:
        raise UnsupportedOpError("node %s: DepthToSpace mode %r (DCR or CRD)" % (node.name, mode))
    y = im.emit("transpose", [x6], {"axes": perm}, node.name)
    emit_reshape(im, y, (n, c // (b * b), h * b, w * b), node.name + "_merge", node.output[0])


@CONVERTERS.register("SpaceToDepth")
def _space_to_depth(im, node, ins, a):
    n, c, h, w = im.type(ins[0]).shape
    b = int(a["blocksize"])
    if h % b or w % b:
        raise UnsupportedOpError("node %s: SpaceToDepth of %dx%d by blocksize %d" % (node.name, h, w, b))
    mode = str_attr(a, "mode", "DCR")
    if mode not in ("DCR", "CRD"):
        raise UnsupportedOpError("node %s: SpaceToDepth mode %r (DCR or CRD)" % (node.name, mode))
    x6 = emit_reshape(im, ins[0], (n, c, h // b, b, w // b, b))
    # DCR puts the block offsets before the channels, CRD after (the inverses of DepthToSpace's modes)
    perm = [0, 3, 5, 1, 2, 4] if mode == "DCR" else [0, 1, 3, 5, 2, 4]
    y = im.emit("transpose", [x6], {"axes": perm}, node.name)
    emit_reshape(im, y, (n, c * b * b, h // b, w // b), node.name + "_merge", node.output[0])
