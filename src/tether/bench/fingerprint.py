"""What was measured, on what: fingerprints of the device, the host and the run (docs/bench.md, "fingerprint").

Two results are comparable when their device and run fingerprints agree on what matters (CPU, governor,
kernel, target, compile options); ``tether bench compare`` shows the differences it finds.
"""
from __future__ import annotations

import functools
import hashlib
import os
import platform
import socket
import subprocess
from typing import Any, Dict, Iterable, Optional

import numpy as np

#: device_info keys copied into the device fingerprint
DEVICE_KEYS = ("arch", "machine", "board", "cpu_model", "cpu_cores", "cpu_features", "num_cores", "usable_cores",
               "parallel_threads", "memory_bytes", "governor", "cpu_max_khz", "os", "python", "python_implementation",
               "numpy", "msgpack", "tether_rpc", "suggested_target")


def device_fingerprint(info: Dict[str, Any], state: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """The parts of ``remote.device_info()`` that identify the device and its software, plus the kernel
    release (``os.release``) at top level, and the cpufreq governors of every policy when the state has them."""
    out = {k: info[k] for k in DEVICE_KEYS if k in info}
    osinfo = info.get("os") or {}
    out["kernel"] = osinfo.get("release")
    governors = sorted({p["governor"] for p in (state or {}).get("cpufreq", []) if "governor" in p})
    if governors:
        out["governors"] = governors
    out["id"] = hashlib.sha256(repr(sorted((k, repr(v)) for k, v in out.items()
                                           if k in ("arch", "board", "cpu_model", "cpu_cores", "num_cores",
                                                    "memory_bytes", "kernel"))).encode()).hexdigest()[:16]
    return out


@functools.lru_cache(maxsize=1)
def _git_commit() -> Optional[Dict[str, Any]]:
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True, timeout=5)
        return {"commit": head.stdout.strip(), "dirty": bool(dirty.stdout.strip())}
    except (OSError, subprocess.SubprocessError):
        return None


def host_fingerprint() -> Dict[str, Any]:
    """tether's version and git commit (when run from a checkout), and the host's Python and platform."""
    try:
        from importlib.metadata import version
        tether_version = version("tether")
    except Exception:  # not installed as a distribution (PYTHONPATH checkout)
        tether_version = None
    git = _git_commit()
    return {"tether_version": tether_version, "git_commit": git["commit"] if git else None,
            "git_dirty": git["dirty"] if git else None, "python": platform.python_version(),
            "numpy": np.__version__, "platform": platform.platform(), "hostname": socket.gethostname()}


def file_sha256(paths: Iterable[str]) -> str:
    """One digest over the files' contents in order (a model folder's library, graph and params)."""
    h = hashlib.sha256()
    for path in paths:
        with open(path, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()
