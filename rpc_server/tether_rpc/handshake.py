"""The handshake: HELLO -> [CHALLENGE -> AUTH] -> WELCOME, its payloads and token MACs, and the client's side of it.

The RPC core (message types 1-4) and the tracker (64-67) run the same exchange; :class:`HandshakeTypes` names the
types of each. :class:`ClientHandshake` is the client's side without I/O: the session client and the tracker
client drive it over a blocking socket (:meth:`ClientHandshake.run`), the device's registrar from its event loop
(:meth:`ClientHandshake.on_frame`). With a token, both sides prove they know it (HMAC-SHA256 over both nonces),
so neither talks to an impostor.
"""
from __future__ import annotations

import hashlib
import hmac
import os
import socket
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, NamedTuple, Optional, Tuple

from .error_mapping import HANDSHAKE_ERRORS, error_from_payload
from .errors import AuthenticationError, ProtocolError, VersionMismatch
from .protocol import CAPABILITIES, PROTOCOL_MAGIC, PROTOCOL_VERSION, MsgType, encode_frame
from .transport import send_buffers

AUTH_ALGO = "hmac-sha256"
NONCE_SIZE = 32
_CLIENT_CONTEXT = b"tether-auth-v1/client"
_SERVER_CONTEXT = b"tether-auth-v1/server"


def make_nonce() -> bytes:
    return os.urandom(NONCE_SIZE)


def client_mac(token: str, server_nonce: bytes, client_nonce: bytes) -> bytes:
    """What the client sends in AUTH: proof it knows the token, bound to both fresh nonces."""
    return hmac.new(token.encode("utf-8"), _CLIENT_CONTEXT + server_nonce + client_nonce, hashlib.sha256).digest()


def server_proof(token: str, server_nonce: bytes, client_nonce: bytes) -> bytes:
    """What the server sends in WELCOME: proof that it knows the token too (mutual authentication)."""
    return hmac.new(token.encode("utf-8"), _SERVER_CONTEXT + client_nonce + server_nonce, hashlib.sha256).digest()


def macs_equal(a: Any, b: Any) -> bool:
    return isinstance(a, bytes) and isinstance(b, bytes) and hmac.compare_digest(a, b)


def hello_payload(caps: Iterable[str] = CAPABILITIES, match: Optional[str] = None, wait: bool = True,
                  client: str = "tether-py", version: int = PROTOCOL_VERSION) -> dict:
    payload = {"magic": PROTOCOL_MAGIC, "version": version, "caps": list(caps), "wait": wait, "client": client}
    if match is not None:
        payload["match"] = match
    return payload


def check_hello(payload: dict) -> dict:
    """Validate a HELLO payload; raises ProtocolError / VersionMismatch naming both versions."""
    if payload.get("magic") != PROTOCOL_MAGIC:
        raise ProtocolError("not a tether client: HELLO magic is %.40r, expected %r"
                            % (payload.get("magic"), PROTOCOL_MAGIC))
    version = payload.get("version")
    if version != PROTOCOL_VERSION:
        raise VersionMismatch("client speaks tether protocol version %r, this server speaks version %d"
                              % (version, PROTOCOL_VERSION))
    caps = payload.get("caps", [])
    if not isinstance(caps, list) or not all(isinstance(c, str) for c in caps):
        raise ProtocolError("HELLO caps must be a list of strings")
    match = payload.get("match")
    if match is not None and not isinstance(match, str):
        raise ProtocolError("HELLO match must be a string")
    return {"caps": caps, "match": match, "wait": bool(payload.get("wait", True)),
            "client": str(payload.get("client", ""))[:64]}


def check_welcome(payload: dict, peer: str = "server") -> dict:
    version = payload.get("version")
    if version != PROTOCOL_VERSION:
        raise VersionMismatch("%s speaks tether protocol version %r, this client speaks version %d"
                              % (peer, version, PROTOCOL_VERSION))
    return payload


def check_auth(token: str, server_nonce: bytes, payload: dict) -> bytes:
    """Verify an AUTH payload in constant time; returns the client nonce (for the server proof)."""
    client_nonce = payload.get("nonce")
    mac = payload.get("mac")
    if not isinstance(client_nonce, bytes) or len(client_nonce) != NONCE_SIZE:
        raise AuthenticationError("AUTH must carry a %d-byte nonce" % NONCE_SIZE)
    if not macs_equal(mac, client_mac(token, server_nonce, client_nonce)):
        raise AuthenticationError("wrong token: the server refused the authentication")
    return client_nonce


class HandshakeTypes(NamedTuple):
    """The message types of one protocol's handshake, and whether its WELCOME must carry PROTOCOL_VERSION."""

    hello: int
    challenge: int
    auth: int
    welcome: int
    check_version: bool


CORE_HANDSHAKE = HandshakeTypes(MsgType.HELLO, MsgType.CHALLENGE, MsgType.AUTH, MsgType.WELCOME, True)


@dataclass
class ClientHandshake:
    """The client's side of one handshake, without I/O: send :meth:`hello_frame`, feed each frame the server
    sends to :meth:`on_frame` (sending what it returns) until :attr:`welcome` is set.

    ``peer`` names the server in messages ("the tracker at h:9190"); ``token_hint`` tells the user how to supply
    a token the server asks for; ``error_context`` goes before the message of an ERROR raised as a local class.
    """

    types: HandshakeTypes
    hello: Dict[str, Any]
    token: Optional[str]
    peer: str
    token_hint: str
    error_context: str = ""
    welcome: Optional[Dict[str, Any]] = field(default=None, init=False)
    _server_nonce: Optional[bytes] = field(default=None, init=False, repr=False)
    _client_nonce: bytes = field(default=b"", init=False, repr=False)

    def hello_frame(self) -> bytes:
        return encode_frame(self.types.hello, 0, self.hello)

    def on_frame(self, msg_type: int, payload: Dict[str, Any]) -> Optional[bytes]:
        """Take one frame from the server: returns the AUTH frame to send after a CHALLENGE, else None; after
        WELCOME (whose proof of the token is checked) :attr:`welcome` holds its payload. An ERROR raises the error
        it carries; any other frame is a ProtocolError."""
        types = self.types
        if msg_type == types.challenge and self._server_nonce is None and self.welcome is None:
            if not self.token:
                raise AuthenticationError("%s requires a token: %s" % (self.peer, self.token_hint))
            nonce = payload.get("nonce")
            if not isinstance(nonce, bytes) or len(nonce) != NONCE_SIZE:
                raise ProtocolError("%s sent a CHALLENGE without a %d-byte nonce" % (self.peer, NONCE_SIZE))
            self._server_nonce = nonce
            self._client_nonce = make_nonce()
            return encode_frame(types.auth, 0, {"nonce": self._client_nonce,
                                                "mac": client_mac(self.token, nonce, self._client_nonce)})
        if msg_type == types.welcome and self.welcome is None:
            if types.check_version:
                check_welcome(payload, self.peer)
            if self.token:
                if self._server_nonce is None:
                    # a server that grants sessions without proving the token could be anyone
                    raise AuthenticationError("%s did not ask for the token this side holds, so it cannot prove it "
                                              "is genuine; give it the same token, or connect without one"
                                              % self.peer)
                if not macs_equal(payload.get("proof"), server_proof(self.token, self._server_nonce,
                                                                     self._client_nonce)):
                    raise AuthenticationError("%s did not prove it knows the token" % self.peer)
            self.welcome = payload
            return None
        if msg_type == MsgType.ERROR:
            raise error_from_payload(payload, HANDSHAKE_ERRORS, self.error_context)
        raise ProtocolError("%s sent message type %d during the handshake" % (self.peer, msg_type))

    def run(self, sock: socket.socket, read_frame: Callable[[], Tuple[int, int, Dict[str, Any]]],
            other: Optional[Callable[[int, Dict[str, Any]], bool]] = None) -> Dict[str, Any]:
        """Run the whole handshake over a blocking socket; returns the WELCOME payload. ``other(msg_type,
        payload)`` sees every frame first and returns True for one it handled (a queue notice, say)."""
        send_buffers(sock, [self.hello_frame()])
        while self.welcome is None:
            msg_type, _, payload = read_frame()
            if other is not None and other(msg_type, payload):
                continue
            reply = self.on_frame(msg_type, payload)
            if reply is not None:
                send_buffers(sock, [reply])
        return self.welcome
