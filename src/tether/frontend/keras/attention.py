"""MultiHeadAttention and the dot-product Attention layer.

MultiHeadAttention: the query, key and value projections (einsum kernels of shape (dim, heads, size)),
scaled dot-product attention per head with an optional causal mask, and the output projection.

Keras scales the projected query by 1/sqrt(key_dim) and masks by adding -1e9 to the scores it masks out
(an attention_mask tensor and the causal mask combined). Attention runs over the sequence axis of rank-3 inputs
(Keras' default attention_axes); query, key and value masks are not converted.
"""
from __future__ import annotations

import math
from typing import List, Optional

import numpy as np

from tether.frontend.keras.builder import Value
from tether.frontend.keras.layer import Call, LayerTable

LAYERS = LayerTable(__name__)


def _project(c: Call, x: str, kernel: np.ndarray, bias: Optional[np.ndarray], hint: str) -> str:
    """(batch, seq, dim) x (dim, heads, size) -> (batch, heads, seq, size)."""
    b = c.b
    dim, heads, size = kernel.shape
    y = b.op("MatMul", [x, b.const(kernel.reshape(dim, heads * size), c.hint(hint + "_W"))], c.hint(hint))
    if bias is not None:
        y = b.op("Add", [y, b.const(bias.reshape(heads * size), c.hint(hint + "_B"))], c.hint(hint))
    y = b.op("Reshape", [y, b.ints([0, 0, heads, size], c.hint(hint + "_shape"))], c.hint(hint))
    return b.transpose(y, [0, 2, 1, 3], c.hint(hint))


def _tensor(c: Call, position: int, key: str) -> Optional[Value]:
    if key in c.tensor_kwargs:
        return c.tensor_kwargs[key]
    return c.inputs[position] if len(c.inputs) > position else None


@LAYERS.register("MultiHeadAttention")
def _mha(c: Call) -> List[Value]:
    query, value = _tensor(c, 0, "query"), _tensor(c, 1, "value")
    key = _tensor(c, 2, "key") or value
    if query is None or value is None:
        raise c.refuse("called without query and value tensors")
    masks = sorted(k for k in c.tensor_kwargs if k.endswith("mask") and k != "attention_mask")
    if masks:
        raise c.refuse("mask tensors (%s)" % ", ".join(masks))
    axes = c.get("attention_axes")
    if query.rank != 3 or value.rank != 3 or (axes is not None and [int(a) % 3 for a in axes] != [1]):
        raise c.refuse("attention over axes %s of rank-%d inputs (tether converts the sequence axis of rank-3 "
                       "inputs)" % (axes, query.rank))
    use_bias = c.get("use_bias", True)
    w = c.weights((8,) if use_bias else (4,))
    kernels = w[0::2] if use_bias else w
    biases = w[1::2] if use_bias else [None] * 4
    if kernels[3].ndim != 3:
        raise c.refuse("an output_shape of rank %d" % (kernels[3].ndim - 2))
    b = c.b
    key_dim = kernels[0].shape[2]
    q = _project(c, b.keras_order(query), kernels[0], biases[0], "_query")
    q = b.op("Mul", [q, b.const(np.float32(1.0 / math.sqrt(float(key_dim))), c.hint("_scale"))], c.hint())
    k = _project(c, b.keras_order(key), kernels[1], biases[1], "_key")
    v = _project(c, b.keras_order(value), kernels[2], biases[2], "_value")
    scores = b.op("MatMul", [q, b.transpose(k, [0, 1, 3, 2], c.hint("_keyT"))], c.hint("_scores"))
    keep = None             # 1 where a query may attend to a key: attention_mask and the causal mask
    mask = c.tensor_kwargs.get("attention_mask")
    if isinstance(mask, Value):
        if mask.rank != 3:
            raise c.refuse("an attention_mask of rank %d (expected batch, queries, keys)" % mask.rank)
        keep = b.op("Cast", [b.keras_order(mask)], c.hint("_mask"), to=1)
    if c.kwargs.get("use_causal_mask"):
        t, s = (query.shape or (None,) * 3)[1], (value.shape or (None,) * 3)[1]
        if t is None or s is None:
            raise c.refuse("a causal mask over sequences of unknown length (the file records no static shape)")
        causal = b.const(np.tril(np.ones((t, s), np.float32)), c.hint("_causal"))
        keep = causal if keep is None else b.op("Mul", [keep, causal], c.hint("_mask"))
    if keep is not None:    # Keras' masked softmax: add -1e9 where masked, the same for every head
        blocked = b.op("Sub", [b.const(np.float32(1.0), c.hint("_one")), keep], c.hint("_mask"))
        blocked = b.op("Mul", [blocked, b.const(np.float32(-1e9), c.hint("_large"))], c.hint("_mask"))
        if mask is not None:
            blocked = b.op("Unsqueeze", [blocked, b.ints([1], c.hint("_heads"))], c.hint("_mask"))
        scores = b.op("Add", [scores, blocked], c.hint())
    probs = b.op("Softmax", [scores], c.hint("_probs"), axis=-1)
    o = b.transpose(b.op("MatMul", [probs, v], c.hint("_context")), [0, 2, 1, 3], c.hint("_context"))
    heads, vdim, out_dim = kernels[3].shape
    o = b.op("Reshape", [o, b.ints([0, 0, heads * vdim], c.hint("_merge"))], c.hint())
    y = b.op("MatMul", [o, b.const(kernels[3].reshape(heads * vdim, out_dim), c.hint("_out_W"))], c.hint("_out"))
    if biases[3] is not None:
        y = b.op("Add", [y, b.const(biases[3], c.hint("_out_B"))], c.hint("_out"))
    result = [Value(y, 3)]
    if c.kwargs.get("return_attention_scores"):
        result.append(Value(probs, 4))
    return result


@LAYERS.register("Attention")
def _attention(c: Call) -> List[Value]:
    """Keras' dot-product Attention: softmax(scale * q k^T, masked) v over [query, value(, key)]."""
    if str(c.get("score_mode", "dot")) != "dot":
        raise c.refuse("score_mode %r (tether converts 'dot')" % c.get("score_mode"))
    if c.tensor_kwargs.get("mask") is not None:
        raise c.refuse("mask tensors")
    if len(c.inputs) not in (2, 3) or any(v.rank != 3 for v in c.inputs):
        raise c.refuse("inputs of ranks %s (expected [query, value] or [query, value, key], each rank 3)"
                       % [v.rank for v in c.inputs])
    b = c.b
    q, v = b.keras_order(c.inputs[0]), b.keras_order(c.inputs[1])
    k = b.keras_order(c.inputs[2]) if len(c.inputs) == 3 else v
    scores = b.op("MatMul", [q, b.transpose(k, [0, 2, 1], c.hint("_keyT"))], c.hint("_scores"))
    if c.get("use_scale", False):
        scale = c.weights((1,))[0]
        scores = b.op("Mul", [scores, b.const(np.asarray(scale, np.float32).reshape(()), c.hint("_scale"))],
                      c.hint())
    if c.kwargs.get("use_causal_mask"):
        t, s = (c.inputs[0].shape or (None,) * 3)[1], (c.inputs[1].shape or (None,) * 3)[1]
        if t is None or s is None:
            raise c.refuse("a causal mask over sequences of unknown length (the file records no static shape)")
        blocked = (1.0 - np.tril(np.ones((t, s), np.float32))) * np.float32(-1e9)
        scores = b.op("Add", [scores, b.const(blocked, c.hint("_causal"))], c.hint())
    probs = b.op("Softmax", [scores], c.hint("_probs"), axis=-1)
    result = [Value(b.op("MatMul", [probs, v], c.hint()), 3)]
    if c.kwargs.get("return_attention_scores"):
        result.append(Value(probs, 3))
    return result
