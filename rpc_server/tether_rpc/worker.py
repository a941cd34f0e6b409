"""A session worker: the forked process that serves one client's CALLs until CLOSE, hang-up or idle timeout.

The parent (:mod:`tether_rpc.server`) has run the handshake; :func:`run_session` takes the connected socket and
answers each CALL with EVENTs and one RETURN or ERROR, through
:class:`tether_rpc.session.SessionHandler`. Small calls with plain arguments take a fast path (:class:`_PlainCalls`:
one receive, one reused Packer, one send). A watchdog thread (:mod:`tether_rpc.watchdog`) ends the worker when the
client hangs up or sends CLOSE, even while a kernel runs (ctypes releases the GIL during the call). The worker's
stdout and stderr go to the client as log EVENTs.
"""
from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time
import traceback
from typing import Any, Dict, List, Optional

from . import limits as session_limits_mod, protocol as p, tls, transport, watchdog
from .error_mapping import error_payload
from .errors import ConnectionClosed, ProtocolError, TetherTimeout

#: The exit status of a worker that ended a call past --call-timeout itself (TLS; see _TlsCallTimer).
CALL_TIMEOUT_EXIT = 3

# Message types as plain ints: compared and packed once per call on the hot path.
_CALL = int(p.MsgType.CALL)
_RETURN = int(p.MsgType.RETURN)


class _Channel:
    """The worker's side of the socket: frames out under one lock (events may come from other threads)."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.lock = threading.Lock()
        self.request_id = 0
        self._deferred: List[bytes] = []  # EVENT frames that leave with the next frame (one write, one wake-up)

    def send(self, data: bytes, bulk: Any = None) -> None:
        with self.lock:
            if bulk is None and not self._deferred:
                self.sock.sendall(data)
            else:
                self._send_locked(data, bulk)

    def _send_locked(self, data: bytes, bulk: Any = None) -> None:
        buffers = self._deferred + [data]
        self._deferred = []
        if bulk is not None:
            buffers.append(bulk)
        transport.send_buffers(self.sock, buffers)

    def send_with_file(self, data: bytes, fh: Any, size: int) -> bool:
        """A frame followed by a file's bytes (sendfile: no copy through Python); False if the file shrank."""
        with self.lock:
            self._send_locked(data)
            return (self.sock.sendfile(fh, 0, size) if size else 0) == size

    def emit(self, kind: str, fields: Dict[str, Any], defer: bool = False) -> None:
        frame = p.encode_frame(p.MsgType.EVENT, self.request_id, fields)
        if defer:  # the caller knows the next frame follows at once (e.g. the last timing sample, then RETURN)
            with self.lock:
                self._deferred.append(frame)
        else:
            self.send(frame)


class _EventLines:
    """A text stream that forwards each complete line to the client as a log EVENT."""

    def __init__(self, channel: _Channel, stream: str):
        self._channel = channel
        self._stream = stream
        self._partial = ""

    def write(self, text: str) -> int:
        self._partial += text
        while "\n" in self._partial:
            line, self._partial = self._partial.split("\n", 1)
            try:
                self._channel.emit("log", {"kind": "log", "stream": self._stream, "line": line})
            except OSError:
                pass
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


def die_with_parent() -> None:
    """Linux/Android: SIGKILL this worker if the server process dies, so no orphan keeps the device busy."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class _TlsCallTimer:
    """The call timeout on a TLS connection. The server's parent reports a worker killed by SIGALRM, but over TLS
    it cannot write to the connection any more (the worker advanced the TLS state it holds a stale copy of), so
    here a thread waits out each call's deadline, sends the client the ERROR itself and ends the process.
    ``arm(which, seconds)`` has signal.setitimer's signature (``seconds`` 0 disarms)."""

    def __init__(self, channel: "_Channel", seconds: float):
        self._channel = channel
        self._seconds = seconds
        self._cond = threading.Condition()
        self._deadline: Optional[float] = None
        threading.Thread(target=self._run, name="tether-call-timer", daemon=True).start()

    def arm(self, which: int, seconds: float) -> None:
        with self._cond:
            self._deadline = time.monotonic() + seconds if seconds else None
            self._cond.notify()

    def _run(self) -> None:
        with self._cond:
            while True:
                if self._deadline is None:
                    self._cond.wait()
                    continue
                left = self._deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
        frame = p.encode_frame(p.MsgType.ERROR, 0, {"type": p.ErrorType.TIMEOUT, "traceback": "",
                                                    "message": session_limits_mod.call_timeout_message(self._seconds)})
        # a kernel holds no lock; a stuck send does, for at most a second, and then the client just sees the close
        if self._channel.lock.acquire(timeout=1.0):
            try:
                self._channel.sock.sendall(frame)
            except OSError:
                pass
        os._exit(CALL_TIMEOUT_EXIT)


def _set_idle_timeout(sock: socket.socket, seconds: Optional[float]) -> None:
    """A receive on the (blocking) worker socket that waits longer fails. The worker only receives between calls
    (and bulk bytes inside one), so a running kernel never counts as idle."""
    if seconds and not transport.set_kernel_timeouts(sock, seconds):
        sock.settimeout(seconds)  # no SO_RCVTIMEO: a socket timeout does the same, one poll() per receive


def run_session(sock: socket.socket, buffer: Optional[p.FrameBuffer], folder: str,
                limits: p.Limits = p.DEFAULT_LIMITS, idle_timeout: Optional[float] = None,
                spin: float = 0.0, session_limits: Optional[session_limits_mod.SessionLimits] = None) -> int:
    """Serve one session's CALLs on a connected, handshaken socket until CLOSE, hang-up or ``idle_timeout``
    seconds without a frame; returns an exit code. ``spin``: see :class:`tether_rpc.protocol.FrameReader`.
    ``session_limits``: tether_rpc.limits; a call that runs past ``call_timeout`` ends this process by SIGALRM
    (an interval timer armed per call: a kernel stuck in native code cannot ignore it), which the server reports."""
    from .session import BulkIn, Reply, SessionHandler  # imported in the parent already by the preload

    sock.setblocking(True)
    _set_idle_timeout(sock, idle_timeout)
    if buffer is None:
        buffer = p.FrameBuffer(limits)
    buffer.limits = limits
    reader = transport.FrameReader(sock, buffer=buffer, spin=spin)
    channel = _Channel(sock)
    calls = watchdog.CallState()
    watchdog.watch(sock, calls, buffer.pending, limits, peek=not tls.is_tls(sock))
    sys.stdout = _EventLines(channel, "stdout")  # type: ignore[assignment]
    sys.stderr = _EventLines(channel, "stderr")  # type: ignore[assignment]
    handler = SessionHandler(folder, session_limits)
    call_timeout = session_limits.call_timeout if session_limits is not None else None
    if session_limits is not None:
        session_limits_mod.apply_memory_backstop(session_limits)
    if call_timeout and tls.is_tls(sock):
        arm = _TlsCallTimer(channel, call_timeout).arm
    elif call_timeout:
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
        arm = signal.setitimer
    else:
        arm = None
    plain = _PlainCalls(channel, handler, Reply, calls)
    read_plain_frame = reader.read_plain_frame
    try:
        while True:
            try:
                frame = read_plain_frame()
                fast = frame is not None
                if not fast:
                    frame = reader.read_frame()
            except TetherTimeout:
                _send_error(channel, 0, TetherTimeout(
                    "the session was idle (nothing received for %s s, the server's --idle-timeout) and has "
                    "ended; open a new session" % idle_timeout), "")
                return 0
            except (ConnectionClosed, OSError):
                return 0
            except ProtocolError as exc:
                _send_error(channel, 0, exc, "")
                return 0
            msg_type, request_id, payload = frame
            if msg_type == _CALL:
                if arm is not None:
                    arm(signal.ITIMER_REAL, call_timeout)
                # A plain frame with exactly {fn, args} carries no tensors and no bulk: the fast path.
                if fast and len(payload) == 2 and type(payload.get("args")) is list:
                    ok = plain.serve(request_id, payload["fn"], payload["args"])
                else:
                    ok = _serve_call(channel, reader, handler, request_id, payload, limits, BulkIn, calls)
                if arm is not None:
                    arm(signal.ITIMER_REAL, 0)
                if not ok:
                    return 0
            elif msg_type == p.MsgType.CLOSE:
                return 0
            else:
                _send_error(channel, 0, ProtocolError("unexpected message type %d in a session" % msg_type), "")
                return 0
    finally:
        handler.close()


def _send_error(channel: _Channel, request_id: int, exc: BaseException, tb: str) -> None:
    try:
        channel.send(p.encode_frame(p.MsgType.ERROR, request_id, error_payload(exc, tb)))
    except OSError:
        pass


class _PlainCalls:
    """The small-call fast path: a CALL of a built-in or function handle with plain arguments, answered with one
    RETURN ``{value}`` packed by a reused Packer and written with one send."""

    def __init__(self, channel: _Channel, handler: Any, reply_type: type, calls: watchdog.CallState):
        self.channel = channel
        self.calls = calls
        self.call_plain = handler.call_plain
        self.emit = channel.emit
        self.reply_type = reply_type
        self.pack = p.new_packer().pack
        self.pack_header = p.HEADER.pack

    def serve(self, request_id: int, fn: Any, args: List[Any]) -> bool:
        """One CALL -> EVENTs* + RETURN/ERROR. False when the connection is unusable."""
        channel = self.channel
        channel.request_id = request_id
        calls = self.calls
        calls.begin()
        try:
            value = self.call_plain(fn, args, self.emit)
            if type(value) is self.reply_type:  # a built-in with bulk bytes or tensors in its answer
                return _send_reply(channel, request_id, value)
            body = self.pack([_RETURN, request_id, {"value": value}])
        except ConnectionClosed:
            return False
        except TetherTimeout as exc:
            _send_error(channel, 0, TetherTimeout("%s; the session has ended" % exc), "")
            return False
        except ProtocolError as exc:
            _send_error(channel, request_id, exc, traceback.format_exc())
            return False
        except Exception as exc:  # (a Packer that fails resets itself)
            _send_error(channel, request_id, exc, traceback.format_exc())
            return True
        finally:
            calls.running = False
        try:
            channel.send(self.pack_header(len(body)) + body)
        except OSError:
            return False
        return True


def _serve_call(channel: _Channel, reader: transport.FrameReader, handler: Any, request_id: int,
                payload: dict, limits: p.Limits, bulk_type: Any, calls: watchdog.CallState) -> bool:
    """One CALL -> EVENTs* + RETURN/ERROR. False when the connection is unusable."""
    channel.request_id = request_id
    bulk = None
    if "nbytes" in payload:
        try:
            nbytes = p.bulk_size(payload, limits)
        except ProtocolError as exc:  # FrameTooLarge included: we will not read that many bytes, so the
            _send_error(channel, request_id, exc, "")  # stream cannot be resynchronised
            return False
        bulk = bulk_type(nbytes, reader.read_into, reader.skip, reader.read_into_fd)
    else:
        calls.begin()  # no bulk bytes to read: the watchdog may look at the input queued behind this call
    try:
        reply = handler.call(payload.get("fn"), payload.get("args", []), bulk, channel.emit)
    except ConnectionClosed:
        return False
    except TetherTimeout as exc:  # bulk bytes stopped coming: the stream cannot be resynchronised
        _send_error(channel, 0, TetherTimeout("%s; the session has ended" % exc), "")
        return False
    except ProtocolError as exc:
        _send_error(channel, request_id, exc, traceback.format_exc())
        return False
    except Exception as exc:
        _send_error(channel, request_id, exc, traceback.format_exc())
        return True
    finally:
        calls.running = False
    return _send_reply(channel, request_id, reply)


def _send_reply(channel: _Channel, request_id: int, reply: Any) -> bool:
    """RETURN for a call's :class:`Reply`, with its bulk bytes (a buffer or a file) if any."""
    try:
        frame = p.encode_frame(_RETURN, request_id, reply.payload())
    except Exception as exc:  # a value msgpack cannot carry
        _send_error(channel, request_id, exc, traceback.format_exc())
        if reply.file is not None:
            reply.file.close()
        return True
    try:
        if reply.buffer is not None:
            channel.send(frame, reply.buffer)
        elif reply.file is not None:
            with reply.file:
                if not channel.send_with_file(frame, reply.file, reply.size):
                    return False  # the file shrank under us: the stream is out of step
        else:
            channel.send(frame)
    except OSError:
        return False
    return True
