#!/usr/bin/env python3
"""Per-run cost of the ways to deploy a model without Python against the Python graph executor, on this machine.

    python scripts/bench_deploy.py [--model tests/data/digits_cnn.onnx] [--shape input:1,1,8,8] [--runs 2000]
                                   [--rounds 7] [--json FILE]

A small model (default: the 8x8 digits CNN, a few microseconds of kernels) is built once for the host; each
section times one deployment of that very build, and all figures come from the same run of this script:

- ``executor``: the Python graph executor (tether_rpc.graph_executor, one ctypes call per kernel): ``run()``
  alone, and ``set_input`` + ``run`` + ``get_output``, what a Python caller pays per inference;
- ``aot``: the AOT module (executor="aot") called by examples/aot/run_model.c, a static musl executable timing
  ``<prefix>_run_arrays`` (input copied in, every kernel, output copied out) with CLOCK_MONOTONIC;
- ``c_runtime``: the model folder through the C runtime (libtether_runtime, statically linked into a C timing
  loop): ``tether_rt_run`` (every kernel, inputs and outputs left in place), the mean of each round's runs.

Per section: the median over ``--rounds`` rounds of the median per-run time of ``--runs`` runs, and the ratio to
the executor's full per-inference time. Both run their kernels in the calling thread (TETHER_NUM_THREADS=1 for
the executor; the AOT module is serial until a caller lends it threads). Another section is one more function in
SECTIONS: it gets the Bench and returns {label: seconds per run}.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Callable, Dict, List

os.environ.setdefault("TETHER_NUM_THREADS", "1")   # read when the executor's pool is created

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "rpc_server"))

import numpy as np  # noqa: E402


class Bench:
    """The model built once for the host: its AOT module, its graph build and one input per graph input."""

    def __init__(self, model_path: str, shapes: Dict[str, tuple], folder: pathlib.Path, runs: int, rounds: int):
        import onnx
        import tether
        from tether.frontend import from_onnx

        graph, params = from_onnx(onnx.load(model_path), shape=shapes)
        self.aot = tether.build_graph(graph, params, target="host", executor="aot", name="bench")
        self.folder, self.runs, self.rounds = folder, runs, rounds
        self.aot_paths = self.aot.export(str(folder / "aot"))
        self.graph_folder = str(folder / "graph")
        self.aot.graph_factory.export(self.graph_folder)
        gj = self.aot.graph_factory.graph_json
        rng = np.random.default_rng(0)
        self.feeds = {}
        for i in gj["inputs"]:
            e = gj["entries"][i]
            self.feeds[e["name"]] = rng.uniform(-1, 1, e["shape"]).astype(e["dtype"])
        self.input_files = []
        for k, x in enumerate(self.feeds.values()):
            path = folder / ("in%d.bin" % k)
            x.tofile(path)
            self.input_files.append(str(path))

    def rounds_of(self, one_round: Callable[[], float]) -> float:
        return statistics.median(one_round() for _ in range(self.rounds))


def _median_per_run(fn: Callable[[], object], runs: int) -> float:
    times: List[float] = []
    clock = time.perf_counter
    for _ in range(runs):
        t0 = clock()
        fn()
        times.append(clock() - t0)
    return statistics.median(times)


def section_executor(b: Bench) -> Dict[str, float]:
    from tether import graph_executor

    gm = graph_executor.load(b.graph_folder)
    names = list(b.feeds)

    def inference() -> None:
        gm.set_input(**b.feeds)
        gm.run()
        for k in range(len(gm.output_names)):
            gm.get_output(k)

    inference()
    return {"executor run()": b.rounds_of(lambda: _median_per_run(gm.run, b.runs)),
            "executor set_input+run+get_output": b.rounds_of(lambda: _median_per_run(inference, b.runs))
            if names else float("nan")}


def section_aot(b: Bench) -> Dict[str, float]:
    from tether import cc

    exe = str(b.folder / "run_model")
    cc.compile_c([str(ROOT / "examples" / "aot" / "run_model.c"), b.aot_paths["static"]], exe, libc="musl",
                 include_dirs=[str(b.folder / "aot")], flags=["-DMODEL_PREFIX=bench", '-DMODEL_HEADER="bench.h"'])

    def one_round() -> float:
        out = subprocess.run([exe, "--repeat", str(b.runs)] + b.input_files, capture_output=True, text=True,
                             check=True).stdout
        return int(out.split("median_ns", 1)[1].split()[0]) * 1e-9

    return {"AOT module <prefix>_run_arrays (C)": b.rounds_of(one_round)}


TIMING_PROGRAM = r"""
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "tether_runtime.h"
int main(int argc, char** argv) {
  tether_rt_model* m;
  if (tether_rt_load(argv[1], NULL, &m) != TETHER_RT_OK) { fprintf(stderr, "%s\n", tether_rt_last_error()); return 1; }
  int runs = atoi(argv[2]), rounds = atoi(argv[3]);
  tether_rt_set_num_threads(atoi(argv[4]));
  for (int k = 0; k < runs; k++) tether_rt_run(m);   /* warm up */
  for (int r = 0; r < rounds; r++) {
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int k = 0; k < runs; k++)
      if (tether_rt_run(m) != TETHER_RT_OK) { fprintf(stderr, "%s\n", tether_rt_last_error()); return 1; }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    printf("%.6f\n", ((t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec)) / runs / 1e3);
  }
  tether_rt_free(m);
  return 0;
}
"""



def section_c_runtime(b: Bench) -> Dict[str, float]:
    from tether import c_runtime, cc

    rt = c_runtime.build_runtime("host", str(b.folder / "rt"))
    src, exe = b.folder / "time_c_runtime.c", str(b.folder / "time_c_runtime")
    src.write_text(TIMING_PROGRAM)
    cc.compile_c([str(src), rt["static"]], exe, "host", include_dirs=[rt["include"]], flags=list(c_runtime.LINK_LIBS))
    out = subprocess.run([exe, b.graph_folder, str(b.runs), str(b.rounds), "1"], capture_output=True, text=True,
                         check=True, timeout=600).stdout
    return {"C runtime tether_rt_run": statistics.median(float(v) for v in out.split()) * 1e-6}


SECTIONS: Dict[str, Callable[[Bench], Dict[str, float]]] = {"executor": section_executor, "aot": section_aot,
                                                            "c_runtime": section_c_runtime}
BASELINE = "executor set_input+run+get_output"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(ROOT / "tests" / "data" / "digits_cnn.onnx"))
    ap.add_argument("--shape", action="append", default=None, metavar="NAME:D0,D1,...",
                    help="input shape (default for the digits model: input:1,1,8,8)")
    ap.add_argument("--runs", type=int, default=2000, help="runs per round")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--sections", default=",".join(SECTIONS), help="comma-separated, from: %s" % ", ".join(SECTIONS))
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args()
    shapes = {}
    for spec in args.shape or ["input:1,1,8,8"]:
        name, _, dims = spec.rpartition(":")
        shapes[name] = tuple(int(d) for d in dims.split(","))
    with tempfile.TemporaryDirectory(prefix="tether-bench-deploy-") as tmp:
        bench = Bench(args.model, shapes, pathlib.Path(tmp), args.runs, args.rounds)
        results: Dict[str, float] = {}
        for name in args.sections.split(","):
            results.update(SECTIONS[name](bench))
    base = results.get(BASELINE)
    print("%s, %d kernels, host; median of %d rounds x %d runs" % (os.path.basename(args.model),
                                                                  bench.aot.kernel_count, args.rounds, args.runs))
    print("%-40s %12s %10s" % ("", "us per run", "speed-up"))
    for label, seconds in results.items():
        ratio = "%9.2fx" % (base / seconds) if base and seconds else ""
        print("%-40s %12.2f %10s" % (label, seconds * 1e6, ratio))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({"model": args.model, "runs": args.runs, "rounds": args.rounds,
                       "seconds_per_run": results, "baseline": BASELINE}, fh, indent=1)


if __name__ == "__main__":
    main()
