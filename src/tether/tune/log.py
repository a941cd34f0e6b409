"""The tuning log: JSON lines, appended (and flushed) as results arrive, so a killed run loses nothing measured.

Two kinds of line (``"kind"``):
- ``task``: one of a model's kernels: ``task`` (key), ``name``, ``target``, ``weight`` (how often the model runs
  it), ``space`` (knob -> choices), ``args`` (shapes and dtypes);
- ``verify``: a re-measurement, at the end of a run, of a task's best config and of its default, in turns (same
  fields as ``result``); when a task has them, their fastest choose between the two;
- ``result``: one config measured: ``task``, ``target``, ``config`` ({knob: value}), ``status`` (``ok``,
  ``timeout``, ``crash``, ``wrong_result``, ``build_error``, ``error``), ``latency_s`` (the fastest sample's seconds
  per call, ``ok`` only), ``samples``, ``device``, ``error`` (the reason, for a failure), ``attempts`` (the failures of
  earlier attempts of the same config, e.g. a device that died mid-measurement), ``time`` (unix seconds).

A task's key (``graph.plan.task_key``) is a hash of the kernel's signature (``graph.plan.kernel_signature``: ops,
attributes, argument types) and the target's full description, so a log applies only to the kernels and the target
it was measured for. A torn last line (a run killed mid-write) is skipped when reading. ``best_configs`` turns a
log into the task key -> config mapping that ``graph.build.build_graph`` takes.
"""
from __future__ import annotations

import json
import logging
import os
import threading
import time
from typing import Any, Dict, Iterable, List, Optional, Tuple

from tether.graph.plan import target_id
from tether.tune.space import config_text

__all__ = ["LOG_VERSION", "OK", "FAILURES", "target_id", "config_text", "read_log", "results",
           "best_results", "verified", "best_configs", "TuningLog"]

log = logging.getLogger(__name__)

LOG_VERSION = 1
OK = "ok"
FAILURES = ("timeout", "crash", "wrong_result", "build_error", "error")


def read_log(path: str) -> List[Dict[str, Any]]:
    """Every well-formed record of the log at `path` (none if it does not exist); a malformed line is skipped with
    a warning (the last one is expected after a kill)."""
    if not os.path.exists(path):
        return []
    records = []
    with open(path, encoding="utf-8") as fh:
        lines = fh.read().split("\n")
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            log.warning("%s:%d: skipping a malformed line (%s)", path, n,
                        "torn by a kill" if n >= len(lines) - 1 else "not JSON")
            continue
        if isinstance(rec, dict) and rec.get("v") == LOG_VERSION:
            records.append(rec)
    return records


def results(records: Iterable[Dict[str, Any]]) -> List[Dict[str, Any]]:
    return [r for r in records if r.get("kind") == "result"]



def best_results(records: Iterable[Dict[str, Any]], target: Any = None) -> Dict[str, Dict[str, Any]]:
    """task key -> its best ``ok`` result (for `target` only, when given): the fastest, unless the task was
    verified (``verify`` lines: the best and the default config measured again, in turns), whose fastest decides."""
    want = target_id(target) if target is not None else None
    records = list(records)
    best: Dict[str, Dict[str, Any]] = {}
    for r in results(records):
        if r.get("status") != OK or (want is not None and r.get("target") != want):
            continue
        cur = best.get(r["task"])
        if cur is None or r["latency_s"] < cur["latency_s"]:
            best[r["task"]] = r
    for task, rec in verified(records, want).items():
        best[task] = rec
    return best


def verified(records: Iterable[Dict[str, Any]], want: Optional[str] = None) -> Dict[str, Dict[str, Any]]:
    """task key -> a record of the config with the fastest verification (over all ``verify`` lines)."""
    by_task: Dict[str, Dict[str, Tuple[Dict[str, Any], List[float]]]] = {}
    for r in records:
        if r.get("kind") != "verify" or r.get("status") != OK or (want is not None and r.get("target") != want):
            continue
        per = by_task.setdefault(r["task"], {})
        per.setdefault(config_text(r["config"]), (r["config"], []))[1].append(r["latency_s"])
    out = {}
    for task, per in by_task.items():
        config, lats = min(per.values(), key=lambda cl: min(cl[1]))
        out[task] = {"task": task, "config": config, "status": OK, "latency_s": min(lats)}
    return out


def best_configs(path: str, target: Any) -> Dict[str, Dict[str, Any]]:
    """task key -> the best config measured for `target` in the log at `path` (tether.build_graph(tuning_log=)).
    A missing log is an error (a typo must not silently give the default build)."""
    if not os.path.exists(path):
        raise FileNotFoundError("tuning log %s does not exist (write one with `tether tune ... --log %s`)"
                                % (path, path))
    return {k: r["config"] for k, r in best_results(read_log(path), target).items()}


class TuningLog:
    """Appends records to a log file, one JSON line each, flushed at once; safe to share between threads."""

    def __init__(self, path: str):
        self.path = path
        folder = os.path.dirname(os.path.abspath(path))
        os.makedirs(folder, exist_ok=True)
        self._lock = threading.Lock()
        self._fh: Optional[Any] = open(path, "a", encoding="utf-8")

    def write(self, record: Dict[str, Any]) -> Dict[str, Any]:
        rec = dict(record)
        rec.setdefault("kind", "result")
        rec["v"] = LOG_VERSION
        rec.setdefault("time", time.time())
        line = json.dumps(rec, sort_keys=True) + "\n"
        with self._lock:
            if self._fh is None:
                raise ValueError("tuning log %s is closed" % self.path)
            self._fh.write(line)
            self._fh.flush()
        return rec

    def close(self) -> None:
        with self._lock:
            if self._fh is not None:
                self._fh.close()
                self._fh = None

    def __enter__(self) -> "TuningLog":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
