"""Segment reductions: SEGMENT_SUM and UNSORTED_SEGMENT_SUM/PROD/MAX/MIN, as a scatter with a reduction into an
output filled with the reduction's identity, as LiteRT fills it (0, 1, the lowest and the highest value of the
type): an empty segment keeps that value. The segment ids must be constants (the output's row of each element is
then known at import); SEGMENT_SUM has as many rows as its largest id plus one.
"""
from __future__ import annotations

import numpy as np

from tether.errors import UnsupportedOpError
from tether.frontend.tflite.table import ConverterTable

CONVERTERS = ConverterTable("tflite segments")

_REDUCTION = {"UNSORTED_SEGMENT_SUM": "add", "SEGMENT_SUM": "add", "UNSORTED_SEGMENT_PROD": "mul",
              "UNSORTED_SEGMENT_MAX": "max", "UNSORTED_SEGMENT_MIN": "min"}


def _identity(reduction: str, dtype: str):
    info = np.finfo(dtype) if np.dtype(dtype).kind == "f" else np.iinfo(dtype)
    return {"add": 0, "mul": 1, "max": info.min, "min": info.max}[reduction]


@CONVERTERS.register(*_REDUCTION)
def _segment(ctx, op) -> None:
    data, ids_t = op.inputs[:2]
    ids = ctx.const(ids_t)
    if ids is None:
        raise UnsupportedOpError("%s: segment ids computed at run time (tether needs them constant)" % ctx.where())
    ids = np.asarray(ids, np.int64)
    if ids.size and ids.min() < 0:
        raise UnsupportedOpError("%s: negative segment ids" % ctx.where())
    if op.op == "SEGMENT_SUM":
        rows = int(ids.max()) + 1 if ids.size else 0
    else:
        (rows,) = ctx.int_list(op.inputs[2], "num_segments")
    if ids.size and ids.max() >= rows:
        raise UnsupportedOpError("%s: segment id %d for %d segments" % (ctx.where(), int(ids.max()), rows))
    dshape = ctx.shape(data)
    dtype = ctx.tensor(op.outputs[0]).dtype
    reduction = _REDUCTION[op.op]
    base = ctx.add_const(np.full([rows] + dshape[ids.ndim:], _identity(reduction, dtype), dtype), "segments")
    y = ctx.emit1("ScatterND", [base, ctx.add_const(ids[..., None], "segment_ids"), ctx.nhwc(data)],
                  reduction=reduction)
    ctx.set_output(op.outputs[0], y)
