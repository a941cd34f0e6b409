"""Where failures cross into tether's exception tree: socket errors, and ERROR frames to and from a peer.

Every client (session, tracker, the device's registrar) and the framing layer translate through here, so a
timeout is a :class:`TetherTimeout` and a lost peer a :class:`ConnectionClosed` wherever they happen, with the
socket error kept as ``__cause__``.

ERROR payloads become exceptions in one of two ways. An error about the connection itself (a wrong token, a
version mismatch, a full queue) is raised as the local class; anything the remote code raised is a
:class:`RemoteError` that is also an instance of the remote class when that class is a tether error or a Python
built-in (so ``except KeyError`` works across the wire).
"""
from __future__ import annotations

import builtins
import socket
from typing import Any, Dict, FrozenSet, Optional

from . import errors
from .errors import ConnectionClosed, RemoteError, SessionCrashed, TetherError, TetherTimeout

try:
    import ssl
    # On a TLS socket SO_RCVTIMEO running out surfaces as "want read/write"; any other SSLError means the stream
    # is unusable (a corrupt record, a peer that is not speaking TLS).
    _TLS_WAIT: tuple = (ssl.SSLWantReadError, ssl.SSLWantWriteError)
    _TLS_ERRORS: tuple = (ssl.SSLError,)
except ImportError:
    _TLS_WAIT = _TLS_ERRORS = ()

#: Socket failures meaning "the wait ran out" (BlockingIOError: SO_RCVTIMEO/SO_SNDTIMEO ran out on a blocking
#: socket) or "the peer is gone". Catch these, then raise :func:`socket_error` ``from`` the caught exception.
SOCKET_ERRORS = (socket.timeout, BlockingIOError, ConnectionResetError, BrokenPipeError,
                 ConnectionAbortedError) + _TLS_ERRORS


def socket_error(exc: BaseException, timed_out: str, lost: str) -> TetherError:
    """The tether exception for a socket failure: ``timed_out`` is the whole TetherTimeout message; ``lost``
    starts the ConnectionClosed message, which goes on with the socket's own words."""
    if isinstance(exc, (socket.timeout, BlockingIOError, TimeoutError) + _TLS_WAIT):
        return TetherTimeout(timed_out)
    return ConnectionClosed("%s: %s" % (lost, exc))


# ---------------------------------------------------------------------------------------------------------------
# ERROR payloads

#: ERROR types that describe the connection rather than the remote code (refused handshakes, sessions ended by
#: the server): they are raised as the local class where the caller asks for it (:func:`error_from_payload`).
CONNECTION_ERRORS: Dict[str, type] = {cls.__name__: cls for cls in (
    errors.VersionMismatch, errors.AuthenticationError, errors.DeviceBusy, errors.ProtocolError,
    errors.FrameTooLarge, TetherTimeout)}
HANDSHAKE_ERRORS: FrozenSet[str] = frozenset(CONNECTION_ERRORS)

_REMOTE_CLASSES: Dict[type, type] = {}


def error_payload(exc: BaseException, traceback_text: Optional[str] = None) -> Dict[str, Any]:
    """The ERROR payload for an exception (a RemoteError passes its remote type on)."""
    return {"type": getattr(exc, "remote_type", None) or type(exc).__name__, "message": str(exc),
            "traceback": traceback_text or ""}


def remote_exception(payload: Dict[str, Any]) -> TetherError:
    """An ERROR payload as a :class:`RemoteError` (also an instance of the remote class when that class is a
    tether error or a Python built-in exception)."""
    typ = str(payload.get("type") or "Exception")
    message = str(payload.get("message", ""))
    tb = str(payload.get("traceback") or "") or None
    if typ == "SessionCrashed":
        return SessionCrashed(message, typ, tb)
    base = getattr(errors, typ, None)
    if base is None:
        base = getattr(builtins, typ, None)
    if isinstance(base, type) and issubclass(base, Exception) and not issubclass(base, RemoteError):
        cls = _REMOTE_CLASSES.get(base)
        if cls is None:
            try:
                cls = type("Remote" + base.__name__, (RemoteError, base), {"__module__": __name__})
            except TypeError:
                cls = RemoteError
            _REMOTE_CLASSES[base] = cls
        try:
            return cls(message, typ, tb)
        except Exception:
            pass
    return RemoteError(message, typ, tb)


def error_from_payload(payload: Dict[str, Any], local: FrozenSet[str] = frozenset(),
                       context: str = "") -> TetherError:
    """The exception for an ERROR payload: the local connection-level class if its type is in ``local`` (with
    ``context`` before the message, e.g. which peer said it), else :func:`remote_exception`."""
    typ = str(payload.get("type"))
    if typ in local:
        return CONNECTION_ERRORS[typ](context + str(payload.get("message", "")))
    return remote_exception(payload)
