"""Client side of tether's RPC: ``rpc.connect(host, port)`` for a device server, ``rpc.LocalSession()`` in-process.

    from tether import rpc
    with rpc.connect("127.0.0.1", 9090) as remote:
        remote.upload("vadd.so"); f = remote.load_module("vadd.so")["vadd"]
"""
from __future__ import annotations

from .client import (RemoteArray, RemoteFunction, RemoteModule, RemoteSession, SessionAPI, Timeout, TimingResult,
                     connect, remote_exception)
from .local import LocalSession

__all__ = ["connect", "RemoteSession", "LocalSession", "SessionAPI", "RemoteArray", "RemoteFunction", "RemoteModule",
           "Timeout", "TimingResult", "remote_exception"]


def __getattr__(name: str):
    # The tracker client lives in its own module (another area); expose it lazily when it exists.
    if name == "connect_tracker":
        from .tracker_client import connect_tracker

        return connect_tracker
    raise AttributeError("module 'tether.rpc' has no attribute %r" % name)
