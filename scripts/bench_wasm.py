#!/usr/bin/env python3
"""wasm32 model latency in node: tether's wasm32 build against its native build at 1 thread and against
onnxruntime-web's wasm backend (single-threaded, SIMD), on the same ONNX model and the same input.

    python scripts/bench_wasm.py [--models mobilenet_v2,squeezenet,...] [--size bench|test] [--repeat 7]
                                 [--no-ort-web] [--profile N] [--json out.json]
                                 [--wasm-target T] [--node-option=--experimental-wasm-relaxed-simd]

Each model is built as the other benchmarks build it (mobilenet_v2 and resnet50 from scripts/make_*.py, the light
squeezenet of the onnx wheel with random weights in place of their constant ones, which make every
output equal, the digits CNN, and tether.testing.model_kinds' detectors, recognizers and encoder; ``--size test``:
smaller inputs), compiled for ``wasm32`` (a model
folder with deploy.wasm, run in node by scripts/wasm_bench/tether_wasm_runner.mjs through bindings/js's
GraphExecutor) and for the host (run here at 1 thread), and loaded into onnxruntime-web in node
(scripts/wasm_bench/ort_web_runner.mjs; ``numThreads = 1``, its SIMD build; the pinned ORT_WEB_VERSION is
installed with npm on first use into $XDG_CACHE_HOME/tether/npm (~/.cache/tether/npm), or $TETHER_NPM_CACHE).
The outputs of tether-wasm are checked against onnxruntime-web (without it, against native tether) first: max
|a - b| / max |b| over the outputs; a model above ``--tolerance`` is reported and not timed, and the script exits
with status 1.
Timing: both node runners stay up between samples, waiting on their stdin, and time themselves with
performance.now(); rounds alternate tether-wasm, native tether and onnxruntime-web, each sample after a pause
and one untimed warm-up call (``_timing.settle``), so each runtime runs alone and a burst of load hits all three
alike. A sample is the mean of enough back-to-back runs to last about ``--sample-ms``. Rounds go on past
``--repeat`` until each runtime's samples are stable (interquartile range at most 10% of the median), at most
3 x ``--repeat`` rounds and ``--max-seconds`` per model. Printed: medians, the ratios tether-wasm / native and
tether-wasm / onnxruntime-web (lower is better; the goal is at most 1.0 against onnxruntime-web), their geometric
means. Absolute times on a loaded box mean little; the ratios of one run do.
``--profile N`` also lists the N nodes of tether-wasm with the most CPU time (each node's call timed alone) beside
the same node natively, their ratio, and the f32x4 and scalar f32 arithmetic the node's function has in the .wasm
(scripts/wasm_bench/wasm_ops.py).
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import select
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "src"))
sys.path.insert(0, os.path.join(ROOT, "rpc_server"))
sys.path.insert(0, HERE)                       # the scripts' shared helpers, also when loaded by its path
sys.path.insert(0, os.path.join(HERE, "wasm_bench"))

from _rows import add_json_option, geometric_mean, write_rows  # noqa: E402
from _timing import per_call_samples, settle  # noqa: E402

ORT_WEB_VERSION = "1.31.1"
RUNNERS = os.path.join(HERE, "wasm_bench")
LIGHT = ("squeezenet",)
KIND_MODELS = ("yolov8_detector", "svtr_recognizer", "crnn_recognizer", "transformer_encoder", "mobilenetv3_cls",
               "db_detector", "yolox_detector", "picodet_layout")
ALL = ("mobilenet_v2", "resnet50") + LIGHT + KIND_MODELS + ("digits",)
DEFAULT = ("mobilenet_v2", "squeezenet", "resnet50", "yolov8_detector", "svtr_recognizer", "transformer_encoder")
STABLE_IQR = 0.10                              # a runtime's samples are stable when IQR / median is at most this
READY_TIMEOUT_S = 600.0                        # loading a large model into a fresh node, on a loaded box
REQUEST_TIMEOUT_S = 600.0


class BenchError(Exception):
    """One line for the user: what failed, and what to do."""


# ---------------------------------------------------------------- models
def _onnx_file_feeds(model, fixed: Optional[Dict[str, Tuple[int, ...]]] = None) -> Dict[str, np.ndarray]:
    """Uniform [0, 1) inputs of each graph input's declared shape (a named dimension is 1)."""
    inits = {i.name for i in model.graph.initializer}
    rng = np.random.default_rng(0)
    feeds = {}
    for inp in model.graph.input:
        if inp.name in inits:
            continue
        shape = (fixed or {}).get(inp.name) or tuple(d.dim_value if d.dim_value > 0 else 1
                                                     for d in inp.type.tensor_type.shape.dim)
        feeds[inp.name] = rng.uniform(0, 1, shape).astype(np.float32)
    return feeds


def _light_with_random_weights(name: str):
    """A light model of the onnx wheel (the real network's structure and cost) with He-normal weights and small
    random biases in place of its constant ones: with those, every output is the same and no comparison of two
    runtimes could fail."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light",
                                   "light_%s.onnx" % name))
    shapes = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    rng = np.random.default_rng(0)
    keep = []
    for node in model.graph.node:
        if node.op_type == "ConstantOfShape" and node.input[0] in shapes:
            shape = tuple(int(d) for d in shapes[node.input[0]])
            if len(shape) > 1:
                w = rng.standard_normal(shape) * np.sqrt(2.0 / max(1, int(np.prod(shape[1:]))))
            else:
                w = rng.uniform(-0.1, 0.1, shape)
            model.graph.initializer.append(numpy_helper.from_array(w.astype(np.float32), node.output[0]))
        else:
            keep.append(node)
    del model.graph.node[:]
    model.graph.node.extend(keep)
    return model


def load_model(name: str, size: str):
    """(onnx ModelProto, feeds) for a model name of ``ALL``."""
    import onnx

    if name == "mobilenet_v2":
        from make_mobilenet_v2 import build_mobilenet_v2

        model = build_mobilenet_v2(seed=0, size=224 if size == "bench" else 96)
        return model, _onnx_file_feeds(model)
    if name == "resnet50":
        from make_resnet50 import build_resnet50

        model = build_resnet50(seed=0, size=224 if size == "bench" else 96)
        return model, _onnx_file_feeds(model)
    if name in LIGHT:
        model = _light_with_random_weights(name)
        return model, _onnx_file_feeds(model)
    if name == "digits":
        model = onnx.load(os.path.join(ROOT, "tests", "data", "digits_cnn.onnx"))
        return model, _onnx_file_feeds(model, {"input": (1, 1, 8, 8)})
    if name in KIND_MODELS:
        from tether.testing.model_kinds import KINDS

        return KINDS[name](size)
    raise BenchError("unknown model %r (choose from %s)" % (name, ", ".join(ALL)))


def write_tensors(folder: str, tensors: List[Tuple[str, np.ndarray]]) -> None:
    """The folder format of scripts/wasm_bench/tensor_files.mjs: tensors.json + one raw file per tensor."""
    os.makedirs(folder, exist_ok=True)
    listing = []
    for i, (name, x) in enumerate(tensors):
        x = np.ascontiguousarray(x)
        x.astype(x.dtype.newbyteorder("<"), copy=False).tofile(os.path.join(folder, "t%d.bin" % i))
        listing.append({"name": name, "shape": list(x.shape), "dtype": str(x.dtype), "file": "t%d.bin" % i})
    with open(os.path.join(folder, "tensors.json"), "w") as fh:
        json.dump(listing, fh)


def read_tensors(folder: str) -> List[Tuple[str, np.ndarray]]:
    with open(os.path.join(folder, "tensors.json")) as fh:
        listing = json.load(fh)
    return [(t["name"], np.fromfile(os.path.join(folder, t["file"]), dtype=np.dtype(t["dtype"]).newbyteorder("<"))
             .reshape(t["shape"])) for t in listing]


def max_relative_error(got: List[np.ndarray], ref: List[np.ndarray]) -> float:
    from tether.testing.model_kinds import relative_error

    if len(got) != len(ref):
        return float("inf")
    return max(relative_error(np.asarray(g).reshape(np.shape(r)), r) if np.size(g) == np.size(r) else float("inf")
               for g, r in zip(got, ref))


# ---------------------------------------------------------------- node runners
def node_path() -> str:
    node = shutil.which("node")
    if node is None:
        raise BenchError("node is not on PATH; bench_wasm.py runs the wasm32 models in node (>= 18)")
    return node


def ort_web_package(version: str = ORT_WEB_VERSION) -> str:
    """The onnxruntime-web package folder, installed with npm into the cache on first use."""
    cache = os.environ.get("TETHER_NPM_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "tether", "npm")
    prefix = os.path.join(cache, "onnxruntime-web-" + version)
    pkg = os.path.join(prefix, "node_modules", "onnxruntime-web")
    if _installed_version(pkg) == version:
        return pkg
    npm = shutil.which("npm")
    if npm is None:
        raise BenchError("npm is not on PATH; it installs onnxruntime-web@%s into %s (or run with --no-ort-web)"
                         % (version, prefix))
    os.makedirs(prefix, exist_ok=True)
    print("installing onnxruntime-web@%s into %s" % (version, prefix), flush=True)
    try:
        proc = subprocess.run([npm, "install", "--prefix", prefix, "--no-audit", "--no-fund", "--ignore-scripts",
                               "onnxruntime-web@" + version], capture_output=True, text=True, timeout=900)
    except subprocess.TimeoutExpired:
        raise BenchError("npm install onnxruntime-web@%s did not finish in 900 s (network?)" % version) from None
    if proc.returncode != 0 or _installed_version(pkg) != version:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise BenchError("npm install onnxruntime-web@%s failed (status %d): %s" % (version, proc.returncode, tail))
    return pkg


def _installed_version(pkg: str) -> Optional[str]:
    try:
        with open(os.path.join(pkg, "package.json")) as fh:
            version = json.load(fh).get("version")
    except (OSError, ValueError):
        return None
    return version if os.path.isfile(os.path.join(pkg, "dist", "ort.node.min.mjs")) else None


class NodeRunner:
    """A runner script (scripts/wasm_bench/*.mjs) kept running: one JSON line per request on its stdin, one per
    answer on its stdout, every read bounded by a timeout."""

    def __init__(self, label: str, args: List[str], log_dir: str, node_options: Sequence[str] = ()):
        self.label = label
        self.stderr_path = os.path.join(log_dir, label + ".stderr")
        self._stderr = open(self.stderr_path, "w")
        self.proc = subprocess.Popen([node_path()] + list(node_options) + args, cwd=RUNNERS, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self._stderr)
        self._buf = b""
        self.ready = self._read(READY_TIMEOUT_S)
        if not self.ready.get("ready"):
            raise BenchError("%s: unexpected first line %r" % (label, self.ready))

    def _fail(self, what: str) -> BenchError:
        self.close()
        try:
            with open(self.stderr_path) as fh:
                lines = [ln for ln in fh.read().splitlines() if ln.strip()]
        except OSError:
            lines = []
        why = next((ln.strip() for ln in lines if "Error" in ln), lines[-1].strip() if lines else "no output")
        return BenchError("%s runner %s: %s" % (self.label, what, why))

    def _read(self, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise self._fail("gave no answer in %.0f s" % timeout)
            ready, _, _ = select.select([fd], [], [], left)
            if ready:
                chunk = os.read(fd, 65536)
                if not chunk:
                    raise self._fail("exited with status %s" % self.proc.wait(timeout=10))
                self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        try:
            return json.loads(line)
        except ValueError:
            raise self._fail("printed %r, not a JSON line" % line[:200]) from None

    def request(self, req: dict, timeout: float = REQUEST_TIMEOUT_S) -> dict:
        try:
            self.proc.stdin.write((json.dumps(req) + "\n").encode())
            self.proc.stdin.flush()
        except OSError:
            raise self._fail("stopped taking requests") from None
        reply = self._read(timeout)
        if "error" in reply:
            raise BenchError("%s runner: %s" % (self.label, reply["error"]))
        return reply

    def sample(self, number: int, warmup: int = 1) -> Tuple[float, float]:
        """(wall seconds, process CPU seconds) per run, over ``number`` runs after ``warmup`` untimed ones."""
        reply = self.request({"cmd": "sample", "number": number, "warmup": warmup})
        return float(reply["seconds"]), float(reply["cpu_seconds"])

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(b'{"cmd": "quit"}\n')
                self.proc.stdin.flush()
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait(timeout=10)
        self._stderr.close()


# ---------------------------------------------------------------- one model
def _compile(model, feeds, target: str):
    import tether
    from tether.frontend import from_onnx

    t0 = time.perf_counter()
    graph, params = from_onnx(model, shape={k: tuple(v.shape) for k, v in feeds.items()})
    factory = tether.build_graph(graph, params, target=target, opt_level=3)
    return factory, time.perf_counter() - t0


def _timed_rounds(runtimes: Dict[str, Callable[[int, int], Tuple[float, float]]], repeat: int, sample_s: float,
                  max_seconds: float) -> Tuple[Dict[str, List[Tuple[float, float]]], Dict[str, int]]:
    """Samples ((wall, CPU) seconds per run) of each runtime, in alternating rounds: at least ``repeat`` rounds
    (fewer only when ``max_seconds`` runs out, never below 3), more until every runtime's wall times are stable, at
    most 3 x ``repeat``."""
    numbers = {}
    for name, sample in runtimes.items():
        settle()
        one = sample(1, 1)[0]
        numbers[name] = max(1, min(1000, int(sample_s / max(one, 1e-6))))
    samples: Dict[str, List[Tuple[float, float]]] = {name: [] for name in runtimes}
    t0 = time.perf_counter()
    for k in range(3 * repeat):
        for name, sample in runtimes.items():
            settle()                       # the previous runtime idle; the sample's first call is a warm-up
            samples[name].append(sample(numbers[name], 1))
        done = k + 1
        if done >= 3 and time.perf_counter() - t0 > max_seconds:
            break
        walls = [[w for w, _ in v] for v in samples.values()]
        if done >= repeat and all(_iqr(v) <= STABLE_IQR * statistics.median(v) for v in walls):
            break
    return samples, numbers


def _iqr(v: List[float]) -> float:
    q1, q3 = np.percentile(v, [25, 75])
    return float(q3 - q1)


def bench(name: str, args, work: str, ort_pkg: Optional[str]) -> dict:
    from tether import graph_executor
    from tether.errors import TetherError
    from tether_rpc import parallel

    from wasm_ops import function_ops, summarize

    row: dict = {"model": name, "size": args.size}
    model, feeds = load_model(name, args.size)
    folder = os.path.join(work, name)
    os.makedirs(folder, exist_ok=True)
    onnx_path = os.path.join(folder, "model.onnx")
    with open(onnx_path, "wb") as fh:
        fh.write(model.SerializeToString())
    inputs_dir = os.path.join(folder, "inputs")
    write_tensors(inputs_dir, list(feeds.items()))
    try:
        factory, row["compile_wasm_s"] = _compile(model, feeds, args.wasm_target)
        wasm_dir = os.path.join(folder, "wasm32")
        factory.export(wasm_dir)
        native, row["compile_native_s"] = _compile(model, feeds, "host")
    except TetherError as exc:
        row["refused"] = " ".join(str(exc).split())
        return row
    row["kernels"] = factory.kernel_count
    with open(os.path.join(wasm_dir, "deploy.json")) as fh:
        wasm_path = os.path.join(wasm_dir, json.load(fh)["lib"])
    with open(wasm_path, "rb") as fh:
        wasm_bytes = fh.read()
    row["wasm_bytes"] = len(wasm_bytes)
    funcs = function_ops(wasm_bytes)
    total = sum((c for _, c in funcs), collections.Counter())
    row["wasm_ops"] = summarize(total)

    gm = graph_executor.from_factory(native)
    for k, v in feeds.items():
        gm.set_input(k, v)
    parallel.set_num_threads(1)
    gm.run()
    native_out = [gm.get_output(i) for i in range(gm.get_num_outputs())]

    runners: List[NodeRunner] = []
    try:
        wasm = NodeRunner("tether-wasm", ["tether_wasm_runner.mjs", wasm_dir, inputs_dir,
                                          os.path.join(folder, "out_wasm")], folder, args.node_option)
        runners.append(wasm)
        wasm_out = [x for _, x in read_tensors(os.path.join(folder, "out_wasm"))]
        row["err_wasm_vs_native"] = max_relative_error(wasm_out, native_out)
        runtimes: Dict[str, Callable[[int, int], Tuple[float, float]]] = {"wasm": wasm.sample}

        def native_sample(number: int, warmup: int) -> Tuple[float, float]:
            for _ in range(warmup):
                gm.run()
            c0 = time.process_time()
            wall = per_call_samples(gm.run, number, 1)[0]
            return wall, (time.process_time() - c0) / number
        runtimes["native"] = native_sample
        if ort_pkg is not None:
            ort = NodeRunner("onnxruntime-web", ["ort_web_runner.mjs", ort_pkg, onnx_path, inputs_dir,
                                                 os.path.join(folder, "out_ort_web")], folder)
            runners.append(ort)
            ref = [x for _, x in read_tensors(os.path.join(folder, "out_ort_web"))]
            row["max_rel_err"] = max_relative_error(wasm_out, ref)
            row["reference"] = "onnxruntime-web"
            runtimes["ort_web"] = ort.sample
        else:
            row["max_rel_err"] = row["err_wasm_vs_native"]
            row["reference"] = "native tether"
        if not row["max_rel_err"] <= args.tolerance:    # NaN counts as wrong too
            row["wrong"] = True
            return row
        samples, numbers = _timed_rounds(runtimes, args.repeat, args.sample_ms / 1e3, args.max_seconds)
        row["rounds"] = len(samples["wasm"])
        row["number"] = numbers
        for rt, v in samples.items():
            wall = [w for w, _ in v]
            row[rt + "_ms"] = statistics.median(wall) * 1e3
            row[rt + "_cpu_ms"] = statistics.median(c for _, c in v) * 1e3
            row[rt + "_iqr_pct"] = 100 * _iqr(wall) / statistics.median(wall)
        for ref in ("native", "ort_web"):
            if ref + "_ms" in row:
                row["ratio_wasm_" + ref] = row["wasm_ms"] / row[ref + "_ms"]
                # one thread each: the ratio of CPU times is the latency ratio without a loaded box's time-slicing
                row["ratio_wasm_%s_cpu" % ref] = row["wasm_cpu_ms"] / row[ref + "_cpu_ms"]
        if args.profile:
            row["profile"] = _profile(wasm, gm, funcs, args.profile)
    finally:
        for r in runners:
            r.close()
    return row


def _profile(wasm: NodeRunner, gm, funcs, top: int) -> List[dict]:
    """The ``top`` nodes of tether-wasm with the most CPU time per call, beside the same node natively, with the
    operations of its function in the .wasm (the packed function and those split off it: its name as their
    prefix)."""
    from wasm_ops import summarize

    wasm_nodes = wasm.request({"cmd": "profile"})["nodes"]
    # native: the executor's profile times each node with time_evaluator (1 warm-up + 20 calls); the process's CPU
    # time between two of its per-node callbacks is that node's
    # (the first node's share also holds the whole run profile() starts with: one run's CPU time, measured just
    # before, is taken off it)
    c0 = time.process_time()
    gm.run()
    run_cpu = time.process_time() - c0
    native_cpu: List[float] = []
    mark = [time.process_time() + run_cpu]

    def on_node(rec: dict) -> None:
        now = time.process_time()
        native_cpu.append(max(0.0, now - mark[0]) / 21)
        mark[0] = now
    native_nodes = gm.profile(number=20, repeat=1, warmup=1, on_node=on_node)["nodes"]
    total = sum(n["cpu_seconds"] for n in wasm_nodes) or 1.0
    out = []
    for k in sorted(range(len(wasm_nodes)), key=lambda i: -wasm_nodes[i]["cpu_seconds"])[:top]:
        n = wasm_nodes[k]
        func = n.get("func", "")
        ops = summarize(sum((c for f, c in funcs if f == func or f.startswith(func + "_")), collections.Counter()))
        same = k < len(native_nodes) and native_nodes[k]["name"] == n["name"]
        out.append({"index": k, "name": n["name"], "func": func, "ops": n.get("ops", ""),
                    "wasm_ms": n["seconds"] * 1e3, "wasm_cpu_ms": n["cpu_seconds"] * 1e3,
                    "share": n["cpu_seconds"] / total,
                    "native_ms": native_nodes[k]["seconds"] * 1e3 if same else float("nan"),
                    "native_cpu_ms": native_cpu[k] * 1e3 if same else float("nan"), **ops})
    return out


# ---------------------------------------------------------------- the run
def _ort_web_simd_line(pkg: str) -> str:
    from wasm_ops import module_summary

    path = os.path.join(pkg, "dist", "ort-wasm-simd-threaded.wasm")
    with open(path, "rb") as fh:
        s = module_summary(fh.read())
    return ("onnxruntime-web %s: %s, 1 thread, SIMD build (%d SIMD instructions, %d f32x4 arithmetic, of %d)"
            % (_installed_version(pkg), os.path.basename(path), s["simd"], s["f32x4_arith"], s["instructions"]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=",".join(DEFAULT), help="comma-separated, from: " + ", ".join(ALL))
    ap.add_argument("--size", default="bench", choices=["bench", "test"],
                    help="input sizes of the model kinds (test: the small ones of tests/test_model_kinds.py)")
    ap.add_argument("--repeat", type=int, default=7, help="rounds at least (medians; more until stable)")
    ap.add_argument("--sample-ms", type=float, default=50.0, help="length of one sample")
    ap.add_argument("--max-seconds", type=float, default=120.0, help="time budget of one model's rounds")
    ap.add_argument("--tolerance", type=float, default=1e-3, help="max relative error before a model is not timed")
    ap.add_argument("--no-ort-web", action="store_true", help="time tether only (needs node, not npm)")
    ap.add_argument("--wasm-target", default="wasm32",
                    help="tether's WebAssembly target (a preset, or e.g. \"wasm32-unknown-unknown "
                         "-mattr=+simd128,+relaxed-simd\")")
    ap.add_argument("--node-option", action="append", default=[],
                    help="an option for tether-wasm's node (repeatable), e.g. --experimental-wasm-relaxed-simd")
    ap.add_argument("--profile", type=int, default=0, help="list the N slowest nodes of tether-wasm")
    ap.add_argument("--keep", help="keep the built models, inputs and outputs in this folder")
    add_json_option(ap)
    args = ap.parse_args()
    names = [m.strip() for m in args.models.split(",") if m.strip()]
    try:
        for name in names:
            if name not in ALL:
                raise BenchError("unknown model %r (choose from %s)" % (name, ", ".join(ALL)))
        if args.repeat < 1:
            raise BenchError("--repeat must be at least 1, got %d" % args.repeat)
        node_path()
        ort_pkg = None if args.no_ort_web else ort_web_package()
        if ort_pkg:
            print(_ort_web_simd_line(ort_pkg))
        print("node %s%s; tether-wasm target %s; native tether at 1 thread; load average %s"
              % (subprocess.run([node_path(), "--version"], capture_output=True, text=True, timeout=60).stdout.strip(),
                 "".join(" " + o for o in args.node_option), args.wasm_target,
                 " ".join("%.2f" % v for v in os.getloadavg())))
        rows = _run(names, args, ort_pkg)
    except BenchError as exc:
        print("bench_wasm.py: %s" % exc, file=sys.stderr)
        return 2
    write_rows(args.json, rows)
    return 1 if any(r.get("wrong") for r in rows) else 0


def _run(names: List[str], args, ort_pkg: Optional[str]) -> List[dict]:
    os.environ.setdefault("TETHER_OBJECT_CACHE", "0")
    ref = "ort-web" if ort_pkg else "native"
    print("%-20s %5s %7s %10s %10s %10s %8s %8s %8s %8s %9s %6s" % (
        "model", "kern", "wasm KB", "wasm", "native 1t", "ort-web", "w/native", "cpu w/n", "w/ortweb", "cpu w/o",
        "err/" + ref, "rounds"))
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-wasm-") as tmp:
        work = args.keep or tmp
        for name in names:
            r = bench(name, args, work, ort_pkg)
            rows.append(r)
            if "refused" in r:
                print("%-20s refused: %s" % (name, r["refused"]))
            elif r.get("wrong"):
                print("%-20s outputs differ: max rel err %.2e (tether-wasm vs %s), above --tolerance %.0e; not timed"
                      % (name, r["max_rel_err"], r["reference"], args.tolerance))
            else:
                ort = "ort_web_ms" in r
                print("%-20s %5d %7.0f %8.3fms %8.3fms %10s %7.2fx %7.2fx %8s %8s %9.1e %6d" % (
                    name, r["kernels"], r["wasm_bytes"] / 1024, r["wasm_ms"], r["native_ms"],
                    "%8.3fms" % r["ort_web_ms"] if ort else "-", r["ratio_wasm_native"], r["ratio_wasm_native_cpu"],
                    "%7.2fx" % r["ratio_wasm_ort_web"] if ort else "-",
                    "%7.2fx" % r["ratio_wasm_ort_web_cpu"] if ort else "-", r["max_rel_err"], r["rounds"]))
                for p in r.get("profile", []):
                    print("    cpu %8.3fms %4.0f%%  native %8.3fms %6.1fx  f32x4 %5d  f32 %5d  %-32s %s" % (
                        p["wasm_cpu_ms"], 100 * p["share"], p["native_cpu_ms"],
                        p["wasm_cpu_ms"] / p["native_cpu_ms"] if p["native_cpu_ms"] > 0 else float("nan"),
                        p["f32x4_arith"], p["f32_arith"], p["func"][:32], p["ops"][:50]))
            sys.stdout.flush()
    timed = [r for r in rows if "wasm_ms" in r]
    if timed:
        print("geometric mean ratio: %.2fx tether-wasm / native tether (1 thread), %.2fx in CPU time"
              % (geometric_mean(r["ratio_wasm_native"] for r in timed),
                 geometric_mean(r["ratio_wasm_native_cpu"] for r in timed)))
        if ort_pkg:
            print("geometric mean ratio: %.2fx tether-wasm / onnxruntime-web, %.2fx in CPU time (goal: at most 1.00x)"
                  % (geometric_mean(r["ratio_wasm_ort_web"] for r in timed),
                     geometric_mean(r["ratio_wasm_ort_web_cpu"] for r in timed)))
    return rows


if __name__ == "__main__":
    sys.exit(main())
