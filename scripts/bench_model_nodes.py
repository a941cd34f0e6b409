#!/usr/bin/env python3
"""Per-node latency inside a whole model at one thread: tether's kernels vs onnxruntime's own profile.

    python scripts/bench_model_nodes.py [--models mobilenet_v2] [--onnx model.onnx] [--top 20]

One-node benchmarks (scripts/bench_conv_layers.py) time a layer with its data warm in cache, and onnxruntime's
one-node models add NCHW <-> NCHWc reorders that its whole-model graph does not have; inside a model both differ
(a layer's input was just written, its weights and scratch buffers are cold). This times every tether node in
execution order, each once per pass over the model, by the thread's CPU time (robust to other processes on a
loaded machine), and reads onnxruntime's per-node kernel times from its profiler (enable_profiling) over the same
number of runs. Conv nodes are paired in graph order (both run them in that order) and summed per kind (1x1, 3x3,
depthwise ...); the rows with the largest gap print first. Medians over `--passes`.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import sys
import tempfile
import time

import numpy as np

from bench_models import ALL, load_model


def conv_labels(model) -> list:
    """A short label per Conv node of the model, in graph order."""
    from onnx import numpy_helper, shape_inference

    inferred = shape_inference.infer_shapes(model)
    shapes = {vi.name: [d.dim_value for d in vi.type.tensor_type.shape.dim]
              for vi in list(inferred.graph.value_info) + list(inferred.graph.input)}
    shapes.update({i.name: list(numpy_helper.to_array(i).shape) for i in model.graph.initializer})
    labels = []
    for node in model.graph.node:
        if node.op_type != "Conv":
            continue
        xs = shapes.get(node.input[0]) or [0] * 4
        ws = shapes.get(node.input[1]) or [0] * 4
        attrs = {a.name: a for a in node.attribute}
        group = attrs["group"].i if "group" in attrs else 1
        stride = attrs["strides"].ints[0] if "strides" in attrs else 1
        kind = "dw %dx%d" % tuple(ws[2:4]) if group > 1 and group == xs[1] else "%dx%d" % tuple(ws[2:4])
        labels.append("%s %d->%d @%d s%d" % (kind, xs[1], ws[0], xs[2], stride))
    return labels


def ort_nodes(model, x, in_name: str, passes: int) -> list:
    """[(node name, op type, median ms)] in execution order, from onnxruntime's profiler at one thread."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.enable_profiling = True
    so.profile_file_prefix = os.path.join(tempfile.mkdtemp(prefix="ort-prof-"), "prof")
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    for _ in range(passes + 2):
        sess.run(None, {in_name: x})
    with open(sess.end_profiling()) as fh:
        events = json.load(fh)
    per: "collections.OrderedDict" = collections.OrderedDict()
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            per.setdefault((e["name"][:-len("_kernel_time")], e["args"].get("op_name")), []).append(e["dur"] / 1e3)
    return [(name, op, statistics.median(v)) for (name, op), v in per.items()]


def tether_nodes(model, x, passes: int) -> list:
    """[(ops label, median ms)] per kernel call in execution order, one thread, thread CPU time."""
    import tether
    from tether import graph_executor
    from tether.frontend import from_onnx
    from tether_rpc import parallel

    graph, params = from_onnx(model)
    gm = graph_executor.from_factory(tether.build_graph(graph, params, target="host", opt_level=3))
    gm.set_input(graph.inputs[0], x)
    parallel.set_num_threads(1)
    for _ in range(2):
        gm.run()
    # (the executor's own per-node timing, GraphExecutor.profile, repeats each node back to back: warm caches)
    nodes, calls = gm._nodes, gm._calls
    samples = [[] for _ in calls]
    for _ in range(passes):
        for k, call in enumerate(calls):
            t0 = time.thread_time()
            call()
            samples[k].append(time.thread_time() - t0)
    return [(nodes[k].get("ops", ""), statistics.median(s) * 1e3) for k, s in enumerate(samples)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="mobilenet_v2", help="comma-separated, from: " + ", ".join(ALL))
    ap.add_argument("--onnx", action="append", default=[], help="also an ONNX file (repeatable)")
    ap.add_argument("--passes", type=int, default=9)
    ap.add_argument("--top", type=int, default=20)
    args = ap.parse_args()
    import onnx

    models = [(m.strip(), load_model(m.strip())) for m in args.models.split(",") if m.strip()]
    models += [(os.path.basename(p), onnx.load(p)) for p in args.onnx]
    for name, model in models:
        inp = model.graph.input[0]
        shape = [d.dim_value or 1 for d in inp.type.tensor_type.shape.dim]
        x = np.random.default_rng(0).uniform(0, 1, shape).astype(np.float32)
        ours = tether_nodes(model, x, args.passes)
        theirs = ort_nodes(model, x, inp.name, args.passes)
        print("\n%s: tether %.2f ms over %d kernels, onnxruntime %.2f ms over %d nodes (1 thread, load %.1f)"
              % (name, sum(t for _, t in ours), len(ours), sum(t for *_, t in theirs), len(theirs),
                 os.getloadavg()[0]))
        t_conv = [r for r in ours if r[0].startswith("conv2d")]
        o_conv = [r for r in theirs if r[1] in ("Conv", "FusedConv")]
        labels = conv_labels(model)
        if not len(t_conv) == len(o_conv) == len(labels):
            print("conv nodes do not pair up (tether %d, onnxruntime %d, model %d): totals only"
                  % (len(t_conv), len(o_conv), len(labels)))
            continue
        rows = list(zip(labels, t_conv, o_conv))
        kinds: "collections.OrderedDict" = collections.OrderedDict()
        for label, (_, t), (_, _, o) in rows:
            kind = " ".join(label.split()[:2]) if label.startswith("dw") else label.split()[0]
            a, b = kinds.get(kind, (0.0, 0.0))
            kinds[kind] = (a + t, b + o)
        print("per kind: " + ", ".join("%s %.2f vs %.2f ms" % (k, a, b) for k, (a, b) in kinds.items()))
        print("%-26s %9s %9s %6s  %s" % ("conv", "tether ms", "ort ms", "ratio", "tether kernel"))
        for label, (ops, t), (_, _, o) in sorted(rows, key=lambda r: -(r[1][1] - r[2][2]))[:args.top]:
            print("%-26s %9.3f %9.3f %5.2fx  %s" % (label, t, o, t / o, ops))
        print("other tether: " + ", ".join("%s %.3f" % r for r in ours if not r[0].startswith("conv2d")))
        print("other onnxruntime: " + ", ".join("%s %.3f" % (op, t) for _, op, t in theirs
                                                if op not in ("Conv", "FusedConv")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
