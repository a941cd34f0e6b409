#!/usr/bin/env python3
"""Recurrent layers: tether's graph executor vs onnxruntime at 1 thread, plus tether's compile time.

    python scripts/bench_rnn.py [--cases crnn512,vad64_s16,...] [--number 20] [--repeat 7] [--json out.json]

Cases are single ONNX LSTM/GRU nodes with random constant weights: a CRNN-like bidirectional LSTM (seq 40,
batch 1 or 4, input 256 or 512, hidden 256) and VAD-like LSTMs (hidden 64/128, seq 1..64, state inputs), plus a GRU.
Latency is the median over ``--repeat`` samples, each the mean of ``--number`` runs after a warm-up; the ratio is
tether / onnxruntime (lower is better), the median of the ratios of
alternating samples. Outputs are checked against onnxruntime first.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np

from _rows import add_json_option, geometric_mean, write_rows
from _timing import add_sample_options, per_call_samples

# name -> (cell, seq, input, hidden, direction, state inputs, batch)
CASES = {
    "crnn256": ("LSTM", 40, 256, 256, "bidirectional", False, 1),
    "crnn512": ("LSTM", 40, 512, 256, "bidirectional", False, 1),
    "crnn256_b4": ("LSTM", 40, 256, 256, "bidirectional", False, 4),
    "vad64_s1": ("LSTM", 1, 64, 64, "forward", True, 1),
    "vad64_s16": ("LSTM", 16, 64, 64, "forward", True, 1),
    "vad64_s64": ("LSTM", 64, 64, 64, "forward", True, 1),
    "vad128_s1": ("LSTM", 1, 64, 128, "forward", True, 1),
    "vad128_s64": ("LSTM", 64, 64, 128, "forward", True, 1),
    "gru128_s32": ("GRU", 32, 64, 128, "bidirectional", False, 1),
}


def make_model(cell: str, seq: int, nin: int, hid: int, direction: str, state: bool, batch: int = 1):
    from onnx import TensorProto as TP
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(0)
    g = {"LSTM": 4, "GRU": 3}[cell]
    d = 2 if direction == "bidirectional" else 1
    inits = [numpy_helper.from_array((rng.standard_normal(s) * 0.1).astype(np.float32), n)
             for n, s in (("W", (d, g * hid, nin)), ("R", (d, g * hid, hid)), ("B", (d, 2 * g * hid)))]
    ins = ["X", "W", "R", "B", ""]
    graph_in = [helper.make_tensor_value_info("X", TP.FLOAT, (seq, batch, nin))]
    outs = ["Y", "Y_h"]
    if state:
        ins += ["h0", "c0"] if cell == "LSTM" else ["h0"]
        graph_in += [helper.make_tensor_value_info(n, TP.FLOAT, (d, batch, hid)) for n in ins[5:]]
        outs += ["Y_c"] if cell == "LSTM" else []
    node = helper.make_node(cell, ins, outs, hidden_size=hid, direction=direction)
    graph = helper.make_graph([node], "rnn", graph_in, [helper.make_tensor_value_info(o, TP.FLOAT, None)
                                                        for o in outs], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    model.ir_version = 8
    feeds = {vi.name: rng.standard_normal([dd.dim_value for dd in vi.type.tensor_type.shape.dim]).astype(np.float32)
             for vi in graph_in}
    return model, feeds


def median_ms(fn, number: int, repeat: int) -> float:
    fn()
    return statistics.median(per_call_samples(fn, number, repeat)) * 1e3


def bench(name: str, number: int, repeat: int) -> dict:
    import onnxruntime as ort

    import tether
    from tether import graph_executor
    from tether.frontend import from_onnx
    from tether_rpc import parallel

    model, feeds = make_model(*CASES[name])
    t0 = time.perf_counter()
    graph, params = from_onnx(model)
    factory = tether.build_graph(graph, params, target="host")
    compile_s = time.perf_counter() - t0
    gm = graph_executor.from_factory(factory)
    for k, v in feeds.items():
        gm.set_input(k, v)
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    gm.run()
    ref = sess.run(None, feeds)
    err = max(float(np.abs(gm.get_output(i) - r).max()) for i, r in enumerate(ref))
    parallel.set_num_threads(1)
    # samples alternate between the runtimes, so a burst of load on a shared machine hits both alike
    pairs = [(median_ms(gm.run, number, 1), median_ms(lambda: sess.run(None, feeds), number, 1))
             for _ in range(repeat)]
    return {"case": name, "compile_s": compile_s, "tether_ms": statistics.median(p[0] for p in pairs),
            "ort_ms": statistics.median(p[1] for p in pairs),
            "ratio": statistics.median(p[0] / p[1] for p in pairs), "max_abs_err": err}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", default=",".join(CASES), help="comma-separated, from: " + ", ".join(CASES))
    add_sample_options(ap, number=20)
    add_json_option(ap)
    args = ap.parse_args()
    rows = []
    print("%-11s %8s %10s %10s %6s %9s" % ("case", "compile", "tether 1t", "ort 1t", "ratio", "max err"))
    for name in [c.strip() for c in args.cases.split(",") if c.strip()]:
        if name not in CASES:
            raise SystemExit("unknown case %r (choose from %s)" % (name, ", ".join(CASES)))
        r = bench(name, args.number, args.repeat)
        rows.append(r)
        print("%-11s %7.2fs %8.3fms %8.3fms %5.2fx %9.2g" % (name, r["compile_s"], r["tether_ms"], r["ort_ms"],
                                                           r["ratio"], r["max_abs_err"]))
        sys.stdout.flush()
    if rows:
        print("geometric mean ratio at 1 thread: %.2fx (tether / onnxruntime)"
              % geometric_mean(r["ratio"] for r in rows))
    write_rows(args.json, rows)


if __name__ == "__main__":
    main()
