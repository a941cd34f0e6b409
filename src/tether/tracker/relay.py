"""Byte relay between a client and a reverse-mode device.

The pairing happens in the tracker's event loop; the copying does not. Each relayed session gets its two sockets
taken out of asyncio and one thread per direction doing blocking copies: ``os.splice`` through a pipe on Linux
(the bytes never enter Python), else ``recv_into`` + ``sendall`` through a reused 1 MiB buffer. That costs two
threads per relayed session but keeps a small call's extra latency at one kernel wake-up per hop (an asyncio
stream pump adds an event-loop round per hop, several times the cost), and a thread per direction can never
deadlock on two full send buffers.
"""
from __future__ import annotations

import asyncio
import errno
import fcntl
import logging
import os
import socket
import threading
from typing import Tuple

log = logging.getLogger(__name__)

CHUNK = 1 << 20


def take_socket(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> Tuple[socket.socket, bytes]:
    """Detach a connection from asyncio: a blocking socket on a dup of its fd, plus bytes asyncio already read."""
    transport = writer.transport
    transport.pause_reading()
    raw = writer.get_extra_info("socket")
    sock = socket.socket(raw.family, raw.type, raw.proto, fileno=os.dup(raw.fileno()))
    sock.setblocking(True)
    # StreamReader has no public "give me what you buffered without waiting"; the relay must not lose those bytes
    leftover = bytes(getattr(reader, "_buffer", b""))
    transport.close()          # closes asyncio's fd only; the dup keeps the connection open
    return sock, leftover


class Relay:
    """Copies bytes both ways between two connected sockets until both directions end; then closes both."""

    def __init__(self, a: socket.socket, b: socket.socket, name: str = "relay"):
        self.a, self.b = a, b
        self.name = name
        self._lock = threading.Lock()
        self._running = 2
        self.bytes = [0, 0]

    def start(self, a_to_b_first: bytes = b"", b_to_a_first: bytes = b"") -> "Relay":
        for i, (src, dst, first) in enumerate(((self.a, self.b, a_to_b_first), (self.b, self.a, b_to_a_first))):
            threading.Thread(target=self._pump, args=(i, src, dst, first), name="%s-%d" % (self.name, i),
                             daemon=True).start()
        return self

    def _copy_splice(self, index: int, src: socket.socket, dst: socket.socket) -> bool:
        """Kernel-side copy; returns False (before moving any byte) where splice is unavailable."""
        splice = getattr(os, "splice", None)
        if splice is None:
            return False
        r, w = os.pipe()
        try:
            try:
                fcntl.fcntl(w, getattr(fcntl, "F_SETPIPE_SZ", 1031), CHUNK)
            except OSError:
                pass         # the default 64 KiB pipe still works, just with more system calls
            sfd, dfd = src.fileno(), dst.fileno()
            while True:
                try:
                    n = splice(sfd, w, CHUNK)
                except OSError as exc:
                    if exc.errno == errno.EINVAL and self.bytes[index] == 0:
                        return False
                    raise
                if not n:
                    return True
                left = n
                while left:
                    left -= splice(r, dfd, left)
                self.bytes[index] += n
        finally:
            os.close(r)
            os.close(w)

    def _pump(self, index: int, src: socket.socket, dst: socket.socket, first: bytes) -> None:
        try:
            if first:
                dst.sendall(first)
            if not self._copy_splice(index, src, dst):
                view = memoryview(bytearray(CHUNK))
                while True:
                    n = src.recv_into(view)
                    if not n:
                        break
                    dst.sendall(view[:n])
                    self.bytes[index] += n
            try:
                dst.shutdown(socket.SHUT_WR)     # pass the end of this direction on; the other may continue
            except OSError:
                pass
        except OSError:
            # one side broke: end both directions now (shutdown wakes the other thread's blocking recv)
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        finally:
            with self._lock:
                self._running -= 1
                last = self._running == 0
            if last:
                self.a.close()
                self.b.close()
                log.debug("%s done: %d bytes up, %d down", self.name, self.bytes[0], self.bytes[1])
