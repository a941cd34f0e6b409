"""Tuning GPU kernels on a device: configs of ``ops.gpu_schedules.schedule_gpu`` (``tune.space.gpu_space``: work-
group size, outputs per thread, matmul tiles, padding) built per config as GPU modules and timed on the device's
clock (``time_evaluator`` of a GPU function: the kernels' execution from the device's events).

Tasks are either an op of the library at fixed shapes (``GpuOpTask``, from ``op:NAME:DIMS``) or the GPU tasks of a
model's kernel plan for a GPU target (``model_gpu_tasks``: the kernels ``build_graph`` puts on the GPU). Each task's
default config is measured first; its output is the reference every other config is checked against (relative
1e-3, as the CPU tuner's). The log is the CPU tuner's (``tune/log.py``: ``task`` and ``result`` lines, ``clock``
"device" on each result), so ``best_configs(log, target)`` feeds ``build_graph(..., tuning_log=)`` for a model and
``GpuOpTask.build(best_config(...))`` for an op.

Measuring runs one config at a time on one session: ``LocalSession`` (this machine's GPU), a device server, or a
device granted by a tracker (``session_for``). Kernel configs are few (a gpu_space has tens of points), so the
search is an exhaustive walk in a seeded random order, bounded by ``trials`` per task and ``time_budget``.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import tempfile
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from tether.tune import log as tlog
from tether.tune.space import ConfigSpace, config_text, gpu_space

log = logging.getLogger(__name__)

__all__ = ["GpuOpTask", "GpuModelTask", "model_gpu_tasks", "tune_gpu", "best_config"]


class GpuOpTask:
    """An op of the library at fixed shapes (``bench.op_kernels.OpKernel``) on one GPU target."""

    def __init__(self, op: Any, target: Any):
        from tether.target import Target

        self.op = op
        self.target = target if isinstance(target, Target) else Target(target)
        if not self.target.is_gpu:
            raise ValueError("GPU tuning needs a GPU target (opencl, vulkan, cuda ...), got %s" % self.target)
        self.name = op.spec
        self.func = op.func_name
        self.key = hashlib.sha256(("gpu-op|%s|%s" % (op.spec, tlog.target_id(self.target))).encode()).hexdigest()[:16]

    def space(self) -> ConfigSpace:
        outs, _ = self.op.outs_and_args()
        return gpu_space(outs[0])

    def export(self, config: Optional[Dict[str, Any]], path: str) -> None:
        self.op.build(self.target, config).export_library(path)

    def arg_specs(self) -> List[Tuple[Tuple[int, ...], str]]:
        return self.op.arg_specs()

    @property
    def n_outputs(self) -> int:
        return 1


class GpuModelTask:
    """One GPU task of a model's kernel plan (``graph.plan``; ``task.device == "gpu"``): ``key`` is the plan's task
    key, so a log of these is read by ``build_graph(tuning_log=)``."""

    def __init__(self, planned: Any, target: Any):
        self.planned = planned
        self.target = target
        self.key = planned.key
        self.name = str(getattr(planned, "label", None) or getattr(planned, "name", None) or planned.key)
        self.func = "k_" + self.key[:12]

    def space(self) -> ConfigSpace:
        _, out, _ = self.planned.lower(None)
        return gpu_space(out)

    def export(self, config: Optional[Dict[str, Any]], path: str) -> None:
        from tether.graph.gpu_graph import build_model_module, lower_gpu_task

        func = lower_gpu_task(self.planned, config, self.func)
        build_model_module([], [func], self.target, self.func).export_library(path)

    def arg_specs(self) -> List[Tuple[Tuple[int, ...], str]]:
        placeholders, out, _ = self.planned.lower(None)
        return [(tuple(int(d) for d in t.shape), str(t.dtype)) for t in list(placeholders) + [out]]

    @property
    def n_outputs(self) -> int:
        return 1


def model_gpu_tasks(graph: Any, params: Dict[str, np.ndarray], target: Any, opt_level: int = 3) -> List[GpuModelTask]:
    """The tunable GPU tasks of a model for a GPU target: those of its kernel plan that run on the GPU."""
    from tether.graph.plan import plan_kernels
    from tether.target import Target

    tgt = target if isinstance(target, Target) else Target(target)
    plan = plan_kernels(graph, params, tgt, opt_level=opt_level)
    return [GpuModelTask(t, tgt) for t in plan.tasks if getattr(t, "device", "cpu") == "gpu"]


def _random_input(rng: np.random.Generator, shape: Sequence[int], dtype: str) -> np.ndarray:
    dt = np.dtype(dtype)
    if dt.kind == "f":
        return rng.standard_normal(tuple(shape)).astype(dt)
    return rng.integers(0, 8, size=tuple(shape)).astype(dt)


def _configs(space: ConfigSpace, trials: int, seed: int, key: str) -> Iterator[Dict[str, Any]]:
    """The default config, then unseen configs in a random order of the task's own seeded stream."""
    rng = random.Random("%d|%s" % (seed, key))
    seen = set()
    default = space.default()
    seen.add(config_text(default))
    yield default
    tries = 0
    produced = 1
    while produced < trials and tries < 50 * trials:
        tries += 1
        cfg = space.sample(rng)
        text = config_text(cfg)
        if text in seen:
            continue
        seen.add(text)
        produced += 1
        yield cfg


def tune_gpu(tasks: Sequence[Any], log_path: str, open_session: Callable[[], Any], *, trials: int = 8,
             time_budget: Optional[float] = None, repeat: int = 5, min_repeat_ms: float = 1.0, seed: int = 0,
             device_label: str = "local", on_result: Optional[Callable[[Dict[str, Any]], None]] = None,
             resume: bool = False) -> Dict[str, Any]:
    """Measure up to ``trials`` configs per task (the default first) on the session ``open_session()`` gives (a
    context manager), appending to the log at ``log_path``. Returns ``{task key: best ok result}`` of this run.

    A log that already has results for one of the tasks is refused unless ``resume``: then nothing it has is
    measured again (the default runs once more, unlogged, for the reference output), and ``trials`` counts the
    configs it already has."""
    from tether.tune.measure import check_output

    done: Dict[str, set] = {}
    for r in tlog.results(tlog.read_log(log_path)):
        done.setdefault(r.get("task"), set()).add(config_text(r.get("config") or {}))
    again = [t.name for t in tasks if t.key in done]
    if again and not resume:
        raise ValueError("tuning log %s already has results for %s; continue it with --resume, or give another --log"
                         % (log_path, ", ".join(again)))
    deadline = time.perf_counter() + time_budget if time_budget else None
    best: Dict[str, Dict[str, Any]] = {}
    with tlog.TuningLog(log_path) as out, open_session() as session, \
            tempfile.TemporaryDirectory(prefix="tether-gpu-tune-") as work:
        for task in tasks:
            space = task.space()
            specs = task.arg_specs()
            seen = done.get(task.key, set())
            if not seen:
                out.write({"kind": "task", "task": task.key, "name": task.name, "target": tlog.target_id(task.target),
                           "weight": 1, "space": {k: list(v) for k, v in space.knobs},
                           "args": [{"shape": list(s), "dtype": d} for s, d in specs], "device": "gpu"})
            rng = np.random.default_rng(seed)
            inputs = [_random_input(rng, s, d) for s, d in specs[:-task.n_outputs]]
            ref: Optional[np.ndarray] = None
            for n, config in enumerate(_configs(space, trials, seed, task.key)):
                if deadline is not None and n > 0 and time.perf_counter() > deadline:
                    break
                if n > 0 and config_text(config) in seen:
                    continue
                rec = _measure_one(session, task, config, inputs, specs, ref, work, repeat, min_repeat_ms,
                                   check_output)
                if n == 0 and rec["status"] == tlog.OK:
                    ref = rec.pop("_output")
                rec.pop("_output", None)
                if n == 0 and config_text(config) in seen:   # (resumed: the reference only)
                    if ref is None:
                        break
                    continue
                rec.update({"kind": "result", "task": task.key, "target": tlog.target_id(task.target),
                            "config": config, "device": device_label, "clock": rec.get("clock", "device")})
                out.write(rec)
                if on_result is not None:
                    on_result(rec)
                better = task.key not in best or (rec["latency_s"] or 0) < best[task.key]["latency_s"]
                if rec["status"] == tlog.OK and better:
                    best[task.key] = rec
                if n == 0 and ref is None:   # no reference: nothing else can be checked
                    log.warning("%s: the default config failed (%s); not tuned", task.name, rec.get("error"))
                    break
    return best


def _measure_one(session: Any, task: Any, config: Dict[str, Any], inputs: List[np.ndarray],
                 specs: List[Tuple[Tuple[int, ...], str]], ref: Optional[np.ndarray], work: str, repeat: int,
                 min_repeat_ms: float, check_output: Callable[[np.ndarray, np.ndarray], Optional[str]]
                 ) -> Dict[str, Any]:
    digest = hashlib.sha256(config_text(config).encode()).hexdigest()[:10]
    path = os.path.join(work, "%s-%s.so" % (task.func, digest))
    t0 = time.perf_counter()
    try:
        task.export(config, path)
    except Exception as exc:   # (a schedule or compiler refusing the config: logged, the search goes on)
        return {"status": "build_error", "error": "%s: %s" % (type(exc).__name__, exc), "latency_s": None,
                "samples": [], "build_s": time.perf_counter() - t0}
    build_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    name = os.path.basename(path)
    arrays: List[Any] = []
    try:
        session.upload(path, name=name)
        mod = session.load_module(name)
        api = (mod.metadata.get("device") or {}).get("api", task.target.gpu.api)
        fn = mod[task.func]
        out_shape, out_dtype = specs[-1]
        arrays = [session.array(x, device="%s:0" % api) for x in inputs]
        poisoned = np.full(out_shape, np.nan, out_dtype) if np.dtype(out_dtype).kind == "f" else \
            np.zeros(out_shape, out_dtype)
        arrays.append(session.array(poisoned, device="%s:0" % api))
        fn(*arrays)
        got = arrays[-1].numpy()
        if ref is not None:
            wrong = check_output(got, ref)
            if wrong is not None:
                return {"status": "wrong_result", "error": wrong, "latency_s": None, "samples": [],
                        "build_s": build_s, "measure_s": time.perf_counter() - t0}
        res = fn.time_evaluator(number=1, repeat=repeat, min_repeat_ms=min_repeat_ms)(*arrays)
        samples = [float(s) for s in res.samples]
        # the fastest sample, as the CPU tuner: a sample can only be slowed by the machine, never sped up
        return {"status": tlog.OK, "latency_s": min(samples), "samples": samples, "clock": res.clock,
                "build_s": build_s, "measure_s": time.perf_counter() - t0, "_output": got}
    except Exception as exc:   # (the device refused the module or the launch: this config's failure)
        return {"status": "error", "error": "%s: %s" % (type(exc).__name__, exc), "latency_s": None, "samples": [],
                "build_s": build_s, "measure_s": time.perf_counter() - t0}
    finally:
        for a in arrays:
            try:
                a.free()
            except Exception:   # (a session that died: its arrays went with it)
                pass


def best_config(log_path: str, task: Any) -> Optional[Dict[str, Any]]:
    """The best measured config of ``task`` in the log (None when the log has none: build the default)."""
    return tlog.best_configs(log_path, task.target).get(task.key)


def read_summary(log_path: str) -> str:
    """One line per tuned task: default and best latency (for the CLI)."""
    records = tlog.read_log(log_path)
    lines = []
    for t in (r for r in records if r.get("kind") == "task"):
        rs = [r for r in tlog.results(records) if r["task"] == t["task"] and r.get("status") == tlog.OK]
        if not rs:
            continue
        default = rs[0]
        top = min(rs, key=lambda r: r["latency_s"])
        lines.append("%s: default %.3g ms, best %.3g ms (%s) with %s" % (
            t.get("name"), default["latency_s"] * 1e3, top["latency_s"] * 1e3, top.get("clock", "?"),
            json.dumps(top["config"], sort_keys=True)))
    return "\n".join(lines)
