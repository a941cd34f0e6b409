#!/usr/bin/env python3
"""Tune models on this box (host as the device: two `rpc-server`s registered with an `rpc-tracker`, one thread
each), then measure the default and the tuned build side by side in the same run, against onnxruntime at 1 thread.

    python scripts/tune_models.py [--models mobilenet_v2,resnet50] [--time-budget 540] [--trials 400]
                                  [--logs DIR] [--resume] [--repeat 15] [--number 3]

For each model: `tether tune` (the Tuner, as the CLI runs it) within --time-budget seconds, logging to
DIR/<model>.jsonl; then tether.build_graph without and with the log; both outputs are checked against onnxruntime;
then default, tuned and onnxruntime (1 intra-op thread) are timed interleaved (one sample of each in turn, each the
mean of --number runs; tether at 1 thread too), and the medians and ratios are printed. On a shared box the
absolute times move with the load; the interleaved ratios are what the run shows.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _rows import add_json_option, write_rows  # noqa: E402
from _timing import add_sample_options  # noqa: E402
from _tune_lab import device_pool  # noqa: E402
from bench_models import load_model  # noqa: E402  (the same models as the model benchmark)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def tune(name: str, graph, params, log_path: str, args) -> dict:
    from tether.tune.measure import MeasureOptions
    from tether.tune.search import Tuner, TuneOptions
    from tether.tune.tasks import extract_tasks

    tasks = extract_tasks(graph, params, args.target)
    options = TuneOptions(trials=args.trials, time_budget=args.time_budget, build_jobs=args.build_jobs,
                          measure=MeasureOptions())
    last = [0.0]

    def progress(tuner) -> None:
        if time.monotonic() - last[0] > 30:
            last[0] = time.monotonic()
            done = sum(1 for s in tuner.states if s.best_s)
            print("  %s: %4.0f s, %d measured (%.1f/s), %d/%d tasks have a result, devices %s"
                  % (name, tuner.elapsed(), tuner.measured_now, tuner.measured_now / max(tuner.elapsed(), 1e-9),
                     done, len(tuner.states), ",".join(tuner.pool.devices_in_use()) if tuner.pool else "-"))
            sys.stdout.flush()

    with device_pool(2, env=dict(os.environ, TETHER_NUM_THREADS="1")) as tracker:
        t0 = time.monotonic()
        summary = Tuner(tasks, log_path, tracker, "host", options=options, resume=args.resume,
                        on_progress=progress).run()
        summary["wall_s"] = time.monotonic() - t0
    return summary


def compare(name: str, model, graph, params, log_path: str, args) -> dict:
    import onnxruntime as ort

    import tether
    from tether import graph_executor
    from tether_rpc import parallel

    parallel.set_num_threads(1)
    runs = {}
    for label, kw in (("default", {}), ("tuned", {"tuning_log": log_path})):
        factory = tether.build_graph(graph, params, target=args.target, **kw)
        runs[label] = graph_executor.from_factory(factory)
    in_name = graph.inputs[0]
    x = np.random.default_rng(0).uniform(0, 1, graph.types[in_name].shape).astype(np.float32)
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    feeds = {sess.get_inputs()[0].name: x}
    ref = sess.run(None, feeds)[0]
    row = {"model": name}
    for label, gm in runs.items():
        gm.set_input(in_name, x)
        gm.run()
        row["max_abs_err_" + label] = float(np.abs(gm.get_output(0) - ref).max())
    fns = {"default": runs["default"].run, "tuned": runs["tuned"].run, "onnxruntime": lambda: sess.run(None, feeds)}
    samples = {k: [] for k in fns}
    for fn in fns.values():
        fn()
    for _ in range(args.repeat):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            for _ in range(args.number):
                fn()
            samples[k].append((time.perf_counter() - t0) / args.number)
    for k, s in samples.items():
        row[k + "_ms"] = statistics.median(s) * 1e3
    # the factor from paired samples: each default sample against the tuned one taken right after it
    row["speedup"] = statistics.median(d / t for d, t in zip(samples["default"], samples["tuned"]))
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="mobilenet_v2,resnet50")
    ap.add_argument("--time-budget", type=float, default=540.0, help="seconds of tuning per model")
    ap.add_argument("--trials", type=int, default=400, help="configs per kernel at most")
    ap.add_argument("--build-jobs", type=int, default=2)
    ap.add_argument("--logs", default=os.path.join(tempfile.gettempdir(), "tether-tune-logs"))
    ap.add_argument("--resume", action="store_true", help="continue the logs in --logs")
    ap.add_argument("--compare-only", action="store_true", help="no tuning: compare with the logs in --logs")
    add_sample_options(ap, number=3, repeat=15)
    ap.add_argument("--target", default="host")
    add_json_option(ap)
    args = ap.parse_args()

    from tether.frontend import from_onnx

    os.makedirs(args.logs, exist_ok=True)
    rows = []
    for name in [m.strip() for m in args.models.split(",") if m.strip()]:
        model = load_model(name)
        graph, params = from_onnx(model)
        log_path = os.path.join(args.logs, name + ".jsonl")
        row = {}
        if not args.compare_only:
            if os.path.exists(log_path) and not args.resume:
                os.unlink(log_path)
            summary = tune(name, graph, params, log_path, args)
            row.update(tune_s=summary["wall_s"], measured=summary["measured"],
                       kernel_speedup=summary["kernel_speedup"], tasks=len(summary["tasks"]))
            print("%s: tuned %d tasks, %d measurements in %.0f s (%.1f/s); kernel time, weighted: %.2fx"
                  % (name, len(summary["tasks"]), summary["measured"], summary["wall_s"],
                     summary["measured"] / summary["wall_s"], summary["kernel_speedup"] or 0))
        row.update(compare(name, model, graph, params, log_path, args))
        rows.append(row)
        print("%s at 1 thread: default %.2f ms, tuned %.2f ms -> %.2fx faster (median of paired ratios); "
              "onnxruntime %.2f ms (tuned / ort %.2f, default / ort %.2f); max abs err default %.2g, tuned %.2g"
              % (name, row["default_ms"], row["tuned_ms"], row["speedup"], row["onnxruntime_ms"],
                 row["tuned_ms"] / row["onnxruntime_ms"], row["default_ms"] / row["onnxruntime_ms"],
                 row["max_abs_err_default"], row["max_abs_err_tuned"]))
        sys.stdout.flush()
    write_rows(args.json, rows)


if __name__ == "__main__":
    main()
