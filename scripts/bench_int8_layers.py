#!/usr/bin/env python3
"""Per-layer int8 conv latency: every distinct conv of a model as a one-node QLinearConv model,
tether vs onnxruntime, at 1 and 2 threads.

    python scripts/bench_int8_layers.py [--models resnet50,mobilenet_v2] [--threads 1,2] [--rounds 7]
                                        [--only REGEX] [--depthwise] [--json out.json]

Each distinct conv shape of the fp32 model (scripts/bench_models.py's builders; bench_conv_layers.conv_layers)
becomes QLinearConv(x uint8, w int8 per-channel, bias int32) -> uint8, the node quantize_static's QOperator form
writes (its QDQ form fuses into the same tether kernel): tether builds it at opt_level 3 (graph/passes/quantize_dot:
the qconv2d kernel with the requantize fused), onnxruntime runs it on its CPU provider at the same thread count.
The outputs are compared first (they must agree bit for bit). Samples alternate tether, onnxruntime, tether, ...
over ``--rounds`` rounds; at one thread each sample is the calling thread's CPU time (both run on it, and wall
time on a loaded machine counts other processes' slices), at more threads wall time after a pause that lets the
other runtime's spinning workers go idle (_timing.settle). The table prints medians, the ratio (tether /
onnxruntime, lower is better) and each shape's share of the gap (count x difference over the model's onnxruntime
conv time). Grouped/depthwise convs are left out unless ``--depthwise``.
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import time
from collections import OrderedDict

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _rows import add_json_option, write_rows  # noqa: E402
from _timing import settle  # noqa: E402
from bench_conv_layers import (calls_per_sample, clocked_samples, conv_layers, describe, macs,  # noqa: E402
                               ort_bound_run)
from bench_models import ALL, load_model  # noqa: E402



def qlinearconv_model(key, seed: int = 0):
    """A QLinearConv of the conv's shape with random uint8 activations and int8 per-channel weights, its output
    scale set so the requantized values spread over the uint8 range (few saturate)."""
    from onnx import TensorProto, helper, numpy_helper

    xs, ws, strides, pads, dil, group = key
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 256, xs).astype(np.uint8)
    w = rng.integers(-127, 128, ws).astype(np.int8)
    fan_in = int(np.prod(ws[1:]))
    sx, zx = np.float32(0.02), np.uint8(128)
    sw = rng.uniform(0.5, 1.5, ws[0]).astype(np.float32) / 100.0
    # the accumulator's spread: sqrt(fan_in) * std(x - zx) * std(w), about 74 * 73 for uniform bytes
    sy = np.float32(sx * 0.01 * np.sqrt(fan_in) * 74 * 73 * 6 / 255)
    inits = {"sx": np.array(sx), "zx": np.array(zx), "w": w, "sw": sw, "zw": np.zeros(ws[0], np.int8),
             "sy": np.array(sy), "zy": np.array(np.uint8(128)),
             "bias": rng.integers(-3000, 3000, ws[0]).astype(np.int32)}
    node = helper.make_node("QLinearConv", ["x", "sx", "zx", "w", "sw", "zw", "sy", "zy", "bias"], ["y"],
                            strides=list(strides), pads=list(pads), dilations=list(dil), group=group,
                            kernel_shape=list(ws[2:]))
    graph = helper.make_graph([node], "qconv", [helper.make_tensor_value_info("x", TensorProto.UINT8, xs)],
                              [helper.make_tensor_value_info("y", TensorProto.UINT8, None)],
                              initializer=[numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model, x


def bench_layer(key, threads: int, rounds: int) -> dict:
    import onnxruntime as ort

    import tether
    from tether import graph_executor
    from tether.frontend import from_onnx
    from tether_rpc import parallel

    model, x = qlinearconv_model(key)
    graph, params = from_onnx(model)
    t0 = time.perf_counter()
    factory = tether.build_graph(graph, params, target="host", opt_level=3)
    build_s = time.perf_counter() - t0
    gm = graph_executor.from_factory(factory)
    gm.set_input("x", x)
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    parallel.set_num_threads(threads)
    gm.run()
    ref = sess.run(None, {"x": x})[0]
    mismatched = int(np.count_nonzero(gm.get_output(0).reshape(ref.shape) != ref))
    run_ort = ort_bound_run(sess, x, ref)
    number = calls_per_sample(gm.run, run_ort)
    clock = time.thread_time if threads == 1 else time.perf_counter
    t_t, t_o = [], []
    for _ in range(rounds):
        if threads > 1:
            settle(gm.run)
        t_t.extend(clocked_samples(gm.run, number, clock))
        if threads > 1:
            settle(run_ort)
        t_o.extend(clocked_samples(run_ort, number, clock))
    gm.close()
    return {"tether_s": statistics.median(t_t), "ort_s": statistics.median(t_o), "mismatched": mismatched,
            "build_s": build_s}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="resnet50,mobilenet_v2", help="comma-separated, from: " + ", ".join(ALL))
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--only", default="", help="regular expression: bench only the layers whose label matches")
    ap.add_argument("--depthwise", action="store_true", help="also the grouped/depthwise convs")
    add_json_option(ap)
    args = ap.parse_args()
    threads = [int(t) for t in args.threads.split(",")]
    print("load average %.2f %.2f %.2f" % os.getloadavg())
    all_rows = []
    for name in (m.strip() for m in args.models.split(",") if m.strip()):
        layers = OrderedDict((k, n) for k, n in conv_layers(load_model(name)).items()
                             if (args.depthwise or k[5] == 1) and (not args.only or re.search(args.only, describe(k))))
        for nt in threads:
            rows = []
            for key, count in layers.items():
                r = bench_layer(key, nt, args.rounds)
                r.update({"model": name, "threads": nt, "layer": describe(key), "count": count,
                          "gmacs": macs(key) / 1e9})
                rows.append(r)
            tt = sum(r["tether_s"] * r["count"] for r in rows)
            to = sum(r["ort_s"] * r["count"] for r in rows)
            print("\n%s, %d thread(s): %d convs (%d distinct), tether %.2f ms, onnxruntime %.2f ms, ratio %.2fx"
                  % (name, nt, sum(layers.values()), len(layers), tt * 1e3, to * 1e3, tt / max(to, 1e-12)))
            print("%-30s %3s %9s %9s %6s %7s %8s %7s" % ("layer", "n", "tether us", "ort us", "ratio", "gap %",
                                                          "mismatch", "build s"))
            for r in sorted(rows, key=lambda r: -(r["tether_s"] - r["ort_s"]) * r["count"]):
                print("%-30s %3d %9.1f %9.1f %5.2fx %6.1f%% %8d %7.2f" % (
                    r["layer"], r["count"], r["tether_s"] * 1e6, r["ort_s"] * 1e6, r["tether_s"] / r["ort_s"],
                    100 * (r["tether_s"] - r["ort_s"]) * r["count"] / max(to, 1e-12), r["mismatched"], r["build_s"]))
            sys.stdout.flush()
            all_rows += rows
    print("\nload average %.2f %.2f %.2f" % os.getloadavg())
    write_rows(args.json, all_rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
