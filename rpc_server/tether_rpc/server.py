"""The device server: one selectors loop in the parent, one forked worker per session.

The parent never runs user code. It accepts connections, runs every handshake without blocking (a silent or
hostile connection costs one fd until its handshake timeout, and never delays anyone else), admits one session at
a time (the rest wait in a queue and are told their position, or are refused with DeviceBusy), forks a worker for
the session with its own temporary folder, and reaps it:

* a worker killed by a signal (a segfaulting kernel) -> the client gets ERROR SessionCrashed naming the signal;
* a session that outlives ``session_timeout`` -> SIGKILL, and ERROR TetherTimeout;
* however the session ends, its folder is deleted and the next queued client is admitted.

Fork, not spawn: spawn re-executes the interpreter, which fails under qemu-user; fork also hands the worker a
warm interpreter (numpy and the runtime are imported before the first session).

The worker is :mod:`tether_rpc.worker`; the configuration, and the environment it reads, :mod:`tether_rpc.config`.

Pluggable components (the tracker registration, :mod:`tether_rpc.registrar`) subclass
:class:`tether_rpc.hooks.ServerHook`: they may add their own
connections to the loop's selector, validate the tracker ``match`` token a client sends in HELLO, hand the server
connections they dialled themselves (:meth:`Server.adopt`), and are told when sessions start and end. Hooks run
in the loop and must not block or start threads (the loop forks; a lock held by another thread at fork time
would stay locked in the worker).
"""
from __future__ import annotations

import errno
import importlib
import logging
import os
import selectors
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
import traceback
from collections import deque
from typing import Any, Callable, Deque, Dict, List, Optional, Tuple

from . import __version__
from . import handshake, protocol as p, tls, transport
from .config import (DEFAULT_IDLE_TIMEOUT, DEFAULT_SESSION_TIMEOUT, DEFAULT_SPIN, ServerConfig, ServerConfigError,
                     check_config, config_from_options)
from .error_mapping import error_payload
from .errors import AuthenticationError, DeviceBusy, ProtocolError, TetherTimeout
from .hooks import ServerHook
from .limits import call_timeout_message
from .registrar import make_hook
from .worker import CALL_TIMEOUT_EXIT, die_with_parent, run_session

log = logging.getLogger(__name__)

SERVER_NAME = "tether-rpc/" + __version__

_LOOP_TICK = 0.05  # how often the loop reaps workers and checks deadlines (bounds "server free again" latency)
#: Watch workers through a pidfd when the kernel has them (Linux >= 5.3); otherwise, or with this off, SIGCHLD
#: wakes the loop through signal.set_wakeup_fd. (A module switch so tests can force the fallback.)
_USE_PIDFD = True


def _on_sigchld(signum: int, frame: Any) -> None:
    pass  # the wake-up fd has been written already; the loop reaps after select() returns


_PIDFD_OK: Optional[bool] = None


def _pidfd_works() -> bool:
    """os.pidfd_open exists and the kernel supports it (Python may have it on a kernel that does not)."""
    global _PIDFD_OK
    if not _USE_PIDFD:
        return False
    if _PIDFD_OK is None:
        try:
            os.close(os.pidfd_open(os.getpid()))
            _PIDFD_OK = True
        except (AttributeError, OSError):
            _PIDFD_OK = False
    return _PIDFD_OK


def _signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return "signal %d" % sig


class _Conn:
    """A connection in the parent: handshaking, queued, or handed to a worker."""

    __slots__ = ("sock", "peer", "buffer", "deadline", "state", "nonce", "proof", "hello", "session_id", "tls_wait")

    def __init__(self, sock: socket.socket, peer: Any, deadline: float):
        self.sock = sock
        self.peer = peer
        self.buffer = p.FrameBuffer(p.HANDSHAKE_LIMITS, size=4096)
        self.deadline = deadline
        self.state = "hello"
        self.nonce = b""
        self.proof: Optional[bytes] = None
        self.hello: Dict[str, Any] = {}
        self.session_id = 0
        self.tls_wait = False        # the TLS handshake is still under way


class _Active:
    __slots__ = ("conn", "pid", "folder", "started", "deadline", "timed_out", "info", "limit", "pidfd")

    def __init__(self, conn: _Conn, pid: int, folder: str, deadline: Optional[float], info: Dict[str, Any]):
        self.conn = conn
        self.pid = pid
        self.folder = folder
        self.started = time.monotonic()
        self.deadline = deadline
        self.timed_out = False
        self.info = info
        self.limit = None if deadline is None else deadline - self.started   # seconds, for the timeout message
        self.pidfd = -1


class Server:
    """Listening socket + selector loop. Use as a context manager; ``serve_forever`` runs until ``stop``."""

    def __init__(self, config: ServerConfig):
        check_config(config)
        self.config = config
        self._tls = tls.server_context(config.tls_cert, config.tls_key) if config.tls_cert else None
        self.selector = selectors.DefaultSelector()
        self.listener = self._bind(config)
        self.address: Tuple[str, int] = self.listener.getsockname()[:2]
        self.listener.setblocking(False)
        self.selector.register(self.listener, selectors.EVENT_READ, self._on_accept)
        self._pending: Dict[int, _Conn] = {}
        self._queue: Deque[_Conn] = deque()
        self._active: Optional[_Active] = None
        self._sessions = 0
        self._stopping = False
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self.selector.register(self._wake_r, selectors.EVENT_READ, self._on_wake)
        self.hooks: List[ServerHook] = list(config.hooks)
        self._closed = False

    # -- set-up ------------------------------------------------------------------------------------------------
    @staticmethod
    def _bind(config: ServerConfig) -> socket.socket:
        last = 0
        single = not config.port_end or config.port_end < config.port or config.port == 0
        end = config.port if single else config.port_end
        infos = socket.getaddrinfo(config.host, None, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, _, _, _, sockaddr = infos[0]
        for port in range(config.port, end + 1):
            sock = socket.socket(family, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((sockaddr[0], port) + tuple(sockaddr[2:]))
                sock.listen(socket.SOMAXCONN)
                return sock
            except OSError as exc:
                sock.close()
                last = exc.errno or 0
                if exc.errno != errno.EADDRINUSE:
                    raise
        raise ServerConfigError("no free port in %d..%d on %s (%s)" % (config.port, end, config.host,
                                                                       os.strerror(last)))

    def __enter__(self) -> "Server":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- public API for hooks ----------------------------------------------------------------------------------
    def register(self, fileobj: Any, events: int, callback: Callable[[Any, int], None]) -> None:
        """Watch ``fileobj``; ``callback(fileobj, mask)`` runs in the loop when it is ready."""
        self.selector.register(fileobj, events, callback)

    def unregister(self, fileobj: Any) -> None:
        self.selector.unregister(fileobj)

    def adopt(self, sock: socket.socket, peer: Any = "adopted") -> None:
        """Serve an already connected socket (e.g. one a reverse-mode hook dialled) as if it had been accepted."""
        self._new_conn(sock, peer)

    def limit_session(self, seconds: float) -> None:
        """Shorten the running session's time limit (e.g. to a tracker grant's session_timeout); when it runs
        out the worker is killed and the client gets ERROR TetherTimeout."""
        active = self._active
        if active is None or seconds <= 0:
            return
        deadline = active.started + seconds
        if active.deadline is None or deadline < active.deadline:
            active.deadline, active.limit = deadline, seconds

    @property
    def busy(self) -> bool:
        return self._active is not None

    def stop(self) -> None:
        """Ask the loop to finish (safe from a signal handler or another thread)."""
        self._stopping = True
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass

    # -- the loop ----------------------------------------------------------------------------------------------
    def serve_forever(self) -> None:
        for hook in self.hooks:
            hook.attach(self)
        restore_signals = self._wake_on_sigchld() if not _pidfd_works() else None
        try:
            self._serve_loop()
        finally:
            if restore_signals is not None:
                restore_signals()

    def _wake_on_sigchld(self) -> Optional[Callable[[], None]]:
        """Without pidfds, a worker's exit would wait for the next loop tick: make SIGCHLD write to the wake-up
        pipe instead (signal.set_wakeup_fd). Main thread only, and only if no one else uses the wake-up fd.
        Returns what undoes it, or None."""
        if threading.current_thread() is not threading.main_thread():
            return None
        try:
            previous_fd = signal.set_wakeup_fd(self._wake_w)
        except (ValueError, OSError):
            return None
        if previous_fd != -1:  # someone else's (an event loop's): leave it to them, and live with the tick
            signal.set_wakeup_fd(previous_fd)
            return None
        # A Python-level handler (not SIG_IGN, which would auto-reap the workers and lose their exit status);
        # the C-level handler behind it writes the signal number to the wake-up fd, which wakes select().
        previous_handler = signal.signal(signal.SIGCHLD, _on_sigchld)
        log.debug("no pidfd: worker exits wake the loop through SIGCHLD")

        def restore() -> None:
            signal.signal(signal.SIGCHLD, previous_handler)
            signal.set_wakeup_fd(-1)
        return restore

    def _serve_loop(self) -> None:
        wake_at = self._tick_hooks()   # hooks start their timers (a tracker connect) without waiting a tick
        while not self._stopping:
            timeout = _LOOP_TICK if wake_at is None else min(_LOOP_TICK, max(0.0, wake_at - time.monotonic()))
            for key, mask in self.selector.select(timeout):
                try:
                    key.data(key.fileobj, mask)
                except Exception:  # a bug in one callback must not take the server down
                    log.exception("error in the server loop handling %r", key.fileobj)
            self._reap()
            self._check_deadlines()
            self._admit_next()
            wake_at = self._tick_hooks()

    def _tick_hooks(self) -> Optional[float]:
        now = time.monotonic()
        wake_at: Optional[float] = None
        for hook in self.hooks:
            try:
                due = hook.tick(now)
            except Exception:
                log.exception("server hook %r failed in tick", hook)
                continue
            if due is not None and (wake_at is None or due < wake_at):
                wake_at = due
        return wake_at

    def _on_wake(self, fd: int, mask: int) -> None:
        try:
            os.read(fd, 512)
        except OSError:
            pass

    def _on_accept(self, listener: socket.socket, mask: int) -> None:
        for _ in range(256):  # drain the backlog (bounded, so a flood cannot starve the rest of the loop)
            try:
                sock, peer = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # EMFILE and friends: keep serving the connections we have
                log.warning("accept failed: %s", exc)
                return
            self._new_conn(sock, peer)

    def _new_conn(self, sock: socket.socket, peer: Any) -> None:
        if len(self._pending) - len(self._queue) >= self.config.max_pending:
            # Evict the oldest handshake rather than refuse the newcomer: a flood of idle connections then
            # cannot lock real clients out for a whole handshake timeout.
            oldest = min((c for c in self._pending.values() if c.state in ("hello", "auth")),
                         key=lambda c: c.deadline, default=None)
            if oldest is not None:
                log.warning("%d handshakes pending: dropping the oldest, from %s", len(self._pending), oldest.peer)
                self._drop(oldest, quiet=True)
        transport.configure_socket(sock)
        sock.setblocking(False)
        if self._tls is not None:
            try:
                sock = self._tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
            except OSError as exc:
                log.info("TLS set-up for %s failed: %s", peer, exc)
                sock.close()
                return
        conn = _Conn(sock, peer, time.monotonic() + self.config.handshake_timeout)
        conn.tls_wait = self._tls is not None
        self._pending[sock.fileno()] = conn
        self.selector.register(sock, selectors.EVENT_READ, self._on_pending)
        log.debug("connection from %s", peer)

    def _drop(self, conn: _Conn, error: Optional[BaseException] = None, quiet: bool = False) -> None:
        if error is not None:
            if not quiet:
                log.info("closing %s: %s", conn.peer, error)
            self._send_nb(conn, p.encode_frame(p.MsgType.ERROR, 0, error_payload(error)))
            # Closing with unread input makes the kernel send RST, which can destroy the ERROR just sent:
            # swallow what has already arrived (bounded) first.
            for _ in range(16):
                try:
                    if not conn.sock.recv(4096):
                        break
                except OSError:
                    break
        self._pending.pop(conn.sock.fileno(), None)
        try:
            self._queue.remove(conn)
        except ValueError:
            pass
        try:
            self.selector.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        conn.sock.close()

    @staticmethod
    def _send_nb(conn: _Conn, data: bytes) -> bool:
        """Best-effort send of one small frame on a non-blocking socket; a peer that cannot take it is dead."""
        try:
            return conn.sock.send(data) == len(data)
        except OSError:
            return False

    def _on_pending(self, sock: socket.socket, mask: int) -> None:
        conn = self._pending.get(sock.fileno())
        if conn is None:
            return
        if conn.state == "queued":
            # A queued client has nothing to say; data or EOF both mean it gives up its place.
            self._drop(conn, quiet=True)
            self._notify_queue()
            return
        if conn.tls_wait:
            try:
                sock.do_handshake()  # (non-blocking: a step per readable event)
            except tls.ssl.SSLWantReadError:
                return
            except (OSError, ValueError) as exc:  # includes SSLError: not TLS, a bad certificate, ...
                log.info("TLS handshake with %s failed: %s", conn.peer, exc)
                self._drop(conn, quiet=True)
                return
            conn.tls_wait = False
        try:
            n = sock.recv_into(conn.buffer.free_space(1024), 1024)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            if tls.is_tls(sock) and isinstance(exc, (tls.ssl.SSLWantReadError, tls.ssl.SSLWantWriteError)):
                return
            n = 0
        if n == 0:
            self._drop(conn, quiet=True)
            return
        conn.buffer.wrote(n)
        if tls.is_tls(sock) and sock.pending():
            # decrypted bytes the selector cannot see (the rest of a record: at most 16 KiB, so this recursion is
            # bounded); the frames are decoded by the innermost call
            self._on_pending(sock, mask)
            return
        try:
            while conn.state in ("hello", "auth"):
                frame = conn.buffer.next_frame()
                if frame is None:
                    return
                self._handshake_step(conn, *frame)
        except (ProtocolError, AuthenticationError) as exc:
            self._drop(conn, exc)

    def _handshake_step(self, conn: _Conn, msg_type: int, request_id: int, payload: dict) -> None:
        if conn.state == "hello":
            if msg_type != p.MsgType.HELLO:
                raise ProtocolError("expected HELLO, got message type %d" % msg_type)
            conn.hello = handshake.check_hello(payload)
            if self.config.token:
                conn.nonce = handshake.make_nonce()
                conn.state = "auth"
                self._send_nb(conn, p.encode_frame(p.MsgType.CHALLENGE, 0,
                                                   {"algo": handshake.AUTH_ALGO, "nonce": conn.nonce}))
                return
        elif conn.state == "auth":
            if msg_type != p.MsgType.AUTH:
                raise ProtocolError("expected AUTH, got message type %d" % msg_type)
            client_nonce = handshake.check_auth(self.config.token or "", conn.nonce, payload)
            conn.proof = handshake.server_proof(self.config.token or "", conn.nonce, client_nonce)
        for hook in self.hooks:
            if not hook.check_match(conn.hello.get("match"), conn.hello):
                raise AuthenticationError("this device does not accept the session's match token %r"
                                          % (conn.hello.get("match"),))
        self._admit(conn)

    def _admit(self, conn: _Conn) -> None:
        if self._active is None and not self._queue:
            self._start_session(conn)
            return
        if not conn.hello.get("wait", True):
            self._drop(conn, DeviceBusy("the device is serving another session (%d waiting); connect with wait=True "
                                        "to queue" % len(self._queue)), quiet=True)
            return
        if len(self._queue) >= self.config.max_queue:
            self._drop(conn, DeviceBusy("the device's queue is full (%d waiting)" % len(self._queue)), quiet=True)
            return
        conn.state = "queued"
        self._queue.append(conn)
        self._send_nb(conn, p.encode_frame(p.MsgType.EVENT, 0, {"kind": "queued", "position": len(self._queue)}))

    def _notify_queue(self) -> None:
        for i, conn in enumerate(list(self._queue)):
            if not self._send_nb(conn, p.encode_frame(p.MsgType.EVENT, 0, {"kind": "queued", "position": i + 1})):
                self._drop(conn, quiet=True)

    def _admit_next(self) -> None:
        if self._active is None and self._queue and not self._stopping:
            conn = self._queue.popleft()
            self._start_session(conn)
            self._notify_queue()

    def _check_deadlines(self) -> None:
        now = time.monotonic()
        for conn in list(self._pending.values()):
            if conn.state in ("hello", "auth") and now > conn.deadline:
                self._drop(conn, TetherTimeout("no complete handshake within %.1f s" % self.config.handshake_timeout))
        active = self._active
        if active is not None and active.deadline is not None and now > active.deadline and not active.timed_out:
            log.info("session %d ran past its %.1f s timeout: killing worker %d", active.conn.session_id,
                     active.limit, active.pid)
            active.timed_out = True
            try:
                os.kill(active.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    # -- sessions ----------------------------------------------------------------------------------------------
    def _start_session(self, conn: _Conn) -> None:
        self._pending.pop(conn.sock.fileno(), None)
        try:
            self.selector.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        self._sessions += 1
        conn.session_id = self._sessions
        conn.state = "session"
        welcome = {"version": p.PROTOCOL_VERSION, "caps": list(p.CAPABILITIES), "server": SERVER_NAME,
                   "session": conn.session_id}
        if conn.proof is not None:
            welcome["proof"] = conn.proof
        folder = tempfile.mkdtemp(prefix="tether-session-%d-" % conn.session_id, dir=self.config.workdir)
        if not self._send_nb(conn, p.encode_frame(p.MsgType.WELCOME, 0, welcome)):
            shutil.rmtree(folder, ignore_errors=True)
            conn.sock.close()
            return
        try:
            pid = os.fork()
        except OSError as exc:  # out of processes or memory: refuse this session, keep serving
            log.error("cannot fork a session worker: %s", exc)
            shutil.rmtree(folder, ignore_errors=True)
            self._send_nb(conn, p.encode_frame(p.MsgType.ERROR, 0, {
                "type": p.ErrorType.SESSION_CRASHED, "traceback": "",
                "message": "the device could not start a session worker: %s" % exc}))
            conn.sock.close()
            return
        if pid == 0:  # the worker
            code = 1
            try:
                self._become_worker(conn)
                code = run_session(conn.sock, conn.buffer, folder, self.config.limits,
                                   idle_timeout=self.config.idle_timeout, spin=self.config.spin,
                                   session_limits=self.config.session_limits)
            except BaseException:  # never return into the parent's loop from a worker
                traceback.print_exc()
            finally:
                os._exit(code)
        deadline = time.monotonic() + self.config.session_timeout if self.config.session_timeout else None
        info = {"session": conn.session_id, "peer": conn.peer, "pid": pid, "folder": folder,
                "client": conn.hello.get("client"), "match": conn.hello.get("match")}
        self._active = _Active(conn, pid, folder, deadline, info)
        self._watch_worker(self._active)
        log.info("session %d for %s started in worker %d", conn.session_id, conn.peer, pid)
        for hook in self.hooks:
            hook.session_started(info)

    def _watch_worker(self, active: _Active) -> None:
        # A pidfd turns readable the moment the worker exits, which wakes the loop to reap it at once instead
        # of on its next tick: most of the handoff time between two clients otherwise. Linux >= 5.3 (else
        # SIGCHLD does it, see _wake_on_sigchld).
        if not _pidfd_works():
            return
        try:
            active.pidfd = os.pidfd_open(active.pid)
            self.selector.register(active.pidfd, selectors.EVENT_READ, self._on_worker_exit)
        except (OSError, ValueError, KeyError):
            self._unwatch_worker(active)

    def _on_worker_exit(self, fd: int, mask: int) -> None:
        pass  # waking the loop is the point; _reap runs right after the callbacks

    def _unwatch_worker(self, active: _Active) -> None:
        if active.pidfd >= 0:
            try:
                self.selector.unregister(active.pidfd)
            except (KeyError, ValueError):
                pass
            os.close(active.pidfd)
            active.pidfd = -1

    def _become_worker(self, conn: _Conn) -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)   # the parent decides when sessions end
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        try:
            signal.set_wakeup_fd(-1)  # the parent's wake-up pipe is closed below
        except ValueError:  # not the main thread: then it was never set
            pass
        die_with_parent()
        for hook in self.hooks:
            hook.after_fork_child()
        for other in list(self._pending.values()) + list(self._queue):
            other.sock.close()
        self.listener.close()
        os.close(self._wake_r)
        os.close(self._wake_w)
        self.selector.close()

    def _reap(self) -> None:
        active = self._active
        if active is None:
            return
        try:
            pid, status = os.waitpid(active.pid, os.WNOHANG)
        except ChildProcessError:
            pid, status = active.pid, 0
        if pid == 0:
            return
        self._end_session(active, status)

    def _end_session(self, active: _Active, status: int) -> None:
        self._active = None
        self._unwatch_worker(active)
        conn = active.conn
        error: Optional[Dict[str, Any]] = None
        if active.timed_out:
            error = {"type": p.ErrorType.TIMEOUT, "traceback": "",
                     "message": "the session ran past its session timeout of %s s and was ended" % active.limit}
        elif self.config.session_limits.call_timeout and (
                (os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGALRM)
                or (os.WIFEXITED(status) and os.WEXITSTATUS(status) == CALL_TIMEOUT_EXIT)):
            error = {"type": p.ErrorType.TIMEOUT, "traceback": "",
                     "message": call_timeout_message(self.config.session_limits.call_timeout)}
        elif os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            error = {"type": p.ErrorType.SESSION_CRASHED, "traceback": "",
                     "message": "the session worker died from %s (%d), probably in a kernel; the server keeps "
                                "serving, start a new session" % (_signal_name(sig), sig)}
        elif os.WIFEXITED(status) and os.WEXITSTATUS(status) != 0:
            error = {"type": p.ErrorType.SESSION_CRASHED, "traceback": "",
                     "message": "the session worker exited with status %d" % os.WEXITSTATUS(status)}
        if error is not None and tls.is_tls(conn.sock):
            # the worker advanced the TLS state this process holds a stale copy of: it cannot write a record
            log.warning("session %d: %s (over TLS only the worker can write to the client: a call timeout reached "
                        "it from there, anything else shows as a closed connection)", conn.session_id,
                        error["message"])
        elif error is not None:
            log.warning("session %d: %s", conn.session_id, error["message"])
            try:
                conn.sock.settimeout(0.5)
                conn.sock.sendall(p.encode_frame(p.MsgType.ERROR, 0, error))
            except OSError:
                pass
        conn.sock.close()
        shutil.rmtree(active.folder, ignore_errors=True)
        active.info["duration"] = time.monotonic() - active.started
        active.info["error"] = error["type"] if error else None
        log.info("session %d ended after %.3f s", conn.session_id, active.info["duration"])
        for hook in self.hooks:
            try:
                hook.session_ended(active.info)
            except Exception:
                log.exception("server hook %r failed in session_ended", hook)

    # -- shutdown ----------------------------------------------------------------------------------------------
    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        active = self._active
        if active is not None:
            try:
                os.kill(active.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            try:
                _, status = os.waitpid(active.pid, 0)
            except ChildProcessError:
                status = 0
            self._end_session(active, status)
        for conn in list(self._pending.values()) + list(self._queue):
            conn.sock.close()
        self._pending.clear()
        self._queue.clear()
        for hook in self.hooks:
            try:
                hook.close()
            except Exception:
                log.exception("server hook %r failed to close", hook)
        self.selector.close()
        self.listener.close()
        os.close(self._wake_r)
        os.close(self._wake_w)


# ---------------------------------------------------------------------------------------------------------------
# entry point shared by `python -m tether_rpc` and the `rpc-server` click command

def _preload_runtime() -> None:
    """Import the runtime once in the parent so every forked session starts warm."""
    for name in ("session", "ndarray", "module", "timing", "device_info", "parallel", "graph_executor"):
        try:
            importlib.import_module("tether_rpc." + name)
        except ImportError as exc:
            log.debug("runtime module tether_rpc.%s not available: %s", name, exc)
    try:  # what modules may need of this CPU (module.load_module checks it): read once, inherited by workers
        importlib.import_module("tether_rpc.device_info").cpu_capabilities()
    except Exception as exc:  # an odd /proc must not stop the server; the check then runs in the worker
        log.debug("CPU capabilities not read at start: %s", exc)


def serve(config: ServerConfig, ready: Optional[Callable[["Server"], None]] = None) -> None:
    """Run a device server until SIGINT/SIGTERM (or ``server.stop()``)."""
    check_config(config)
    if config.tracker:
        config.hooks.append(make_hook(config))
    t0 = time.perf_counter()
    with Server(config) as server:
        previous = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                previous[sig] = signal.signal(sig, lambda *_: server.stop())
        host, port = server.address[:2]
        log.info("tether rpc-server listening on %s:%d (start-up %.0f ms)", host, port,
                 1000 * (time.perf_counter() - t0))
        # Connections queue in the kernel's backlog meanwhile; forked sessions then start warm.
        t1 = time.perf_counter()
        _preload_runtime()
        log.info("runtime loaded in %.0f ms", 1000 * (time.perf_counter() - t1))
        if ready is not None:
            ready(server)
        try:
            server.serve_forever()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        log.info("tether rpc-server on %s:%d stopped", host, port)


def run(host: str = "127.0.0.1", port: int = 9090, port_end: Optional[int] = 9199, tracker: Optional[str] = None,
        key: Optional[str] = None, token: Optional[str] = None, insecure: bool = False,
        session_timeout: Optional[float] = DEFAULT_SESSION_TIMEOUT, workdir: Optional[str] = None,
        reverse: bool = False,
        handshake_timeout: float = 5.0, verbose: int = 0, tracker_token: Optional[str] = None,
        tags: Optional[List[str]] = None, advertise_host: Optional[str] = None,
        idle_timeout: Optional[float] = DEFAULT_IDLE_TIMEOUT, spin_us: float = DEFAULT_SPIN * 1e6,
        session_memory: Optional[str] = None, session_disk: Optional[str] = None,
        session_handles: Optional[int] = None, call_timeout: Optional[float] = None,
        tls_cert: Optional[str] = None, tls_key: Optional[str] = None, tracker_tls: bool = False,
        tracker_ca: Optional[str] = None) -> int:
    """The whole `rpc-server` / `python -m tether_rpc` command: logging, config, serve. Returns an exit code."""
    logging.basicConfig(level=logging.INFO if verbose < 2 else logging.DEBUG, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        serve(config_from_options(host=host, port=port, port_end=port_end, tracker=tracker, key=key, token=token,
                                  insecure=insecure, session_timeout=session_timeout, workdir=workdir,
                                  reverse=reverse, handshake_timeout=handshake_timeout,
                                  tracker_token=tracker_token, tags=tags, advertise_host=advertise_host,
                                  idle_timeout=idle_timeout, spin_us=spin_us, session_memory=session_memory,
                                  session_disk=session_disk, session_handles=session_handles,
                                  call_timeout=call_timeout, tls_cert=tls_cert, tls_key=tls_key,
                                  tracker_tls=tracker_tls, tracker_ca=tracker_ca))
    except ServerConfigError as exc:
        log.error("%s", exc)
        return 2
    return 0
