"""The tracker's dashboard: one HTML page, a JSON state endpoint, a Server-Sent Events stream and bench uploads.

It serves from the tracker's own asyncio loop. The pool is plain Python objects owned by that loop, so a thread
would still have to ask the loop for every snapshot (or race its dicts mid-change); in the loop, a snapshot is
consistent by construction and costs what ``Pool.summary`` costs. That cost is paid at most once per tick for
all open pages together (every stream gets the same encoded bytes) and at most once per ``STATE_MAX_AGE`` for
scripts polling ``/api/state``, whatever the number of viewers. All socket I/O is non-blocking; a page that
reads its stream too slowly is dropped instead of buffered for, and every request and stream is bounded in size
and time (``tether.tracker.http``).

Access: with a tracker token the dashboard asks for it too, wherever it listens (the page shows no more than
`tether query` does, and that needs the token), as ``Authorization: Bearer TOKEN`` or through the login form,
which sets a cookie derived from the token and a secret of this process (the token itself is never stored in the
browser, and a tracker restart logs everyone out); comparisons are constant-time. Without a token it listens on
loopback only, and the Host header must then name that loopback address (a web page elsewhere cannot reach it
through DNS rebinding). Uploads must be ``application/json``, which a cross-site form cannot send without a
preflight that this server never grants.
"""
from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import html
import json
import logging
import os
import re
import secrets
import time
from typing import Any, Dict, Optional, Set
from urllib.parse import parse_qs

from tether_rpc.config import is_loopback

from . import http
from .bench_board import BenchBoard, BenchUploadError
from .load import LoadSampler

log = logging.getLogger(__name__)

PAGE_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "dashboard.html")
COOKIE = "tether_dashboard"
STATE_MAX_AGE = 0.25         # seconds a built /api/state answer is reused for the next script asking
MAX_STREAM_BUFFER = 1 << 20  # bytes queued for one page before it counts as gone
MAX_LOGIN_BODY = 4096


class DashboardConfigError(ValueError):
    """A dashboard that would be reachable beyond loopback without the tracker's token."""


def check_access(host: str, token: Optional[str]) -> bool:
    """Whether a dashboard on ``host`` asks for the token (whenever the tracker has one); raises
    :class:`DashboardConfigError` if it would be reachable beyond loopback without one."""
    if token:
        return True
    if not is_loopback(host):
        raise DashboardConfigError(
            "refusing to serve the dashboard on %s without the tracker's token: anyone who can reach it would see "
            "every device and who holds it, and could post bench results. Give the tracker --token (the page then "
            "asks for it), or keep --http-host on loopback and reach it through an SSH tunnel." % host)
    return False


def _inline_hashes(page: str, tag: str) -> str:
    """CSP sources for the page's inline ``<tag>`` blocks, by their SHA-256 (only these may run / apply)."""
    blocks = re.findall(r"<%s>(.*?)</%s>" % (tag, tag), page, re.S)
    return " ".join("'sha256-%s'" % base64.b64encode(hashlib.sha256(b.encode()).digest()).decode() for b in blocks)


LOGIN_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><link rel="icon" href="data:,"><title>tether tracker: log in</title>
</head><body><h1>tether tracker</h1><p>%s</p>
<form method="post" action="/login"><label>tracker token <input type="password" name="token" autofocus></label>
<button type="submit">log in</button></form></body></html>
"""


class Dashboard:
    """Serves the dashboard of ``tracker`` on ``host:port``; ``await start()``, ``close()``."""

    def __init__(self, tracker: Any, host: str = "127.0.0.1", port: int = 0, *, token: Optional[str] = None,
                 interval: float = 1.0, max_connections: int = 64, max_streams: int = 32,
                 stream_seconds: float = 3600.0, request_timeout: float = 10.0, max_body: int = 1 << 20,
                 bench_keep: int = 20):
        self.tracker = tracker
        self.host = host
        self.port = port
        self.auth_required = check_access(host, token)
        self._loopback = is_loopback(host)
        self._token = token.encode() if token else b""
        self._cookie = (hmac.new(self._token, b"tether-dashboard-cookie-v1" + secrets.token_bytes(32),
                                 hashlib.sha256).hexdigest().encode() if token else b"")
        self.interval = interval
        self.max_connections = max_connections
        self.max_streams = max_streams
        self.stream_seconds = stream_seconds
        self.request_timeout = request_timeout
        self.max_body = max_body
        self.bench = BenchBoard(bench_keep)
        self.load = LoadSampler()
        with open(PAGE_PATH, encoding="utf-8") as f:
            self._page = f.read().encode()
        page = self._page.decode()
        self._csp = ("default-src 'none'; script-src %s; style-src %s; connect-src 'self'; img-src data:; "
                     "form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
                     % (_inline_hashes(page, "script"), _inline_hashes(page, "style")))
        self._login_csp = "default-src 'none'; img-src data:; form-action 'self'; base-uri 'none'; " \
                          "frame-ancestors 'none'"
        self._server: Optional[asyncio.base_events.Server] = None
        self._ticker: Optional["asyncio.Task[None]"] = None
        self._streams: Set[asyncio.StreamWriter] = set()
        self._open = 0
        self._hosts: Set[str] = set()
        self._state_cache = (-1.0, b"")
        self._lag_ms = 0.0

    # ------------------------------------------------------------------------------------------- lifecycle
    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, self.host, self.port, limit=http.MAX_HEAD,
                                                  backlog=128, reuse_address=True)
        self.port = self._server.sockets[0].getsockname()[1]
        self._hosts = {"%s:%d" % (h, self.port) for h in ("127.0.0.1", "localhost", "[::1]")} | {
            "127.0.0.1", "localhost", "[::1]"}
        self.load.sample(self._counters(), self._gauges())
        self._ticker = asyncio.ensure_future(self._tick())
        log.info("dashboard on http://%s:%d/%s", self.host, self.port, " (token required)" if self.auth_required
                 else "")

    def close(self) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
            self._ticker = None
        if self._server is not None:
            self._server.close()
            self._server = None
        for writer in list(self._streams):
            writer.transport.abort()
        self._streams.clear()

    @property
    def url(self) -> str:
        return "http://%s:%d/" % ("[%s]" % self.host if ":" in self.host else self.host, self.port)

    # ---------------------------------------------------------------------------------------------- state
    def _counters(self) -> Dict[str, float]:
        traffic = getattr(self.tracker, "traffic", {})
        return {"frames": traffic.get("frames", 0), "requests": traffic.get("requests", 0),
                "grants": self.tracker.stats.get("grants", 0)}

    def _gauges(self) -> Dict[str, float]:
        return {"connections": self.tracker.connection_count(), "dashboard_streams": len(self._streams),
                "loop_lag_ms": self._lag_ms}

    def snapshot(self) -> Dict[str, Any]:
        """The whole dashboard state: what ``/api/state`` answers and each stream event carries."""
        pool = self.tracker.pool
        summary = pool.summary()
        waiting = pool.waiting()
        devices = []
        for d in summary["devices"]:
            info = d.get("info") if isinstance(d.get("info"), dict) else {}
            tags = d.get("tags") or {}
            os_info = info.get("os") if isinstance(info.get("os"), dict) else {}
            devices.append({
                "id": d["id"], "key": d["key"], "state": d["state"], "holder": d["holder"], "since": d["since"],
                "registered_at": d["registered_at"], "host": d["host"], "port": d["port"], "reverse": d["reverse"],
                "tags": tags, "board": info.get("board") or tags.get("board"), "cpu": info.get("cpu_model"),
                "arch": info.get("arch"), "target": info.get("suggested_target") or tags.get("target"),
                "os": os_info.get("name") or os_info.get("system") or tags.get("os")})
        queues = {}
        for pattern, q in summary["queues"].items():
            queues[pattern] = dict(q, busy=q["total"] - q["free"], waiting=waiting.get(pattern, {}).get("first", []))
        return {"time": time.time(),
                "tracker": {"host": self.tracker.host, "port": self.tracker.port, "token": bool(self.tracker.token)},
                "devices": devices, "queues": queues, "stats": dict(self.tracker.stats), "load": self.load.last,
                "bench": self.bench.items()}

    def _state_bytes(self) -> bytes:
        now = time.monotonic()
        built, data = self._state_cache
        if now - built > STATE_MAX_AGE:
            data = json.dumps(self.snapshot(), separators=(",", ":"), default=str).encode()
            self._state_cache = (now, data)
        return data

    async def _tick(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + self.interval
            await asyncio.sleep(self.interval)
            # how late this timer fired: what anything else waiting in the tracker's loop was delayed by
            self._lag_ms = round(max(0.0, loop.time() - due) * 1000, 1)
            try:
                self.load.sample(self._counters(), self._gauges())
                if self._streams:
                    self._state_cache = (-1.0, b"")
                    event = b"data: " + self._state_bytes() + b"\n\n"
                    for writer in list(self._streams):
                        self._push(writer, event)
            except Exception:     # a bug here must stop neither the pages' updates nor the tracker
                log.exception("dashboard: tick failed")

    def _push(self, writer: asyncio.StreamWriter, event: bytes) -> None:
        transport = writer.transport
        if transport.is_closing():
            self._streams.discard(writer)
        elif transport.get_write_buffer_size() > MAX_STREAM_BUFFER:
            log.info("dashboard: a page stopped reading its stream; dropped")
            self._streams.discard(writer)
            transport.abort()
        else:
            writer.write(event)

    # -------------------------------------------------------------------------------------------- requests
    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._open >= self.max_connections:
            writer.write(http.json_response(503, {"error": "the dashboard has %d connections open (the limit)"
                                                  % self.max_connections}))
            writer.close()
            return
        self._open += 1
        refused = False
        try:
            try:
                request = await asyncio.wait_for(http.read_request(reader, self.max_body), self.request_timeout)
                await self._route(request, reader, writer)
            except http.HttpError as exc:
                writer.write(http.error_response(exc))
                refused = True
            except asyncio.TimeoutError:
                writer.write(http.json_response(408, {"error": "no complete request within %.0f s"
                                                      % self.request_timeout}))
            try:
                await asyncio.wait_for(writer.drain(), self.request_timeout)
            except asyncio.TimeoutError:
                writer.transport.abort()        # it does not read its answer: do not keep it for it
                refused = False
            if refused:
                await http.linger(reader, writer)
        except (ConnectionError, OSError):
            pass
        except Exception:     # a bug in one request must not take the tracker down
            log.exception("dashboard: unexpected error")
        finally:
            self._open -= 1
            writer.close()

    def _authorized(self, request: http.Request) -> bool:
        if not self.auth_required:
            return True
        auth = request.headers.get("authorization", "")
        if auth[:7].lower() == "bearer ":
            return hmac.compare_digest(auth[7:].strip().encode("latin-1"), self._token)
        for part in request.headers.get("cookie", "").split(";"):
            name, _, value = part.strip().partition("=")
            if name == COOKIE and hmac.compare_digest(value.encode("latin-1"), self._cookie):
                return True
        return False

    def _check_origin(self, request: http.Request) -> None:
        if not self._loopback:
            return          # the token decides; its cookie is SameSite=Strict, so other sites cannot use it
        host = request.headers.get("host", "")
        if host not in self._hosts:
            raise http.HttpError(421, "this dashboard answers only to 127.0.0.1:%d or localhost:%d"
                                 % (self.port, self.port))
        origin = request.headers.get("origin")
        if origin is not None and origin.split("//", 1)[-1] not in self._hosts:
            raise http.HttpError(403, "requests from another site's page are refused")

    async def _route(self, request: http.Request, reader: asyncio.StreamReader,
                     writer: asyncio.StreamWriter) -> None:
        self._check_origin(request)
        method, path = request.method, request.path
        routes = {"/": ("GET",), "/index.html": ("GET",), "/login": ("POST",), "/api/state": ("GET",),
                  "/api/events": ("GET",), "/api/bench": ("GET", "POST"), "/favicon.ico": ("GET",)}
        if path not in routes:
            raise http.HttpError(404, "no such page: %.100s" % path)
        if method not in routes[path]:
            raise http.HttpError(405, "%s takes %s, not %.10s" % (path, " or ".join(routes[path]), method))
        if path == "/favicon.ico":
            writer.write(http.response(204))
        elif path == "/login":
            await self._login(request, writer)
        elif not self._authorized(request):
            if path.startswith("/api/"):
                writer.write(http.json_response(401, {"error": "the tracker's token is required (Authorization: "
                                                               "Bearer TOKEN)"},
                                                (("WWW-Authenticate", 'Bearer realm="tether-tracker"'),)))
            else:
                writer.write(self._login_page(401, "This tracker's dashboard needs the tracker's token."))
        elif path in ("/", "/index.html"):
            writer.write(http.response(200, self._page, "text/html; charset=utf-8",
                                       (("Content-Security-Policy", self._csp),)))
        elif path == "/api/state":
            writer.write(http.response(200, self._state_bytes(), "application/json"))
        elif path == "/api/events":
            await self._stream(reader, writer)
        elif method == "GET":
            writer.write(http.json_response(200, {"bench": self.bench.items()}))
        else:
            ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
            if ctype != "application/json":
                raise http.HttpError(415, "a bench upload must be sent as application/json")
            try:
                kept = self.bench.add(request.body, "%s" % (writer.get_extra_info("peername") or ("?",))[0])
            except BenchUploadError as exc:
                raise http.HttpError(400, str(exc)) from None
            self._state_cache = (-1.0, b"")    # the uploader may look for it right away
            writer.write(http.json_response(200, {"kept": kept["id"], "results": len(kept["results"])}))

    def _login_page(self, status: int, message: str, extra: tuple = ()) -> bytes:
        body = (LOGIN_PAGE % html.escape(message)).encode()
        return http.response(status, body, "text/html; charset=utf-8",
                             (("Content-Security-Policy", self._login_csp),) + extra)

    async def _login(self, request: http.Request, writer: asyncio.StreamWriter) -> None:
        if not self.auth_required:
            writer.write(http.response(303, extra=(("Location", "/"),)))
            return
        if len(request.body) > MAX_LOGIN_BODY:
            raise http.HttpError(413, "a login form has at most %d bytes" % MAX_LOGIN_BODY)
        given = parse_qs(request.body.decode("utf-8", "replace"), max_num_fields=4).get("token", [""])[0]
        if hmac.compare_digest(given.encode("utf-8", "replace"), self._token):
            cookie = "%s=%s; Path=/; HttpOnly; SameSite=Strict" % (COOKIE, self._cookie.decode())
            writer.write(http.response(303, extra=(("Location", "/"), ("Set-Cookie", cookie))))
            return
        await asyncio.sleep(0.5)     # slows guessing down without holding up the tracker's loop
        writer.write(self._login_page(401, "That is not the tracker's token."))

    async def _stream(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(self._streams) >= self.max_streams:
            raise http.HttpError(503, "%d pages are open on this tracker (the limit)" % self.max_streams)
        writer.write(http.response_head(200, "text/event-stream; charset=utf-8", None) + b"retry: 2000\n\n"
                     + b"data: " + self._state_bytes() + b"\n\n")
        self._streams.add(writer)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.stream_seconds
        received = 0
        try:
            # the page sends nothing more: end of input means it left; the stream's lifetime bounds it anyway
            # (EventSource reconnects by itself)
            while received <= http.MAX_HEAD:
                left = deadline - loop.time()
                if left <= 0:
                    break
                try:
                    chunk = await asyncio.wait_for(reader.read(4096), left)
                except asyncio.TimeoutError:
                    break
                if not chunk:
                    break
                received += len(chunk)
        finally:
            self._streams.discard(writer)

