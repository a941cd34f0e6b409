"""LinearAttention (opset 27): the recurrence unrolled over the (fixed, short) sequence into batched matmuls and
elementwise ops. onnx's own function body runs a Scan, which tether does not convert; with every shape fixed
at import the recurrence is a straight line of ``T`` steps, each a handful of small kernels, so prefill of a
long sequence is refused (MAX_STEPS) rather than built as thousands of kernels."""
from __future__ import annotations

import math

import numpy as np

from tether.errors import UnsupportedOpError
from tether.frontend.onnx.importer import ConverterTable, emit_reshape, node_output, require_dtype, str_attr

CONVERTERS = ConverterTable(__name__)

MAX_STEPS = 64
_RULES = ("linear", "gated", "delta", "gated_delta")


def _opt(ins, k):
    return ins[k] if len(ins) > k and ins[k] else None


def _step(im, x: str, t: int, shape):
    """Time step ``t`` of a (B, T, F) tensor, reshaped to ``shape``."""
    b, _, f = im.type(x).shape
    s = im.emit("strided_slice", [x], {"begin": (0, t, 0), "end": (b, t + 1, f), "step": (1, 1, 1)})
    return emit_reshape(im, s, shape)


@CONVERTERS.register("LinearAttention")
def _linear_attention(im, node, ins, a):
    for k in (0, 1, 2):
        require_dtype(im, node, ins[k], ("float32",))
        if len(im.type(ins[k]).shape) != 3:
            raise UnsupportedOpError("node %s: LinearAttention %s of rank %d (it takes (B, T, H*D))"
                                     % (node.name, ("query", "key", "value")[k], len(im.type(ins[k]).shape)))
    rule = str_attr(a, "update_rule", "gated_delta")
    if rule not in _RULES:
        raise UnsupportedOpError("node %s: LinearAttention update_rule=%r" % (node.name, rule))
    hq, hkv = int(a.get("q_num_heads", 0)), int(a.get("kv_num_heads", 0))
    if hq <= 0 or hkv <= 0 or hq % hkv:
        raise UnsupportedOpError("node %s: LinearAttention q_num_heads=%d, kv_num_heads=%d (q must be a positive "
                                 "multiple of kv)" % (node.name, hq, hkv))
    q, k, v = ins[0], ins[1], ins[2]
    past, decay, beta = _opt(ins, 3), _opt(ins, 4), _opt(ins, 5)
    gating, delta = rule in ("gated", "gated_delta"), rule in ("delta", "gated_delta")
    if gating != (decay is not None) or delta != (beta is not None):
        raise UnsupportedOpError("node %s: LinearAttention update_rule=%r %s decay and %s beta" % (
            node.name, rule, "needs" if gating else "forbids", "needs" if delta else "forbids"))
    b, steps, qf = im.type(q).shape
    dk, dv = qf // hq, im.type(v).shape[2] // hkv
    g = hq // hkv
    if qf % hq or im.type(k).shape != (b, steps, hkv * dk) or im.type(v).shape != (b, steps, hkv * dv):
        raise UnsupportedOpError("node %s: LinearAttention shapes q %s, k %s, v %s do not split into %d/%d heads"
                                 % (node.name, im.type(q).shape, im.type(k).shape, im.type(v).shape, hq, hkv))
    if steps > MAX_STEPS:
        raise UnsupportedOpError("node %s: LinearAttention over %d steps (tether unrolls the recurrence, up to %d)"
                                 % (node.name, steps, MAX_STEPS))
    bh = b * hkv
    if decay is not None:
        require_dtype(im, node, decay, ("float32",))
        if im.type(decay).shape not in ((b, steps, hkv), (b, steps, hkv * dk)):
            raise UnsupportedOpError("node %s: LinearAttention decay of shape %s" % (node.name, im.type(decay).shape))
        per_key = im.type(decay).shape[2] == hkv * dk
    if beta is not None:
        require_dtype(im, node, beta, ("float32",))
        if im.type(beta).shape not in ((b, steps, hkv), (b, steps, 1)):
            raise UnsupportedOpError("node %s: LinearAttention beta of shape %s" % (node.name, im.type(beta).shape))
        if im.type(beta).shape[2] != hkv:
            beta = im.emit("broadcast_to", [beta], {"shape": (b, steps, hkv)})
    if past is not None:
        require_dtype(im, node, past, ("float32",))
        if im.type(past).shape != (b, hkv, dk, dv):
            raise UnsupportedOpError("node %s: LinearAttention past_state of shape %s, expected %s"
                                     % (node.name, im.type(past).shape, (b, hkv, dk, dv)))
        state = emit_reshape(im, past, (bh, dk, dv))
    else:
        state = im.add_const(np.zeros((bh, dk, dv), np.float32), "la_state")
    scale = float(a.get("scale", 0.0)) or 1.0 / math.sqrt(dk)
    scale_c = im.add_const(np.array(scale, np.float32))
    outs = []
    for t in range(steps):
        if gating:
            gt = _step(im, decay, t, (bh, dk, 1) if per_key else (bh, 1, 1))
            state = im.emit("mul", [state, im.emit("exp", [gt])])
        vt = _step(im, v, t, (bh, 1, dv))
        if delta:
            kt_row = _step(im, k, t, (bh, 1, dk))
            retrieved = im.emit("batch_matmul", [kt_row, state])
            vt = im.emit("mul", [_step(im, beta, t, (bh, 1, 1)), im.emit("sub", [vt, retrieved])])
        state = im.emit("add", [state, im.emit("mul", [_step(im, k, t, (bh, dk, 1)), vt])])
        ot = im.emit("batch_matmul", [_step(im, q, t, (bh, g, dk)), state])
        outs.append(emit_reshape(im, ot, (b, 1, hq * dv)))
    o = outs[0] if steps == 1 else im.emit("concat", outs, {"axis": 1})
    im.emit("mul", [o, scale_c], {}, node.name, node_output(node))
    if len(node.output) > 1 and node.output[1]:
        emit_reshape(im, state, (b, hkv, dk, dv), node.name + "_state", node.output[1])
