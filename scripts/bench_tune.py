#!/usr/bin/env python3
"""Tuning throughput on loopback: candidates built per second (forked build workers) and candidates measured per
second per device (one upload of a small module + load + output check + one time_evaluator), against the floor
of a bare time_evaluator call on an already loaded function, measured in the same run. Prints medians and ratios.

    python scripts/bench_tune.py [--devices 2] [--candidates 40] [--rounds 3] [--build-jobs 2] [--min-repeat-ms MS]

Kernels: the digits CNN's five kernels (tests/data/digits_cnn.onnx: microsecond-sized conv, pooling, dense,
softmax), candidates drawn at random from their config spaces. Measurement options are `tether tune`'s defaults
(8 repeats of >= 0.5 ms, 4 MiB cache flush before each). On a shared box absolute rates move with the load; the
ratio to the floor says what the tuner itself costs.
"""
from __future__ import annotations

import argparse
import os
import queue
import random
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _tune_lab import device_pool  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--devices", type=int, default=2)
    ap.add_argument("--candidates", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--build-jobs", type=int, default=2)
    ap.add_argument("--min-repeat-ms", type=float, default=None, help="default: tether tune's")
    ap.add_argument("--flush-mb", type=float, default=None, help="default: tether tune's")
    args = ap.parse_args()

    import onnx

    from tether.frontend import from_onnx
    from tether.rpc.tracker_client import connect_tracker
    from tether.tune.measure import Builder, Candidate, DevicePool, MeasureOptions
    from tether.tune.tasks import KERNEL_NAME, extract_tasks

    graph, params = from_onnx(onnx.load(os.path.join(ROOT, "tests", "data", "digits_cnn.onnx")),
                              shape={"input": (1, 1, 8, 8)})
    tasks = extract_tasks(graph, params, "host")
    rng = random.Random(0)
    picks = [(i, t.space.default()) for i, t in enumerate(tasks)]
    while len(picks) < len(tasks) + args.candidates:
        i = rng.randrange(len(tasks))
        picks.append((i, tasks[i].space.sample(rng)))
    options = MeasureOptions()
    if args.min_repeat_ms is not None:
        options.min_repeat_ms = args.min_repeat_ms
    if args.flush_mb is not None:
        options.flush_bytes = int(args.flush_mb * (1 << 20))
    print("measurement: %d repeats of >= %g ms, %.0f MiB flush before each"
          % (options.repeat, options.min_repeat_ms, options.flush_bytes / (1 << 20)))
    workdir = tempfile.mkdtemp(prefix="bench-tune-")
    try:
        # -- builds
        builder = Builder(tasks, workdir, args.build_jobs)
        done: "queue.Queue" = queue.Queue()
        t0 = time.perf_counter()
        for i, cfg in picks:
            builder.submit(Candidate(i, cfg), lambda c, err: done.put((c, err)))
        built = [done.get(timeout=600) for _ in picks]
        build_s = time.perf_counter() - t0
        builder.close()
        errors = [err for _, err in built if err]
        if errors:
            raise SystemExit("build failed: %s" % errors[0])
        cands = sorted((c for c, _ in built), key=lambda c: (not c.reference, c.task))
        per_build = statistics.median(c.build_s for c in cands)
        print("builds: %d candidates in %.2f s with %d workers: %.1f builds/s (median %.0f ms per build)"
              % (len(cands), build_s, args.build_jobs, len(cands) / build_s, per_build * 1e3))

        with device_pool(args.devices) as tracker:
            refs: dict = {}
            results: "queue.Queue" = queue.Queue()
            pool = DevicePool(tracker, "host", tasks, refs, lambda c, r: results.put((c, r)), options)
            pool.start()
            # references first (the default of each task), then the timed rounds
            for i, cfg in picks[:len(tasks)]:
                src = next(c for c in cands if c.task == i and c.config == cfg)
                ref = Candidate(i, cfg, reference=True, timed=False, path=_copy(src.path, workdir, "ref%d" % i))
                pool.submit(ref)
            for _ in tasks:
                c, r = results.get(timeout=120)
                if r["status"] != "ok":
                    raise SystemExit("reference run failed: %s" % r)
            rates = []
            for rnd in range(args.rounds):
                batch = [Candidate(c.task, c.config, path=_copy(c.path, workdir, "r%d_%d" % (rnd, k)))
                         for k, c in enumerate(cands[len(tasks):])]
                t0 = time.perf_counter()
                for c in batch:
                    pool.submit(c)
                got = [results.get(timeout=600) for _ in batch]
                elapsed = time.perf_counter() - t0
                bad = [r for _, r in got if r["status"] != "ok"]
                if bad:
                    raise SystemExit("a measurement failed: %s" % bad[0])
                rates.append(len(batch) / elapsed / args.devices)
                print("round %d: %d candidates on %d devices in %.2f s: %.1f candidates/s per device"
                      % (rnd + 1, len(batch), args.devices, elapsed, rates[-1]))
            pool.close()

            # the floor: time_evaluator alone, same options, on one loaded function of one task
            host, _, port = tracker.rpartition(":")
            with connect_tracker(host, int(port)) as tc:
                session = tc.request("host", wait_timeout=30)
            with session:
                src = cands[len(tasks)]
                session.upload(src.path if os.path.exists(src.path) else _rebuild(tasks, src, workdir), name="f.so")
                fn = session.load_module("f.so")[KERNEL_NAME]
                arrs = [session.array(x) for x in tasks[src.task].inputs(config=src.config)]
                shape, dtype = tasks[src.task].args[-1]
                arrs.append(session.empty(shape, dtype))
                evaluate = fn.time_evaluator(number=1, repeat=options.repeat, min_repeat_ms=options.min_repeat_ms,
                                             flush_bytes=options.flush_bytes)
                floor = []
                for _ in range(20):
                    t0 = time.perf_counter()
                    evaluate(*arrs)
                    floor.append(time.perf_counter() - t0)
        med = statistics.median(rates)
        floor_rate = 1.0 / statistics.median(floor)
        print()
        print("measured: median %.1f candidates/s per device (target >= 20); floor (time_evaluator alone): %.1f/s; "
              "ratio %.2f" % (med, floor_rate, med / floor_rate))
        print("builds: %.1f/s with %d workers" % (len(cands) / build_s, args.build_jobs))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _copy(path: str, workdir: str, name: str) -> str:
    dst = os.path.join(workdir, name + ".so")
    shutil.copyfile(path, dst)
    return dst


def _rebuild(tasks, cand, workdir: str) -> str:
    path = os.path.join(workdir, "floor.so")
    tasks[cand.task].build(cand.config).export_library(path)
    return path


if __name__ == "__main__":
    main()
