"""GPU scheduling: thread binding, shared/local caches, barriers, and the host/device split with its build-time
verification (the structure of the lowered code; tests/test_gpu_schedule_opencl.py runs it on pocl)."""
from __future__ import annotations

import re

import pytest

import tether
from tether import te, tir
from tether.errors import ScheduleError
from tether.tir.buffer import Buffer
from tether.tir.device import Barrier, DeviceKernel
from tether.tir.device_split import DeviceProgram, split_host_device
from tether.tir.expr import Compare, Const, Load, Var
from tether.tir.stmt import For, IfThenElse, PrimFunc, Store, seq

from fixtures.gpu_kernels import (matmul_gpu, rowsum_gpu, scale2d_gpu, shifted_exp_gpu, softmax_gpu, stencil_gpu,
                                  vadd_gpu)


def thread_loops(body):
    return [(s.var.name, s.thread_tag, s.extent.value) for s in tir.walk(body)
            if isinstance(s, For) and s.kind == "thread"]


def kernel_loops(kernel: DeviceKernel):
    return [s for s in tir.walk(kernel.body) if isinstance(s, For)]


def tags(kernel: DeviceKernel):
    return {v.name: t for v, t in kernel.thread_of.items()}


# ---- thread axes and bind ---------------------------------------------------------------------------------------

def test_thread_axis_is_an_itervar_with_its_tag():
    for tag in tir.device.THREAD_TAGS:
        ax = te.thread_axis(tag)
        assert isinstance(ax, te.IterVar) and ax.thread_tag == tag and ax.kind == "thread"
    assert te.thread_axis((0, 64), "threadIdx.x").extent == 64
    assert te.thread_axis(32, "threadIdx.y").extent == 32


def test_thread_axis_refuses_an_unknown_tag_naming_the_valid_ones():
    with pytest.raises(ScheduleError, match=r"'threadIdx\.w'.*blockIdx\.x, blockIdx\.y.*threadIdx\.z"):
        te.thread_axis("threadIdx.w")
    with pytest.raises(ScheduleError, match="'vthread'"):
        te.thread_axis("vthread")


def test_bound_loops_lower_to_thread_loops():
    s, args = vadd_gpu(1024, block=64)
    pf = tether.lower(s, args, "vadd")
    assert thread_loops(pf.body) == [("i.outer", "blockIdx.x", 16), ("i.inner", "threadIdx.x", 64)]
    text = str(pf)
    assert "for i.outer in range(16) thread(blockIdx.x):" in text
    assert "for i.inner in range(64) thread(threadIdx.x):" in text


# ---- the split --------------------------------------------------------------------------------------------------

def test_vector_add_is_one_kernel_with_its_grid_and_block():
    s, args = vadd_gpu(1000, block=64)
    prog = split_host_device(tether.lower(s, args, "vadd"))
    assert isinstance(prog, DeviceProgram)
    assert len(prog.kernels) == 1 and prog.temporaries == [] and prog.args == [[0, 1, 2]]
    k = prog.kernels[0]
    assert k.name == "vadd_kernel0"
    assert k.grid == (16, 1, 1) and k.block == (64, 1, 1)      # ceil(1000 / 64) work-groups
    assert [b.name for b in k.params] == ["A", "B", "C"]
    assert tags(k) == {"i.outer": "blockIdx.x", "i.inner": "threadIdx.x"}
    assert kernel_loops(k) == []                                 # the thread loops became the launch
    # the tail: threads past the end store nothing
    guard = [s for s in tir.walk(k.body) if isinstance(s, IfThenElse)]
    assert len(guard) == 1 and str(guard[0].cond) == "i.outer * 64 + i.inner < 1000"
    info = k.launch_info()
    assert info["grid"] == [16, 1, 1] and info["block"] == [64, 1, 1] and info["shared_bytes"] == 0


def test_2d_elementwise_binds_two_grid_and_two_block_dimensions():
    s, args = scale2d_gpu(40, 64, th=8, tw=16)
    prog = split_host_device(tether.lower(s, args, "scale2d"))
    (k,) = prog.kernels
    assert k.grid == (4, 5, 1) and k.block == (16, 8, 1)
    assert sorted(tags(k).values()) == ["blockIdx.x", "blockIdx.y", "threadIdx.x", "threadIdx.y"]
    assert kernel_loops(k) == [] and prog.args == [[0, 1]]
    assert [s for s in tir.walk(k.body) if isinstance(s, Store)][0].buffer.name == "B"


def test_tiled_matmul_fetches_tiles_cooperatively_between_barriers():
    s, args = matmul_gpu(64, 64, 64, tile=16, ktile=16)
    pf = tether.lower(s, args, "mm")
    text = str(pf)
    # inside the reduction loop: barrier, both tiles filled by all threads (one element each), barrier, then the
    # inner product over the tiles
    body = re.search(r"for k\.outer in range\(4\):\n(.*)", text, re.S).group(1)
    lines = [ln.strip() for ln in body.splitlines()]
    assert lines[:8] == [
        "allocate A.shared: float32[256]  # shared",
        "allocate B.shared: float32[256]  # shared",
        "barrier()",
        "A.shared[i.inner * 16 + j.inner] = A[i.outer * 1024 + i.inner * 64 + k.outer * 16 + j.inner]",
        "B.shared[i.inner * 16 + j.inner] = B[k.outer * 1024 + i.inner * 64 + j.outer * 16 + j.inner]",
        "barrier()",
        "for k.inner in range(16):",
        "C[i.outer * 1024 + i.inner * 64 + j.outer * 16 + j.inner] = C[i.outer * 1024 + i.inner * 64 + j.outer * 16 "
        "+ j.inner] + A.shared[i.inner * 16 + k.inner] * B.shared[k.inner * 16 + j.inner]",
    ]
    # the cache stages' loops reuse the consumer's thread indices: no thread loops of their own
    assert thread_loops(pf.body) == [("i.outer", "blockIdx.y", 4), ("j.outer", "blockIdx.x", 4),
                                     ("i.inner", "threadIdx.y", 16), ("j.inner", "threadIdx.x", 16)]
    prog = split_host_device(pf)
    (k,) = prog.kernels
    assert k.grid == (4, 4, 1) and k.block == (16, 16, 1) and k.shared_bytes() == 2 * 256 * 4
    assert sum(isinstance(x, Barrier) for x in tir.walk(k.body)) == 2
    # work-group memory is declared at the kernel's top; the k loop stays a loop
    assert isinstance(k.body, tir.Allocate) and k.body.buffer.scope == "shared"
    assert [f.var.name for f in kernel_loops(k)] == ["k.outer", "k.inner"]


def test_a_shorter_cooperative_fetch_is_guarded_by_the_thread_index():
    # an 16 x 8 tile fetched by 16 x 16 threads: threadIdx.y < 8 only
    s, args = matmul_gpu(64, 64, 64, tile=16, ktile=8, cache_local=True)
    pf = tether.lower(s, args, "mm")
    text = str(pf)
    assert "allocate A.shared: float32[128]  # shared" in text
    assert "allocate C.local: float32[1]  # local" in text
    fills = [x for x in tir.walk(pf.body) if isinstance(x, IfThenElse)]
    assert [str(x.cond) for x in fills] == ["i.inner < 8", "i.inner < 8"]
    assert all(isinstance(x.then_case, Store) and x.then_case.buffer.scope == "shared" for x in fills)
    (k,) = split_host_device(pf).kernels
    assert k.block == (16, 16, 1)
    local = [x for x in tir.walk(k.body) if isinstance(x, tir.Allocate) and x.buffer.scope == "local"]
    assert [a.buffer.name for a in local] == ["C.local"]


def test_a_cache_bound_on_its_own_widens_the_work_group_and_guards_the_consumer():
    s, args = stencil_gpu(256, block=64)
    pf = tether.lower(s, args, "stencil")
    assert thread_loops(pf.body) == [("i.outer", "blockIdx.x", 4), ("ax0", "threadIdx.x", 65),
                                     ("i.inner", "threadIdx.x", 64)]
    (k,) = split_host_device(pf).kernels
    assert k.block == (65, 1, 1) and k.grid == (4, 1, 1) and tags(k) == {"i.outer": "blockIdx.x", "ax0": "threadIdx.x"}
    # attached at a thread loop the fill runs once: a barrier after it only, outside the consumer's guard
    assert str(k.body).splitlines() == [
        "allocate A.shared: float32[65]  # shared",
        "A.shared[ax0] = A[i.outer * 64 + ax0]",
        "barrier()",
        "if ax0 < 64:",
        "  C[i.outer * 64 + ax0] = A.shared[ax0] + A.shared[ax0 + 1]",
    ]


def test_a_local_cache_holds_one_threads_region():
    a = te.placeholder((32, 32), name="A")
    b = te.placeholder((32, 32), name="B")
    r = te.reduce_axis(32, "k")
    c = te.compute((32, 32), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), name="C")
    s = te.create_schedule(c.op)
    bl = s.cache_read(b, "local", [c])
    bi, bj, ti, tj = s[c].tile(c.op.axis[0], c.op.axis[1], 8, 8)
    ko, ki = s[c].split(r, factor=8)
    for ax, tag in ((bi, "blockIdx.y"), (bj, "blockIdx.x"), (ti, "threadIdx.y"), (tj, "threadIdx.x")):
        s[c].bind(ax, te.thread_axis(tag))
    s[bl].compute_at(s[c], ki)
    (k,) = split_host_device(tether.lower(s, [a, b, c], "mm")).kernels
    (alloc,) = [x for x in tir.walk(k.body) if isinstance(x, tir.Allocate)]
    assert alloc.buffer.scope == "local" and alloc.buffer.size == 1       # one thread's element, not relaxed
    assert str(alloc.body).splitlines()[0] == "B.local[0] = B[k.outer * 256 + k.inner * 32 + j.outer * 8 + j.inner]"
    assert not any(isinstance(x, Barrier) for x in tir.walk(k.body))     # nothing shared: no barrier


def test_row_sum_runs_one_thread_per_row():
    s, args = rowsum_gpu(100, 37, block=32)
    prog = split_host_device(tether.lower(s, args, "rowsum"))
    (k,) = prog.kernels
    assert k.grid == (4, 1, 1) and k.block == (32, 1, 1)
    assert [(f.var.name, f.extent.value, f.kind) for f in kernel_loops(k)] == [("k", 37, "serial")]
    stores = [x for x in tir.walk(k.body) if isinstance(x, Store)]
    assert [x.reduction for x in stores] == [None, "sum"]


def test_two_root_stages_are_two_kernels_through_a_temporary():
    s, args = shifted_exp_gpu(100, 37, block=32)
    prog = split_host_device(tether.lower(s, args, "shexp"))
    assert [k.name for k in prog.kernels] == ["shexp_kernel0", "shexp_kernel1"]
    assert [b.name for b in prog.temporaries] == ["M"] and prog.temporaries[0].scope == "param"
    assert [b.name for b in prog.buffers] == ["A", "E", "M"]
    assert prog.args == [[0, 2], [0, 1, 2]]
    k0, k1 = prog.kernels
    assert [b.name for b in k0.params] == ["A", "M"] and [b.name for b in k1.params] == ["A", "E", "M"]
    assert k0.grid == (4, 1, 1) and k0.block == (32, 1, 1)
    assert k1.grid == (100, 1, 1) and k1.block == (37, 1, 1)
    # the kernel reads the temporary through its global (param) buffer, not the function's local one
    loads = {ld.buffer.name: ld.buffer.scope for x in tir.walk(k1.body) if isinstance(x, Store)
             for ld in tir.walk(x.value) if isinstance(ld, Load)}
    assert loads == {"A": "param", "M": "param"}
    assert prog.launch_info()["temporaries"] == [{"name": "M", "dtype": "float32", "size": 100}]


def test_softmax_is_three_kernels():
    s, args = softmax_gpu(10, 20)
    prog = split_host_device(tether.lower(s, args, "softmax"))
    assert len(prog.kernels) == 3 and [b.name for b in prog.temporaries] == ["M", "S"]
    assert prog.args == [[0, 2], [0, 2, 3], [0, 1, 2, 3]]


def test_cpu_schedules_lower_as_before():
    from fixtures.te_kernels import vadd_schedule
    s, args = vadd_schedule(1024, factor=8)
    pf = tether.lower(s, args, "vadd")
    assert [(f.kind, f.thread_tag) for f in tir.walk(pf.body) if isinstance(f, For)] == [
        ("parallel", None), ("vectorized", None)]


# ---- errors: bind -------------------------------------------------------------------------------------------

def _vadd_split():
    a = te.placeholder((256,), name="A")
    c = te.compute((256,), lambda i: a[i] + 1.0, name="C")
    s = te.create_schedule(c.op)
    xo, xi = s[c].split(c.op.axis[0], factor=64)
    return s, c, xo, xi, [a, c]


def test_bind_refuses_a_reduction_axis_on_blockidx():
    s, args = rowsum_gpu(64, 16)
    b = args[1]
    with pytest.raises(ScheduleError, match=r"stage 'B': axis 'k' is a reduction axis .*blockIdx\.y"):
        s[b].bind(b.op.reduce_axis[0], te.thread_axis("blockIdx.y"))


def test_bind_refuses_an_axis_already_bound_vectorized_or_parallel():
    s, c, xo, xi, _ = _vadd_split()
    s[c].bind(xo, te.thread_axis("blockIdx.x"))
    with pytest.raises(ScheduleError, match=r"stage 'C': axis 'i\.outer' is already bound to blockIdx\.x"):
        s[c].bind(xo, te.thread_axis("blockIdx.y"))
    s[c].vectorize(xi)
    with pytest.raises(ScheduleError, match=r"stage 'C': axis 'i\.inner' is already vectorized"):
        s[c].bind(xi, te.thread_axis("threadIdx.x"))
    s, c, xo, xi, _ = _vadd_split()
    s[c].parallel(xo)
    with pytest.raises(ScheduleError, match=r"stage 'C': axis 'i\.outer' is already parallel"):
        s[c].bind(xo, te.thread_axis("blockIdx.x"))
    s, c, xo, xi, _ = _vadd_split()
    s[c].bind(xi, te.thread_axis("threadIdx.x"))
    with pytest.raises(ScheduleError, match=r"already thread"):
        s[c].vectorize(xi)


def test_bind_refuses_two_axes_of_a_stage_on_one_tag():
    s, c, xo, xi, _ = _vadd_split()
    tx = te.thread_axis("threadIdx.x")
    s[c].bind(xi, tx)
    with pytest.raises(ScheduleError, match=r"stage 'C': axis 'i\.outer' cannot be bound to threadIdx\.x, axis "
                                            r"'i\.inner' already is"):
        s[c].bind(xo, te.thread_axis("threadIdx.x"))


def test_bind_refuses_a_loop_of_another_extent_than_the_declared_thread_axis():
    s, c, xo, xi, args = _vadd_split()
    s[c].bind(xo, te.thread_axis("blockIdx.x"))
    s[c].bind(xi, te.thread_axis((0, 128), "threadIdx.x"))
    with pytest.raises(ScheduleError, match=r"stage 'C': axis 'i\.inner' has extent 64 .* extent 128"):
        tether.lower(s, args, "f")


def test_cache_read_refuses_bad_scopes_and_readers():
    s, args = vadd_gpu(64)
    a, b, c = args
    with pytest.raises(ScheduleError, match="unknown scope 'texture'"):
        s.cache_read(a, "texture", [c])
    x = te.placeholder((64,), name="X")
    d = te.compute((64,), lambda i: a[i] + 1.0, name="D")
    e = te.compute((64,), lambda i: d[i] + x[i], name="E")
    with pytest.raises(ScheduleError, match="cache_read: stage 'D' does not read 'X'"):
        te.create_schedule(e.op).cache_read(x, "shared", [d])


# ---- errors: the split ------------------------------------------------------------------------------------------

def test_split_refuses_an_unbound_loop_outside_the_thread_loops():
    s, c, xo, xi, args = _vadd_split()
    s[c].bind(xi, te.thread_axis("threadIdx.x"))
    with pytest.raises(ScheduleError, match=r"^stage 'C': axis 'i\.outer' is not bound to a thread; a GPU kernel's "
                                            r"outer loops must be bound to blockIdx/threadIdx"):
        split_host_device(tether.lower(s, args, "f"))


def test_split_refuses_a_stage_with_no_bound_loop():
    a = te.placeholder((16, 8), name="A")
    r = te.reduce_axis(8, "k")
    m = te.compute((16,), lambda i: te.sum(a[i, r], axis=r), name="M")
    e = te.compute((16, 8), lambda i, j: a[i, j] - m[i], name="E")
    s = te.create_schedule(e.op)
    s[e].bind(e.op.axis[0], te.thread_axis("blockIdx.x"))
    s[e].bind(e.op.axis[1], te.thread_axis("threadIdx.x"))
    with pytest.raises(ScheduleError, match=r"stage 'M': none of its axes \(i, k\) is bound to a thread"):
        split_host_device(tether.lower(s, [a, e], "f"))


def test_split_refuses_a_bound_loop_inside_an_unbound_one():
    s, args = rowsum_gpu(64, 16)
    b = args[1]
    s2 = te.create_schedule(b.op)
    i, = b.op.axis
    k = b.op.reduce_axis[0]
    io, ii = s2[b].split(i, factor=16)
    s2[b].reorder(io, k, ii)
    s2[b].bind(io, te.thread_axis("blockIdx.x"))
    s2[b].bind(ii, te.thread_axis("threadIdx.x"))
    with pytest.raises(ScheduleError, match=r"stage 'B': axis 'i\.inner' is bound to threadIdx\.x inside loop 'k'"):
        split_host_device(tether.lower(s2, [args[0], b], "f"))


def test_split_refuses_a_work_group_over_the_thread_limit():
    s, args = scale2d_gpu(64, 128, th=16, tw=128)
    with pytest.raises(ScheduleError, match=r"stage 'B': a work-group of 128 x 16 x 1 = 2048 threads \(j\.inner -> "
                                            r"threadIdx\.x, i\.inner -> threadIdx\.y\) is over the limit of 1024"):
        split_host_device(tether.lower(s, args, "f"))
    assert split_host_device(tether.lower(s, args, "f"), max_threads_per_block=2048).kernels[0].block == (128, 16, 1)


def test_split_refuses_shared_memory_over_the_limit():
    s, args = matmul_gpu(64, 64, 64, tile=16, ktile=16)
    with pytest.raises(ScheduleError, match=r"stage 'C': shared memory of 2048 bytes \(A\.shared \(1024 bytes\), "
                                            r"B\.shared \(1024 bytes\)\) is over the limit of 1024 bytes"):
        split_host_device(tether.lower(s, args, "mm"), max_shared_bytes=1024)


def test_split_refuses_a_parallel_loop_in_device_code():
    s, args = rowsum_gpu(64, 16)
    b = args[1]
    s2 = te.create_schedule(b.op)
    io, ii = s2[b].split(b.op.axis[0], factor=16)
    iio, iii = s2[b].split(ii, factor=4)
    s2[b].bind(io, te.thread_axis("blockIdx.x"))
    s2[b].bind(iio, te.thread_axis("threadIdx.x"))
    s2[b].parallel(iii)
    with pytest.raises(ScheduleError, match=r"stage 'B': axis 'i\.inner\.inner' is a parallel loop; device code"):
        split_host_device(tether.lower(s2, [args[0], b], "f"))


def test_split_refuses_a_shared_cache_outside_every_kernel():
    s, args = vadd_gpu(256)
    a, b, c = args
    aa = s.cache_read(a, "shared", [c])
    s[aa].bind(s[aa].op.axis[0], te.thread_axis("threadIdx.x"))
    with pytest.raises(ScheduleError, match=r"stage 'A\.shared': a shared-memory cache must be attached inside"):
        split_host_device(tether.lower(s, args, "f"))


# hand-built device functions for what a te schedule does not produce: the split checks any PrimFunc
def _func(inner_fn):
    """C[tx] = 1 in a 1 x 32 launch, with ``inner_fn(tx, store)`` around the store."""
    c = Buffer("C", (32,), "float32")
    tx = Var("tx")
    store = Store(c, tx, Const(1.0, "float32"))
    body = For(tx, Const(0, "int32"), Const(32, "int32"), "thread", inner_fn(tx, store), 32, thread_tag="threadIdx.x")
    return PrimFunc("f", [c], [c], body)


def test_split_refuses_a_barrier_under_a_thread_dependent_condition():
    cond = lambda tx, st: seq(IfThenElse(Compare("lt", tx, Const(8, "int32")), Barrier()), st)  # noqa: E731
    with pytest.raises(ScheduleError, match=r"stage 'C': barrier under the condition tx < 8, which depends on "
                                            r"threadIdx\.x \(axis 'tx'\); divergent control flow"):
        split_host_device(_func(cond))
    # a condition on the work-group only is uniform: every thread of a work-group takes the same branch
    bx = Var("bx")
    c = Buffer("C", (32,), "float32")
    ok = For(bx, Const(0, "int32"), Const(2, "int32"), "thread",
             For(Var("t"), Const(0, "int32"), Const(16, "int32"), "thread",
                 IfThenElse(Compare("lt", bx, Const(1, "int32")), seq(Barrier(), Store(c, bx, Const(0.0, "float32")))),
                 16, thread_tag="threadIdx.x"), 2, thread_tag="blockIdx.x")
    assert split_host_device(PrimFunc("g", [c], [c], ok)).kernels[0].grid == (2, 1, 1)


def test_split_refuses_a_barrier_in_a_thread_dependent_loop():
    loop = lambda tx, st: seq(For(Var("r"), Const(0, "int32"), tx, "serial", Barrier()), st)  # noqa: E731
    with pytest.raises(ScheduleError, match=r"stage 'C': barrier inside loop 'r' whose range depends on threadIdx\.x "
                                            r"\(axis 'tx'\)"):
        split_host_device(_func(loop))


def test_split_refuses_a_vectorized_loop_over_a_run_time_extent():
    c = Buffer("C", (32,), "float32")

    def vec(tx, st):
        v = Var("v")
        return For(v, Const(0, "int32"), Load(Buffer("N", (1,), "int32"), Const(0, "int32")), "vectorized",
                   Store(c, v, Const(1.0, "float32")), 4)
    with pytest.raises(ScheduleError, match=r"stage 'C': axis 'v' is vectorized over the non-constant extent N\[0\]"):
        split_host_device(_func(vec))
