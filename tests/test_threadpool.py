"""The native thread pool that every tether module carries (codegen/threadpool.py, docs/parallel.md).

Real modules only: kernels built by tether.build (the pool's provider) and gcc-built C kernels from
tests/kernels (hand-written modules without a pool, which get the provider's launcher installed). Results are
compared with numpy; every loop is bounded in count and time, every join and wait has a timeout.
"""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import tether
from kernels import GCC_FLAGS, KERNEL_DIR, build_kernel
from tether import ops, te
from tether.codegen import threadpool
from tether.target import PRESET_NAMES
from tether_rpc import elf, module, parallel
from tether_rpc.errors import KernelError
from fixtures.children import wait_forked_child
from fixtures.schedules import elementwise

T = 64            # tasks per launch of par.c's kernels
N_ELEM = 1 << 20  # elements of the elementwise kernel
WAIT_S = 60.0     # upper bound for any multi-threaded scenario below


def _elementwise():
    return elementwise(N_ELEM, lambda a, b: a * b + a * 0.5, factor=1024, lanes=8)


def _matmul():
    x = te.placeholder((192, 160), "float32", name="X")
    w = te.placeholder((160, 144), "float32", name="W")
    out = ops.matmul(x, w)
    return ops.schedule([out], target="host"), [x, w, out]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    d = tmp_path_factory.mktemp("threadpool")
    mods = {}
    for name, make in (("ew", _elementwise), ("mm", _matmul)):
        s, args = make()
        lib = tether.build(s, args, target="host", name=name)
        assert lib.metadata["thread_pool"] == parallel.NATIVE_POOL_VERSION
        assert lib.metadata["functions"][0]["parallel"] is True
        mods[name] = module.load_module(lib.export_library(str(d / (name + ".so"))))
    mods["par"] = module.load_module(str(build_kernel("par", d)))
    return mods


@pytest.fixture(autouse=True)
def native(built):
    """Every test runs with the native pool on and restores the thread count and spin it found."""
    before_threads = parallel.get_num_threads()
    before_enabled = parallel.get_native_pool_enabled()
    parallel.set_native_pool_enabled(True)
    assert parallel.native_pool() is not None, "a tether-built module was loaded: it must provide the pool"
    yield parallel.native_pool()
    parallel.set_pool_spin(threadpool.DEFAULT_SPIN)
    parallel.set_num_threads(before_threads)
    parallel.set_native_pool_enabled(before_enabled)


def _inputs(seed: int):
    rng = np.random.default_rng(seed)
    return rng.standard_normal(N_ELEM).astype("float32"), rng.standard_normal(N_ELEM).astype("float32")


def _mark(mod, wait_for_other: int):
    counts = np.zeros(T, "int32")
    tids = np.zeros(T, "int64")
    mod["mark"](counts, tids, wait_for_other)
    return counts, tids


def _pool_threads():
    return [t for t in threading.enumerate() if t.name.startswith("tether-pool-")]


def _os_threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _settled_os_threads(expected: int) -> int:
    # A joined Python thread is done with Python but its OS thread may still be exiting: poll (bounded).
    deadline = time.monotonic() + 5.0
    while _os_threads() != expected and time.monotonic() < deadline:
        time.sleep(0.005)
    return _os_threads()


@pytest.mark.parametrize("threads", [1, 2, 4])
def test_kernels_match_numpy(built, native, threads):
    parallel.set_num_threads(threads)
    assert native.num_workers == threads - 1
    a, b = _inputs(threads)
    c = np.zeros(N_ELEM, "float32")
    built["ew"]["ew"](a, b, c)
    np.testing.assert_allclose(c, a * b + a * np.float32(0.5), rtol=1e-6, atol=1e-6)
    rng = np.random.default_rng(10 + threads)
    x = rng.standard_normal((192, 160)).astype("float32")
    w = rng.standard_normal((160, 144)).astype("float32")
    y = np.zeros((192, 144), "float32")
    built["mm"]["mm"](x, w, y)
    np.testing.assert_allclose(y, x @ w, rtol=1e-4, atol=1e-3)


def test_hand_written_module_gets_the_native_launcher(built, native):
    # par.c has no pool of its own: the provider's launcher runs it, with no Python launcher involved (the
    # Python launcher records every task function it sees in _task_cache).
    parallel.set_num_threads(2)
    known = set(parallel._task_cache)
    counts, tids = _mark(built["par"], 1)  # task 0 spins (bounded) until another thread finishes a task
    np.testing.assert_array_equal(counts, np.ones(T, "int32"))
    assert len(set(tids.tolist())) == 2
    assert set(parallel._task_cache) == known


@pytest.mark.parametrize("spin", [0, None], ids=["sleep-at-once", "default-spin"])
@pytest.mark.parametrize("threads", [2, 4])
def test_thousands_of_back_to_back_launches_stay_exact(built, native, spin, threads):
    # spin 0: every launch goes through the futex sleep / wake path; the default spin: through the spinning one.
    # 4 threads on this 2-core machine also exercise preempted workers.
    parallel.set_num_threads(threads)
    parallel.set_pool_spin(threadpool.DEFAULT_SPIN if spin is None else spin)
    par = built["par"]["mark"]
    counts = np.zeros(T, "int32")
    tids = np.zeros(T, "int64")
    deadline = time.monotonic() + WAIT_S
    launches = 0
    while launches < 3000 and time.monotonic() < deadline:
        par(counts, tids, 0)
        launches += 1
    np.testing.assert_array_equal(counts, np.full(T, launches, "int32"))  # each task id exactly once per launch
    assert launches >= 500, "only %d launches in %.0f s" % (launches, WAIT_S)
    # a compiled kernel, with the input changing between launches
    a, b = _inputs(1)
    c = np.zeros(N_ELEM, "float32")
    ew = built["ew"]["ew"]
    for k in range(40):
        a[:4] = k
        ew(a, b, c)
        np.testing.assert_allclose(c, a * b + a * np.float32(0.5), rtol=1e-6, atol=1e-6)


def test_task_failure_propagates(built, native):
    parallel.set_num_threads(2)
    counts = np.zeros(T, "int32")
    with pytest.raises(KernelError, match="fail: a parallel task failed with code 42"):
        built["par"]["fail"](counts)
    expected = np.ones(T, "int32")
    expected[5] = 0  # task 5 fails before counting itself; every other task still runs exactly once
    np.testing.assert_array_equal(counts, expected)
    # the pool is free again afterwards
    counts, tids = _mark(built["par"], 1)
    assert (counts == 1).all() and len(set(tids.tolist())) == 2


NESTED_C = r"""
/* nest(counts int32[64], tids int64[64]): an outer launch of 8 tasks, each of which launches 8 inner tasks
   through the same launcher; inner task (o, i) counts counts[8*o + i] and records its thread. */
#include "tether_abi.h"
TETHER_META("{\"abi_version\": 1, \"tether_version\": \"0.1.0\", \"target\": {\"arch\": \"" TETHER_ARCH "\"}, "
            "\"functions\": [{\"name\": \"nest\", \"args\": [{\"name\": \"counts\", \"shape\": [64], "
            "\"dtype\": \"int32\"}, {\"name\": \"tids\", \"shape\": [64], \"dtype\": \"int64\"}]}]}");
typedef struct { int32_t* counts; int64_t* tids; int32_t outer; } Inner;
static int32_t inner_task(int32_t i, int32_t n, void* p) {
  Inner* c = (Inner*)p;
  (void)n;
  __atomic_add_fetch(&c->counts[8 * c->outer + i], 1, __ATOMIC_RELAXED);
  c->tids[8 * c->outer + i] = (int64_t)(intptr_t)__builtin_thread_pointer();
  return 0;
}
typedef struct { int32_t* counts; int64_t* tids; } Outer;
static int32_t outer_task(int32_t o, int32_t n, void* p) {
  Outer* c = (Outer*)p;
  Inner in = {c->counts, c->tids, o};
  (void)n;
  return tether_parallel(inner_task, &in, 8);
}
TETHER_EXPORT int32_t nest(const TetherValue* args, const int32_t* codes, int32_t num_args) {
  static const int64_t shape[1] = {64};
  CHECK_NARGS(2);
  CHECK(check_tensor(args, codes, 0, 1, shape, 0, 32));
  CHECK(check_tensor(args, codes, 1, 1, shape, 0, 64));
  Outer c = {DATA(0, int32_t), DATA(1, int64_t)};
  return tether_parallel(outer_task, &c, 8);
}
"""


@pytest.fixture(scope="module")
def nested_mod(tmp_path_factory):
    d = tmp_path_factory.mktemp("nested")
    src = d / "nest.c"
    src.write_text(NESTED_C)
    out = d / "nest.so"
    subprocess.run(["gcc", *GCC_FLAGS, "-I", str(KERNEL_DIR), str(src), "-o", str(out), "-Wl,-soname,nest.so",
                    "-Wl,--no-undefined"], check=True, capture_output=True, timeout=60)
    return module.load_module(str(out))


def test_nested_launch_runs_serially_in_its_task(nested_mod, native):
    # The inner launch finds the pool busy (the outer launch holds it) and runs its tasks in the calling thread.
    parallel.set_num_threads(2)
    for _ in range(50):
        counts = np.zeros(64, "int32")
        tids = np.zeros(64, "int64")
        nested_mod["nest"](counts, tids)
        np.testing.assert_array_equal(counts, np.ones(64, "int32"))
        for o in range(8):
            assert len(set(tids[8 * o:8 * o + 8].tolist())) == 1  # one outer task's inner tasks: one thread


def test_concurrent_launches_from_two_python_threads(built, nested_mod, native):
    parallel.set_num_threads(2)
    errors = []
    done = []
    a, b = _inputs(7)
    want = a * b + a * np.float32(0.5)

    def elementwise():
        c = np.zeros(N_ELEM, "float32")
        for _ in range(30):
            built["ew"]["ew"](a, b, c)
            np.testing.assert_allclose(c, want, rtol=1e-6, atol=1e-6)
        done.append("ew")

    def marks():
        for _ in range(300):
            counts, _ = _mark(built["par"], 0)
            assert (counts == 1).all(), counts
            counts = np.zeros(64, "int32")
            nested_mod["nest"](counts, np.zeros(64, "int64"))
            assert (counts == 1).all(), counts
        done.append("mark")

    def guarded(fn):
        def run():
            try:
                fn()
            except BaseException as exc:  # reported by the main thread
                errors.append(exc)
        return run

    threads = [threading.Thread(target=guarded(f), daemon=True) for f in (elementwise, marks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT_S)
    assert not any(t.is_alive() for t in threads), "concurrent launches deadlocked"
    assert not errors, errors
    assert sorted(done) == ["ew", "mark"]


def test_set_num_threads_starts_and_stops_workers(built, native):
    parallel.set_num_threads(1)
    time.sleep(0.2)  # let OS threads of earlier tests finish exiting
    base_os = _os_threads()
    assert _pool_threads() == [] and native.num_workers == 0
    counts, tids = _mark(built["par"], 0)  # NULL launcher: the module's own serial loop
    assert (counts == 1).all() and len(set(tids.tolist())) == 1
    for threads in (4, 2, 3):
        parallel.set_num_threads(threads)
        assert native.num_workers == threads - 1
        assert len(_pool_threads()) == threads - 1
        assert _settled_os_threads(base_os + threads - 1) == base_os + threads - 1
        counts, tids = _mark(built["par"], 1)
        assert (counts == 1).all() and 2 <= len(set(tids.tolist())) <= threads
    parallel.set_num_threads(1)
    # shut down and joined: no worker thread remains, in Python or in the kernel's view
    assert _pool_threads() == [] and native.num_workers == 0
    assert _settled_os_threads(base_os) == base_os


def test_pool_works_in_a_forked_child(built, native):
    parallel.set_num_threads(2)
    _mark(built["par"], 0)  # the parent's worker exists; it does not survive fork
    a, b = _inputs(3)
    pid = os.fork()
    if pid == 0:  # child: the pool is reset and restarted; a launch needing 2 threads must finish
        code = 1
        try:
            counts, tids = _mark(built["par"], 1)
            c = np.zeros(N_ELEM, "float32")
            built["ew"]["ew"](a, b, c)
            ok = ((counts == 1).all() and len(set(tids.tolist())) == 2 and parallel.native_pool().num_workers == 1
                  and np.allclose(c, a * b + a * np.float32(0.5), rtol=1e-6, atol=1e-6))
            code = 0 if ok else 2
        finally:
            os._exit(code)
    status = wait_forked_child(pid, WAIT_S, "in the native pool")
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    counts, _ = _mark(built["par"], 1)  # and the parent's pool is untouched
    assert (counts == 1).all()


def _thread_cpu_ticks(native_id: int) -> int:
    fields = pathlib.Path("/proc/self/task/%d/stat" % native_id).read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime (fields 14 and 15 of stat)


def test_idle_workers_sleep(built, native):
    parallel.set_num_threads(3)
    for _ in range(200):
        _mark(built["par"], 0)
    time.sleep(0.1)  # the default spin is well under a millisecond
    workers = _pool_threads()
    assert len(workers) == 2
    before = [_thread_cpu_ticks(t.native_id) for t in workers]
    cpu0 = time.process_time()
    time.sleep(0.5)
    cpu = time.process_time() - cpu0
    after = [_thread_cpu_ticks(t.native_id) for t in workers]
    hz = os.sysconf("SC_CLK_TCK")
    # a spinning worker would burn ~0.5 s each; sleeping ones wake once a second at most
    assert all((a - b) / hz < 0.05 for a, b in zip(after, before)), (before, after)
    assert cpu < 0.25, cpu


def test_spin_setting_is_checked(native):
    with pytest.raises(ValueError):
        parallel.set_pool_spin(-1)


FALLBACK_CHECK = textwrap.dedent("""
    import sys
    import numpy as np
    from tether_rpc import module, parallel
    parallel.set_num_threads(2)
    parallel.set_min_parallel_work_us(0)
    m = module.load_module(sys.argv[1])
    assert parallel.native_pool() is None, "a hand-written module cannot provide the pool"
    counts = np.zeros(64, "int32"); tids = np.zeros(64, "int64")
    m["mark"](counts, tids, 1)
    assert (counts == 1).all(), counts
    assert len(set(tids.tolist())) == 2, tids
    assert parallel._task_cache, "the Python launcher ran the tasks"
    print("FALLBACK-OK")
""")


def test_without_a_provider_the_python_launcher_runs(built, tmp_path):
    # A fresh process that loads only a hand-written module (no pool): the Python launcher, as before.
    env = dict(os.environ, TETHER_NUM_THREADS="2")
    proc = subprocess.run([sys.executable, "-c", FALLBACK_CHECK, built["par"].path], capture_output=True,
                          text=True, timeout=WAIT_S, env=env)
    assert proc.returncode == 0 and "FALLBACK-OK" in proc.stdout, proc.stderr[-3000:]


def test_native_pool_can_be_switched_off(built, native):
    parallel.set_num_threads(2)
    parallel.set_native_pool_enabled(False)
    assert parallel.native_pool() is None and _pool_threads() == []
    counts, tids = _mark(built["par"], 0)  # the Python launcher now
    assert (counts == 1).all()
    parallel.set_native_pool_enabled(True)
    assert native.num_workers == 1
    counts, tids = _mark(built["par"], 1)
    assert (counts == 1).all() and len(set(tids.tolist())) == 2


SHF_EXECINSTR = 0x4


@pytest.mark.parametrize("preset", [p for p in PRESET_NAMES if not p.startswith("wasm32")])   # (single-threaded)
def test_pool_keeps_every_preset_self_contained(tmp_path, preset):
    # The pool adds exports and a system-call stub, but no libc: no DT_NEEDED, no undefined symbol, and the stub
    # (emitted into a .text.* section) ends up in the executable .text of the linked library.
    a = te.placeholder((4096,), "float32", name="A")
    c = te.compute((4096,), lambda i: a[i] + 1.0, name="C")
    s = te.create_schedule(c.op)
    xo, xi = s[c].split(c.op.axis[0], factor=256)
    s[c].parallel(xo)
    lib = tether.build(s, [a, c], target=preset, name="inc")
    with elf.read_elf(lib.export_library(str(tmp_path / "inc.so"))) as f:
        assert f.needed == [] and f.undefined_symbols == []
        assert set(threadpool.EXPORTED_SYMBOLS) <= set(f.exported_symbols)
        assert f.section(".text.tether_pool_syscall") is None
        assert f.section(".text").flags & SHF_EXECINSTR
