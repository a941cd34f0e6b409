"""time_evaluator: repeatable kernel timings with a low, fixed per-call cost.

Arguments are converted once (``PackedFunc.bind``), so each timed call is one ctypes call plus a return-code
check. ``number`` (calls per sample) grows until one sample lasts at least ``min_repeat_ms``, which keeps the
clock's resolution and the loop's own cost negligible against the kernel; all reported samples then use the
same ``number``.

A GPU module's function (``gpu.module.GpuFunction``) is timed on the device's clock instead: its ``bind_timed``
gives a call that returns the seconds its kernels ran, measured by the device's events (OpenCL profiling,
Vulkan timestamps, CUDA events), so the host's launch overhead and waiting are not in the samples. The result
says which clock it used: ``"clock": "device"`` or ``"host"``.
"""
from __future__ import annotations

import math
import time
from typing import Any, Callable, Dict, Optional, Sequence

OnSample = Callable[[int, float, int], None]

_MAX_NUMBER = 1 << 30       # bounds the calibration for kernels that are (nearly) free
_MAX_CALIBRATION_ROUNDS = 32
# device-clock calibration: every call is a real launch and a wait, so bound the calls and the host time it takes
# (an empty grid times as 0 s and would otherwise grow ``number`` to _MAX_NUMBER)
MAX_DEVICE_NUMBER = 1 << 16
MAX_DEVICE_CALIBRATION_S = 5.0

HOST_CLOCK = "host"
DEVICE_CLOCK = "device"


def device_timer(func: Any, args: Sequence[Any]) -> Optional[Callable[[], float]]:
    """A call of ``func(*args)`` that returns its own device-clock seconds, for functions that run on a GPU
    (those with ``bind_timed``); None for a CPU function."""
    bind_timed = getattr(func, "bind_timed", None)
    return bind_timed(*args) if bind_timed is not None else None


def run_device(timed_call: Callable[[], float], number: int) -> float:
    """Device seconds of ``number`` calls (each call times itself on the device)."""
    total = 0.0
    for _ in range(number):
        total += timed_call()
    return total


def _bound_call(func: Any, args: Sequence[Any]) -> Callable[[], None]:
    bind = getattr(func, "bind", None)
    if bind is not None:
        return bind(*args)
    if args:
        return lambda: func(*args)
    return func


def _run(call: Callable[[], None], number: int) -> float:
    clock = time.perf_counter
    loop = range(number)
    t0 = clock()
    for _ in loop:
        call()
    return clock() - t0


def time_evaluator(func: Any, args: Sequence[Any] = (), number: int = 10, repeat: int = 3, min_repeat_ms: float = 0,
                   warmup: int = 1, cooldown_ms: float = 0, on_sample: Optional[OnSample] = None,
                   flush_bytes: int = 0) -> Dict[str, Any]:
    """Time ``func(*args)``.

    ``warmup`` untimed calls first; then ``repeat`` samples of ``number`` calls each, where ``number`` is first
    grown until a sample takes at least ``min_repeat_ms``; ``cooldown_ms`` of sleep between samples (thermal
    throttling on small boards). Returns ``{"samples": [seconds per call, ...], "number": number_used, "clock":
    "host" | "device"}`` and
    calls ``on_sample(index, seconds_per_call, number)`` as each sample is measured. ``flush_bytes`` > 0: that
    many bytes are written before each sample (untimed), evicting the kernel's data from the caches.
    """
    number = int(number)
    repeat = int(repeat)
    if number < 1 or repeat < 1:
        raise ValueError("time_evaluator: number and repeat must be >= 1 (got number=%r, repeat=%r)"
                         % (number, repeat))
    timed_call = device_timer(func, args)
    if timed_call is not None:
        def measure(n: int) -> float:
            return run_device(timed_call, n)
        call: Callable[[], Any] = timed_call
        max_number, clock = MAX_DEVICE_NUMBER, DEVICE_CLOCK
    else:
        call = _bound_call(func, args)

        def measure(n: int) -> float:
            return _run(call, n)
        max_number, clock = _MAX_NUMBER, HOST_CLOCK
    for _ in range(max(0, int(warmup))):
        call()

    min_s = max(0.0, float(min_repeat_ms)) / 1e3
    if min_s > 0:
        t_cal = time.perf_counter()
        for _ in range(_MAX_CALIBRATION_ROUNDS):
            elapsed = measure(number)
            if elapsed >= min_s or number >= max_number:
                break
            if clock == DEVICE_CLOCK and time.perf_counter() - t_cal > MAX_DEVICE_CALIBRATION_S:
                break
            # Aim 20% past the target so the first real sample does not fall just short of it.
            guess = number * 1.2 * min_s / elapsed if elapsed > 0 else number * 10
            number = min(max_number, max(number * 2, int(math.ceil(guess))))

    flush = _flusher(flush_bytes)
    samples = []
    for i in range(repeat):
        if cooldown_ms > 0 and i > 0:
            time.sleep(cooldown_ms / 1e3)
        flush()
        per_call = measure(number) / number
        samples.append(per_call)
        if on_sample is not None:
            on_sample(i, per_call, number)
    return {"samples": samples, "number": number, "clock": clock}


# ---------------------------------------------------------------------------------------------------------------
# cache flush between samples (tether tune: each config measured from cold caches, as AutoTVM's flush does)
MAX_FLUSH_BYTES = 1 << 28


def _flusher(flush_bytes: int) -> Callable[[], None]:
    n = int(flush_bytes)
    if n < 0 or n > MAX_FLUSH_BYTES:
        raise ValueError("time_evaluator: flush_bytes must be within 0..%d (got %r)" % (MAX_FLUSH_BYTES, flush_bytes))
    if n == 0:
        return lambda: None
    import numpy as np

    buf = np.zeros(n, np.uint8)
    state = [0]

    def flush() -> None:
        state[0] = (state[0] + 1) & 0xFF
        buf.fill(state[0])      # a write to every cache line of a buffer larger than the caches
    return flush
