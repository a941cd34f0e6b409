"""The tracker: a shared pool of device servers with queues, priorities, grants and a byte relay.

Run it with ``rpc-tracker`` (:mod:`tether.cli.tracker`) or in-process with :class:`TrackerServer`; talk to it
with :func:`tether.rpc.tracker_client.connect_tracker`. The wire format is in :mod:`tether_rpc.tracker_protocol`.
"""
from .pool import Device, Pool, Request
from .server import TrackerServer, run_tracker

__all__ = ["Device", "Pool", "Request", "TrackerServer", "run_tracker"]
