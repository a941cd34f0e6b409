"""A device server's link to the tracker: registration, heartbeats, match tokens, and reverse-mode dial-out.

Two layers:

* :class:`Registrar` owns the tracker connection in one daemon thread. Its thread-safe calls are everything a
  server loop needs::

    reg = Registrar(("tracker", 9190), key="rasp4b", port=server_port, token=None, reverse=False,
                    on_connection=adopt)                 # reverse mode: sockets it dialled out, for sessions
    reg.start()
    terms = reg.accept_match(hello["match"])             # None -> refuse; else {match, session_timeout, client}
    reg.session_started(match)                           # the session's WELCOME went out
    reg.session_ended()                                  # the worker is gone: re-register as free
    reg.after_fork()                                     # in a forked session worker: drop our descriptor
    reg.close()

* :class:`TrackerHook` adapts it to :class:`tether_rpc.server.ServerHook` (``rpc-server --tracker H:P --key K``
  loads it through :func:`make_hook`). Work that must happen on the server's loop thread (adopting reverse
  sockets, killing a session that outlives its grant's ``session_timeout``) is handed over through a wake-up
  pipe; a pidfd on the session worker wakes the loop the moment the worker exits, for a fast handoff.

The thread never gives up: a refused, lost or restarted tracker is retried forever with capped exponential
backoff plus jitter, and every reconnect re-registers with the server's current state. Wire format:
:mod:`tether_rpc.tracker_protocol`, ``docs/tracker.md``.
"""
from __future__ import annotations

import logging
import os
import random
import select
import selectors
import signal
import socket
import threading
import time
from typing import Any, Callable, Dict, Optional, Tuple

from . import protocol as p
from .server import ServerHook, parse_hostport
from .errors import AuthenticationError, ConnectionClosed, ProtocolError, TetherError, TetherTimeout
from .tracker_protocol import TRACKER_LIMITS, TrackerMsg, check_match, hello_payload

log = logging.getLogger(__name__)

#: How long an acknowledged match token stays acceptable without a REVOKE (the tracker's grant window is 1 s).
MATCH_TTL = 30.0


class Registrar:
    def __init__(self, tracker: Tuple[str, int], key: str, *, port: int, host: Optional[str] = None,
                 token: Optional[str] = None, tags: Optional[Dict[str, str]] = None,
                 info: Optional[Callable[[], dict]] = None, reverse: bool = False,
                 on_connection: Optional[Callable[[socket.socket], None]] = None, name: str = "",
                 connect_timeout: float = 5.0, max_backoff: float = 10.0):
        if reverse and on_connection is None:
            raise ValueError("reverse mode needs on_connection: the server must adopt the sockets dialled out")
        self.tracker = tracker
        self.key = key
        self.port = port
        self.host = host
        self.token = token
        self.tags = dict(tags or {})
        self.info = info
        self.reverse = reverse
        self.on_connection = on_connection
        self.name = name or key
        self.connect_timeout = connect_timeout
        self.max_backoff = max_backoff
        self.device_id: Optional[int] = None
        self.registrations = 0             # completed REGISTER exchanges, for tests and logs
        self._lock = threading.Lock()      # guards the state below and every send on _sock
        self._sock: Optional[socket.socket] = None
        self._expected: Dict[str, Tuple[float, dict]] = {}
        self._busy_match: Optional[str] = None
        self._busy = False
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._heartbeat = 1.0
        self._registered = threading.Event()
        self._info_cache: Optional[dict] = None

    # ------------------------------------------------------------------------------------- server-facing API
    def start(self) -> "Registrar":
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="tether-registrar", daemon=True)
            self._thread.start()
        return self

    def wait_registered(self, timeout: float) -> bool:
        return self._registered.wait(timeout)

    def accept_match(self, match: Optional[str]) -> Optional[dict]:
        """Consume a one-time match token from a HELLO; returns the grant's terms, or None to refuse."""
        if not isinstance(match, str):
            return None
        with self._lock:
            entry = self._expected.pop(match, None)
        if entry is None or entry[0] < time.monotonic():
            return None
        return entry[1]

    def session_started(self, match: Optional[str]) -> None:
        with self._lock:
            self._busy, self._busy_match = True, match
            self._send_locked(TrackerMsg.SESSION, {"state": "started", "match": match})

    def session_ended(self) -> None:
        """The session is over: register again, so the tracker hands the device to the next client."""
        with self._lock:
            self._busy, self._busy_match = False, None
            self._send_locked(TrackerMsg.REGISTER, self._register_payload())

    def after_fork(self) -> None:
        """In a forked child: close our copy of the tracker socket so only the parent speaks for the device."""
        sock = self._sock     # no lock: the thread holding it may not exist in the child
        if sock is not None:
            sock.close()      # drops only the child's descriptor; the parent's connection stays up

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            sock, self._sock = self._sock, None
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)

    def __enter__(self) -> "Registrar":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -------------------------------------------------------------------------------------------- the thread
    def _register_payload(self) -> dict:
        # device info is gathered once (it reads /proc and /sys: ~0.2 s) and re-sent on every re-registration
        if self._info_cache is None:
            self._info_cache = {}
            if self.info is not None:
                try:
                    self._info_cache = self.info()
                except Exception:  # device info is a courtesy; never let it stop registration
                    log.exception("device info failed; registering without it")
        info = self._info_cache
        payload = {"key": self.key, "port": self.port, "tags": self.tags, "info": info, "reverse": self.reverse,
                   "state": "busy" if self._busy else "free"}
        if self.host:
            payload["host"] = self.host
        return payload

    def _send_locked(self, msg_type: int, payload: dict) -> None:
        if self._sock is None:
            return          # not connected: the next registration carries the current state
        try:
            p.send_frame(self._sock, msg_type, 0, payload)
        except (TetherError, OSError) as exc:
            log.info("tracker send failed (%s); the registrar reconnects", exc)
            try:
                self._sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _run(self) -> None:
        backoff = 0.1
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self._session()
            except AuthenticationError as exc:
                log.error("tracker %s:%d refused this device: %s (retrying)", self.tracker[0], self.tracker[1], exc)
            except (TetherError, OSError) as exc:
                if not self._stop.is_set():
                    log.info("tracker %s:%d unreachable or lost: %s", self.tracker[0], self.tracker[1], exc)
            except Exception:  # the registrar must never die: log and retry
                log.exception("registrar error")
            finally:
                with self._lock:
                    sock, self._sock = self._sock, None
                    self._expected.clear()
                if sock is not None:
                    sock.close()
                self._registered.clear()
            if time.monotonic() - started > 5.0:
                backoff = 0.1          # we were connected for a while: the next loss starts the ladder again
            delay = backoff * (0.5 + random.random())
            backoff = min(backoff * 2, self.max_backoff)
            self._stop.wait(delay)

    def _session(self) -> None:
        self._register_payload()      # gather device info before the connection exists, not while it waits
        sock = socket.create_connection(self.tracker, timeout=self.connect_timeout)
        p.configure_socket(sock)
        reader = p.FrameReader(sock, TRACKER_LIMITS)
        p.send_frame(sock, TrackerMsg.HELLO, 0, hello_payload("device", self.name))
        msg_type, _, payload = reader.read_frame()
        if msg_type == TrackerMsg.CHALLENGE:
            if not self.token:
                raise AuthenticationError("the tracker requires a token: set TETHER_TRACKER_TOKEN for this device server")
            nonce = p.make_nonce()
            server_nonce = payload.get("nonce")
            if not isinstance(server_nonce, bytes):
                raise ProtocolError("tracker CHALLENGE lacks a nonce")
            p.send_frame(sock, TrackerMsg.AUTH, 0, {"nonce": nonce, "mac": p.client_mac(self.token, server_nonce, nonce)})
            msg_type, _, payload = reader.read_frame()
            if msg_type == TrackerMsg.WELCOME and not p.macs_equal(payload.get("proof"),
                                                                   p.server_proof(self.token, server_nonce, nonce)):
                raise AuthenticationError("the tracker could not prove it knows the token")
        _raise_if_error(msg_type, payload)
        if msg_type != TrackerMsg.WELCOME:
            raise ProtocolError("tracker answered HELLO with message type %d" % msg_type)
        with self._lock:
            self._sock = sock
            p.send_frame(sock, TrackerMsg.REGISTER, 0, self._register_payload())
        msg_type, _, payload = reader.read_frame()
        _raise_if_error(msg_type, payload)
        if msg_type != TrackerMsg.REGISTERED:
            raise ProtocolError("tracker answered REGISTER with message type %d" % msg_type)
        self.device_id = payload.get("device")
        hb = payload.get("heartbeat", 1.0)
        self._heartbeat = float(hb) if isinstance(hb, (int, float)) and 0.05 <= hb <= 60 else 1.0
        self.registrations += 1
        self._registered.set()
        log.info("registered with tracker %s:%d as device %s (key %s)", self.tracker[0], self.tracker[1],
                 self.device_id, self.key)
        self._serve(sock, reader)

    def _serve(self, sock: socket.socket, reader: p.FrameReader) -> None:
        handlers = {TrackerMsg.EXPECT: self._on_expect, TrackerMsg.REVOKE: self._on_revoke,
                    TrackerMsg.DIAL: self._on_dial, TrackerMsg.HEARTBEAT: lambda s, pl: None,
                    TrackerMsg.REGISTERED: lambda s, pl: None}
        next_beat = time.monotonic() + self._heartbeat
        last_heard = time.monotonic()
        while not self._stop.is_set():
            now = time.monotonic()
            if now >= next_beat:
                with self._lock:
                    p.send_frame(sock, TrackerMsg.HEARTBEAT, 0, {})
                next_beat = now + self._heartbeat
            if now - last_heard > 3 * self._heartbeat + 2.0:
                raise TetherTimeout("no word from the tracker for %.1f s" % (now - last_heard))
            if not reader.buffer.buffered:
                ready, _, _ = select.select([sock], [], [], max(0.0, next_beat - time.monotonic()))
                if not ready:
                    continue
            # the socket keeps connect_timeout: a started frame must finish, and a send to a stuck tracker
            # cannot block the device server's loop (which calls session_started/ended) for longer
            msg_type, _, payload = reader.read_frame()
            last_heard = time.monotonic()
            _raise_if_error(msg_type, payload)
            handler = handlers.get(msg_type)
            if handler is None:
                raise ProtocolError("tracker sent message type %d to a device" % msg_type)
            handler(sock, payload)

    def _on_expect(self, sock: socket.socket, payload: dict) -> None:
        match = check_match(payload)
        session_timeout = payload.get("session_timeout")
        if not (isinstance(session_timeout, (int, float)) and 0 < session_timeout < float("inf")):
            session_timeout = None        # no limit from the tracker; the server's own --session-timeout holds
        terms = {"match": match, "client": str(payload.get("client", ""))[:128],
                 "session_timeout": float(session_timeout) if session_timeout is not None else None}
        with self._lock:
            now = time.monotonic()
            for old in [m for m, (dl, _) in self._expected.items() if dl < now]:
                del self._expected[old]
            self._expected[match] = (now + MATCH_TTL, terms)
            p.send_frame(sock, TrackerMsg.EXPECTED, 0, {"match": match})

    def _on_revoke(self, sock: socket.socket, payload: dict) -> None:
        with self._lock:
            self._expected.pop(payload.get("match"), None)

    def _on_dial(self, sock: socket.socket, payload: dict) -> None:
        match = check_match(payload)
        if not self.reverse or self.on_connection is None:
            raise ProtocolError("tracker asked a device that is not in reverse mode to dial back")
        # dial from a helper thread: a slow connect must not stall heartbeats
        threading.Thread(target=self._dial, args=(match,), name="tether-dial", daemon=True).start()

    def _dial(self, match: str) -> None:
        try:
            data = socket.create_connection(self.tracker, timeout=self.connect_timeout)
            p.configure_socket(data)
            p.send_frame(data, TrackerMsg.RELAY, 0, {"match": match})
            data.settimeout(None)
        except (OSError, TetherError) as exc:
            log.warning("reverse dial to the tracker failed: %s", exc)
            return
        assert self.on_connection is not None
        try:
            self.on_connection(data)
        except Exception:
            log.exception("the server refused a reverse-mode connection")
            data.close()


# ---------------------------------------------------------------------------------------------------------------
# the device server's hook (tether_rpc.server.ServerHook): the server loop calls these, the Registrar's thread
# does the talking. Everything that touches the server (adopting reverse sockets, killing a session that ran past
# its grant's session_timeout) is handed to the loop thread through a wake-up pipe.

def parse_tags(text: Optional[str]) -> Dict[str, str]:
    """``"board=rpi4,lab=b12"`` -> dict; empty parts are ignored."""
    out: Dict[str, str] = {}
    for part in (text or "").split(","):
        name, sep, value = part.partition("=")
        if part.strip() and not sep:
            raise ValueError("a device tag must look like name=value, got %r" % part)
        if part.strip():
            out[name.strip()] = value.strip()
    return out


def _device_info() -> dict:
    from . import device_info

    info = device_info.device_info()
    os_info = info.get("os")
    if isinstance(os_info, dict):
        # a flat "os" string makes the os=linux / os=android tag work
        info = dict(info, os="android" if os_info.get("android") else str(os_info.get("system", "")).lower(),
                    os_details=os_info)
    return info


def make_hook(config: Any) -> Any:
    """The tracker hook for :func:`tether_rpc.server.serve` (``config`` is its ServerConfig)."""
    token = getattr(config, "tracker_token", None) or os.environ.get("TETHER_TRACKER_TOKEN") or None
    tags = getattr(config, "tags", None) or parse_tags(os.environ.get("TETHER_DEVICE_TAGS"))
    return TrackerHook(parse_hostport(config.tracker), config.key, token=token, tags=tags,
                       reverse=bool(config.reverse), advertise_host=getattr(config, "advertise_host", None))


class TrackerHook(ServerHook):
    """Registers the server with a tracker; accepts only sessions the tracker granted."""

    def __init__(self, tracker: Tuple[str, int], key: str, *, token: Optional[str] = None,
                 tags: Optional[Dict[str, str]] = None, reverse: bool = False,
                 advertise_host: Optional[str] = None, info: Optional[Callable[[], dict]] = _device_info):
        self._args = dict(tracker=tracker, key=key, token=token, tags=tags, reverse=reverse,
                          host=advertise_host, info=info)
        self.registrar: Optional[Registrar] = None
        self._server: Any = None
        self._wake_r = self._wake_w = -1
        self._adopt: "list[socket.socket]" = []
        self._terms: Dict[str, dict] = {}
        self._kill_at: Optional[Tuple[float, int]] = None    # (monotonic deadline, worker pid)
        self._timer: Optional[threading.Timer] = None
        self._mutex = threading.Lock()
        self._pidfd = -1

    def attach(self, server: Any) -> None:
        self._server = server
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        server.register(self._wake_r, selectors.EVENT_READ, self._on_wake)
        self.registrar = Registrar(port=server.address[1], on_connection=self._hand_over,
                                   **self._args).start()

    # registrar thread -> loop thread
    def _hand_over(self, sock: socket.socket) -> None:
        with self._mutex:
            self._adopt.append(sock)
        self._wake()

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass

    def _on_wake(self, fd: int, mask: int) -> None:
        try:
            os.read(fd, 512)
        except OSError:
            pass
        with self._mutex:
            adopt, self._adopt = self._adopt, []
            kill_at = self._kill_at
        for sock in adopt:
            self._server.adopt(sock, "reverse-relay")
        if kill_at is not None and time.monotonic() >= kill_at[0] and self._server.busy:
            log.info("session ran past its grant's session_timeout: killing worker %d", kill_at[1])
            self._kill_at = None
            try:
                os.kill(kill_at[1], signal.SIGKILL)
            except ProcessLookupError:
                pass

    # server loop thread
    def check_match(self, match: Optional[str], hello: Dict[str, Any]) -> bool:
        terms = self.registrar.accept_match(match) if self.registrar is not None else None
        if terms is None:
            return False
        self._terms[match] = terms       # type: ignore[index]
        while len(self._terms) > 64:     # accepted clients that left the device's queue before their session
            del self._terms[next(iter(self._terms))]
        return True

    def session_started(self, info: Dict[str, Any]) -> None:
        match = info.get("match")
        terms = self._terms.pop(match, None) if isinstance(match, str) else None
        if self.registrar is not None:
            self.registrar.session_started(match)
        limit = terms.get("session_timeout") if terms else None
        if limit and info.get("pid"):
            with self._mutex:
                self._kill_at = (time.monotonic() + limit, int(info["pid"]))
            self._timer = threading.Timer(limit, self._wake)
            self._timer.daemon = True
            self._timer.start()
        self._watch_worker(info.get("pid"))

    def _watch_worker(self, pid: Any) -> None:
        # A pidfd turns readable when the worker exits (without reaping it), which wakes the server loop at
        # once; it then reaps on its own and calls session_ended. Without it the loop notices on its next tick
        # (tens of ms), which is most of the handoff time between two clients. Linux >= 5.3 only.
        if not isinstance(pid, int) or not hasattr(os, "pidfd_open") or self._server is None:
            return
        self._close_pidfd()
        try:
            self._pidfd = os.pidfd_open(pid)
            self._server.register(self._pidfd, selectors.EVENT_READ, self._on_worker_exit)
        except (OSError, ValueError, KeyError):
            self._close_pidfd()

    def _on_worker_exit(self, fd: int, mask: int) -> None:
        self._close_pidfd()

    def _close_pidfd(self) -> None:
        if self._pidfd >= 0:
            try:
                self._server.unregister(self._pidfd)
            except (KeyError, ValueError):
                pass
            os.close(self._pidfd)
            self._pidfd = -1

    def session_ended(self, info: Dict[str, Any]) -> None:
        with self._mutex:
            self._kill_at = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._close_pidfd()
        if self.registrar is not None:
            self.registrar.session_ended()

    def after_fork_child(self) -> None:
        if self.registrar is not None:
            self.registrar.after_fork()
        for fd in (self._wake_r, self._wake_w, self._pidfd):
            if fd >= 0:
                os.close(fd)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._close_pidfd()
        if self.registrar is not None:
            self.registrar.close()
            self.registrar = None
        for fd in (self._wake_r, self._wake_w):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._wake_r = self._wake_w = -1


def _raise_if_error(msg_type: int, payload: dict) -> None:
    if msg_type == p.MsgType.ERROR:
        text = "%s: %s" % (payload.get("type"), payload.get("message"))
        if payload.get("type") == p.ErrorType.AUTHENTICATION:
            raise AuthenticationError("tracker refused: " + text)
        raise ConnectionClosed("tracker sent an error: " + text)
