#!/usr/bin/env python3
"""What `tether bench` costs per sample over `time_evaluator`'s own loop, measured on a real device server.

    python scripts/bench_overhead.py [--rounds 15] [--number 50]

Both loops time the same compiled kernel (a 64-element vadd built with tether for this machine) with the same
runs per sample. Per sample, `tether.bench.run` also reads the device state (thermal zone, cpufreq, throttle
flags where the board has them), the run-queue wait, checks for the end of the warm-up, and sends the sample as
an EVENT, as time_evaluator does. The fixed costs (first run, state snapshots) are taken out by timing each
loop at two sample counts and comparing the slopes:

    overhead per sample = [(bench(R2) - bench(R1)) - (time_evaluator(R2) - time_evaluator(R1))] / (R2 - R1)

with the medians of ``--rounds`` interleaved repetitions (host wall clock around each call). Goal: <= 50 us.
Loopback only; the server is a child process stopped by its PID.
"""
from __future__ import annotations

import argparse
import glob
import os
import pathlib
import statistics
import sys
import tempfile
import time
from typing import Dict, Optional

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "rpc_server"))

GOAL_US = 50.0


def build_kernel(out_dir: pathlib.Path, n: int = 64) -> pathlib.Path:
    import tether
    from tether import te

    A = te.placeholder((n,), "float32", name="A")
    B = te.placeholder((n,), "float32", name="B")
    C = te.compute((n,), lambda i: A[i] + B[i], name="C")
    s = te.create_schedule(C.op)
    path = out_dir / "vadd64.so"
    tether.build(s, [A, B, C], target="host", name="vadd").export_library(str(path))
    return path


def board_files(root: pathlib.Path) -> pathlib.Path:
    """A Raspberry-Pi-like /sys (a thermal zone, two cpufreq policies, the firmware's throttle flags) for hosts
    that have none, so the per-sample state reads a board costs are in the measurement too."""
    zone = root / "sys/class/thermal/thermal_zone0"
    zone.mkdir(parents=True)
    (zone / "type").write_text("cpu-thermal\n")
    (zone / "temp").write_text("48312\n")
    for k in range(2):
        policy = root / ("sys/devices/system/cpu/cpufreq/policy%d" % (4 * k))
        policy.mkdir(parents=True)
        (policy / "scaling_cur_freq").write_text("1500000\n")
    firmware = root / "sys/devices/platform/soc/soc:firmware"
    firmware.mkdir(parents=True)
    (firmware / "get_throttled").write_text("0x0\n")
    return root


def start_server(workdir: pathlib.Path, sysfs_root: Optional[pathlib.Path] = None):
    """`python -m tether_rpc` on 127.0.0.1, port 0, reading its board's state files under ``sysfs_root``: a
    tether.launch.ServiceProcess (waits until the server listens; ``stop()`` ends it by its PID)."""
    from tether.launch import start_rpc_server

    env = dict(os.environ)
    if sysfs_root is not None:
        env["TETHER_SYSFS_ROOT"] = str(sysfs_root)
    return start_rpc_server("--host", "127.0.0.1", "--port", "0", "--workdir", str(workdir), env=env,
                            log_path=workdir / "server.log")


def measure_overhead(host: str, port: int, library: pathlib.Path, rounds: int = 15, number: int = 50,
                     r1: int = 50, r2: int = 250) -> Dict[str, float]:
    """Per-sample overhead of tether.bench.run over time_evaluator (seconds), and the parts it came from."""
    from tether import rpc

    with rpc.connect(host, port, timeout=120) as remote:
        remote.upload(str(library), name="vadd64.so")
        f = remote.load_module("vadd64.so")["vadd"]
        rng = np.random.default_rng(0)
        args = [remote.array(rng.standard_normal(64).astype("float32")) for _ in range(2)] + \
            [remote.empty((64,), "float32")]
        bench = remote.get_function("tether.bench.run")

        def te_loop(repeat: int) -> float:
            evaluate = f.time_evaluator(number=number, repeat=repeat, warmup=1)
            t0 = time.perf_counter()
            evaluate(*args)
            return time.perf_counter() - t0

        gaps = []

        def bench_loop(samples: int) -> float:
            opts = {"number": number, "samples": samples, "max_warmup": 0, "retry_disturbed": False}
            t0 = time.perf_counter()
            res = bench(f.fn, [a.handle for a in args], opts)
            elapsed = time.perf_counter() - t0
            recs = res["samples"]
            if len(recs) != samples:
                raise RuntimeError("bench.run took %d samples, asked for %d" % (len(recs), samples))
            # device side: time between the end of one sample and the end of the next, minus its runs
            gaps.extend(b["t"] - a["t"] - b["s"] * number for a, b in zip(recs, recs[1:]))
            return elapsed

        for fn, r in ((te_loop, r1), (bench_loop, r1)):  # warm both paths once
            fn(r)
        times: Dict[str, list] = {"te1": [], "te2": [], "b1": [], "b2": []}
        for _ in range(rounds):  # interleaved, so load drifts hit all four alike
            times["te1"].append(te_loop(r1))
            times["b1"].append(bench_loop(r1))
            times["te2"].append(te_loop(r2))
            times["b2"].append(bench_loop(r2))
        med = {k: statistics.median(v) for k, v in times.items()}
        per_te = (med["te2"] - med["te1"]) / (r2 - r1)
        per_bench = (med["b2"] - med["b1"]) / (r2 - r1)
        sample_s = per_te  # one sample of `number` runs, as time_evaluator's loop does it
        return {"overhead_s": per_bench - per_te, "bench_per_sample_s": per_bench, "te_per_sample_s": sample_s,
                "device_gap_median_s": float(np.median(gaps)), "number": number, "rounds": rounds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--number", type=int, default=50, help="runs per sample")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tether-bench-overhead-") as tmp:
        tmp_path = pathlib.Path(tmp)
        lib = build_kernel(tmp_path)
        fake = None if glob.glob("/sys/class/thermal/thermal_zone*/temp") else board_files(tmp_path / "board")
        if fake is not None:
            print("this host has no thermal zone: the device reads a Pi-like set of board files instead")
        with start_server(tmp_path, sysfs_root=fake) as server:
            res = measure_overhead(server.host, server.port, lib, rounds=args.rounds, number=args.number)
    print("per sample of %d runs: time_evaluator %.1f us, tether.bench.run %.1f us"
          % (res["number"], res["te_per_sample_s"] * 1e6, res["bench_per_sample_s"] * 1e6))
    print("overhead per sample: %.1f us (goal <= %.0f us); device-side gap between samples: %.1f us (median)"
          % (res["overhead_s"] * 1e6, GOAL_US, res["device_gap_median_s"] * 1e6))


if __name__ == "__main__":
    main()
