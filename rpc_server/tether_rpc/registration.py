"""Where :mod:`tether_rpc.server` looks for the tracker hook (``TRACKER_HOOK_MODULE``); it lives in the registrar."""
from __future__ import annotations

from .registrar import TrackerHook, make_hook

__all__ = ["TrackerHook", "make_hook"]
