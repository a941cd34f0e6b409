#!/usr/bin/env python3
"""Per-layer convolution latency: every distinct Conv of a model as a one-node model, tether vs onnxruntime.

    python scripts/bench_conv_layers.py [--models mobilenet_v2,squeezenet,resnet50,shufflenet] [--onnx path.onnx]
                                        [--threads 1] [--rounds 5] [--act Relu] [--json out.json]

Each distinct conv shape (input, weight, strides, pads, dilations, group) of a model becomes a one-node ONNX
model Conv(x, w, b) followed by ``--act`` (Relu by default: onnxruntime fuses Conv+Relu as the whole model does,
and tether fuses it as an epilogue), compiled by tether.build_graph at opt_level 3 (the conv-as-GEMM path the
model takes) and run by onnxruntime's CPU provider at the same thread count. Samples alternate tether, onnxruntime,
tether, ... over ``--rounds`` rounds, timed at one thread by the thread's CPU time (both run on the calling
thread; on a loaded machine wall time counts the other processes' slices); the table prints medians, the ratio
(tether / onnxruntime, lower is better), tether's GFLOP/s, and each shape's share of the model's conv time
(count x median), so the rows that carry the model's gap sort to the top. A single-thread numpy (OpenBLAS)
1024^3 matmul measured in the same run gives the machine's practical fp32 peak to read the GFLOP/s against.
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

from _rows import add_json_option, write_rows
from bench_models import ALL, load_model

SAMPLE_S = 0.05
COLD_BYTES = 64 << 20   # --cold: a pass over this much memory before each call evicts the layer's data


def conv_layers(model) -> "OrderedDict":
    """{(x shape, w shape, strides, pads, dilations, group): count} over the model's Conv nodes."""
    import onnx
    from onnx import numpy_helper, shape_inference

    inferred = shape_inference.infer_shapes(model)
    shapes = {}
    for vi in list(inferred.graph.value_info) + list(inferred.graph.input) + list(inferred.graph.output):
        dims = [d.dim_value for d in vi.type.tensor_type.shape.dim]
        shapes[vi.name] = tuple(dims)
    for init in inferred.graph.initializer:
        shapes[init.name] = tuple(numpy_helper.to_array(init).shape)
    layers: "OrderedDict" = OrderedDict()
    for node in inferred.graph.node:
        if node.op_type != "Conv":
            continue
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        xs, ws = shapes.get(node.input[0]), shapes.get(node.input[1])
        if not xs or not ws or 0 in xs:
            continue
        nd = len(ws) - 2
        key = (xs, ws, tuple(attrs.get("strides", [1] * nd)), tuple(attrs.get("pads", [0] * 2 * nd)),
               tuple(attrs.get("dilations", [1] * nd)), int(attrs.get("group", 1)))
        layers[key] = layers.get(key, 0) + 1
    return layers


def one_conv_model(key, act: str, seed: int = 0):
    from onnx import TensorProto, helper, numpy_helper

    xs, ws, strides, pads, dil, group = key
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal(ws) / np.sqrt(np.prod(ws[1:]))).astype(np.float32)
    b = rng.standard_normal(ws[0]).astype(np.float32) * 0.1
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c" if act else "y"], strides=list(strides), pads=list(pads),
                              dilations=list(dil), group=group)]
    if act:
        nodes.append(helper.make_node(act, ["c"], ["y"]))
    graph = helper.make_graph(nodes, "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, xs)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              initializer=[numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def macs(key) -> float:
    xs, ws, strides, pads, dil, group = key
    nd = len(ws) - 2
    total = float(xs[0] * ws[0] * ws[1])
    for a in range(nd):
        total *= ws[2 + a] * ((xs[2 + a] + pads[a] + pads[nd + a] - ((ws[2 + a] - 1) * dil[a] + 1)) // strides[a] + 1)
    return total


def clocked_samples(fn, number: int, clock, evict=None) -> list:
    """One sample of `clock` seconds per call, the mean over `number` calls; with `evict` (a large array), every
    call runs after a pass over it, untimed, as a layer runs inside a model: its data and output cold in cache."""
    if evict is None:
        t0 = clock()
        for _ in range(number):
            fn()
        return [(clock() - t0) / number]
    total = 0.0
    for _ in range(number):
        evict += 1.0
        t0 = clock()
        fn()
        total += clock() - t0
    return [total / number]


def ort_bound_run(sess, x, ref):
    """onnxruntime's call of a one-node model with input "x" and output "y" bound, the output preallocated like
    ``ref``: a plain sess.run allocates (and page-faults) the output every call, which the whole model's arena
    does not."""
    import onnxruntime as ort

    binding = sess.io_binding()
    binding.bind_cpu_input("x", x)
    binding.bind_ortvalue_output("y", ort.OrtValue.ortvalue_from_numpy(np.empty_like(ref)))
    return lambda: sess.run_with_iobinding(binding)


def calls_per_sample(*fns) -> int:
    """Calls per sample: about SAMPLE_S seconds of one call of each of ``fns``."""
    t0 = time.perf_counter()
    for fn in fns:
        fn()
    return max(1, int(SAMPLE_S / max(time.perf_counter() - t0, 1e-6)))


def bench_layer(key, act: str, threads: int, rounds: int, cold: bool = False) -> dict:
    import onnxruntime as ort

    import tether
    from tether import graph_executor
    from tether.frontend import from_onnx
    from tether_rpc import parallel

    model = one_conv_model(key, act)
    graph, params = from_onnx(model)
    factory = tether.build_graph(graph, params, target="host", opt_level=3)
    gm = graph_executor.from_factory(factory)
    x = np.random.default_rng(1).uniform(-1, 1, key[0]).astype(np.float32)
    gm.set_input("x", x)
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    feeds = {"x": x}
    parallel.set_num_threads(threads)
    gm.run()
    ref = sess.run(None, feeds)[0]
    err = float(np.abs(gm.get_output(0) - ref).max() / max(1e-6, float(np.abs(ref).max())))
    run_ort = ort_bound_run(sess, x, ref)
    number = calls_per_sample(gm.run, run_ort)
    t_t, t_o = [], []
    # at one thread both run on this thread: its CPU time leaves out the time other processes held the core
    clock = time.thread_time if threads == 1 else time.perf_counter
    evict = np.zeros(COLD_BYTES // 4, np.float32) if cold else None
    if cold:
        number = max(1, min(number, 20))
    for _ in range(rounds):
        t_t.extend(clocked_samples(gm.run, number, clock, evict))
        t_o.extend(clocked_samples(run_ort, number, clock, evict))
    gm.close()
    return {"tether_s": statistics.median(t_t), "ort_s": statistics.median(t_o), "rel_err": err,
            "tether_min_s": min(t_t), "ort_min_s": min(t_o)}


def peak_gflops() -> float:
    """numpy's single-thread 1024^3 matmul GFLOP/s (OpenBLAS fixes its thread count at load: run in a child)."""
    import subprocess

    code = ("import numpy as np, time\n"
            "a=np.random.rand(1024,1024).astype(np.float32); b=a.copy(); a@b\n"
            "best=1e9\n"
            "for _ in range(7):\n"
            "    t=time.perf_counter(); a@b; best=min(best, time.perf_counter()-t)\n"
            "print(2*1024**3/best/1e9)\n")
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    return float(out.stdout.strip() or "nan")


def override_family(knobs: dict) -> None:
    """Make every schedule built in this process use `knobs` over the family defaults (values parsed as int when
    they are digits)."""
    from tether.ops import schedules

    config = {k: int(v) if v.lstrip("-").isdigit() else v for k, v in knobs.items()}
    base = schedules.family_of
    schedules.family_of = lambda target, *rest: schedules.with_config(base(target, *rest), config)


def describe(key) -> str:
    xs, ws, strides, pads, dil, group = key
    kind = "dw" if group > 1 and group == xs[1] else ("g%d" % group if group > 1 else "")
    return "%s %s %d->%d @%s s%d%s" % (kind or "conv", "x".join(map(str, ws[2:])), xs[1], ws[0],
                                      "x".join(map(str, xs[2:])), strides[0], " p%d" % pads[0] if pads[0] else "")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="mobilenet_v2,squeezenet,resnet50,shufflenet",
                    help="comma-separated, from: " + ", ".join(ALL))
    ap.add_argument("--onnx", action="append", default=[], help="also an ONNX file (repeatable)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--act", default="Relu", help="activation after each conv ('' for none)")
    ap.add_argument("--cold", action="store_true", help="evict the caches before every call (as inside a model)")
    ap.add_argument("--only", default="", help="regular expression: bench only the layers whose label matches")
    ap.add_argument("--top", type=int, default=0, help="print only the N rows with the largest time gap")
    add_json_option(ap)
    ap.add_argument("--knobs", default="", help="schedule knobs replacing the target family's defaults for every "
                    "kernel, e.g. mm_rows=12,conv_pixels=12 (ops.schedules.KNOBS), to try a default before making it")
    args = ap.parse_args()
    if args.knobs:
        override_family(dict(kv.split("=") for kv in args.knobs.split(",")))
    import onnx

    models = [(m.strip(), load_model(m.strip())) for m in args.models.split(",") if m.strip()]
    models += [(os.path.splitext(os.path.basename(p))[0], onnx.load(p)) for p in args.onnx]
    peak = peak_gflops()
    print("numpy 1-thread 1024^3 matmul: %.1f GFLOP/s; load average %.2f" % (peak, os.getloadavg()[0]))
    all_rows = []
    for name, model in models:
        layers = conv_layers(model)
        layers = OrderedDict((k, n) for k, n in layers.items() if not args.only or re.search(args.only, describe(k)))
        rows = []
        for key, count in layers.items():
            if args.only and not re.search(args.only, describe(key)):
                continue
            r = bench_layer(key, args.act, args.threads, args.rounds, args.cold)
            r.update({"model": name, "layer": describe(key), "count": count, "key": [list(k) if isinstance(k, tuple)
                                                                                      else k for k in key],
                      "gflops": 2 * macs(key) / r["tether_s"] / 1e9, "ort_gflops": 2 * macs(key) / r["ort_s"] / 1e9})
            rows.append(r)
        if not rows:
            print("\n%s: no convolution of known shapes" % name)
            continue
        tt = sum(r["tether_s"] * r["count"] for r in rows)
        to = sum(r["ort_s"] * r["count"] for r in rows)
        print("\n%s: %d convs (%d distinct), conv time tether %.2f ms, onnxruntime %.2f ms, ratio %.2fx "
              "(%d thread(s))" % (name, sum(layers.values()), len(layers), tt * 1e3, to * 1e3, tt / to, args.threads))
        print("%-34s %3s %9s %9s %6s %7s %7s %7s %8s %9s" % ("layer", "n", "tether us", "ort us", "ratio", "GF/s",
                                                            "ort GF/s", "gap %", "rel err", "min ratio"))
        order = sorted(rows, key=lambda r: -(r["tether_s"] - r["ort_s"]) * r["count"])
        for r in order[:args.top or None]:
            print("%-34s %3d %9.1f %9.1f %5.2fx %7.1f %7.1f %6.1f%% %8.1g %8.2fx" % (
                r["layer"], r["count"], r["tether_s"] * 1e6, r["ort_s"] * 1e6, r["tether_s"] / r["ort_s"],
                r["gflops"], r["ort_gflops"], 100 * (r["tether_s"] - r["ort_s"]) * r["count"] / max(to, 1e-12),
                r["rel_err"], r["tether_min_s"] / r["ort_min_s"]))
        sys.stdout.flush()
        all_rows += rows
    print("\nload average %.2f; gap %% = (tether - ort) x count / the model's onnxruntime conv time"
          % os.getloadavg()[0])
    write_rows(args.json, all_rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
