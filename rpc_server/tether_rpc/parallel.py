"""The parallel launcher the runtime hands to every module (docs/abi.md "Parallel loops", docs/parallel.md).

A module outlines each ``parallel`` loop into a task function and calls the launcher installed through
``tether_set_parallel_launcher``. The launcher is a ctypes callback backed by a persistent thread pool:
``num_threads - 1`` worker threads plus the calling thread pull task ids from one shared iterator (dynamic
scheduling), each task running as a ctypes foreign call, which releases the GIL, so tasks run truly in
parallel. Threads are plain Python threads (pthreads), which behave the same on glibc, musl, bionic and under
qemu-user.

Nested or concurrent launches (a task that itself launches, or two Python threads running kernels at once)
run serially in the caller instead of waiting for the busy pool, so they can never deadlock. Launches whose
measured work is tiny run in the caller too (waking a worker would cost more); bigger ones are timed both ways
and take the faster (with the cores busy elsewhere, the pool loses). At one thread the modules get a NULL
launcher so their own native serial loop runs. A launch of a tether-built module that stays in the caller is
one native call (its tasks accept any task count). A forked child starts a fresh pool.
"""
from __future__ import annotations

import ctypes
import itertools
import logging
import os
import threading
import time
from typing import Dict, List, Optional

logger = logging.getLogger(__name__)

TASK_TYPE = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_int32, ctypes.c_int32, ctypes.c_void_p)
# The task arrives as a raw address: converting it to a TASK_TYPE ourselves lets us cache the callable.
LAUNCHER_TYPE = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32)

# Returned when the launcher itself fails (a Python exception): fits the 24-bit field of "8 << 24 | t".
LAUNCHER_INTERNAL_ERROR = 0xFFFFFF
_JOIN_TIMEOUT_S = 5.0
_clock = time.perf_counter


def _env_min_work_us() -> float:
    env = os.environ.get("TETHER_PARALLEL_MIN_WORK_US", "").strip()
    if env:
        try:
            return max(0.0, float(env))
        except ValueError:
            logger.warning("ignoring TETHER_PARALLEL_MIN_WORK_US=%r: expected a number of microseconds", env)
    return 50.0


# Below this much measured work a launch runs in the caller (docs/parallel.md: about twice the wake-up cost).
_min_parallel_work_s = _env_min_work_us() / 1e6
# Above it, serial and pool launches of a task are both timed and the faster one is used; every
# _EXPLORE_EVERY-th launch tries the other one again, because the answer changes with the load on the cores.
_EXPLORE_EVERY = 32
_TIMES_KEPT = 3
# The pool keeps a launch unless serial was clearly faster: per-launch times are noisy, and on a quiet box a
# wrong serial choice costs more (up to the whole second core) than a wrong pool choice under load.
_SERIAL_MARGIN = 1.25
_WAIT_LOG_INTERVAL_S = 60.0
_TASK_CACHE_MAX = 1024
_PROBE_LAUNCHES = 2


def default_num_threads() -> int:
    """TETHER_NUM_THREADS if set to a positive int, else the CPUs this process may run on."""
    env = os.environ.get("TETHER_NUM_THREADS", "").strip()
    if env:
        try:
            n = int(env)
            if n >= 1:
                return n
        except ValueError:
            pass
        logger.warning("ignoring TETHER_NUM_THREADS=%r: expected a positive integer", env)
    try:
        return max(1, len(os.sched_getaffinity(0)))  # respects taskset / container CPU sets
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


class _Job:
    """One launch: a shared id iterator that every participating thread drains, and a completion count.

    The caller waits for the *tasks* to finish, not for the workers: a worker that wakes up after the caller
    has already run every task finds nothing to do and goes back to sleep without delaying anyone.
    """

    __slots__ = ("task", "closure", "num_tasks", "ids", "finished", "all_done", "result", "_fail_lock")

    def __init__(self, task, closure: Optional[int], num_tasks: int):
        self.task = task
        self.closure = closure
        self.num_tasks = num_tasks
        # next() on a range iterator / itertools.count is one C call, atomic under the GIL: each id is handed
        # out exactly once and each completion is counted exactly once.
        self.ids = iter(range(num_tasks))
        self.finished = itertools.count(1)
        self.all_done = threading.Lock()
        self.all_done.acquire()
        self.result = 0
        self._fail_lock = threading.Lock()

    def run(self) -> None:
        task, closure, n, finished = self.task, self.closure, self.num_tasks, self.finished
        for tid in self.ids:
            try:
                rc = task(tid, n, closure)
            except BaseException:  # never let an exception escape a worker or the ctypes callback
                logger.exception("parallel task %d raised inside the launcher", tid)
                rc = LAUNCHER_INTERNAL_ERROR
            if rc:
                self._fail(rc)
            if next(finished) == n:
                self.all_done.release()

    def wait(self) -> None:
        # Tasks may legitimately run for minutes; a stuck kernel is at least made visible in the log.
        while not self.all_done.acquire(timeout=_WAIT_LOG_INTERVAL_S):
            logger.warning("parallel launch of %d tasks still running after another %.0f s",
                           self.num_tasks, _WAIT_LOG_INTERVAL_S)

    def _fail(self, rc: int) -> None:
        with self._fail_lock:
            if not self.result:
                self.result = rc


class _Worker:
    """A persistent thread, woken by releasing ``go`` only while ``idle`` (so ``go`` is never released twice)."""

    def __init__(self, index: int):
        self.job: Optional[_Job] = None
        self.idle = True
        self.stopping = False
        self.go = threading.Lock()
        self.go.acquire()
        self.thread = threading.Thread(target=self._loop, name="tether-parallel-%d" % index, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while True:
            self.go.acquire()
            job, self.job = self.job, None
            if job is not None:
                job.run()
            self.idle = True
            if self.stopping:
                return

    def try_start(self, job: _Job) -> bool:
        if not self.idle or self.stopping:
            return False  # still waking up for an earlier launch: this launch goes without it
        self.idle = False
        self.job = job
        self.go.release()
        return True

    def stop(self) -> None:
        self.stopping = True
        if self.idle:
            self.idle = False
            self.job = None
            self.go.release()


class ThreadPool:
    """``num_threads`` threads in total: the caller plus ``num_threads - 1`` workers started on first use."""

    def __init__(self, num_threads: int):
        self.num_threads = max(1, int(num_threads))
        self._workers: List[_Worker] = []
        self._busy = threading.Lock()
        self._closed = False

    def _ensure_workers(self) -> None:
        while len(self._workers) < self.num_threads - 1:
            self._workers.append(_Worker(len(self._workers)))

    def launch(self, task, closure: Optional[int], num_tasks: int) -> int:
        if num_tasks <= 0:
            return 0
        job = _Job(task, closure, num_tasks)
        if num_tasks == 1 or self.num_threads == 1 or self._closed or not self._busy.acquire(blocking=False):
            job.run()  # serial: trivial job, 1 thread, or the pool is busy (nested/concurrent launch)
            return job.result
        try:
            self._ensure_workers()
            wanted = num_tasks - 1
            for w in self._workers:
                if wanted <= 0:
                    break
                if w.try_start(job):
                    wanted -= 1
            job.run()
            job.wait()
            return job.result
        finally:
            self._busy.release()

    @staticmethod
    def run_serial(task, closure: Optional[int], num_tasks: int) -> int:
        job = _Job(task, closure, num_tasks)
        job.run()
        return job.result

    def close(self) -> None:
        """Stop the workers (idempotent). Waits (bounded) for a running launch to finish first."""
        if self._closed:
            return
        got = self._busy.acquire(timeout=_JOIN_TIMEOUT_S)
        self._closed = True
        try:
            for w in self._workers:
                w.stop()
            for w in self._workers:
                w.thread.join(_JOIN_TIMEOUT_S)
            self._workers = []
        finally:
            if got:
                self._busy.release()


_pool: Optional[ThreadPool] = None
_pool_lock = threading.Lock()
_task_cache: Dict[int, "_TaskInfo"] = {}


def get_pool() -> ThreadPool:
    global _pool
    pool = _pool
    if pool is None:
        with _pool_lock:
            if _pool is None:
                _pool = ThreadPool(default_num_threads())
            pool = _pool
    return pool


def set_num_threads(n: int) -> None:
    """Use ``n`` threads (caller included) for parallel loops from now on; 1 means serial.

    With one thread, loaded modules get a NULL launcher, so they run their tasks in their own serial loop at
    native speed instead of paying a Python callback per task."""
    global _pool
    if int(n) < 1:
        raise ValueError("set_num_threads: need at least 1 thread, got %r" % (n,))
    with _pool_lock:
        old, _pool = _pool, ThreadPool(int(n))
    if old is not None:
        old.close()
    _reinstall_all()


def get_num_threads() -> int:
    return get_pool().num_threads


def _reset_after_fork() -> None:
    # Threads do not survive fork: the child must never wake workers that exist only in the parent.
    # The child keeps the configured thread count (set_num_threads in the parent) with a fresh, empty pool.
    global _pool, _pool_lock
    if _pool is not None:
        _pool = ThreadPool(_pool.num_threads)
    _pool_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)


class _TaskInfo:
    """A task function seen before: its ctypes callable and what its launches cost in the caller alone (serial)
    and through the pool."""

    __slots__ = ("fn", "work", "probes", "serial_times", "pool_times", "launches")

    def __init__(self, task_ptr: int):
        self.fn = TASK_TYPE(task_ptr)
        self.work = float("inf")  # seconds one thread needed for a serial launch (min over the probes)
        self.probes = 0
        # the latest launch times each way (seconds): medians decide, so one preempted launch cannot flip it
        self.serial_times: List[float] = []
        self.pool_times: List[float] = []
        self.launches = 0

    @property
    def pool_probes(self) -> int:
        return len(self.pool_times)

    @property
    def serial(self) -> float:
        return _median(self.serial_times)

    @property
    def pooled(self) -> float:
        return _median(self.pool_times)


def _median(times: List[float]) -> float:
    if not times:
        return float("inf")
    return sorted(times)[len(times) // 2]


def _record(times: List[float], dt: float) -> None:
    times.append(dt)
    if len(times) > _TIMES_KEPT:
        del times[0]


def _task_info(task_ptr: int) -> _TaskInfo:
    info = _task_cache.get(task_ptr)
    if info is None:
        if len(_task_cache) >= _TASK_CACHE_MAX:
            _task_cache.clear()
        info = _task_cache[task_ptr] = _TaskInfo(task_ptr)
    return info


def set_min_parallel_work_us(us: float) -> None:
    """Launches whose last run did less than ``us`` microseconds of work run in the caller alone (waking a
    worker costs more than it saves); 0 always uses the pool."""
    global _min_parallel_work_s
    if us < 0:
        raise ValueError("set_min_parallel_work_us: need >= 0, got %r" % (us,))
    _min_parallel_work_s = us / 1e6


def get_min_parallel_work_us() -> float:
    return _min_parallel_work_s * 1e6


def _run_whole(fn, closure: Optional[int], num_tasks: int, chunked: bool) -> int:
    """Every task of one launch in the calling thread. A chunked module's task covers chunk ``task_id`` of
    ``num_tasks`` equal chunks for any ``num_tasks``, so the whole loop is one native call (task 0 of 1) instead
    of one ctypes call per task."""
    if chunked:
        return fn(0, 1, closure)
    return ThreadPool.run_serial(fn, closure, num_tasks)


def _launch(task_ptr: Optional[int], closure: Optional[int], num_tasks: int, chunked: bool = False) -> int:
    try:
        if not task_ptr:
            logger.error("parallel launcher called with a NULL task")
            return LAUNCHER_INTERNAL_ERROR
        info = _task_info(task_ptr)
        pool = get_pool()
        threshold = _min_parallel_work_s
        # Kernels have static shapes, so a task function does the same work at every launch: its first launches
        # run serially in the caller to measure that work (the minimum, as the first call pays one-time costs
        # and any run can be preempted), and tasks whose whole launch is tiny then always run in the caller.
        if threshold > 0:
            if info.probes < _PROBE_LAUNCHES:
                t0 = _clock()
                rc = _run_whole(info.fn, closure, num_tasks, chunked)
                dt = _clock() - t0
                info.work = min(info.work, dt)
                info.probes += 1
                _record(info.serial_times, dt)
                return rc
            if info.work < threshold:
                return _run_whole(info.fn, closure, num_tasks, chunked)
            return _adaptive(pool, info, closure, num_tasks, chunked)
        return pool.launch(info.fn, closure, num_tasks)
    except BaseException:  # an exception escaping a ctypes callback would be reported as success (0)
        logger.exception("parallel launcher failed")
        return LAUNCHER_INTERNAL_ERROR


# Tasks per thread of a pool launch of chunked tasks: enough that a thread that arrives late leaves work to the
# others, few enough to keep the per-task cost (a ctypes call and a GIL hand-over, 1 to 3 us) low.
_CHUNKS_PER_THREAD = 4


def _pool_tasks(pool: ThreadPool, num_tasks: int) -> int:
    """How many tasks a pool launch of a chunked task function uses (never more than the module asked for)."""
    return min(num_tasks, _CHUNKS_PER_THREAD * pool.num_threads)


def _adaptive(pool: ThreadPool, info: _TaskInfo, closure: Optional[int], num_tasks: int, chunked: bool) -> int:
    """Run a launch big enough to be worth the pool the faster way, serial or pooled, as measured so far.

    Whether waking a worker pays depends on the other load on the cores, not only on the work: with every core
    busy elsewhere, the second thread only adds hand-over costs (docs/parallel.md)."""
    info.launches += 1
    if len(info.pool_times) < _PROBE_LAUNCHES:
        use_pool = True
    else:
        use_pool = info.pooled < info.serial * _SERIAL_MARGIN
        if info.launches % _EXPLORE_EVERY == 0:
            use_pool = not use_pool
    t0 = _clock()
    if use_pool:
        rc = pool.launch(info.fn, closure, _pool_tasks(pool, num_tasks) if chunked else num_tasks)
    else:
        rc = _run_whole(info.fn, closure, num_tasks, chunked)
    _record(info.pool_times if use_pool else info.serial_times, _clock() - t0)
    return rc


def _launch_chunked(task_ptr: Optional[int], closure: Optional[int], num_tasks: int) -> int:
    return _launch(task_ptr, closure, num_tasks, True)


# One callback object per task convention for the whole process; they must stay alive as long as any module
# may call them. Modules built by tether declare chunked tasks (metadata "parallel_tasks": "chunked"); other
# modules (hand-written C) get the launcher that runs each task id exactly as the module numbered it.
LAUNCHER = LAUNCHER_TYPE(_launch)
LAUNCHER_ADDRESS = ctypes.cast(LAUNCHER, ctypes.c_void_p).value
LAUNCHER_CHUNKED = LAUNCHER_TYPE(_launch_chunked)
LAUNCHER_CHUNKED_ADDRESS = ctypes.cast(LAUNCHER_CHUNKED, ctypes.c_void_p).value


# The launcher setters of every module loaded so far and whether its tasks are chunked, by dlopen handle
# (modules are never unloaded).
_setters: Dict[int, tuple] = {}


def _launcher_for_pool(chunked: bool = False):
    # NULL tells the module to run its tasks serially itself: the fastest choice when there is one thread.
    if get_num_threads() <= 1:
        return None
    return LAUNCHER_CHUNKED_ADDRESS if chunked else LAUNCHER_ADDRESS


def _reinstall_all() -> None:
    for setter, chunked in list(_setters.values()):
        setter(_launcher_for_pool(chunked))


def install(lib: ctypes.CDLL, chunked: bool = False) -> bool:
    """Hand the launcher to a loaded module; False if the module has no ``tether_set_parallel_launcher``.

    ``chunked``: the module declares (metadata ``"parallel_tasks": "chunked"``) that its task functions accept
    any ``num_tasks``, so launches that stay in the caller run as one native call."""
    try:
        setter = lib.tether_set_parallel_launcher
    except AttributeError:
        return False
    setter.argtypes = [ctypes.c_void_p]  # void* so that None installs NULL
    setter.restype = None
    setter(_launcher_for_pool(chunked))
    _setters[lib._handle] = (setter, bool(chunked))
    return True
