#!/usr/bin/env python3
"""PyTorch models through both torch.onnx exporters into tether: correctness against PyTorch eager, and latency at
1 thread against eager and onnxruntime, side by side.

    python scripts/bench_pytorch.py [--models mobilenet_v2,mobilenet_v3_small,resnet18,transformer]
                                    [--exporters torchscript,dynamo] [--repeat 7] [--number 5] [--json out.json]

torch, torchvision and onnxscript (the dynamo exporter's dependency) are installed on demand with pip when missing
(torch==2.14.1, torchvision==0.29.1: several GB, so they are not in tether's required dependencies; the extra
``tether[pytorch]`` names them). Models get random weights (no download): the torchvision CNNs at 1x3x224x224,
and a two-layer nn.TransformerEncoder (d_model 128, 4 heads, feed-forward 512, GELU, batch_first) on 1x64x128.

Each model is exported with the TorchScript exporter (``dynamo=False``, opset 17) and the dynamo exporter
(``dynamo=True``, its default opset) into a temporary folder (the dynamo exporter may write the weights as an
external ``.onnx.data`` file), imported from that path with ``from_onnx``, compiled for the host and run with the
graph executor. Every output is checked against eager (max relative error = max|tether - eager| / max|eager|)
before timing. Latency is the median over ``--repeat`` samples, each the mean of ``--number`` runs after a warm-up;
eager and onnxruntime are measured in the same run, so the ratios (lower is better for tether) hold on a loaded
machine where absolute times do not. All three run on one thread.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

from _timing import per_call_samples

MODELS = ["mobilenet_v2", "mobilenet_v3_small", "resnet18", "transformer"]
EXPORTERS = ["torchscript", "dynamo"]
TORCH_PINS = ["torch==2.14.1", "torchvision==0.29.1", "onnxscript"]


def ensure_torch() -> None:
    """Import torch, torchvision and onnxscript, installing them with pip first if any is missing."""
    missing = []
    for mod in ("torch", "torchvision", "onnxscript"):
        try:
            importlib.import_module(mod)
        except ImportError:
            missing.append(mod)
    if missing:
        print("installing %s (missing: %s); this takes minutes" % (" ".join(TORCH_PINS), ", ".join(missing)))
        subprocess.run([sys.executable, "-m", "pip", "install"] + TORCH_PINS, check=True)


def build_model(name: str):
    """(module in eval mode, example input) with deterministic random weights."""
    import torch
    import torchvision

    torch.manual_seed(0)
    if name == "transformer":
        layer = torch.nn.TransformerEncoderLayer(d_model=128, nhead=4, dim_feedforward=512, dropout=0.0,
                                                 activation="gelu", batch_first=True)
        model = torch.nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
        x = torch.randn(1, 64, 128)
    else:
        model = getattr(torchvision.models, name)(weights=None)
        x = torch.rand(1, 3, 224, 224)
    return model.eval(), x


def export(model, x, exporter: str, folder: str) -> str:
    import torch

    path = os.path.join(folder, "model.onnx")
    if exporter == "torchscript":
        # with grad enabled: under no_grad, nn.TransformerEncoderLayer takes its fused fast path
        # (aten::_transformer_encoder_layer_fwd), which the TorchScript exporter cannot write
        torch.onnx.export(model, (x,), path, dynamo=False, opset_version=17, input_names=["input"],
                          output_names=["output"])
    else:
        with torch.no_grad():
            torch.onnx.export(model, (x,), path, dynamo=True, input_names=["input"], output_names=["output"],
                              external_data=True)
    return path


def median_ms(fn, number: int, repeat: int) -> float:
    fn()  # warm-up
    return statistics.median(per_call_samples(fn, number, repeat)) * 1e3


def bench(name: str, exporter: str, number: int, repeat: int, timing: bool = True) -> dict:
    import onnxruntime as ort
    import torch

    import tether
    from tether import graph_executor
    from tether.frontend import from_onnx
    from tether_rpc import parallel

    model, x = build_model(name)
    folder = tempfile.mkdtemp(prefix="bench-pytorch-%s-%s-" % (name, exporter))
    t0 = time.perf_counter()
    path = export(model, x, exporter, folder)
    export_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    graph, params = from_onnx(path)
    factory = tether.build_graph(graph, params, target="host", opt_level=3)
    compile_s = time.perf_counter() - t0
    factory.export(os.path.join(folder, "tether"))
    gm = graph_executor.load(os.path.join(folder, "tether"))
    xn = x.numpy()
    in_name = graph.inputs[0]
    gm.set_input(in_name, xn)
    with torch.no_grad():
        eager = model(x).numpy()
    gm.run()
    got = gm.get_output(0)
    row = {"model": name, "exporter": exporter, "export_s": export_s, "compile_s": compile_s,
           "kernels": factory.kernel_count, "external_data": os.path.exists(path + ".data"),
           "max_rel_err": float(np.abs(got - eager).max() / max(np.abs(eager).max(), 1e-30))}
    if not timing:
        return row
    torch.set_num_threads(1)
    parallel.set_num_threads(1)
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    feeds = {sess.get_inputs()[0].name: xn}

    def eager_run():
        with torch.no_grad():
            model(x)

    row["tether_ms"] = median_ms(gm.run, number, repeat)
    row["eager_ms"] = median_ms(eager_run, number, repeat)
    row["ort_ms"] = median_ms(lambda: sess.run(None, feeds), number, repeat)
    row["vs_eager"] = row["tether_ms"] / row["eager_ms"]
    row["vs_ort"] = row["tether_ms"] / row["ort_ms"]
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated, from: " + ", ".join(MODELS))
    ap.add_argument("--exporters", default=",".join(EXPORTERS), help="comma-separated, from: " + ", ".join(EXPORTERS))
    ap.add_argument("--number", type=int, default=5, help="runs per sample")
    ap.add_argument("--repeat", type=int, default=7, help="samples (median reported)")
    ap.add_argument("--no-timing", action="store_true", help="only export, import, compile and check")
    ap.add_argument("--json", help="also write the rows as JSON here")
    args = ap.parse_args()
    ensure_torch()
    import logging
    logging.getLogger("torch").setLevel(logging.ERROR)
    rows = []
    print("%-19s %-11s %7s %5s %9s %10s %10s %10s %8s %8s" % ("model", "exporter", "compile", "kern", "max rel",
                                                              "tether 1t", "eager 1t", "ort 1t", "/eager", "/ort"))
    for name in [m.strip() for m in args.models.split(",") if m.strip()]:
        for exporter in [e.strip() for e in args.exporters.split(",") if e.strip()]:
            r = bench(name, exporter, args.number, args.repeat, timing=not args.no_timing)
            rows.append(r)
            if args.no_timing:
                print("%-19s %-11s %6.1fs %5d %9.2g" % (name, exporter, r["compile_s"], r["kernels"],
                                                        r["max_rel_err"]))
            else:
                print("%-19s %-11s %6.1fs %5d %9.2g %8.2fms %8.2fms %8.2fms %7.2fx %7.2fx" % (
                    name, exporter, r["compile_s"], r["kernels"], r["max_rel_err"], r["tether_ms"], r["eager_ms"],
                    r["ort_ms"], r["vs_eager"], r["vs_ort"]))
            sys.stdout.flush()
    if rows and not args.no_timing:
        for key, what in (("vs_eager", "PyTorch eager"), ("vs_ort", "onnxruntime")):
            print("geometric mean ratio tether / %s at 1 thread: %.2fx"
                  % (what, float(np.exp(np.mean(np.log([r[key] for r in rows]))))))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main()
