"""The web relay: lets a browser tab be a tether device by joining WebSockets to the tracker's TCP port.

A tab can neither accept connections nor open raw TCP ones, so the JS device (bindings/js) registers in reverse
mode through this relay: each WebSocket the tab opens at ``/tracker`` becomes one TCP connection to the tracker,
and binary messages carry the raw bytes of that stream both ways (any split; text messages are refused). Nothing
is parsed here: the tracker's HELLO, its token HMAC and the RPC frames run end to end between the tab and the
tracker, so the tracker's token rules apply unchanged.

The relay also serves the device page and its ES modules over plain HTTP (``/`` -> ``/js/web/device.html``,
``/js/src/*.js``, ``/js/web/*``) from the ``bindings/js`` folder, since a module script needs an http origin.

Safety: it binds 127.0.0.1 by default (``rpc-tracker --web`` refuses another address without the tracker's
token); a WebSocket whose ``Origin`` is not the relay's own page (or one given with ``--web-origin``) is refused
with 403, so a web page the user happens to visit cannot reach the tracker through it; messages are capped at
:data:`MAX_MESSAGE` and concurrent bridges at :data:`MAX_BRIDGES`.
"""
from __future__ import annotations

import asyncio
import http
import logging
import pathlib
import re
import socket
from typing import Iterable, Optional, Set

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

log = logging.getLogger(__name__)

#: Largest WebSocket message accepted from a tab (the JS transport sends at most 1 MiB per message).
MAX_MESSAGE = 4 << 20
#: Bytes read from the tracker per message sent to the tab.
READ_CHUNK = 1 << 20
#: Concurrent tab connections (a tab holds one, plus one per session it serves).
MAX_BRIDGES = 256
#: The folder with src/ and web/ that the page is made of.
DEFAULT_ROOT = pathlib.Path(__file__).resolve().parents[3] / "bindings" / "js"

WS_PATH = "/tracker"
PAGE_PATH = "/js/web/device.html"
_SERVED = re.compile(r"^/js/(src|web)/([A-Za-z0-9_][A-Za-z0-9_.-]*\.(js|mjs|html|css))$")
_TYPES = {"js": "text/javascript; charset=utf-8", "mjs": "text/javascript; charset=utf-8",
          "html": "text/html; charset=utf-8", "css": "text/css; charset=utf-8"}


def _response(status: int, body: bytes, content_type: str = "text/plain; charset=utf-8",
              extra: Iterable = ()) -> Response:
    headers = Headers([("Content-Type", content_type), ("Content-Length", str(len(body))),
                       ("Cache-Control", "no-store"), ("X-Content-Type-Options", "nosniff")] + list(extra))
    return Response(status, http.HTTPStatus(status).phrase, headers, body)


class WebRelay:
    """Serve the device page and bridge ``/tracker`` WebSockets to the tracker at ``tracker_host:tracker_port``."""

    def __init__(self, tracker_host: str, tracker_port: int, host: str = "127.0.0.1", port: int = 0,
                 origins: Iterable[str] = (), root: Optional[pathlib.Path] = None):
        self.tracker_host = tracker_host
        self.tracker_port = tracker_port
        self.host = host
        self.port = port
        self.extra_origins = set(origins)
        self.root = pathlib.Path(root) if root is not None else DEFAULT_ROOT
        self._server: Optional[Server] = None
        self._bridges: Set[asyncio.Task] = set()
        self.stats = {"bridged": 0, "refused": 0}

    async def start(self) -> None:
        self._server = await serve(self._bridge, self.host, self.port, process_request=self._process_request,
                                   max_size=MAX_MESSAGE, compression=None, ping_interval=20, ping_timeout=20)
        self.port = self._server.sockets[0].getsockname()[1]

    def close(self) -> None:
        if self._server is not None:
            self._server.close()

    @property
    def page_url(self) -> str:
        return "http://%s:%d%s" % ("127.0.0.1" if self.host in ("0.0.0.0", "") else self.host, self.port, PAGE_PATH)

    def allowed_origins(self) -> Set[str]:
        names = {self.host, "127.0.0.1", "localhost", "[::1]"} - {"0.0.0.0", ""}
        return {"http://%s:%d" % (n, self.port) for n in names} | self.extra_origins

    # -- HTTP ----------------------------------------------------------------------------------------------------
    def _process_request(self, connection: ServerConnection, request: Request) -> Optional[Response]:
        path = request.path.split("?", 1)[0]
        if path == WS_PATH:
            origin = request.headers.get("Origin")
            # a browser always sends Origin; only this relay's own page may open the tracker through it
            if origin is not None and origin not in self.allowed_origins():
                self.stats["refused"] += 1
                log.warning("refused a WebSocket from origin %.80s", origin)
                return _response(403, b"this relay accepts WebSockets only from its own page (origin %s refused)\n"
                                 % origin.encode("utf-8", "replace")[:200])
            if len(self._bridges) >= MAX_BRIDGES:
                return _response(503, b"too many connections\n")
            return None
        if path in ("/", "/index.html"):
            return _response(302, b"", extra=[("Location", PAGE_PATH)])
        m = _SERVED.match(path)
        if m is None:
            return _response(404, b"not found\n")
        file = self.root / m.group(1) / m.group(2)
        try:
            body = file.read_bytes()
        except OSError:
            return _response(404, b"not found\n")
        # cross-origin isolation: the tab's performance.now() then ticks in microseconds instead of 100 us steps,
        # which device-side timings need (the page loads nothing from other origins)
        return _response(200, body, _TYPES[m.group(3)], extra=[("Cross-Origin-Opener-Policy", "same-origin"),
                                                               ("Cross-Origin-Embedder-Policy", "require-corp")])

    # -- the bridge ----------------------------------------------------------------------------------------------
    async def _bridge(self, ws: ServerConnection) -> None:
        task = asyncio.current_task()
        self._bridges.add(task)
        writer = None
        try:
            try:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection(self.tracker_host, self.tracker_port), 10)
            except (OSError, asyncio.TimeoutError) as exc:
                await ws.close(1011, "cannot reach the tracker: %s" % str(exc)[:80])
                return
            sock = writer.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.stats["bridged"] += 1

            async def tab_to_tracker() -> None:
                async for message in ws:
                    if isinstance(message, str):
                        await ws.close(1003, "binary messages only: they carry the tracker stream's bytes")
                        return
                    writer.write(message)
                    await writer.drain()

            async def tracker_to_tab() -> None:
                while True:
                    data = await reader.read(READ_CHUNK)
                    if not data:
                        return
                    await ws.send(data)

            up = asyncio.ensure_future(tab_to_tracker())
            down = asyncio.ensure_future(tracker_to_tab())
            done, pending = await asyncio.wait({up, down}, return_when=asyncio.FIRST_COMPLETED)
            for t in pending:
                t.cancel()
            for t in done | pending:
                try:
                    await t
                except (asyncio.CancelledError, ConnectionClosed, OSError):
                    pass
        finally:
            if writer is not None:
                writer.close()
            await ws.close()
            self._bridges.discard(task)
