#!/usr/bin/env python3
"""Kernel benchmark: tether.ops kernels built for the host vs numpy (OpenBLAS) and onnxruntime, one run.

    python scripts/bench_kernels.py [--sizes 256 512 1024] [--rounds 3]

Prints matmul GFLOP/s at 1 and 2 threads against numpy at the same thread count (numpy runs in worker processes
with OPENBLAS_NUM_THREADS set, because OpenBLAS fixes its thread count at load time), the fused relu(a*b+c) on
1M floats against numpy's three passes, mobilenet-sized depthwise and pointwise convolutions against a one-node
onnxruntime model, and the compile time (schedule + build + link) of every kernel.  tether and baseline samples
alternate over `--rounds` rounds, so load from other processes hits both; ratios are against baselines measured
in this same run.  Two tables: medians of all samples, and best samples (on a shared machine the least
disturbed ones).  tether's thread count is set with tether_rpc.parallel.set_num_threads.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

from _timing import per_call_samples

HERE = os.path.dirname(os.path.abspath(__file__))


# ---- timing -----------------------------------------------------------------------------------------------------

def time_samples(fn, min_time: float = 0.2, repeat: int = 7, max_number: int = 10000) -> list:
    """`repeat` samples of seconds per call, each sample long enough (>= min_time / repeat)."""
    fn()  # warm-up (page faults, thread pool start)
    t0 = time.perf_counter()
    fn()
    one = max(time.perf_counter() - t0, 1e-7)
    number = int(min(max_number, max(1, (min_time / repeat) / one)))
    return per_call_samples(fn, number, repeat)


# ---- numpy baselines in child processes (OpenBLAS fixes its thread count when it loads) -------------------------

class NumpyWorker:
    """A child python with OPENBLAS_NUM_THREADS=threads that times `a @ b` on request (one JSON line each way),
    so numpy and tether samples can be interleaved: load from other processes hits both alike."""

    def __init__(self, threads: int):
        env = dict(os.environ, OPENBLAS_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads))
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--numpy-worker"], env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def matmul_samples(self, n: int, min_time: float) -> list:
        self.proc.stdin.write(json.dumps({"n": n, "min_time": min_time}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("numpy benchmark worker exited early")
        return [float(x) for x in json.loads(line)["samples"]]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _numpy_worker_loop() -> None:
    rng = np.random.default_rng(0)
    cache = {}
    for line in sys.stdin:
        req = json.loads(line)
        n = int(req["n"])
        if n not in cache:
            cache[n] = (rng.standard_normal((n, n), dtype=np.float32), rng.standard_normal((n, n), dtype=np.float32),
                        np.empty((n, n), np.float32))
        a, b, c = cache[n]
        secs = time_samples(lambda: np.matmul(a, b, out=c), min_time=float(req["min_time"]))
        sys.stdout.write(json.dumps({"samples": secs}) + "\n")
        sys.stdout.flush()


def _interleaved(rounds: int, *measures):
    """All samples of each measurement over `rounds` rounds, the measurements alternating within a round."""
    samples = [[] for _ in measures]
    for _ in range(rounds):
        for lst, m in zip(samples, measures):
            lst.extend(m())
    return samples


def ort_conv(x, w, stride, pad, group, threads: int) -> tuple:
    """(a zero-argument callable running a one-node onnxruntime Conv, its output)."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    node = helper.make_node("Conv", ["x", "w"], ["y"], strides=[stride, stride], pads=[pad] * 4, group=group)
    graph = helper.make_graph([node], "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              initializer=[numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    feed = {"x": x}
    y = sess.run(None, feed)[0]
    return (lambda: sess.run(None, feed)), y


# ---- tether kernels -----------------------------------------------------------------------------------------------

class Built:
    def __init__(self, fn, compile_s: float, module):
        self.fn, self.compile_s, self.module = fn, compile_s, module


def build(outs, inputs, name: str, workdir: str) -> Built:
    import tether
    from tether import ops, runtime

    t0 = time.perf_counter()
    s = ops.schedule(outs, target="host")
    lib = tether.build(s, list(inputs) + list(outs), target="host", name=name)
    path = os.path.join(workdir, name + ".so")
    lib.export_library(path)
    compile_s = time.perf_counter() - t0
    mod = runtime.load_module(path)
    return Built(mod[name], compile_s, mod)


def tether_samples(built: Built, args, threads: int) -> list:
    from tether_rpc import parallel

    parallel.set_num_threads(threads)
    return time_samples(lambda: built.fn(*args))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[256, 512, 1024])
    ap.add_argument("--rounds", type=int, default=3, help="interleaved tether/baseline rounds (median taken)")
    ap.add_argument("--numpy-worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.numpy_worker:
        _numpy_worker_loop()
        return 0

    from tether import ops, te

    rows = []  # (kernel, tether 1T, tether 2T, baseline 1T, baseline 2T, unit, compile s)
    rng = np.random.default_rng(0)
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="tether-bench-") as work, NumpyWorker(1) as np1, NumpyWorker(2) as np2:
        # one throw-away build first, so the compile column shows per-kernel cost, not LLVM's start-up
        W0 = te.placeholder((8,), "float32", name="W0")
        build([ops.relu(W0)], [W0], "warmup", work)
        for n in args.sizes:
            A = te.placeholder((n, n), "float32", name="A")
            B = te.placeholder((n, n), "float32", name="B")
            C = ops.matmul(A, B)
            k = build([C], [A, B], f"matmul{n}", work)
            a = rng.standard_normal((n, n), dtype=np.float32)
            b = rng.standard_normal((n, n), dtype=np.float32)
            c = np.empty((n, n), np.float32)
            k.fn(a, b, c)
            np.testing.assert_allclose(c, a @ b, rtol=1e-3, atol=1e-2 * np.sqrt(n))
            flop = 2.0 * n ** 3
            t1, t2, b1, b2 = _interleaved(args.rounds, lambda: tether_samples(k, (a, b, c), 1),
                                          lambda: tether_samples(k, (a, b, c), 2),
                                          lambda: np1.matmul_samples(n, 0.2), lambda: np2.matmul_samples(n, 0.2))
            rows.append((f"matmul {n}", t1, t2, b1, b2, "GFLOP/s", k.compile_s, flop))

        m = 1 << 20
        A, B, Cc = (te.placeholder((m,), "float32", name=nm) for nm in "ABC")
        out = ops.relu(ops.add(ops.multiply(A, B), Cc))
        k = build([out], [A, B, Cc], "fused_relu_fma", work)
        a, b, cc = (rng.standard_normal(m, dtype=np.float32) for _ in range(3))
        y = np.empty(m, np.float32)
        k.fn(a, b, cc, y)
        np.testing.assert_allclose(y, np.maximum(a * b + cc, 0), rtol=1e-6, atol=1e-6)
        t_np, t1, t2 = _interleaved(args.rounds, lambda: time_samples(lambda: np.maximum(a * b + cc, 0)),
                                    lambda: tether_samples(k, (a, b, cc, y), 1),
                                    lambda: tether_samples(k, (a, b, cc, y), 2))
        rows.append(("relu(a*b+c) 1M", t1, t2, t_np, t_np, "us (vs numpy)", k.compile_s, None))

        convs = [("depthwise 3x3 1x32x112x112", (1, 32, 112, 112), (32, 1, 3, 3), 1, 1, 32),
                 ("pointwise 1x1 32->64 @56x56", (1, 32, 56, 56), (64, 32, 1, 1), 1, 0, 1)]
        for label, xs, ws, stride, pad, groups in convs:
            X = te.placeholder(xs, "float32", name="X")
            W = te.placeholder(ws, "float32", name="W")
            Y = ops.conv2d(X, W, stride=stride, padding=pad, groups=groups)
            k = build([Y], [X, W], "conv_" + label.split()[0], work)
            x = rng.standard_normal(xs, dtype=np.float32)
            w = rng.standard_normal(ws, dtype=np.float32)
            y = np.empty(tuple(int(d) for d in Y.shape), np.float32)
            k.fn(x, w, y)
            ort1, ref = ort_conv(x, w, stride, pad, groups, 1)
            ort2, _ = ort_conv(x, w, stride, pad, groups, 2)
            np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-3)
            o1, o2, t1, t2 = _interleaved(args.rounds, lambda: time_samples(ort1), lambda: time_samples(ort2),
                                          lambda: tether_samples(k, (x, w, y), 1),
                                          lambda: tether_samples(k, (x, w, y), 2))
            rows.append((label, t1, t2, o1, o2, "us (vs onnxruntime)", k.compile_s, None))

    print("medians of all samples:")
    _print_table(rows, statistics.median)
    print("\nbest samples (the least disturbed by other processes on a shared machine):")
    _print_table(rows, min)
    print(f"load average (1 min) before / after: {load_before:.2f} / {os.getloadavg()[0]:.2f} on "
          f"{os.cpu_count()} CPUs; other processes' load skews the 2-thread figures most")
    return 0


def _print_table(rows, stat) -> None:
    hdr = ("kernel", "tether 1T", "tether 2T", "base 1T", "base 2T", "ratio 1T", "ratio 2T", "scale 2T/1T",
           "unit", "compile ms")
    lines = []
    for kernel, *samples, unit, comp, flop in rows:
        secs = [stat(x) for x in samples]
        if flop:  # GFLOP/s: higher is better
            t1, t2, b1, b2 = (flop / x / 1e9 for x in secs)
            r1, r2, sc = t1 / b1, t2 / b2, t2 / t1
        else:  # microseconds; ratio = baseline time / tether time
            t1, t2, b1, b2 = (x * 1e6 for x in secs)
            r1, r2, sc = b1 / t1, b2 / t2, t1 / t2
        lines.append((kernel, f"{t1:.1f}", f"{t2:.1f}", f"{b1:.1f}", f"{b2:.1f}", f"{r1:.2f}x", f"{r2:.2f}x",
                      f"{sc:.2f}x", unit, f"{comp * 1e3:.0f}"))
    widths = [max(len(str(r[i])) for r in [hdr] + lines) for i in range(len(hdr))]
    fmt = "  ".join("{:<%d}" % w for w in widths)
    print(fmt.format(*hdr))
    for r in lines:
        print(fmt.format(*r))
    print("ratio = tether speed / baseline speed (matmul baseline: numpy/OpenBLAS at the same thread count; "
          "relu: numpy np.maximum(a*b+c, 0); conv: onnxruntime one-node model)")


if __name__ == "__main__":
    sys.exit(main())
