#!/usr/bin/env python3
"""Thread scaling of whole models: tether vs onnxruntime at 1 and 2 threads, interleaved, plus per-kernel scaling.

    python scripts/bench_threads.py [--models mobilenet_v2,squeezenet] [--rounds 9] [--number 5] [--profile 12]

Each round times, in turn, tether at 1 thread, onnxruntime at 1 thread, tether at 2 threads and onnxruntime at 2
threads (``--number`` runs each, after a warm-up run), so all four see the same load on a shared machine. Printed
are medians over the rounds, the ratios tether / onnxruntime at each thread count, and each runtime's speed-up
from 1 to 2 threads. ``--profile N`` also times every kernel alone at 1 and 2 threads (the executor's per-node
profile) and lists the N kernels that gain least from the second thread, weighted by the time they lose.
Absolute times on a loaded box mean little; the ratios of one run do.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_models import compile_model  # noqa: E402
from _timing import per_call_samples, settle  # noqa: E402


def build(name: str, target: str):
    model, _, gm, in_name, x, _ = compile_model(name, target)
    return model, gm, in_name, x


def ort_session(model, threads: int):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def measure(name: str, rounds: int, number: int, target: str, profile: int) -> dict:
    from tether_rpc import parallel

    model, gm, in_name, x = build(name, target)
    feeds = {in_name: x}
    sessions = {t: ort_session(model, t) for t in (1, 2)}
    gm.run()
    ref = sessions[1].run(None, feeds)[0]
    err = float(np.abs(gm.get_output(0) - ref).max())
    samples = {(rt, t): [] for rt in ("tether", "ort") for t in (1, 2)}
    for _ in range(rounds):
        for t in (1, 2):
            parallel.set_num_threads(t)
            settle(gm.run)  # the previous runtime's pool threads idle, as when this one runs alone
            samples[("tether", t)].append(statistics.median(per_call_samples(gm.run, number, 1)))
            sess = sessions[t]
            settle(lambda: sess.run(None, feeds))
            samples[("ort", t)].append(statistics.median(per_call_samples(lambda: sess.run(None, feeds), number, 1)))
    med = {k: statistics.median(v) * 1e3 for k, v in samples.items()}
    row = {"model": name, "err": err, "ms": med}
    if profile:
        per = {}
        for t in (1, 2):
            parallel.set_num_threads(t)
            per[t] = gm.profile(number=20, repeat=3)["nodes"]
        row["profile"] = [(a["name"], a["func"], a["seconds"], b["seconds"]) for a, b in zip(per[1], per[2])]
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="mobilenet_v2,squeezenet")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--number", type=int, default=5)
    ap.add_argument("--target", default="host")
    ap.add_argument("--profile", type=int, default=0, help="list the N kernels that scale worst")
    args = ap.parse_args()
    print("load average at start: %s" % " ".join("%.2f" % v for v in os.getloadavg()))
    print("%-13s %9s %9s %6s %9s %9s %6s %8s %8s %8s" % ("model", "tether 1t", "ort 1t", "ratio", "tether 2t",
                                                        "ort 2t", "ratio", "tth 1/2", "ort 1/2", "max err"))
    r1, r2 = [], []
    for name in [m.strip() for m in args.models.split(",") if m.strip()]:
        row = measure(name, args.rounds, args.number, args.target, args.profile)
        ms = row["ms"]
        a, b = ms[("tether", 1)] / ms[("ort", 1)], ms[("tether", 2)] / ms[("ort", 2)]
        r1.append(a)
        r2.append(b)
        print("%-13s %7.2fms %7.2fms %5.2fx %7.2fms %7.2fms %5.2fx %7.2fx %7.2fx %8.1g" % (
            name, ms[("tether", 1)], ms[("ort", 1)], a, ms[("tether", 2)], ms[("ort", 2)], b,
            ms[("tether", 1)] / ms[("tether", 2)], ms[("ort", 1)] / ms[("ort", 2)], row["err"]))
        if args.profile:
            prof = row["profile"]
            t1 = sum(p[2] for p in prof)
            t2 = sum(p[3] for p in prof)
            print("  kernels alone: sum %.2f ms at 1t, %.2f ms at 2t (%.2fx); worst scaling (lost = t2 - t1/2):"
                  % (t1 * 1e3, t2 * 1e3, t1 / t2))
            worst = sorted(prof, key=lambda p: -(p[3] - p[2] / 2))[:args.profile]
            for nm, fn, s1, s2 in worst:
                print("    %-40s %8.1fus %8.1fus %5.2fx lost %6.1fus"
                      % (fn[:40], s1 * 1e6, s2 * 1e6, s1 / max(s2, 1e-9), (s2 - s1 / 2) * 1e6))
        sys.stdout.flush()
    if r1:
        print("geometric mean ratio: %.2fx at 1 thread, %.2fx at 2 threads"
              % (float(np.exp(np.mean(np.log(r1)))), float(np.exp(np.mean(np.log(r2))))))
    print("load average at end: %s" % " ".join("%.2f" % v for v in os.getloadavg()))


if __name__ == "__main__":
    main()
