"""TimeDistributed: its layer applied to every time step, as one call over batch * time rows.

The time axis folds into the batch (a Reshape computed from the input's shape, which folds at import once
shapes are fixed), the wrapped layer converts as it would alone, and its output unfolds back.
"""
from __future__ import annotations

from typing import List

import numpy as np

from tether.frontend.keras.builder import Value
from tether.frontend.keras.layer import Call, LayerTable

LAYERS = LayerTable(__name__)
END = np.iinfo(np.int64).max


@LAYERS.register("TimeDistributed")
def _time_distributed(c: Call) -> List[Value]:
    inner = c.get("layer") or {}
    if c.x.rank < 3:
        raise c.refuse("an input of rank %d (expected batch, time and more)" % c.x.rank)
    b = c.b
    x = b.keras_order(c.x)
    shape = b.op("Shape", [x], c.hint("_in"))
    rows = b.op("Concat", [b.ints([-1], c.hint("_rows")),
                           b.op("Slice", [shape, b.ints([2], c.hint("_s")), b.ints([END], c.hint("_e"))],
                                c.hint())], c.hint(), axis=0)
    folded = Value(b.op("Reshape", [x, rows], c.hint("_fold")), c.x.rank - 1)
    inner_call = c.with_config(str(inner.get("class_name")), inner.get("config", {}), [folded], c.path)
    outs = c.dispatch(inner_call)
    if any(o is None for o in outs):        # a layer inside a wrapped model was refused, and reported
        return [None]
    result = []
    for o in outs:
        y = b.keras_order(o)
        lead = b.op("Slice", [shape, b.ints([0], c.hint("_s")), b.ints([2], c.hint("_e"))], c.hint())
        rest = b.op("Slice", [b.op("Shape", [y], c.hint("_out")), b.ints([1], c.hint("_s")),
                              b.ints([END], c.hint("_e"))], c.hint())
        target = b.op("Concat", [lead, rest], c.hint(), axis=0)
        result.append(Value(b.op("Reshape", [y, target], c.hint("_unfold")), o.rank + 1))
    return result
