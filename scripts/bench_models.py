#!/usr/bin/env python3
"""Model latency: tether's graph executor vs onnxruntime, at 1 and 2 threads, plus tether's compile time.

    python scripts/bench_models.py [--models squeezenet,resnet50,mobilenet_v2,digits] [--repeat 7] [--json out.json]

Models: the nine light models inside the onnx wheel (weights set to constants; the structure and cost are the
real networks'), mobilenet_v2 with random weights (scripts/make_mobilenet_v2.py) and the digits CNN
(tests/data/digits_cnn.onnx, batch 1). Both runtimes get the same input. Latency is the median over `--repeat`
samples; each sample is the mean of `--number` runs after warm-up. onnxruntime is measured in the same run, so
the printed ratio (tether / onnxruntime, lower is better) is meaningful on a loaded machine; absolute times are
not. Outputs are checked against onnxruntime before timing (max abs error is printed).
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import time

import numpy as np

from _rows import add_json_option, print_ratio_means, write_rows
from _timing import add_sample_options, per_call_samples, settle

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIGHT = ["squeezenet", "shufflenet", "resnet50", "densenet121", "inception_v1", "inception_v2", "bvlc_alexnet",
         "vgg19", "zfnet512"]
ALL = LIGHT + ["mobilenet_v2", "digits"]


def load_model(name: str):
    import onnx

    if name in LIGHT:
        return onnx.load(os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light",
                                      "light_%s.onnx" % name))
    if name == "digits":
        return onnx.load(os.path.join(ROOT, "tests", "data", "digits_cnn.onnx"))
    if name == "mobilenet_v2":
        spec = importlib.util.spec_from_file_location("make_mobilenet_v2",
                                                      os.path.join(ROOT, "scripts", "make_mobilenet_v2.py"))
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod.build_mobilenet_v2(seed=0)
    raise SystemExit("unknown model %r (choose from %s)" % (name, ", ".join(ALL)))


def median_ms(fn, number: int, repeat: int) -> float:
    settle(fn)  # the other runtime's pool threads idle, then a warm-up call
    return statistics.median(per_call_samples(fn, number, repeat)) * 1e3


def compile_model(name: str, target: str):
    """(onnx model, factory, loaded graph executor with its input set, input name, input, compile seconds)."""
    import tether
    from tether import graph_executor
    from tether.frontend import from_onnx

    model = load_model(name)
    shape = {"input": (1, 1, 8, 8)} if name == "digits" else None
    t0 = time.perf_counter()
    graph, params = from_onnx(model, shape=shape)
    factory = tether.build_graph(graph, params, target=target, opt_level=3)
    compile_s = time.perf_counter() - t0
    gm = graph_executor.from_factory(factory)
    in_name = graph.inputs[0]
    x = np.random.default_rng(0).uniform(0, 1, graph.types[in_name].shape).astype(np.float32)
    gm.set_input(in_name, x)
    return model, factory, gm, in_name, x, compile_s


def bench(name: str, number: int, repeat: int, target: str) -> dict:
    import onnxruntime as ort

    from tether_rpc import parallel

    model, factory, gm, in_name, x, compile_s = compile_model(name, target)
    row = {"model": name, "compile_s": compile_s, "kernels": factory.kernel_count}
    for threads in (1, 2):
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        feeds = {in_name: x}
        if threads == 1:
            gm.run()
            ref = sess.run(None, feeds)[0]
            row["max_abs_err"] = float(np.abs(gm.get_output(0) - ref).max())
        parallel.set_num_threads(threads)
        t_tether = median_ms(gm.run, number, repeat)
        t_ort = median_ms(lambda: sess.run(None, feeds), number, repeat)
        row["tether_ms_%dt" % threads] = t_tether
        row["ort_ms_%dt" % threads] = t_ort
        row["ratio_%dt" % threads] = t_tether / t_ort
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=",".join(ALL), help="comma-separated, from: " + ", ".join(ALL))
    add_sample_options(ap, number=3)
    ap.add_argument("--target", default="host")
    add_json_option(ap)
    args = ap.parse_args()
    rows = []
    print("%-13s %8s %5s %10s %10s %6s %10s %10s %6s %9s" % ("model", "compile", "kern", "tether 1t", "ort 1t",
                                                            "ratio", "tether 2t", "ort 2t", "ratio", "max err"))
    for name in [m.strip() for m in args.models.split(",") if m.strip()]:
        r = bench(name, args.number, args.repeat, args.target)
        rows.append(r)
        print("%-13s %7.2fs %5d %8.2fms %8.2fms %5.2fx %8.2fms %8.2fms %5.2fx %9.2g" % (
            name, r["compile_s"], r["kernels"], r["tether_ms_1t"], r["ort_ms_1t"], r["ratio_1t"], r["tether_ms_2t"],
            r["ort_ms_2t"], r["ratio_2t"], r["max_abs_err"]))
        sys.stdout.flush()
    print_ratio_means(rows)
    write_rows(args.json, rows)


if __name__ == "__main__":
    main()
