#!/usr/bin/env python3
"""PyTorch models through both torch.onnx exporters into tether: correctness against PyTorch eager, and latency at
1 and 2 threads against eager and onnxruntime, side by side.

    python scripts/bench_pytorch.py [--models mobilenet_v2,mobilenet_v3_small,resnet18,transformer]
                                    [--exporters torchscript,dynamo] [--threads 1,2] [--repeat 7] [--number 5]
                                    [--inline-torchscript] [--json out.json]

torch, torchvision and onnxscript (the dynamo exporter's dependency) are installed on demand with pip when missing
(torch==2.14.1, torchvision==0.29.1: several GB, so they are not in tether's required dependencies; the extra
``tether[pytorch]`` names them). Models get random weights (no download): the torchvision CNNs at 1x3x224x224,
and a two-layer nn.TransformerEncoder (d_model 128, 4 heads, feed-forward 512, GELU, batch_first) on 1x64x128.

Each model is exported with the TorchScript exporter (``dynamo=False``, opset 17) and the dynamo exporter
(``dynamo=True``, its default opset) into a temporary folder, imported from that path with ``from_onnx``, compiled
for the host and run with the graph executor. Both exports keep their weights as external data: the dynamo
exporter writes one ``model.onnx.data`` (tensors at offsets, small ones inline); the TorchScript export is re-saved
with one data file per tensor, as that exporter writes models over 2 GB (``--inline-torchscript`` keeps its inline
weights). The "data" column counts the external data files. Every output is checked against eager (max relative
error = max|tether - eager| / max|eager|) before timing. Latency is the median over ``--repeat`` samples, each the
mean of ``--number`` runs; the three runtimes' samples are interleaved (tether, eager, onnxruntime, tether, ...),
each after a settling pause and one untimed call, so the ratios (lower is better for tether) hold on a loaded
machine where absolute times do not; at one thread also the ratio of the median process CPU times tether /
eager ("cpu/eager"), which a loaded machine's time-slicing does not inflate. Each runtime gets the same thread
count (``torch.set_num_threads``, onnxruntime's intra-op threads, tether's pool).
"""
from __future__ import annotations

import argparse
import importlib
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

from _rows import add_json_option, geometric_mean, write_rows
from _timing import add_sample_options, per_call_samples, settle

MODELS = ["mobilenet_v2", "mobilenet_v3_small", "resnet18", "transformer"]
EXPORTERS = ["torchscript", "dynamo"]
TORCH_PINS = ["torch==2.14.1", "torchvision==0.29.1", "onnxscript"]


def ensure_torch(modules=("torch", "torchvision", "onnxscript"), pins=TORCH_PINS) -> None:
    """Import ``modules``, installing ``pins`` with pip first if any is missing."""
    missing = []
    for mod in modules:
        try:
            importlib.import_module(mod)
        except ImportError:
            missing.append(mod)
    if missing:
        print("installing %s (missing: %s); this takes minutes" % (" ".join(pins), ", ".join(missing)))
        subprocess.run([sys.executable, "-m", "pip", "install"] + list(pins), check=True)


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


def export(model, x, exporter: str, folder: str, inline_torchscript: bool = False) -> str:
    import onnx
    import torch

    path = os.path.join(folder, "model.onnx")
    if exporter == "torchscript":
        # with grad enabled: under no_grad, nn.TransformerEncoderLayer takes its fused fast path
        # (aten::_transformer_encoder_layer_fwd), which the TorchScript exporter cannot write
        torch.onnx.export(model, (x,), path, dynamo=False, opset_version=17, input_names=["input"],
                          output_names=["output"])
        if not inline_torchscript:
            # one file per tensor, named after it, as the TorchScript exporter writes a model over 2 GB
            onnx.save(onnx.load(path), path, save_as_external_data=True, all_tensors_to_one_file=False,
                      size_threshold=1024)
    else:
        with torch.no_grad():
            torch.onnx.export(model, (x,), path, dynamo=True, input_names=["input"], output_names=["output"],
                              external_data=True)
    return path


def interleaved_ms(runs: dict, number: int, repeat: int) -> tuple:
    """({runtime: median wall ms per call}, {runtime: median process CPU ms per call}) of each runtime in
    ``runs``, their samples taken in turn, each after a settling pause (the other runtimes' pool threads idle) and
    one untimed call."""
    wall = {key: [] for key in runs}
    cpu = {key: [] for key in runs}
    for _ in range(repeat):
        for key, fn in runs.items():
            settle(fn)
            c0 = time.process_time()
            wall[key] += per_call_samples(fn, number, 1)
            cpu[key].append((time.process_time() - c0) / number)
    return ({key: statistics.median(v) * 1e3 for key, v in wall.items()},
            {key: statistics.median(v) * 1e3 for key, v in cpu.items()})


def data_files(folder: str) -> int:
    """How many external data files the export wrote beside model.onnx."""
    return sum(1 for f in os.listdir(folder) if f != "model.onnx" and os.path.isfile(os.path.join(folder, f)))


def bench(name: str, exporter: str, number: int, repeat: int, threads=(1, 2), inline_torchscript: bool = False,
          timing: bool = True) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-pytorch-%s-%s-" % (name, exporter)) as folder:
        return _bench_in(folder, name, exporter, number, repeat, threads, inline_torchscript, timing)


def _bench_in(folder: str, name: str, exporter: str, number: int, repeat: int, threads, inline_torchscript: bool,
              timing: bool) -> dict:
    import onnxruntime as ort
    import torch

    import tether
    from tether import graph_executor
    from tether.frontend import from_onnx
    from tether_rpc import parallel

    model, x = build_model(name)
    onnx_dir = os.path.join(folder, "onnx")   # the export alone, so its data files can be counted
    os.makedirs(onnx_dir)
    t0 = time.perf_counter()
    path = export(model, x, exporter, onnx_dir, inline_torchscript)
    export_s = time.perf_counter() - t0
    n_data = data_files(onnx_dir)
    t0 = time.perf_counter()
    graph, params = from_onnx(path)
    factory = tether.build_graph(graph, params, target="host", opt_level=3)
    compile_s = time.perf_counter() - t0
    gm = graph_executor.from_factory(factory)
    xn = x.numpy()
    in_name = graph.inputs[0]
    gm.set_input(in_name, xn)
    with torch.no_grad():
        eager = model(x).numpy()
    gm.run()
    got = gm.get_output(0)
    row = {"model": name, "exporter": exporter, "export_s": export_s, "compile_s": compile_s,
           "kernels": factory.kernel_count, "data_files": n_data,
           "max_rel_err": float(np.abs(got - eager).max() / max(np.abs(eager).max(), 1e-30))}
    if not timing:
        return row

    def eager_run():
        with torch.no_grad():
            model(x)

    for t in threads:
        torch.set_num_threads(t)
        parallel.set_num_threads(t)
        so = ort.SessionOptions()
        so.intra_op_num_threads = t
        so.inter_op_num_threads = 1
        sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        feeds = {sess.get_inputs()[0].name: xn}
        ms, cpu_ms = interleaved_ms({"tether": gm.run, "eager": eager_run, "ort": lambda: sess.run(None, feeds)},
                                    number, repeat)
        for key, value in ms.items():
            row["%s_ms_%dt" % (key, t)] = value
        row["vs_eager_%dt" % t] = ms["tether"] / ms["eager"]
        row["vs_ort_%dt" % t] = ms["tether"] / ms["ort"]
        if t == 1:
            # on one thread the process's CPU time is the latency without a loaded machine's time-slicing
            row["cpu_vs_eager_1t"] = cpu_ms["tether"] / cpu_ms["eager"]
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated, from: " + ", ".join(MODELS))
    ap.add_argument("--exporters", default=",".join(EXPORTERS), help="comma-separated, from: " + ", ".join(EXPORTERS))
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    add_sample_options(ap, number=5)
    ap.add_argument("--inline-torchscript", action="store_true",
                    help="keep the TorchScript export's weights inline (default: one external file per tensor)")
    ap.add_argument("--no-timing", action="store_true", help="only export, import, compile and check")
    add_json_option(ap)
    args = ap.parse_args()
    threads = [int(t) for t in args.threads.split(",") if t.strip()]
    ensure_torch()
    import logging
    logging.getLogger("torch").setLevel(logging.ERROR)
    rows = []
    head = "%-19s %-11s %4s %7s %5s %9s" % ("model", "exporter", "data", "compile", "kern", "max rel")
    if not args.no_timing:
        for t in threads:
            head += " %9s %9s %9s %7s %7s" % ("tether %dt" % t, "eager %dt" % t, "ort %dt" % t, "/eager", "/ort")
            if t == 1:
                head += " %9s" % "cpu/eager"
    print(head)
    for name in [m.strip() for m in args.models.split(",") if m.strip()]:
        for exporter in [e.strip() for e in args.exporters.split(",") if e.strip()]:
            r = bench(name, exporter, args.number, args.repeat, threads, args.inline_torchscript,
                      timing=not args.no_timing)
            rows.append(r)
            line = "%-19s %-11s %4d %6.1fs %5d %9.2g" % (name, exporter, r["data_files"], r["compile_s"],
                                                          r["kernels"], r["max_rel_err"])
            if not args.no_timing:
                for t in threads:
                    line += " %7.2fms %7.2fms %7.2fms %6.2fx %6.2fx" % (
                        r["tether_ms_%dt" % t], r["eager_ms_%dt" % t], r["ort_ms_%dt" % t], r["vs_eager_%dt" % t],
                        r["vs_ort_%dt" % t])
                    if t == 1:
                        line += " %8.2fx" % r["cpu_vs_eager_1t"]
            print(line)
            sys.stdout.flush()
    if rows and not args.no_timing:
        for t in threads:
            for key, what in (("vs_eager", "PyTorch eager"), ("vs_ort", "onnxruntime")):
                print("geometric mean ratio tether / %s at %d thread(s): %.2fx"
                      % (what, t, geometric_mean(r["%s_%dt" % (key, t)] for r in rows)))
    write_rows(args.json, rows)


if __name__ == "__main__":
    main()
