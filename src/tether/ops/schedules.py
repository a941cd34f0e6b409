"""Default schedules of the op library, per target family (x86, aarch64, armv7).

`schedule(outs, target)` walks the op graph from the outputs, inlines injective producers into their
consumers, and gives every remaining stage the schedule its tag calls for:
- injective roots: the innermost axis vectorized by the lane count when its loads are contiguous (a scalar loop
  otherwise: LLVM handles it better than lane-by-lane gathers), the outermost non-trivial axis parallel;
- matmul: an MR x NR register-blocked micro-kernel (k outermost inside the block, MR rows unrolled, NR columns
  as NR/lanes vector FMAs) over B packed into NR-wide panels; elementwise epilogues (bias, activation) are
  fused into the block's write-back;
- conv2d: the same register blocking over (output channels x output rows x output columns);
- depthwise conv2d and pooling: a block of output columns accumulated in registers over the window;
- reductions: the innermost spatial axis vectorized with the reduction inside it when that is contiguous;
- packing and padding stages: materialized (their consumers read them many times).
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Callable, Dict, List, Sequence

from tether import te
from tether.errors import ScheduleError
from tether.target import Target, has_half_arithmetic
from tether.tir import Binary, Reduce, TensorLoad, walk
from tether.tir.dtype import bits as dtype_bits

from . import common as c
from .linear import PANEL, REGISTER_BLOCK

log = logging.getLogger(__name__)

# Tasks per parallel injective loop: enough for dynamic balancing on 2-8 cores, few enough that the per-task
# cost of the runtime's launcher stays small next to the work.
PARALLEL_TASKS = 8


@dataclasses.dataclass(frozen=True)
class Family:
    """Tuning knobs of one target family (float32)."""

    name: str
    lanes: int  # float32 lanes per vector register
    mm_rows: int  # micro-kernel rows (MR); MR * NR/lanes accumulators + NR/lanes B vectors fit the registers
    acc_regs: int  # vector registers a micro-kernel may spend on accumulators
    max_col_vectors: int  # widest conv micro-kernel row, in vectors
    # matmul accumulates in the output itself (one parallel launch, panels packed per task) rather than in a
    # local block: only where LLVM was seen to keep that output block in vector registers (AVX2; on armv7 it
    # scalarized the unaligned vector accumulators; with AVX-512's 16 lanes it reloads the block every k step:
    # a (64x128) @ (128x384) dense ran at 3-4 GMAC/s against 39 with the local block)
    direct_matmul: bool = False
    parallel_min: int = 1 << 14  # below this many output elements a parallel launch costs more than it saves
    conv_pixels: int = 0  # output pixels per conv2d_pixels block (0: mm_rows)
    # -- more knobs, set only by a tuning config (docs/tune.md); these defaults are the hand-made choices
    mm_cols: int = 16  # matmul micro-kernel columns (NR) when B is not packed into panels
    k_unroll: int = 4  # reduction steps unrolled inside a matmul block
    # ... and inside a matmul of one row (a dense layer of one sample). Its block does a few multiply-adds per
    # step and reads each weight once, so at 4 steps the loop's counter, compare, branch and pointer updates were
    # a tenth of its instructions: a 512 -> 512 layer counted 10.8% fewer on the emulated A72 at 16
    k_unroll_one_row: int = 16
    parallel_tasks: int = 8  # tasks of a parallel loop split by count (the grain)
    conv_order: str = "auto"  # conv2d_pixels outer loop: "auto" (by cache_bytes), "pixels" or "panels"
    cache_bytes: int = 256 << 10  # conv2d_pixels: weights up to this size stay in cache across pixel blocks
    # conv2d_pixels: weights over cache_bytes stream from memory through each block's reduction; read them this
    # many bytes ahead with prefetches (0: never)
    prefetch_ahead: int = 0
    window_unroll: int = 7  # depthwise/pooling: window axes up to this extent are unrolled
    window_pad_per_channel: bool = False  # strided depthwise/pooling: column phases made per channel (_channel_pads)
    # conv2d_pixels: output channels per weight panel (0: as the kernel packs them, ops.linear.PANEL by default).
    # A layout, not a loop: the packing (build_graph's, for a config's width) makes it, so a schedule asking for a
    # width the kernel was not packed with is refused, never re-blocked
    conv_panel: int = 0
    # which block loop runs across threads: "auto" (matmul: column panels; conv2d_pixels: the outer loop, fused
    # with the inner one when there are few panels), "rows" (matmul rows / conv pixels), "cols" (column / channel
    # panels) or "fused" (both block loops fused into one parallel loop)
    parallel_axis: str = "auto"


# conv2d_pixels' streamed weights, x86: how far ahead they are prefetched. resnet50's deep 1x1 convs with their
# weights evicted before each call (bench_conv_layers.py --cold), none / 1 / 4 / 8 / 16 KB ahead: 1024 -> 2048
# @14x14 s2 2628 / 2456 / 2178 / 2156 / 2208 us, 512 -> 2048 @7x7 1207 / 1172 / 1094 / 1097 / 1113 us.
PREFETCH_AHEAD_X86 = 4096


def family_of(target: Target, dtype: str = "float32") -> Family:
    """The knobs for kernels of ``dtype`` on ``target``: float16 computed in half (has_half_arithmetic) fills a
    vector with twice the float32 lanes (8 on NEON: fmla .8h), so its blocks are counted in those lanes."""
    lanes = target.vector_lanes(16 if dtype == "float16" and has_half_arithmetic(target) else 32)
    arch = target.arch
    if arch == "x86_64":
        # 16 ymm (AVX2): 6 x 16 -> 12 accumulators + 2 B vectors + 1 broadcast; 16 zmm would allow more but
        # the same blocking is near the load/FMA balance point.
        # conv2d_pixels: 4 pixels x 16 channels (8 accumulators); 6 x 16 measured 1.2-1.5x slower on vgg/resnet
        # layers (its six broadcast addresses plus twelve accumulators strain the 16 ymm / 16 GPR files).
        # AVX-512: 16 channels are one zmm, so 4 pixels would be only 4 accumulators; 12 pixels (12 of the 32 zmm)
        # measured resnet50's 3x3 layers at 57 -> 78-85 GMAC/s and mobilenet_v2 1.1x faster at 1 thread.
        return Family("x86", lanes, mm_rows=6 if lanes >= 8 else 4, acc_regs=12 if lanes < 16 else 24,
                      max_col_vectors=2, direct_matmul=lanes == 8, conv_pixels=4 if lanes < 16 else 12,
                      window_pad_per_channel=lanes >= 16, prefetch_ahead=PREFETCH_AHEAD_X86)
    if arch == "wasm32":
        # v128 (4 float lanes). Engines map wasm locals onto the host's vector registers: 16 xmm on x86-64 (V8
        # reserves one as scratch), 32 q on arm64; blocked as x86 with SSE (the same 16 registers): 4-row matmul
        # blocks, at most 12 accumulators, 4-pixel conv blocks. No x86/ARM-only path keys on this family's name.
        return Family("wasm32", lanes, mm_rows=4, acc_regs=12, max_col_vectors=2, conv_pixels=4)
    if arch == "aarch64":
        # 32 q registers. matmul: 5 x 16 -> 20 accumulators + 4 B vectors + the 5 A vectors whose lanes the
        # unrolled reduction steps multiply by (codegen/lane_groups.py); with 6 rows those 34 spilled (MobileNetV2
        # on the A72, in its kernels: 6 rows 130.7 M instructions, 5 rows 116.5 M, 4 rows 117.7 M). conv2d_pixels
        # keeps 6 pixels x 16 channels (24 accumulators), its input read by broadcast loads
        return Family("aarch64", lanes, mm_rows=5, acc_regs=24, max_col_vectors=4, conv_pixels=6)
    # armv7: 16 q registers: 2 x 16 -> 8 accumulators + 4 B vectors
    return Family("armv7", lanes, mm_rows=2, acc_regs=8, max_col_vectors=2)


# ---------------------------------------------------------------------------------------------------------------
# graph helpers

def _is_compute(op) -> bool:
    return isinstance(op, te.ComputeOp)


def axis_extent(iv) -> int:
    """Extent of an op's own axis (axes made by split/fuse have none until lowering)."""
    return int(iv.extent)


def _collect(outs: Sequence) -> tuple:
    """(compute ops in topological order, consumers: op -> [ops])."""
    order: List = []
    seen = set()
    consumers: Dict = {}

    def visit(op):
        if id(op) in seen:
            return
        seen.add(id(op))
        for t in op.input_tensors:
            consumers.setdefault(id(t.op), []).append(op)
            visit(t.op)
        if _is_compute(op):
            order.append(op)

    for t in outs:
        visit(t.op)
    return order, consumers


def _coef(e, var):
    """Coefficient of `var` in index expression `e` if `e` is affine in it (0 when absent), else None."""
    if e is var:
        return 1
    if isinstance(e, (te.Const,)) or (isinstance(e, te.Var) and e is not var):
        return 0
    if isinstance(e, Binary) and e.op in ("add", "sub"):
        a, b = _coef(e.a, var), _coef(e.b, var)
        if a is None or b is None:
            return None
        return a + b if e.op == "add" else a - b
    if isinstance(e, Binary) and e.op == "mul":
        a, b = _coef(e.a, var), _coef(e.b, var)
        if a is None or b is None:
            return None
        if a and isinstance(e.b, te.Const):
            return a * int(e.b.value)
        if b and isinstance(e.a, te.Const):
            return b * int(e.a.value)
        return None if (a or b) else 0
    return 0 if not any(n is var for n in walk(e)) else None


def _contiguous_along(op, var, inline: set, depth: int = 0) -> bool:
    """Whether every load in op's body (looking through inlined producers) moves by one element per step of
    `var` (or does not move): then a vectorized `var` loop loads whole vectors. Otherwise the codegen would
    gather lane by lane, which is slower than LLVM's own handling of a scalar loop."""
    if depth > 16:
        return False
    body = op.body.source if isinstance(op.body, Reduce) else op.body
    for node in walk(body):
        if not isinstance(node, TensorLoad):
            continue
        coefs = [_coef(i, var) for i in node.indices]
        if any(k is None for k in coefs) or any(coefs[:-1]):
            return False
        if not coefs or coefs[-1] == 0:
            continue
        if coefs[-1] != 1:
            return False
        prod = node.tensor.op
        if id(prod) in inline:
            # the producer's last axis stands in for var
            if not _contiguous_along(prod, prod.axis[-1], inline, depth + 1):
                return False
    return True


def _strided_along(op, var, inline: set) -> bool:
    """Whether every load in op's body moves by a constant number of elements per step of ``var`` (none through
    an inlined producer): then a vectorized ``var`` loop loads each vector with one gather."""
    body = op.body.source if isinstance(op.body, Reduce) else op.body
    for node in walk(body):
        if isinstance(node, TensorLoad):
            coefs = [_coef(i, var) for i in node.indices]
            if any(k is None for k in coefs) or (any(coefs) and id(node.tensor.op) in inline):
                return False
    return True


def _gathers(fam: Family) -> bool:
    """Whether ``fam``'s vectors load strided lanes with one gather instruction (AVX-512's 16 lanes).

    Why vectorize strided loads there: left scalar, LLVM's loop vectorizer made the same gathers itself, but
    spent half of a transpose kernel's compile time deciding so (0.23 of 0.45 s for a (256, 50, 38) -> (50, 38,
    256) transpose; picodet_layout has 14 transposes)."""
    return fam.name == "x86" and fam.lanes >= 16


def numel(t) -> int:
    """Number of elements of tensor ``t``."""
    n = 1
    for d in t.shape:
        n *= int(d)
    return n


# ---------------------------------------------------------------------------------------------------------------
# per-tag schedules

def _trailing_fusable(op, h, w, inline: set, depth: int = 0) -> bool:
    """Whether every load in op's body (looking through inlined producers) either ignores the two innermost axes
    h, w or reads them as its own two innermost dimensions of the same extents: then h and w fuse into one
    contiguous axis (a 28x28 map is one 784-long vector loop, not 28 rows of 28 with a tail each)."""
    if depth > 16:
        return False
    body = op.body.source if isinstance(op.body, Reduce) else op.body
    eh, ew = axis_extent(h), axis_extent(w)
    for node in walk(body):
        if not isinstance(node, TensorLoad):
            continue
        idx = node.indices
        uses = [any(n is h or n is w for n in walk(i)) for i in idx]
        if not any(uses):
            continue
        shape = [int(d) for d in node.tensor.shape]
        if (len(idx) < 2 or idx[-2] is not h or idx[-1] is not w or any(uses[:-2])
                or shape[-2] != eh or shape[-1] != ew):
            return False
        prod = node.tensor.op
        if id(prod) in inline and not _trailing_fusable(prod, prod.axis[-2], prod.axis[-1], inline, depth + 1):
            return False
    return True


def _vectorize_inner(s, t, fam: Family, axes=None, parallel: bool = True, block: int | None = None):
    """Vectorize the innermost axis by the lane count when its loads are contiguous (fusing the two innermost
    axes first when they are contiguous together), and run the outermost non-trivial axis in parallel."""
    st = s[t]
    axes = list(t.op.axis) if axes is None else list(axes)
    if not axes:
        return
    inner_extent = axis_extent(axes[-1])
    if (not block and len(axes) >= 3 and axes == list(t.op.axis) and inner_extent % fam.lanes
            and _trailing_fusable(t.op, axes[-2], axes[-1], ctx_inline(s))):
        inner_extent *= axis_extent(axes[-2])
        axes = axes[:-2] + [st.fuse(axes[-2], axes[-1])]
    inner = axes[-1]
    outer = axes[:-1]
    xo = None
    if block:  # laid out for vectors of `block` columns (contiguous once split by exactly that)
        xo, xi = st.split(inner, factor=block)
        st.vectorize(xi)
    elif not _contiguous_along(t.op, inner, ctx_inline(s)):
        if _gathers(fam) and inner_extent >= fam.lanes and _strided_along(t.op, inner, ctx_inline(s)):
            xo, xi = st.split(inner, factor=fam.lanes)
            st.vectorize(xi)
        # else strided or gathered loads: a scalar inner loop (LLVM handles it better than lane-by-lane loads)
    elif inner_extent >= fam.lanes:
        xo, xi = st.split(inner, factor=fam.lanes)
        st.vectorize(xi)
    if not parallel or numel(t) < fam.parallel_min:
        return
    # parallel over the outermost axis that has more than one iteration; not over a fused axis, whose index
    # decode (div/mod) inside the task body costs more than the balance it buys
    lead = next((ax for ax in outer if axis_extent(ax) > 1), None)
    if lead is not None:
        st.parallel(lead)
    elif xo is not None:
        po, _ = st.split(xo, nparts=fam.parallel_tasks)
        st.parallel(po)


def ctx_inline(s) -> set:
    """ids of the ops this schedule inlines."""
    return {id(st.op) for st in s.stages if st.attach_type == "inline"}


# A transpose whose output rows read down the input's columns runs in square tiles of this side: row by row, each
# output row touched one line of every input row it read (a (512, 3199) -> (3199, 512) transpose: 512 lines, all
# of L1), and the next output row needed the same lines again after they were gone (3.4 ms for 6.5 MB; tiled 1.0)
TRANSPOSE_TILE = 16
# ... when an output row reads at least this many input rows (a line each: 8 KB of L1) and the whole moves at least
# TRANSPOSE_TILED_MIN_ELEMENTS: a small one (an attention's heads) stays in cache as it is, and its tiles' extra
# loop levels cost instructions (the emulated A72's transformer: +4.6% in its head transpose)
TRANSPOSE_TILED_MIN_ROWS = 128
TRANSPOSE_TILED_MIN_ELEMENTS = 1 << 16


def _tile_transpose(s, t, fam: Family) -> bool:
    """Schedule ``t`` as tiles of TRANSPOSE_TILE x TRANSPOSE_TILE when its loads are strided along its innermost
    axis but contiguous along another: the input lines of a tile stay in cache while it is written. False when
    ``t`` is no such op."""
    st = s[t]
    axes = list(t.op.axis)
    inline = ctx_inline(s)
    if (len(axes) < 2 or axis_extent(axes[-1]) < TRANSPOSE_TILED_MIN_ROWS or numel(t) < TRANSPOSE_TILED_MIN_ELEMENTS
            or _contiguous_along(t.op, axes[-1], inline)):
        return False
    along = next((ax for ax in reversed(axes[:-1]) if axis_extent(ax) >= TRANSPOSE_TILE
                  and _contiguous_along(t.op, ax, inline)), None)
    if along is None:
        return False
    inner = axes[-1]
    ao, ai = st.split(along, factor=TRANSPOSE_TILE)
    io, ii = st.split(inner, factor=TRANSPOSE_TILE)
    rest = [ax for ax in axes if ax is not along and ax is not inner]
    st.reorder(*rest, ao, io, ai, ii)
    if _gathers(fam):
        st.vectorize(ii)
    if numel(t) >= fam.parallel_min:
        st.parallel(next((ax for ax in rest if axis_extent(ax) > 1), ao))
    return True


def _schedule_injective(s, t, fam: Family, ctx):
    if not _tile_transpose(s, t, fam):
        _vectorize_inner(s, t, fam)


def _schedule_reduce(s, t, fam: Family, ctx):
    """Vectorize the innermost spatial axis with the reduction moved inside it, when that axis is wide."""
    st = s[t]
    sp = list(t.op.axis)
    rd = list(t.op.reduce_axis)
    outer = sp
    if sp and axis_extent(sp[-1]) >= fam.lanes and _contiguous_along(t.op, sp[-1], ctx_inline(s)):
        xo, xi = st.split(sp[-1], factor=fam.lanes)
        st.reorder(*sp[:-1], xo, *rd, xi)
        st.vectorize(xi)
        outer = sp[:-1] + [xo]
    if outer and numel(t) * max(1, reduce_size(t)) >= fam.parallel_min:
        lead = next((ax for ax in sp[:-1] if axis_extent(ax) > 1), None)
        st.parallel(lead if lead is not None else outer[0])


def reduce_size(t) -> int:
    """Number of points of ``t``'s reduction (the product of its reduce axes' extents)."""
    n = 1
    for r in t.op.reduce_axis:
        n *= axis_extent(r)
    return n


def _epilogue_anchor(t, ctx):
    """The output stage an op's elementwise consumers were inlined into (or None if t is itself an output)."""
    return ctx["anchor"].get(id(t.op))


def accumulator_and_output(s, t, ctx):
    """(block, out): where a reduction accumulates and which stage writes the result. With a fused epilogue, t
    itself is the block and the epilogue's stage writes; without one, t accumulates in a local cache_write block."""
    anchor = _epilogue_anchor(t, ctx)
    if anchor is None:
        return s.cache_write(t, "local"), t
    return t, anchor


# A product with fewer column panels than this many (times the family's grain) and a right-hand side up to
# ROWS_PARALLEL_MAX_B_BYTES runs its row blocks in parallel instead: a pointwise conv on channels-last pixels
# ((4096 pixels, 8) x (8, 48): 3 panels) ran its 3 or 1 panels on one core of two; B is read by every task,
# which a small one costs nothing.
ROWS_PARALLEL_MAX_B_BYTES = 256 << 10
# A matmul with a local register block runs in parallel from this many multiply-adds per parallel_min output
# elements (262144 by default): channels-last pointwise convs of 5-12 us (MobileNetV2 0.5@128's 16x16 and 8x8
# layers) ran on one core of two at 64 (1M); at 16, 7% faster at 2 threads, the same at 1 (x86 AVX-512; elsewhere
# 64 until measured: each parallel loop adds its closure's loads to the ARM instruction counts).
MATMUL_PARALLEL_MIN_PRODUCTS = 16


def parallel_products(fam: Family) -> int:
    """Multiply-adds per parallel_min output elements from which a product with a register block (a matmul, an
    int8 conv) runs in parallel on `fam`."""
    return MATMUL_PARALLEL_MIN_PRODUCTS if fam.name == "x86" else 64


def _rows_parallel(t, mr: int, nr: int, fam: Family) -> bool:
    m, n = (int(v) for v in t.shape[-2:])
    return (len(t.shape) == 2 and -(-n // nr) < fam.parallel_tasks and -(-m // mr) >= 2 * -(-n // nr)
            and n * reduce_size(t) * 4 <= ROWS_PARALLEL_MAX_B_BYTES)


def _schedule_matmul(s, t, fam: Family, ctx):
    """MR x NR register-blocked micro-kernel: k outermost inside the block, MR rows unrolled, NR columns as
    NR/lanes vectors; column panels outermost (parallel), each packing its own panel of B inside its task."""
    mr, nr = t.op.attrs.get(REGISTER_BLOCK) or (fam.mm_rows, fam.mm_cols)
    anchor = _epilogue_anchor(t, ctx)
    packed = any(c.tag_of(src.op) == c.MATMUL_PACK for src in t.op.input_tensors)
    packed = packed or bool(t.op.attrs.get("prepacked"))     # weights packed at build time (graph/dense_panels)
    # packed panels are read as p[j // NR, k, j % NR]: contiguous once j is split by NR, as below
    contiguous = packed or _contiguous_along(t.op, t.op.axis[-1], ctx_inline(s))
    if anchor is None and fam.direct_matmul and id(t.op) in ctx["outputs"]:
        # The output itself accumulates: LLVM keeps the MR x NR block in registers across the k loop (a kernel
        # output is a noalias argument; an internal buffer is not, so those get a local block below), and the
        # packed panel's only consumer is this stage, so it can be packed per task.
        st = s[t]
        axes = list(t.op.axis)
        lead, (i, j) = axes[:-2], axes[-2:]
        (k,) = list(t.op.reduce_axis)
        io, ii = st.split(i, factor=mr)
        jo, ji = st.split(j, factor=nr)
        ko, ki = st.split(k, factor=_k_steps(fam, axis_extent(i), axis_extent(k)))
        first, second = (io, jo) if fam.parallel_axis == "rows" else (jo, io)
        st.reorder(*lead, first, second, ko, ki, ii, ji)
        if contiguous:
            st.vectorize(ji)
        st.unroll(ii)
        st.unroll(ki)
        outer = lead + ([first, second] if fam.parallel_axis == "fused" else [first])
        if numel(t) * reduce_size(t) >= fam.parallel_min * 64:
            st.parallel(st.fuse(*outer) if len(outer) > 1 else outer[0])
        # a task packs its own panel of B only when a task is one column panel (else the packing stays a stage)
        by_panel = fam.parallel_axis in ("auto", "cols")
        for src in t.op.input_tensors:
            if (by_panel and c.tag_of(src.op) == c.MATMUL_PACK and ctx["consumers"].get(id(src.op)) == [t.op]
                    and not lead):
                s[src].compute_at(st, jo)
                ctx["serial"].add(id(src.op))
        return
    # Otherwise a local MR x NR block (cache_write, or the kernel itself when an epilogue consumes it) is
    # computed inside the output's tile loops, and the packed operand stays a root stage of its own.
    if anchor is None:
        block = s.cache_write(t, "local")
        out = t
    else:
        block, out = t, anchor
    so = s[out]
    axes = list(out.op.axis)
    lead, (i, j) = axes[:-2], axes[-2:]
    if t.op.attrs.get(REGISTER_BLOCK) or (contiguous and axis_extent(j) % nr and axis_extent(j) > nr):
        # (an attention's head width of 24, 30 or 36 columns: the partial tile ran as scalar code)
        io, jo, ii, ji = _tile_shifted(so, i, j, mr, nr)
    else:
        io, jo, ii, ji = so.tile(i, j, x_factor=mr, y_factor=nr)
    rows = fam.parallel_axis == "rows" or (fam.parallel_axis == "auto" and _rows_parallel(t, mr, nr, fam))
    first, second = (io, jo) if rows else (jo, io)
    so.reorder(*lead, first, second, ii, ji)
    if contiguous:
        so.vectorize(ji)
    so.unroll(ii)
    fuse_both = fam.parallel_axis == "fused"
    outer = lead + ([first, second] if fuse_both else [first])
    if numel(out) * reduce_size(t) >= fam.parallel_min * parallel_products(fam):
        par = so.fuse(*outer) if len(outer) > 1 else outer[0]
        so.parallel(par)
        if fuse_both:
            second = par
    s[block].compute_at(so, second)
    sb = s[block]
    bi, bj = list(block.op.axis)[-2:]
    (k,) = list(block.op.reduce_axis)
    ko, ki = sb.split(k, factor=_k_steps(fam, axis_extent(bi), axis_extent(k)))
    sb.reorder(ko, ki, bi, bj)
    sb.unroll(ki)
    sb.unroll(bi)
    if contiguous:
        sb.vectorize(bj)


def _k_steps(fam: Family, rows: int, k: int) -> int:
    """Reduction steps unrolled in a matmul over ``rows`` rows and ``k`` steps: ``k_unroll``, or for one row (a
    dense layer of one sample) ``k_unroll_one_row``, halved until it divides ``k`` (a tail would put a condition
    in the unrolled body)."""
    if rows != 1:
        return fam.k_unroll
    steps = fam.k_unroll_one_row
    while steps > 1 and k % steps:
        steps //= 2
    return steps


# ---------------------------------------------------------------- matmul: a shifted last column tile
# The in-place pointwise matmul (an explicit REGISTER_BLOCK, graph/conv_gemm.py) on a map that is not whole
# 32-pixel tiles (1900 = 59 x 32 + 12) ran its last tile's 12 columns as scalar loops for every reduction step
# and row, serially after the parallel loop; shifted back to end at the last column, the tile is whole vectors
# (its overlap with the tile before is computed twice, to the same values) and one more parallel task.
def _tile_shifted(so, i, j, mr: int, nr: int):
    """so.tile(i, j, mr, nr) with the column split's last tile shifted (Stage.split shift_tail)."""
    io, ii = so.split(i, factor=mr)
    jo, ji = so.split(j, factor=nr, shift_tail=True)
    so.reorder(io, jo, ii, ji)
    return io, jo, ii, ji


def _schedule_rowdot_partial(s, t, fam: Family, ctx):
    st = s[t]
    i, j, l = t.op.axis
    (ko,) = t.op.reduce_axis
    st.reorder(i, j, ko, l)
    st.vectorize(l)
    if numel(t) * reduce_size(t) >= fam.parallel_min * 4:
        fused = st.fuse(i, j)
        if numel(t) // axis_extent(l) > fam.parallel_tasks:
            fused, _ = st.split(fused, nparts=fam.parallel_tasks)
        st.parallel(fused)


def _schedule_rowdot_final(s, t, fam: Family, ctx):
    pass  # N*(16 + k tail) scalar adds: not worth a parallel launch


def _schedule_pack(s, t, fam: Family, ctx):
    st = s[t]
    jo, kk, ji = t.op.axis
    if _contiguous_along(t.op, ji, ctx_inline(s)):
        st.vectorize(ji)
    if numel(t) >= fam.parallel_min and id(t.op) not in ctx["serial"]:
        st.parallel(jo)


def _schedule_conv2d(s, t, fam: Family, ctx):
    """Register block (output channels x output rows x output columns) accumulated in a local buffer over the
    whole reduction, then written back through the fused epilogue (bias, activation) if any."""
    n, oc, oh, ow = (int(d) for d in t.shape)
    block, out = accumulator_and_output(s, t, ctx)
    so = s[out]
    b, o, y, x = out.op.axis
    cols, rows_y, rows_o = _conv_block(fam, oc, oh, ow)
    oo, oi = so.split(o, factor=rows_o)
    yo, yi = so.split(y, factor=rows_y)
    xo, xi = so.split(x, factor=cols)
    # rows outermost: one row block of input (all channels) stays in cache while every channel block uses it
    so.reorder(b, yo, oo, xo, oi, yi, xi)
    so.unroll(oi)
    so.unroll(yi)
    so.vectorize(xi)
    if numel(out) >= fam.parallel_min:
        lead = [b, yo] if n > 1 else [yo]
        if n * -(-oh // rows_y) < 2 * fam.parallel_tasks:
            lead.append(oo)
        so.parallel(so.fuse(*lead) if len(lead) > 1 else lead[0])
    s[block].compute_at(so, xo)
    sb = s[block]
    bb, bo, by, bx = block.op.axis
    rc, ry, rx = block.op.reduce_axis
    sb.reorder(bb, rc, ry, rx, bo, by, bx)
    sb.unroll(bo)
    sb.unroll(by)
    sb.vectorize(bx)


# Weights up to this size stay in cache (L2) while pixel blocks stream past them.
CONV_WEIGHTS_IN_CACHE = 256 << 10


# conv2d_pixels writes its (pixels x channels) block back transposed. Fully unrolled, LLVM's SLP vectorizer turns
# the 12 x 32 scalar stores into hundreds of shuffles and takes 0.6 s of compile time per kernel (mobilenet_v2
# compiled in 15 CPU-s, resnet50 in 24); as a vector along the pixels per channel it compiles in a third of that,
# and with this long a reduction the write-back is a small part of the run (x86 AVX-512, resnet50's 3x3 and
# mobilenet_v2's deep 1x1 layers within noise; 96->576 @14x14, K=96, was 10% slower so, hence the bound). AVX2
# and ARM keep the unrolled write-back until measured.
CONV_PIXELS_VECTOR_WRITEBACK_MIN_REDUCE = 128
# An epilogue calling these (SiLU's sigmoid, GELU's erf) is vectorized at any reduction length, along the
# channels: unrolled, each of the block's 12 x 16 results ran its own scalar sigmoid (EfficientNet's 3 -> 32 stem
# with SiLU: 0.25 ms without the SiLU, 0.73 with it unrolled, 0.41 vectorized along the channels).
_COSTLY_CALLS = frozenset({"exp", "log", "tanh", "sigmoid", "erf", "pow"})


def _calls_costly_math(out, block) -> bool:
    """Whether the ops from ``block`` (excluded) up to ``out`` (a fused epilogue) call a costly math function."""
    from tether.tir.expr import Call

    seen = set()
    ops_ = [out.op]
    while ops_:
        op = ops_.pop()
        if id(op) in seen or op is block.op or not hasattr(op, "body"):
            continue
        seen.add(id(op))
        exprs = [op.body]
        while exprs:
            e = exprs.pop()
            if isinstance(e, Call) and e.name in _COSTLY_CALLS:
                return True
            for f in getattr(e, "_fields", ()):
                v = getattr(e, f, None)
                exprs.extend(v if isinstance(v, (list, tuple)) else [v] if v is not None else [])
        ops_.extend(t.op for t in op.input_tensors)
    return False


# (see _schedule_conv_pixels: when channel panels go outermost on AVX-512)
PANELS_OUTER_MIN_CHANNELS = 128
PANELS_OUTER_MAX_REDUCE = 128
PANELS_OUTER_MAX_INPUT_BYTES = 1 << 20
# With channel panels outermost, an input bigger than this streams from L3 or memory once per panel (wav2vec2's
# second feature conv: 512 channels x 3199 frames, 6.5 MB, read by 32 panels): the pixel blocks are then taken in
# chunks of about this much input, each chunk read by every panel while it stays in L2.
PANELS_OUTER_CHUNK_BYTES = 512 << 10


def _schedule_conv_pixels(s, t, fam: Family, ctx):
    """Implicit-GEMM convolution (ops.conv2d_pixels): the matmul micro-kernel's MR x NR block, MR output pixels by
    one NR-wide panel of output channels, accumulated over the whole reduction and written back transposed to
    (channels, pixels) through the fused epilogue. Pixel blocks outermost and parallel: each task reads its
    pixels' input patches once for every channel panel."""
    block, out = accumulator_and_output(s, t, ctx)
    so = s[out]
    channels_last = bool(t.op.attrs.get("channels_last_out"))     # out is (pixels, channels)
    p, o = list(out.op.axis)[-2:] if channels_last else list(out.op.axis)[-2:][::-1]
    nr = int(t.op.attrs.get("panel", PANEL))
    if fam.conv_panel and nr != fam.conv_panel:
        raise ScheduleError("%s packs its weights into %d-wide panels but the schedule asks for conv_panel=%d: "
                            "lower it with that panel width (build_graph(tuning_log=) and tether tune do)"
                            % (t.op.name, nr, fam.conv_panel))
    oo, oi = so.split(o, factor=nr)
    rows = pixel_block(fam, int(t.shape[-2]), nr)     # (t: (pixels, channels), or a batch's (N, pixels, channels))
    po, pi = so.split(p, factor=rows)
    # Which operand streams from memory: with pixel blocks outermost the whole weight tensor is read once per
    # block, with channel panels outermost the whole input once per panel. Deep layers (512 channels, 3x3: 9 MB of
    # weights, few pixels) must keep a panel in cache across the pixel blocks; shallow ones the input patch.
    n_blocks = -(-int(t.shape[-2]) // rows) * (int(t.shape[0]) if len(t.shape) == 3 else 1)
    n_panels = -(-int(t.shape[-1]) // nr)
    w_bytes = int(t.shape[-1]) * reduce_size(t) * 4
    x_bytes = numel(t.op.input_tensors[0]) * 4      # the (padded) input; [-1] is the weight panels
    panels_outer = w_bytes > fam.cache_bytes and n_panels * x_bytes < n_blocks * w_bytes
    # x86 AVX-512, short reductions into many channels: with pixel blocks outermost every block writes a piece of
    # each of the (oc) output rows, more partly written lines than L1 holds (the rows of a 56x56 map are 12.5 KB
    # apart: they share 16 of its 64 sets); one panel at a time writes 32 rows while the input (L2-sized) is
    # re-read. resnet50's 1x1 64->256 @56x56: 1.47x -> 1.02x onnxruntime's time (that one now runs in place,
    # graph.conv_gemm.pointwise_direct), 128->512 @28x28: 1032 -> 888 us.
    if (fam.name == "x86" and fam.lanes >= 16 and int(t.shape[-1]) >= PANELS_OUTER_MIN_CHANNELS
            and reduce_size(t) <= PANELS_OUTER_MAX_REDUCE and x_bytes <= PANELS_OUTER_MAX_INPUT_BYTES):
        panels_outer = True
    if fam.conv_order != "auto":
        panels_outer = fam.conv_order == "panels"
    outer, inner = (oo, po) if panels_outer else (po, oo)
    chunk = None
    if panels_outer and x_bytes > 2 * PANELS_OUTER_CHUNK_BYTES and fam.conv_order == "auto":
        per_chunk = max(1, PANELS_OUTER_CHUNK_BYTES * n_blocks // x_bytes)
        if per_chunk < n_blocks:
            chunk, inner = so.split(po, factor=per_chunk)
    costly = out is not t and _calls_costly_math(out, t)
    # a costly epilogue runs along the block's channels (whole vectors, read contiguously), its results stored
    # per pixel: along the pixels it ran on 12- or 13-lane vectors read across the block, which LLVM legalized
    # element by element (YOLOX's 96 -> 96 3x3 with SiLU: 4.5 ms against 2.7 without the SiLU). A channels-last
    # output is written so too, each pixel's channels one contiguous vector store.
    along_channels = costly or channels_last
    first, second = (pi, oi) if along_channels else (oi, pi)
    if chunk is not None:
        so.reorder(chunk, outer, inner, first, second)
    else:
        so.reorder(outer, inner, first, second)
    so.unroll(first)
    if along_channels or (fam.name == "x86" and fam.lanes >= 16
                          and reduce_size(t) >= CONV_PIXELS_VECTOR_WRITEBACK_MIN_REDUCE):
        so.vectorize(second)
    else:
        so.unroll(second)
    if chunk is not None:
        if numel(out) * reduce_size(t) >= fam.parallel_min * 64:
            so.parallel(so.fuse(chunk, outer))
    elif numel(out) * reduce_size(t) >= fam.parallel_min * 64:
        axis = fam.parallel_axis
        if axis == "fused" or (axis == "auto" and panels_outer and n_panels < 2 * fam.parallel_tasks):
            # (auto: too few panels to balance the threads on)
            inner = outer = so.fuse(outer, inner)
        # "rows"/"cols" name the loop, wherever conv_order put it (an inner one: a parallel launch per outer step)
        so.parallel({"rows": po, "cols": oo}.get(axis, outer))
    accumulate_block_at(s, block, so, inner)
    if fam.prefetch_ahead and w_bytes > fam.cache_bytes:
        _prefetch_weights(s[block], t, fam.prefetch_ahead)


def _prefetch_weights(sb, t, ahead: int) -> None:
    """Prefetch the packed weight panels of conv ``t`` (3-D, ``attrs["panel"]`` wide, read in order by the block
    ``sb``'s reduction) ``ahead`` bytes on, at the innermost reduction loop of more than one step. The first pixel
    block to read a panel streams it from memory at ~10 bytes per cycle, more than one core's share of memory
    bandwidth, and each line it misses stalls the whole block: resnet50's 1x1 1024 -> 2048 (8 MB of weights) took
    2.43 ms inside the model against 1.94 when repeated with its weights in cache."""
    panel = int(t.op.attrs.get("panel", PANEL))
    tensor = next((x for x in t.op.input_tensors[1:] if len(x.shape) == 3 and int(x.shape[2]) == panel), None)
    if tensor is None or tensor.op not in {x.op for x in sb.op.input_tensors}:
        return
    loops = [ax for ax in sb.op.reduce_axis if int(ax.extent) > 1]
    if not loops:
        return
    row = panel * dtype_bits(tensor.dtype) // 8    # a panel's bytes per step (the reduction loops inside: 1 step)
    sb.prefetch(tensor, loops[-1], max(1, ahead // row))


def accumulate_block_at(s, block, so, inner) -> None:
    """Compute a register block of accumulators (pixels x output-channel vector) under the output's ``inner`` loop:
    the reduction outermost, so each step updates every accumulator of the block from one load per operand."""
    s[block].compute_at(so, inner)
    sb = s[block]
    bp, bo = list(block.op.axis)[-2:]
    sb.reorder(*block.op.reduce_axis, bp, bo)
    sb.unroll(bp)
    sb.vectorize(bo)


def row_columns(fam: Family, ow: int) -> int:
    """Output columns per micro-kernel row (the vectorized extent): whole vectors dividing the width if possible,
    else any divisor of the width from half a vector up, else the whole (short) row, else whole vectors with a
    scalar tail. A tail block runs as a scalar loop, so dividing the width matters more than full vectors."""
    widest = fam.max_col_vectors * fam.lanes
    for cols in range(widest, fam.lanes - 1, -fam.lanes):
        if ow % cols == 0:
            return cols
    # A partial vector wider than one register (28 columns of 16 lanes, 14 of 8) is never allowed: LLVM
    # legalizes it so badly that a 1x1 conv 32->64 at 56x56 ran at 2 GMAC/s (AVX-512, 28 columns) against 51
    # with 14 columns; AVX2 at 28x28: 6.5 GMAC/s with 14 columns, 35 with 7. (Measured on x86 only: ARM keeps
    # its wider partial vectors until timed on a real device.)
    cap = fam.lanes if fam.name == "x86" else widest
    for cols in range(min(cap, ow), max(1, fam.lanes // 2) - 1, -1):
        if ow % cols == 0:
            return cols
    if ow <= cap:
        return ow
    return widest


def _divisors_upto(n: int, limit: int) -> list:
    return [d for d in range(1, min(n, limit) + 1) if n % d == 0]


def _conv_block(fam: Family, oc: int, oh: int, ow: int) -> tuple:
    """(columns, output rows, output channels) of the conv micro-kernel.

    Columns: whole vectors, preferring a count that divides the output width (a tail column block runs as a
    scalar loop).  Then as many accumulators as the family allows, split between output channels (each weight
    broadcast once per block) and output rows (each input vector reused), preferring exact divisors."""
    cols = row_columns(fam, ow)
    budget = max(1, fam.acc_regs // -(-cols // fam.lanes))
    best = (1, 1)
    for ro in _divisors_upto(oc, budget):
        for ry in _divisors_upto(oh, budget // ro):
            # most accumulators; then fewer loads per FMA (ro broadcasts + ry vectors); then more channels
            key = (ro * ry, -(ro + ry), ro)
            if key > (best[0] * best[1], -(best[0] + best[1]), best[0]):
                best = (ro, ry)
    return cols, best[1], best[0]


def _schedule_window(s, t, fam: Family, ctx):
    """Depthwise conv and pooling: a block of output columns accumulated in registers over the (small) window,
    vectorized along the columns, one channel per parallel task; any epilogue is fused into the write-back."""
    block, out = accumulator_and_output(s, t, ctx)
    so = s[out]
    b, o, y, x = out.op.axis
    ow = int(t.shape[3])    # the window's own width: whole column blocks (ops.conv.window_columns)
    cols = row_columns(fam, ow)
    chan = so.fuse(b, o)
    if numel(out) >= fam.parallel_min:
        so.parallel(chan)
    xo, xi = so.split(x, factor=cols)
    so.vectorize(xi)
    sb = s[block]
    bb, bo, by, bx = block.op.axis
    rd = list(block.op.reduce_axis)
    pads = _channel_pads(block, t, fam, ctx)
    chunk = _channel_pad_rows(t, pads) if pads else 0
    if pads:
        if chunk < int(out.shape[2]):
            # a channel too large for the stack: its rows in chunks, each with its own part of the phases
            yo, _ = so.split(y, factor=chunk)
            so.reorder(chan, yo)
            sb.compute_at(so, yo)
        else:
            # the whole channel accumulates in a local block, its padded input made just before (both in cache)
            sb.compute_at(so, chan)
        bxo, bxi = sb.split(bx, factor=cols)
        sb.reorder(bb, bo, by, bxo, *rd, bxi)
        sb.vectorize(bxi)
        for src in pads:
            s[src].compute_at(sb, bo)
            ctx["serial"].add(id(src.op))
    else:
        rows = _window_rows(fam, t, cols)
        if rows > 1:
            yo, yi = so.split(y, factor=rows)
            so.reorder(chan, yo, xo, yi, xi)
            sb.compute_at(so, xo)
            sb.reorder(bb, bo, *rd, by, bx)
            sb.unroll(by)
        else:
            sb.compute_at(so, xo)
            sb.reorder(bb, bo, by, *rd, bx)
        sb.vectorize(bx)
    for r in rd:
        if axis_extent(r) <= fam.window_unroll:
            sb.unroll(r)


# ---------------------------------------------------------------- depthwise: a block of output rows
# A 5x5 depthwise layer reads each input row for five output rows: a block of rows x columns accumulated together
# loads each input vector once for all the block's rows that use it (LLVM merges the unrolled loads) where one
# row at a time loads it five times (5x5 256 @50x38: 0.73 -> 0.56 ms, 128 @100x76: 1.32 -> 0.96 ms; AVX-512).
# 3x3 windows measured no gain (their time is the memory passes), so they keep single rows.
_WINDOW_ROWS_MIN_KERNEL = 5
# accumulator vectors of a row block: the window's weights (25 broadcast registers for 5x5) take the rest of
# AVX-512's 32 (5 rows x 2 vectors at 25x19 -> 32 columns spilled and ran 1.3x slower than single rows)
_WINDOW_ROW_VECTORS = 6


def _window_rows(fam: Family, t, cols: int) -> int:
    """Output rows per register block of a depthwise window (1: a row at a time): the largest divisor of the
    output height whose block fits _WINDOW_ROW_VECTORS accumulators, for kernels at least 5 rows tall."""
    if c.tag_of(t.op) != c.DEPTHWISE_CONV2D or fam.lanes < 16:
        return 1
    if axis_extent(t.op.reduce_axis[0]) < _WINDOW_ROWS_MIN_KERNEL:
        return 1
    vectors = -(-cols // fam.lanes)
    return max(_divisors_upto(int(t.shape[2]), max(1, _WINDOW_ROW_VECTORS // vectors)))


# a channel's padded input and output block up to this many bytes each are made per channel (parallel tasks hold
# them on their stacks: codegen/function.py STACK_BYTES)
_CHANNEL_PAD_BYTES = 64 << 10
# ... and only when the whole-input pass is larger than this (it spills the L2; smaller ones stay cached, and the
# per-channel form's local block then costs more: 192->192 @28x28 s2, 0.7 MB of phases, went 1.15-1.4x slower)
_WHOLE_PASS_BYTES = 1 << 20


def _channel_pads(block, t, fam: Family, ctx) -> list:
    """The padding stages of a window kernel to make per channel inside its channel loop rather than as a pass
    of their own over the whole input (fam.window_pad_per_channel), or [] to keep that pass.

    Why: the whole-input pass wrote the padded (column-phase) tensor out to memory and the window read it back,
    memory-bound passes that were most of a stride-2 depthwise layer's time on AVX-512 (96->96 @112x112 s2: the
    phase split alone 0.36 ms of 0.74); one channel's copy stays in L2 while its window runs: 0.6-0.7x the
    time of mobilenet_v2's two large stride-2 layers (96 @112x112, 144 @56x56). Only the column-phase split of a
    strided window: stride-1 padding per channel measured 1.10x slower (its pass is cheap and vectorized, the
    local block costs more)."""
    if not fam.window_pad_per_channel:
        return []
    pads = [src for src in block.op.input_tensors
            if c.tag_of(src.op) == c.PAD and src.op.attrs.get("column_phases")
            and ctx["consumers"].get(id(src.op)) == [t.op]]
    if not pads:
        return []
    for src in pads:
        if 4 * numel(src) <= _WHOLE_PASS_BYTES:
            return []
    return pads if _channel_pad_rows(t, pads) else []


# ---------------------------------------------------------------- per-channel phases in row chunks
# A channel whose output block or column phases exceed _CHANNEL_PAD_BYTES (a detector's 32 channels @400x304 s2:
# 0.5 MB of phases each) made its phases as a pass over the whole input (16 MB, memory-bound: 3x3 s2 32 @400x304
# 2.5 ms in picodet against onnxruntime's 0.8); in chunks of output rows whose block and phase rows fit, each
# chunk's phases (with the window's overlap rows) stay in cache like a small channel's.
def _channel_pad_rows(t, pads) -> int:
    """Output rows per chunk of a per-channel window (the whole height when the channel fits), 0 when not even
    one row fits."""
    oh, ow = int(t.shape[2]), int(t.shape[3])
    rows = min(oh, _CHANNEL_PAD_BYTES // (4 * ow))
    for src in pads:
        height, row_bytes = int(src.shape[2]), 4 * numel(src) // (int(src.shape[0]) * int(src.shape[1]) *
                                                                  int(src.shape[2]))
        extra = max(0, height - oh * (height // oh))      # rows the window reads past stride x rows (the overlap)
        stride = max(1, height // oh)
        while rows and (rows * stride + extra) * row_bytes > _CHANNEL_PAD_BYTES:
            rows -= 1
    return rows


def _schedule_global_pool(s, t, fam: Family, ctx):
    st = s[t]
    b, o, _, _ = t.op.axis
    if numel(t) * reduce_size(t) >= fam.parallel_min:
        st.parallel(st.fuse(b, o))


def _schedule_root(s, t, fam: Family, ctx):
    """Materialized intermediate (padding, softmax exp): plain injective schedule (serial when it was attached
    inside a consumer's parallel loop)."""
    _vectorize_inner(s, t, fam, parallel=id(t.op) not in ctx["serial"], block=t.op.attrs.get("vector_block"))


_BY_TAG: Dict[str, Callable] = {
    c.ELEMWISE: _schedule_injective,
    c.BROADCAST: _schedule_injective,
    c.INJECTIVE: _schedule_injective,
    c.PAD: _schedule_root,
    c.SOFTMAX_STAGE: _schedule_root,
    c.REDUCE: _schedule_reduce,
    c.MATMUL: _schedule_matmul,
    c.MATMUL_PACK: _schedule_pack,
    c.ROWDOT_PARTIAL: _schedule_rowdot_partial,
    c.ROWDOT_FINAL: _schedule_rowdot_final,
    c.CONV2D: _schedule_conv2d,
    c.CONV2D_PIXELS: _schedule_conv_pixels,
    c.DEPTHWISE_CONV2D: _schedule_window,
    c.POOL: _schedule_window,
    c.GLOBAL_POOL: _schedule_global_pool,
}

# Kernels whose elementwise consumers are fused into their write-back loop.
_EPILOGUE_KERNELS = frozenset({c.MATMUL, c.CONV2D, c.CONV2D_PIXELS, c.DEPTHWISE_CONV2D, c.POOL})
# Consumers that read their input many times per output: keep injective producers (padding) materialized.
_MATERIALIZE_INPUTS_OF = frozenset({c.CONV2D, c.CONV2D_PIXELS, c.DEPTHWISE_CONV2D, c.POOL, c.MATMUL})


def schedule(outs, target="host", config=None):
    """A te schedule for `outs` (tensor or list of tensors built by tether.ops) with each op's default schedule
    for `target` (a preset name, target string or Target). ``config`` ({knob: value}, see `KNOBS`) replaces
    some of the family's defaults, e.g. a config found by ``tether tune``; None or {} is the default schedule."""
    outs = [outs] if isinstance(outs, te.Tensor) else list(outs)
    tgt = target if isinstance(target, Target) else Target(target)
    s = te.create_schedule([t.op for t in outs])
    order, consumers = _collect(outs)
    # a kernel computing in float16 is blocked in half lanes, also when it ends in a cast to float32
    half = any(_is_compute(op) and str(op.output(0).dtype) == "float16" for op in order)
    fam = with_config(family_of(tgt, "float16" if half else "float32"), config)
    out_ids = {id(t.op) for t in outs}

    inline = set()
    for op in order:
        if id(op) in out_ids or not c.is_injective(op):
            continue
        users = consumers.get(id(op), [])
        if any(c.tag_of(u) in _MATERIALIZE_INPUTS_OF for u in users):
            continue
        inline.add(id(op))

    # An epilogue kernel whose only consumers are (chains of) inlined injective ops ending in one output stage
    # is computed block-wise inside that output stage.
    anchor = {}
    for op in order:
        # (a padded product keeps its own full-width tiles; only its unpadding copy carries the epilogue)
        if c.tag_of(op) in _EPILOGUE_KERNELS and id(op) not in out_ids and "padded_from" not in op.attrs:
            target_op = _single_injective_sink(op, consumers, inline, out_ids)
            if target_op is not None and len(target_op.output(0).shape) == len(op.output(0).shape):
                anchor[id(op)] = target_op.output(0)

    ctx = {"anchor": anchor, "consumers": consumers, "serial": set(), "outputs": out_ids}
    for op in order:
        if id(op) in inline:
            s[op].compute_inline()
    anchored_outputs = {id(a.op) for a in anchor.values()}
    for op in reversed(order):
        if id(op) in inline or id(op) in anchored_outputs:
            continue
        fn = _BY_TAG.get(c.tag_of(op))
        if fn is None:
            log.debug("no default schedule for op %s (tag %r): left as written", op.name, c.tag_of(op))
            continue
        fn(s, op.output(0), fam, ctx)
    return s


def _single_injective_sink(op, consumers, inline, out_ids):
    """Follow op's consumers through inlined injective ops; return the single output op they all end in, if any.
    The paths may part and meet again (SiLU's x * sigmoid(x) reads x twice): the output still computes each
    element of op once per element it writes."""
    sink = None
    seen = set()
    frontier = [op]
    while frontier:
        cur = frontier.pop()
        users = consumers.get(id(cur), [])
        if not users:
            return None
        for u in users:
            if id(u) in seen:
                continue
            seen.add(id(u))
            if not c.is_injective(u) or len(seen) > 64:
                return None
            if id(u) in out_ids:
                if sink is not None and sink is not u:
                    return None
                sink = u
            elif id(u) in inline:
                frontier.append(u)
            else:
                return None
    return sink


# ---------------------------------------------------------------------------------------------------------------
# tuning configs: a config is {knob: value} over the Family fields below; tether.tune searches them

#: knob -> its type; every knob is a Family field, so a config is the family with some fields replaced
KNOBS: Dict[str, type] = {f.name: (bool if f.type in ("bool", bool) else str if f.type in ("str", str) else int)
                          for f in dataclasses.fields(Family) if f.name != "name"}
CONV_ORDERS = ("auto", "pixels", "panels")
PARALLEL_AXES = ("auto", "rows", "cols", "fused")
_STR_CHOICES = {"conv_order": CONV_ORDERS, "parallel_axis": PARALLEL_AXES}


def with_config(fam: Family, config) -> Family:
    """`fam` with the knobs of `config` replaced; a knob or value the schedules cannot take raises ScheduleError
    naming it (a config never silently means something else)."""
    if not config:
        return fam
    bad = sorted(set(config) - set(KNOBS))
    if bad:
        raise ScheduleError("unknown schedule knob(s) %s; the knobs are: %s" % (", ".join(bad), ", ".join(KNOBS)))
    for k, v in config.items():
        kind = KNOBS[k]
        if kind is str:
            ok = v in _STR_CHOICES.get(k, (v,))
        else:
            zero_ok = k in ("conv_pixels", "conv_panel", "prefetch_ahead")  # 0: derived (mm_rows; the packing), off
            ok = isinstance(v, (int, bool)) and (kind is bool or int(v) >= (0 if zero_ok else 1))
        if not ok or (kind is str and not isinstance(v, str)):
            raise ScheduleError("schedule knob %s=%r is not a valid %s" % (k, v, kind.__name__))
    return dataclasses.replace(fam, **{k: (bool(v) if KNOBS[k] is bool else v) for k, v in config.items()})


# ---------------------------------------------------------------------------------------------------------------
# conv2d_pixels' pixel block on AVX-512: a block size that divides the map's pixels
# The last, partial pixel block of a conv2d_pixels kernel runs with a run-time pixel count: its accumulators live in
# memory, not registers, at a fraction of the full blocks' speed. On the 4 x 80 maps of a CRNN recognizer (320
# pixels, 27 blocks of 12, the last one of 8) that tail was ~7% of the layer; blocks of 10 divide 320 and left no
# tail: 256->256 @4x80 1.28x -> 1.18x onnxruntime's time (128->128 @8x25, 200 pixels: 1.15x -> 1.03x). Only a
# block at most two pixels smaller is taken (fewer accumulators per weight load), only where it divides the pixels
# exactly, only on small maps (at most PIXEL_BLOCK_MAX_BLOCKS blocks), where one partial block is a share worth
# the smaller block, and only when the partial block is over half a block (a tail of 4, as at 20 x 20 = 400
# pixels, measured even or slightly worse with blocks of 10); larger maps (the zoo CNNs', YOLO's 640 x 640 levels)
# keep 12.
PIXEL_BLOCK_SHRINK = 2
PIXEL_BLOCK_MAX_BLOCKS = 64


# ---------------------------------------------------------------- conv2d_pixels: a one-pixel larger block
# A 416 x 416 detector (YOLOX) has maps of 13 * 2**k pixels on a side: 52 x 52 = 2704 = 225 x 12 + 4 leaves each
# of its 3x3 convs a partial last block (accumulators in memory), 26 x 26 = 676 too; 13 divides both. Blocks of
# 13 (13 of AVX-512's 32 zmm) on the 96->96 3x3 convs measured 1.05x -> 0.98x onnxruntime's time at 52 x 52 and
# 1.03x -> 0.97x at 26 x 26 (x86 AVX-512, 1 thread, interleaved). On a 13 x 13 map (13 blocks) 13 measured
# 1.33x -> 1.95x (96->96), hence the minimum block count; maps of 12 * n pixels and the zoo CNNs' (112, 56, 28,
# 14, 7 on a side) and YOLOv8-640's (320 ... 20) maps, which 13 does not divide, keep their block.
PIXEL_BLOCK_GROW = 1
PIXEL_BLOCK_GROW_MIN_BLOCKS = 32


def pixel_block(fam: Family, pixels: int, panel: int = 0) -> int:
    """Output pixels per conv2d_pixels register block for a conv of ``pixels`` output pixels: the family's block,
    or on x86 AVX-512, where that leaves a partial last block, a block near it that divides the pixels (up to
    PIXEL_BLOCK_SHRINK smaller on small maps, PIXEL_BLOCK_GROW larger on large ones; the two comments above).
    On Arm a ``panel`` narrower than ops.linear.PANEL takes as many more pixels as fit the same accumulators."""
    rows = fam.conv_pixels or fam.mm_rows
    if fam.name in ("aarch64", "armv7") and 0 < panel < PANEL:
        rows = rows * PANEL // panel
        return next((r for r in range(rows, rows // 2, -1) if pixels % r == 0), rows)
    if fam.name != "x86" or fam.lanes < 16 or pixels % rows == 0:
        return rows
    if pixels % rows > rows // 2 and -(-pixels // rows) <= PIXEL_BLOCK_MAX_BLOCKS:
        for r in range(rows - 1, max(1, rows - PIXEL_BLOCK_SHRINK) - 1, -1):
            if pixels % r == 0:
                return r
    grown = rows + PIXEL_BLOCK_GROW
    if pixels % grown == 0 and pixels // grown >= PIXEL_BLOCK_GROW_MIN_BLOCKS:
        return grown
    return rows
