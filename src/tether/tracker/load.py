"""The tracker process's own load, sampled once per dashboard tick: CPU, memory and the rates of its counters.

Each sample costs a getrusage call and one small /proc read; rates are the counters' differences divided by the
wall time between two samples, so they need no per-event bookkeeping beyond the counters themselves.
"""
from __future__ import annotations

import os
import resource
import time
from typing import Dict, Mapping, Optional

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def rss_bytes() -> int:
    """Resident memory now (Linux: /proc/self/statm); elsewhere the peak, which is what getrusage knows."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if os.uname().sysname == "Darwin" else peak * 1024


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class LoadSampler:
    """Turns successive readings of monotonic counters into per-second rates, with CPU percent and RSS."""

    def __init__(self) -> None:
        self._wall = time.monotonic()
        self._cpu = _cpu_seconds()
        self._counters: Dict[str, float] = {}
        self.last: Dict[str, float] = {}

    def sample(self, counters: Mapping[str, float], gauges: Optional[Mapping[str, float]] = None) -> Dict[str, float]:
        """``{"cpu_percent", "rss_bytes", "<counter>_per_s"..., **gauges}``; also kept as :attr:`last`."""
        wall, cpu = time.monotonic(), _cpu_seconds()
        dt = max(wall - self._wall, 1e-6)
        out: Dict[str, float] = {"cpu_percent": round(100.0 * (cpu - self._cpu) / dt, 1), "rss_bytes": rss_bytes()}
        for name, value in counters.items():
            before = self._counters.get(name, value)
            out[name + "_per_s"] = round(max(0.0, value - before) / dt, 1)
        out.update(gauges or {})
        self._wall, self._cpu, self._counters = wall, cpu, dict(counters)
        self.last = out
        return out
