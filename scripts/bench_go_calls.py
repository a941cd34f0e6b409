#!/usr/bin/env python3
"""The cost of one packed call from Go (bindings/go) against the Python runtime, measured in the same run.

    python scripts/bench_go_calls.py [--n 16] [--calls 200000] [--rounds 3]

Builds one small tether kernel (C = A + B over n float32, so the call overhead dominates), then alternates
``go test -bench BenchmarkPackedCall`` (Function.Call and Bound.Run) with the Python runtime's calls on the same
.so (PackedFunc with numpy arrays, with NDArrays, and a bound call), and prints the medians per call and the
ratio Python / Go. Needs go (apt-get install golang-go); Go runs offline (GOPROXY=off).
"""
from __future__ import annotations

import argparse
import os
import pathlib
import re
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
GO_DIR = ROOT / "bindings" / "go"
BENCH_RE = re.compile(r"^BenchmarkPackedCall/(\w+)\S*\s+\d+\s+([\d.]+) ns/op", re.M)


def build_module(folder: pathlib.Path, n: int) -> str:
    import tether
    from tether import te

    A = te.placeholder((n,), "float32", name="A")
    B = te.placeholder((n,), "float32", name="B")
    C = te.compute((n,), lambda i: A[i] + B[i], name="C")
    s = te.create_schedule(C.op)
    return tether.build(s, [A, B, C], target="host", name="vadd_small").export_library(str(folder / "vadd_small.so"))


def go_round(path: str, calls: int) -> dict:
    env = dict(os.environ, GOFLAGS="-mod=mod", GOPROXY="off", GOTOOLCHAIN="local", CGO_ENABLED="1",
               TETHER_GO_BENCH_MODULE=path, TETHER_GO_BENCH_FUNC="vadd_small")
    proc = subprocess.run(["go", "test", "-run", "^$", "-bench", "BenchmarkPackedCall", "-benchtime",
                           "%dx" % calls, "."], cwd=GO_DIR, env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        sys.exit("go test -bench failed:\n" + proc.stdout + proc.stderr)
    found = {name: float(ns) for name, ns in BENCH_RE.findall(proc.stdout)}
    if set(found) != {"Call", "Bound"}:
        sys.exit("unexpected go test -bench output:\n" + proc.stdout)
    return found


def python_round(path: str, n: int, calls: int) -> dict:
    from tether_rpc import module, ndarray

    f = module.load_module(path)["vadd_small"]
    a, b, c = (np.zeros(n, "float32") for _ in range(3))
    na, nb, nc = (ndarray.from_numpy(x) for x in (a, b, c))
    bound = f.bind(a, b, c)
    out = {}
    for name, call in (("numpy", lambda: f(a, b, c)), ("NDArray", lambda: f(na, nb, nc)), ("bound", bound)):
        for _ in range(1000):
            call()
        t0 = time.perf_counter()
        for _ in range(calls):
            call()
        out[name] = (time.perf_counter() - t0) / calls * 1e9
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=16, help="elements per tensor (small: the call cost dominates)")
    ap.add_argument("--calls", type=int, default=200000, help="calls per measurement")
    ap.add_argument("--rounds", type=int, default=3, help="alternating Go / Python rounds")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="tether-go-bench-") as tmp:
        path = build_module(pathlib.Path(tmp), args.n)
        go, py = [], []
        for _ in range(args.rounds):
            go.append(go_round(path, args.calls))
            py.append(python_round(path, args.n, args.calls))
    med = {k: statistics.median(r[k] for r in go) for k in go[0]}
    pmed = {k: statistics.median(r[k] for r in py) for k in py[0]}
    print("packed call of vadd_small (3 float32[%d] tensors), median of %d rounds of %d calls, ns per call"
          % (args.n, args.rounds, args.calls))
    print("%-34s %10s" % ("caller", "ns/call"))
    for k, v in med.items():
        print("%-34s %10.1f" % ("Go " + ("Function.Call" if k == "Call" else "Bound.Run"), v))
    for k, v in pmed.items():
        print("%-34s %10.1f" % ("Python PackedFunc (%s)" % k, v))
    print("ratio Python numpy call / Go Function.Call: %.1fx" % (pmed["numpy"] / med["Call"]))
    print("ratio Python bound call / Go Bound.Run:     %.1fx" % (pmed["bound"] / med["Bound"]))


if __name__ == "__main__":
    main()
