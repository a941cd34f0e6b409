"""The session worker's watchdog: ends the worker at once when its client hangs up or sends CLOSE mid-call.

A running kernel holds the worker's main thread (ctypes releases the GIL, so this thread still runs), and the
main thread reads the next frame only after the call returns. So the watchdog thread watches the socket:

* hang-up (POLLRDHUP/POLLHUP/POLLERR) at any time -> ``os._exit(0)``;
* while a call without bulk bytes runs (:attr:`CallState.running`), input waiting -> it looks, without consuming
  anything, at the frames queued behind the call (the reader's buffered bytes, then the socket's, through
  ``MSG_PEEK``); if one of them is CLOSE, the client has given the session up: ``os._exit(0)``. Pipelined CALLs
  before the CLOSE are dropped with it (a client that sends CLOSE wants no more answers).

Exiting frees the device: the server reaps the worker, deletes the session folder and admits the next client
(docs/protocol.md, "Calls"). A call that reads bulk bytes is never "running" here: its bytes on the socket are
not frames, and its CLOSE can only come after them.
"""
from __future__ import annotations

import os
import select
import socket
import threading
from typing import Callable

from . import protocol as p

#: How much queued input the watchdog inspects for a CLOSE (a CLOSE queued behind more than this is seen when
#: the call ends, like any other frame).
PEEK_BYTES = 256 << 10
#: How often the watchdog checks whether a call has started (and looks again at input that did not change): a
#: CLOSE that reaches the socket while a call runs wakes it at once; one that came before the call started is
#: found within a tick.
TICK = 0.05

_HANGUP = getattr(select, "POLLRDHUP", 0x2000) | select.POLLHUP | select.POLLERR
_CLOSE = int(p.MsgType.CLOSE)


class CallState:
    """What the main thread tells the watchdog: a call without bulk bytes is running (``running``), and which one
    (``seq`` grows with each call, so a CLOSE found while one call ran is not blamed on the next)."""

    __slots__ = ("running", "seq")

    def __init__(self) -> None:
        self.running = False
        self.seq = 0

    def begin(self) -> None:
        self.seq += 1
        self.running = True

    def end(self) -> None:
        self.running = False


def queued_close(data: bytes, limits: p.Limits = p.DEFAULT_LIMITS) -> bool:
    """True if the frames at the start of ``data`` (a byte stream, possibly cut short) include a CLOSE. Frames
    are skipped with their bulk bytes; the scan stops at the first frame that is incomplete or undecodable (the
    main thread reports that one when it gets there)."""
    pos = 0
    end = len(data)
    view = memoryview(data)
    while end - pos >= p.HEADER_SIZE:
        (size,) = p.HEADER.unpack_from(data, pos)
        if size > limits.max_frame or end - pos - p.HEADER_SIZE < size:
            return False
        body = view[pos + p.HEADER_SIZE:pos + p.HEADER_SIZE + size]
        try:
            msg_type, _, payload = p.decode_body(body, limits)
            nbytes = p.bulk_size(payload, limits) if "nbytes" in payload else 0
        except p.ProtocolError:
            return False
        if msg_type == _CLOSE:
            return True
        pos += p.HEADER_SIZE + size + nbytes
    return False


def _peek(sock: socket.socket, readable: "select.poll") -> bytes:
    # only when input is waiting: on a socket with a Python-level timeout (no SO_RCVTIMEO), recv would first
    # wait for input even with MSG_DONTWAIT
    if not readable.poll(0):
        return b""
    try:
        return sock.recv(PEEK_BYTES, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except (BlockingIOError, InterruptedError):
        return b""
    except OSError:
        os._exit(0)  # the connection is gone: nothing left to serve


def _drain_and_exit(sock: socket.socket) -> None:
    """Exit after swallowing the input already queued (bounded): a socket closed with unread input sends RST
    instead of FIN, and the client then sees "connection reset" instead of the end of the session it asked for."""
    try:
        sock.setblocking(False)  # (a Python-level timeout would make each recv below wait for input first)
    except OSError:
        os._exit(0)
    for _ in range(64):
        try:
            if not sock.recv(PEEK_BYTES):
                break
        except OSError:
            break
    os._exit(0)


def watch(sock: socket.socket, state: CallState, buffered: Callable[[], bytes],
          limits: p.Limits = p.DEFAULT_LIMITS, peek: bool = True) -> threading.Thread:
    """Start the watchdog thread for a session socket. ``buffered()`` returns the bytes the frame reader holds
    but has not decoded yet (read only while a call runs, when the main thread does not touch the reader).
    ``peek=False`` watches for hang-ups only: on a TLS socket the queued bytes are ciphertext, and ssl sockets
    refuse MSG_PEEK, so a CLOSE there is read when the call ends."""
    thread = threading.Thread(target=_run, args=(sock, state, buffered, limits, peek), name="tether-watchdog",
                              daemon=True)
    thread.start()
    return thread


def _run(sock: socket.socket, state: CallState, buffered: Callable[[], bytes], limits: p.Limits,
         peek: bool) -> None:
    hangup_only = select.poll()
    hangup_only.register(sock.fileno(), _HANGUP)
    with_input = select.poll()
    with_input.register(sock.fileno(), _HANGUP | select.POLLIN)
    seen = (-1, -1)  # (call, bytes pending) at the last look that found no CLOSE: do not look again until it grows
    tick_ms = int(TICK * 1000)
    while True:
        seq = state.seq
        watching = peek and state.running
        poller = with_input if watching and seen[0] != seq else hangup_only
        for _, events in poller.poll(tick_ms):
            if events & _HANGUP:
                os._exit(0)
        if not (watching and state.running and state.seq == seq):
            continue
        data = buffered() + _peek(sock, with_input)
        if (seq, len(data)) == seen:
            continue
        if queued_close(data, limits) and state.running and state.seq == seq:
            _drain_and_exit(sock)
        seen = (seq, len(data))
