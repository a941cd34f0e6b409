"""The timing loop the benchmark scripts share, so every figure is measured the same way."""
from __future__ import annotations

import argparse
import time
from typing import Any, Callable, List, Optional


def per_call_samples(fn: Callable[[], object], number: int, repeat: int) -> List[float]:
    """``repeat`` samples of seconds per call, each the mean over ``number`` back-to-back calls of ``fn``."""
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        samples.append((time.perf_counter() - t0) / number)
    return samples


def add_sample_options(ap: argparse.ArgumentParser, number: int, repeat: int = 7) -> None:
    """``--number`` and ``--repeat``, the arguments of :func:`per_call_samples`, with this script's defaults."""
    ap.add_argument("--number", type=int, default=number, help="runs per sample")
    ap.add_argument("--repeat", type=int, default=repeat, help="samples (median reported)")


def echo_round_trip(remote: Any, calls: int) -> float:
    """Seconds per small call of an RPC session: ``tether.echo``, once untimed, then ``calls`` back to back."""
    echo = remote.get_function("tether.echo")
    echo(0)
    return per_call_samples(lambda: echo(1), calls, 1)[0]


# ---- settling between runtimes: onnxruntime's intra-op workers keep spinning on their cores for about 25 ms after
# a run (session.intra_op.allow_spinning, on by default), tether's native pool workers for about 0.3 ms. Timed
# right after the other runtime, a 2-thread run finds its second core taken and runs as if serial (int8
# mobilenet_v2: 6.1 ms right after an onnxruntime run, 3.8 ms alone or after a pause). Each runtime is measured as
# it runs alone in a process, its own spinning kept, by pausing this long before each of its samples.
SETTLE_S = 0.1


def settle(warm_up: Optional[Callable[[], object]] = None, seconds: float = SETTLE_S) -> None:
    """Pause so that the pool threads of whatever ran before have gone idle, then make one untimed call of
    ``warm_up`` (its own pool's wake-up): call before each timed sample of an interleaved comparison."""
    time.sleep(seconds)
    if warm_up is not None:
        warm_up()
