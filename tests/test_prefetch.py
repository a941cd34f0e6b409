"""Stage.prefetch: the schedule hint that reads a stream ahead (tir Prefetch -> llvm.prefetch on CPUs, nothing on
GPUs), and conv2d_pixels' use of it for weights streamed from memory on x86."""
from __future__ import annotations

import re

import numpy as np
import pytest

import tether
from tether import ops, te
from tether.codegen.opencl_c import opencl_source
from tether.codegen.spirv import spirv_module
from tether.errors import ScheduleError
from tether.target import Target
from tether.tir import Prefetch, walk
from tether.tir.device_split import split_host_device

from fixtures.conv_ref import conv_ref
from fixtures.gpu_kernels import vadd_gpu
from fixtures.te_kernels import matmul

AVX512 = Target("x86_64-linux-gnu -mattr=+avx2,+fma,+avx512f")


def _prefetches(primfunc):
    return [s for s in walk(primfunc.body) if isinstance(s, Prefetch)]


def _matmul_prefetching(m, n, k, offset):
    """A (m, k) @ B (k, n), the row of B the reduction reads ``offset`` steps on prefetched at each step."""
    a, b, c = matmul(m, n, k)
    s = te.create_schedule(c.op)
    i, j = c.op.axis
    (r,) = c.op.reduce_axis
    s[c].reorder(i, r, j)
    s[c].vectorize(j)
    s[c].prefetch(b, r, offset)
    return s, [a, b, c]


def test_each_step_prefetches_the_lines_it_will_read_later():
    s, args = _matmul_prefetching(4, 32, 16, 3)
    f = tether.lower(s, args, "mm")
    text = str(f)
    # B's row of 32 floats is two 64-byte lines, 3 rows (96 floats) on; none of A (not asked for)
    assert re.search(r"for k in range\(16\):\n\s+prefetch B\[k \* 32 \+ 96\]\n\s+prefetch B\[k \* 32 \+ 112\]", text), \
        text
    assert all(p.buffer.name == "B" for p in _prefetches(f)) and len(_prefetches(f)) == 2


def test_prefetching_past_the_end_changes_nothing(rng, tmp_path):
    """The last steps prefetch rows beyond B's end: no fault, the same product; the module calls llvm.prefetch and
    the x86 code holds prefetch instructions."""
    s, args = _matmul_prefetching(5, 32, 24, 20)
    lib = tether.build(s, args, target="host", name="mm")
    assert re.search(r"call void @\"?llvm\.prefetch", lib.ir_text)
    if Target("host").arch == "x86_64":
        assert "prefetcht0" in lib.compiled.asm
    a = rng.standard_normal((5, 24)).astype("float32")
    b = rng.standard_normal((24, 32)).astype("float32")
    path = str(tmp_path / "mm.so")
    lib.export_library(path)
    from tether import runtime
    mod = runtime.load_module(path)
    out = np.zeros((5, 32), "float32")
    mod["mm"](a, b, out)
    np.testing.assert_allclose(out, a @ b, rtol=1e-5, atol=1e-5)


def test_unrolled_loops_over_panels_prefetch_each_panel():
    """A read whose index steps by a panel in an unrolled loop inside the prefetching loop is one stream per panel."""
    a = te.placeholder((4, 64), "float32", name="A")
    b = te.placeholder((2, 64, 16), "float32", name="B")     # two 16-wide panels
    r = te.reduce_axis((0, 64), name="r")
    c = te.compute((4, 32), lambda i, j: te.sum(a[i, r] * b[j // 16, r, j % 16], axis=r), name="C")
    s = te.create_schedule(c.op)
    i, j = c.op.axis
    jo, ji = s[c].split(j, factor=16)
    s[c].reorder(i, r, jo, ji)
    s[c].unroll(jo)
    s[c].vectorize(ji)
    s[c].prefetch(b, r, 4)
    text = str(tether.lower(s, [a, b, c], "k"))
    assert "prefetch B[r * 16 + 64]" in text and "prefetch B[r * 16 + 1088]" in text, text


def test_prefetch_refuses_what_it_cannot_mean():
    a, b, c = matmul(4, 8, 8)
    s = te.create_schedule(c.op)
    (r,) = c.op.reduce_axis
    with pytest.raises(ScheduleError, match="positive number of iterations"):
        s[c].prefetch(b, r, 0)
    other = te.placeholder((8, 8), "float32", name="D")
    with pytest.raises(ScheduleError, match="does not read 'D'"):
        s[c].prefetch(other, r, 2)
    s2 = te.create_schedule(c.op)
    ro, _ = s2[c].split(r, factor=4)
    with pytest.raises(ScheduleError):
        s2[c].prefetch(b, r, 2)    # no longer a leaf: split into ro, ri
    s2[c].prefetch(b, ro, 2)


def test_gpu_kernels_ignore_prefetches(tmp_path):
    s, args = vadd_gpu(1000)
    (c,) = [t for t in args if t.name == "C"]
    s[c].prefetch(args[0], s[c].leaf_iter_vars[-1], 1)
    prog = split_host_device(tether.lower(s, args, "vadd"))
    assert any(isinstance(x, Prefetch) for k in prog.kernels for x in walk(k.body))
    source = opencl_source(prog.kernels)
    assert "__kernel" in source and "prefetch" not in source
    assert spirv_module(prog.kernels)[:4] == b"\x03\x02\x23\x07"


def _conv(c_in, oc, hw, k):
    x = te.placeholder((c_in, hw, hw), "float32", name="X")
    w = te.placeholder((oc, c_in * k * k), "float32", name="W")
    return x, w, ops.conv2d_pixels(x, w, (k, k), 1, k // 2, panel=32)


@pytest.mark.parametrize("k", [1, 3])
def test_streamed_conv_weights_are_prefetched_on_x86(k):
    """conv2d_pixels whose weights exceed the family's cache_bytes prefetches them PREFETCH_AHEAD_X86 bytes ahead,
    a line per 16 floats of the 32-wide panel, at the innermost reduction loop (the taps of a 3x3)."""
    x, w, out = _conv(512, 256, 7, k)
    f = tether.lower(ops.schedule([out], target=AVX512), [x, w, out], "conv")
    pf = _prefetches(f)
    assert len({str(p.index) for p in pf}) == 2 and all(p.buffer.name.endswith("panels") for p in pf), str(f)
    ahead = ops.schedules.PREFETCH_AHEAD_X86 // 4
    loop = "rx" if k == 3 else "rc"
    assert re.search(r"for %s in range\(%d\):\n\s+prefetch \S+\[.* \+ %d\]\n\s+prefetch \S+\[.* \+ %d\]"
                     % (loop, k if k > 1 else 512, ahead, ahead + 16), str(f)), str(f)


@pytest.mark.parametrize("target,c_in", [(AVX512, 16),                    # 256 x 16 weights: 16 KB, in cache
                                         (Target("rasp4b"), 512)])          # ARM: not measured, not prefetched
def test_cached_weights_and_arm_builds_are_not_prefetched(target, c_in):
    x, w, out = _conv(c_in, 256, 7, 1)
    assert not _prefetches(tether.lower(ops.schedule([out], target=target), [x, w, out], "conv"))


def test_a_conv_prefetching_its_weights_computes_the_same(run_ops, rng):
    x, w, out = _conv(320, 96, 6, 3)
    assert _prefetches(tether.lower(ops.schedule([out], target="host"), [x, w, out], "conv")) or \
        Target("host").arch != "x86_64"
    xs = rng.standard_normal((320, 6, 6)).astype("float32")
    ws = (rng.standard_normal((96, 320, 3, 3)) / 40).astype("float32")
    (got,) = run_ops([(x, xs), (w, ws.reshape(96, -1))], [out], schedule=ops.schedule([out]))
    ref = conv_ref(xs[None], ws, pad4=(1,) * 4)[0].reshape(96, -1)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
