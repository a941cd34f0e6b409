"""Converters of layer, instance and group normalization."""
from __future__ import annotations

import numpy as np

from tether.errors import UnsupportedOpError
from tether.frontend.onnx.importer import ConverterTable, emit_reshape, node_output, norm_axis, require_dtype

CONVERTERS = ConverterTable(__name__)


# ---------------------------------------------------------------- layer / instance / group normalization
def _stash_check(node, a, dtype: str) -> None:
    # stash_type 1 (float32 statistics) is the only kind: on float32 inputs it changes nothing
    if dtype != "float32":
        raise UnsupportedOpError("node %s: %s on %s tensors (float32 only)" % (node.name, node.op_type, dtype))
    if int(a.get("stash_type", 1)) != 1:
        raise UnsupportedOpError("node %s: %s stash_type=%d (only 1, float32)"
                                 % (node.name, node.op_type, int(a["stash_type"])))


@CONVERTERS.register("LayerNormalization")
def _layer_norm(im, node, ins, a):
    t = im.type(ins[0])
    _stash_check(node, a, t.dtype)
    nd = len(t.shape)
    axis = norm_axis(int(a.get("axis", -1)), nd)
    eps = float(a.get("epsilon", 1e-5))
    inputs = [ins[0], ins[1]]
    has_bias = len(ins) > 2 and bool(ins[2])
    if has_bias:
        inputs.append(ins[2])
    im.emit("normalize", inputs, {"axis": axis, "epsilon": eps, "has_scale": True, "has_bias": has_bias},
            node.name, node_output(node))
    want_mean = len(node.output) > 1 and node.output[1]
    want_inv = len(node.output) > 2 and node.output[2]
    if want_mean or want_inv:
        # the optional statistics outputs (training exports): mean and 1/sqrt(var + eps) over [axis, ndim)
        axes = list(range(axis, nd))
        m = im.emit("reduce", [ins[0]], {"kind": "mean", "axes": axes, "keepdims": True}, node.name + "_mean",
                    node_output(node, 1) if want_mean else None)
        if want_inv:
            d = im.emit("sub", [ins[0], m])
            v = im.emit("reduce", [im.emit("mul", [d, d])], {"kind": "mean", "axes": axes, "keepdims": True})
            sd = im.emit("sqrt", [im.emit("add", [v, im.add_const(np.array(eps, np.float32))])])
            im.emit("div", [im.add_const(np.array(1.0, np.float32)), sd], {}, node.name + "_invstd",
                    node_output(node, 2))


@CONVERTERS.register("InstanceNormalization")
def _instance_norm(im, node, ins, a):
    t = im.type(ins[0])
    _stash_check(node, a, t.dtype)
    nd = len(t.shape)
    if nd < 3:
        raise UnsupportedOpError("node %s: InstanceNormalization of a rank-%d tensor (needs N, C, D1, ...)"
                                 % (node.name, nd))
    vec = (t.shape[1],) + (1,) * (nd - 2)
    im.emit("normalize", [ins[0], emit_reshape(im, ins[1], vec), emit_reshape(im, ins[2], vec)],
            {"axis": 2, "epsilon": float(a.get("epsilon", 1e-5)), "has_scale": True, "has_bias": True},
            node.name, node_output(node))


@CONVERTERS.register("GroupNormalization")
def _group_norm(im, node, ins, a):
    t = im.type(ins[0])
    _stash_check(node, a, t.dtype)
    nd = len(t.shape)
    g = int(a["num_groups"])
    n, ch = t.shape[0], t.shape[1]
    if nd < 3 or g <= 0 or ch % g:
        raise UnsupportedOpError("node %s: GroupNormalization with num_groups=%d on shape %s (channels must "
                                 "split into the groups)" % (node.name, g, t.shape))
    spatial = int(np.prod(t.shape[2:], dtype=np.int64))
    x = emit_reshape(im, ins[0], (n, g, ch // g, spatial))
    # opset 18 took scale/bias per group, opset 21 per channel (18's form was withdrawn as ambiguous)
    per_channel = im.opset >= 21
    want = ch if per_channel else g
    for k in (1, 2):
        if im.type(ins[k]).shape != (want,):
            raise UnsupportedOpError("node %s: GroupNormalization (opset %d) wants %s of shape (%d,), got %s"
                                     % (node.name, im.opset, "scale" if k == 1 else "bias", want,
                                        im.type(ins[k]).shape))
    vec = (g, ch // g, 1) if per_channel else (g, 1, 1)
    y = im.emit("normalize", [x, emit_reshape(im, ins[1], vec), emit_reshape(im, ins[2], vec)],
                {"axis": 2, "epsilon": float(a.get("epsilon", 1e-5)), "has_scale": True, "has_bias": True},
                node.name)
    emit_reshape(im, y, t.shape, node.name + "_unflatten", node.output[0])


# ---------------------------------------------------------------- shape ops: Split, Expand, Tile, Range, Size


# ---------------------------------------------------------------- LpNormalization
@CONVERTERS.register("LpNormalization")
def _lp_norm(im, node, ins, a):
    dt = require_dtype(im, node, ins[0], ("float32", "float64"))
    p = int(a.get("p", 2))
    if p not in (1, 2):
        raise UnsupportedOpError("node %s: LpNormalization p=%d (the spec allows 1 and 2)" % (node.name, p))
    axis = norm_axis(int(a.get("axis", -1)), len(im.type(ins[0]).shape))
    norm = im.emit("reduce", [ins[0]], {"kind": "l1" if p == 1 else "l2", "axes": [axis], "keepdims": True})
    zero = im.add_const(np.array(0, dt))
    # a zero norm (an all-zero slice) gives zeros, not 0/0
    is_zero = im.emit("equal", [norm, zero])
    safe = im.emit("where", [is_zero, im.add_const(np.array(1, dt)), norm])
    im.emit("where", [is_zero, zero, im.emit("div", [ins[0], safe])], {}, node.name, node_output(node))


# ---------------------------------------------------------------- RMSNormalization
@CONVERTERS.register("RMSNormalization")
def _rms_norm(im, node, ins, a):
    from tether.frontend.onnx.functions import expand_node
    t = im.type(ins[0])
    if str(t.dtype) != "float32" or int(a.get("stash_type", 1)) != 1:
        # other dtypes compute in the stash type and cast back: the spec's function body says exactly how
        expand_node(im, node, ins)
        return
    nd = len(t.shape)
    axis = norm_axis(int(a.get("axis", -1)), nd)
    st = im.type(ins[1])
    tail = tuple(t.shape[nd - len(st.shape):]) if len(st.shape) <= nd else None
    if str(st.dtype) != "float32" or tail is None or any(s not in (1, d) for s, d in zip(st.shape, tail)):
        raise UnsupportedOpError("node %s: RMSNormalization scale %s %s does not broadcast to X %s"
                                 % (node.name, st.dtype, st.shape, t.shape))
    im.emit("rms_normalize", [ins[0], ins[1]], {"axis": axis, "epsilon": float(a.get("epsilon", 1e-5)),
                                                "has_scale": True}, node.name, node_output(node))
