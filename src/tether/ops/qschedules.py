"""Schedules of the int8 conv kernels, registered into ops.schedules' tag table on import (ops imports this
module): ops/qconv.py's pixel form (QCONV_PIXELS) and matmul form (QMATMUL) and ops/qdepthwise.py's window stage
(QDEPTHWISE). All fuse their elementwise consumers (the requantize) into the write-back and keep their packing
stage materialized."""
from __future__ import annotations

from . import common as c
from . import schedules
from .qconv import PAIR_BLOCK, QCONV_PIXELS, QMATMUL, QMATMUL_ACCUMULATORS, QMATMUL_COL_VECTORS, QPAIRS
from .qdepthwise import QDEPTHWISE
from .schedules import accumulator_and_output, axis_extent, numel, reduce_size, row_columns

# x86 AVX-512 pixel form: accumulators (zmm) of one register block, leaving registers for the weight vectors
QCONV_WIDE_MAX_ACCUMULATORS = 24
# aarch64 pixel form: accumulator registers of one register block (half of the 32). The weights of a reduction
# step and, without sdot, their widened halves and the byte products need the rest: 8 pixels x one 16-lane panel
# (32 accumulators) spilled and rotated registers through chains of movs (MobileNetV2 int8 on the A72: 203.5 M
# -> 184.4 M instructions per inference in its kernels; on the A76 with sdot 89.2 M -> 86.8 M with 4 pixels where
# 4 divide them). armv7 keeps 8 pixels: with 2 (8 of its 16 q registers) it counted 0.6% more.
QCONV_NEON_MAX_ACCUMULATORS = {"aarch64": 16}
# The fused requantize's vector operations per output vector (convert, bias, scale, round, clamps, zero point,
# narrowing), counted as reduction steps when deciding whether a kernel goes parallel: a pointwise conv over 8 or
# 16 input channels (2-4 dot-product steps) spends most of its time there (4096 pixels 8 -> 48: 34 us, which ran on
# one core of two when counted by its 2 steps alone).
QREQUANTIZE_STEPS = 8


def schedule_qmatmul(s, t, fam, ctx) -> None:
    """The matmul form's schedule (ops.schedules calls it for the QMATMUL tag): a block of output channels x
    pixel vectors (QMATMUL_ACCUMULATORS of them, within the family's accumulator registers) accumulated over all
    of k inside the output's tile (through the fused epilogue); pixel blocks outermost and parallel, or channel
    blocks when there are too few pixel blocks to share among the threads."""
    block, out = accumulator_and_output(s, t, ctx)
    so = s[out]
    o, p = list(out.op.axis)[-2:]
    # a partial column block runs as scalar code: the widest block of whole vectors that divides the pixels, then
    # as many channel rows as the accumulators allow (a weight word is one broadcast, folded into vpdpbusd)
    npix = int(t.shape[-1])     # the product's pixels, padded (ops.qconv.POINTWISE_PIXEL_PAD): the blocks tile them
    accumulators = min(QMATMUL_ACCUMULATORS, fam.acc_regs)
    vecs = next((v for v in range(min(QMATMUL_COL_VECTORS, accumulators), 0, -1) if npix % (v * fam.lanes) == 0),
                1)
    cols = fam.lanes * vecs
    oo, oi = so.split(o, factor=max(1, accumulators // vecs))
    po, pi = so.split(p, factor=cols)
    few_pixel_blocks = -(-npix // cols) < fam.parallel_tasks
    outer, inner = (oo, po) if few_pixel_blocks else (po, oo)
    tail = int(out.shape[-1]) % cols
    if tail and (tail < 4 or tail & (tail - 1)):
        # the last block over the unpadded pixels' end (49 of 64 at 7x7) is not a vector: one vector at a time,
        # or the whole 64-lane loop clipped to 49 runs as one scalar tail (160 -> 960 @7x7: 59 -> 38 us; where the
        # tail is a vector, 196 of 32-pixel blocks, this split measured slower: 47 -> 62 us at 576 -> 96 @14x14)
        pio, pi = so.split(pi, factor=fam.lanes)
        so.reorder(outer, inner, oi, pio, pi)
        so.unroll(pio)
    else:
        so.reorder(outer, inner, oi, pi)
    so.unroll(oi)
    so.vectorize(pi)
    if numel(out) * (reduce_size(t) + QREQUANTIZE_STEPS) >= fam.parallel_min * schedules.parallel_products(fam):
        so.parallel(outer)
    s[block].compute_at(so, inner)
    sb = s[block]
    bo, bp = block.op.axis
    (k,) = block.op.reduce_axis
    sb.reorder(k, bo, bp)
    sb.unroll(bo)
    sb.vectorize(bp)


def _pixel_block(fam, pixels: int, channels: int, nr: int) -> tuple:
    """(output pixels, weight panels) of the pixel form's register block.

    x86 AVX-512 (a panel is one zmm, 32 registers): the block is ``pixels x panels`` accumulators and each
    reduction step loads ``panels`` weight vectors and ``pixels`` broadcast words, so one panel (8 x 1: 9 loads per
    8 vpdpbusd) is bound by the two load ports before the two vpdpbusd units. Measured on resnet50's 3x3 layers
    (us at one thread): 64 @56x56 8x1 590, 8x2 482, 4x4 437; 128 @28x28 8x1 1026, 8x2 626, 7x2 548, 4x4 421 (blocks
    of 7 or 8 pixels keep as many broadcast addresses live across the unrolled taps); 96 @28x28 4x6 252, 4x3 272.
    So: 4 pixels (else the smallest count from 5 to 8 that divides them: a partial block runs guarded) by up to 4
    panels, within QCONV_WIDE_MAX_ACCUMULATORS. aarch64: as many pixels as QCONV_NEON_MAX_ACCUMULATORS allow (at most
    8; else the largest count below that divides them) by one panel. Elsewhere (and AVX2): 8 pixels x one panel
    where 8 tiles the pixels, else the family's pixel count (8 measured 1.8x faster than the fp32 family's 12 on a
    3x3 conv 64 -> 64 at 56x56)."""
    if fam.name == "x86" and fam.lanes >= 16 and nr == fam.lanes:
        rows = next((r for r in range(4, 9) if pixels % r == 0), 0)
        n_panels = -(-channels // nr)
        if rows:
            panels = next(p for p in (4, 3, 2, 1) if n_panels % p == 0 and rows * p <= QCONV_WIDE_MAX_ACCUMULATORS)
            return rows, panels
    if fam.name in QCONV_NEON_MAX_ACCUMULATORS:
        most = max(1, min(8, QCONV_NEON_MAX_ACCUMULATORS[fam.name] // max(1, nr // fam.lanes)))
        return next((r for r in range(most, 1, -1) if pixels % r == 0), most), 1
    return (8 if pixels % 8 == 0 else (fam.conv_pixels or fam.mm_rows)), 1


def schedule_qconv_pixels(s, t, fam, ctx) -> None:
    """The pixel form (ops.qconv.qconv2d with 3-D packed weights): conv2d_pixels' block of output pixels x
    output-channel panels (_pixel_block), but written back one pixel at a time with the channels as the vector:
    the fused requantize then runs on vectors (a scalar requantize per element cost about as much as the dot
    products of a 3x3 conv over 64 channels) and only the stores go lane by lane."""
    block, out = accumulator_and_output(s, t, ctx)
    so = s[out]
    o, p = list(out.op.axis)[-2:]
    if t.op.attrs.get("channels_last_out"):     # (pixels, channels): the stores are contiguous vectors
        p, o = o, p
    nr = int(t.op.attrs["panel"])
    rows, panels = _pixel_block(fam, int(t.shape[0]), int(t.shape[1]), nr)
    oo, oi = so.split(o, factor=nr * panels)
    po, pi = so.split(p, factor=rows)
    n_blocks = -(-int(t.shape[0]) // rows)
    n_panels = -(-int(t.shape[1]) // (nr * panels))
    w_bytes = int(t.shape[1]) * reduce_size(t) * 4
    x_bytes = numel(t.op.input_tensors[0]) * 4
    # the streamed operand: weights (pixel blocks outermost) or the packed input (panels outermost), as fp32's
    panels_outer = w_bytes > fam.cache_bytes and n_panels * x_bytes < n_blocks * w_bytes
    if fam.conv_order != "auto":
        panels_outer = fam.conv_order == "panels"
    outer, inner = (oo, po) if panels_outer else (po, oo)
    # one vector per panel: a vector of 48 lanes (3 panels) legalized into a 27x slower write-back
    oio, oii = so.split(oi, factor=nr)
    so.reorder(outer, inner, pi, oio, oii)
    so.unroll(pi)
    so.unroll(oio)
    so.vectorize(oii)
    if numel(out) * (reduce_size(t) + QREQUANTIZE_STEPS) >= fam.parallel_min * schedules.parallel_products(fam):
        if panels_outer and n_panels < 2 * fam.parallel_tasks:
            inner = outer = so.fuse(outer, inner)
        so.parallel(outer)
    s[block].compute_at(so, inner)
    sb = s[block]
    bp, bo = block.op.axis
    if panels > 1:
        # one vector per weight panel: its words are contiguous (o % nr), the panels apart
        boo, boi = sb.split(bo, factor=nr)
        sb.reorder(*block.op.reduce_axis, bp, boo, boi)
        sb.unroll(boo)
        bo = boi
    else:
        sb.reorder(*block.op.reduce_axis, bp, bo)
    if t.op.attrs.get("widened"):   # the byte index of byte_of: a constant lane of the widened word
        *taps, rc, rt = block.op.reduce_axis
        sb.unroll(rt)
        if axis_extent(rc) % 2 == 0 and all(axis_extent(a) == 1 for a in taps):
            # pointwise: two words per iteration, the loop's own four instructions paid per 32 multiply-adds, not 16
            # (a one-pixel 512 -> 512 int8 dense on the A72: 108.2 k -> 98.0 k instructions; a 3x3 conv over 16
            # channels, whose taps are unrolled around it already, counted 3% more)
            rco, rci = sb.split(rc, factor=2)
            sb.reorder(rco, rci, rt)
            sb.unroll(rci)
    sb.unroll(bp)
    sb.vectorize(bo)


# the pairs form's register block: pixels x PAIR_BLOCK output channels, each four int32 lanes
QPAIRS_PIXELS = 1


def schedule_qpairs(s, t, fam, ctx) -> None:
    """The pairs form (ops.qconv._pairs): a block of QPAIRS_PIXELS pixels x PAIR_BLOCK output channels, each a
    vector of four int32 lanes accumulated over all input channels (one pair_dot of 16 bytes per step), then the
    write-back adding each accumulator's lanes, the output channels as the vector (the fused requantize runs on
    whole vectors). Pixel blocks outermost (and parallel), the weights streamed through each."""
    block, out = accumulator_and_output(s, t, ctx)
    so = s[out]
    o, p = list(out.op.axis)[-2:]
    if t.op.attrs.get("channels_last_out"):     # (pixels, channels)
        p, o = o, p
    npix = int(t.shape[0])
    rows = QPAIRS_PIXELS if npix % QPAIRS_PIXELS == 0 else 1
    oo, oi = so.split(o, factor=PAIR_BLOCK)
    po, pi = so.split(p, factor=rows)
    outer, inner = (oo, po) if npix == 1 else (po, oo)
    so.reorder(outer, inner, pi, oi)
    so.unroll(pi)
    so.vectorize(oi)
    if numel(out) * (reduce_size(t) * 16 + QREQUANTIZE_STEPS) >= fam.parallel_min * schedules.parallel_products(fam):
        so.parallel(outer)
    s[block].compute_at(so, inner)
    sb = s[block]
    bp, bq = block.op.axis
    bo, bl = sb.split(bq, factor=4)     # (output channel, lane)
    (r,) = block.op.reduce_axis
    if axis_extent(r) % 2 == 0:     # two steps per iteration: the loop's own instructions paid once per two
        ro, ri = sb.split(r, factor=2)
        sb.reorder(ro, ri, bp, bo, bl)
        sb.unroll(ri)
    else:
        sb.reorder(r, bp, bo, bl)
    sb.unroll(bp)
    sb.unroll(bo)
    sb.vectorize(bl)


def schedule_qdepthwise(s, t, fam, ctx) -> None:
    """One channel per parallel task: its float planes, then its whole output plane accumulated in a local buffer
    (a block of output columns in vector registers over the unrolled taps), then the write-back through the fused
    epilogue."""
    block, out = accumulator_and_output(s, t, ctx)
    so = s[out]
    b, q, _, x = out.op.axis
    chan = so.fuse(b, q)
    if numel(out) >= fam.parallel_min:
        so.parallel(chan)
    cols = row_columns(fam, int(out.shape[3]))
    # rows of 2 or 3 columns are unrolled as scalars, kept in registers: as a 2- or 3-lane vector each tap
    # went through memory (5x5 over 1152 channels @3x3, EfficientNet-B0's last stage: 668 -> 73 us; 320 @2x2 3x3
    # 7.0 -> 1.2 us; 4, 6 and 7 columns measured as fast as vectors or faster)
    narrow = cols < 4
    _, xi = so.split(x, factor=cols)
    so.unroll(xi) if narrow else so.vectorize(xi)
    sb = s[block]
    sb.compute_at(so, chan)
    bb, bq, by, bx = block.op.axis
    bxo, bxi = sb.split(bx, factor=cols)
    rd = list(block.op.reduce_axis)
    sb.reorder(bb, bq, by, bxo, *rd, bxi)
    sb.unroll(bxi) if narrow else sb.vectorize(bxi)
    for r in rd:
        if axis_extent(r) <= fam.window_unroll:
            sb.unroll(r)
    for src in block.op.input_tensors:
        if c.tag_of(src.op) == c.PAD:
            s[src].compute_at(sb, bq)
            ctx["serial"].add(id(src.op))


_TAGS = {QCONV_PIXELS: schedule_qconv_pixels, QMATMUL: schedule_qmatmul, QDEPTHWISE: schedule_qdepthwise,
         QPAIRS: schedule_qpairs}
schedules._BY_TAG.update(_TAGS)
schedules._EPILOGUE_KERNELS = schedules._EPILOGUE_KERNELS | set(_TAGS)
schedules._MATERIALIZE_INPUTS_OF = schedules._MATERIALIZE_INPUTS_OF | set(_TAGS)
