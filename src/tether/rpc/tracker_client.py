"""Asking a tracker for a device: ``rpc.connect_tracker(host, port).request("rasp4b")`` -> a RemoteSession.

    from tether import rpc
    tracker = rpc.connect_tracker("127.0.0.1", 9190, token=None)
    with tracker.request("rasp*", priority=1, wait_timeout=60, session_timeout=600) as remote:
        remote.device_info()
    tracker.summary()     # {"devices": [...], "queues": {key: {"total", "free", "pending"}}}

The session is exactly what :func:`tether.rpc.connect` returns: the tracker only picks the device and issues a
one-time match token; the client then connects to the device itself (or, for a reverse-mode device, to the
tracker's port, which relays the bytes).
"""
from __future__ import annotations

import getpass
import logging
import os
import random
import socket
import threading
import time
from typing import Any, Callable, Dict, Optional, Union

from tether_rpc import protocol as p, tls as tether_tls, transport
from tether_rpc.error_mapping import error_from_payload, socket_error
from tether_rpc.errors import AuthenticationError, ConnectionClosed, ProtocolError, TetherError, TetherTimeout
from tether_rpc.handshake import ClientHandshake
from tether_rpc.tracker_protocol import DEFAULT_PORT, REPLY_LIMITS, TRACKER_HANDSHAKE, TrackerMsg, hello_payload

from .client import RemoteSession, connect
from .timeout import Timeout

log = logging.getLogger(__name__)

#: Extra seconds the client waits beyond wait_timeout for the tracker's own timeout verdict.
_GRACE = 5.0
#: Longest pause between two attempts to reach a lost tracker.
_MAX_BACKOFF = 2.0
#: ERROR types from the tracker raised as the local class (the rest as remote exceptions).
_LOCAL_ERRORS = frozenset([p.ErrorType.TIMEOUT, p.ErrorType.AUTHENTICATION])


class TrackerClient:
    """One connection to a tracker. States: open -> closed; ``close()`` is idempotent (also via ``with``)."""

    def __init__(self, host: str = "127.0.0.1", port: int = DEFAULT_PORT, *, token: Optional[str] = None,
                 timeout: Union[Timeout, float, None] = 10.0, name: str = "", session_token: Optional[str] = None,
                 session_timeouts: Optional[Timeout] = None, tls: Any = None, ca: Optional[str] = None,
                 reconnect: bool = True, reconnect_backoff: float = 0.1):
        """``reconnect``: a request waiting in the queue survives losing the tracker (a restart, a network blip):
        the client reconnects with capped exponential backoff starting at ``reconnect_backoff`` s, for as long
        as the request's ``wait_timeout`` lasts, and asks again with its ticket, which gets back its place in
        line where the tracker still knows it (docs/tracker.md)."""
        # timeout: connect + handshake (connect), and the wait for a SUMMARY (read); a number sets both
        self.host, self.port = host, port
        self.timeout = Timeout.coerce(timeout)
        self.session_token = session_token
        self.session_timeouts = session_timeouts
        self.reconnect = reconnect
        self.reconnect_backoff = reconnect_backoff
        self.reconnects = 0
        self.closed = False
        self._lost = False
        self._lock = threading.Lock()
        self._next_id = 1
        self._where = "the tracker at %s:%d" % (host, port)
        self._token = token
        self._name = name or _default_name()
        self._context = tether_tls.client_context(tls, ca)
        self._connect()

    def _connect(self) -> None:
        try:
            sock = socket.create_connection((self.host, self.port), timeout=self.timeout.connect)
        except OSError as exc:
            raise socket_error(exc, "could not reach %s within %s s" % (self._where, self.timeout.connect),
                               "could not connect to %s" % self._where) from exc
        if self._context is not None:
            sock = tether_tls.wrap_client(sock, self._context, self.host, self._where)
        self.sock = sock
        try:
            transport.configure_socket(sock)
            self._reader = transport.FrameReader(sock, REPLY_LIMITS)
            ClientHandshake(TRACKER_HANDSHAKE, hello_payload("client", self._name), self._token,
                            peer=self._where, token_hint="connect_tracker(..., token=...)",
                            error_context="tracker %s:%d: " % (self.host, self.port)).run(sock, self._read)
        except BaseException:
            self.closed = True
            sock.close()
            raise
        self.closed = self._lost = False

    def _reconnect(self, deadline: float) -> bool:
        """After losing the tracker: connect again, with backoff, until ``deadline``; False if that passed."""
        delay = self.reconnect_backoff
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(left, delay * (0.5 + random.random())))
            delay = min(delay * 2, _MAX_BACKOFF)
            try:
                self._connect()
            except AuthenticationError:
                raise
            except (TetherError, OSError) as exc:
                log.info("tracker %s:%d still unreachable: %s", self.host, self.port, exc)
                continue
            self.reconnects += 1
            log.warning("reconnected to %s", self._where)
            return True

    def _read(self) -> Any:
        try:
            return self._reader.read_frame()
        except TetherTimeout as exc:
            raise TetherTimeout("%s did not answer within %.1f s"
                                % (self._where, self.sock.gettimeout() or 0)) from exc

    def _error(self, payload: Dict[str, Any]) -> TetherError:
        return error_from_payload(payload, _LOCAL_ERRORS, "tracker %s:%d: " % (self.host, self.port))

    def _rid(self) -> int:
        rid = self._next_id
        self._next_id += 1
        return rid

    # ------------------------------------------------------------------------------------------------ API
    def request(self, key: str, priority: float = 1, wait_timeout: float = 60, session_timeout: float = 600, *,
                on_queued: Optional[Callable[[Dict[str, Any]], None]] = None, **connect_options: Any
                ) -> RemoteSession:
        """Wait (at most ``wait_timeout`` s) for a device matching ``key`` and open a session on it.

        ``key`` is a device key (``rasp4b``), a glob (``rasp*``) or tags (``arch=aarch64,os=linux``). Higher
        ``priority`` is served first, equal priorities in arrival order. The device ends the session after
        ``session_timeout`` s. Raises TetherTimeout (a TimeoutError) naming the key and its queue state.
        Extra keyword arguments go to :func:`tether.rpc.connect` (``token`` for a device's own token, ...).
        """
        deadline = time.monotonic() + wait_timeout
        grant = self.reserve(key, priority, wait_timeout, session_timeout, on_queued=on_queued)
        host = grant["host"] if grant.get("host") is not None else self.host
        port = grant["port"] if grant.get("port") is not None else self.port
        options: Dict[str, Any] = {"token": self.session_token}
        if self.session_timeouts is not None:
            options["timeout"] = self.session_timeouts
        options.update(connect_options)
        log.info("tracker granted %s (device %s) at %s:%d%s", grant.get("key"), grant.get("device"), host, port,
                 " via relay" if grant.get("relay") else "")
        try:
            return connect(host, port, match=grant["match"], **options)
        except (ConnectionClosed, TetherTimeout) as exc:
            # the device vanished between grant and connect: ask again while the wait budget lasts
            left = deadline - time.monotonic()
            if left <= 0:
                raise
            log.warning("granted device %s unreachable (%s); requesting another", grant.get("device"), exc)
            return self.request(key, priority, left, session_timeout, on_queued=on_queued, **connect_options)

    def reserve(self, key: str, priority: float = 1, wait_timeout: float = 60, session_timeout: float = 600, *,
                on_queued: Optional[Callable[[Dict[str, Any]], None]] = None) -> Dict[str, Any]:
        """The grant alone: ``{host, port, match, key, device, relay, session_timeout}`` (host/port None means
        "connect to the tracker itself"). The match token is good for one session, started within ~1 s."""
        with self._lock:
            self._check_open()
            wait_end = time.monotonic() + wait_timeout
            deadline = wait_end + _GRACE
            ticket = ""
            rid = self._send_request(key, priority, wait_timeout, session_timeout, ticket)
            try:
                while True:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise TetherTimeout("the tracker at %s:%d neither granted %r nor timed it out within "
                                            "%.1f s" % (self.host, self.port, key, wait_timeout + _GRACE))
                    self.sock.settimeout(left)
                    try:
                        msg_type, got_rid, payload = self._read() if rid else (0, -1, {})
                    except ConnectionClosed:
                        msg_type, got_rid = 0, -1
                    if got_rid == -1:       # the tracker went away (restarted?): back in line with the ticket
                        self._abort()
                        if not self.reconnect or not self._reconnect(wait_end):
                            raise ConnectionClosed("lost %s while waiting for %r%s" % (
                                self._where, key, "" if self.reconnect else " (reconnect=False)"))
                        rid = self._send_request(key, priority, max(0.0, wait_end - time.monotonic()),
                                                 session_timeout, ticket)
                        continue
                    if got_rid != rid:
                        continue            # a late answer to an earlier, abandoned request
                    if msg_type == TrackerMsg.GRANT:
                        return payload
                    if msg_type == TrackerMsg.QUEUED:
                        log.info("queued for %r at the tracker: %s", key, payload)
                        ticket = payload.get("ticket") or ticket
                        if on_queued is not None:
                            on_queued(payload)
                    elif msg_type == p.MsgType.ERROR:
                        raise self._error(payload)
                    else:
                        raise ProtocolError("the tracker answered REQUEST with message type %d" % msg_type)
            except BaseException as exc:
                if isinstance(exc, (ConnectionClosed, ProtocolError)):
                    self._abort()
                elif not self.closed and not isinstance(exc, TetherTimeout):
                    # e.g. KeyboardInterrupt: withdraw the request so it cannot swallow a device later
                    try:
                        transport.send_frame(self.sock, TrackerMsg.CANCEL, rid, {})
                    except TetherError:
                        self._abort()
                raise

    def _send_request(self, key: str, priority: float, wait_timeout: float, session_timeout: float,
                      ticket: str) -> int:
        """Send REQUEST; returns its id, or 0 if the connection broke on the way (the caller reconnects)."""
        rid = self._rid()
        payload = {"key": key, "priority": priority, "wait_timeout": wait_timeout, "session_timeout": session_timeout}
        if ticket:
            payload["ticket"] = ticket
        try:
            transport.send_frame(self.sock, TrackerMsg.REQUEST, rid, payload)
        except (ConnectionClosed, OSError):
            if not self.reconnect:
                raise
            return 0
        return rid

    def summary(self) -> Dict[str, Any]:
        """``{"devices": [...], "queues": {key: {"total", "free", "pending"}}, "stats": {...}}``."""
        with self._lock:
            self._check_open()
            rid = self._rid()
            transport.send_frame(self.sock, TrackerMsg.SUMMARY, rid, {})
            self.sock.settimeout(self.timeout.read)
            while True:
                msg_type, got_rid, payload = self._read()
                if got_rid != rid:
                    continue
                if msg_type == TrackerMsg.SUMMARY_REPLY:
                    return payload
                if msg_type == p.MsgType.ERROR:
                    raise self._error(payload)
                raise ProtocolError("the tracker answered SUMMARY with message type %d" % msg_type)

    def _check_open(self) -> None:
        if self.closed and self._lost and self.reconnect:
            self._connect()                 # lost earlier (not closed by us): one attempt, its errors raised
        if self.closed:
            raise ConnectionClosed("this tracker connection is closed")

    def _abort(self) -> None:
        self.closed = True
        self._lost = True
        transport.close_quietly(self.sock)

    def close(self) -> None:
        """Leave the tracker: every request still queued on this connection is withdrawn at once. Idempotent."""
        if not self.closed:
            self._abort()
        self._lost = False

    def __enter__(self) -> "TrackerClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return "TrackerClient(%s:%d%s)" % (self.host, self.port, ", closed" if self.closed else "")


def _default_name() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "user"
    return "%s@%s/%d" % (user, socket.gethostname(), os.getpid())


def connect_tracker(host: str = "127.0.0.1", port: int = DEFAULT_PORT, token: Optional[str] = None, *,
                    timeout: Union[Timeout, float, None] = 10.0, name: str = "", session_token: Optional[str] = None,
                    tls: Any = None, ca: Optional[str] = None, reconnect: bool = True,
                    reconnect_backoff: float = 0.1) -> TrackerClient:
    """Connect to a tracker. ``token`` is the tracker's token (default: env TETHER_TRACKER_TOKEN);
    ``session_token`` the devices' own ``--token`` (default: env TETHER_TOKEN, as for rpc.connect).
    ``tls``/``ca``: as for rpc.connect, for the tracker's own connection (docs/tls.md). ``reconnect``: a waiting
    request survives a tracker restart (see :class:`TrackerClient`)."""
    if token is None:
        token = os.environ.get("TETHER_TRACKER_TOKEN") or None
    return TrackerClient(host, port, token=token, timeout=timeout, name=name, session_token=session_token, tls=tls,
                         ca=ca, reconnect=reconnect, reconnect_backoff=reconnect_backoff)
