"""Rotary position embedding (ONNX RotaryEmbedding) as one kernel: each element of the rotated part is
x * cos + sign * partner * sin, its partner the other half of its pair (the other half of the head, or the
neighbour when interleaved); the rest of the head passes through."""
from __future__ import annotations

from tether import te

from . import common as c


def rotary_embedding(x, cos, sin, seq_axis: int, rotary_dim: int, interleaved: bool,
                     name: str = "rotary_embedding"):
    """x: rank 4 with the heads last, (B, S, N, H) (``seq_axis`` 1) or (B, N, S, H) (``seq_axis`` 2); cos and
    sin: (B, S, rotary_dim / 2). The first ``rotary_dim`` entries of each head rotate."""
    shape = c.shape_of(x)
    head = shape[3]
    half = rotary_dim // 2
    if rotary_dim % 2 or not 0 < rotary_dim <= head or c.shape_of(cos)[-1] != half:
        raise ValueError(f"{name}: rotary_dim {rotary_dim} with head size {head} and tables {c.shape_of(cos)}")
    one = c.const(1, "int32")

    def f(b, a1, a2, h):
        s = a1 if seq_axis == 1 else a2
        if interleaved:
            first = h % 2 == c.const(0, "int32")
            j = h // 2
            partner = te.if_then_else(first, h + one, h - one)
        else:
            first = h < c.const(half, "int32")
            j = te.if_then_else(first, h, h - c.const(half, "int32"))
            partner = te.if_then_else(first, h + c.const(half, "int32"), h - c.const(half, "int32"))
        # clamped so that every load stays inside the tensors on the pass-through lanes too
        j = c.clamp_index(j, half)
        partner = c.clamp_index(partner, head)
        xs = x[b, a1, a2, h]
        xp = x[b, a1, a2, partner]
        co, si = cos[b, s, j], sin[b, s, j]
        rotated = te.if_then_else(first, xs * co - xp * si, xs * co + xp * si)
        if rotary_dim == head:
            return rotated
        return te.if_then_else(h < c.const(rotary_dim, "int32"), rotated, xs)
    return c.compute(shape, f, name, c.INJECTIVE)
