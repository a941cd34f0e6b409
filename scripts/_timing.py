"""The timing loop the benchmark scripts share, so every figure is measured the same way."""
from __future__ import annotations

import time
from typing import Callable, List


def per_call_samples(fn: Callable[[], object], number: int, repeat: int) -> List[float]:
    """``repeat`` samples of seconds per call, each the mean over ``number`` back-to-back calls of ``fn``."""
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        samples.append((time.perf_counter() - t0) / number)
    return samples
