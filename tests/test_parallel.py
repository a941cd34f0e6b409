"""The Python launcher with real gcc-built kernels: every task id runs exactly once, two threads really share
the work, failures propagate, and modules without a launcher fall back to serial execution.

The Python launcher is the fallback for processes that load no module with a native pool (hand-written C,
older tether builds). Any tether-built module loaded earlier in the same process would provide the native pool
(tests/test_threadpool.py), so every test here switches it off for its duration."""
from __future__ import annotations

import os
import pathlib
import shutil
import threading

import numpy as np
import pytest

from kernels import build_kernel, build_kernel_for
from tether_rpc import module, parallel
from tether_rpc.errors import KernelError
from fixtures.children import wait_forked_child
from fixtures.schedules import elementwise

T = 64      # tasks per launch in par.c
N = 65536   # elements of the heavy kernel


@pytest.fixture(scope="module")
def par_paths(tmp_path_factory):
    d = tmp_path_factory.mktemp("par")
    path = build_kernel("par", d)
    # A separate copy (separate inode => separate dlopen handle and launcher slot) for the serial fallback.
    serial = d / "par_serial.so"
    shutil.copyfile(path, serial)
    return path, serial


@pytest.fixture(scope="module")
def par_mod(par_paths):
    return module.load_module(str(par_paths[0]))


@pytest.fixture(autouse=True)
def python_launcher():
    before = parallel.get_native_pool_enabled()
    parallel.set_native_pool_enabled(False)
    yield
    parallel.set_native_pool_enabled(before)


@pytest.fixture(autouse=True)
def always_use_pool(python_launcher):
    # These tests check how work is shared, so tiny launches must not be short-cut to the caller.
    before = parallel.get_min_parallel_work_us()
    parallel.set_min_parallel_work_us(0)
    yield
    parallel.set_min_parallel_work_us(before)


@pytest.fixture
def two_threads():
    before = parallel.get_num_threads()
    parallel.set_num_threads(2)
    yield
    parallel.set_num_threads(before)


def _mark(mod, wait_for_other):
    counts = np.zeros(T, "int32")
    tids = np.zeros(T, "int64")
    mod["mark"](counts, tids, wait_for_other)
    return counts, tids


def test_launcher_installed(par_mod):
    assert par_mod.has_parallel_launcher


def test_two_threads_share_the_tasks_each_exactly_once(par_mod, two_threads):
    # Task 0 spins until some other task has finished: only a second thread can let it go (bounded spin).
    counts, tids = _mark(par_mod, 1)
    np.testing.assert_array_equal(counts, np.ones(T, "int32"))
    assert len(set(tids.tolist())) == 2
    assert 0 not in set(tids.tolist())


def test_many_launches_stay_exact(par_mod, two_threads):
    for _ in range(50):
        counts, tids = _mark(par_mod, 0)
        np.testing.assert_array_equal(counts, 1)
        assert 1 <= len(set(tids.tolist())) <= 2


def test_one_thread_runs_everything_in_the_caller(par_mod):
    before = parallel.get_num_threads()
    parallel.set_num_threads(1)
    try:
        counts, tids = _mark(par_mod, 0)
    finally:
        parallel.set_num_threads(before)
    np.testing.assert_array_equal(counts, 1)
    assert len(set(tids.tolist())) == 1


def test_back_to_two_threads_after_one(par_mod):
    # At 1 thread the modules get a NULL launcher (native serial loop); going back to 2 reinstalls the pool.
    before = parallel.get_num_threads()
    try:
        parallel.set_num_threads(1)
        assert len(set(_mark(par_mod, 0)[1].tolist())) == 1
        parallel.set_num_threads(2)
        counts, tids = _mark(par_mod, 1)
        np.testing.assert_array_equal(counts, 1)
        assert len(set(tids.tolist())) == 2
    finally:
        parallel.set_num_threads(before)


def test_serial_fallback_without_launcher(par_paths):
    m = module.load_module(str(par_paths[1]), parallel_launcher=False)
    assert not m.has_parallel_launcher
    counts, tids = _mark(m, 0)
    np.testing.assert_array_equal(counts, 1)
    assert len(set(tids.tolist())) == 1  # all in the calling thread
    x = np.linspace(-1, 1, N).astype("float32")
    y = np.zeros(N, "float32")
    m["heavy"](x, y, 7)
    np.testing.assert_allclose(y, _heavy_reference(x), rtol=1e-5, atol=1e-6)


def _heavy_reference(x):
    v = x.copy()
    for _ in range(256):
        v = v * np.float32(0.999) + np.float32(0.001)
    return v


@pytest.mark.parametrize("num_tasks", [1, 2, 3, 16, 1000])
def test_compute_kernel_matches_numpy(par_mod, two_threads, num_tasks):
    x = np.random.default_rng(num_tasks).standard_normal(N).astype("float32")
    y = np.zeros(N, "float32")
    par_mod["heavy"](x, y, num_tasks)
    np.testing.assert_allclose(y, _heavy_reference(x), rtol=1e-5, atol=1e-6)


def test_failing_task_is_reported_and_others_still_run_once(par_mod, two_threads):
    counts = np.zeros(T, "int32")
    with pytest.raises(KernelError, match="fail: a parallel task failed with code 42"):
        par_mod["fail"](counts)
    expected = np.ones(T, "int32")
    expected[5] = 0  # task 5 fails before counting itself
    np.testing.assert_array_equal(counts, expected)


def test_zero_tasks_is_a_no_op(par_mod, two_threads):
    for num_tasks in (0, -1, 0):  # a kernel error would raise KernelError here; returning at all is the point
        par_mod["noop"](np.zeros(T, "int32"), num_tasks)
    # ... and it leaves the pool free: a launch that needs both threads to finish still gets them
    counts, tids = _mark(par_mod, 1)
    np.testing.assert_array_equal(counts, np.ones(T, "int32"))
    assert len(set(tids.tolist())) == 2


def test_concurrent_callers_do_not_deadlock(par_mod, two_threads):
    # Two Python threads launch at once: one gets the pool, the other runs serially; both must be exact.
    results, errors = [], []

    def worker():
        try:
            for _ in range(20):
                results.append(_mark(par_mod, 0)[0])
        except Exception as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads), "launcher deadlocked"
    assert not errors
    assert len(results) == 40 and all((c == 1).all() for c in results)


def test_pool_works_in_a_forked_child(par_mod, two_threads, monkeypatch):
    # The child must keep the parent's configured count, not fall back to the default (3 here).
    monkeypatch.setenv("TETHER_NUM_THREADS", "3")
    _mark(par_mod, 0)  # the parent's workers exist now; they do not survive fork
    pid = os.fork()
    if pid == 0:  # child: must rebuild its pool instead of waking threads that are not there
        code = 1
        try:
            counts, tids = _mark(par_mod, 1)
            ok = (counts == 1).all() and len(set(tids.tolist())) == 2 and parallel.get_num_threads() == 2
            code = 0 if ok else 2
        finally:
            os._exit(code)
    status = wait_forked_child(pid, 30, "in the parallel launcher")
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


def test_tiny_launches_run_in_the_caller(par_paths, tmp_path, two_threads):
    # With a threshold, the first launch of a task is measured serially; tiny ones then stay in the caller, big
    # ones go to the pool. A fresh copy of the module gives fresh task addresses (no earlier measurements).
    fresh = tmp_path / "par_fresh.so"
    shutil.copyfile(par_paths[0], fresh)
    m = module.load_module(str(fresh))
    parallel.set_min_parallel_work_us(5000)  # far between mark's ~0.1 ms and heavy's ~30 ms
    for _ in range(5):
        counts, tids = _mark(m, 0)
        np.testing.assert_array_equal(counts, 1)
        assert len(set(tids.tolist())) == 1
    x = np.linspace(-1, 1, N).astype("float32")
    y = np.zeros(N, "float32")
    for _ in range(2):
        m["heavy"](x, y, 8)  # tens of ms of work, measured serially on the first two launches
    works = sorted(i.work for i in parallel._task_cache.values() if i.probes)
    assert works[-1] > 5e-3 and works[0] < 5e-3
    m["heavy"](x, y, 8)  # now through the pool
    np.testing.assert_allclose(y, _heavy_reference(x), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError):
        parallel.set_min_parallel_work_us(-1)


def test_big_launches_time_both_ways_and_keep_exploring(par_paths, tmp_path, two_threads, monkeypatch):
    # Above the threshold, the first two launches after the serial probes go through the pool and are timed
    # too; later launches take the faster way, and every _EXPLORE_EVERY-th tries the other way again (the load
    # on the cores changes).
    fresh = tmp_path / "par_adaptive.so"
    shutil.copyfile(par_paths[0], fresh)
    m = module.load_module(str(fresh))
    parallel.set_min_parallel_work_us(5000)  # heavy (tens of ms) is above it
    x = np.linspace(-1, 1, N).astype("float32")
    ways = []
    real_launch = parallel.ThreadPool.launch
    real_whole = parallel._run_whole

    def pooled(self, task, closure, num_tasks):
        ways.append("pool")
        return real_launch(self, task, closure, num_tasks)

    def whole(fn, closure, num_tasks, chunked):
        ways.append("serial")
        return real_whole(fn, closure, num_tasks, chunked)

    monkeypatch.setattr(parallel.ThreadPool, "launch", pooled)
    monkeypatch.setattr(parallel, "_run_whole", whole)
    monkeypatch.setattr(parallel, "_EXPLORE_EVERY", 8)
    want = _heavy_reference(x)
    for _ in range(2 + 2 + 8):
        y = np.zeros(N, "float32")
        m["heavy"](x, y, 8)
        np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)
    assert ways[:4] == ["serial", "serial", "pool", "pool"]
    assert set(ways[4:]) == {"serial", "pool"}  # the faster way, and at least one exploring launch the other way
    info = max((i for i in parallel._task_cache.values() if i.pool_probes), key=lambda i: i.work)  # heavy's
    assert 1e-3 < info.work < 10 and 1e-3 < info.pooled < 10  # real timings of a ~30 ms launch, both ways


def test_tether_modules_run_a_serial_launch_as_one_task(tmp_path, host_linker, two_threads):
    # Modules built by tether declare chunked tasks: a launch that stays in the caller is one native call of
    # task 0 of 1, not one ctypes call per task.
    import tether

    n = 1 << 16
    s, args = elementwise(n, lambda a: a * 2.0 + 1.0, inputs=1, factor=64, vectorize=False)
    lib = tether.build(s, args, target="host", name="affine")
    assert lib.metadata["parallel_tasks"] == "chunked"
    m = module.load_module(lib.export_library(str(tmp_path / "affine.so")))
    parallel.set_min_parallel_work_us(1e9)  # every launch stays in the caller
    calls = []
    known = set(parallel._task_cache)
    x = np.random.default_rng(0).random(n, dtype=np.float32)
    for k in range(3):
        y = np.zeros(n, "float32")
        m["affine"](x, y)
        np.testing.assert_allclose(y, x * 2 + 1, rtol=1e-6)
        if k == 0:  # the task is known now: count its native calls (task_id, num_tasks) from here on
            (ptr,) = set(parallel._task_cache) - known
            info = parallel._task_cache[ptr]
            real = info.fn
            info.fn = lambda tid, ntasks, closure: (calls.append((tid, ntasks)), real(tid, ntasks, closure))[1]
    info.fn = real
    assert calls == [(0, 1), (0, 1)]


def test_num_threads_from_environment(monkeypatch):
    monkeypatch.setenv("TETHER_NUM_THREADS", "3")
    assert parallel.default_num_threads() == 3
    monkeypatch.setenv("TETHER_NUM_THREADS", "lots")
    assert parallel.default_num_threads() >= 1
    monkeypatch.delenv("TETHER_NUM_THREADS")
    assert parallel.default_num_threads() == len(os.sched_getaffinity(0))
    with pytest.raises(ValueError):
        parallel.set_num_threads(0)


GUEST_CHECK = """
import sys
sys.path.insert(0, sys.argv[3])
import numpy as np
from tether_rpc import device_info, elf, module, parallel
from tether_rpc.errors import ArchMismatch
arch, d = sys.argv[1], sys.argv[2]
assert elf.host_arch() == arch, elf.host_arch()
info = device_info.device_info()
assert info["arch"] == arch and info["suggested_target"], info
m = module.load_module(d + "/vadd_%s.so" % arch)
a = np.arange(1024, dtype="float32"); b = np.full(1024, 0.5, "float32"); c = np.zeros(1024, "float32")
m["vadd"](a, b, c)
assert (c == a + b).all()
p = module.load_module(d + "/par_%s.so" % arch)
parallel.set_num_threads(2)
parallel.set_min_parallel_work_us(0)
counts = np.zeros(64, "int32"); tids = np.zeros(64, "int64")
p["mark"](counts, tids, 1)
assert (counts == 1).all(), counts
assert len(set(tids.tolist())) == 2, tids
x = np.linspace(-1, 1, 65536).astype("float32"); y = np.zeros_like(x); v = x.copy()
p["heavy"](x, y, 16)
for _ in range(256):
    v = v * np.float32(0.999) + np.float32(0.001)
assert np.allclose(y, v, rtol=1e-5, atol=1e-6)
try:
    module.load_module(d + "/vadd.so")
    raise SystemExit("host module not refused")
except ArchMismatch as exc:
    assert "was built for x86_64 but this device is " + arch in str(exc), exc
print("GUEST-OK")
"""


@pytest.mark.emulated
@pytest.mark.parametrize("arch", ["aarch64", "armv7"])
def test_runtime_and_launcher_under_qemu(emulated_devices, tmp_path, arch):
    """The same runtime on an emulated ARM userland (Debian, glibc) with zig-cross-compiled modules: load, call,
    2-thread launcher, and refusal of the x86_64 build."""
    userland = emulated_devices.userland(arch)
    for name in ("vadd", "par"):
        build_kernel_for(name, arch, tmp_path)
    build_kernel("vadd", tmp_path)
    script = tmp_path / "guest_check.py"
    script.write_text(GUEST_CHECK)
    rpc_server = pathlib.Path(module.__file__).resolve().parent.parent
    proc = userland.run_python([str(script), arch, str(tmp_path), str(rpc_server)], timeout=240, check=False)
    assert proc.returncode == 0 and "GUEST-OK" in proc.stdout, proc.stderr[-3000:]
