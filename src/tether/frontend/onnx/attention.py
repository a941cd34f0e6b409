"""ONNX Attention (opset 23+) as a handful of kernels: Q scaled, one batched matmul against K transposed, the
additive bias (attn_mask, causal, padding of a short mask), softmax, one batched matmul against V.

Grouped-query attention never repeats K and V: the ``G = q_num_heads / kv_num_heads`` query heads that share a
KV head are stacked along the rows of one matmul, (B*Hkv, G*S, D) x (B*Hkv, D, T). A row whose whole bias is
-inf (no key it may attend) gives zeros, as the spec says, through a guard decided on the bias (a constant
whenever the mask is).

The rest of the attribute space (the qk_matmul_output output, nonpad_kv_seqlen, sliding windows, a softmax
precision other than float, dtypes other than float32) converts through the spec's function body."""
from __future__ import annotations

import math

import numpy as np

from tether.errors import UnsupportedOpError
from tether.frontend.onnx.functions import expand_node
from tether.frontend.onnx.importer import ConverterTable, emit_reshape, node_output

CONVERTERS = ConverterTable(__name__)

_FLOAT = 1      # onnx.TensorProto.FLOAT


def _opt(ins, k):
    return ins[k] if len(ins) > k and ins[k] else None


def _fast_path(im, node, ins, a) -> bool:
    if any(str(im.type(x).dtype) != "float32" for x in ins[:3]):
        return False
    if _opt(ins, 6) is not None or _wants(node, 3):
        return False
    if int(a.get("left_window_size", -1)) >= 0 or int(a.get("right_window_size", -1)) >= 0:
        return False
    if int(a.get("softmax_precision", _FLOAT)) != _FLOAT:
        return False
    mask = _opt(ins, 3)
    if mask is not None and str(im.type(mask).dtype) not in ("bool", "float32"):
        return False
    return all(str(im.type(x).dtype) == "float32" for x in (_opt(ins, 4), _opt(ins, 5)) if x is not None)


def _wants(node, k) -> bool:
    return len(node.output) > k and bool(node.output[k])


def _heads_4d(im, node, x: str, heads: int, what: str) -> str:
    """(B, S, H*D) -> (B, H, S, D); a 4-D input as it is."""
    shape = im.type(x).shape
    if len(shape) == 4:
        return x
    b, s, hd = shape
    if heads <= 0 or hd % heads:
        raise UnsupportedOpError("node %s: Attention %s of shape %s does not split into %d heads"
                                 % (node.name, what, shape, heads))
    return im.emit("transpose", [emit_reshape(im, x, (b, s, heads, hd // heads))], {"axes": (0, 2, 1, 3)})


def _bias(im, node, mask, b: int, hq: int, s: int, t: int, causal: bool, past: int):
    """The additive bias (broadcastable to (B, Hq, S, T)) or None: the mask as 0/-inf (bool) or as given
    (float), padded with -inf up to T keys, plus the bottom-right aligned causal part."""
    neg_inf = im.add_const(np.array(-np.inf, np.float32))
    bias = None
    if mask is not None:
        mshape = im.type(mask).shape
        if len(mshape) > 4 or not mshape:
            raise UnsupportedOpError("node %s: Attention attn_mask of rank %d" % (node.name, len(mshape)))
        if str(im.type(mask).dtype) == "bool":
            bias = im.emit("where", [mask, im.add_const(np.array(0, np.float32)), neg_inf])
        else:
            bias = mask
        m = mshape[-1]
        if m < t:   # a mask shorter than the keys: the missing keys are masked out
            bias = im.emit("concat", [bias, im.add_const(np.full(tuple(mshape[:-1]) + (t - m,), -np.inf,
                                                                 np.float32))], {"axis": len(mshape) - 1})
        elif m > t:
            raise UnsupportedOpError("node %s: Attention attn_mask covers %d keys, there are %d"
                                     % (node.name, m, t))
        full = (b, hq, s, t)
        lead = tuple(im.type(bias).shape)
        if any(d not in (1, f) for d, f in zip(lead[::-1], full[::-1])):
            raise UnsupportedOpError("node %s: Attention attn_mask of shape %s does not broadcast to %s"
                                     % (node.name, mshape, full))
    if causal:
        i = np.arange(s).reshape(s, 1)
        j = np.arange(t).reshape(1, t)
        c = im.add_const(np.where(j <= i + past, np.float32(0), np.float32(-np.inf)).astype(np.float32))
        bias = c if bias is None else im.emit("add", [bias, c])
    return bias


@CONVERTERS.register("Attention")
def _attention(im, node, ins, a):
    if not _fast_path(im, node, ins, a):
        expand_node(im, node, ins)
        return
    q_in, k_in, v_in = ins[0], ins[1], ins[2]
    rank = len(im.type(q_in).shape)
    if rank not in (3, 4) or len(im.type(k_in).shape) != rank or len(im.type(v_in).shape) != rank:
        raise UnsupportedOpError("node %s: Attention on Q, K, V of ranks %d, %d, %d" % (
            node.name, rank, len(im.type(k_in).shape), len(im.type(v_in).shape)))
    q = _heads_4d(im, node, q_in, int(a.get("q_num_heads", 0)), "Q")
    k = _heads_4d(im, node, k_in, int(a.get("kv_num_heads", 0)), "K")
    v = _heads_4d(im, node, v_in, int(a.get("kv_num_heads", 0)), "V")
    past_k, past_v = _opt(ins, 4), _opt(ins, 5)
    if (past_k is None) != (past_v is None):
        raise UnsupportedOpError("node %s: Attention with only one of past_key, past_value" % node.name)
    past = 0
    if past_k is not None:
        past = im.type(past_k).shape[2]
        k = im.emit("concat", [past_k, k], {"axis": 2})
        v = im.emit("concat", [past_v, v], {"axis": 2})
    b, hq, s, d = im.type(q).shape
    _, hkv, t, dk = im.type(k).shape
    dv = im.type(v).shape[3]
    if dk != d or im.type(v).shape[:3] != (b, hkv, t) or im.type(k).shape[0] != b or hq % hkv:
        raise UnsupportedOpError("node %s: Attention Q %s, K %s, V %s (query heads must be a multiple of the KV "
                                 "heads, head sizes of Q and K equal)" % (node.name, im.type(q).shape,
                                                                         im.type(k).shape, im.type(v).shape))
    for idx, val in ((1, k), (2, v)):
        if _wants(node, idx):
            emit_reshape(im, val, im.type(val).shape, node.name + "_present%d" % idx, node.output[idx])
    g = hq // hkv
    scale = float(a["scale"]) if "scale" in a else 1.0 / math.sqrt(d)
    qs = im.emit("mul", [q, im.add_const(np.array(scale, np.float32))])
    qs = emit_reshape(im, qs, (b * hkv, g * s, d))
    kt = emit_reshape(im, im.emit("transpose", [k], {"axes": (0, 1, 3, 2)}), (b * hkv, d, t))
    scores = emit_reshape(im, im.emit("batch_matmul", [qs, kt]), (b, hq, s, t))
    softcap = float(a.get("softcap", 0.0))
    if softcap > 0:     # before the bias, so that masked keys stay -inf
        capped = im.emit("tanh", [im.emit("mul", [scores, im.add_const(np.array(1.0 / softcap, np.float32))])])
        scores = im.emit("mul", [capped, im.add_const(np.array(softcap, np.float32))])
    bias = _bias(im, node, _opt(ins, 3), b, hq, s, t, bool(int(a.get("is_causal", 0))), past)
    if bias is not None:
        scores = im.emit("add", [scores, bias])
    probs = im.emit("softmax", [scores], {"axis": 3})
    if bias is not None and _opt(ins, 3) is not None:
        # a row with no attendable key gives zeros, decided on the bias (the scores may be NaN there)
        row_max = im.emit("reduce", [bias], {"kind": "max", "axes": [len(im.type(bias).shape) - 1],
                                             "keepdims": True})
        dead = im.emit("equal", [row_max, im.add_const(np.array(-np.inf, np.float32))])
        dead_const = im.const(dead)
        if dead_const is None or dead_const.any():
            probs = im.emit("where", [dead, im.add_const(np.array(0, np.float32)), probs])
    y = im.emit("batch_matmul", [emit_reshape(im, probs, (b * hkv, g * s, t)), emit_reshape(im, v, (b * hkv, t, dv))])
    y = emit_reshape(im, y, (b, hq, s, dv))
    if rank == 3:
        y = im.emit("transpose", [y], {"axes": (0, 2, 1, 3)})
        im.emit("reshape", [y], {"shape": (b, s, hq * dv)}, node.name, node_output(node))
    else:
        im.emit("reshape", [y], {"shape": (b, hq, s, dv)}, node.name, node_output(node))
