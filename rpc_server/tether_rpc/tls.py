"""Optional TLS (docs/tls.md), with the standard library's ssl module only.

The framing is the same inside TLS as on plain TCP; token authentication runs inside it unchanged. The server
loads a certificate and key (``--tls-cert``/``--tls-key``); clients pass ``tls=True`` (the system's trusted CAs),
``ca="ca.pem"`` (trust that CA or self-signed certificate), or their own ``ssl.SSLContext``. The fast paths that
bypass Python's socket layer (splice for uploads, MSG_DONTWAIT polling, sendmsg) are off on a TLS socket: every
byte goes through the ssl object (see tether_rpc.transport).
"""
from __future__ import annotations

import socket
from typing import Any, Optional, Union

try:
    import ssl
except ImportError:  # a Python built without OpenSSL: plain TCP still works
    ssl = None  # type: ignore[assignment]

from .errors import AuthenticationError, ConnectionClosed, ProtocolError, TetherError, TetherTimeout


class TLSError(TetherError):
    """TLS was asked for but cannot be set up (no ssl module, unreadable certificate or key)."""


def _need_ssl() -> Any:
    if ssl is None:
        raise TLSError("this Python has no ssl module (built without OpenSSL): TLS is unavailable")
    return ssl


def is_tls(sock: Any) -> bool:
    return ssl is not None and isinstance(sock, ssl.SSLSocket)


def server_context(cert: str, key: Optional[str] = None) -> Any:
    """An SSLContext for a server (TLS 1.2 or newer) from a PEM certificate (chain) and its key."""
    mod = _need_ssl()
    ctx = mod.SSLContext(mod.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = mod.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(cert, key)
    except (OSError, mod.SSLError) as exc:
        raise TLSError("cannot load the TLS certificate %r and key %r: %s" % (cert, key, exc)) from exc
    return ctx


def client_context(tls: Union[bool, Any, None] = None, ca: Optional[str] = None) -> Optional[Any]:
    """The SSLContext a client uses: ``tls`` an SSLContext (used as is), True (the system's CAs, or ``ca``), or
    False/None (plain TCP unless ``ca`` is given). The server's certificate and host name are always checked."""
    if tls is None or tls is False:
        if ca is None:
            return None
        tls = True
    mod = _need_ssl()
    if isinstance(tls, mod.SSLContext):
        return tls
    try:
        ctx = mod.create_default_context(cafile=ca)
    except (OSError, mod.SSLError) as exc:
        raise TLSError("cannot load the CA certificate %r: %s" % (ca, exc)) from exc
    ctx.minimum_version = mod.TLSVersion.TLSv1_2
    return ctx


def wrap_client(sock: socket.socket, ctx: Any, host: str, where: str) -> socket.socket:
    """Run the client side of the TLS handshake on a connected socket (under the socket's own timeout)."""
    mod = _need_ssl()
    try:
        return ctx.wrap_socket(sock, server_hostname=host)
    except mod.SSLCertVerificationError as exc:
        sock.close()
        raise AuthenticationError("TLS: %s presented a certificate this client does not trust (%s); pass ca= the "
                                  "server's CA certificate" % (where, exc.verify_message or exc)) from exc
    except socket.timeout as exc:
        sock.close()
        raise TetherTimeout("TLS handshake with %s timed out" % where) from exc
    except mod.SSLError as exc:
        sock.close()
        raise ProtocolError("TLS handshake with %s failed: %s (does it run with --tls-cert?)" % (where, exc)) from exc
    except OSError as exc:
        sock.close()
        raise ConnectionClosed("TLS handshake with %s failed: %s (does it run with --tls-cert?)"
                               % (where, exc)) from exc
