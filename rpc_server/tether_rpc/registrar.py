"""A device server's link to the tracker: registration, heartbeats, match tokens, and reverse-mode dial-out.

Everything here is event driven and thread-free, because it runs inside the device server's parent process, which
forks a worker per session: a thread alive at fork time can leave a lock held in the worker, and under qemu-user a
child forked from a multi-threaded process aborts as soon as it starts a thread of its own (docs/emulation.md).

* :class:`Registrar` is a state machine over non-blocking sockets. It registers its sockets in a selector whose
  key data are callbacks (``key.data(fileobj, mask)``, the device server's convention) and needs :meth:`tick`
  called now and then: ``tick(now)`` runs due timers (connect and handshake deadlines, heartbeats, the silence
  check, reconnect backoff, dial deadlines) and returns when it next needs to be called::

    reg = Registrar(("tracker", 9190), key="rasp4b", port=server_port, token=None, reverse=False,
                    on_connection=adopt)                 # reverse mode: sockets it dialled out, for sessions
    reg.attach(selector)                                 # the server's selector; then call reg.tick(now)
    terms = reg.accept_match(hello["match"])             # None -> refuse; else {match, session_timeout, client}
    reg.session_started(match)                           # the session's WELCOME went out
    reg.session_ended()                                  # the worker is gone: re-register as free
    reg.after_fork()                                     # in a forked session worker: drop our descriptors
    reg.close()

  Outside a device server (a tool, a test) ``reg.start()`` drives the same machine from its own selector in a
  daemon thread; in that mode only :meth:`wait_registered` and :meth:`close` may be called from other threads.

* :class:`TrackerHook` adapts it to :class:`tether_rpc.hooks.ServerHook` (``rpc-server --tracker H:P --key K``
  loads it through :func:`make_hook`): it shares the server's selector, is ticked by the server's loop, hands
  reverse-mode sockets to :meth:`Server.adopt` and gives a granted session the grant's ``session_timeout`` through
  :meth:`Server.limit_session`.

A tracker given by name is looked up in a short-lived forked child (:class:`_Lookup`), never in the loop: a dead
DNS server must not stall the server. The link never gives up: a refused, lost, silent, garbage-speaking or
restarted tracker is retried forever with capped exponential backoff plus jitter, and every reconnect re-registers
with the server's current state. Nothing a tracker sends can raise out of the registrar into the server. Wire
format: :mod:`tether_rpc.tracker_protocol`, ``docs/tracker.md``.
"""
from __future__ import annotations

import errno
import logging
import os
import random
import selectors
import signal
import socket
import stat
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import msgpack

from . import protocol as p, tls, transport
from .config import ServerConfig, parse_hostport
from .error_mapping import HANDSHAKE_ERRORS, error_from_payload
from .errors import AuthenticationError, ProtocolError, TetherError
from .handshake import ClientHandshake
from .hooks import ServerHook
from .tracker_protocol import TRACKER_HANDSHAKE, TRACKER_LIMITS, TrackerMsg, check_match, hello_payload

log = logging.getLogger(__name__)

#: How long an acknowledged match token stays acceptable without a REVOKE (the tracker's grant window is 1 s).
MATCH_TTL = 30.0
MIN_BACKOFF = 0.1
#: A link that stayed up this long starts the backoff ladder again when it is lost.
STABLE_AFTER = 5.0
#: More unsent bytes than this means the tracker stopped reading: drop the link rather than buffer forever.
MAX_UNSENT = 1 << 20
MAX_DIALS = 16
_RECV_CHUNK = 64 << 10

_READ = selectors.EVENT_READ
_WRITE = selectors.EVENT_WRITE
_IN_PROGRESS = (errno.EINPROGRESS, errno.EWOULDBLOCK, errno.EALREADY, errno.EINTR)


class _LinkLost(Exception):
    """Internal: the tracker link is unusable; the message says why (logged once, then reconnect)."""


class _Lookup:
    """The tracker's host name looked up in a forked child, so a dead DNS server cannot stall the server's loop.

    The device server's parent is single-threaded, so forking it is safe (and, copy-on-write, cheap). The child
    closes its copies of every socket (a peer must see the parent's close at once), resolves, writes the
    addresses to a pipe as msgpack and exits; the parent reads the pipe from its selector and reaps the child.
    """

    def __init__(self, host: str, port: int):
        r, w = os.pipe()
        try:
            self.pid = os.fork()
        except OSError:
            os.close(r)
            os.close(w)
            raise
        if self.pid == 0:  # the child: never returns
            self._child(w, host, port)
        os.close(w)
        os.set_blocking(r, False)
        self.fd = r
        self.data = bytearray()

    @staticmethod
    def _child(w: int, host: str, port: int) -> None:
        try:
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            try:
                fds = [int(name) for name in os.listdir("/proc/self/fd")]
            except OSError:
                fds = []
            for fd in fds:
                try:
                    if fd != w and stat.S_ISSOCK(os.fstat(fd).st_mode):
                        os.close(fd)
                except OSError:
                    pass
            try:
                infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
                out = msgpack.packb([[family, list(sockaddr)] for family, _, _, _, sockaddr in infos])
            except (OSError, UnicodeError) as exc:
                out = msgpack.packb("cannot resolve the tracker host %r: %s" % (host, exc))
            os.write(w, out)
        finally:
            os._exit(0)

    def read(self) -> bool:
        """Take what the child wrote; True once it is done (end of file)."""
        try:
            chunk = os.read(self.fd, 65536)
        except (BlockingIOError, InterruptedError):
            return False
        if chunk and len(self.data) < (1 << 20):
            self.data += chunk
            return False
        return True

    def result(self) -> List[Tuple[int, Tuple[Any, ...]]]:
        try:
            value = msgpack.unpackb(bytes(self.data), raw=False)
        except Exception as exc:
            raise _LinkLost("the tracker host lookup failed: %s" % exc)
        if isinstance(value, str):
            raise _LinkLost(value)
        addrs = [(int(family), tuple(sockaddr)) for family, sockaddr in value
                 if isinstance(family, int) and isinstance(sockaddr, list) and sockaddr]
        if not addrs:
            raise _LinkLost("the tracker host lookup returned no address")
        return addrs

    def close(self) -> bool:
        """Stop and reap the child if it is done; False if it still has to be reaped later."""
        os.close(self.fd)
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        return _reaped(self.pid)


def _reaped(pid: int) -> bool:
    try:
        return os.waitpid(pid, os.WNOHANG)[0] != 0
    except ChildProcessError:
        return True


class _Dial:
    """A reverse-mode data connection being opened: non-blocking connect, then one RELAY frame, then adopt."""

    __slots__ = ("sock", "match", "deadline", "out", "connected")

    def __init__(self, sock: socket.socket, match: str, deadline: float):
        self.sock = sock
        self.match = match
        self.deadline = deadline
        self.out = p.encode_frame(TrackerMsg.RELAY, 0, {"match": match})
        self.connected = False


def _tls_wait(exc: BaseException) -> bool:
    """A non-blocking TLS socket's "try again when readable/writable" (not a failure)."""
    return tls.ssl is not None and isinstance(exc, (tls.ssl.SSLWantReadError, tls.ssl.SSLWantWriteError))


class Registrar:
    """One device's registration with one tracker, as a non-blocking state machine (see the module docstring).

    States: ``idle`` (waiting out the backoff) -> [``resolving``: a host name, looked up in a child] ->
    ``connecting`` -> ``hello`` -> [``auth``] -> ``register`` -> ``registered``; any failure goes back to ``idle``.
    """

    def __init__(self, tracker: Tuple[str, int], key: str, *, port: int, host: Optional[str] = None,
                 token: Optional[str] = None, tags: Optional[Dict[str, str]] = None,
                 info: Optional[Callable[[], dict]] = None, reverse: bool = False,
                 on_connection: Optional[Callable[[socket.socket], None]] = None, name: str = "",
                 connect_timeout: float = 5.0, max_backoff: float = 10.0, tls_context: Any = None):
        """``tls_context``: speak TLS to the tracker (tether_rpc.tls.client_context); not with ``reverse``."""
        if reverse and tls_context is not None:
            raise ValueError("a reverse-mode device cannot use a TLS tracker: the tracker relays raw bytes")
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
        self.tls_context = tls_context
        self.device_id: Optional[int] = None
        self.registrations = 0             # completed REGISTER exchanges, for tests and logs
        self.state = "idle"
        self._selector: Optional[selectors.BaseSelector] = None
        self._sock: Optional[socket.socket] = None
        self._events = 0
        self._buf = p.FrameBuffer(TRACKER_LIMITS, size=_RECV_CHUNK)
        self._out = bytearray()
        self._deadline = 0.0               # lookup / connect / handshake deadline
        self._state_since = 0.0
        self._retry_at = 0.0
        self._backoff = MIN_BACKOFF
        self._linked_at = 0.0
        self._last_heard = 0.0
        self._next_beat = 0.0
        self._heartbeat = 1.0
        self._handshake: Optional[ClientHandshake] = None
        self._addrs: List[Tuple[Any, ...]] = []
        self._addr: Optional[Tuple[Any, ...]] = None
        self._addr_failures = 0
        self._lookup: Optional[_Lookup] = None
        self._unreaped: List[int] = []     # lookup children killed or finished but not yet reaped
        self._expected: Dict[str, Tuple[float, dict]] = {}
        self._busy = False
        self._busy_match: Optional[str] = None
        self._sent_busy: Optional[bool] = None
        self._info_cache: Optional[dict] = None
        self._dials: Dict[int, _Dial] = {}
        self._registered = threading.Event()   # a flag other threads may wait on; never a thread itself
        self._closed = False
        self._stopping = False
        self._thread: Optional[threading.Thread] = None   # only in standalone mode (start())
        self._own_selector = False

    # ------------------------------------------------------------------------------------- server-facing API
    def attach(self, selector: selectors.BaseSelector) -> None:
        """Use ``selector`` (key data are ``callback(fileobj, mask)``); the first connect happens on the next tick."""
        self._selector = selector
        self._retry_at = 0.0

    def tick(self, now: Optional[float] = None) -> float:
        """Run due timers; returns the monotonic time by which the next tick is needed."""
        if now is None:
            now = time.monotonic()
        if self._closed or self._selector is None:
            return now + 3600.0
        try:
            self._timers(now)
        except _LinkLost as exc:
            self._lose(str(exc))
        except Exception:  # the registrar must never take the server down: log, drop the link, retry
            log.exception("registrar error")
            self._lose("internal error")
        return self._next_deadline(time.monotonic())

    def start(self) -> "Registrar":
        """Standalone mode: drive the machine from a private selector in a daemon thread (never in a server)."""
        if self._thread is None:
            self.attach(selectors.DefaultSelector())
            self._own_selector = True
            self._thread = threading.Thread(target=self._drive, name="tether-registrar", daemon=True)
            self._thread.start()
        return self

    def wait_registered(self, timeout: float) -> bool:
        return self._registered.wait(timeout)

    @property
    def registered(self) -> bool:
        return self.state == "registered"

    def accept_match(self, match: Optional[str]) -> Optional[dict]:
        """Consume a one-time match token from a HELLO; returns the grant's terms, or None to refuse."""
        if not isinstance(match, str):
            return None
        entry = self._expected.pop(match, None)
        if entry is None or entry[0] < time.monotonic():
            return None
        return entry[1]

    def session_started(self, match: Optional[str]) -> None:
        self._busy, self._busy_match = True, match
        if self.state == "registered":
            self._send_or_lose(TrackerMsg.SESSION, {"state": "started", "match": match})

    def session_ended(self) -> None:
        """The session is over: register again, so the tracker hands the device to the next client."""
        self._busy, self._busy_match = False, None
        if self.state == "registered":
            self._send_or_lose(TrackerMsg.REGISTER, self._register_payload())

    def _send_or_lose(self, msg_type: int, payload: dict) -> None:
        # called from the server's own code paths: a broken link must not raise there
        try:
            self._send(msg_type, payload)
        except _LinkLost as exc:
            self._lose(str(exc))

    def after_fork(self) -> None:
        """In a forked child: close our descriptors so only the parent speaks for the device.

        Only close, never unregister: the child's selector shares the parent's epoll instance, and an unregister
        here would silently remove the parent's registration.
        """
        for sock in [self._sock] + [d.sock for d in self._dials.values()]:
            if sock is not None:
                sock.close()
        if self._lookup is not None:
            os.close(self._lookup.fd)
            self._lookup = None
        self._unreaped = []             # not our children in the worker
        self._sock = None
        self._dials.clear()
        self._closed = True

    def close(self) -> None:
        """Drop the tracker link and any dial in progress (the tracker then removes the device at once)."""
        self._stopping = True
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5.0)      # the driver notices _stopping within one select timeout
        if self._closed and self._sock is None and not self._dials:
            return
        self._closed = True
        self._drop_link()
        for dial in list(self._dials.values()):
            self._drop_dial(dial)
        self._registered.clear()
        for pid in self._unreaped:       # killed lookup children: gone in a moment
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
        self._unreaped = []
        if self._own_selector and self._selector is not None:
            self._selector.close()

    def __enter__(self) -> "Registrar":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ----------------------------------------------------------------------------------------- standalone loop
    def _drive(self) -> None:
        selector = self._selector
        assert selector is not None
        while not self._stopping:
            timeout = max(0.0, min(0.1, self.tick() - time.monotonic()))
            for key, mask in selector.select(timeout):
                key.data(key.fileobj, mask)

    # --------------------------------------------------------------------------------------------- timers
    def _timers(self, now: float) -> None:
        if self._unreaped:
            self._unreaped = [pid for pid in self._unreaped if not _reaped(pid)]
        state = self.state
        if state == "idle":
            if now >= self._retry_at:
                self._connect(now)
        elif state == "registered":
            if now - self._last_heard > 3 * self._heartbeat + 2.0:
                raise _LinkLost("no word from the tracker for %.1f s" % (now - self._last_heard))
            if now >= self._next_beat:
                self._send(TrackerMsg.HEARTBEAT, {})
                self._next_beat = now + self._heartbeat
        elif now >= self._deadline:
            what = {"resolving": "the lookup of the tracker host %r did not finish" % self.tracker[0],
                    "connecting": "the tracker did not accept the connection"}.get(
                state, "the tracker did not complete the handshake")
            raise _LinkLost("%s within %.1f s" % (what, self._deadline - self._state_since))
        for dial in [d for d in self._dials.values() if now >= d.deadline]:
            log.warning("reverse dial to the tracker for match %.8s... timed out after %.1f s", dial.match,
                        self.connect_timeout)
            self._drop_dial(dial)

    def _next_deadline(self, now: float) -> float:
        state = self.state
        if state == "idle":
            nxt = self._retry_at
        elif state == "registered":
            nxt = min(self._next_beat, self._last_heard + 3 * self._heartbeat + 2.0)
        else:
            nxt = self._deadline
        for dial in self._dials.values():
            nxt = min(nxt, dial.deadline)
        if self._unreaped:
            nxt = min(nxt, now + 0.05)
        return max(nxt, now)

    # ------------------------------------------------------------------------------------------ connecting
    def _numeric_address(self) -> Optional[List[Tuple[Any, ...]]]:
        host, port = self.tracker
        try:  # a numeric address never blocks
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_NUMERICHOST)
        except (socket.gaierror, UnicodeError):
            return None
        return [(family, sockaddr) for family, _, _, _, sockaddr in infos]

    def _connect(self, now: float) -> None:
        if self._info_cache is None:
            self._register_payload()   # gather device info before the connection exists, not while it waits
        if not self._addrs or self._addr_failures >= 3:
            numeric = self._numeric_address()
            if numeric is None:      # a name: look it up in a child; _on_lookup connects when it is done
                try:
                    self._lookup = _Lookup(self.tracker[0], self.tracker[1])
                except OSError as exc:
                    raise _LinkLost("cannot start the tracker host lookup: %s" % exc)
                self.state = "resolving"
                self._state_since = now
                self._deadline = now + max(self.connect_timeout, 10.0)   # resolvers retry for several seconds
                assert self._selector is not None
                self._selector.register(self._lookup.fd, _READ, self._on_lookup)
                return
            self._addrs = numeric
            self._addr_failures = 0
        self._open(now)

    def _on_lookup(self, fd: int, mask: int) -> None:
        lookup = self._lookup
        if lookup is None or lookup.fd != fd or not lookup.read():
            return
        try:
            self._end_lookup()
            self._addrs = lookup.result()
            self._addr_failures = 0
            self._open(time.monotonic())
        except _LinkLost as exc:
            self._lose(str(exc))
        except Exception:
            log.exception("registrar error")
            self._lose("internal error")

    def _end_lookup(self) -> None:
        lookup, self._lookup = self._lookup, None
        if lookup is not None:
            if self._selector is not None:
                try:
                    self._selector.unregister(lookup.fd)
                except (KeyError, ValueError):
                    pass
            if not lookup.close():
                self._unreaped.append(lookup.pid)

    def _open(self, now: float) -> None:
        family, sockaddr = self._addrs[0]
        self._addrs.append(self._addrs.pop(0))   # the next attempt tries the next address
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setblocking(False)
        err = sock.connect_ex(sockaddr)
        if err not in (0,) + _IN_PROGRESS:
            sock.close()
            self._addr_failures += 1
            raise _LinkLost(os.strerror(err))
        self._sock = sock
        self._addr = (family, sockaddr)
        self._buf = p.FrameBuffer(TRACKER_LIMITS, size=_RECV_CHUNK)
        self._out = bytearray()
        self._sent_busy = None
        self.state = "connecting"
        self._state_since = now
        self._deadline = now + self.connect_timeout
        self._events = _WRITE
        assert self._selector is not None
        self._selector.register(sock, _WRITE, self._on_link)

    def _on_link(self, sock: socket.socket, mask: int) -> None:
        if sock is not self._sock:
            return
        try:
            if self.state == "connecting":
                if mask & (_WRITE | _READ):
                    self._connected()
                return
            if self.state == "tls":
                self._tls_step()
                return
            if mask & _WRITE:
                self._flush()
            if mask & _READ:
                self._receive()
        except _LinkLost as exc:
            self._lose(str(exc))
        except AuthenticationError as exc:
            log.error("tracker %s:%d refused this device: %s (retrying)", self.tracker[0], self.tracker[1], exc)
            self._lose(None)
        except (TetherError, OSError) as exc:
            self._lose("%s: %s" % (type(exc).__name__, exc))
        except Exception:  # a bug must not take the server down: log, drop the link, retry
            log.exception("registrar error")
            self._lose("internal error")

    def _connected(self) -> None:
        assert self._sock is not None
        err = self._sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if err:
            raise _LinkLost(os.strerror(err))
        transport.configure_socket(self._sock)
        self._addr_failures = 0
        if self.tls_context is not None:
            assert self._selector is not None
            self._selector.unregister(self._sock)
            self._sock = self.tls_context.wrap_socket(self._sock, server_hostname=self.tracker[0],
                                                      do_handshake_on_connect=False)
            self._events = _READ
            self._selector.register(self._sock, _READ, self._on_link)
            self.state = "tls"
            self._state_since = time.monotonic()
            self._deadline = self._state_since + self.connect_timeout
            self._tls_step()
            return
        self._start_hello()

    def _tls_step(self) -> None:
        """One step of the non-blocking TLS handshake; the tether HELLO follows when it is done."""
        assert self._sock is not None
        try:
            self._sock.do_handshake()
        except tls.ssl.SSLWantReadError:
            self._set_events(_READ)
            return
        except tls.ssl.SSLWantWriteError:
            self._set_events(_WRITE)
            return
        except (OSError, ValueError) as exc:
            raise _LinkLost("TLS handshake with the tracker failed: %s" % exc)
        self._start_hello()

    def _start_hello(self) -> None:
        self.state = "hello"
        self._state_since = time.monotonic()
        self._deadline = self._state_since + self.connect_timeout
        self._set_events(_READ)
        self._handshake = ClientHandshake(TRACKER_HANDSHAKE, hello_payload("device", self.name), self.token,
                                          peer="the tracker",
                                          token_hint="set TETHER_TRACKER_TOKEN for this device server")
        self._send_frame(self._handshake.hello_frame())

    # --------------------------------------------------------------------------------------------- I/O
    def _set_events(self, events: int) -> None:
        if events != self._events and self._sock is not None and self._selector is not None:
            self._selector.modify(self._sock, events, self._on_link)
            self._events = events

    def _send(self, msg_type: int, payload: dict) -> None:
        """Queue one frame; sent at once if the socket takes it, else when it turns writable."""
        self._send_frame(p.encode_frame(msg_type, 0, payload))

    def _send_frame(self, frame: bytes) -> None:
        if self._sock is None or self.state in ("connecting", "tls"):
            return
        self._out += frame
        if len(self._out) > MAX_UNSENT:
            raise _LinkLost("the tracker stopped reading (%d bytes unsent)" % len(self._out))
        self._flush()

    def _flush(self) -> None:
        assert self._sock is not None
        if self._out:
            try:
                n = self._sock.send(self._out)
            except (BlockingIOError, InterruptedError):
                n = 0
            except OSError as exc:
                if _tls_wait(exc):
                    n = 0
                else:
                    raise _LinkLost("send to the tracker failed: %s" % exc)
            del self._out[:n]
        self._set_events(_READ | _WRITE if self._out else _READ)

    def _receive(self) -> None:
        assert self._sock is not None
        for _ in range(16):  # bounded: a chatty tracker cannot starve the server's other connections
            try:
                n = self._sock.recv_into(self._buf.free_space(_RECV_CHUNK), _RECV_CHUNK)
            except (BlockingIOError, InterruptedError):
                break
            except OSError as exc:
                if _tls_wait(exc):
                    break
                raise _LinkLost("connection lost: %s" % exc)
            if n == 0:
                raise _LinkLost("the tracker closed the connection")
            self._buf.wrote(n)
            self._last_heard = time.monotonic()
            while self._sock is not None:
                frame = self._buf.next_frame()
                if frame is None:
                    break
                self._on_frame(*frame)
            if self._sock is None or (n < _RECV_CHUNK and not (tls.is_tls(self._sock) and self._sock.pending())):
                break   # (a TLS socket may hold decrypted bytes the selector cannot see: read them first)

    # ------------------------------------------------------------------------------------------ protocol
    def _on_frame(self, msg_type: int, request_id: int, payload: dict) -> None:
        if msg_type == p.MsgType.ERROR:
            raise error_from_payload(payload, HANDSHAKE_ERRORS, "tracker refused: ")
        if self.state in ("hello", "auth"):
            self._on_handshake(msg_type, payload)
            return
        handler = self._HANDLERS.get((self.state, msg_type))
        if handler is None:
            raise ProtocolError("tracker sent message type %d to a device in state %s" % (msg_type, self.state))
        handler(self, payload)

    def _on_handshake(self, msg_type: int, payload: dict) -> None:
        assert self._handshake is not None
        reply = self._handshake.on_frame(msg_type, payload)
        if reply is not None:
            self.state = "auth"
            self._send_frame(reply)
        elif self._handshake.welcome is not None:
            self.state = "register"
            self._send_register()

    def _send_register(self) -> None:
        self._sent_busy = self._busy
        self._send(TrackerMsg.REGISTER, self._register_payload())

    def _on_registered(self, payload: dict) -> None:
        device = payload.get("device")
        self.device_id = device if isinstance(device, int) else None
        hb = payload.get("heartbeat", 1.0)
        self._heartbeat = float(hb) if isinstance(hb, (int, float)) and 0.05 <= hb <= 60 else 1.0
        now = time.monotonic()
        self.state = "registered"
        self._linked_at = now
        self._next_beat = now + self._heartbeat
        self.registrations += 1
        self._registered.set()
        log.info("registered with tracker %s:%d as device %s (key %s)", self.tracker[0], self.tracker[1],
                 self.device_id, self.key)
        if self._sent_busy != self._busy:   # a session started or ended while the REGISTER was in flight
            self._send_register()

    def _on_expect(self, payload: dict) -> None:
        match = check_match(payload)
        session_timeout = payload.get("session_timeout")
        if isinstance(session_timeout, bool) or not (isinstance(session_timeout, (int, float))
                                                     and 0 < session_timeout < float("inf")):
            session_timeout = None        # no limit from the tracker; the server's own --session-timeout holds
        terms = {"match": match, "client": str(payload.get("client", ""))[:128],
                 "session_timeout": float(session_timeout) if session_timeout is not None else None}
        now = time.monotonic()
        for old in [m for m, (dl, _) in self._expected.items() if dl < now]:
            del self._expected[old]
        if len(self._expected) >= 64:     # a tracker flooding EXPECTs cannot grow this without bound
            del self._expected[next(iter(self._expected))]
        self._expected[match] = (now + MATCH_TTL, terms)
        self._send(TrackerMsg.EXPECTED, {"match": match})

    def _on_revoke(self, payload: dict) -> None:
        match = payload.get("match")
        if isinstance(match, str):
            self._expected.pop(match, None)

    def _on_dial(self, payload: dict) -> None:
        match = check_match(payload)
        if not self.reverse or self.on_connection is None:
            raise ProtocolError("tracker asked a device that is not in reverse mode to dial back")
        self._dial(match)

    def _ignore(self, payload: dict) -> None:
        pass

    _HANDLERS: Dict[Tuple[str, int], Callable[["Registrar", dict], None]] = {
        ("register", TrackerMsg.REGISTERED): _on_registered,
        ("registered", TrackerMsg.EXPECT): _on_expect,
        ("registered", TrackerMsg.REVOKE): _on_revoke,
        ("registered", TrackerMsg.DIAL): _on_dial,
        ("registered", TrackerMsg.HEARTBEAT): _ignore,    # the tracker's echo: _last_heard is all it is for
        ("registered", TrackerMsg.REGISTERED): _ignore,
    }

    def _register_payload(self) -> dict:
        # device info is gathered once (it reads /proc and /sys: ~0.2 s) and re-sent on every re-registration
        if self._info_cache is None:
            self._info_cache = {}
            if self.info is not None:
                try:
                    self._info_cache = self.info()
                except Exception:  # device info is a courtesy; never let it stop registration
                    log.exception("device info failed; registering without it")
        payload = {"key": self.key, "port": 0 if self.reverse else self.port, "tags": self.tags,
                   "info": self._info_cache, "reverse": self.reverse, "state": "busy" if self._busy else "free"}
        if self.host:
            payload["host"] = self.host
        return payload

    # ---------------------------------------------------------------------------------------- losing the link
    def _drop_link(self) -> None:
        self._end_lookup()
        sock, self._sock = self._sock, None
        if sock is not None:
            if self._selector is not None:
                try:
                    self._selector.unregister(sock)
                except (KeyError, ValueError):
                    pass
            sock.close()
        self._out = bytearray()
        self._events = 0

    def _lose(self, why: Optional[str]) -> None:
        """Drop the link and schedule a reconnect (capped exponential backoff with jitter)."""
        was_registered = self.state == "registered"
        if self.state == "connecting":
            self._addr_failures += 1   # after a few, the address is looked up again
        self._drop_link()
        self._expected.clear()
        self._registered.clear()
        now = time.monotonic()
        if was_registered and now - self._linked_at > STABLE_AFTER:
            self._backoff = MIN_BACKOFF   # we were connected for a while: the next loss starts the ladder again
        delay = self._backoff * (0.5 + random.random())
        self._backoff = min(self._backoff * 2, self.max_backoff)
        self.state = "idle"
        self._retry_at = now + delay
        if why is not None and not self._closed:
            log.info("tracker %s:%d unreachable or lost: %s (retrying in %.2f s)", self.tracker[0], self.tracker[1],
                     why, delay)

    # ------------------------------------------------------------------------------------- reverse-mode dial
    def _dial(self, match: str) -> None:
        if len(self._dials) >= MAX_DIALS:
            log.warning("%d reverse dials already open: ignoring DIAL for match %.8s...", len(self._dials), match)
            return
        if self._addr is None:
            log.warning("DIAL before the tracker's address is known: ignored")
            return
        family, sockaddr = self._addr
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setblocking(False)
        err = sock.connect_ex(sockaddr)
        if err not in (0,) + _IN_PROGRESS:
            sock.close()
            log.warning("reverse dial to the tracker failed: %s", os.strerror(err))
            return
        dial = _Dial(sock, match, time.monotonic() + self.connect_timeout)
        self._dials[sock.fileno()] = dial
        assert self._selector is not None
        self._selector.register(sock, _WRITE, self._on_dial_ready)

    def _on_dial_ready(self, sock: socket.socket, mask: int) -> None:
        dial = self._dials.get(sock.fileno())
        if dial is None or dial.sock is not sock:
            return
        try:
            if not dial.connected:
                err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if err:
                    raise OSError(err, os.strerror(err))
                transport.configure_socket(sock)
                dial.connected = True
            n = sock.send(dial.out)
            dial.out = dial.out[n:]
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            log.warning("reverse dial to the tracker failed: %s", exc)
            self._drop_dial(dial)
            return
        if dial.out:
            return            # the rest of RELAY goes when the socket is writable again
        del self._dials[sock.fileno()]
        assert self._selector is not None
        self._selector.unregister(sock)
        assert self.on_connection is not None
        try:
            self.on_connection(sock)     # the server now owns it; the tracker forwards the client's HELLO
        except Exception:
            log.exception("the server refused a reverse-mode connection")
            sock.close()

    def _drop_dial(self, dial: _Dial) -> None:
        self._dials.pop(dial.sock.fileno(), None)
        if self._selector is not None:
            try:
                self._selector.unregister(dial.sock)
            except (KeyError, ValueError):
                pass
        dial.sock.close()


# ---------------------------------------------------------------------------------------------------------------
# the device server's hook (tether_rpc.hooks.ServerHook)

def _device_info() -> dict:
    from . import device_info

    info = device_info.device_info()
    os_info = info.get("os")
    if isinstance(os_info, dict):
        # a flat "os" string makes the os=linux / os=android tag work
        info = dict(info, os="android" if os_info.get("android") else str(os_info.get("system", "")).lower(),
                    os_details=os_info)
    return info


def make_hook(config: ServerConfig) -> "TrackerHook":
    """The tracker hook for :func:`tether_rpc.server.serve`."""
    tracker_tls = tls.client_context(config.tracker_tls or None, config.tracker_ca)
    return TrackerHook(parse_hostport(config.tracker), config.key, token=config.tracker_token, tags=config.tags,
                       reverse=bool(config.reverse), advertise_host=config.advertise_host, tls_context=tracker_tls)


class TrackerHook(ServerHook):
    """Registers the server with a tracker; accepts only sessions the tracker granted. Runs in the server loop."""

    def __init__(self, tracker: Tuple[str, int], key: str, *, token: Optional[str] = None,
                 tags: Optional[Dict[str, str]] = None, reverse: bool = False,
                 advertise_host: Optional[str] = None, info: Optional[Callable[[], dict]] = _device_info,
                 connect_timeout: float = 5.0, max_backoff: float = 10.0, tls_context: Any = None):
        self._args = dict(tracker=tracker, key=key, token=token, tags=tags, reverse=reverse,
                          host=advertise_host, info=info, connect_timeout=connect_timeout, max_backoff=max_backoff,
                          tls_context=tls_context)
        self.registrar: Optional[Registrar] = None
        self._server: Any = None
        self._terms: Dict[str, dict] = {}

    def attach(self, server: Any) -> None:
        self._server = server
        self.registrar = Registrar(port=server.address[1], on_connection=self._adopt, **self._args)
        self.registrar.attach(server.selector)

    def _adopt(self, sock: socket.socket) -> None:
        self._server.adopt(sock, "reverse-relay")

    def tick(self, now: float) -> Optional[float]:
        return self.registrar.tick(now) if self.registrar is not None else None

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
        limit = terms.get("session_timeout") if terms else None
        if limit and self._server is not None and hasattr(self._server, "limit_session"):
            self._server.limit_session(limit)   # the server ends it with ERROR TetherTimeout
        if self.registrar is not None:
            self.registrar.session_started(match)

    def session_ended(self, info: Dict[str, Any]) -> None:
        if self.registrar is not None:
            self.registrar.session_ended()

    def after_fork_child(self) -> None:
        if self.registrar is not None:
            self.registrar.after_fork()

    def close(self) -> None:
        if self.registrar is not None:
            self.registrar.close()
            self.registrar = None
