"""The asyncio tracker: one port for devices, clients and relayed sessions.

Life of a grant (``docs/tracker.md`` has the diagrams)::

    client REQUEST -> (queue) -> device chosen -> EXPECT {match} to device -> EXPECTED back
        -> GRANT {host, port, match} to client -> client connects to the device with HELLO {match}
        -> device reports SESSION started -> ... -> SESSION ended (or REGISTER again) -> device free

The device learns the one-time match token *before* the client does (EXPECT is acknowledged), so the client's
HELLO can never overtake it. A grant whose session has not started within ``grant_timeout`` is revoked and the
device goes back to the pool. A device connection that stays silent for ``dead_after`` seconds, or closes, takes
the device out of the pool; a client connection that closes withdraws its pending requests at once.
"""
from __future__ import annotations

import asyncio
import logging
import secrets
import socket
import time
from typing import Any, Dict, Optional, Set, Tuple

from tether_rpc import error_mapping, handshake, protocol as p
from tether_rpc.errors import AuthenticationError, ConnectionClosed, FrameTooLarge, ProtocolError
from tether_rpc.tracker_protocol import (TRACKER_LIMITS, TRACKER_VERSION, TrackerMsg, check_hello, check_match,
                                         check_register, check_request, device_tags)

from . import state as tracker_state
from .pool import Device, Pool, Request
from .relay import Relay, take_socket

log = logging.getLogger(__name__)

_HEARTBEAT_FRAME = p.encode_frame(TrackerMsg.HEARTBEAT, 0, {})
#: Small frames of scalars (heartbeats, EXPECTED, SESSION, REQUEST) decode without the per-container limit hooks,
#: about twice as fast; anything else (REGISTER's nested info) falls back to the fully checked decode. One decoder
#: serves every connection: each body is complete when decoded, and the loop decodes one at a time.
_PLAIN = p.FrameBuffer(TRACKER_LIMITS, size=64)


class Conn:
    """One peer connection: framed reads with limits, one write per frame."""

    __slots__ = ("reader", "writer", "peer", "name", "role", "closed", "requests", "device")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader = reader
        self.writer = writer
        peer = writer.get_extra_info("peername") or ("?", 0)
        self.peer: Tuple[str, int] = (peer[0], peer[1])
        self.name = "%s:%d" % self.peer
        self.role = ""
        self.closed = False
        self.requests: Dict[int, Request] = {}
        self.device: Optional[Device] = None
        sock = writer.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    async def read_frame(self, limits: p.Limits) -> Tuple[int, int, dict, bytes]:
        """Returns (msg_type, request_id, payload, raw frame bytes)."""
        try:
            header = await self.reader.readexactly(p.HEADER_SIZE)
            (n,) = p.HEADER.unpack(header)
            if n > limits.max_frame:
                raise FrameTooLarge("frame of %d bytes exceeds the tracker's limit of %d" % (n, limits.max_frame))
            body = await self.reader.readexactly(n)
        except asyncio.IncompleteReadError as exc:
            raise ConnectionClosed("%s closed the connection" % self.name) from exc
        except OSError as exc:
            raise error_mapping.socket_error(exc, "timed out reading from %s" % self.name, self.name) from exc
        frame = _PLAIN.decode_plain(body) if n <= p.PLAIN_FRAME_MAX and limits is TRACKER_LIMITS else None
        msg_type, rid, payload = frame if frame is not None else p.decode_body(body, limits)
        return msg_type, rid, payload, header + body

    def send(self, msg_type: int, rid: int = 0, payload: Optional[dict] = None) -> None:
        if self.closed:
            return
        try:
            self.writer.write(p.encode_frame(msg_type, rid, payload))
        except (ConnectionError, OSError, RuntimeError):
            self.close()

    def send_frame(self, frame: bytes) -> None:
        if not self.closed:
            self.writer.write(frame)

    def send_error(self, rid: int, exc: BaseException) -> None:
        self.send(p.MsgType.ERROR, rid, error_mapping.error_payload(exc))

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.writer.close()


class TrackerServer:
    """The tracker. ``await start()`` binds; ``await serve_forever()``; ``close()`` stops it."""

    def __init__(self, host: str = "127.0.0.1", port: int = 9190, *, token: Optional[str] = None,
                 grant_timeout: float = 1.0, heartbeat: float = 1.0, dead_after: float = 3.0,
                 handshake_timeout: float = 5.0, dial_timeout: float = 5.0, max_requests_per_conn: int = 1024,
                 ssl_context: Any = None, state_file: Optional[str] = None):
        """``ssl_context``: serve TLS (tether_rpc.tls.server_context; docs/tls.md). Reverse-mode devices cannot
        be relayed then (the relay copies raw bytes, and each side's TLS ends at the tracker).
        ``state_file``: keep queued requests' places and device holds there, to survive a restart
        (:mod:`tether.tracker.state`)."""
        self.host = host
        self.ssl_context = ssl_context
        self.port = port
        self.token = token or None
        self.grant_timeout = grant_timeout
        self.heartbeat = heartbeat
        self.dead_after = dead_after
        self.handshake_timeout = handshake_timeout
        self.dial_timeout = dial_timeout
        self.max_requests_per_conn = max_requests_per_conn
        self.pool = Pool()
        self._by_match: Dict[str, Tuple[Device, Request]] = {}
        self._dials: Dict[str, "asyncio.Future[Conn]"] = {}
        self._server: Optional[asyncio.base_events.Server] = None
        self._sweeper: Optional["asyncio.Task[None]"] = None
        self._conns: Set[Conn] = set()
        self._packer = p.new_packer()
        self.stats = {"grants": 0, "revoked": 0, "timeouts": 0, "relayed": 0}
        self.traffic = {"frames": 0, "requests": 0}     # frames read after handshakes; REQUESTs (the dashboard's rates)
        self.state_file = state_file
        self._restored = tracker_state.Restored()
        self._state_writer: Optional[tracker_state.StateWriter] = None

    # ------------------------------------------------------------------------------------------- lifecycle
    async def start(self) -> None:
        tls = {"ssl": self.ssl_context, "ssl_handshake_timeout": self.handshake_timeout} if self.ssl_context else {}
        self._server = await asyncio.start_server(self._handle, self.host, self.port, backlog=1024,
                                                  reuse_address=True, **tls)
        sock = self._server.sockets[0]
        self.port = sock.getsockname()[1]
        if self.state_file:
            self._restored = tracker_state.load(self.state_file)
            self.pool.skip_ids(self._restored.last_id)
            self._state_writer = tracker_state.StateWriter(self.state_file, self._snapshot)
            self.pool.changed = self._state_writer.changed
        self._sweeper = asyncio.ensure_future(self._sweep())
        log.info("tracker listening on %s:%d%s", self.host, self.port, " (token required)" if self.token else "")

    async def serve_forever(self) -> None:
        assert self._server is not None, "call start() first"
        await self._server.serve_forever()

    def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        if self._server is not None:
            self._server.close()
            self._server = None
        if self._state_writer is not None:
            self.pool.changed = lambda: None
            self._state_writer.flush()      # before the connections go: their requests are still queued
            self._state_writer = None
        for conn in list(self._conns):
            conn.close()

    def connection_count(self) -> int:
        """Open tracker connections (devices, clients, ones still in their handshake; not relayed sessions)."""
        return len(self._conns)

    async def __aenter__(self) -> "TrackerServer":
        await self.start()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.close()

    # --------------------------------------------------------------------------------------- connections
    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = Conn(reader, writer)
        self._conns.add(conn)
        handed_over = False
        try:
            msg_type, rid, payload, raw = await asyncio.wait_for(conn.read_frame(p.HANDSHAKE_LIMITS),
                                                                 self.handshake_timeout)
            if msg_type == p.MsgType.HELLO:
                handed_over = True
                await self._relay_client(conn, payload, raw)
            elif msg_type == TrackerMsg.RELAY:
                self._relay_device(conn, payload)
                handed_over = True      # the client's relay task owns the connection now
            elif msg_type == TrackerMsg.HELLO:
                hello = check_hello(payload)
                await self._authenticate(conn, hello)
                loop = {"device": self._device_loop, "client": self._client_loop}.get(hello["role"])
                if loop is None:
                    raise ProtocolError("role %r must start with RELAY, not HELLO" % hello["role"])
                await loop(conn)
            else:
                raise ProtocolError("a tracker connection must start with HELLO, got message type %d" % msg_type)
        except asyncio.TimeoutError:
            log.info("%s: closed after %.1f s without a handshake", conn.name, self.handshake_timeout)
        except ConnectionClosed:
            pass
        except (ProtocolError, AuthenticationError) as exc:
            log.info("%s: %s", conn.name, exc)
            conn.send_error(0, exc)
        except Exception:  # a bug in one connection must not take the tracker down
            log.exception("%s: unexpected error", conn.name)
        finally:
            self._conns.discard(conn)
            if not handed_over:
                self._forget(conn)
                conn.close()

    async def _authenticate(self, conn: Conn, hello: dict) -> None:
        conn.role = hello["role"]
        if hello["name"]:
            conn.name = "%s@%s:%d" % (hello["name"], conn.peer[0], conn.peer[1])
        welcome: Dict[str, Any] = {"version": TRACKER_VERSION, "tracker": "tether-tracker", "peer": id(conn) & 0xFFFF}
        if self.token:
            nonce = handshake.make_nonce()
            conn.send(TrackerMsg.CHALLENGE, 0, {"algo": handshake.AUTH_ALGO, "nonce": nonce})
            msg_type, _, payload, _ = await asyncio.wait_for(conn.read_frame(p.HANDSHAKE_LIMITS),
                                                             self.handshake_timeout)
            if msg_type != TrackerMsg.AUTH:
                raise AuthenticationError("this tracker requires a token: expected AUTH, got message type %d"
                                          % msg_type)
            client_nonce = handshake.check_auth(self.token, nonce, payload)
            welcome["proof"] = handshake.server_proof(self.token, nonce, client_nonce)
        conn.send(TrackerMsg.WELCOME, 0, welcome)

    def _forget(self, conn: Conn) -> None:
        """A connection ended: withdraw its requests (their tickets keep their places a while), drop its device."""
        for request in list(conn.requests.values()):
            if request.ticket and request.state in ("pending", "expecting"):
                self._restored.leave_ticket(tracker_state.Ticket(request.ticket, request.pattern_text,
                                                                 request.priority, request.seq, request.deadline()))
            self._finish_request(request, "withdrawn")
        conn.requests.clear()
        device = conn.device
        if device is not None and self.pool.devices.get(device.id) is device:
            log.info("device %d (%s) left", device.id, device.key)
            if device.state == "busy" and device.holder and not device.reverse:
                # its session may well go on (a tracker link blip): the holder is back when it re-registers busy
                self._restored.holds[(device.key, device.host, device.port)] = {
                    "holder": device.holder, "since": device.since, "expires": time.time() + tracker_state.HOLD_GRACE}
            self._drop_grant(device)
            self.pool.remove_device(device)

    # ---------------------------------------------------------------------------------------------- devices
    async def _device_loop(self, conn: Conn) -> None:
        handlers = {TrackerMsg.REGISTER: self._on_register, TrackerMsg.HEARTBEAT: self._on_heartbeat,
                    TrackerMsg.EXPECTED: self._on_expected, TrackerMsg.SESSION: self._on_session}
        while True:
            msg_type, rid, payload, _ = await conn.read_frame(TRACKER_LIMITS)
            self.traffic["frames"] += 1
            if conn.device is not None:
                conn.device.last_seen = time.monotonic()
            handler = handlers.get(msg_type)
            if handler is None:
                raise ProtocolError("a device may not send message type %d" % msg_type)
            if msg_type != TrackerMsg.REGISTER and conn.device is None:
                raise ProtocolError("a device must REGISTER before anything else")
            handler(conn, payload)

    def _on_register(self, conn: Conn, payload: dict) -> None:
        reg = check_register(payload)
        device = conn.device
        if device is not None and device.key != reg["key"]:
            raise ProtocolError("a device cannot change its key from %r to %r; reconnect instead"
                                % (device.key, reg["key"]))
        if device is None and reg["reverse"] and self.ssl_context is not None:
            raise ProtocolError("this tracker serves TLS and cannot relay reverse-mode devices (each side's TLS "
                                "ends at the tracker); register the device without --reverse")
        if device is None:
            host = reg["host"] or conn.peer[0]
            stale = None if reg["reverse"] else self.pool.find_by_address(reg["key"], host, reg["port"])
            if stale is not None:     # the same server came back on a new connection: the old one is dead
                log.info("device %d (%s) re-registered from a new connection", stale.id, stale.key)
                self._drop_grant(stale)
                self.pool.remove_device(stale)
                if stale.conn is not None:
                    stale.conn.device = None
                    stale.conn.close()
            device = Device(self.pool.next_id(), reg["key"], reg["tags"], reg["info"], host, reg["port"],
                            reg["reverse"], conn)
            device.state = reg["state"]
            if device.state == "busy" and not device.reverse:
                # a session that outlived a tracker restart: its holder, from the state file
                hold = self._restored.claim_hold((device.key, host, device.port))
                if hold is not None:
                    device.holder, device.since = hold["holder"], hold["since"]
            conn.device = device
            self.pool.add_device(device)
            conn.send(TrackerMsg.REGISTERED, 0, {"device": device.id, "heartbeat": self.heartbeat})
            log.info("device %d registered: key %s at %s:%d%s", device.id, device.key, host, reg["port"],
                     " (reverse)" if reg["reverse"] else "")
        else:
            device.info = reg["info"] or device.info
            self.pool.set_tags(device, device_tags(device.key, reg["tags"], device.info))
        if reg["state"] == "free":
            # "free" from a device holding an outstanding grant means a different session just ended (an older
            # grant used late); the grant stands, its client may be connecting right now
            if device.state != "granted":
                self._device_free(device)
        elif device.state == "free":
            self.pool.set_state(device, "busy", "(direct session)")

    def _on_heartbeat(self, conn: Conn, payload: dict) -> None:
        # a thousand devices send one a second: echo a frame encoded once
        if not conn.closed:
            conn.writer.write(_HEARTBEAT_FRAME)

    def _on_expected(self, conn: Conn, payload: dict) -> None:
        match = check_match(payload)
        entry = self._by_match.get(match)
        if entry is None or entry[0] is not conn.device:
            return          # revoked meanwhile
        device, request = entry
        if request.conn.closed:
            self._revoke(device, "the requester left before its grant was sent")
            return
        self._cancel_timer(device)
        loop = asyncio.get_running_loop()
        device.grant_timer = loop.call_later(self.grant_timeout, self._grant_expired, device, match)
        grant = {"host": None if device.reverse else device.host, "port": None if device.reverse else device.port,
                 "match": match, "key": device.key, "device": device.id, "relay": device.reverse,
                 "session_timeout": request.session_timeout}
        self.stats["grants"] += 1
        request.state = "granted"
        request.conn.requests.pop(request.rid, None)
        request.conn.send(TrackerMsg.GRANT, request.rid, grant)

    def _on_session(self, conn: Conn, payload: dict) -> None:
        device = conn.device
        state = payload.get("state")
        if state == "started":
            match = payload.get("match")
            self._cancel_timer(device)
            if device.match is not None and device.match != match:
                # a session other than the one we granted (an older grant used late, or a direct client)
                self._drop_grant(device)
            holder = device.holder if device.match == match and device.match else "(direct session)"
            self.pool.set_state(device, "busy", holder)
            device.match = match if isinstance(match, str) else None
        elif state == "ended":
            self._device_free(device)
        else:
            raise ProtocolError("SESSION state must be 'started' or 'ended', got %.20r" % (state,))

    def _device_free(self, device: Device) -> None:
        self._drop_grant(device)
        self.pool.set_state(device, "free")
        self._dispatch_device(device)

    def _drop_grant(self, device: Device) -> None:
        self._cancel_timer(device)
        if device.match is not None:
            entry = self._by_match.pop(device.match, None)
            if entry is not None and entry[1].state == "expecting":
                # the device fell through before the client heard of it: the request keeps its place in line
                self._requeue(entry[1])
            dial = self._dials.pop(device.match, None)
            if dial is not None and not dial.done():
                dial.cancel()
            device.match = None

    @staticmethod
    def _cancel_timer(device: Device) -> None:
        if device.grant_timer is not None:
            device.grant_timer.cancel()
            device.grant_timer = None

    def _grant_expired(self, device: Device, match: str) -> None:
        device.grant_timer = None
        if device.state == "granted" and device.match == match:
            self._revoke(device, "its grant was not used within %.1f s" % self.grant_timeout)

    def _revoke(self, device: Device, why: str) -> None:
        log.info("device %d (%s) back to the pool: %s", device.id, device.key, why)
        self.stats["revoked"] += 1
        if device.match is not None and device.conn is not None:
            device.conn.send(TrackerMsg.REVOKE, 0, {"match": device.match})
        self._device_free(device)

    async def _sweep(self) -> None:
        """Drop devices whose connection went silent (a heartbeat is due every ``heartbeat`` seconds)."""
        period = min(0.5, self.dead_after / 4)
        loop = asyncio.get_running_loop()
        while True:
            before = loop.time()
            await asyncio.sleep(period)
            if loop.time() - before > period + self.dead_after / 2:
                # this loop was blocked (a huge burst of work): heartbeats may sit unread in socket buffers,
                # so silence measured now would be ours, not the devices'
                continue
            if self._restored.expire() and self._state_writer is not None:
                self._state_writer.changed()
            deadline = time.monotonic() - self.dead_after
            for device in [d for d in self.pool.devices.values() if d.last_seen < deadline]:
                log.warning("device %d (%s) silent for %.1f s: removed", device.id, device.key, self.dead_after)
                self._drop_grant(device)
                self.pool.remove_device(device)
                if device.conn is not None:
                    device.conn.device = None
                    device.conn.close()

    # ---------------------------------------------------------------------------------------------- clients
    async def _client_loop(self, conn: Conn) -> None:
        while True:
            msg_type, rid, payload, _ = await conn.read_frame(TRACKER_LIMITS)
            self.traffic["frames"] += 1
            if msg_type == TrackerMsg.REQUEST:
                self.traffic["requests"] += 1
                try:
                    self._on_request(conn, rid, check_request(payload))
                except ProtocolError as exc:
                    conn.send_error(rid, exc)      # a bad request is refused; the connection stays
            elif msg_type == TrackerMsg.CANCEL:
                request = conn.requests.pop(rid, None)
                if request is not None:
                    self._finish_request(request, "withdrawn")
            elif msg_type == TrackerMsg.SUMMARY:
                conn.send_frame(self._summary_frame(rid))
            else:
                raise ProtocolError("a client may not send message type %d" % msg_type)

    def _on_request(self, conn: Conn, rid: int, req: dict) -> None:
        if rid in conn.requests:
            raise ProtocolError("request id %d is already waiting on this connection" % rid)
        if len(conn.requests) >= self.max_requests_per_conn:
            raise ProtocolError("this connection already has %d requests waiting (the limit)" % len(conn.requests))
        request = Request(self.pool.next_id(), conn, rid, req["key"], req["priority"], req["wait_timeout"],
                          req["session_timeout"], conn.name)
        place = self._restored.claim_ticket(req["ticket"], req["key"])
        if place is not None:       # a client back after a restart or a lost connection: its old place in line
            request.seq = place.seq
        request.ticket = place.ticket if place is not None else secrets.token_urlsafe(12)
        conn.requests[rid] = request
        device = self.pool.add_request(request)
        if device is not None:
            self._grant(device, request)
            return
        state = self.pool.queue_state(request.pattern_text)
        conn.send(TrackerMsg.QUEUED, rid, dict(state, key=request.pattern_text, ticket=request.ticket))
        request.timer = asyncio.get_running_loop().call_later(request.wait_timeout, self._request_timed_out,
                                                              request)

    def _finish_request(self, request: Request, state: str) -> None:
        if request.timer is not None:
            request.timer.cancel()
            request.timer = None
        self.pool.withdraw(request, state)

    def _request_timed_out(self, request: Request) -> None:
        request.timer = None
        if request.state != "pending":
            return
        self.stats["timeouts"] += 1
        self._finish_request(request, "timed_out")
        request.conn.requests.pop(request.rid, None)
        state = self.pool.queue_state(request.pattern_text)
        busy = state["total"] - state["free"]
        message = ("no device for %r within wait_timeout=%gs: %d device(s) match (%d busy or granted, %d free), "
                   "%d other request(s) still queued for it"
                   % (request.pattern_text, request.wait_timeout, state["total"], busy, state["free"],
                      state["pending"]))
        if state["total"] == 0:
            message += "; no registered device has this key or tag (check `tether query`)"
        request.conn.send(p.MsgType.ERROR, request.rid, {"type": p.ErrorType.TIMEOUT, "message": message,
                                                         "traceback": ""})

    def _requeue(self, request: Request) -> None:
        if request.conn.closed:
            request.state = "withdrawn"
            return
        request.state = "pending"
        device = self.pool.add_request(request)
        if device is not None:
            self._grant(device, request)
            return
        left = request.created + request.wait_timeout - time.monotonic()
        request.timer = asyncio.get_running_loop().call_later(max(0.0, left), self._request_timed_out, request)

    def _grant(self, device: Device, request: Request) -> None:
        """Reserve ``device`` for ``request``: tell the device the match token first (GRANT follows EXPECTED)."""
        if request.timer is not None:
            request.timer.cancel()
            request.timer = None
        match = secrets.token_urlsafe(18)
        self.pool.set_state(device, "granted", request.name)
        device.match = match
        device.session_timeout = request.session_timeout
        self._by_match[match] = (device, request)
        device.conn.send(TrackerMsg.EXPECT, 0, {"match": match, "session_timeout": request.session_timeout,
                                                "client": request.name, "grant": request.id})
        # the device must acknowledge within the grant window too, or the grant is revoked
        device.grant_timer = asyncio.get_running_loop().call_later(self.grant_timeout, self._grant_expired,
                                                                   device, match)

    def _dispatch_device(self, device: Device) -> None:
        if device.state != "free":
            return
        while True:
            request = self.pool.next_request_for(device)
            if request is None:
                return
            if request.conn.closed:
                continue
            self._grant(device, request)
            return

    def _summary_frame(self, rid: int) -> bytes:
        """SUMMARY_REPLY ``{devices, queues, stats}``, framed by hand around each device's cached encoding."""
        pack = self._packer
        devices = self.pool.encoded_devices()
        body = b"".join([pack.pack_array_header(3), pack.pack(int(TrackerMsg.SUMMARY_REPLY)), pack.pack(rid),
                         pack.pack_map_header(3), pack.pack("devices"), pack.pack_array_header(len(devices))]
                        + devices + [pack.pack("queues"), pack.pack(self.pool.queues()), pack.pack("stats"),
                                     pack.pack(self.stats)])
        return p.HEADER.pack(len(body)) + body

    def _snapshot(self) -> dict:
        """Places in line and holds, for the state file (module tether.tracker.state)."""
        waiting = self.pool.pending_requests() + [r for _, r in self._by_match.values() if r.state == "expecting"]
        tickets = [tracker_state.Ticket(r.ticket, r.pattern_text, r.priority, r.seq, r.deadline())
                   for r in waiting if r.ticket and not r.conn.closed]
        tickets += self._restored.tickets.values()
        holds = [{"key": d.key, "host": d.host, "port": d.port, "holder": d.holder, "since": d.since}
                 for d in self.pool.devices.values() if d.state == "busy" and d.holder and not d.reverse]
        holds += [{"key": a[0], "host": a[1], "port": a[2], "holder": h["holder"], "since": h["since"]}
                  for a, h in self._restored.holds.items()]
        return tracker_state.snapshot(self.pool.last_id, tickets, holds)

    # ------------------------------------------------------------------------------------------------ relay
    async def _relay_client(self, conn: Conn, payload: dict, raw_hello: bytes) -> None:
        """A client sent the core HELLO to the tracker: it wants a reverse-mode device, named by its match."""
        match = payload.get("match")
        entry = self._by_match.get(match) if isinstance(match, str) else None
        if entry is None or not entry[0].reverse or entry[0].state != "granted":
            conn.send_error(0, AuthenticationError("the tracker relays only granted sessions of reverse-mode "
                                                   "devices: this HELLO's match token is unknown or used"))
            conn.close()
            return
        device = entry[0]
        future: "asyncio.Future[Conn]" = asyncio.get_running_loop().create_future()
        self._dials[match] = future
        device.conn.send(TrackerMsg.DIAL, 0, {"match": match})
        try:
            data_conn = await asyncio.wait_for(future, self.dial_timeout)
        except (asyncio.TimeoutError, asyncio.CancelledError):
            self._dials.pop(match, None)
            conn.send_error(0, ConnectionClosed("reverse-mode device %d (%s) did not dial back within %.1f s"
                                                % (device.id, device.key, self.dial_timeout)))
            conn.close()
            return
        self.stats["relayed"] += 1
        client_sock, client_extra = take_socket(conn.reader, conn.writer)
        device_sock, device_extra = take_socket(data_conn.reader, data_conn.writer)
        conn.closed = data_conn.closed = True
        Relay(client_sock, device_sock, "relay-%s" % match[:6]).start(raw_hello + client_extra, device_extra)

    def _relay_device(self, conn: Conn, payload: dict) -> None:
        match = check_match(payload)
        future = self._dials.pop(match, None)
        if future is None or future.done():
            raise AuthenticationError("RELAY for a match token the tracker is not dialling")
        future.set_result(conn)


async def run_tracker(host: str = "127.0.0.1", port: int = 9190, token: Optional[str] = None,
                      ready: Optional[Any] = None, **options: Any) -> None:
    """Run a tracker until cancelled; ``ready(server)`` is called once it listens."""
    server = TrackerServer(host, port, token=token, **options)
    await server.start()
    if ready is not None:
        ready(server)
    try:
        await server.serve_forever()
    finally:
        server.close()
