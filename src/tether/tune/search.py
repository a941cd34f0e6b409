"""The search: which configs to measure next (explorer + cost model), and the tuning loop over all tasks.

Explorer (per task, as in AutoTVM): until the cost model has enough measurements, random unmeasured configs; then
the model ranks candidates and the best unmeasured ones are measured, with a share (``EPSILON``) picked at random so
the model keeps seeing new regions. A space small enough is ranked whole; a larger one is walked by simulated
annealing over one-knob moves, started from the best measured configs and random points.

Tuning loop (Tuner.run): every task first measures its default config, whose output becomes the reference the
other configs are checked against. Then, while trials and time remain, the task with the most to gain (weight x
best latency, discounted by the trials it already had) gets the next batch. Builds run in forked workers and
measurements on every device in parallel; results are logged as they arrive. ``resume`` reads the log first:
nothing measured there is measured again (the default of each task is run once, untimed, to get its reference).
"""
from __future__ import annotations

import logging
import math
import os
import queue
import random
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np

from tether.errors import TetherError
from tether.tune import log as tlog
from tether.tune.cost_model import CostModel
from tether.tune.measure import Builder, Candidate, DevicePool, MeasureOptions
from tether.tune.space import ConfigSpace, config_key
from tether.tune.tasks import Task

log = logging.getLogger(__name__)

EPSILON = 0.2              # share of each batch picked at random
RANK_WHOLE_SPACE = 4096    # spaces up to this size are ranked whole by the model
BATCH = 4                  # candidates per task per round


def propose(space: ConfigSpace, model: Optional[CostModel], seen: set, measured: Sequence[Dict[str, Any]],
            n: int, rng: random.Random) -> List[Dict[str, Any]]:
    """Up to `n` unmeasured configs (config_key not in `seen`) worth measuring next."""
    out: List[Dict[str, Any]] = []
    keys = set(seen)

    def take(cfg: Dict[str, Any]) -> None:
        k = config_key(cfg)
        if k not in keys and len(out) < n:
            keys.add(k)
            out.append(cfg)

    n_random = n if model is None or not model.ready else max(1, int(round(n * EPSILON)))
    if model is not None and model.ready:
        pool = space.all_configs(RANK_WHOLE_SPACE)
        if not pool:
            pool = _anneal(space, model, measured, rng)
        for cfg in model.rank([c for c in pool if config_key(c) not in keys]):
            if len(out) >= n - n_random:
                break
            take(cfg)
    for _ in range(50 * n):
        if len(out) >= n:
            break
        take(space.sample(rng))
    return out


def _anneal(space: ConfigSpace, model: CostModel, starts: Sequence[Dict[str, Any]], rng: random.Random,
            chains: int = 16, steps: int = 60) -> List[Dict[str, Any]]:
    """Configs visited by simulated annealing on the model's prediction (every visited point is a candidate)."""
    points = list(starts[:chains // 2]) + [space.sample(rng) for _ in range(chains - min(len(starts), chains // 2))]
    visited: Dict[str, Dict[str, Any]] = {}
    scores = list(model.predict(points))
    temp = 1.0
    for _ in range(steps):
        nxt = [space.neighbour(p, rng) for p in points]
        new_scores = model.predict(nxt)
        for i, (cfg, s) in enumerate(zip(nxt, new_scores)):
            visited[config_key(cfg)] = cfg
            if s < scores[i] or rng.random() < math.exp(-(s - scores[i]) / max(temp, 1e-3)):
                points[i], scores[i] = cfg, s
        temp *= 0.93
    return list(visited.values())


@dataclass
class TaskState:
    task: Task
    seen: set = field(default_factory=set)                 # config keys measured or in flight
    configs: List[Dict[str, Any]] = field(default_factory=list)
    latencies: List[Optional[float]] = field(default_factory=list)
    default_s: Optional[float] = None
    best_s: Optional[float] = None
    best_config: Optional[Dict[str, Any]] = None
    reference: str = "pending"       # pending -> ready | failed (the task is then left alone)
    paths: Dict[str, str] = field(default_factory=dict)   # config key -> .so of the best and the default
    in_flight: int = 0
    failures: Dict[str, int] = field(default_factory=dict)
    model: Optional[CostModel] = None
    fitted_at: int = 0

    @property
    def trials(self) -> int:
        return len(self.configs)

    def add(self, config: Dict[str, Any], status: str, latency: Optional[float], default: bool) -> None:
        self.seen.add(config_key(config))
        self.configs.append(config)
        ok = status == tlog.OK and latency is not None
        self.latencies.append(latency if ok else None)
        if not ok:
            self.failures[status] = self.failures.get(status, 0) + 1
            return
        if default:
            self.default_s = latency
        if self.best_s is None or latency < self.best_s:
            self.best_s, self.best_config = latency, config


@dataclass
class TuneOptions:
    trials: int = 200                 # configs measured per task at most (the default included)
    time_budget: Optional[float] = None
    build_jobs: int = 2
    seed: int = 0
    verify_rounds: int = 3            # the best and the default of each task measured again this often, in turns
    verify_share: float = 0.1         # of the time budget kept for verification
    ray: Optional[str] = None         # HOST:PORT of a Ray cluster's head: build there (tune/ray_build.py)
    ray_store: Optional[str] = None   # the name of the cluster's artifact store (default: ray_build.STORE_NAME)
    ray_task_options: Optional[Dict[str, Any]] = None   # Ray's .options() of each build task (resources, ...)
    measure: MeasureOptions = field(default_factory=MeasureOptions)


class Tuner:
    """Tunes `tasks` on the devices of `key` at `tracker` (HOST:PORT), logging to `log_path`."""

    def __init__(self, tasks: Sequence[Task], log_path: str, tracker: str, key: str, *,
                 options: Optional[TuneOptions] = None, resume: bool = False,
                 on_progress: Optional[Callable[["Tuner"], None]] = None,
                 tracker_token: Optional[str] = None, session_token: Optional[str] = None,
                 on_start: Optional[Callable[[Candidate, Dict[str, Any]], None]] = None,
                 on_built: Optional[Callable[[Candidate, str], None]] = None):
        self.tasks = list(tasks)
        self.log_path = log_path
        self.tracker, self.key = tracker, key
        self.options = options or TuneOptions()
        self.resume = resume
        self.on_progress = on_progress
        self.tracker_token, self.session_token = tracker_token, session_token
        self.on_start = on_start
        self.on_built = on_built      # (cand, Ray node id) as a build comes back from the cluster
        self.states = [TaskState(t) for t in self.tasks]
        # one random stream per task: which configs a task draws depends on the seed and that task alone, not on
        # the order in which builds and measurements of other tasks come back (with Ray or without, the same)
        self.rngs = [random.Random("%d:%s" % (self.options.seed, t.key)) for t in self.tasks]
        self.builder: Any = None
        self.events: "queue.Queue[tuple]" = queue.Queue()
        self.refs: Dict[int, np.ndarray] = {}
        self.pool: Optional[DevicePool] = None
        self.started = time.monotonic()
        self.measured_now = 0
        self.in_flight = 0
        self.verifying = False
        self.verified: List[Dict[str, Any]] = []

    # -- set-up ------------------------------------------------------------------------------------------------
    def _load_log(self) -> None:
        records = tlog.read_log(self.log_path)
        by_key = {s.task.key: s for s in self.states}
        old = [r for r in tlog.results(records) if r["task"] in by_key]
        if old and not self.resume:
            raise TetherError("the tuning log %s already has %d results for this model's kernels: pass --resume to "
                              "continue it, or choose another --log" % (self.log_path, len(old)))
        for r in old:
            st = by_key[r["task"]]
            default = r["config"] == st.task.space.default()
            st.add(r["config"], r["status"], r.get("latency_s"), default)
        logged = {r["task"] for r in records if r.get("kind") == "task"}
        with tlog.TuningLog(self.log_path) as out:
            for st in self.states:
                if st.task.key not in logged:
                    out.write(st.task.record())
        if old:
            log.info("resuming %s: %d results for %d tasks already measured", self.log_path, len(old),
                     len({r["task"] for r in old}))

    # -- the loop ----------------------------------------------------------------------------------------------
    def run(self) -> Dict[str, Any]:
        self._load_log()
        opts = self.options
        with tempfile.TemporaryDirectory(prefix="tether-tune-") as workdir:
            if opts.ray:
                from tether.tune.ray_build import STORE_NAME, RayBuilder

                builder = RayBuilder(self.tasks, workdir, opts.ray, on_built=self.on_built,
                                     store=opts.ray_store or STORE_NAME, task_options=opts.ray_task_options)
            else:
                builder = Builder(self.tasks, workdir, opts.build_jobs)
            self.builder = builder
            self.pool = DevicePool(self.tracker, self.key, self.tasks, self.refs, self._measured,
                                   options=opts.measure, tracker_token=self.tracker_token,
                                   session_token=self.session_token, on_start=self.on_start)
            try:
                devices = self.pool.start()
                log.info("tuning %d tasks on %d device(s) of %r", len(self.tasks), devices, self.key)
                with tlog.TuningLog(self.log_path) as out:
                    self._loop(builder, out, devices)
            finally:
                builder.close()
                self.pool.close()
        return self.summary()

    def _deadline(self) -> float:
        budget = self.options.time_budget
        return self.started + budget * (1 - self.options.verify_share) if budget else math.inf

    def _loop(self, builder: Any, out: tlog.TuningLog, devices: int) -> None:
        self.started = time.monotonic()
        for i, st in enumerate(self.states):
            default = st.task.space.default()
            failed_default = config_key(default) in st.seen and st.default_s is None
            if failed_default:
                st.reference = "failed"
                continue
            timed = config_key(default) not in st.seen
            st.seen.add(config_key(default))
            self._submit(builder, Candidate(i, default, reference=True, timed=timed))
        cap = 2 * (builder.jobs + devices)
        last_progress = 0.0
        grace = self.options.measure.timeout * self.options.measure.max_attempts + 30
        while True:
            now = time.monotonic()
            open_time = now < self._deadline()
            if open_time:
                while self.in_flight < cap:
                    batch = self._next_batch()
                    if not batch:
                        break
                    for cand in batch:
                        self._submit(builder, cand)
            if self.in_flight == 0 and (not open_time or not self._has_work()):
                if self.verifying or not self._verify():
                    break
                continue
            if not open_time and now > self._deadline() + grace:
                log.warning("time budget over: %d measurements still running are abandoned", self.in_flight)
                break
            try:
                event = self.events.get(timeout=0.1)
            except queue.Empty:
                event = None
            while event is not None:
                self._handle(event, builder, out)
                try:
                    event = self.events.get_nowait()
                except queue.Empty:
                    event = None
            if self.on_progress is not None and time.monotonic() - last_progress > 0.25:
                last_progress = time.monotonic()
                self.on_progress(self)
        if self.on_progress is not None:
            self.on_progress(self)

    def _verify(self) -> bool:
        """Queue the verification of every task whose best config is not its default: both measured again
        `verify_rounds` times, in turns, on whichever devices are free. False if there is nothing to verify."""
        self.verifying = True
        jobs = []
        for i, st in enumerate(self.states):
            default = st.task.space.default()
            if st.best_config is None or st.best_config == default:
                continue
            best_path = st.paths.get(config_key(st.best_config))
            default_path = st.paths.get(config_key(default))
            if not best_path or not default_path:
                continue        # measured by an earlier run (--resume): nothing built to verify with
            for _ in range(self.options.verify_rounds):
                for cfg, path in ((default, default_path), (st.best_config, best_path)):
                    jobs.append(Candidate(i, cfg, verify=True, path=path))
        if not jobs or self.pool is None:
            return False
        log.info("verifying the best config of %d tasks against their defaults (%d measurements)",
                 len(jobs) // (2 * self.options.verify_rounds), len(jobs))
        for cand in jobs:
            self.in_flight += 1
            self.states[cand.task].in_flight += 1
            self.pool.submit(cand)
        return True

    def _keep_path(self, st: TaskState, cand: Candidate, default: bool) -> None:
        """Keep the .so of the task's default and current best (verification measures them again)."""
        if not cand.path or cand.verify:
            return
        key = config_key(cand.config)
        if default or (st.best_config is not None and config_key(st.best_config) == key):
            for old_key in [k for k in st.paths if k != key and k != config_key(st.task.space.default())]:
                _unlink(st.paths.pop(old_key))
            st.paths[key] = cand.path
        else:
            _unlink(cand.path)

    def _has_work(self) -> bool:
        return any(self._open(st) for st in self.states)

    def _open(self, st: TaskState) -> bool:
        return (st.reference == "ready" and len(st.seen) < min(self.options.trials, st.task.space.size))

    def _next_batch(self) -> List[Candidate]:
        open_states = [(i, st) for i, st in enumerate(self.states) if self._open(st) and st.in_flight < 2 * BATCH]
        if not open_states:
            return []
        # most to gain first: the time the model spends in the kernel, discounted by the trials it already had
        i, st = max(open_states, key=lambda p: p[1].task.weight * (p[1].best_s or 0.0)
                    / math.sqrt(1 + len(p[1].seen)) / (1 + p[1].in_flight))
        if st.model is None:
            st.model = CostModel(st.task.space, self.options.seed)
        if st.trials >= st.fitted_at + BATCH:
            st.model.fit(st.configs, st.latencies)
            st.fitted_at = st.trials
        order = sorted((lat, k) for k, lat in enumerate(st.latencies) if lat is not None)
        best_first = [st.configs[k] for _, k in order]
        left = min(self.options.trials, st.task.space.size) - len(st.seen)
        configs = propose(st.task.space, st.model, st.seen, best_first, min(BATCH, left), self.rngs[i])
        for cfg in configs:
            st.seen.add(config_key(cfg))
        return [Candidate(i, cfg) for cfg in configs]

    def _submit(self, builder: Any, cand: Candidate) -> None:
        self.in_flight += 1
        self.states[cand.task].in_flight += 1
        builder.submit(cand, lambda c, error: self.events.put(("built", c, error)))

    def _measured(self, cand: Candidate, record: Dict[str, Any]) -> None:
        self.events.put(("measured", cand, record))

    def _handle(self, event: tuple, builder: Any, out: tlog.TuningLog) -> None:
        kind, cand, payload = event
        st = self.states[cand.task]
        if kind == "built":
            if payload is None and self.pool is not None:
                self.pool.submit(cand)
                return
            record = {"status": "build_error", "error": payload}
        else:
            record = payload
        self.in_flight -= 1
        st.in_flight -= 1
        if cand.reference:
            st.reference = "ready" if record["status"] == tlog.OK else "failed"
            if st.reference == "failed":
                log.warning("task %s (%s): the default config failed (%s: %s); not tuned", st.task.key,
                            st.task.name, record["status"], record.get("error"))
        if not cand.timed:
            if record["status"] == tlog.OK and cand.path:
                st.paths[config_key(cand.config)] = cand.path
            return
        full = {"task": st.task.key, "target": tlog.target_id(st.task.target), "config": cand.config,
                "latency_s": None, "error": None, "build_s": round(cand.build_s, 4),
                "attempts": cand.attempts, **record}
        if cand.verify:
            full["kind"] = "verify"
            out.write(full)
            self.verified.append(full)
            return
        out.write(full)
        self.measured_now += 1
        st.add(cand.config, full["status"], full.get("latency_s"), cand.reference)
        self._keep_path(st, cand, cand.reference and full["status"] == tlog.OK)

    # -- results -----------------------------------------------------------------------------------------------
    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def summary(self) -> Dict[str, Any]:
        """Per task: trials, default and best latency (the search's), failures; with verification, the fastest of
        the re-measured default and best (`verified_default_s`, `verified_best_s`). `kernel_speedup`: the model's
        kernel time (weighted), default / tuned, from the verified figures where a task has them."""
        fastest: Dict[str, Dict[str, List[float]]] = {}
        for r in self.verified:
            if r["status"] == tlog.OK:
                fastest.setdefault(r["task"], {}).setdefault(config_key(r["config"]), []).append(r["latency_s"])
        rows = []
        default_total = best_total = 0.0
        for st in self.states:
            row = {"task": st.task.key, "name": st.task.name, "weight": st.task.weight, "trials": st.trials,
                   "default_s": st.default_s, "best_s": st.best_s, "best_config": st.best_config,
                   "failures": dict(st.failures), "reference": st.reference}
            per = fastest.get(st.task.key, {})
            d_key = config_key(st.task.space.default())
            b_key = config_key(st.best_config) if st.best_config is not None else None
            if d_key in per and b_key in per:
                row["verified_default_s"] = min(per[d_key])
                row["verified_best_s"] = min(min(per[b_key]), row["verified_default_s"])
            rows.append(row)
            d = row.get("verified_default_s", st.default_s)
            b = row.get("verified_best_s", st.best_s)
            if d and b:
                default_total += st.task.weight * d
                best_total += st.task.weight * b
        return {"tasks": rows, "measured": self.measured_now, "verified": len(self.verified),
                "elapsed_s": self.elapsed(), "kernel_speedup": (default_total / best_total) if best_total else None}


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
