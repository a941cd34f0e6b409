"""The parallel launcher the runtime hands to every module (docs/abi.md "Parallel loops", docs/parallel.md).

Modules built by tether carry a native thread pool (metadata ``"thread_pool": 1``, exports ``tether_pool_*``).
The first such module loaded becomes the *provider*: its ``tether_pool_launch`` is installed as the launcher of
every loaded module, and ``num_threads - 1`` daemon Python threads call its ``tether_pool_worker`` through ctypes
(which releases the GIL) and stay parked in native code, so a launch involves no Python at all. The rest of this
module is the fallback for processes that load no such module (hand-written C, older tether builds):

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

import atexit
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


def _env_number(name: str, cast, default, what: str):
    """A non-negative number from the environment variable ``name``, or ``default`` if unset or unreadable."""
    env = os.environ.get(name, "").strip()
    if env:
        try:
            return max(cast(0), cast(env))
        except ValueError:
            logger.warning("ignoring %s=%r: expected %s", name, env, what)
    return default


# Below this much measured work a launch runs in the caller (docs/parallel.md: about twice the wake-up cost).
_min_parallel_work_s = _env_number("TETHER_PARALLEL_MIN_WORK_US", float, 50.0, "a number of microseconds") / 1e6
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
    native speed. The native pool's workers are stopped, joined (bounded) and started anew."""
    global _pool
    if int(n) < 1:
        raise ValueError("set_num_threads: need at least 1 thread, got %r" % (n,))
    with _pool_lock:
        old, _pool = _pool, ThreadPool(int(n))
    if old is not None:
        old.close()
    _restart_native(int(n))
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
    _native_after_fork()


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


# The launcher setters of every module loaded and whether its tasks are chunked, by dlopen handle (until the
# module is unloaded: uninstall).
_setters: Dict[int, tuple] = {}


def _launcher_for_pool(chunked: bool = False):
    # NULL tells the module to run its tasks serially itself: the fastest choice when there is one thread.
    if get_num_threads() <= 1:
        return None
    native = _native if _native_enabled else None
    if native is not None:
        return native.launch_address
    return LAUNCHER_CHUNKED_ADDRESS if chunked else LAUNCHER_ADDRESS


def _reinstall_all() -> None:
    for setter, chunked in list(_setters.values()):
        setter(_launcher_for_pool(chunked))


# handle -> (lib, metadata "thread_pool") of every module with a launcher slot: the candidates for provider
_pool_libs: Dict[int, tuple] = {}


def uninstall(lib: ctypes.CDLL) -> bool:
    """Forget a module about to be unloaded. If it provides the native pool, the pool's workers leave first and
    another loaded module with a pool (if any) takes over. False if a worker is still inside a long task: the
    module must then stay loaded (its code is running)."""
    global _native
    handle = lib._handle
    with _native_lock:
        if _native is not None and _native.lib is lib:
            if not _native.stop():
                return False
            _native = None
        _setters.pop(handle, None)
        _pool_libs.pop(handle, None)
        successor = next((other for other, version in _pool_libs.values() if version == NATIVE_POOL_VERSION), None)
    if successor is not None and _native is None:
        _adopt_provider(successor)
    else:
        _reinstall_all()
    return True


def install(lib: ctypes.CDLL, chunked: bool = False, thread_pool: Optional[int] = None) -> bool:
    """Hand the launcher to a loaded module; False if the module has no ``tether_set_parallel_launcher``.

    ``chunked``: the module declares (metadata ``"parallel_tasks": "chunked"``) that its task functions accept
    any ``num_tasks``, so launches that stay in the Python launcher's caller run as one native call.
    ``thread_pool``: the module's metadata ``"thread_pool"`` (the native pool's protocol version); the first
    module with a version this runtime knows becomes the provider of the native pool for every module."""
    try:
        setter = lib.tether_set_parallel_launcher
    except AttributeError:
        return False
    setter.argtypes = [ctypes.c_void_p]  # void* so that None installs NULL
    setter.restype = None
    _setters[lib._handle] = (setter, bool(chunked))
    _pool_libs[lib._handle] = (lib, thread_pool)
    if thread_pool == NATIVE_POOL_VERSION and _native is None:
        _adopt_provider(lib)  # installs the native launcher everywhere, this module included
    else:
        setter(_launcher_for_pool(chunked))
    return True


# ---- the native pool ------------------------------------------------------------------------------------------

# The protocol version of codegen/threadpool.py this runtime drives (metadata "thread_pool").
NATIVE_POOL_VERSION = 1
_NATIVE_SYMBOLS = ("tether_pool_launch", "tether_pool_worker", "tether_pool_shutdown", "tether_pool_reset",
                   "tether_pool_set_spin", "tether_pool_num_workers")
_WORKERS_READY_TIMEOUT_S = 10.0


def _env_flag(name: str, default: bool) -> bool:
    env = os.environ.get(name, "").strip().lower()
    if not env:
        return default
    if env in ("0", "false", "no", "off"):
        return False
    if env in ("1", "true", "yes", "on"):
        return True
    logger.warning("ignoring %s=%r: expected 0 or 1", name, env)
    return default


class NativePool:
    """The native pool of the provider module: worker threads parked inside ``tether_pool_worker``.

    The threads are ordinary daemon Python threads, so the module needs no thread creation of its own (no
    libc, safe under qemu-user). Start and stop are serialised by the module-level lock of this file."""

    def __init__(self, lib: ctypes.CDLL):
        self.lib = lib
        missing = [name for name in _NATIVE_SYMBOLS if not hasattr(lib, name)]
        if missing:
            raise AttributeError("module declares a thread pool but lacks %s" % ", ".join(missing))
        self.launch_address = ctypes.cast(lib.tether_pool_launch, ctypes.c_void_p).value
        self._worker = lib.tether_pool_worker
        self._worker.argtypes, self._worker.restype = [], None
        self._shutdown = lib.tether_pool_shutdown
        self._shutdown.argtypes, self._shutdown.restype = [], None
        self._reset = lib.tether_pool_reset
        self._reset.argtypes, self._reset.restype = [], None
        self._set_spin = lib.tether_pool_set_spin
        self._set_spin.argtypes, self._set_spin.restype = [ctypes.c_int32], None
        self._num_workers = lib.tether_pool_num_workers
        self._num_workers.argtypes, self._num_workers.restype = [], ctypes.c_int32
        self.threads: List[threading.Thread] = []
        self._started = 0

    @property
    def num_workers(self) -> int:
        """Threads currently inside ``tether_pool_worker`` (the launcher's helpers)."""
        return int(self._num_workers())

    def set_spin(self, iterations: int) -> None:
        self._set_spin(int(iterations))

    def start(self, num_threads: int) -> None:
        """Start ``num_threads - 1`` workers and wait (bounded) until they are inside the pool."""
        want = max(0, int(num_threads) - 1)
        for _ in range(want):
            self._started += 1
            t = threading.Thread(target=self._worker, name="tether-pool-%d" % self._started, daemon=True)
            t.start()
            self.threads.append(t)
        deadline = time.monotonic() + _WORKERS_READY_TIMEOUT_S
        while self.num_workers < want and time.monotonic() < deadline:
            time.sleep(0.0005)
        if self.num_workers < want:
            logger.warning("only %d of %d tether pool workers started within %.0f s; launches run with fewer "
                           "threads until they do", self.num_workers, want, _WORKERS_READY_TIMEOUT_S)

    def stop(self, timeout: float = _JOIN_TIMEOUT_S) -> bool:
        """Make every worker return and join it (bounded). False if some worker is still inside a long task:
        it leaves when that task ends, and is joined at the next stop."""
        if not self.threads:
            return True
        self._shutdown()
        deadline = time.monotonic() + timeout
        for t in self.threads:
            t.join(max(0.0, deadline - time.monotonic()))
        alive = [t for t in self.threads if t.is_alive()]
        self.threads = alive
        if alive:
            logger.warning("%d tether pool worker(s) still running a task after %.1f s; they leave when it ends",
                           len(alive), timeout)
        return not alive

    def after_fork_in_child(self) -> None:
        # The child has none of the parent's threads but inherits the pool's counters: zero them. Safe because
        # the forking thread is the only thread of the child.
        self._reset()
        self.threads = []


_native: Optional[NativePool] = None
_native_enabled = _env_flag("TETHER_NATIVE_POOL", True)
_native_lock = threading.Lock()
# None: the module's default (codegen/threadpool.py DEFAULT_SPIN)
_pool_spin: Optional[int] = _env_number("TETHER_POOL_SPIN", int, None, "a number of spin iterations")


def _adopt_provider(lib: ctypes.CDLL) -> None:
    global _native
    with _native_lock:
        if _native is not None:
            return
        try:
            pool = NativePool(lib)
        except AttributeError as exc:
            logger.warning("not using the native thread pool: %s", exc)
            return
        if _pool_spin is not None:
            pool.set_spin(_pool_spin)
        _native = pool
        if _native_enabled and get_num_threads() > 1:
            pool.start(get_num_threads())
    _reinstall_all()


def native_pool() -> Optional[NativePool]:
    """The native pool in use, or None (no provider module loaded, or disabled): then the Python launcher runs."""
    return _native if _native_enabled else None


def get_native_pool_enabled() -> bool:
    return _native_enabled


def set_native_pool_enabled(enabled: bool) -> None:
    """Use the provider's native pool (the default; env TETHER_NATIVE_POOL=0 turns it off) or the Python
    launcher. Mostly for comparisons (scripts/bench_parallel.py) and as an escape hatch."""
    global _native_enabled
    enabled = bool(enabled)
    with _native_lock:
        if enabled == _native_enabled:
            return
        _native_enabled = enabled
        if _native is not None:
            if enabled and get_num_threads() > 1:
                _native.start(get_num_threads())
            elif not enabled:
                _native.stop()
    _reinstall_all()


def set_pool_spin(iterations: int) -> None:
    """Idle iterations (a pause hint each) a native worker, and a waiting launcher, spin before sleeping on a
    futex; 0 sleeps at once. More keeps back-to-back launches fast, less frees the core sooner."""
    global _pool_spin
    if int(iterations) < 0:
        raise ValueError("set_pool_spin: need >= 0 iterations, got %r" % (iterations,))
    _pool_spin = int(iterations)
    if _native is not None:
        _native.set_spin(_pool_spin)


def _restart_native(num_threads: int) -> None:
    with _native_lock:
        if _native is None or not _native_enabled:
            return
        _native.stop()
        if num_threads > 1:
            _native.start(num_threads)


def _native_after_fork() -> None:
    global _native_lock
    _native_lock = threading.Lock()
    if _native is None:
        return
    _native.after_fork_in_child()
    if _native_enabled and _pool is not None and _pool.num_threads > 1:
        # Restarted at once: a launch is pure native code, so no later Python call could restart it lazily.
        _native.start(_pool.num_threads)


def _native_at_exit() -> None:
    with _native_lock:
        if _native is not None:
            _native.stop(timeout=1.0)


atexit.register(_native_at_exit)
