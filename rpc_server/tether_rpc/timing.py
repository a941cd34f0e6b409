"""time_evaluator: repeatable kernel timings with a low, fixed per-call cost.

Arguments are converted once (``PackedFunc.bind``), so each timed call is one ctypes call plus a return-code
check. ``number`` (calls per sample) grows until one sample lasts at least ``min_repeat_ms``, which keeps the
clock's resolution and the loop's own cost negligible against the kernel; all reported samples then use the
same ``number``.
"""
from __future__ import annotations

import math
import time
from typing import Any, Callable, Dict, Optional, Sequence

OnSample = Callable[[int, float, int], None]

_MAX_NUMBER = 1 << 30       # bounds the calibration for kernels that are (nearly) free
_MAX_CALIBRATION_ROUNDS = 32


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
    throttling on small boards). Returns ``{"samples": [seconds per call, ...], "number": number_used}`` and
    calls ``on_sample(index, seconds_per_call, number)`` as each sample is measured. ``flush_bytes`` > 0: that
    many bytes are written before each sample (untimed), evicting the kernel's data from the caches.
    """
    number = int(number)
    repeat = int(repeat)
    if number < 1 or repeat < 1:
        raise ValueError("time_evaluator: number and repeat must be >= 1 (got number=%r, repeat=%r)"
                         % (number, repeat))
    call = _bound_call(func, args)
    for _ in range(max(0, int(warmup))):
        call()

    min_s = max(0.0, float(min_repeat_ms)) / 1e3
    if min_s > 0:
        for _ in range(_MAX_CALIBRATION_ROUNDS):
            elapsed = _run(call, number)
            if elapsed >= min_s or number >= _MAX_NUMBER:
                break
            # Aim 20% past the target so the first real sample does not fall just short of it.
            guess = number * 1.2 * min_s / elapsed if elapsed > 0 else number * 10
            number = min(_MAX_NUMBER, max(number * 2, int(math.ceil(guess))))

    flush = _flusher(flush_bytes)
    samples = []
    for i in range(repeat):
        if cooldown_ms > 0 and i > 0:
            time.sleep(cooldown_ms / 1e3)
        flush()
        per_call = _run(call, number) / number
        samples.append(per_call)
        if on_sample is not None:
            on_sample(i, per_call, number)
    return {"samples": samples, "number": number}


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
