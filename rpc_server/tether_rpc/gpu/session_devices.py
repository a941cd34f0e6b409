"""The GPU devices one session has opened: one DeviceAPI per ``API:INDEX``, opened on first use, closed with the
session.

Opening lazily keeps a session that never asks for a GPU from loading any driver (and a server process from
touching one before it forks its session workers: most drivers' threads do not survive a fork). A device that
cannot be opened is one line naming it (``opencl:0: this device has no OpenCL: libOpenCL.so.1 not found``); the
session goes on and may ask again.
"""
from __future__ import annotations

import logging
from typing import Any, Dict, List

from .api import DeviceAPI, GpuUnavailable
from .array import API_TITLES, canonical_spec
from .devices import open_device

log = logging.getLogger(__name__)


class SessionDevices:
    """``get("opencl:0")`` -> that device's DeviceAPI (opened once); ``close()`` closes them all."""

    def __init__(self) -> None:
        self._open: Dict[str, DeviceAPI] = {}

    def get(self, spec: Any) -> DeviceAPI:
        key = canonical_spec(spec)
        if key is None:
            raise ValueError("device %r is host memory, not a GPU" % (spec,))
        device = self._open.get(key)
        if device is None:
            device = self._open[key] = open_spec(key)
        return device

    @property
    def specs(self) -> List[str]:
        """The devices opened so far, in the order they were opened."""
        return list(self._open)

    def close(self) -> None:
        devices, self._open = self._open, {}
        for key, device in devices.items():
            try:
                device.close()
            except Exception:  # one driver's failure must not keep the other devices open
                log.exception("closing %s at the end of the session failed", key)


def open_spec(key: str) -> DeviceAPI:
    """Open a canonical ``API:INDEX``; GpuUnavailable (one line naming it) when this device cannot."""
    api = key.partition(":")[0]
    try:
        return open_device(key)
    except GpuUnavailable as exc:
        raise GpuUnavailable(_naming(key, exc)) from exc
    except ValueError as exc:
        if api in API_TITLES:   # an API tether knows whose runtime module this device install lacks
            raise GpuUnavailable("%s: this device has no %s (its tether_rpc has no %s runtime)"
                                 % (key, API_TITLES[api], API_TITLES[api])) from exc
        raise ValueError(_naming(key, exc)) from exc


def _naming(key: str, exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if text.startswith(key) else "%s: %s" % (key, text)


__all__ = ["SessionDevices", "open_spec"]
