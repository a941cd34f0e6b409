#!/usr/bin/env python3
"""The model kinds real users bring (tether.testing.model_kinds): tether's compile time, its latency against
onnxruntime at 1 and 2 threads, and its max relative error against onnxruntime.

    python scripts/bench_model_kinds.py [--kinds db_detector,vad,...] [--size bench|test] [--repeat 9]
                                        [--profile N] [--json out.json]

Each kind is built with onnx.helper at the input size the shipped model runs on (``--size test``: the small inputs
of tests/test_model_kinds.py), compiled for the host at opt_level 3 (compile time = from_onnx + build_graph),
with the object cache off unless TETHER_OBJECT_CACHE is set (scripts/bench_compile.py compares cold and warm
builds), checked against onnxruntime (max relative error = max |tether - ort| / max |ort|, over every output),
then timed.
Timing alternates between the runtimes (tether sample, onnxruntime sample, ...) so a burst of load on a shared
machine hits both alike; a sample is the mean of enough back-to-back runs to last about 50 ms. Reported: medians
of ``--repeat`` samples and their ratio tether / onnxruntime (lower is better; the goal is at most 1.3); at one
thread also the ratio of the median CPU times of the process ("cpu 1t"), which time-slicing on a loaded machine
does not inflate.
``--profile N`` also prints the N slowest kernels of each model at 1 thread (tether's per-node profile).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time



HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "src"))
sys.path.insert(0, os.path.join(HERE, "..", "rpc_server"))
sys.path.insert(0, HERE)   # the scripts' shared helpers, also when this file is loaded by its path

from _rows import add_json_option, print_ratio_means, write_rows  # noqa: E402


def _number_for(fn, target_s: float = 0.05) -> int:
    t0 = time.perf_counter()
    fn()
    one = time.perf_counter() - t0
    return max(1, min(1000, int(target_s / max(one, 1e-6))))


def _sample(fn, number: int) -> tuple:
    """(wall seconds, process CPU seconds) per call, over ``number`` back-to-back calls."""
    c0, t0 = time.process_time(), time.perf_counter()
    for _ in range(number):
        fn()
    return (time.perf_counter() - t0) / number, (time.process_time() - c0) / number


def _settled_sample(fn, number: int) -> tuple:
    from _timing import settle

    settle(fn)
    return _sample(fn, number)


def bench(name: str, size: str, repeat: int, profile: int) -> dict:
    import onnxruntime as ort

    import tether
    from tether import graph_executor
    from tether.frontend import from_onnx
    from tether.testing.model_kinds import KINDS, relative_error
    from tether_rpc import parallel

    model, feeds = KINDS[name](size)
    t0 = time.perf_counter()
    graph, params = from_onnx(model)
    factory = tether.build_graph(graph, params, target="host", opt_level=3)
    compile_s = time.perf_counter() - t0
    gm = graph_executor.from_factory(factory)
    for k, v in feeds.items():
        gm.set_input(k, v)
    row = {"kind": name, "size": size, "compile_s": compile_s, "kernels": factory.kernel_count}
    blob = model.SerializeToString()
    for threads in (1, 2):
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        sess = ort.InferenceSession(blob, so, providers=["CPUExecutionProvider"])
        parallel.set_num_threads(threads)
        gm.run()
        ref = sess.run(None, feeds)
        if threads == 1:
            row["max_rel_err"] = max(relative_error(gm.get_output(i), r) for i, r in enumerate(ref))

        def run_ort():
            sess.run(None, feeds)
        n_t, n_o = _number_for(gm.run), _number_for(run_ort)
        # each sample after a pause: the other runtime's pool threads idle, as when this one runs alone
        pairs = [(_settled_sample(gm.run, n_t), _settled_sample(run_ort, n_o)) for _ in range(repeat)]
        row["tether_ms_%dt" % threads] = statistics.median(p[0][0] for p in pairs) * 1e3
        row["ort_ms_%dt" % threads] = statistics.median(p[1][0] for p in pairs) * 1e3
        row["ratio_%dt" % threads] = row["tether_ms_%dt" % threads] / row["ort_ms_%dt" % threads]
        if threads == 1:
            # on one thread the process's CPU time is the latency without the time-slicing of a loaded machine
            row["ratio_1t_cpu"] = (statistics.median(p[0][1] for p in pairs)
                                   / statistics.median(p[1][1] for p in pairs))
        if threads == 1 and profile:
            prof = gm.profile(number=max(1, n_t // 2))
            nodes = sorted(prof["nodes"], key=lambda r: -r["seconds"])[:profile]
            row["profile"] = [{"func": r["func"], "ops": r["ops"], "ms": r["seconds"] * 1e3} for r in nodes]
    return row


def main() -> int:
    from tether.testing.model_kinds import KINDS

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kinds", default=",".join(KINDS), help="comma-separated, from: " + ", ".join(KINDS))
    ap.add_argument("--size", default="bench", choices=["bench", "test"])
    ap.add_argument("--repeat", type=int, default=9, help="samples per runtime and thread count (medians)")
    ap.add_argument("--profile", type=int, default=0, help="print the N slowest kernels at 1 thread")
    add_json_option(ap)
    args = ap.parse_args()
    # ---- compile time is the cold figure (what a user's first build costs) unless the caller asks for the object cache
    os.environ.setdefault("TETHER_OBJECT_CACHE", "0")
    rows = []
    print("%-20s %7s %5s %10s %10s %6s %7s %10s %10s %6s %8s" % (
        "kind", "compile", "kern", "tether 1t", "ort 1t", "ratio", "cpu 1t", "tether 2t", "ort 2t", "ratio", "rel err"))
    for name in [k.strip() for k in args.kinds.split(",") if k.strip()]:
        if name not in KINDS:
            raise SystemExit("unknown kind %r (choose from %s)" % (name, ", ".join(KINDS)))
        r = bench(name, args.size, args.repeat, args.profile)
        rows.append(r)
        print("%-20s %6.2fs %5d %8.3fms %8.3fms %5.2fx %6.2fx %8.3fms %8.3fms %5.2fx %8.1e" % (
            name, r["compile_s"], r["kernels"], r["tether_ms_1t"], r["ort_ms_1t"], r["ratio_1t"], r["ratio_1t_cpu"],
            r["tether_ms_2t"], r["ort_ms_2t"], r["ratio_2t"], r["max_rel_err"]))
        for p in r.get("profile", []):
            print("    %8.3fms  %-40s %s" % (p["ms"], p["func"][:40], p["ops"][:80]))
        sys.stdout.flush()
    print_ratio_means(rows)
    write_rows(args.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
