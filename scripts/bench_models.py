#!/usr/bin/env python3
"""Model latency: tether's graph executor vs onnxruntime, at 1 and 2 threads, each runtime timed alone in a process
of its own, plus tether's compile time.

    python scripts/bench_models.py [--models squeezenet,resnet50,mobilenet_v2,digits] [--min-rounds 5]
                                   [--max-rounds 25] [--tolerance 0.02] [--number N] [--json out.json]

Models: the nine light models inside the onnx wheel (weights set to constants; the structure and cost are the
real networks'), mobilenet_v2 with random weights (scripts/make_mobilenet_v2.py) and the digits CNN
(tests/data/digits_cnn.onnx, batch 1). This process compiles (compile time = from_onnx + build_graph); the exported
build and the .onnx then run in two worker processes (``_alone.Worker``), which get the same input. Outputs are
checked first (max abs error is printed). Timing goes in rounds (``_alone.compare_alone``): in each, every
runtime gives one sample per thread count, alone (the other worker waits idle), after a pause and a warm-up call;
a sample is the mean of ``--number`` calls (default: as many as last ~50 ms). The rounds go on until the ratio
tether / onnxruntime (lower is better; the median of the per-round ratios) is stable, at least ``--min-rounds``,
at most ``--max-rounds``; a ratio still moving then is marked ``*``. Times are medians over the rounds; on a loaded
machine the ratio means something, absolute times do not.
"""
from __future__ import annotations

import importlib.util
import os
import sys
import tempfile
import time
from typing import Any, Callable, List, Mapping, Optional

import numpy as np

from _alone import (UNSTABLE_NOTE, Worker, WorkerError, compare_alone, comparison_options, row_figures,
                    table_header, table_row, write_arrays)
from _rows import print_ratio_means, write_rows

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


def build_model(name: str, target: str):
    """(onnx model, tether graph, factory, compile seconds): from_onnx + build_graph, the input at batch 1."""
    import tether
    from tether.frontend import from_onnx

    model = load_model(name)
    shape = {"input": (1, 1, 8, 8)} if name == "digits" else None
    t0 = time.perf_counter()
    graph, params = from_onnx(model, shape=shape)
    factory = tether.build_graph(graph, params, target=target, opt_level=3)
    return model, graph, factory, time.perf_counter() - t0


def model_input(graph) -> tuple:
    """(name, value) of the model's one input, the same values on every run of the script."""
    in_name = graph.inputs[0]
    return in_name, np.random.default_rng(0).uniform(0, 1, graph.types[in_name].shape).astype(np.float32)


ORT_COLUMNS = {"tether": "tether", "onnxruntime": "ort"}


def time_alone(stem: str, factory, model, feeds: Mapping[str, np.ndarray], compare: dict,
               profile: Optional[Callable[[Worker], Any]] = None) -> tuple:
    """The build ``factory`` and the onnx ``model`` on ``feeds``, each in a worker process of its own (their files
    at ``stem`` + "_tether", ".onnx" and "_inputs.npz"): (tether's outputs, onnxruntime's, the row's figures from
    ``compare_alone``, with ``profile(tether's worker)`` as "profile" when given, taken after the rounds)."""
    import onnx

    build, path = stem + "_tether", stem + ".onnx"
    factory.export(build)
    onnx.save(model, path)
    inputs = write_arrays(stem + "_inputs.npz", feeds)
    with Worker("tether", build, inputs) as tw, Worker("onnxruntime", path, inputs) as ow:
        got, ref = tw.outputs(), ow.outputs()
        figures = row_figures(compare_alone({"tether": tw, "onnxruntime": ow}, "onnxruntime", **compare), ORT_COLUMNS)
        if profile:
            figures["profile"] = profile(tw)
    return got, ref, figures


def bench(name: str, folder: str, target: str, compare: dict,
          profile: Optional[Callable[[Worker], Any]] = None) -> dict:
    """One model's row: compile time and kernels here, the max abs error and the figures of :func:`time_alone`
    (with its "profile" when ``profile`` is given)."""
    model, graph, factory, compile_s = build_model(name, target)
    row = {"model": name, "compile_s": compile_s, "kernels": factory.kernel_count}
    got, ref, figures = time_alone(os.path.join(folder, name), factory, model, dict([model_input(graph)]), compare,
                                   profile)
    row["max_abs_err"] = max(float(np.abs(g - r).max()) for g, r in zip(got, ref))
    row.update(figures)
    return row


def run_table(models: str, header: str, measure: Callable[[str, str], dict],
              show: Callable[[str, dict], None]) -> List[dict]:
    """The table of a comparison with onnxruntime: ``header``, then for each of the comma-separated ``models`` its
    row, ``measure(name, folder)`` (a temporary folder for its files), printed by ``show(name, row)``; then the
    geometric-mean ratios and, when a ratio did not settle, the note on it. A worker that fails ends the script
    with its one line."""
    print(header)
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for name in [m.strip() for m in models.split(",") if m.strip()]:
            try:
                row = measure(name, folder)
            except WorkerError as exc:
                raise SystemExit(str(exc)) from None
            rows.append(row)
            show(name, row)
            sys.stdout.flush()
    print_ratio_means(rows)
    if any(not r["stable_%dt" % t] for r in rows for t in (1, 2)):
        print(UNSTABLE_NOTE)
    return rows


def main() -> None:
    args, compare = comparison_options(__doc__.split("\n")[0], ALL)
    rows = run_table(args.models, table_header(13, "ort"),
                     lambda name, folder: bench(name, folder, args.target, compare),
                     lambda name, row: print(table_row(13, name, row, "ort", "max_abs_err")))
    write_rows(args.json, rows)


if __name__ == "__main__":
    main()
