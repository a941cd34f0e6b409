"""The interface of components plugged into the device server's loop (the tracker registration is one)."""
from __future__ import annotations

from typing import Any, Dict, Optional


class ServerHook:
    """Base class for components plugged into the server loop (e.g. tracker registration)."""

    def attach(self, server: Any) -> None:
        """Called once the server (a :class:`tether_rpc.server.Server`) listens; register sockets with
        ``server.register``."""

    def tick(self, now: float) -> Optional[float]:
        """Called on every loop iteration (``now``: time.monotonic()); run due timers here. Returns the monotonic
        time the hook next needs a tick (the loop sleeps no longer than that), or None."""
        return None

    def check_match(self, match: Optional[str], hello: Dict[str, Any]) -> bool:
        """Accept or refuse a client by the tracker match token in its HELLO (None if it sent none)."""
        return True

    def session_started(self, info: Dict[str, Any]) -> None:
        pass

    def session_ended(self, info: Dict[str, Any]) -> None:
        pass

    def after_fork_child(self) -> None:
        """Runs in a fresh session worker: close the hook's own sockets there."""

    def close(self) -> None:
        pass
