"""Run benchmarks on a session: targets (a kernel in a library, a model folder, an ONNX file) -> result records.

Only the public client API is used (``upload``, ``load_module``, ``array``, ``graph_executor``, ``get_function``,
``device_info``), plus the device's ``tether.bench.*`` built-ins (``tether_rpc.device_state``), which do the
measuring on the device: the first run, the calibration of runs per sample, samples until the warm-up is
detected and enough steady samples follow, and the board's state with every sample. Phases the host sees
(upload, load) are timed here with the host's clock.

A result record and the run document are described in docs/bench.md; ``schema/bench.schema.json`` is their
JSON Schema.
"""
from __future__ import annotations

import contextlib
import dataclasses
import datetime
import logging
import os
import tempfile
import threading
import time
import uuid
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from . import fingerprint, stats

log = logging.getLogger(__name__)

# 2: results[].instruction_counts (--count-instructions); a /1 document is a valid /2 document without them
# 3: results[].placement / clock / pair / compute and the top-level "pairs" (a GPU build beside the CPU build);
#    a /2 document is a valid /3 document without them
SCHEMA_ID = "tether-bench/3"
OnSample = Callable[[str, Dict[str, Any]], None]   # (target name, sample event payload)


class BenchError(Exception):
    """A target that cannot be benchmarked as given (bad spec, missing shapes, old device runtime)."""


@dataclasses.dataclass
class BenchOptions:
    """How to measure. Times in seconds unless the name says otherwise."""

    min_sample_ms: float = 10.0
    samples: int = 20
    max_warmup: int = 10
    warmup_window: int = 5
    max_seconds: float = 120.0
    pin: Optional[List[int]] = None
    hot_c: Optional[float] = None
    cooldown_temp: Optional[float] = None
    cooldown_timeout: float = 300.0
    seed: int = 0
    profile: bool = False
    compile_target: Optional[str] = None
    opt_level: int = 3
    fast_math: bool = False
    keep_disturbed: bool = False
    number: Optional[int] = None
    count_instructions: bool = False
    gpu: Optional[str] = None      # a GPU API ("opencl", "vulkan", "cuda"): build for it beside the CPU build
    precision: str = "fp32"        # what ONNX targets' float32 math is computed in (tether.target.PRECISIONS)

    def device_options(self) -> Dict[str, Any]:
        return {"min_sample_ms": float(self.min_sample_ms), "samples": int(self.samples),
                "max_warmup": int(self.max_warmup), "warmup_window": int(self.warmup_window),
                "max_seconds": float(self.max_seconds), "pin": list(self.pin) if self.pin else None,
                "hot_c": self.hot_c, "retry_disturbed": not self.keep_disturbed,
                "number": int(self.number) if self.number else None}


@dataclasses.dataclass
class BenchTarget:
    """What to measure: ``kind`` is "kernel" (``path`` a library, ``func`` its function), "model" (a folder
    from ``tether compile``), "onnx" (compiled on the fly) or "op" (``op:NAME:DIMS``, an op of the library built
    on the fly: ``bench.op_kernels``; its results are kernels)."""

    spec: str
    kind: str
    path: str
    func: Optional[str] = None
    shapes: Optional[List[Tuple[int, ...]]] = None
    dtypes: Optional[List[str]] = None
    input_shapes: Optional[Dict[str, Tuple[int, ...]]] = None
    label: Optional[str] = None     # the display name, when not the path's (one placement of a paired target)

    @property
    def name(self) -> str:
        if self.label:
            return self.label
        base = os.path.basename(os.path.normpath(self.path))
        return "%s:%s" % (base, self.func) if self.func else base


def parse_target(spec: str, shapes: Optional[Sequence[Tuple[int, ...]]] = None, dtypes: Optional[Sequence[str]] = None,
                 input_shapes: Optional[Dict[str, Tuple[int, ...]]] = None) -> BenchTarget:
    """``LIB.so:FUNC``, a model folder (with deploy.json) or ``model.onnx``. A folder or model file is checked
    here, before any device is asked for: a broken one raises ``tether.errors.InvalidInput`` naming it."""
    from tether.frontend.model_file import load_model_file
    from tether.model_folder import check_model_folder

    from .op_kernels import OP_PREFIX, OpSpecError, parse_op

    if spec.startswith(OP_PREFIX) and not os.path.exists(spec):
        try:
            parse_op(spec)
        except OpSpecError as exc:
            raise BenchError(str(exc)) from None
        return BenchTarget(spec, "op", spec)
    if os.path.isdir(spec):
        if not os.path.isfile(os.path.join(spec, "deploy.json")):
            raise BenchError("%s is a folder without deploy.json (compile a model with `tether compile`)" % spec)
        check_model_folder(spec)
        return BenchTarget(spec, "model", spec)
    if os.path.isfile(spec):
        with open(spec, "rb") as fh:
            if fh.read(4) == b"\x7fELF":
                raise BenchError("%s is a library: name the function to run, as %s:FUNC" % (spec, spec))
        from tether.errors import UnsupportedOpError

        try:
            # a file tether cannot read is named and refused (InvalidInput)
            load_model_file(spec, shape=dict(input_shapes or {}))
        except UnsupportedOpError as exc:   # a format's reader names every op it does not translate
            raise BenchError(str(exc)) from None
        return BenchTarget(spec, "onnx", spec, input_shapes=dict(input_shapes or {}))
    if spec.lower().endswith(".onnx"):
        raise BenchError("no such ONNX file: %s" % spec)
    path, sep, func = spec.rpartition(":")
    if not sep or not path or not func:
        raise BenchError("target %r: expected LIB.so:FUNC, a model folder or an .onnx file" % spec)
    if not os.path.isfile(path):
        raise BenchError("no such library: %s" % path)
    with open(path, "rb") as fh:
        magic = fh.read(4)
    if magic != b"\x7fELF":
        raise BenchError("%s is not a shared library (it starts with %r, not the ELF magic)" % (path, magic))
    return BenchTarget(spec, "kernel", path, func, [tuple(s) for s in shapes] if shapes else None,
                       list(dtypes) if dtypes else None)


def random_input(rng: np.random.Generator, shape: Sequence[int], dtype: str) -> np.ndarray:
    dt = np.dtype(dtype)
    if dt.kind == "f":
        return rng.standard_normal(tuple(shape)).astype(dt)
    if dt.kind in "iu":
        return rng.integers(0, 8, size=tuple(shape)).astype(dt)
    return np.zeros(tuple(shape), dt)


def _target_label(target: Any) -> str:
    if isinstance(target, str):
        return target
    if getattr(target, "gpu", None) is not None:   # (a GPU target's preset is its host's: name the whole target)
        return str(target)
    return getattr(target, "preset", None) or str(target)


def compile_target_for(info: Dict[str, Any], options: BenchOptions) -> Any:
    """What an ONNX target is compiled for on this device: ``--target``, else the device's suggested preset,
    else a generic target for its architecture and cores (``Target.from_device_info``)."""
    if options.compile_target:
        return options.compile_target
    from tether.target import Target, for_precision

    target = Target.from_device_info(info)
    if options.precision == "fp32":
        return target
    caps = info.get("cpu_capabilities") if isinstance(info.get("cpu_capabilities"), dict) else {}
    features = caps.get("features") or info.get("cpu_features") or []
    try:   # the device's own preset with half arithmetic turned on, where its CPU reports it
        return for_precision(target, options.precision, [str(f) for f in features])
    except ValueError as exc:
        raise BenchError(str(exc)) from None


# -- compiling ONNX on the fly ---------------------------------------------------------------------------------

class OnnxCache:
    """Compiled ONNX models by (file, preset): compiled once per run however many devices want one."""

    def __init__(self, workdir: str):
        self.workdir = workdir
        self._lock = threading.Lock()
        self._done: Dict[Tuple[str, str, str], Tuple[str, float]] = {}

    def compile(self, target: BenchTarget, compile_for: Any, options: BenchOptions) -> Tuple[str, float]:
        """``compile_for``: a preset name, a triple or a ``tether.target.Target``."""
        preset = _target_label(compile_for)
        key = (os.path.abspath(target.path), preset, options.precision)
        with self._lock:  # one build at a time: builds use every core already
            if key not in self._done:

                import tether
                from tether.frontend import from_onnx
                from tether.frontend.model_file import load_model_file

                t0 = time.perf_counter()
                # any format tether reads, as an ONNX graph
                proto, base_dir = load_model_file(target.path, shape=dict(target.input_shapes or {}))
                graph, params = from_onnx(proto, shape=dict(target.input_shapes or {}), base_dir=base_dir)
                factory = tether.build_graph(graph, params, target=compile_for, opt_level=options.opt_level,
                                             fast_math=options.fast_math, precision=options.precision)
                out = os.path.join(self.workdir, "%s-%d" % (os.path.basename(target.path), len(self._done)))
                factory.export(out)
                self._done[key] = (out, time.perf_counter() - t0)
                log.info("compiled %s for %s in %.2f s", target.path, preset, self._done[key][1])
            return self._done[key]


# -- one target on one session --------------------------------------------------------------------------------

@contextlib.contextmanager
def _sample_events(session: Any, name: str, on_sample: Optional[OnSample]) -> Iterator[None]:
    if on_sample is None:
        yield
        return
    previous = session.on_event

    def on_event(payload: Dict[str, Any]) -> None:
        if payload.get("kind") == "sample":
            on_sample(name, payload)
        if previous is not None:
            previous(payload)

    session.on_event = on_event
    try:
        yield
    finally:
        session.on_event = previous


def _kernel_args(fn_meta: Dict[str, Any], target: BenchTarget) -> List[Tuple[Tuple[int, ...], str]]:
    meta_args = [a for a in fn_meta.get("args", []) if isinstance(a, dict)]
    n = len(target.shapes) if target.shapes else len(meta_args)
    out = []
    for i in range(n):
        meta = meta_args[i] if i < len(meta_args) else {}
        shape = target.shapes[i] if target.shapes else meta.get("shape")
        if target.dtypes:
            dtype = target.dtypes[i] if len(target.dtypes) > 1 else target.dtypes[0]
        else:
            dtype = meta.get("dtype", "float32")
        if shape is None:
            raise BenchError("%s: argument %d (%s) has no shape in the library's metadata: give --shape for every "
                             "argument" % (target.spec, i, meta.get("name", "?")))
        out.append((tuple(int(d) for d in shape), str(dtype)))
    if target.dtypes and len(target.dtypes) not in (1, n):
        raise BenchError("%s: %d --dtype values for %d arguments (give one, or one per argument)"
                         % (target.spec, len(target.dtypes), n))
    return out


def _uid() -> str:
    return uuid.uuid4().hex[:8]


Evaluate = Callable[[int, float], Tuple[Sequence[float], int]]   # (repeat, min_repeat_ms) -> (samples, number)


def _measure(session: Any, handle: Any, args: List[Any], options: BenchOptions, name: str,
             on_sample: Optional[OnSample], first: Callable[[], Any], evaluate: Evaluate) -> Dict[str, Any]:
    """The device's ``tether.bench.run`` when it has one, else :func:`_measure_fallback`."""
    if "tether.bench.run" not in session.functions():
        return _measure_fallback(options, first, evaluate)
    bench = session.get_function("tether.bench.run")
    with _sample_events(session, name, on_sample):
        return bench(handle, args, options.device_options())


def _measure_fallback(options: BenchOptions, first: Callable[[], Any], evaluate: Evaluate) -> Dict[str, Any]:
    """For a device runtime without ``tether.bench.*`` (an older tether_rpc, another implementation of the
    protocol): the first run timed by the host (round trip included), then time_evaluator's samples, the
    warm-up detected here with the same rule. No device state, no interruption check; the result says so."""
    from tether_rpc.device_state import detect_warmup

    t0 = time.perf_counter()
    first()
    first_s = time.perf_counter() - t0
    repeat = int(options.samples) + int(options.max_warmup)
    t0 = time.perf_counter()
    series, number = evaluate(repeat, 0.0 if options.number else float(options.min_sample_ms))
    wall = time.perf_counter() - t0
    warm, converged = detect_warmup(list(series), options.warmup_window, options.max_warmup)
    if warm is None:
        warm, converged = 0, False
    records, t = [], 0.0
    for i, sec in enumerate(series):
        t += float(sec) * number  # the device reports no timestamps: the sum of the samples so far
        records.append({"i": i, "t": t, "s": float(sec)})
    return {"number": int(number), "first_run_s": first_s, "calibration_s": 0.0, "samples": records,
            "warmup": warm, "warmup_converged": converged, "budget_exhausted": False, "wall_s": wall,
            "pinned": None, "fallback": "time_evaluator"}


def _bench_kernel(session: Any, target: BenchTarget, options: BenchOptions, on_sample: Optional[OnSample]
                  ) -> Dict[str, Any]:
    phases: Dict[str, float] = {}
    remote_name = "bench-%s-%s" % (_uid(), os.path.basename(target.path))
    t0 = time.perf_counter()
    session.upload(target.path, name=remote_name)
    phases["upload_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    mod = session.load_module(remote_name)
    if target.func not in mod.function_names:
        raise BenchError("%s has no function %r (it has: %s)" % (target.path, target.func,
                                                                 ", ".join(mod.function_names)))
    func = mod[target.func]
    phases["load_s"] = time.perf_counter() - t0
    gpu_entry = mod.metadata.get("device") if isinstance(mod.metadata.get("device"), dict) else None
    fn_meta = next((f for f in mod.metadata.get("functions", []) if f.get("name") == target.func), None)
    if fn_meta is None and gpu_entry is not None:   # a GPU function: its arguments are in the device entry
        fn_meta = next((f for f in gpu_entry.get("functions", []) if f.get("name") == target.func), None)
    specs = _kernel_args(fn_meta or {}, target)
    rng = np.random.default_rng(options.seed)
    # a GPU module's arguments live in its device's memory, so no copy is in the timed calls
    device = "%s:0" % gpu_entry["api"] if gpu_entry is not None else None
    arrays = [session.array(random_input(rng, shape, dtype), device=device) if device else
              session.array(random_input(rng, shape, dtype)) for shape, dtype in specs]
    try:
        def evaluate(repeat: int, min_ms: float) -> Tuple[Sequence[float], int]:
            res = func.time_evaluator(number=options.number or 1, repeat=repeat, min_repeat_ms=min_ms,
                                      warmup=0)(*arrays)
            clock[0] = res.clock
            return res.samples, res.number

        clock = ["host"]
        raw = _measure(session, func.fn, [a.handle for a in arrays], options, target.name, on_sample,
                       lambda: func(*arrays), evaluate)
        raw.setdefault("clock", clock[0])
    finally:
        for a in arrays:
            a.free()
    run = {"artifact_sha256": fingerprint.file_sha256([target.path]),
           "target": (mod.metadata.get("target") or {}).get("preset"), "compile_options": None,
           "input_seed": options.seed, "inputs": [{"shape": list(s), "dtype": d} for s, d in specs]}
    if gpu_entry is not None:
        run["target"] = gpu_entry.get("target") or run["target"]
    out = {"phases": phases, "raw": raw, "run": run, "memory": {}}
    if gpu_entry is not None:
        out["compute"] = str(gpu_entry["api"])
    return out


def _graph_evaluate(gm: Any, options: BenchOptions) -> Evaluate:
    def evaluate(repeat: int, min_ms: float) -> Tuple[Sequence[float], int]:
        res = gm.benchmark(number=options.number or 1, repeat=repeat, min_repeat_ms=min_ms, warmup=0)
        return res["samples"], int(res["number"])

    return evaluate


def _bench_model(session: Any, folder: str, target: BenchTarget, options: BenchOptions,
                 on_sample: Optional[OnSample], run_extra: Dict[str, Any]) -> Dict[str, Any]:
    import json

    from tether.rpc.graph_client import RemoteGraphExecutor

    with open(os.path.join(folder, "deploy.json"), "r", encoding="utf-8") as fh:
        graph = json.load(fh)
    lib = graph.get("lib", "deploy.so")
    files = [f for f in ("deploy.json", lib, "deploy.params") if os.path.isfile(os.path.join(folder, f))]
    prefix = "bench-%s-" % _uid()
    phases: Dict[str, float] = {}
    t0 = time.perf_counter()
    for f in files:
        session.upload(os.path.join(folder, f), name=prefix + f)
    phases["upload_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    gm = RemoteGraphExecutor(session, folder, uploaded=True, prefix=prefix,
                             params_name="deploy.params" if "deploy.params" in files else None)
    phases["load_s"] = time.perf_counter() - t0
    memory: Dict[str, Any] = {}
    profile = None
    with gm:
        rng = np.random.default_rng(options.seed)
        for inp in gm.inputs:
            gm.set_input(inp["name"], random_input(rng, inp["shape"], inp["dtype"]))
        raw = _measure(session, gm.handle, [], options, target.name, on_sample, gm.run, _graph_evaluate(gm, options))
        info = session.get_function("tether.graph.info")(gm.handle)
        memory["arena_bytes"] = int(info.get("storage_bytes", 0))
        memory["nodes"] = int(info.get("nodes", 0))
        if options.profile:
            prof = gm.profile()
            profile = [{"index": int(r["index"]), "name": str(r["name"]), "func": str(r["func"]),
                        "ops": str(r.get("ops", "")), "seconds": float(r["seconds"])} for r in prof["nodes"]]
    run = dict(run_extra)
    run.setdefault("artifact_sha256", fingerprint.file_sha256([os.path.join(folder, f) for f in files]))
    run.setdefault("target", graph.get("target", {}).get("preset") if isinstance(graph.get("target"), dict)
                   else graph.get("target"))
    run.setdefault("compile_options", None)
    run["input_seed"] = options.seed
    run["inputs"] = [{"name": i["name"], "shape": list(i["shape"]), "dtype": i["dtype"]} for i in gm.inputs]
    out = {"phases": phases, "raw": raw, "run": run, "memory": memory}
    if profile is not None:
        out["profile"] = profile
    api = _gpu_api_of(run.get("target"))
    if api:
        out["compute"] = api
    return out


def _gpu_api_of(target: Any) -> Optional[str]:
    """The GPU API a build's target names (None for a CPU target or one that does not parse)."""
    if not target:
        return None
    try:
        from tether.target import Target

        t = target if isinstance(target, Target) else Target(str(target))
    except Exception:   # (a label of an older build: treated as a CPU build)
        return None
    return t.gpu.api if t.is_gpu else None


def _result(target: BenchTarget, device_id: str, measured: Dict[str, Any], options: BenchOptions) -> Dict[str, Any]:
    raw = measured["raw"]
    warm = int(raw["warmup"])
    records = []
    for rec in raw["samples"]:
        rec = dict(rec)
        rec["warmup"] = rec["i"] < warm
        records.append(rec)
    steady_records = [r for r in records if not r["warmup"]]
    clean = [r for r in steady_records if not r.get("disturbed")]
    # Statistics use the steady samples no other program interrupted; when too few are clean (a machine busy
    # all the time), all steady samples, with a warning.
    enough = len(clean) >= max(3, min(options.samples, len(steady_records)) // 2)
    use_clean = not options.keep_disturbed and enough
    for r in records:
        r["used"] = not r["warmup"] and (not use_clean or not r.get("disturbed"))
    steady = [r["s"] for r in records if r["used"]]
    summary = stats.summarize(steady)
    phases = dict(measured["phases"])
    phases.update({"first_run_s": float(raw["first_run_s"]), "calibration_s": float(raw["calibration_s"]),
                   "warmup_s": float(sum(r["s"] for r in records if r["warmup"]) * raw["number"]),
                   "steady_s": float(sum(r["s"] for r in steady_records) * raw["number"]),
                   "device_wall_s": float(raw["wall_s"])})
    flags = {"hot": sum(1 for r in steady_records if r.get("hot")),
             "throttled": sum(1 for r in steady_records if r.get("throttled")),
             "disturbed": sum(1 for r in steady_records if r.get("disturbed"))}
    warnings = []
    if summary["unstable"]:
        warnings.append("unstable: coefficient of variation %.1f%% > %.0f%% (close other programs, pin with --pin, "
                        "or take more samples)" % (100 * summary["cv"], 100 * stats.UNSTABLE_CV))
    if flags["hot"]:
        warnings.append("%d steady sample(s) taken while hot (>= %.0f C)"
                        % (flags["hot"], raw.get("state_start", {}).get("hot_c", options.hot_c or 80.0)))
    if flags["throttled"]:
        warnings.append("%d steady sample(s) taken while the firmware reported throttling" % flags["throttled"])
    if raw.get("fallback"):
        warnings.append("the device runtime has no tether.bench.run (update it with `tether bundle`): samples from "
                        "time_evaluator, no device state, no check for interrupted samples" +
                        (", --pin ignored" if options.pin else ""))
    if flags["disturbed"] and not options.keep_disturbed:
        if use_clean:
            log.info("%s: %d steady sample(s) interrupted by other programs left out of the statistics",
                     target.name, flags["disturbed"])
        else:
            warnings.append("%d of %d steady samples were interrupted by other programs (the CPU was busy); all are "
                            "in the statistics (a smaller --min-sample-ms makes clean samples likelier)"
                            % (flags["disturbed"], len(steady_records)))
    if not raw["warmup_converged"]:
        warnings.append("warm-up not detected within %d samples; the first %d were dropped"
                        % (options.max_warmup, warm))
    if raw["budget_exhausted"]:
        warnings.append("stopped by the time budget (--max-seconds %.0f) with %d steady samples"
                        % (options.max_seconds, len(steady)))
    memory = dict(measured["memory"])
    for key in ("peak_rss_bytes", "rss_start_bytes"):
        if key in raw:
            memory[key] = int(raw[key])
    if "peak_rss_scope" in raw:
        memory["peak_rss_scope"] = str(raw["peak_rss_scope"])
    out = {"target": target.name, "kind": target.kind, "spec": target.spec, "device": device_id,
           "run": measured["run"], "phases": phases, "number": int(raw["number"]),
           "warmup": {"count": warm, "converged": bool(raw["warmup_converged"])}, "stats": summary,
           "flags": flags, "memory": memory, "samples": records, "warnings": warnings,
           "pinned": raw.get("pinned"), "state_start": raw.get("state_start", {}),
           "state_end": raw.get("state_end", {})}
    if "profile" in measured:
        out["profile"] = measured["profile"]
    # where it ran and on which clock: a GPU build ("gpu", its API) or the CPU's ("cpu"); "device" samples come
    # from the GPU's events, "host" ones from the CPU's perf_counter (a whole model on a GPU, for now)
    compute = measured.get("compute", "cpu")
    out["compute"] = compute
    out["placement"] = "cpu" if compute == "cpu" else "gpu"
    out["clock"] = str(raw.get("clock", "host"))
    if raw.get("clock") == "device" and raw.get("fallback"):
        out["warnings"].append("device clock through time_evaluator (the device runtime has no tether.bench.run)")
    return out


def bench_target(session: Any, target: BenchTarget, options: BenchOptions, device_id: str,
                 device_info: Optional[Dict[str, Any]] = None, onnx_cache: Optional[OnnxCache] = None,
                 on_sample: Optional[OnSample] = None) -> Dict[str, Any]:
    """Measure one target on one session and return its result record."""
    if options.cooldown_temp is not None and "tether.bench.cooldown" in session.functions():
        cool = session.get_function("tether.bench.cooldown")(float(options.cooldown_temp),
                                                              float(options.cooldown_timeout))
    else:
        cool = None
    if target.kind == "kernel":
        measured = _bench_kernel(session, target, options, on_sample)
    elif target.kind == "op":
        raise BenchError("op targets are built per placement: use bench_placements")
    elif target.kind == "model":
        measured = _bench_model(session, target.path, target, options, on_sample, {})
    elif target.kind == "onnx":
        compile_for = compile_target_for(device_info or session.device_info(), options)
        if onnx_cache is None:
            raise BenchError("ONNX targets need an OnnxCache (a work folder for the compiled model)")
        folder, compile_s = onnx_cache.compile(target, compile_for, options)
        shapes = {k: list(v) for k, v in (target.input_shapes or {}).items()}
        extra = {"target": _target_label(compile_for),
                 "compile_options": {"opt_level": options.opt_level, "fast_math": options.fast_math,
                                     "precision": options.precision, "input_shapes": shapes},
                 "onnx_sha256": fingerprint.file_sha256([target.path])}
        measured = _bench_model(session, folder, target, options, on_sample, extra)
        measured["phases"]["compile_s"] = compile_s
    else:
        raise BenchError("unknown target kind %r" % target.kind)
    result = _result(target, device_id, measured, options)
    if options.precision != "fp32" and target.kind != "onnx":
        result["warnings"].append("--precision %s applies to the ONNX files bench compiles; %s was built already"
                                  % (options.precision, target.spec))
    if options.count_instructions:
        if target.kind == "kernel":
            result["warnings"].append("instructions are counted for models and ONNX files only, not for LIB:FUNC")
        else:
            result["instruction_counts"] = count_instructions(folder if target.kind == "onnx" else target.path,
                                                              result["run"], options)
    if cool is None and options.cooldown_temp is not None:
        result["warnings"].append("--cooldown-temp ignored: the device runtime has no tether.bench.cooldown")
    if cool is not None:
        result["cooldown"] = cool
        if not cool.get("reached", True):
            result["warnings"].append("did not cool to %.0f C within %.0f s (at %.1f C)"
                                      % (options.cooldown_temp, options.cooldown_timeout, cool.get("temp_c", 0)))
    return result


def count_instructions(folder: str, run: Dict[str, Any], options: BenchOptions) -> Dict[str, Any]:
    """The model's instructions per inference on the emulated CPU of the target it was compiled for
    (``tether.bench.insn_count``), with the inputs the measurement used (same seed, shapes, dtypes, order)."""
    from . import insn_count

    rng = np.random.default_rng(options.seed)
    inputs = [random_input(rng, i["shape"], i["dtype"]) for i in run["inputs"]]
    return insn_count.count_model(folder, run["target"], inputs)


def bench_remote_object(session: Any, obj: Any, args: Sequence[Any], options: BenchOptions, name: str,
                        device_id: str, on_sample: Optional[OnSample] = None) -> Dict[str, Any]:
    """Measure something the caller already put on the session: a module function (``RemoteFunction``, called on
    ``args``: RemoteArrays or scalars) or a ``RemoteGraphExecutor`` (its inputs as the caller set them)."""
    from tether.rpc.graph_client import RemoteGraphExecutor

    memory: Dict[str, Any] = {}
    if isinstance(obj, RemoteGraphExecutor):
        kind, handle, wire = "model", obj.handle, []
        info = session.get_function("tether.graph.info")(obj.handle)
        memory["arena_bytes"] = int(info.get("storage_bytes", 0))
        memory["nodes"] = int(info.get("nodes", 0))
    elif isinstance(getattr(obj, "fn", None), _remote_handle_type()):
        kind, handle = "kernel", obj.fn
        wire = [a.handle if hasattr(a, "handle") and hasattr(a, "numpy") else a for a in args]
    else:
        raise BenchError("remote_benchmark measures a module function or a remote graph executor, not %r" % (obj,))
    if kind == "model":
        raw = _measure(session, handle, wire, options, name, on_sample, obj.run, _graph_evaluate(obj, options))
    else:
        def evaluate(repeat: int, min_ms: float) -> Tuple[Sequence[float], int]:
            res = obj.time_evaluator(number=options.number or 1, repeat=repeat, min_repeat_ms=min_ms,
                                     warmup=0)(*args)
            return res.samples, res.number

        raw = _measure(session, handle, wire, options, name, on_sample, lambda: obj(*args), evaluate)
    target = BenchTarget(name, kind, name)
    run = {"artifact_sha256": None, "target": None, "compile_options": None, "input_seed": options.seed,
           "inputs": [{"shape": list(a.shape), "dtype": a.dtype} for a in args if hasattr(a, "shape")]}
    result = _result(target, device_id, {"phases": {}, "raw": raw, "run": run, "memory": memory}, options)
    result["target"] = name
    return result


def _remote_handle_type() -> type:
    from tether_rpc.protocol import RemoteHandle

    return RemoteHandle


def describe_device(session: Any, device_id: str, connection: Dict[str, Any]) -> Dict[str, Any]:
    info = session.device_info()
    state = session.get_function("tether.bench.state")() if "tether.bench.state" in session.functions() else {}
    return {"id": device_id, "connection": connection, "fingerprint": fingerprint.device_fingerprint(info, state),
            "state": state, "info": info}


def bench_on_session(session: Any, targets: Sequence[BenchTarget], options: BenchOptions, device_id: str,
                     connection: Dict[str, Any], onnx_cache: OnnxCache,
                     on_sample: Optional[OnSample] = None,
                     on_result: Optional[Callable[[Dict[str, Any]], None]] = None
                     ) -> Tuple[Dict[str, Any], List[Dict[str, Any]]]:
    """Every target on one session: ``(device record, [result records])``; with a GPU target (or
    ``options.gpu``), ops and ONNX models give two results each: the GPU build and the CPU build."""
    device = describe_device(session, device_id, connection)
    results = []
    for target in targets:
        for res in bench_placements(session, target, options, device_id, device["info"], onnx_cache, on_sample):
            results.append(res)
            if on_result is not None:
                on_result(res)
    return device, results


def placements(info: Dict[str, Any], options: BenchOptions) -> List[Tuple[str, Any]]:
    """What to build a kernel or model for on this device: ``[(compute, target)]``: the GPU target and its host
    (``[("opencl", gpu), ("cpu", gpu.host)]``) when ``--target`` is a GPU target or ``--gpu API`` is given (the
    host then ``--target`` or the device's own CPU target), else ``[("cpu", the CPU target)]``."""
    from tether.target import Target

    if options.compile_target and Target(options.compile_target).is_gpu:
        gpu = Target(options.compile_target)
        if options.gpu and options.gpu != gpu.gpu.api:
            raise BenchError("--gpu %s contradicts --target %s (a %s target)" % (options.gpu, options.compile_target,
                                                                                 gpu.gpu.api))
        return [(gpu.gpu.api, gpu), ("cpu", gpu.host)]
    cpu = compile_target_for(info, options)
    if options.gpu:
        host = cpu if isinstance(cpu, Target) else Target(cpu)
        gpu = Target(options.gpu, host=host)
        return [(gpu.gpu.api, gpu), ("cpu", host)]
    return [("cpu", cpu)]


def _placed(target: BenchTarget, compute: str, paired: bool) -> BenchTarget:
    """The target as measured on one placement: named ``NAME (opencl)`` / ``NAME (cpu)`` when paired, so the two
    rows (and `tether bench compare`) keep them apart."""
    if not paired:
        return target
    return dataclasses.replace(target, label="%s (%s)" % (target.name, compute))


def bench_placements(session: Any, target: BenchTarget, options: BenchOptions, device_id: str,
                     device_info: Optional[Dict[str, Any]] = None, onnx_cache: Optional[OnnxCache] = None,
                     on_sample: Optional[OnSample] = None) -> List[Dict[str, Any]]:
    """One target on one session, once per placement (``placements``) for ops and ONNX models; a library, or a
    model folder, is measured as it was built (on the GPU when it is a GPU build). Paired results carry
    ``pair`` (the target's name) and ``compute``; ``pair_summary`` puts them side by side."""
    info = device_info or session.device_info()
    if target.kind not in ("op", "onnx"):
        return [bench_target(session, target, options, device_id, info, onnx_cache, on_sample)]
    places = placements(info, options)
    paired = len(places) > 1
    if not paired and target.kind == "onnx":   # as before GPUs: built for the device's own CPU target
        return [bench_target(session, target, options, device_id, info, onnx_cache, on_sample)]
    out = []
    for compute, build_for in places:
        named = _placed(target, compute, paired)
        if target.kind == "op":
            res = _bench_op(session, named, compute, build_for, options, device_id, onnx_cache, on_sample)
        else:
            res = bench_target(session, named, dataclasses.replace(options, compile_target=build_for),
                               device_id, info, onnx_cache, on_sample)
        res["compute"] = compute
        res["placement"] = "cpu" if compute == "cpu" else "gpu"
        if paired:
            res["pair"] = target.name
        out.append(res)
    return out


def _bench_op(session: Any, target: BenchTarget, compute: str, build_for: Any, options: BenchOptions,
              device_id: str, onnx_cache: Optional[OnnxCache], on_sample: Optional[OnSample]) -> Dict[str, Any]:
    from .op_kernels import parse_op

    op = parse_op(target.path)
    folder = onnx_cache.workdir if onnx_cache is not None else tempfile.mkdtemp(prefix="tether-bench-op-")
    t0 = time.perf_counter()
    try:
        lib = op.export(build_for, folder, tag=compute)
    except Exception as exc:   # (a schedule or compiler refusing the op for this target: one line)
        raise BenchError("%s: building for %s failed: %s: %s" % (target.spec, build_for, type(exc).__name__,
                                                               exc)) from None
    compile_s = time.perf_counter() - t0
    kernel = BenchTarget(target.spec, "kernel", lib, op.func_name)
    measured = _bench_kernel(session, kernel, options, on_sample)
    measured["phases"]["compile_s"] = compile_s
    measured["run"]["target"] = str(build_for)
    measured["run"]["compile_options"] = {"op": op.spec}
    if compute != "cpu":
        measured["compute"] = compute
    res = _result(kernel, device_id, measured, options)
    res["target"], res["spec"] = target.name, target.spec
    return res


def pair_summary(results: Sequence[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Per paired target and device: the GPU build's and the CPU build's medians and ``speedup`` (CPU median /
    GPU median: above 1, the GPU build is faster), each with the clock its samples came from."""
    by: Dict[Tuple[str, str], Dict[str, Dict[str, Any]]] = {}
    for r in results:
        if r.get("pair"):
            by.setdefault((r["pair"], r["device"]), {})[r.get("placement", "cpu")] = r
    out = []
    for (name, dev), rows in by.items():
        g, c = rows.get("gpu"), rows.get("cpu")
        if g is None or c is None:
            continue
        gm, cm = float(g["stats"]["median"]), float(c["stats"]["median"])
        out.append({"pair": name, "device": dev, "gpu": g["target"], "cpu": c["target"], "compute": g["compute"],
                    "gpu_target": g["run"].get("target"), "cpu_target": c["run"].get("target"),
                    "gpu_median_s": gm, "cpu_median_s": cm, "gpu_clock": g.get("clock", "host"),
                    "cpu_clock": c.get("clock", "host"), "speedup": cm / gm if gm > 0 else None})
    return out


def pool_summary(results: Sequence[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Per target over devices: each device's median, the spread, and within/between-device variance."""
    by_target: Dict[str, List[Dict[str, Any]]] = {}
    for r in results:
        by_target.setdefault(r["target"], []).append(r)
    out = []
    for name, rs in by_target.items():
        if len(rs) < 2:
            continue
        groups = [[s["s"] for s in r["samples"] if s["used"]] for r in rs]
        comp = stats.variance_components(groups)
        medians = [r["stats"]["median"] for r in rs]
        out.append({"target": name, "devices": [r["device"] for r in rs], "medians": medians,
                    "median_of_medians": float(np.median(medians)), "min_median": float(min(medians)),
                    "max_median": float(max(medians)),
                    **{k: v for k, v in (comp or {}).items() if k != "groups"}})
    return out


def run_document(devices: Sequence[Dict[str, Any]], results: Sequence[Dict[str, Any]], options: BenchOptions,
                 argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    """The JSON document of one `tether bench` run (docs/bench.md)."""
    doc = {"schema": SCHEMA_ID,
           "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "command": list(argv) if argv is not None else None,
           "host": fingerprint.host_fingerprint(),
           "options": dataclasses.asdict(options),
           "devices": [{k: v for k, v in d.items() if k != "info"} for d in devices],
           "results": list(results)}
    pool = pool_summary(results)
    if pool:
        doc["pool"] = pool
    pairs = pair_summary(results)
    if pairs:
        doc["pairs"] = pairs
    return doc


def temp_workdir() -> "tempfile.TemporaryDirectory[str]":
    return tempfile.TemporaryDirectory(prefix="tether-bench-")
