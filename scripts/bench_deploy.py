#!/usr/bin/env python3
"""The cost per run of a model through the C runtime (libtether_runtime) against the Python graph executor, measured
in the same run on the host, on a small model where the executor's own cost shows.

    python scripts/bench_deploy.py [--runs 2000] [--rounds 5] [--threads 1]

Builds the digits CNN (tests/data/digits_cnn.onnx, batch 1: a few microseconds of kernels) and a model of tiny
elementwise nodes (where almost all of a run is the executor), then alternates rounds of ``tether_rt_run`` in a C
timing loop with rounds of ``GraphExecutor.run`` in Python, and prints the medians per run and the ratio. Each
runtime is measured by a function (``time_c_runtime``, ``time_python_executor``) that takes a model folder, so
other deployment paths add a function of their own beside them and a column to the table.
"""
from __future__ import annotations

import argparse
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Callable, Dict, List

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent

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


def build_models(folder: pathlib.Path) -> Dict[str, pathlib.Path]:
    import onnx
    from onnx import TensorProto, helper

    import tether
    from tether.frontend import from_onnx

    out = {}
    graph, params = from_onnx(onnx.load(str(ROOT / "tests" / "data" / "digits_cnn.onnx")),
                              shape={"input": (1, 1, 8, 8)})
    out["digits_cnn"] = folder / "digits_cnn"
    tether.build_graph(graph, params, target="host", opt_level=3).export(str(out["digits_cnn"]))
    # 32 dependent elementwise nodes on 64 floats: the executor's cost per node is the run
    nodes, x = [], "x"
    for k in range(32):
        op = ("Relu", "Neg", "Abs", "Sigmoid")[k % 4]
        nodes.append(helper.make_node(op, [x], ["t%d" % k]))
        x = "t%d" % k
    model = helper.make_model(helper.make_graph(
        nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, [64])]), opset_imports=[helper.make_opsetid("", 17)])
    graph, params = from_onnx(model)
    out["chain_32_nodes"] = folder / "chain_32_nodes"
    # opt_level 0: no fusion, so the 32 nodes stay 32 kernel calls
    tether.build_graph(graph, params, target="host", opt_level=0).export(str(out["chain_32_nodes"]))
    return out


def time_c_runtime(folder: pathlib.Path, runs: int, rounds: int, threads: int, work: pathlib.Path) -> List[float]:
    """Microseconds per tether_rt_run, one sample per round."""
    from tether import c_runtime
    from tether.cc import compile_c

    exe = work / "time_c_runtime"
    if not exe.exists():
        rt = c_runtime.build_runtime("host", str(work / "rt"))
        src = work / "time_c_runtime.c"
        src.write_text(TIMING_PROGRAM)
        compile_c([str(src), rt["static"]], str(exe), "host", include_dirs=[rt["include"]],
                  flags=list(c_runtime.LINK_LIBS))
    proc = subprocess.run([str(exe), str(folder), str(runs), str(rounds), str(threads)], capture_output=True,
                          text=True, check=True, timeout=600)
    return [float(line) for line in proc.stdout.split()]


def time_python_executor(folder: pathlib.Path, runs: int, rounds: int, threads: int, work: pathlib.Path
                         ) -> List[float]:
    """Microseconds per GraphExecutor.run, one sample per round."""
    from tether import graph_executor
    from tether_rpc import parallel

    parallel.set_num_threads(threads)
    gm = graph_executor.load(str(folder))
    for _ in range(runs):
        gm.run()
    samples = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(runs):
            gm.run()
        samples.append((time.perf_counter() - t0) / runs * 1e6)
    return samples


RUNTIMES: Dict[str, Callable[..., List[float]]] = {"python": time_python_executor, "c_runtime": time_c_runtime}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=2000, help="runs per round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-deploy-") as tmp:
        work = pathlib.Path(tmp)
        models = build_models(work)
        print("%-16s %s   python/c_runtime" % ("model", "   ".join("%12s" % n for n in RUNTIMES)))
        for name, folder in models.items():
            medians = {}
            for rt, fn in RUNTIMES.items():
                medians[rt] = statistics.median(fn(folder, args.runs, args.rounds, args.threads, work))
            print("%-16s %s   %.1fx" % (name, "   ".join("%9.2f us" % medians[rt] for rt in RUNTIMES),
                                         medians["python"] / medians["c_runtime"]))
    return 0


if __name__ == "__main__":
    np.seterr(all="ignore")
    sys.exit(main())
