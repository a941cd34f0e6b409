"""Byte relay between a client and a reverse-mode device.

The pairing happens in the tracker's event loop; the copying does not. Each relayed session gets its two sockets
taken out of asyncio and one thread per direction doing blocking ``recv_into`` + ``sendall`` through a reused
1 MiB buffer. That costs two threads per relayed session but keeps a small call's extra latency at one kernel
wake-up per hop (an asyncio stream pump adds an event-loop round per hop, several times the cost), and a thread
per direction can never deadlock on two full send buffers.
"""
from __future__ import annotations

import asyncio
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

    def _pump(self, index: int, src: socket.socket, dst: socket.socket, first: bytes) -> None:
        view = memoryview(bytearray(CHUNK))
        try:
            if first:
                dst.sendall(first)
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
