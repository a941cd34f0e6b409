"""Schedules of the int8 conv kernels (issue 12), registered into ops.schedules' tag table on import (ops imports
this module): ops/qconv.py's matmul form (QMATMUL) and ops/qdepthwise.py's window stage (QDEPTHWISE). Both fuse
their elementwise consumers (the requantize) into the write-back and keep their packing stage materialized."""
from __future__ import annotations

from . import common as c
from . import schedules
from .qconv import QMATMUL, QMATMUL_ACCUMULATORS, QMATMUL_COL_VECTORS
from .qdepthwise import QDEPTHWISE
from .schedules import _accumulator_and_output, _columns, _extent, _numel, _reduce_size


def schedule_qmatmul(s, t, fam, ctx) -> None:
    """The matmul form's schedule (ops.schedules calls it for the QMATMUL tag): a block of output channels x
    pixel vectors (QMATMUL_ACCUMULATORS of them, within the family's accumulator registers) accumulated over all
    of k inside the output's tile (through the fused epilogue); pixel blocks outermost and parallel, or channel
    blocks when there are too few pixel blocks to share among the threads."""
    block, out = _accumulator_and_output(s, t, ctx)
    so = s[out]
    o, p = list(out.op.axis)[-2:]
    # a partial column block runs as scalar code: the widest block of whole vectors that divides the pixels, then
    # as many channel rows as the accumulators allow (a weight word is one broadcast, folded into vpdpbusd)
    npix = int(out.shape[-1])
    accumulators = min(QMATMUL_ACCUMULATORS, fam.acc_regs)
    vecs = next((v for v in range(min(QMATMUL_COL_VECTORS, accumulators), 0, -1) if npix % (v * fam.lanes) == 0),
                1)
    cols = fam.lanes * vecs
    oo, oi = so.split(o, factor=max(1, accumulators // vecs))
    po, pi = so.split(p, factor=cols)
    few_pixel_blocks = -(-npix // cols) < fam.parallel_tasks
    outer, inner = (oo, po) if few_pixel_blocks else (po, oo)
    so.reorder(outer, inner, oi, pi)
    so.unroll(oi)
    so.vectorize(pi)
    if _numel(out) * _reduce_size(t) >= fam.parallel_min * 64:
        so.parallel(outer)
    s[block].compute_at(so, inner)
    s[block].compute_at(so, oo)
    sb = s[block]
    bo, bp = block.op.axis
    (k,) = block.op.reduce_axis
    sb.reorder(k, bo, bp)
    sb.unroll(bo)
    sb.vectorize(bp)


def schedule_qdepthwise(s, t, fam, ctx) -> None:
    """One channel per parallel task: its float planes, then its whole output plane accumulated in a local buffer
    (a block of output columns in vector registers over the unrolled taps), then the write-back through the fused
    epilogue."""
    block, out = _accumulator_and_output(s, t, ctx)
    so = s[out]
    b, q, y, x = out.op.axis
    chan = so.fuse(b, q)
    if _numel(out) >= fam.parallel_min:
        so.parallel(chan)
    cols = _columns(fam, int(out.shape[3]))
    xo, xi = so.split(x, factor=cols)
    so.vectorize(xi)
    sb = s[block]
    sb.compute_at(so, chan)
    bb, bq, by, bx = block.op.axis
    bxo, bxi = sb.split(bx, factor=cols)
    rd = list(block.op.reduce_axis)
    sb.reorder(bb, bq, by, bxo, *rd, bxi)
    sb.vectorize(bxi)
    for r in rd:
        if _extent(r) <= fam.window_unroll:
            sb.unroll(r)
    for src in block.op.input_tensors:
        if c.tag_of(src.op) == c.PAD:
            s[src].compute_at(sb, bq)
            ctx["serial"].add(id(src.op))


schedules._BY_TAG.update({QMATMUL: schedule_qmatmul, QDEPTHWISE: schedule_qdepthwise})
schedules._EPILOGUE_KERNELS = schedules._EPILOGUE_KERNELS | {QMATMUL, QDEPTHWISE}
schedules._MATERIALIZE_INPUTS_OF = schedules._MATERIALIZE_INPUTS_OF | {QMATMUL, QDEPTHWISE}
