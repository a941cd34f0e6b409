"""Frames over a blocking socket: sending them (one send call each), receiving them, and bulk bytes.

:class:`FrameReader` reads frames through a :class:`tether_rpc.protocol.FrameBuffer` (the sans-IO decoder) and
moves bulk bytes straight into their destination (a buffer, or a file through splice(2)). While a peer answers
fast it polls instead of sleeping (see :class:`FrameReader`). Socket failures leave as tether exceptions
(:mod:`tether_rpc.error_mapping`), the socket error chained as the cause.
"""
from __future__ import annotations

import errno
import logging
import os
import socket
import struct
import time
from typing import Any, Dict, Iterable, List, Optional, Tuple

try:
    import fcntl
except ImportError:  # not on Windows (hosts only: devices are Linux/Android)
    fcntl = None  # type: ignore[assignment]

from .error_mapping import SOCKET_ERRORS, socket_error
from .errors import ConnectionClosed, FrameTooLarge
from .protocol import DEFAULT_LIMITS, FrameBuffer, Limits, encode_frame
from .tls import is_tls

log = logging.getLogger(__name__)

_RECV_TIMED_OUT = "timed out waiting for data from the peer"
_SEND_TIMED_OUT = "timed out sending to the peer"


def _recv_some(sock: socket.socket, view: memoryview) -> int:
    try:
        n = sock.recv_into(view)
    except SOCKET_ERRORS as exc:
        raise socket_error(exc, _RECV_TIMED_OUT, "connection lost") from exc
    if n == 0:
        raise ConnectionClosed("the peer closed the connection")
    return n


_DONTWAIT = getattr(socket, "MSG_DONTWAIT", 0)
_splice = getattr(os, "splice", None)  # Python 3.10+, Linux
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031) if fcntl is not None else 1031
#: Pieces in which uploads move into files: measured faster than 4 MiB (it stays in the caches) or 64 KiB.
FILE_CHUNK = 1 << 20
_yield = getattr(os, "sched_yield", lambda: None)
_clock = time.perf_counter


class FrameReader:
    """Blocking frame reader over a socket (honours the socket's timeout).

    ``spin`` (seconds) lets :meth:`read_plain_frame` poll the socket for up to that long before it sleeps. A peer
    in a call loop answers within microseconds, and sleeping costs a wake-up per frame (an IPI, an idle exit,
    caches gone cold: most of a small call's round trip on a quiet machine). But polling only pays while a core
    is free: on a busy machine the scheduler treats a poller as CPU-bound and it waits behind the other work. So
    the reader measures: an epoch of each mode, comparing the median time from one frame to the next (the wait,
    and the work after it, which runs slower from cold caches after a sleep); it then keeps the clearly faster
    mode, sleeping unless polling wins by MARGIN, for STAY epochs without timing anything, and measures again.
    0 disables polling.
    """

    CHUNK = 16 << 20  # per recv_into call: large, so bulk reads take few syscalls
    EPOCH = 128       # frames per measurement of a waiting mode
    STAY = 32         # epochs in the chosen mode before both are measured again
    MARGIN = 0.9      # polling must cut the median frame interval by this factor to be chosen (it costs CPU)

    def __init__(self, sock: socket.socket, limits: Limits = DEFAULT_LIMITS, buffer: Optional[FrameBuffer] = None,
                 spin: float = 0.0):
        self.sock = sock
        self.buffer = buffer if buffer is not None else FrameBuffer(limits)
        self.tls = is_tls(sock)                 # every byte through the ssl object: no polling, no splice
        self.spin = spin if _DONTWAIT else 0.0
        self.polling = True                     # the current mode: polling is measured first, then sleeping
        self._timing = True                     # measuring (else staying with the chosen mode)
        self._other_done = False                # this round measured one mode already
        self._left = self.EPOCH                 # frames left in this phase
        self._last = 0.0                        # when the previous frame arrived (while timing)
        self._intervals: List[float] = []       # between frame arrivals, this epoch
        self.medians: Dict[bool, float] = {}    # the last measured median interval of each mode

    @property
    def limits(self) -> Limits:
        return self.buffer.limits

    def _recv_frame_start(self, view: memoryview) -> int:
        """One receive into an empty buffer (polling first when that pays, see ``spin``); tether exceptions."""
        sock = self.sock
        try:
            if not self.spin or self.tls or sock.gettimeout() is not None:  # (a timeout polls before each try)
                n = sock.recv_into(view)
            else:
                n = self._poll_recv(view, _clock()) if self.polling else sock.recv_into(view)
                if self._timing:
                    now = _clock()
                    self._intervals.append(now - self._last)
                    self._last = now
                self._left -= 1
                if self._left <= 0:
                    self._next_phase()
        except SOCKET_ERRORS as exc:
            raise socket_error(exc, _RECV_TIMED_OUT, "connection lost") from exc
        if n == 0:
            raise ConnectionClosed("the peer closed the connection")
        return n

    def _poll_recv(self, view: memoryview, t0: float) -> int:
        # Non-blocking receives for up to ``spin`` seconds, yielding the CPU between them (the peer may need this
        # very CPU to send what we wait for); then, or as soon as one yield gave the CPU away for long (another
        # busy process shares it), a blocking receive.
        recv_into = self.sock.recv_into
        end = t0 + self.spin
        ceiling = self.spin / 2
        last = t0
        while True:
            try:
                return recv_into(view, 0, _DONTWAIT)
            except BlockingIOError:
                now = _clock()
                if now > end or now - last > ceiling:
                    return recv_into(view)
                last = now
                _yield()

    def _next_phase(self) -> None:
        self._left = self.EPOCH
        if not self._timing:  # the stay is over: measure the current mode, then the other one
            self._timing = True
            self._intervals = []
            self._last = _clock()
            return
        intervals = sorted(self._intervals[1:])  # (the first interval began before this epoch did)
        self._intervals = []
        self._last = _clock()
        if intervals:
            self.medians[self.polling] = intervals[len(intervals) // 2]
        if not self._other_done:
            self._other_done = True
            self.polling = not self.polling
            return
        poll, sleep = self.medians.get(True), self.medians.get(False)
        self.polling = poll is not None and sleep is not None and poll < self.MARGIN * sleep
        self._timing = False
        self._other_done = False
        self._left = self.STAY * self.EPOCH
        if log.isEnabledFor(logging.DEBUG):
            log.debug("frame interval %.1f us polling, %.1f us sleeping: %s", 1e6 * (poll or 0), 1e6 * (sleep or 0),
                      "polling" if self.polling else "sleeping")

    def read_plain_frame(self) -> Optional[Tuple[int, int, dict]]:
        """The fast path for small calls and replies: when nothing is buffered, receive once, and if exactly one
        small plain frame arrived, return it decoded. Otherwise (or if bytes were buffered already) return None
        and leave what arrived buffered for :meth:`read_frame`, which decodes it with every check."""
        return self.buffer.read_plain(self._recv_frame_start)

    def read_frame(self) -> Tuple[int, int, dict]:
        buf = self.buffer
        sock = self.sock
        while True:
            frame = buf.next_frame()
            if frame is not None:
                return frame
            # missing() has checked the frame against the limit, so growing to fit it whole is safe
            buf.wrote(_recv_some(sock, buf.free_space(buf.missing())))

    def read_into(self, dest: memoryview) -> None:
        """Fill ``dest`` exactly with bulk bytes: buffered leftovers first, then ``recv_into`` in place."""
        dest = byte_view(dest)
        pos = self.buffer.take(dest)
        total = len(dest)
        while pos < total:
            pos += _recv_some(self.sock, dest[pos:pos + self.CHUNK])

    def read_into_fd(self, fd: int, n: int) -> None:
        """Move exactly ``n`` bulk bytes into the file descriptor ``fd`` (an upload): buffered leftovers first, then
        splice(2) through a pipe where Python has it (3.10+: the bytes never enter Python, and are copied once
        instead of twice), else recv_into a scratch buffer and os.write."""
        buffered = self.buffer.pop_bytes(n)
        if len(buffered):
            _write_all(fd, buffered)
            n -= len(buffered)
        if n and _splice is not None and not self.tls:
            n = self._splice_into(fd, n)
        if n:
            scratch = memoryview(bytearray(min(n, FILE_CHUNK)))
            while n:
                got = _recv_some(self.sock, scratch[:min(n, len(scratch))])
                _write_all(fd, scratch[:got])
                n -= got

    def _splice_into(self, fd: int, n: int) -> int:
        """splice socket -> pipe -> fd; returns how many bytes are left for the fallback (all of them if this
        kernel or file system cannot splice)."""
        try:
            pipe_r, pipe_w = os.pipe()
        except OSError:
            return n
        try:
            try:
                fcntl.fcntl(pipe_w, _F_SETPIPE_SZ, FILE_CHUNK)  # 1 MiB: few calls (the default 64 KiB is slower)
            except OSError:
                pass
            src = self.sock.fileno()
            while n:
                try:
                    got = _splice(src, pipe_w, min(n, FILE_CHUNK))
                except SOCKET_ERRORS as exc:
                    raise socket_error(exc, "timed out waiting for bulk bytes from the peer",
                                       "connection lost") from exc
                except OSError as exc:
                    if exc.errno in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
                        return n  # nothing moved by this call: the fallback takes over from here
                    raise
                if got == 0:
                    raise ConnectionClosed("the peer closed the connection in the middle of bulk bytes")
                left = got
                while left:
                    left -= _splice(pipe_r, fd, left)
                n -= got
            return 0
        finally:
            os.close(pipe_r)
            os.close(pipe_w)

    def read_bulk(self, n: int) -> bytearray:
        if n > self.limits.max_bulk:
            raise FrameTooLarge("bulk payload of %d bytes exceeds the limit of %d" % (n, self.limits.max_bulk))
        out = bytearray(n)
        self.read_into(memoryview(out))
        return out

    def skip(self, n: int) -> None:
        """Discard ``n`` bulk bytes (a refused upload) without keeping them."""
        scratch = memoryview(bytearray(min(n, 1 << 20) or 1))
        while n > 0:
            step = min(n, len(scratch))
            self.read_into(scratch[:step])
            n -= step


def _write_all(fd: int, view: memoryview) -> None:
    while len(view):
        view = view[os.write(fd, view):]


def byte_view(obj: Any) -> memoryview:
    """A flat unsigned-byte view of any C-contiguous buffer (numpy arrays included, even empty ones)."""
    view = obj if isinstance(obj, memoryview) else memoryview(obj)
    if view.ndim == 1 and view.format == "B":
        return view
    if view.nbytes == 0:  # memoryview.cast refuses zeros in the shape
        return memoryview(b"")
    return view.cast("B")


def send_buffers(sock: socket.socket, buffers: Iterable[Any]) -> None:
    """Write several buffers with as few syscalls as possible (one ``sendmsg`` for small frames), no copies."""
    views: List[memoryview] = [byte_view(b) for b in buffers]
    views = [v for v in views if len(v)]
    if is_tls(sock):  # an SSLSocket has no sendmsg: small pieces joined into one record, large ones as they are
        _send_tls(sock, views)
        return
    try:
        while views:
            sent = sock.sendmsg(views[:64])
            while sent and views:
                if sent >= len(views[0]):
                    sent -= len(views[0])
                    views.pop(0)
                else:
                    views[0] = views[0][sent:]
                    sent = 0
    except SOCKET_ERRORS as exc:
        raise socket_error(exc, _SEND_TIMED_OUT, "connection lost while sending") from exc


def _send_tls(sock: socket.socket, views: List[memoryview]) -> None:
    small: List[memoryview] = []
    try:
        for v in views:
            if len(v) < 65536:
                small.append(v)
                continue
            if small:
                sock.sendall(b"".join(small))
                small = []
            sock.sendall(v)
        if small:
            sock.sendall(b"".join(small))
    except SOCKET_ERRORS as exc:
        raise socket_error(exc, _SEND_TIMED_OUT, "connection lost while sending") from exc


def send_frame(sock: socket.socket, msg_type: int, request_id: int, payload: Optional[dict] = None,
               bulk: Any = None) -> None:
    """Send one frame (one send call); with ``bulk``, its size goes into ``payload["nbytes"]`` and its bytes follow."""
    if bulk is None:
        data = encode_frame(msg_type, request_id, payload)
        try:
            sock.sendall(data)
        except SOCKET_ERRORS as exc:
            raise socket_error(exc, _SEND_TIMED_OUT, "connection lost while sending") from exc
        return
    view = byte_view(bulk)
    payload = dict(payload or {})
    payload["nbytes"] = len(view)
    send_buffers(sock, [encode_frame(msg_type, request_id, payload), view])


def close_quietly(sock: socket.socket) -> None:
    """Close a socket whose peer may be gone already (nothing to report then)."""
    try:
        sock.close()
    except OSError:
        pass


def configure_socket(sock: socket.socket) -> None:
    """TCP_NODELAY: small frames leave at once (Nagle + delayed ACK costs tens of ms per call otherwise)."""
    if sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def set_kernel_timeouts(sock: socket.socket, read: Optional[float], write: Optional[float] = None) -> bool:
    """Bound each receive / send on a blocking socket with SO_RCVTIMEO / SO_SNDTIMEO (None: no limit), which costs
    nothing per call, unlike a socket timeout (a poll() before every receive). A wait that runs out fails with
    BlockingIOError (a TetherTimeout through the transport). False if the kernel lacks the options."""
    try:
        for opt, seconds in ((socket.SO_RCVTIMEO, read), (socket.SO_SNDTIMEO, write)):
            seconds = seconds or 0.0
            sec = int(seconds)
            sock.setsockopt(socket.SOL_SOCKET, opt, struct.pack("ll", sec, int((seconds - sec) * 1e6)))
        return True
    except (OSError, struct.error):
        return False
