"""A model's (or kernel's) GPU build against its CPU build on the same device, and against onnxruntime's GPU
provider where one runs, all measured in the same run (docs/gpu.md "Measuring GPUs").

    python scripts/bench_gpu.py [--gpu opencl|vulkan|cuda] [--models digits,op:matmul:128,128,128,...]
                                [--host H --port P] [--samples 7] [--min-sample-ms 2] [--max-seconds 120]
                                [--json rows.json]

Each target is built for the GPU target (``--gpu``, host: this machine's CPU, or the device's own) and for that
host CPU target, and both run on the same device (this process, or a device server with ``--host``) through
`tether bench`'s runner: the GPU build's samples come from the device's events ("device" clock), the CPU build's
from perf_counter ("host" clock). onnxruntime's GPU provider (CUDAExecutionProvider, from the onnxruntime-gpu
wheel) is timed on the same model where it is available; the script says so when it is not. ``--max-seconds``
bounds the whole run: each measurement gets its share, and a target whose turn comes after it is spent is skipped.

On pocl (OpenCL) and lavapipe (Vulkan) the "GPU" is this CPU running the kernels through a driver, with none of a
GPU's parallelism: the script prints that its GPU figures are then not GPU figures.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for p in (os.path.join(ROOT, "src"), os.path.join(ROOT, "rpc_server")):
    if p not in sys.path:
        sys.path.insert(0, p)

from tether.bench.stats import format_seconds  # noqa: E402

MODELS = {"digits": (os.path.join(ROOT, "tests", "data", "digits_cnn.onnx"), {"input": (1, 1, 8, 8)})}
DEFAULT_TARGETS = "op:matmul:128,128,128,digits"
# what a CPU-backed "GPU" calls itself: pocl's devices ("pthread-<cpu>", "cpu-<cpu>") and Mesa's lavapipe
CPU_DRIVER_WORDS = ("pthread", "pocl", "llvmpipe", "lavapipe", "swiftshader")
ORT_GPU_PROVIDERS = {"cuda": "CUDAExecutionProvider", "opencl": None, "vulkan": None}


def _split_targets(text: str) -> List[str]:
    """``op:matmul:1,2,3,digits`` -> ["op:matmul:1,2,3", "digits"]: commas inside an op's dims stay."""
    out: List[str] = []
    for part in text.split(","):
        if out and out[-1].startswith("op:") and part.isdigit():
            out[-1] += "," + part
        elif part:
            out.append(part)
    return out


def cpu_backed(gpus: List[Dict[str, Any]], api: str) -> Optional[str]:
    """The name of this API's device 0 when it is a CPU pretending to be a GPU (pocl, lavapipe), else None."""
    for g in gpus:
        if g.get("api") == api and int(g.get("index", 0)) == 0:
            name = str(g.get("name", ""))
            if str(g.get("device_type", "")).lower() == "cpu" or any(w in name.lower() for w in CPU_DRIVER_WORDS):
                return name
    return None


def ort_gpu(model: str, shapes: Dict[str, Any], api: str, samples: int, budget_s: float) -> Dict[str, Any]:
    """onnxruntime's GPU provider on the model: {"median_s": ...} or {"skipped": why}."""
    provider = ORT_GPU_PROVIDERS.get(api)
    try:
        import onnxruntime as ort
    except ImportError:
        return {"skipped": "onnxruntime is not installed"}
    available = ort.get_available_providers()
    if provider is None:
        return {"skipped": "onnxruntime has no %s execution provider (its GPU providers are CUDA, ROCm, DirectML, "
                           "CoreML...; available here: %s)" % (api, ", ".join(available))}
    if provider not in available:
        return {"skipped": "%s is not available here (available: %s; on a CUDA machine install onnxruntime-gpu)"
                           % (provider, ", ".join(available))}
    sess = ort.InferenceSession(model, providers=[provider])
    rng = np.random.default_rng(0)
    feeds = {i.name: rng.standard_normal(shapes.get(i.name) or [d if isinstance(d, int) else 1 for d in i.shape])
             .astype(np.float32) for i in sess.get_inputs()}
    sess.run(None, feeds)
    times: List[float] = []
    deadline = time.perf_counter() + budget_s
    while len(times) < samples and time.perf_counter() < deadline:
        t0 = time.perf_counter()
        sess.run(None, feeds)
        times.append(time.perf_counter() - t0)
    return {"median_s": float(np.median(times)), "samples": len(times), "provider": provider, "clock": "host"}


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpu", default="opencl", choices=("opencl", "vulkan", "cuda"))
    ap.add_argument("--models", default=DEFAULT_TARGETS,
                    help="comma-separated: %s, ONNX files, op:NAME:DIMS kernels" % ", ".join(MODELS))
    ap.add_argument("--host", default=None, help="a device server (default: this process)")
    ap.add_argument("--port", type=int, default=9090)
    ap.add_argument("--samples", type=int, default=7)
    ap.add_argument("--min-sample-ms", type=float, default=2.0)
    ap.add_argument("--max-seconds", type=float, default=120.0, help="bound on the whole run's measurements")
    ap.add_argument("--json", default=None, help="write the rows as JSON")
    args = ap.parse_args(argv)

    from tether import rpc
    from tether.bench import runner
    from tether.rpc.local import LocalSession

    specs = _split_targets(args.models)
    t_start = time.perf_counter()
    share = args.max_seconds / max(1, 3 * len(specs))   # GPU, CPU and onnxruntime per target
    options = runner.BenchOptions(samples=args.samples, min_sample_ms=args.min_sample_ms, max_warmup=3,
                                  max_seconds=share, gpu=args.gpu)
    targets = []
    for spec in specs:
        path, shapes = MODELS.get(spec, (spec, {}))
        try:
            targets.append((spec, runner.parse_target(path, input_shapes=shapes), path, shapes))
        except runner.BenchError as exc:
            print("bench_gpu: %s" % exc, file=sys.stderr)
            return 2
    session = rpc.connect(args.host, args.port) if args.host else LocalSession()
    rows: List[Dict[str, Any]] = []
    with session, tempfile.TemporaryDirectory(prefix="bench-gpu-") as work:
        info = session.device_info()
        device_id = "%s:%d" % (args.host, args.port) if args.host else "local"
        gpus = list(info.get("gpus") or [])
        if not any(g.get("api") == args.gpu for g in gpus) and not args.host:
            # (device_info lists OpenCL devices only so far: ask this process's drivers, which run the GPU builds)
            from tether_rpc.gpu.module import available_apis

            found = available_apis().get(args.gpu)
            gpus += [dict(g, api=args.gpu, index=i) for i, g in enumerate(found)] if isinstance(found, list) else []
        pretend = cpu_backed(gpus, args.gpu)
        described = any(g.get("api") == args.gpu for g in gpus)
        cache = runner.OnnxCache(work)
        for spec, target, path, shapes in targets:
            if time.perf_counter() - t_start > args.max_seconds:
                rows.append({"target": spec, "skipped": "--max-seconds spent"})
                continue
            row: Dict[str, Any] = {"target": spec}
            try:
                results = runner.bench_placements(session, target, options, device_id, info, cache)
            except Exception as exc:   # (one target failing to build or run is a row, not the end of the run)
                row["error"] = "%s: %s" % (type(exc).__name__, exc)
                rows.append(row)
                continue
            for r in results:
                key = "gpu" if r.get("placement") == "gpu" else "cpu"
                row[key + "_median_s"] = float(r["stats"]["median"])
                row[key + "_clock"] = r.get("clock", "host")
                row[key + "_target"] = r["run"].get("target")
            if target.kind == "onnx":
                left = max(1.0, args.max_seconds - (time.perf_counter() - t_start))
                row["ort_gpu"] = ort_gpu(path, shapes, args.gpu, args.samples, min(share, left))
            else:
                row["ort_gpu"] = {"skipped": "a kernel, not a model"}
            rows.append(row)
    wall = time.perf_counter() - t_start

    print("bench_gpu: %s GPU build vs the CPU build of the same target on %s (medians of up to %d samples, "
          "measured in this run; %.0f s)" % (args.gpu, device_id, args.samples, wall))
    if pretend:
        print("NOTE: %s device 0 is %r, a CPU running the kernels through a driver (pocl / lavapipe): the GPU "
              "column is not a GPU figure; it shows that the build runs and what the driver costs, not what a GPU "
              "would do." % (args.gpu, pretend))
    elif not described and args.host:
        print("NOTE: the device does not describe its %s devices (device_info lists OpenCL only so far): if %s:0 is "
              "pocl or lavapipe, the GPU column is not a GPU figure." % (args.gpu, args.gpu))
    head = ("target", "GPU (clock)", "CPU (clock)", "CPU/GPU", "onnxruntime GPU", "CPU/ort")
    print("  ".join("%-28s" % head[0:1] if i == 0 else "%16s" % h for i, h in enumerate(head)))
    for row in rows:
        if "error" in row or "skipped" in row:
            print("%-28s  %s" % (row["target"], row.get("error") or "skipped: " + row["skipped"]))
            continue
        g, c = row.get("gpu_median_s"), row.get("cpu_median_s")
        ort = row.get("ort_gpu", {})
        o = ort.get("median_s")
        print("%-28s  %16s  %16s  %16s  %16s  %16s" % (
            row["target"], "%s (%s)" % (format_seconds(g), row.get("gpu_clock", "-")),
            "%s (%s)" % (format_seconds(c), row.get("cpu_clock", "-")), "%.2fx" % (c / g) if g and c else "-",
            format_seconds(o) if o else "-", "%.2fx" % (c / o) if o and c else "-"))
    for row in rows:
        why = row.get("ort_gpu", {}).get("skipped")
        if why and row.get("ort_gpu", {}) and "kernel" not in why:
            print("onnxruntime GPU for %s: none: %s" % (row["target"], why))
    print("CPU/GPU above 1: the GPU build is faster. GPU clock 'device': the kernels' execution on the device's "
          "events; 'host': perf_counter around whole runs (models on a GPU, for now).")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({"gpu": args.gpu, "device": device_id, "cpu_backed_gpu": pretend, "rows": rows,
                       "wall_s": wall}, fh, indent=1)
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
