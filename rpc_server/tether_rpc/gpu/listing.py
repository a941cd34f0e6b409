"""The GPUs of this device, for ``device_info()["gpus"]``: each API's ``available()``, asked in a child process.

A child process, because a driver may hang while it enumerates (a wedged GPU, a broken ICD), and a thread stuck
in native code cannot be stopped: the child is killed at the deadline and the APIs it had not answered for are
named in ``gpus_error``. It also keeps the caller from loading any driver: the server process, which forks
session workers, must not start a driver's threads before it forks.

``python -m tether_rpc.gpu.listing`` prints one JSON line per API as it is answered.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any, Dict, List, Optional, Tuple

#: seconds the whole listing may take before the child is killed
LISTING_TIMEOUT = 20.0

_cached: Optional[Tuple[List[Dict[str, Any]], Optional[str]]] = None


def list_in_process() -> List[Dict[str, Any]]:
    """Every device of every API this install has, in this process: ``{"spec", "api", "index", **info}``."""
    from .devices import api_classes

    out: List[Dict[str, Any]] = []
    for api, cls in sorted(api_classes().items()):
        out.extend(_entries(api, cls))
    return out


def _entries(api: str, cls: type) -> List[Dict[str, Any]]:
    try:
        infos = cls.available()
    except Exception:  # a driver that fails to enumerate lists no device; the others still count
        return []
    return [dict({"spec": "%s:%d" % (api, i), "api": api, "index": i}, **dict(info)) for i, info in enumerate(infos)]


def gpus(timeout: float = LISTING_TIMEOUT) -> Tuple[List[Dict[str, Any]], Optional[str]]:
    """``(gpus, error)``: the listing from a child process (cached for this process), and None or one line
    saying what could not be listed."""
    global _cached
    if _cached is None:
        _cached = _list_in_child(timeout)
    return _cached[0], _cached[1]


def _list_in_child(timeout: float) -> Tuple[List[Dict[str, Any]], Optional[str]]:
    package_parent = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([package_parent] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep)
                                                            if p])
    try:
        proc = subprocess.Popen([sys.executable, "-m", "tether_rpc.gpu.listing"], stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
    except OSError as exc:
        return [], "could not list GPUs: %s" % exc
    error = None
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        error = "listing GPUs ran past %.0f s (a driver hung)" % timeout
    found: List[Dict[str, Any]] = []
    answered: List[str] = []
    for line in out.decode("utf-8", "replace").splitlines():
        try:
            record = json.loads(line)
            answered.append(str(record["api"]))
            found.extend(dict(d) for d in record["devices"])
        except (ValueError, KeyError, TypeError):
            continue
    if error is not None:
        return found, "%s; answered: %s" % (error, ", ".join(answered) or "none")
    if proc.returncode != 0:
        return found, "listing GPUs failed (exit status %s) after: %s" % (proc.returncode, ", ".join(answered) or
                                                                          "none")
    return found, None


def main() -> None:
    from .devices import api_classes

    for api, cls in sorted(api_classes().items()):
        print(json.dumps({"api": api, "devices": _entries(api, cls)}, default=str), flush=True)


if __name__ == "__main__":
    main()
