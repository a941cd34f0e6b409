#!/usr/bin/env python3
"""Latency of the transformer ops (ONNX Attention, RMSNormalization, RotaryEmbedding) as one-node models:
tether's graph executor vs onnxruntime, at one thread each, on the host.

    python scripts/bench_transformer_ops.py [--repeat 7] [--number 20]

Both runtimes get the same inputs; outputs are checked against onnxruntime first (max abs error printed).
Latency is the median of ``--repeat`` samples, each the mean of ``--number`` runs; onnxruntime is measured in
the same run, so the ratio (tether / onnxruntime, lower is better) holds on a loaded machine.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile

import numpy as np

from _timing import per_call_samples

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "src"))
sys.path.insert(0, os.path.join(HERE, "..", "rpc_server"))


def _model(op, feeds, attrs, opset, n_out=1, inits=None, names=None):
    """One node reading ``names`` (default: the feeds, then the initializers; "" leaves an input out)."""
    from onnx import helper, numpy_helper
    inits = inits or {}
    ins = [helper.make_tensor_value_info(k, 1, list(v.shape)) for k, v in feeds.items()]
    outs = ["y%d" % i for i in range(n_out)]
    node = helper.make_node(op, names or list(feeds) + list(inits), outs, **attrs)
    g = helper.make_graph([node], "g", ins, [helper.make_tensor_value_info(o, 1, None) for o in outs],
                          [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def cases():
    rng = np.random.default_rng(0)

    def r(*s):
        return rng.standard_normal(s).astype(np.float32)
    b, h, s, d = 1, 8, 128, 64
    yield "attention 4d b1 h8 s128 d64", _model("Attention", {"q": r(b, h, s, d), "k": r(b, h, s, d),
                                                               "v": r(b, h, s, d)}, {}, 23)
    yield "attention 4d causal", _model("Attention", {"q": r(b, h, s, d), "k": r(b, h, s, d), "v": r(b, h, s, d)},
                                        {"is_causal": 1}, 23)
    yield "attention 3d gqa 8/2 heads", _model("Attention", {"q": r(b, s, h * d), "k": r(b, s, 2 * d),
                                                             "v": r(b, s, 2 * d)},
                                               {"q_num_heads": h, "kv_num_heads": 2}, 23)
    yield "attention decode past 127", _model("Attention", {"q": r(b, h, 1, d), "k": r(b, h, 1, d), "v": r(b, h, 1, d),
                                                           "pk": r(b, h, s - 1, d), "pv": r(b, h, s - 1, d)},
                                              {}, 23, n_out=3, names=["q", "k", "v", "", "pk", "pv"])
    yield "rms_norm 128x1024", _model("RMSNormalization", {"x": r(128, 1024)}, {}, 23, inits={"w": r(1024)})
    pos = np.tile(np.arange(s, dtype=np.int64), (b, 1))
    yield "rotary 4d b1 h8 s128 d64", _model("RotaryEmbedding", {"x": r(b, h, s, d)}, {}, 23,
                                             inits={"cos": r(s, d // 2), "sin": r(s, d // 2), "pos": pos})


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--number", type=int, default=20)
    args = ap.parse_args(argv)
    import onnxruntime as ort

    import tether
    from tether import graph_executor
    from tether.frontend import from_onnx

    print("%-32s %8s %11s %11s %8s %9s" % ("case", "kernels", "tether ms", "ort ms", "ratio", "max err"))
    for name, model in cases():
        if model is None:
            continue
        feeds = {i.name: np.random.default_rng(1).standard_normal(
            [d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32) for i in model.graph.input}
        so = ort.SessionOptions()
        so.intra_op_num_threads = 1
        sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        ref = sess.run(None, feeds)[0]
        graph, params = from_onnx(model)
        factory = tether.build_graph(graph, params, target="host")
        with tempfile.TemporaryDirectory() as tmp:
            factory.export(tmp)
            gm = graph_executor.load(tmp)
            for k, v in feeds.items():
                gm.set_input(k, v)
            gm.run()
            err = float(np.max(np.abs(gm.get_output(0) - ref)))
            t_tether = statistics.median(per_call_samples(gm.run, args.number, args.repeat))
            t_ort = statistics.median(per_call_samples(lambda: sess.run(None, feeds), args.number, args.repeat))
        print("%-32s %8d %11.3f %11.3f %8.2f %9.1e" % (name, factory.kernel_count, t_tether * 1e3, t_ort * 1e3,
                                                      t_tether / t_ort, err))
    return 0


if __name__ == "__main__":
    sys.exit(main())
