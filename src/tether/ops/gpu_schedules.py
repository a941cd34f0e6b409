"""Default GPU schedules of the op library: `schedule_gpu(outs, limits, config)`.

The walk is the CPU one's (`ops.schedules.schedule`): injective producers are inlined into their consumers, and
a kernel whose only consumers are elementwise ops ending in one output (bias, activation, the copy out of a
padded product) is computed inside that output's threads, in registers, so the epilogue costs no extra pass.
Every remaining root stage is one GPU kernel (docs/gpu.md "Schedules of the op families"):
- injective (elementwise chains, layout transforms, concat, resize, padding, packing): all output axes fused,
  split by the block size, bound to blockIdx.x / threadIdx.x;
- reductions, pooling, direct / depthwise / grouped convolution: one thread per output element (or per a few
  consecutive output columns: ``outputs_per_thread``), accumulating in a register (a "local" cache);
- matmul / dense / batched matmul: a work-group computes a tile of the output, each thread a small register
  block of it, and the k loop walks the operands through shared-memory tiles that the work-group fetches
  together (tails guarded).

- a long reduction with few outputs (a global pool, a reduce to a scalar, softmax's row max and sum, norm
  statistics): a work-group per output element, its threads splitting the reduction and combining their partials
  in a shared-memory tree (the reduction axis bound to threadIdx.x; ``reduce_threads``, 0 turns it off). One
  thread per output over the whole reduction would leave most of the device idle.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, Mapping, Optional

from tether import te
from tether.errors import ScheduleError
from tether.tir import Const, Reduce, TensorLoad, walk
from tether.tir.dtype import bits

from . import common as c
from .schedules import _collect, numel

#: default device limits: those of Mali-class GPUs, so that a default schedule runs everywhere
DEFAULT_MAX_THREADS = 256
DEFAULT_MAX_SHARED_BYTES = 16 * 1024


@dataclasses.dataclass(frozen=True)
class GpuLimits:
    """What one work-group may use; the names are split_host_device's keyword arguments."""

    max_threads_per_block: int = DEFAULT_MAX_THREADS
    max_shared_bytes: int = DEFAULT_MAX_SHARED_BYTES


@dataclasses.dataclass(frozen=True)
class GpuKnobs:
    """The tunable choices of the GPU schedules (a config replaces some of them; see GPU_KNOBS)."""

    block: int = 256               # threads per work-group of the one-dimensional schedules
    outputs_per_thread: int = 1    # reductions (conv, pooling): consecutive outputs along the last axis per thread
    mm_threads_y: int = 8          # matmul work-group: threads along the rows ...
    mm_threads_x: int = 8          # ... and along the columns of the output tile
    mm_block_y: int = 4            # matmul register block of one thread: rows ...
    mm_block_x: int = 4            # ... and columns
    mm_ktile: int = 8              # matmul: k steps per shared-memory tile
    pad: str = "inline"            # padding of convolution / pooling inputs: "inline" (read through a select) or
                                   # "materialize" (a kernel of its own writing the padded copy)
    reduce_threads: int = 256      # threads of the work-group tree reduction of a long reduction with few outputs
                                   # (see wants_tree_reduction); 0: one thread per output instead


GPU_KNOBS: Dict[str, type] = {f.name: (str if f.type in ("str", str) else int) for f in dataclasses.fields(GpuKnobs)}
PAD_CHOICES = ("inline", "materialize")
# knobs for which 0 is a valid value (it turns the feature off)
_ZERO_OFF = frozenset({"reduce_threads"})

#: a reduction gets a work-group tree when it has fewer output elements than this (each output is then a
#: work-group, and fewer threads than this times the block would leave a GPU idle when run one per output) ...
TREE_MAX_OUTPUTS = 2048
#: ... and at least this many elements to combine per output (shorter ones are cheaper in one thread)
TREE_MIN_REDUCTION = 64

_MATMUL_TAGS = frozenset({c.MATMUL})
# tags the GPU inlines on top of the injective ones: a panel packing is a CPU layout; read through it in place
_ALSO_INLINED = frozenset({c.MATMUL_PACK})


def gpu_limits(limits: Any = None) -> GpuLimits:
    """``limits`` as GpuLimits: None (the defaults), a GpuLimits, or a mapping with max_threads_per_block and/or
    max_shared_bytes (split_host_device's names) or shared_memory_bytes (DeviceAPI.info()'s name), so a device's
    info can be passed as it is (its other keys are not read)."""
    if limits is None:
        return GpuLimits()
    if isinstance(limits, GpuLimits):
        return limits
    if not isinstance(limits, Mapping):
        raise ScheduleError(f"GPU limits must be a mapping with max_threads_per_block / max_shared_bytes, got "
                            f"{limits!r}")
    out = {}
    for k, field in (("max_threads_per_block", "max_threads_per_block"), ("shared_memory_bytes", "max_shared_bytes"),
                     ("max_shared_bytes", "max_shared_bytes")):
        if k in limits:
            v = limits[k]
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ScheduleError(f"GPU limit {k} must be a positive int, got {v!r}")
            out[field] = v
    return GpuLimits(**out)


def gpu_knobs(config: Optional[Mapping[str, Any]] = None) -> GpuKnobs:
    """The default knobs with those of ``config`` replaced; an unknown knob or a bad value is a ScheduleError
    naming it (a config never silently means something else)."""
    if not config:
        return GpuKnobs()
    bad = sorted(set(config) - set(GPU_KNOBS))
    if bad:
        raise ScheduleError("unknown GPU schedule knob(s) %s; the knobs are: %s"
                            % (", ".join(bad), ", ".join(GPU_KNOBS)))
    for k, v in config.items():
        low = 0 if k in _ZERO_OFF else 1
        is_int = isinstance(v, int) and not isinstance(v, bool)
        ok = (v in PAD_CHOICES) if GPU_KNOBS[k] is str else (is_int and v >= low)
        if not ok:
            expected = (" or ".join(PAD_CHOICES) if GPU_KNOBS[k] is str
                        else "0 (off) or a positive int" if low == 0 else "a positive int")
            raise ScheduleError(f"GPU schedule knob {k}={v!r} is not valid (expected {expected})")
    return dataclasses.replace(GpuKnobs(), **dict(config))


def _pow2_at_least(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


class _Ctx:
    def __init__(self, knobs: GpuKnobs, limits: GpuLimits, explicit: frozenset):
        self.knobs, self.limits, self.explicit = knobs, limits, explicit

    def block(self, outputs: int) -> int:
        """Threads per work-group for ``outputs`` threads' worth of work: the knob (an explicit one over the device
        limit is refused, the default is capped by it)."""
        b = self.knobs.block
        if b > self.limits.max_threads_per_block:
            if "block" in self.explicit:
                raise ScheduleError(f"GPU schedule knob block={b} is over the device's "
                                    f"{self.limits.max_threads_per_block} threads per work-group")
            b = self.limits.max_threads_per_block
        # never wider than the work (a 10-element op gets a work-group of 16, not 256)
        return min(b, max(1, _pow2_at_least(outputs)))


    def reduce_threads(self, length: int, itemsize: int) -> int:
        """Threads of a work-group tree reduction over ``length`` elements of ``itemsize`` bytes (the knob, capped
        by the device's thread and shared-memory limits unless given explicitly, and by the next power of two of
        the length)."""
        b = self.knobs.reduce_threads
        lim = self.limits
        explicit = "reduce_threads" in self.explicit
        if b > lim.max_threads_per_block:
            if explicit:
                raise ScheduleError(f"GPU schedule knob reduce_threads={b} is over the device's "
                                    f"{lim.max_threads_per_block} threads per work-group")
            b = lim.max_threads_per_block
        if b * itemsize > lim.max_shared_bytes:
            if explicit:
                raise ScheduleError(f"GPU schedule knob reduce_threads={b} needs {b * itemsize} bytes of shared "
                                    f"memory, over the device's {lim.max_shared_bytes}")
            b = max(1, lim.max_shared_bytes // itemsize)
        return min(b, _pow2_at_least(length))


def reduction_length(op) -> int:
    """How many elements each output element of reduction ``op`` combines."""
    n = 1
    for a in op.reduce_axis:
        n *= int(a.extent)
    return n


def wants_tree_reduction(op) -> bool:
    """Whether schedule_gpu gives reduction ``op`` a work-group tree (unless ``reduce_threads`` is 0): few output
    elements, each combining many."""
    if not isinstance(getattr(op, "body", None), Reduce) or not op.axis:
        return False
    return numel(op.output(0)) < TREE_MAX_OUTPUTS and reduction_length(op) >= TREE_MIN_REDUCTION


def schedule_gpu(outs, limits: Any = None, config: Optional[Mapping[str, Any]] = None) -> "te.Schedule":
    """A te schedule for ``outs`` (a tensor or list of tensors built by tether.ops) whose every root stage is a
    GPU kernel within ``limits`` (see gpu_limits; defaults 256 threads and 16 KiB of shared memory per
    work-group). ``config`` ({knob: value}, GPU_KNOBS; gpu_space gives the choices) replaces default knobs."""
    outs = [outs] if isinstance(outs, te.Tensor) else list(outs)
    ctx = _Ctx(gpu_knobs(config), gpu_limits(limits), frozenset(config or ()))
    s = te.create_schedule([t.op for t in outs])
    order, consumers = _collect(outs)
    out_ids = {id(t.op) for t in outs}

    inline = set()
    for op in order:
        if id(op) in out_ids or isinstance(op.body, Reduce):
            continue
        tag = c.tag_of(op)
        if tag == c.PAD and ctx.knobs.pad == "materialize":
            continue
        if c.is_injective(op) or tag in _ALSO_INLINED:
            inline.add(id(op))
    for op in order:
        if id(op) in inline:
            s[op].compute_inline()

    # a reduction whose consumers are a chain of inlined injective ops reading one element of it per element,
    # ending in one output, is computed in that output's threads (in a register: no pass over memory for the
    # epilogue, the layout copy or the crop of a padded product)
    anchor: Dict[int, Any] = {}
    for op in order:
        if isinstance(op.body, Reduce) and id(op) not in out_ids:
            sink = _identity_sink(op, consumers, inline, out_ids)
            if sink is not None and id(sink) not in {id(a) for a in anchor.values()}:
                anchor[id(op)] = sink
    anchored_outputs = {id(a): k for k, a in anchor.items()}

    for op in reversed(order):
        if id(op) in inline or id(op) in anchor:
            continue
        kernel = next((o for o in order if id(o) == anchored_outputs.get(id(op))), None)
        _schedule_root(s, op, kernel, ctx)
    return s


def _identity_sink(op, consumers, inline, out_ids):
    """The output op that a chain of inlined injective consumers of ``op`` ends in, when each link reads one element
    of the one before per element (so a thread of the output needs one element of ``op``, computed by no other)."""
    cur = op
    for _ in range(64):
        users = consumers.get(id(cur), [])
        if len({id(u) for u in users}) != 1:
            return None
        u = users[0]
        if not c.is_injective(u) or not _reads_one_element(u, cur):
            return None
        if id(u) in out_ids:
            return u
        if id(u) not in inline:
            return None
        cur = u
    return None


def _reads_one_element(u, producer) -> bool:
    """Whether each element of ``u`` reads one element of ``producer`` that no other element of ``u`` reads: every
    load of it indexes with u's axes, each used once, in any order (a layout copy), every axis of extent > 1 used
    (else elements would share, and each thread recompute, the producer's element: a row sum read by a whole
    row), and constants elsewhere (a slice, or 0 where a broadcasting op reads an axis of extent 1)."""
    loads = [n for n in walk(u.body) if isinstance(n, TensorLoad) and n.tensor.op is producer]
    def same(i, j) -> bool:
        return i is j or (isinstance(i, Const) and isinstance(j, Const) and i.value == j.value)

    if not loads or any(len(ld.indices) != len(loads[0].indices)
                        or not all(same(i, j) for i, j in zip(ld.indices, loads[0].indices)) for ld in loads):
        return False        # none, or two elements of it (x[i, j] + x[j, i]): each would be computed twice
    needed = {id(a) for a in u.axis if int(a.extent) > 1}
    axis_ids = {id(a) for a in u.axis}
    for ld in loads:
        used = [id(i) for i in ld.indices if id(i) in axis_ids]
        if len(used) != len(set(used)) or not needed <= set(used):
            return False
        if any(id(i) not in axis_ids and not isinstance(i, Const) for i in ld.indices):
            return False
    return True


def _reads_in_place(sink, kernel) -> bool:
    """Whether ``sink`` reads ``kernel`` through its chain of inlined injective ops at the same index: every link
    loads the one before with exactly its own axes, in order (0 where an axis has extent 1)."""
    def same(i, a) -> bool:
        return i is a or (int(a.extent) == 1 and isinstance(i, Const) and i.value == 0)

    cur, seen = sink, 0
    while cur is not kernel and seen < 64:
        seen += 1
        loads = [n for n in walk(cur.body) if isinstance(n, TensorLoad)
                 and (n.tensor.op is kernel or _reaches(n.tensor.op, kernel))]
        if not loads or len({id(ld.tensor.op) for ld in loads}) != 1:
            return False
        if not all(len(ld.indices) == len(cur.axis) and all(same(i, a) for i, a in zip(ld.indices, cur.axis))
                   for ld in loads):
            return False
        cur = loads[0].tensor.op
    return cur is kernel


def _reaches(op, target, depth: int = 0) -> bool:
    if op is target:
        return True
    if depth > 64 or not isinstance(op, te.ComputeOp):
        return False
    return any(_reaches(t.op, target, depth + 1) for t in op.input_tensors)


def _schedule_root(s, op, kernel, ctx: _Ctx) -> None:
    """Schedule root stage ``op``; ``kernel``: the reduction computed inside its threads (an epilogue's kernel)."""
    main = kernel if kernel is not None else op
    tag = c.tag_of(main)
    # the output tile is laid over op's own axes: the product's, when op reads it at its own index (an epilogue,
    # the crop of a padded product), not when op is a transpose or reshape of it
    if tag in _MATMUL_TAGS and _matmul_form(main) is not None and (kernel is None or _reads_in_place(op, kernel)):
        _schedule_matmul(s, op, main, ctx)
    elif isinstance(main.body, Reduce) and ctx.knobs.reduce_threads and wants_tree_reduction(main) and op.axis:
        _schedule_tree_reduction(s, op, main, ctx)
    elif isinstance(main.body, Reduce):
        _schedule_per_output(s, op, main, ctx)
    else:
        _schedule_injective(s, op, ctx)


def _bind_1d(s, op, axes, ctx: _Ctx, outputs: int):
    """Fuse ``axes`` of ``op``'s stage, split by the block size, bind; returns the threadIdx.x axis."""
    st = s[op]
    fused = st.fuse(*axes) if len(axes) > 1 else axes[0]
    bx, tx = st.split(fused, factor=ctx.block(outputs))
    st.bind(bx, te.thread_axis("blockIdx.x"))
    st.bind(tx, te.thread_axis("threadIdx.x"))
    return tx


def _check_rank(op) -> None:
    if not op.axis:
        raise ScheduleError(f"GPU schedule of {op.name!r}: a 0-d result has no axis to run threads over; keep a "
                            "dimension of extent 1 (keepdims=True)")


def _schedule_injective(s, op, ctx: _Ctx) -> None:
    _check_rank(op)
    _bind_1d(s, op, list(s[op].op.axis), ctx, numel(op.output(0)))


def _schedule_per_output(s, op, kernel, ctx: _Ctx) -> None:
    """One thread per output element (or per ``outputs_per_thread`` consecutive ones along the last axis), the
    reduction accumulated in a register: the kernel stage attached inside the thread, reduction loops outermost."""
    _check_rank(op)
    if kernel is op:
        kernel_t = s.cache_write(op.output(0), "local")
        comp = s[kernel_t]
    else:
        comp = s[kernel]
    st = s[op]
    axes = list(st.op.axis)
    per = ctx.knobs.outputs_per_thread
    per = min(per, int(axes[-1].extent))
    inner = None
    if per > 1:
        xo, inner = st.split(axes[-1], factor=per)
        axes = axes[:-1] + [xo]
    total = numel(op.output(0)) // per if per > 1 else numel(op.output(0))
    tx = _bind_1d(s, op, axes, ctx, max(1, total))
    if inner is not None:
        st.unroll(inner)
    comp.compute_at(st, tx)
    # the reduction outermost, the thread's outputs inside it: each input element the window reads is loaded once
    # per step for all of the thread's outputs
    data = [a for a in comp.leaf_iter_vars if a.kind == "data"]
    red = [a for a in comp.leaf_iter_vars if a.kind == "reduce"]
    if red and data:
        comp.reorder(*(red + data))


def _schedule_tree_reduction(s, op, kernel, ctx: _Ctx) -> None:
    """A work-group per output element: the reduction split over its threads (threadIdx.x, strided so that
    neighbouring threads read neighbouring elements), each thread's partial in a register, the partials combined
    in a shared-memory tree (the lowering of a reduction axis bound to threadIdx). The output's own store runs in
    thread 0 (a threadIdx.x loop of one iteration)."""
    if kernel is op:
        comp = s[s.cache_write(op.output(0), "local")]
    else:
        comp = s[kernel]
    st = s[op]
    axes = list(st.op.axis)
    fused = st.fuse(*axes) if len(axes) > 1 else axes[0]
    bx, t1 = st.split(fused, factor=1)
    st.bind(bx, te.thread_axis("blockIdx.x"))
    st.bind(t1, te.thread_axis("threadIdx.x"))
    comp.compute_at(st, bx)
    red = [a for a in comp.leaf_iter_vars if a.kind == "reduce"]
    r = comp.fuse(*red) if len(red) > 1 else red[0]
    itemsize = max(1, bits(kernel.output(0).dtype) // 8)
    ro, ri = comp.split(r, factor=ctx.reduce_threads(reduction_length(kernel), itemsize))
    comp.reorder(ri, ro)
    comp.bind(ri, te.thread_axis("threadIdx.x"))


def _matmul_form(op):
    """(batch axes, row axis, column axis, reduction axis) of a matmul-tagged op of rank >= 2 with one reduction
    axis, else None (then it is scheduled one thread per output)."""
    if len(op.axis) < 2 or len(op.reduce_axis) != 1:
        return None
    return list(op.axis[:-2]), op.axis[-2], op.axis[-1], op.reduce_axis[0]


def _direct_loads(st):
    """Tensors the stage's body loads directly, in first-use order."""
    body = st.body.source if isinstance(st.body, Reduce) else st.body
    out = []
    for n in walk(body):
        if isinstance(n, TensorLoad) and all(n.tensor is not t for t in out):
            out.append(n.tensor)
    return out


def _matmul_tile(ctx: _Ctx, m: int, n: int):
    """(threads_y, threads_x, block_y, block_x, ktile) within the limits, the tile shrunk (halving the register
    block first) while it is twice the output's extent or more; the default ktile shrinks to fit shared memory,
    explicit knobs over a limit are refused."""
    k = ctx.knobs
    ty, tx, by, bx, kt = k.mm_threads_y, k.mm_threads_x, k.mm_block_y, k.mm_block_x, k.mm_ktile
    # the tile is at most what the output needs (a dense layer of one row gets one thread row, not 32 rows)
    while ty * by >= 2 * m and by > 1:
        by //= 2
    while ty * by >= 2 * m and ty > 1:
        ty //= 2
    while tx * bx >= 2 * n and bx > 1:
        bx //= 2
    while tx * bx >= 2 * n and tx > 1:
        tx //= 2
    lim = ctx.limits
    explicit_threads = {"mm_threads_y", "mm_threads_x"} & ctx.explicit
    while ty * tx > lim.max_threads_per_block and not explicit_threads:
        if ty >= tx:
            ty //= 2
        else:
            tx //= 2
    if ty * tx > lim.max_threads_per_block:
        raise ScheduleError(f"GPU matmul work-group mm_threads_y x mm_threads_x = {ty} x {tx} is over the device's "
                            f"{lim.max_threads_per_block} threads per work-group")

    def shared(kt):
        return 4 * kt * (ty * by + tx * bx)
    while shared(kt) > lim.max_shared_bytes and kt > 1 and "mm_ktile" not in ctx.explicit:
        kt //= 2
    if shared(kt) > lim.max_shared_bytes:
        raise ScheduleError(f"GPU matmul tiles ({ty * by} + {tx * bx}) x {kt} float32 need {shared(kt)} bytes of "
                            f"shared memory, over the device's {lim.max_shared_bytes}")
    return ty, tx, by, bx, kt


def _schedule_matmul(s, op, kernel, ctx: _Ctx) -> None:
    """A work-group per (ty*by) x (tx*bx) output tile, a thread per by x bx register block; k in steps of ktile,
    the operands' tiles fetched into shared memory by the whole work-group between barriers."""
    if kernel is op:
        comp = s[s.cache_write(op.output(0), "local")]
    else:
        comp = s[kernel]
    st = s[op]
    batch, i, j = list(st.op.axis[:-2]), st.op.axis[-2], st.op.axis[-1]
    m, n = int(i.extent), int(j.extent)
    ty, tx, by, bx, kt = _matmul_tile(ctx, m, n)
    operands = _direct_loads(comp)
    caches = [s.cache_read(t, "shared", [comp]) for t in operands]
    bi, ri = st.split(i, factor=ty * by)
    ti, vi = st.split(ri, factor=by)
    bj, rj = st.split(j, factor=tx * bx)
    tj, vj = st.split(rj, factor=bx)
    st.reorder(*batch, bi, bj, ti, tj, vi, vj)
    thy, thx = te.thread_axis("threadIdx.y"), te.thread_axis("threadIdx.x")
    if batch:
        bz = st.fuse(*batch) if len(batch) > 1 else batch[0]
        st.bind(bz, te.thread_axis("blockIdx.z"))
    st.bind(bi, te.thread_axis("blockIdx.y"))
    st.bind(bj, te.thread_axis("blockIdx.x"))
    st.bind(ti, thy)
    st.bind(tj, thx)
    st.unroll(vi)
    st.unroll(vj)
    comp.compute_at(st, tj)
    data = [a for a in comp.leaf_iter_vars if a.kind == "data"]
    (r,) = [a for a in comp.leaf_iter_vars if a.kind == "reduce"]
    ko, ki = comp.split(r, factor=kt)
    comp.reorder(ko, ki, *data)
    for cache in caches:
        cs = s[cache]
        cs.compute_at(comp, ko)
        fused = cs.fuse(*cs.op.axis)
        rest, x = cs.split(fused, factor=tx)
        outer, y = cs.split(rest, factor=ty)
        cs.bind(x, thx)
        cs.bind(y, thy)
