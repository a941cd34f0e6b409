#!/usr/bin/env python3
"""int8 model latency: tether's int8 build vs tether's fp32 build of the same network, and vs
onnxruntime's int8, at 1 and 2 threads.

    python scripts/bench_int8.py [--models mobilenet_v2,resnet50] [--format qdq,qoperator] [--size 224]
        [--number 3] [--repeat 7] [--json out.json]

Each model (random weights: scripts/make_mobilenet_v2.py, scripts/make_resnet50.py) is quantized with
onnxruntime's quantize_static (scripts/quantize_model.py, per-channel weights, uint8 activations). The printed
ratios: fp32/int8 (tether's speed-up from int8, higher is better) and tether/ort (tether's int8 over onnxruntime's
int8, lower is better). Medians over --repeat samples of --number runs after warm-up, all measured in the same run,
the three builds sampled in turn (the machine is shared: ratios mean something, absolute times less). The int8
outputs are checked against onnxruntime's first (share of outputs within one quantization step).
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile

import numpy as np

from _rows import add_json_option, write_rows
from _timing import add_sample_options, per_call_samples, settle

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def _build(model):
    import tether
    from tether import graph_executor
    from tether.frontend import from_onnx
    graph, params = from_onnx(model)
    return graph_executor.from_factory(tether.build_graph(graph, params, target="host", opt_level=3))


def bench(name: str, fmt: str, size: int, number: int, repeat: int) -> dict:
    work = tempfile.mkdtemp(prefix="bench-int8-%s-" % name)
    try:
        return _bench_in(work, name, fmt, size, number, repeat)
    finally:
        shutil.rmtree(work, ignore_errors=True)     # the fp32 and quantized models


def _bench_in(work: str, name: str, fmt: str, size: int, number: int, repeat: int) -> dict:
    import onnx
    import onnxruntime as ort
    from tether_rpc import parallel

    from make_mobilenet_v2 import build_mobilenet_v2
    from make_resnet50 import build_resnet50
    from quantize_model import quantize

    fp32 = (build_mobilenet_v2 if name == "mobilenet_v2" else build_resnet50)(0, size)
    fp32_path = os.path.join(work, "fp32.onnx")
    onnx.save(fp32, fp32_path)
    int8_path = quantize(fp32_path, os.path.join(work, "int8.onnx"), fmt, per_channel=True)
    int8 = onnx.load(int8_path)
    gm8 = _build(int8)
    gm32 = _build(fp32)
    x = np.random.default_rng(0).random((1, 3, size, size), dtype=np.float32)
    for gm in (gm8, gm32):
        gm.set_input("input", x)
    row = {"model": name, "format": fmt, "size": size}
    for threads in (1, 2):
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        sess = ort.InferenceSession(int8_path, so, providers=["CPUExecutionProvider"])
        if threads == 1:
            gm8.run()
            ref = sess.run(None, {"input": x})[0]
            inits = {i.name: onnx.numpy_helper.to_array(i) for i in int8.graph.initializer}
            (dq,) = [n for n in int8.graph.node if n.op_type == "DequantizeLinear" and n.output[0] == "output"]
            step = float(inits[dq.input[1]])
            row["within_one_step"] = float(np.mean(np.abs(gm8.get_output(0) - ref) <= step * 1.001))
        parallel.set_num_threads(threads)
        runs = {"int8": gm8.run, "fp32": gm32.run, "ort": lambda: sess.run(None, {"input": x})}
        for key, value in _interleaved_median_ms(runs, number, repeat).items():
            row["%s_ms_%dt" % (key, threads)] = value
    return row


def _interleaved_median_ms(runs: dict, number: int, repeat: int) -> dict:
    """Median ms per call of each of ``runs``, sampled in turn (one sample of each per round), so that a change in
    the shared machine's load hits all of them alike."""
    samples = {k: [] for k in runs}
    for fn in runs.values():
        fn()
    for _ in range(repeat):
        for k, fn in runs.items():
            settle(fn)  # the previous runtime's pool threads idle, as when this one runs alone
            samples[k].extend(per_call_samples(fn, number, 1))
    return {k: statistics.median(v) * 1e3 for k, v in samples.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="mobilenet_v2,resnet50")
    ap.add_argument("--format", default="qdq", help="qdq, qoperator or both, comma-separated")
    ap.add_argument("--size", type=int, default=224)
    # calls per sample: each sample follows a 0.1 s pause (settle), and with 3 calls the first, cold ones (caches
    # refilled after the other model ran, the idle second core woken) weighed on 2-thread figures (int8
    # mobilenet_v2: 2.7 ms with 3, 2.0 ms with 10, 1.85 ms back to back)
    add_sample_options(ap, number=10)
    add_json_option(ap)
    args = ap.parse_args()
    rows = []
    print("%-13s %-9s %3s %9s %9s %9s %8s %8s %8s" % ("model", "format", "thr", "int8", "fp32", "ort int8",
                                                       "fp32/i8", "i8/ort", "1-step"))
    formats = [f.strip() for f in args.format.split(",") if f.strip()]
    bad = sorted(set(formats) - {"qdq", "qoperator"})
    if bad:
        ap.error("unknown --format %s (qdq, qoperator)" % ", ".join(bad))
    for name in [m.strip() for m in args.models.split(",") if m.strip()]:
        for fmt in formats:
            r = bench(name, fmt, args.size, args.number, args.repeat)
            rows.append(r)
            for t in (1, 2):
                i8, f32, o = r["int8_ms_%dt" % t], r["fp32_ms_%dt" % t], r["ort_ms_%dt" % t]
                print("%-13s %-9s %3d %7.2fms %7.2fms %7.2fms %7.2fx %7.2fx %8.4f" % (
                    name, fmt, t, i8, f32, o, f32 / i8, i8 / o, r["within_one_step"]))
            sys.stdout.flush()
    write_rows(args.json, rows)


if __name__ == "__main__":
    main()
