#!/usr/bin/env python3
"""The Java device server (android_app/run_device.sh) against the Python one (python -m tether_rpc), same run.

    python scripts/bench_java_device.py [--repeat 5] [--calls 200]

Both servers run on loopback; the Java one twice: sessions in child JVMs (the desktop default, crash isolation)
and in its own process (--isolation thread, what Android does). Prints medians, and ratios to the Python server,
of: session open (connect to WELCOME), small-call round trip (tether.echo), a 1024-element vadd kernel call with
device arrays, the kernel's own time (time_evaluator: timed on the device), and for the isolating servers the
crash recovery: a segfaulting kernel's SessionCrashed until the next session answers.
"""
from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import sys
import tempfile
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from _timing import echo_round_trip  # noqa: E402
from fixtures.rpc import EXTRA_KERNELS, ServerProcess  # noqa: E402
from kernels import GCC_FLAGS, KERNEL_DIR, build_kernel  # noqa: E402
from tether import errors, rpc  # noqa: E402


def kernels(tmp: pathlib.Path) -> dict:
    import subprocess

    vadd = build_kernel("vadd", tmp)
    src = tmp / "misc.c"
    src.write_text(EXTRA_KERNELS)
    misc = tmp / "misc.so"
    subprocess.run(["gcc", *GCC_FLAGS, "-I", str(KERNEL_DIR), str(src), "-o", str(misc), "-Wl,--no-undefined"],
                   check=True, timeout=60)
    return {"vadd": vadd, "misc": misc}


def measure(server: ServerProcess, k: dict, repeat: int, calls: int, crash: bool) -> dict:
    opens, rtts, kcalls, ktimes, recover = [], [], [], [], []
    a = np.random.default_rng(0).standard_normal(1024).astype("float32")
    for _ in range(repeat):
        t0 = time.perf_counter()
        with rpc.connect(server.host, server.port, timeout=60) as remote:
            opens.append(time.perf_counter() - t0)
            rtts.append(echo_round_trip(remote, calls))
            remote.upload(k["vadd"])
            f = remote.load_module("vadd.so")["vadd"]
            A, B, C = remote.array(a), remote.array(a), remote.empty((1024,), "float32")
            f(A, B, C)
            t1 = time.perf_counter()
            for _ in range(calls):
                f(A, B, C)
            kcalls.append((time.perf_counter() - t1) / calls)
            ktimes.append(statistics.median(f.time_evaluator(number=100, repeat=5)(A, B, C).samples))
        if crash:
            with rpc.connect(server.host, server.port, timeout=60) as remote:
                remote.upload(k["misc"])
                c = remote.load_module("misc.so")["crash"]
                try:
                    c()
                except errors.SessionCrashed:
                    pass
                t1 = time.perf_counter()
            with rpc.connect(server.host, server.port, timeout=60) as remote:
                remote.get_function("tether.echo")(1)
            recover.append(time.perf_counter() - t1)
    out = {"open": statistics.median(opens), "rtt": statistics.median(rtts), "kernel_call": statistics.median(kcalls),
           "kernel_time": statistics.median(ktimes)}
    if recover:
        out["crash_recovery"] = statistics.median(recover)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--calls", type=int, default=200)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmpname:
        tmp = pathlib.Path(tmpname)
        k = kernels(tmp)
        env = dict(os.environ)
        env.pop("TETHER_TOKEN", None)
        env["PYTHONPATH"] = "%s:%s" % (ROOT / "src", ROOT / "rpc_server")
        setups = [("python rpc-server", None, True), ("java, child JVMs", ["--isolation", "process"], True),
                  ("java, in process", ["--isolation", "thread"], False)]
        rows = {}
        for name, java_flags, crash in setups:
            work = tmp / name.replace(" ", "_").replace(",", "")
            work.mkdir()
            flags = ["--host", "127.0.0.1", "--port", "0", "--workdir", str(work)]
            command = None if java_flags is None else [str(ROOT / "android_app" / "run_device.sh")]
            server = ServerProcess(flags + (java_flags or []), work / "server.log", env=env, start_timeout=120,
                                   command=command)
            try:
                rows[name] = measure(server, k, args.repeat, args.calls, crash)
            finally:
                server.stop()
    base = rows["python rpc-server"]
    print("%-20s %12s %12s %14s %14s %16s" % ("server", "open ms", "echo us", "vadd call us", "vadd time us",
                                                 "crash->next ms"))
    for name, r in rows.items():
        crash = "%9.1f" % (r["crash_recovery"] * 1e3) if "crash_recovery" in r else "-"
        print("%-20s %12.2f %12.1f %14.1f %14.2f %16s" % (name, r["open"] * 1e3, r["rtt"] * 1e6,
                                                           r["kernel_call"] * 1e6, r["kernel_time"] * 1e6, crash))
    for name, r in rows.items():
        if r is base:
            continue
        ratios = ", ".join("%s %.2fx" % (key, r[key] / base[key]) for key in r if key in base and base[key] > 0)
        print("%s vs python rpc-server: %s" % (name, ratios))
    return 0


if __name__ == "__main__":
    sys.exit(main())
