"""Separable resampling (ONNX Resize/Upsample) from precomputed per-axis tap tables.

Every resized axis ``d`` has an index table ``idx_d`` (out_d, taps) of source positions (already clamped into
the input) and, unless each output reads one source with weight 1 (nearest), a weight table ``w_d`` of the same
shape. The output element sums, over every combination of taps, the product of the axes' weights times the
input at the combined source index: 1 tap per axis for nearest, 2 for linear, 4 for cubic. An optional
``inside_d`` table (out_d,) of 1/0 marks tf_crop_and_resize positions that fall outside the input, which take
``extrapolation`` instead. The tables are built at import time (frontend), so the kernel is shape-static.
"""
from __future__ import annotations

import itertools
from typing import Optional, Sequence

from tether import te

from . import common as c


def resize_tables(x, out_shape: Sequence[int], axes: Sequence[dict], tables: Sequence,
                  extrapolation: Optional[float] = None, name: str = "resize"):
    """`axes`: one dict per resized axis, {"axis", "taps", "weights": bool, "inside": bool}; `tables`: the te
    tensors of those axes in order (idx, then w if weights, then inside if inside)."""
    it = iter(tables)
    plan = []
    for a in axes:
        idx = next(it)
        w = next(it) if a["weights"] else None
        inside = next(it) if a["inside"] else None
        plan.append((int(a["axis"]), int(a["taps"]), idx, w, inside))
    dt = x.dtype

    def f(*o):
        acc = None
        for combo in itertools.product(*[range(p[1]) for p in plan]):
            src = list(o)
            weight = None
            for (d, _, idx, w, _), t in zip(plan, combo):
                src[d] = idx[o[d], t]
                if w is not None:
                    weight = w[o[d], t] if weight is None else weight * w[o[d], t]
            v = x[tuple(src)]
            term = v if weight is None else v * weight
            acc = term if acc is None else acc + term
        masks = [inside[o[d]] for d, _, _, _, inside in plan if inside is not None]
        if masks:
            m = masks[0]
            for extra in masks[1:]:
                m = m * extra
            acc = te.if_then_else(m > c.const(0.5, dt), acc, c.const(extrapolation or 0.0, dt))
        return acc
    return c.compute(tuple(out_shape), f, name, c.INJECTIVE)
