"""Schedules of the int8 conv kernels (issue 12), registered into ops.schedules' tag table on import (ops imports
this module): ops/qconv.py's pixel form (QCONV_PIXELS) and matmul form (QMATMUL) and ops/qdepthwise.py's window
stage (QDEPTHWISE). All fuse
their elementwise consumers (the requantize) into the write-back and keep their packing stage materialized."""
from __future__ import annotations

from . import common as c
from . import schedules
from .qconv import QCONV_PIXELS, QMATMUL, QMATMUL_ACCUMULATORS, QMATMUL_COL_VECTORS
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
    sb = s[block]
    bo, bp = block.op.axis
    (k,) = block.op.reduce_axis
    sb.reorder(k, bo, bp)
    sb.unroll(bo)
    sb.vectorize(bp)


def schedule_qconv_pixels(s, t, fam, ctx) -> None:
    """The pixel form (ops.qconv.qconv2d with 3-D packed weights): conv2d_pixels' block of output pixels x one
    panel of output channels (ops.schedules._schedule_conv_pixels, whose loop order it follows), but written back
    one pixel at a time with the channels as the vector: the fused requantize then runs on vectors (a scalar
    requantize per element cost about as much as the dot products of a 3x3 conv over 64 channels) and only the
    stores go lane by lane."""
    block, out = _accumulator_and_output(s, t, ctx)
    so = s[out]
    o, p = list(out.op.axis)[-2:]
    if t.op.attrs.get("channels_last_out"):     # (pixels, channels): the stores are contiguous vectors
        p, o = o, p
    nr = int(t.op.attrs["panel"])
    # output pixels per block: 8 where that leaves no partial block (measured 1.8x faster than the fp32 family's 12
    # on a 3x3 conv 64 -> 64 at 56x56, 3136 pixels), else the family's
    rows = 8 if int(t.shape[0]) % 8 == 0 else (fam.conv_pixels or fam.mm_rows)
    oo, oi = so.split(o, factor=nr)
    po, pi = so.split(p, factor=rows)
    n_blocks = -(-int(t.shape[0]) // rows)
    n_panels = -(-int(t.shape[1]) // nr)
    w_bytes = int(t.shape[1]) * _reduce_size(t) * 4
    x_bytes = _numel(t.op.input_tensors[0]) * 4
    # the streamed operand: weights (pixel blocks outermost) or the packed input (panels outermost), as fp32's
    panels_outer = w_bytes > fam.cache_bytes and n_panels * x_bytes < n_blocks * w_bytes
    outer, inner = (oo, po) if panels_outer else (po, oo)
    so.reorder(outer, inner, pi, oi)
    so.unroll(pi)
    so.vectorize(oi)
    if _numel(out) * _reduce_size(t) >= fam.parallel_min * 64:
        if panels_outer and n_panels < 2 * fam.parallel_tasks:
            inner = outer = so.fuse(outer, inner)
        so.parallel(outer)
    schedules.accumulate_block_at(s, block, so, inner)


def schedule_qdepthwise(s, t, fam, ctx) -> None:
    """One channel per parallel task: its float planes, then its whole output plane accumulated in a local buffer
    (a block of output columns in vector registers over the unrolled taps), then the write-back through the fused
    epilogue."""
    block, out = _accumulator_and_output(s, t, ctx)
    so = s[out]
    b, q, _, x = out.op.axis
    chan = so.fuse(b, q)
    if _numel(out) >= fam.parallel_min:
        so.parallel(chan)
    cols = _columns(fam, int(out.shape[3]))
    _, xi = so.split(x, factor=cols)
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


_TAGS = {QCONV_PIXELS: schedule_qconv_pixels, QMATMUL: schedule_qmatmul, QDEPTHWISE: schedule_qdepthwise}
schedules._BY_TAG.update(_TAGS)
schedules._EPILOGUE_KERNELS = schedules._EPILOGUE_KERNELS | set(_TAGS)
schedules._MATERIALIZE_INPUTS_OF = schedules._MATERIALIZE_INPUTS_OF | set(_TAGS)
