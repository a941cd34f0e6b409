"""Building candidates in forked workers and measuring them on every device of a tracker key.

Builder: a process pool forked once, before any device thread starts, so that its workers inherit the tasks
(kernels are lowered from the graph nodes in the worker; nothing but a task index and a config crosses the pipe).
A worker writes the candidate's .so and returns its path, or the build error's text.

DevicePool: one runner thread per device registered under the key. A runner holds one session on one device (the
tracker picks it) and measures one candidate at a time on it: upload the .so, load it, run it once on fixed random
inputs into an output poisoned with NaN (or a fixed pattern), compare the output with the task's reference (the
default config's output), then ``time_evaluator`` (repeats of at least ``min_repeat_ms``, each after a write of
``flush_bytes`` that evicts the caches). The module is freed and
the file removed at once, so a long session holds one candidate at a time.

Failures (the log's ``status``):
- ``build_error``: the builder raised (the reason is its message);
- ``wrong_result``: the output differs from the reference beyond a float tolerance;
- ``error``: the device answered with an error (the module failed to load, the kernel returned an error code);
- ``crash`` / ``timeout``: the session ended (the worker or the whole device died) or stopped answering within
  ``timeout`` s. These may be the device's fault rather than the config's, so the candidate is retried on another
  device, up to ``max_attempts`` in all, before the config is marked invalid; the runner drops that device and asks
  the tracker for one again (a device that registers again is taken back by the pool's monitor).
"""
from __future__ import annotations

import concurrent.futures as cf
import fnmatch
import gc
import itertools
import logging
import multiprocessing
import os
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np

from tether.rpc.client import connect
from tether.rpc.timeout import Timeout
from tether.rpc.tracker_client import connect_tracker
from tether.tune.log import OK
from tether.tune.tasks import KERNEL_NAME, Task
from tether_rpc.errors import ConnectionClosed, TetherError, TetherTimeout

log = logging.getLogger(__name__)

# Relative and absolute (scaled by the reference's largest magnitude) tolerance of the output check: configs
# reorder float sums (k unroll, block shapes), never change what is summed.
RTOL = 1e-3
ATOL = 1e-4


@dataclass
class Candidate:
    """One config of one task on its way through build and measurement."""

    task: int
    config: Dict[str, Any]
    reference: bool = False          # the default config: its output becomes the task's reference
    verify: bool = False             # a re-measurement of the best or the default config (the log's "verify")
    timed: bool = True               # False: a reference run only (after --resume), nothing to log
    path: Optional[str] = None
    build_s: float = 0.0
    attempts: List[Dict[str, Any]] = field(default_factory=list)
    avoid: set = field(default_factory=set)
    seq: int = 0


# ---------------------------------------------------------------------------------------------------------------
# building

_TASKS: Sequence[Task] = ()       # set before the pool forks; the workers read it


def _build_one(task_index: int, config: Dict[str, Any], path: str) -> tuple:
    t0 = time.perf_counter()
    try:
        _TASKS[task_index].build(config).export_library(path)
    except Exception as exc:   # noqa: BLE001 - any failure of a candidate's build is that config's result
        return None, "%s: %s" % (type(exc).__name__, exc), time.perf_counter() - t0
    return path, None, time.perf_counter() - t0


def _ready(_: int) -> int:
    return os.getpid()


def _exit_with_parent(parent: int) -> None:
    """Worker initializer: leave when the tuner is gone (killed, even by SIGKILL), instead of waiting forever on a
    queue whose other end this worker itself keeps open."""
    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(0)
    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


class Builder:
    """Builds candidates in `jobs` forked worker processes (create it before starting any thread)."""

    def __init__(self, tasks: Sequence[Task], workdir: str, jobs: int):
        global _TASKS
        _TASKS = tasks
        self.workdir = workdir
        self.jobs = max(1, int(jobs))
        self._seq = itertools.count()
        self._pool = cf.ProcessPoolExecutor(self.jobs, mp_context=multiprocessing.get_context("fork"),
                                            initializer=_exit_with_parent, initargs=(os.getpid(),))
        # fork every worker now, while this process has no other threads. The workers inherit this process's
        # objects frozen (gc.freeze): a worker's collector once freed the parent's garbage there, an onnxruntime
        # session whose destructor waited forever on its thread pool's condition variable (threads the fork did
        # not copy), and the pool never started (seen in the full test suite, after 4,000 tests)
        gc.collect()
        gc.freeze()
        try:
            list(self._pool.map(_ready, range(self.jobs), timeout=60))
        finally:
            gc.unfreeze()

    def submit(self, cand: Candidate, done: Callable[[Candidate, Optional[str]], None]) -> None:
        """Build `cand` in a worker; then `done(cand, error)` (in a pool thread) with cand.path set on success."""
        path = os.path.join(self.workdir, "c%d.so" % next(self._seq))

        def finished(fut: "cf.Future[tuple]") -> None:
            try:
                out, error, seconds = fut.result()
            except Exception as exc:   # noqa: BLE001 - a worker that died (BrokenProcessPool) fails this build
                out, error, seconds = None, "the build worker died: %s" % exc, 0.0
            cand.path, cand.build_s = out, seconds
            done(cand, error)

        try:
            fut = self._pool.submit(_build_one, cand.task, cand.config, path)
        except Exception as exc:   # noqa: BLE001 - a broken pool refuses work: report it as this build's error
            done(cand, "the build pool is broken: %s" % exc)
            return
        fut.add_done_callback(finished)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


# ---------------------------------------------------------------------------------------------------------------
# measuring

def check_output(out: np.ndarray, ref: np.ndarray) -> Optional[str]:
    """None if `out` matches the reference, else what differs."""
    if out.shape != ref.shape:
        return "output shape %s, reference %s" % (out.shape, ref.shape)
    if ref.dtype.kind != "f":
        bad = int(np.count_nonzero(out != ref))
        return None if bad == 0 else "%d of %d elements differ from the default config's output" % (bad, ref.size)
    scale = float(np.nanmax(np.abs(ref))) if np.isfinite(ref).any() else 1.0
    close = np.isclose(out, ref, rtol=RTOL, atol=ATOL * max(1.0, scale), equal_nan=True)
    if close.all():
        return None
    i = int(np.argmin(close.reshape(-1)))
    return ("%d of %d elements differ from the default config's output (first at flat index %d: %r, expected %r)"
            % (int(close.size - close.sum()), close.size, i, out.reshape(-1)[i].item(), ref.reshape(-1)[i].item()))


def _poison(shape: tuple, dtype: str) -> np.ndarray:
    dt = np.dtype(dtype)
    if dt.kind == "f":
        return np.full(shape, np.nan, dt)
    if dt.kind == "b":
        return np.ones(shape, dt)
    return np.full(shape, 0x5A, dt)


def _unless_closed(session: Any, cleanup: Callable[[], Any]) -> None:
    """Clean up on a live session; after a failure the session is gone and the failure is what matters."""
    if not getattr(session, "closed", False):
        cleanup()


@dataclass
class MeasureOptions:
    # many short repeats: on a busy host some of them run undisturbed (their minimum varied 1.01x over re-runs of
    # one kernel at load 10, against 1.4x for 3 repeats of 2 ms), and a measurement costs less (14 ms vs 45 ms)
    repeat: int = 8
    min_repeat_ms: float = 0.5
    flush_bytes: int = 4 << 20      # written before each timed repeat: every config starts from cold caches
    timeout: float = 20.0           # a measurement's longest silence before the device counts as hung
    max_attempts: int = 2           # crash/timeout: tries (on different devices) before the config is invalid
    wait_timeout: float = 5.0       # one wait for a device at the tracker (the runner then asks again)


class DevicePool:
    """Runner threads measuring candidates on every device of `key` at the tracker; `on_result(cand, record)` is
    called (from a runner thread) with the log fields of each final outcome."""

    def __init__(self, tracker: str, key: str, tasks: Sequence[Task], refs: Dict[int, np.ndarray],
                 on_result: Callable[[Candidate, Dict[str, Any]], None], options: Optional[MeasureOptions] = None,
                 tracker_token: Optional[str] = None, session_token: Optional[str] = None,
                 on_start: Optional[Callable[[Candidate, Dict[str, Any]], None]] = None):
        host, _, port = tracker.rpartition(":")
        self.host, self.port = host or "127.0.0.1", int(port)
        self.key = key
        self.tasks = tasks
        self.refs = refs
        self.on_result = on_result
        self.on_start = on_start      # (cand, grant) as a measurement starts: tests kill that device
        self.options = options or MeasureOptions()
        self.tracker_token, self.session_token = tracker_token, session_token
        self.jobs: "queue.Queue[Candidate]" = queue.Queue()
        self.in_use: Dict[int, str] = {}           # runner id -> device it holds
        self.measurements = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._runners: Dict[int, threading.Thread] = {}
        self._ids = itertools.count()
        self._monitor: Optional[threading.Thread] = None
        self._names = itertools.count()

    # -- pool management -------------------------------------------------------------------------------------
    def registered(self) -> int:
        """Devices registered under the key now (any state)."""
        with connect_tracker(self.host, self.port, token=self.tracker_token) as tc:
            devices = tc.summary()["devices"]
        return sum(1 for d in devices if fnmatch.fnmatchcase(d["key"], self.key))

    def start(self) -> int:
        n = self.registered()
        if n == 0:
            raise TetherError("no device is registered under the key %r at the tracker %s:%d (start rpc-server "
                              "--tracker %s:%d --key %s)" % (self.key, self.host, self.port, self.host, self.port,
                                                             self.key))
        for _ in range(n):
            self._add_runner()
        self._monitor = threading.Thread(target=self._watch, name="tune-monitor", daemon=True)
        self._monitor.start()
        return n

    def _add_runner(self) -> None:
        rid = next(self._ids)
        t = threading.Thread(target=self._run, args=(rid,), name="tune-device-%d" % rid, daemon=True)
        with self._lock:
            self._runners[rid] = t
        t.start()

    def _watch(self) -> None:
        """Take back devices that register (again): one runner per registered device."""
        while not self._stop.wait(1.0):
            try:
                n = self.registered()
            except (TetherError, OSError) as exc:
                log.warning("tracker summary failed: %s", exc)
                continue
            with self._lock:
                alive = sum(1 for t in self._runners.values() if t.is_alive())
            for _ in range(n - alive):
                log.info("a device registered under %r: adding a runner", self.key)
                self._add_runner()

    def devices_in_use(self) -> List[str]:
        with self._lock:
            return sorted(set(self.in_use.values()))

    def submit(self, cand: Candidate) -> None:
        self.jobs.put(cand)

    def close(self) -> None:
        self._stop.set()
        for t in list(self._runners.values()):
            t.join(self.options.timeout + self.options.wait_timeout + 5)

    # -- a runner ----------------------------------------------------------------------------------------------
    def _run(self, rid: int) -> None:
        opts = self.options
        try:
            tc = connect_tracker(self.host, self.port, token=self.tracker_token, session_token=self.session_token)
        except (TetherError, OSError) as exc:
            log.warning("runner %d: cannot reach the tracker: %s", rid, exc)
            return
        misses = 0
        with tc:
            while not self._stop.is_set():
                try:
                    grant = tc.reserve(self.key, wait_timeout=opts.wait_timeout, session_timeout=24 * 3600)
                except TetherTimeout:
                    misses += 1
                    with self._lock:
                        alive = sum(1 for t in self._runners.values() if t.is_alive())
                    if misses >= 2 and alive > 1:
                        break           # fewer devices than runners now: the monitor adds one back if needed
                    continue
                except (TetherError, OSError) as exc:
                    log.warning("runner %d: tracker request failed: %s", rid, exc)
                    break
                misses = 0
                host = grant.get("host") or self.host
                port = grant["port"] if grant.get("port") is not None else self.port
                device = "%s#%s" % (grant.get("key"), grant.get("device"))
                try:
                    session = connect(host, port, match=grant["match"], token=self.session_token,
                                      timeout=Timeout(connect=5.0, read=opts.timeout, write=opts.timeout,
                                                      session=5.0))
                except (TetherError, OSError) as exc:
                    log.warning("runner %d: device %s unreachable: %s", rid, device, exc)
                    continue
                with self._lock:
                    self.in_use[rid] = device
                try:
                    self._serve(session, device, grant)
                finally:
                    with self._lock:
                        self.in_use.pop(rid, None)
                    session.close()
        with self._lock:
            self._runners.pop(rid, None)

    def _serve(self, session: Any, device: str, grant: Dict[str, Any]) -> None:
        """Measure candidates on one session until it fails (the device is then dropped) or the pool stops."""
        args_of: Dict[int, list] = {}
        while not self._stop.is_set():
            try:
                cand = self.jobs.get(timeout=0.1)
            except queue.Empty:
                continue
            if device in cand.avoid and len(self.devices_in_use()) > 1 and len(cand.avoid) < 8:
                # retried elsewhere: leave it to another runner for a moment
                self.jobs.put(cand)
                time.sleep(0.02)
                continue
            if self.on_start is not None:
                self.on_start(cand, grant)
            t0 = time.perf_counter()
            try:
                record = self._measure(session, cand, args_of)
            except (ConnectionClosed, TetherTimeout, OSError) as exc:
                reason = "timeout" if isinstance(exc, (TetherTimeout, TimeoutError)) else "crash"
                cand.attempts.append({"device": device, "status": reason, "error": str(exc)})
                log.warning("device %s: %s while measuring %s (attempt %d): %s", device, reason,
                            self.tasks[cand.task].name, len(cand.attempts), exc)
                if len(cand.attempts) >= self.options.max_attempts:
                    self._finish(cand, {"status": reason, "error": str(exc), "device": device})
                else:
                    cand.avoid.add(device)
                    self.jobs.put(cand)
                return
            except TetherError as exc:    # the device answered with an error: this config's fault
                record = {"status": "error", "error": "%s: %s" % (type(exc).__name__, exc)}
            record["device"] = device
            record["measure_s"] = time.perf_counter() - t0
            self._finish(cand, record)

    def _finish(self, cand: Candidate, record: Dict[str, Any]) -> None:
        with self._lock:
            self.measurements += 1
        self.on_result(cand, record)       # the .so stays: the caller may measure it again (verification)

    def _measure(self, session: Any, cand: Candidate, args_of: Dict[int, list]) -> Dict[str, Any]:
        task = self.tasks[cand.task]
        key = (cand.task, task.layout(cand.config))      # a config's conv_panel changes the weight argument
        args = args_of.get(key)
        if args is None:
            args = [session.array(x) for x in task.inputs(config=cand.config)]
            shape, dtype = task.args[-1]
            args.append(session.empty(shape, dtype))
            args_of[key] = args
        name = "cand%d.so" % next(self._names)
        session.upload(cand.path, name=name)
        try:
            mod = session.load_module(name)
            try:
                fn = mod[KERNEL_NAME]
                try:
                    res = self._run_checked(fn, args, cand, args_of)
                finally:
                    _unless_closed(session, lambda: session._call("tether.free", [fn.fn]))
            finally:
                # the module's handles go at once: a session measures thousands of candidates
                _unless_closed(session, lambda: session._call("tether.free", [mod.handle]))
        finally:
            _unless_closed(session, lambda: session.remove(name))
        if isinstance(res, dict):
            return res
        # the fastest sample: on a shared host a sample can only be slowed (descheduled, interrupted), never sped
        # up, so the minimum is the estimate least moved by the load; the median was seen off by 8x at load 10
        return {"status": OK, "latency_s": float(min(res.samples)), "samples": list(res.samples),
                "number": res.number}

    def _run_checked(self, fn: Any, args: list, cand: Candidate, session_state: Dict[Any, Any]) -> Any:
        """One run into a poisoned output, the check against the reference, then the timing (a TimingResult),
        or the log fields of a wrong result / an untimed reference run."""
        shape, dtype = self.tasks[cand.task].args[-1]
        args[-1].copyfrom(_poison(shape, dtype))
        fn(*args)
        out = args[-1].numpy()
        if cand.reference:
            self.refs[cand.task] = out
        else:
            problem = check_output(out, self.refs[cand.task])
            if problem is not None:
                return {"status": "wrong_result", "error": problem}
        if not cand.timed:
            return {"status": OK, "latency_s": None, "samples": []}
        flush = session_state.get("flush_bytes", self.options.flush_bytes)
        try:
            return fn.time_evaluator(number=1, repeat=self.options.repeat, min_repeat_ms=self.options.min_repeat_ms,
                                     flush_bytes=flush)(*args)
        except TetherError as exc:
            if not flush or "flush_bytes" not in str(exc):
                raise
            # a device server older than the flush option: measure there without it
            log.warning("this device's time_evaluator cannot flush caches (an older tether_rpc): measuring with "
                        "warm caches")
            session_state["flush_bytes"] = 0
            return fn.time_evaluator(number=1, repeat=self.options.repeat,
                                     min_repeat_ms=self.options.min_repeat_ms)(*args)
