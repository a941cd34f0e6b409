"""Client side of tether's RPC: ``rpc.connect(host, port)`` for a device server, ``rpc.connect_tracker(host, port)``
for a device from a tracker's pool, ``rpc.LocalSession()`` in-process.

    from tether import rpc
    with rpc.connect("127.0.0.1", 9090) as remote:
        remote.upload("vadd.so"); f = remote.load_module("vadd.so")["vadd"]
"""
from __future__ import annotations

from tether_rpc.error_mapping import remote_exception

from .client import RemoteArray, RemoteFunction, RemoteModule, RemoteSession, SessionAPI, TimingResult, connect
from .local import LocalSession
from .timeout import Timeout
from .tracker_client import TrackerClient, connect_tracker

__all__ = ["connect", "connect_tracker", "RemoteSession", "LocalSession", "SessionAPI", "RemoteArray",
           "RemoteFunction", "RemoteModule", "Timeout", "TimingResult", "TrackerClient", "remote_exception"]
