"""Just enough HTTP/1.1 for the tracker's dashboard, on asyncio streams in the tracker's own loop.

One request per connection (every response says ``Connection: close``), no chunked bodies, no upgrades. Every
size is capped before anything is allocated for it (the request head by the stream's buffer limit, the body by
its declared length) and the whole request must arrive within one deadline, so a slow or hostile peer costs one
small buffer and one timer, never a blocked loop.
"""
from __future__ import annotations

import asyncio
import json
from typing import Dict, Iterable, Optional, Tuple
from urllib.parse import unquote, urlsplit

MAX_HEAD = 16 * 1024          # request line + headers; also the StreamReader limit the server is started with
MAX_HEADERS = 64

REASONS = {200: "OK", 204: "No Content", 303: "See Other", 400: "Bad Request", 401: "Unauthorized",
           403: "Forbidden", 404: "Not Found", 405: "Method Not Allowed", 408: "Request Timeout",
           411: "Length Required", 413: "Content Too Large", 415: "Unsupported Media Type",
           421: "Misdirected Request", 431: "Request Header Fields Too Large", 501: "Not Implemented",
           503: "Service Unavailable"}

# with every answer: no MIME sniffing, no caching, no framing (clickjacking the login form); "same-origin" rather
# than "no-referrer" because under the latter a browser sends `Origin: null` with the login form, which the
# dashboard's origin check must refuse
SECURITY_HEADERS = (("X-Content-Type-Options", "nosniff"), ("Referrer-Policy", "same-origin"),
                    ("Cache-Control", "no-store"), ("X-Frame-Options", "DENY"))


class HttpError(Exception):
    """A request the dashboard refuses: ``status`` and a one-line reason for the body."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class Request:
    __slots__ = ("method", "path", "query", "headers", "body")

    def __init__(self, method: str, path: str, query: str, headers: Dict[str, str], body: bytes):
        self.method = method
        self.path = path
        self.query = query
        self.headers = headers
        self.body = body


async def read_request(reader: asyncio.StreamReader, max_body: int) -> Request:
    """Read one request (the caller bounds the time); raises :class:`HttpError` for anything malformed."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.LimitOverrunError:
        raise HttpError(431, "the request head exceeds %d bytes" % MAX_HEAD) from None
    except asyncio.IncompleteReadError:
        raise ConnectionResetError("the peer closed before a complete request") from None
    lines = head[:-4].decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise HttpError(400, "expected a request line 'METHOD /path HTTP/1.1'")
    method, target, _ = parts
    if len(lines) - 1 > MAX_HEADERS:
        raise HttpError(431, "more than %d header lines" % MAX_HEADERS)
    headers: Dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise HttpError(400, "malformed header line")
        name = name.lower()
        if name in headers and name in ("content-length", "host", "authorization"):
            raise HttpError(400, "header %s given twice" % name)
        headers[name] = value.strip()
    if "transfer-encoding" in headers:
        raise HttpError(501, "chunked or encoded request bodies are not accepted; send Content-Length")
    body = b""
    length_text = headers.get("content-length")
    if length_text is not None:
        if not length_text.isdigit() or len(length_text) > 12:
            raise HttpError(400, "Content-Length must be a decimal byte count")
        length = int(length_text)
        if length > max_body:
            raise HttpError(413, "a %s request body may have at most %d bytes, this one declares %d"
                            % (method, max_body, length))
        try:
            body = await reader.readexactly(length)
        except asyncio.IncompleteReadError:
            raise ConnectionResetError("the peer closed in the middle of the body") from None
    elif method in ("POST", "PUT"):
        raise HttpError(411, "a %s needs a Content-Length" % method)
    split = urlsplit(target)
    if split.scheme or split.netloc or not split.path.startswith("/"):
        raise HttpError(400, "the request target must be a path")
    return Request(method, unquote(split.path), split.query, headers, body)


def response_head(status: int, content_type: Optional[str], length: Optional[int],
                  extra: Iterable[Tuple[str, str]] = ()) -> bytes:
    """Status line and headers (with the security headers); no Content-Length when ``length`` is None."""
    lines = ["HTTP/1.1 %d %s" % (status, REASONS.get(status, "Status"))]
    if content_type:
        lines.append("Content-Type: " + content_type)
    if length is not None:
        lines.append("Content-Length: %d" % length)
    lines.append("Connection: close")
    lines.extend("%s: %s" % kv for kv in SECURITY_HEADERS)
    lines.extend("%s: %s" % kv for kv in extra)
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def response(status: int, body: bytes = b"", content_type: Optional[str] = "text/plain; charset=utf-8",
             extra: Iterable[Tuple[str, str]] = ()) -> bytes:
    return response_head(status, content_type if body else None, len(body), extra) + body


def json_response(status: int, doc: object, extra: Iterable[Tuple[str, str]] = ()) -> bytes:
    return response(status, json.dumps(doc, separators=(",", ":")).encode(), "application/json", extra)


def error_response(exc: HttpError) -> bytes:
    return json_response(exc.status, {"error": str(exc)})


LINGER_BYTES = 8 << 20       # what a refused client may still send after its answer; the rest is cut off
LINGER_SECONDS = 2.0


async def linger(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Half-close after an early answer and discard what the peer still sends, within a byte and time bound.

    A request refused before its body was read (413, 431...) leaves the client still sending; closing at once
    makes the kernel reset the connection, and the client sees a broken pipe instead of the answer it was sent.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + LINGER_SECONDS
    discarded = 0
    try:
        if writer.can_write_eof():
            writer.write_eof()
        while discarded < LINGER_BYTES:
            left = deadline - loop.time()
            if left <= 0:
                return
            chunk = await asyncio.wait_for(reader.read(65536), left)
            if not chunk:
                return
            discarded += len(chunk)
    except (asyncio.TimeoutError, ConnectionError, OSError):
        return
