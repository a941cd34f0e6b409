"""Remote benchmarking: ``tether bench`` (runner, statistics, fingerprints, reports, comparisons).

See docs/bench.md. The measuring itself happens on the device (``tether_rpc.device_state``).
"""
from __future__ import annotations

from .runner import BenchError, BenchOptions, BenchTarget, bench_on_session, bench_target, parse_target, run_document

__all__ = ["BenchError", "BenchOptions", "BenchTarget", "bench_on_session", "bench_target", "parse_target",
           "run_document"]
