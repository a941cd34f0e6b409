"""The int8 depthwise convolution on channels-last activations: ``qdepthwise2d_nhwc``, exact in float32.

The channels-last twin of ops/qdepthwise.py, for the int8 activations graph/passes/int8_layout.py keeps channels
last between int8 kernels: ``x (1, H, W, C)`` 8-bit, weights ``(KH, KW, C)`` and bias ``(C,)`` holding integers
as float32, the output ``(1, OH, OW, C)`` float32 (the requantize that follows is fused into its write-back).
As there, every product and partial sum is an integer below 2**24 (the caller checks the bound), so float32
multiply-adds compute the int32 accumulator exactly.

The vector runs along the channels, so a stride moves whole vectors and every tap is one vector load and one
fused multiply-add, whatever the stride: a task takes one vector of channels; its first stage writes that
channel block of the image as float ``x - zx`` with the padding (zeros), ``(H + pads, W + pads, lanes)``, then a
block of output columns is accumulated in registers over the unrolled taps (the taps' weights, one vector each,
stay in registers across the row). When a channel block's plane would not stay in cache (the 112x112 layers),
the stage is written per output row instead: the few input rows that row reads.

Widened (int16 weights, Arm cores without a dot product: kernels/qconv_ops.for_target): the stage holds ``x - zx``
as int16 and the taps multiply-add into int32 (smlal on 8 channels per vector: one load and two multiply-adds per
tap where float32 took two of each), converted to float32 with the bias at the write-back, so the output is the same
float32 either way.
"""
from __future__ import annotations

from tether import te
from tether.codegen.function import STACK_BYTES
from tether.tir.dtype import bits

from . import common as c
from . import schedules
from .qdepthwise import window_geometry
from .schedules import accumulator_and_output, axis_extent, numel

QDEPTHWISE_NHWC = "qdepthwise_nhwc"    # the tag of the window stage (its schedule: below)
# a channel block's float plane up to this size is written once per task, larger ones per output row (measured on
# AVX-512: the whole 58x58 plane of a 56x56 layer, 215 KB, was 5-25% slower than per row; 30x30 ones 2-10% faster)
PLANE_BYTES = 128 << 10
# output columns accumulated at once, at most (registers: this many accumulators plus the taps' weight vectors)
COLUMNS = 8


def qdepthwise2d_nhwc(x, w, bias, stride, padding, x_zero: int, name: str = "qdepthwise2d_nhwc"):
    """x (1, H, W, C) uint8/int8, w (KH, KW, C) float32 (integer values), bias (C,) float32 ->
    (1, OH, OW, C) float32: bias[c] + sum_taps (x - x_zero) * w, exact while the sums stay below 2**24.
    With float x (``depthwise2d_nhwc``) it is the float convolution itself, padding read as zeros."""
    (n, h, wd, ch), (kh, kw, wc) = c.shape_of(x), c.shape_of(w)
    ch, h, wd, kh, kw, sh, sw, p4, oh, ow = window_geometry((n, ch, h, wd), (wc, kh, kw), stride, padding, name)
    top, left, bottom, right = p4
    floating = str(x.dtype) in ("float32", "float16")
    widened = str(w.dtype) == "int16"
    plane_dtype = str(x.dtype) if floating else ("int16" if widened else "float32")
    zero = c.const(0, plane_dtype)
    zx = c.const(x_zero, plane_dtype)

    def plane(yy, xx, q):
        y, xc = yy - top, xx - left
        # widened: unclamped, the load sits under the padding test, which is one branch per pixel (the codegen
        # guards a load it cannot prove in bounds), where the clamps cost a compare and select per coordinate
        v = x[0, y, xc, q] if widened else x[0, c.clamp_index(y, h), c.clamp_index(xc, wd), q]
        v = v if floating else v.astype(plane_dtype) - zx
        return te.if_then_else(c.all_of([y >= 0, y < h, xc >= 0, xc < wd]), v, zero) if any(p4) else v

    # widened: the plane is written in vectors of 8 int16 (one load of 8 bytes, one widening subtract, one store)
    xf = c.compute((h + top + bottom, wd + left + right, ch), plane, f"{name}_planes", c.PAD,
                   attrs={"vector_block": 8} if widened and ch % 8 == 0 else None)
    ry = te.reduce_axis((0, kh), name="ry")
    rx = te.reduce_axis((0, kw), name="rx")
    if widened:
        conv = c.compute((1, oh, ow, ch), lambda b, y, xx, q: te.sum(
            xf[y * sh + ry, xx * sw + rx, q].astype("int32") * w[ry, rx, q].astype("int32"), axis=[ry, rx]),
            f"{name}_conv", QDEPTHWISE_NHWC)
        return c.compute((1, oh, ow, ch), lambda b, y, xx, q: conv[b, y, xx, q].astype("float32") + bias[q], name,
                         c.BROADCAST)
    conv = c.compute((1, oh, ow, ch),
                     lambda b, y, xx, q: te.sum(xf[y * sh + ry, xx * sw + rx, q] * w[ry, rx, q], axis=[ry, rx]),
                     f"{name}_conv", QDEPTHWISE_NHWC)
    return c.compute((1, oh, ow, ch), lambda b, y, xx, q: conv[b, y, xx, q] + bias[q], name, c.BROADCAST)


def depthwise2d_nhwc(x, w, bias, stride, padding, name: str = "depthwise2d_nhwc"):
    """x (1, H, W, C) float32 or float16, w (KH, KW, C) and bias (C,) of its dtype -> (1, OH, OW, C): the float
    depthwise convolution on channels-last activations (graph/passes/float_layout.py), on the int8 kernel's loops,
    in the activations' dtype (float16: fmla on eight half lanes where the target computes in half)."""
    return qdepthwise2d_nhwc(x, w, bias, stride, padding, 0, name)


def channel_vector(fam, channels: int, lanes: int = 0) -> int:
    """The channels a channels-last kernel takes per vector: the family's lanes (``lanes``: per register, for
    narrower elements), or a half or a quarter register where that divides the channels and the whole one does
    not: a partial last vector (24 channels: 16 + 8) ran lane by lane, as scalar code (BlazeFace's 3x3 over 24
    channels @64x64 on AVX-512: 264 us; in 8-lane vectors 23)."""
    lanes = lanes or fam.lanes
    for v in (lanes, lanes // 2, lanes // 4):
        if v >= 4 and channels % v == 0:
            return v
    return lanes


def schedule_qdepthwise_nhwc(s, t, fam, ctx) -> None:
    """Groups of output rows outermost (the parallel loop), then channel vectors; inside, the accumulation of the
    group's rows of that vector (or, when its float plane would not stay in cache, and always for float input,
    one output row at a time), blocks of COLUMNS output columns in registers over the unrolled taps, after the
    float plane (rows) it reads; then the write-back through the fused epilogue."""
    block, out = accumulator_and_output(s, t, ctx)
    so = s[out]
    b, y, x, q = out.op.axis
    (src,) = [i for i in block.op.input_tensors if c.tag_of(i.op) == c.PAD]
    # int16 planes (the widened form): a vector of 8 channels, one q register of the plane per tap
    lanes = 2 * fam.lanes if str(src.dtype) == "int16" else fam.lanes
    qo, qi = so.split(q, factor=channel_vector(fam, int(out.shape[3]), lanes))
    # the parallel loop runs over groups of output rows, each task taking every channel vector of its rows: split
    # by channel vectors, the threads wrote interleaved 64-byte pieces of the same pixels, and a depthwise conv
    # ran no faster on two threads than on one (96 channels @32x32: 43 -> 49 us; by rows 32 us; MobileNetV2
    # 0.5@128 at 2 threads 8% faster, its int8 build 5%, neither slower at 1)
    oh = int(out.shape[1])
    groups = max(1, min(oh, 2 * fam.parallel_tasks))   # the tasks other schedules aim at
    yo, yi = so.split(y, nparts=groups)
    so.reorder(b, yo, qo, yi, x, qi)
    rows = so.fuse(b, yo)
    if numel(out) >= fam.parallel_min:
        so.parallel(rows)
    so.vectorize(qi)
    hp, wp = (int(d) for d in src.shape[:2])
    sb = s[block]
    # a task's share of the plane (its row group's rows) stays whole up to PLANE_BYTES, and on the task's stack;
    # a float plane (no conversion to share) is always written per output row: whole, it ran 1.4-2x slower at every
    # map size from 4x4 to 64x64 (AVX-512, 3x3 over 16..576 channels, stride 1 and 2)
    floating = str(src.op.input_tensors[0].dtype) in ("float32", "float16")
    whole = hp * wp * lanes * bits(str(src.dtype)) // 8 <= min(PLANE_BYTES, STACK_BYTES) * groups and not floating
    sb.compute_at(so, qo if whole else yi)
    bb, by, bx, bq = block.op.axis
    ow = int(block.shape[2])
    # the accumulators and the taps' weight vectors share the registers: half the family's accumulator budget
    # (AVX-512, aarch64: 8 columns; AVX2: 6; armv7: 4, with 9 weight vectors in its 16 q registers)
    widest = max(1, min(COLUMNS, fam.acc_regs // 2 // (lanes // fam.lanes)))
    cols = next((k for k in range(widest, 0, -1) if ow % k == 0), 1)
    bxo, bxi = sb.split(bx, factor=cols)
    rd = list(block.op.reduce_axis)
    sb.reorder(bb, by, bxo, *rd, bxi, bq)
    for r in rd:
        if axis_extent(r) <= fam.window_unroll:
            sb.unroll(r)
    sb.unroll(bxi)
    sb.vectorize(bq)
    s[src].compute_at(sb, bb)
    s[src].vectorize(src.op.axis[-1])
    ctx["serial"].add(id(src.op))


schedules._BY_TAG[QDEPTHWISE_NHWC] = schedule_qdepthwise_nhwc
schedules._EPILOGUE_KERNELS = schedules._EPILOGUE_KERNELS | {QDEPTHWISE_NHWC}
schedules._MATERIALIZE_INPUTS_OF = schedules._MATERIALIZE_INPUTS_OF | {QDEPTHWISE_NHWC}
