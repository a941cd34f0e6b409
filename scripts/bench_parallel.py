"""Benchmark the device runtime's call path and parallel launcher against baselines measured in the same run.

Builds the ABI test kernels (tests/kernels/*.c) with gcc, then prints medians of:
  1. per-call cost: raw ctypes call vs PackedFunc(...) vs PackedFunc.bind(...)() on a 1024-element vadd;
  2. launch overhead: empty tasks through the thread-pool launcher vs the module's serial fallback;
  3. scaling: a compute-bound kernel, serial fallback vs the pool with 1 and 2 threads;
  4. the native pool (a tether-built module is loaded and becomes its provider): launch overhead and scaling
     of the same kernels through the native pool vs the Python launcher vs serial, in alternating rounds.
Sections 1-3 run before any tether-built module is loaded, so they measure the Python launcher.
Usage: python scripts/bench_parallel.py [--repeat 7] [--min-ms 100] [--native-only]
"""
from __future__ import annotations

import argparse
import pathlib
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from fixtures.schedules import elementwise  # noqa: E402
from kernels import build_kernel  # noqa: E402
from tether_rpc import module, parallel, timing  # noqa: E402


def median_time(call, repeat: int, min_ms: float) -> float:
    res = timing.time_evaluator(call, (), number=1, repeat=repeat, min_repeat_ms=min_ms, warmup=3)
    return statistics.median(res["samples"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--min-ms", type=float, default=100.0)
    ap.add_argument("--native-only", action="store_true", help="only section 4 (the native pool)")
    opts = ap.parse_args()
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="tether-bench-"))
    try:
        if not opts.native_only:
            run(tmp, opts.repeat, opts.min_ms)
        run_native(tmp, opts.repeat, opts.min_ms)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def run(tmp: pathlib.Path, repeat: int, min_ms: float) -> None:
    vadd = module.load_module(str(build_kernel("vadd", tmp)))
    par_path = build_kernel("par", tmp)
    serial_path = tmp / "par_serial.so"
    shutil.copyfile(par_path, serial_path)
    par = module.load_module(str(par_path))
    ser = module.load_module(str(serial_path), parallel_launcher=False)
    print("threads available: %d; pool default: %d" % (len(__import__("os").sched_getaffinity(0)),
                                                      parallel.default_num_threads()))

    # 1. call path
    a, b, c = (np.ones(1024, "float32") for _ in range(3))
    f = vadd["vadd"]
    values, codes, n, _keep = f._pack((a, b, c))
    raw = f._cfunc
    t_raw = median_time(lambda: raw(values, codes, n), repeat, min_ms)
    t_call = median_time(lambda: f(a, b, c), repeat, min_ms)
    bound = f.bind(a, b, c)
    t_bound = median_time(bound, repeat, min_ms)
    print("\n[call path] vadd float32[1024], median per call")
    print("  raw ctypes call (baseline)      %8.2f us" % (t_raw * 1e6))
    print("  PackedFunc(a, b, c) numpy args  %8.2f us   (%.2fx baseline)" % (t_call * 1e6, t_call / t_raw))
    print("  PackedFunc.bind(...)()          %8.2f us   (%.2fx baseline)" % (t_bound * 1e6, t_bound / t_raw))

    # 2. launch overhead
    counts = np.zeros(64, "int32")
    default_min_us = parallel.get_min_parallel_work_us()

    def pool_times(fn, *args):
        times = []
        for threads, min_us in ((1, 0.0), (2, 0.0), (2, default_min_us)):
            parallel.set_num_threads(threads)
            parallel.set_min_parallel_work_us(min_us)
            times.append(median_time(fn.bind(*args), repeat, min_ms))
        return times

    print("\n[launch overhead] empty tasks; serial fallback (NULL launcher) is the baseline; median per launch")
    print("  pool=1 installs NULL (native loop); 'forced' always wakes the worker; 'auto' = default %.0f us rule"
          % default_min_us)
    print("  %-7s %11s %11s %14s %12s" % ("tasks", "serial us", "pool=1 us", "pool=2 forced", "pool=2 auto"))
    for k in (1, 2, 8, 16, 64, 1024):
        t_ser = median_time(ser["noop"].bind(counts, k), repeat, min_ms)
        p1, p2, auto = pool_times(par["noop"], counts, k)
        print("  %-7d %11.2f %11.2f %14.2f %12.2f   (forced: +%.1f us/launch, %.2f us/task)"
              % (k, t_ser * 1e6, p1 * 1e6, p2 * 1e6, auto * 1e6, (p2 - t_ser) * 1e6, (p2 - t_ser) * 1e6 / k))

    # 3. scaling of a compute-bound kernel: serial and pool samples alternate, so both see the same machine
    # load (the box may be shared); the speedup is the median of the per-round ratios.
    x = np.linspace(-1, 1, 65536).astype("float32")
    y = np.zeros_like(x)
    print("\n[scaling] heavy(): 65536 x 256 dependent float32 mul-adds; serial fallback is the baseline;")
    print("  %d alternating rounds, medians" % repeat)
    print("  %-7s %11s %13s %13s %15s" % ("tasks", "serial ms", "pool=2 ms", "speedup", "speedup range"))
    parallel.set_num_threads(2)
    parallel.set_min_parallel_work_us(default_min_us)
    for k in (2, 8, 16, 64):
        ser_call, par_call = ser["heavy"].bind(x, y, k), par["heavy"].bind(x, y, k)
        for _ in range(3):  # warm-up, including the launcher's two serial probes
            par_call()
        ts, tp = [], []
        for _ in range(repeat):
            ts.append(median_time(ser_call, 1, min_ms))
            tp.append(median_time(par_call, 1, min_ms))
        ratios = sorted(a / b for a, b in zip(ts, tp))
        print("  %-7d %11.3f %13.3f %12.2fx %8.2f-%.2fx" % (k, statistics.median(ts) * 1e3, statistics.median(tp) * 1e3,
                                                           statistics.median(ratios), ratios[0], ratios[-1]))
    parallel.set_min_parallel_work_us(default_min_us)
    parallel.set_num_threads(parallel.default_num_threads())


def _alternating(calls, repeat: int, min_ms: float):
    """Median time of each (setup, call) pair, measured in alternating rounds so all see the same load."""
    samples = [[] for _ in calls]
    for _ in range(repeat):
        for i, (setup, call) in enumerate(calls):
            setup()
            samples[i].append(median_time(call, 1, min_ms))
    return [statistics.median(t) for t in samples]


def _provider_module(tmp: pathlib.Path):
    """A small tether-built parallel kernel (y = 2x + 1 over 65536 floats): loading it provides the native pool."""
    import tether

    s, args = elementwise(65536, lambda a: a * 2.0 + 1.0, inputs=1, factor=1024, vectorize=False)
    lib = tether.build(s, args, target="host", name="affine")
    return module.load_module(lib.export_library(str(tmp / "affine.so")))


def run_native(tmp: pathlib.Path, repeat: int, min_ms: float) -> None:
    par_path = tmp / "par.so"
    if not par_path.exists():
        par_path = build_kernel("par", tmp)
    serial_path = tmp / "par_serial_native.so"
    shutil.copyfile(par_path, serial_path)
    par = module.load_module(str(par_path))
    ser = module.load_module(str(serial_path), parallel_launcher=False)
    affine = _provider_module(tmp)
    pool = parallel.native_pool()
    if pool is None:
        print("\n[native pool] not available (TETHER_NATIVE_POOL=0?): skipped")
        return
    default_min_us = parallel.get_min_parallel_work_us()
    parallel.set_num_threads(2)

    def python_forced():
        parallel.set_native_pool_enabled(False)
        parallel.set_min_parallel_work_us(0)

    def python_auto():
        parallel.set_native_pool_enabled(False)
        parallel.set_min_parallel_work_us(default_min_us)

    def native(spin=None):
        def setup():
            parallel.set_native_pool_enabled(True)
            parallel.set_pool_spin(spin if spin is not None else _default_spin())
        return setup

    def nothing():
        pass

    counts = np.zeros(64, "int32")
    print("\n[native pool] 2 threads; empty tasks of a hand-written module; serial fallback (NULL launcher) is "
          "the baseline;")
    print("  %d alternating rounds, medians per launch; 'python' = the ctypes-callback launcher (forced: always "
          "the pool)" % repeat)
    print("  %-6s %10s %14s %12s %14s %13s %16s" % ("tasks", "serial us", "python forced", "python auto",
                                                    "native spin=0", "native spin", "native vs python"))
    for k in (2, 8, 16, 64):
        t_ser, t_py, t_auto, t_n0, t_nat = _alternating(
            [(nothing, ser["noop"].bind(counts, k)), (python_forced, par["noop"].bind(counts, k)),
             (python_auto, par["noop"].bind(counts, k)), (native(0), par["noop"].bind(counts, k)),
             (native(), par["noop"].bind(counts, k))], repeat, min_ms)
        print("  %-6d %10.2f %14.2f %12.2f %14.2f %13.2f %15.1fx   (native: +%.2f us over serial)"
              % (k, t_ser * 1e6, t_py * 1e6, t_auto * 1e6, t_n0 * 1e6, t_nat * 1e6, t_py / t_nat,
                 (t_nat - t_ser) * 1e6))

    x = np.linspace(-1, 1, 65536).astype("float32")
    y = np.zeros_like(x)
    print("\n[native pool scaling] heavy() as in [scaling]; speedup over the serial fallback, medians;")
    print("  'cores' = process CPU time / wall time over native launches: 1.0 means the box lent this process one")
    print("  core only (another job holds the other), and no launcher can win then")
    print("  %-6s %10s %14s %14s %16s %7s" % ("tasks", "serial ms", "python ms", "native ms", "native speedup",
                                              "cores"))
    for k in (2, 16, 64):
        t_ser, t_py, t_nat = _alternating(
            [(nothing, ser["heavy"].bind(x, y, k)), (python_auto, par["heavy"].bind(x, y, k)),
             (native(), par["heavy"].bind(x, y, k))], repeat, min_ms)
        call = par["heavy"].bind(x, y, k)
        cpu0, wall0 = time.process_time(), time.perf_counter()
        for _ in range(5):
            call()
        cores = (time.process_time() - cpu0) / (time.perf_counter() - wall0)
        print("  %-6d %10.3f %14.3f %14.3f %15.2fx %7.2f" % (k, t_ser * 1e3, t_py * 1e3, t_nat * 1e3, t_ser / t_nat,
                                                             cores))

    # A tether-built kernel of model-launch size (tens of us): 16 chunked tasks of y = 2x + 1.
    xa = np.random.default_rng(0).random(65536, dtype=np.float32)
    ya = np.zeros_like(xa)

    def one_thread():
        parallel.set_num_threads(1)

    def two(setup):
        def both():
            parallel.set_num_threads(2)
            setup()
        return both

    call = affine["affine"].bind(xa, ya)
    t1, t_py, t_nat = _alternating([(one_thread, call), (two(python_auto), call), (two(native()), call)],
                                   repeat, min_ms)
    print("\n[native pool, compiled kernel] y = 2x + 1 over 65536 float32 (16 tasks), medians per call")
    print("  1 thread (NULL launcher)  %8.2f us" % (t1 * 1e6))
    print("  2 threads, python (auto)  %8.2f us   (%.2fx of 1 thread)" % (t_py * 1e6, t1 / t_py))
    print("  2 threads, native pool    %8.2f us   (%.2fx of 1 thread)" % (t_nat * 1e6, t1 / t_nat))
    parallel.set_native_pool_enabled(True)
    parallel.set_pool_spin(_default_spin())
    parallel.set_min_parallel_work_us(default_min_us)
    parallel.set_num_threads(parallel.default_num_threads())


def _default_spin() -> int:
    from tether.codegen import threadpool
    return threadpool.DEFAULT_SPIN


if __name__ == "__main__":
    main()
