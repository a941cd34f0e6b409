"""The tracker's message types and payloads, on top of the tether framing in :mod:`tether_rpc.protocol`.

Same wire format as the RPC core (4-byte big-endian length + msgpack ``[msg_type, request_id, payload]``, one
write per frame, TCP_NODELAY); the tracker uses message types 64-127, plus the core ``ERROR`` (7) for failures.
``docs/tracker.md`` is the prose reference; a test checks that it names every type below with its value.

Three kinds of peer connect to the tracker's single port and say which one they are in HELLO:

* ``device``: a device server's registrar. HELLO, REGISTER, then HEARTBEATs; it answers EXPECT with EXPECTED and
  reports SESSION start/end. It is told to REVOKE unused match tokens and, in reverse mode, to DIAL back.
* ``client``: a user or CI job. HELLO, then REQUEST (answered by QUEUED notices, then GRANT or ERROR) and
  SUMMARY (answered by SUMMARY_REPLY). Closing the connection withdraws every pending request at once.
* ``relay``: the data connection a reverse-mode device opens after DIAL; its only frame is RELAY, after which the
  connection carries raw session bytes. A client reaches a reverse device by sending the core HELLO (type 1,
  with ``match``) to the tracker's port instead of a device's.

With a tracker token, HELLO is followed by the core challenge/response (CHALLENGE, AUTH carrying the same HMAC
as the RPC handshake) before WELCOME; a peer that fails it gets ERROR ``AuthenticationError`` and is closed.

This module is device-side (the registrar lives on the device), so it uses stdlib + msgpack only.
"""
from __future__ import annotations

import enum
import fnmatch
import math
from typing import Any, Dict, Optional

from .errors import ProtocolError
from .handshake import HandshakeTypes
from .protocol import TRACKER_TYPE_MAX, TRACKER_TYPE_MIN, Limits

TRACKER_MAGIC = "tether-tracker"
TRACKER_VERSION = 1
DEFAULT_PORT = 9190
#: Longest wait or session a REQUEST may ask for (30 days).
MAX_TIMEOUT = 30 * 24 * 3600

#: Frames from an authenticated tracker peer: device info and summaries are small maps, never bulk.
TRACKER_LIMITS = Limits(max_frame=8 << 20, max_bulk=0, max_str=64 << 10, max_bin=4096, max_array=1 << 16,
                        max_map=1 << 12, max_ext=0, max_depth=8)

#: What a client accepts from the tracker: a summary of thousands of devices with their info can pass 8 MiB.
REPLY_LIMITS = Limits(max_frame=64 << 20, max_bulk=0, max_str=64 << 10, max_bin=4096, max_array=1 << 20,
                      max_map=1 << 12, max_ext=0, max_depth=8)

ROLES = ("device", "client", "relay")


class TrackerMsg(enum.IntEnum):
    """Tracker message types (64-127). Values are part of the wire format: never renumber."""

    HELLO = 64          # peer -> tracker   {magic, version, role, name?}
    CHALLENGE = 65      # tracker -> peer   {algo, nonce}                      (only with a tracker token)
    AUTH = 66           # peer -> tracker   {nonce, mac}
    WELCOME = 67        # tracker -> peer   {version, tracker, peer, proof?}
    REGISTER = 68       # device -> tracker {key, port, host?, tags, info, reverse, state}
    REGISTERED = 69     # tracker -> device {device, heartbeat}
    HEARTBEAT = 70      # both directions {}  (the tracker echoes each device heartbeat)
    EXPECT = 71         # tracker -> device {match, grant, session_timeout, client}
    EXPECTED = 72       # device -> tracker {match}
    REVOKE = 73         # tracker -> device {match}
    SESSION = 74        # device -> tracker {state: "started"|"ended", match?}
    DIAL = 75           # tracker -> device {match}                             (reverse mode)
    RELAY = 76          # device -> tracker {match}, then raw bytes              (reverse mode data connection)
    REQUEST = 80        # client -> tracker {key, priority, wait_timeout, session_timeout, ticket?}
    QUEUED = 81         # tracker -> client {key, total, free, pending, ticket}
    GRANT = 82          # tracker -> client {host, port, match, key, device, session_timeout, relay}
    SUMMARY = 83        # client -> tracker {}
    SUMMARY_REPLY = 84  # tracker -> client {devices: [...], queues: {...}}
    CANCEL = 85         # client -> tracker {}  withdraw the request with this request id


assert all(TRACKER_TYPE_MIN <= m <= TRACKER_TYPE_MAX for m in TrackerMsg)

#: The tracker's handshake (tether_rpc.handshake.ClientHandshake); its WELCOME carries the tracker's version.
TRACKER_HANDSHAKE = HandshakeTypes(TrackerMsg.HELLO, TrackerMsg.CHALLENGE, TrackerMsg.AUTH, TrackerMsg.WELCOME,
                                   check_version=False)


def hello_payload(role: str, name: str = "") -> dict:
    if role not in ROLES:
        raise ValueError("tracker role must be one of %s, got %r" % (", ".join(ROLES), role))
    return {"magic": TRACKER_MAGIC, "version": TRACKER_VERSION, "role": role, "name": name[:64]}


def check_hello(payload: dict) -> dict:
    """Validate a tracker HELLO; returns ``{role, name}``."""
    if payload.get("magic") != TRACKER_MAGIC:
        raise ProtocolError("not a tether tracker peer: HELLO magic is %.40r, expected %r"
                            % (payload.get("magic"), TRACKER_MAGIC))
    if payload.get("version") != TRACKER_VERSION:
        raise ProtocolError("peer speaks tracker protocol version %r, this tracker speaks version %d"
                            % (payload.get("version"), TRACKER_VERSION))
    role = payload.get("role")
    if role not in ROLES:
        raise ProtocolError("tracker HELLO role must be one of %s, got %.40r" % (", ".join(ROLES), role))
    return {"role": role, "name": str(payload.get("name", ""))[:64]}


def _field(payload: dict, name: str, kind: Any, default: Any = None, required: bool = False) -> Any:
    if name not in payload or payload[name] is None:
        if required:
            raise ProtocolError("tracker message lacks the %r field" % name)
        return default
    value = payload[name]
    # bool is an int subclass: keep numeric fields numeric
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise ProtocolError("tracker field %r has the wrong type %s" % (name, type(value).__name__))
    return value


def check_key(key: Any) -> str:
    if not isinstance(key, str) or not key or len(key) > 256:
        raise ProtocolError("a device key or request pattern must be a non-empty string of at most 256 chars")
    return key


def check_register(payload: dict) -> dict:
    """Validate REGISTER (a device's announcement, sent again after each session and after each reconnect)."""
    tags = _field(payload, "tags", dict, {})
    if not all(isinstance(k, str) and isinstance(v, (str, int, float)) for k, v in tags.items()):
        raise ProtocolError("REGISTER tags must map strings to strings or numbers")
    port = _field(payload, "port", int, 0)
    if not 0 <= port < 65536:
        raise ProtocolError("REGISTER port %d is not a TCP port" % port)
    state = _field(payload, "state", str, "free")
    if state not in ("free", "busy"):
        raise ProtocolError("REGISTER state must be 'free' or 'busy', got %.20r" % state)
    reverse = _field(payload, "reverse", bool, False)
    if not reverse and port == 0:
        raise ProtocolError("a device that is not in reverse mode must register the port it listens on")
    return {"key": check_key(payload.get("key")), "port": port, "host": _field(payload, "host", str),
            "tags": {k: str(v) for k, v in tags.items()}, "info": _field(payload, "info", dict, {}),
            "reverse": reverse, "state": state}


def check_request(payload: dict) -> dict:
    priority = _field(payload, "priority", (int, float), 1)
    wait = _field(payload, "wait_timeout", (int, float), 60.0)
    session = _field(payload, "session_timeout", (int, float), 600.0)
    # NaN would break the queue's ordering and inf the event loop's timers: refuse both
    if not all(math.isfinite(x) for x in (priority, wait, session)):
        raise ProtocolError("REQUEST priority and timeouts must be finite numbers")
    if not 0 <= wait <= MAX_TIMEOUT or not 0 < session <= MAX_TIMEOUT:
        raise ProtocolError("REQUEST timeouts must lie in 0 <= wait_timeout <= %d and 0 < session_timeout <= %d "
                            "seconds" % (MAX_TIMEOUT, MAX_TIMEOUT))
    ticket = _field(payload, "ticket", str, "")
    if len(ticket) > 64:
        raise ProtocolError("a REQUEST ticket is at most 64 characters")
    return {"key": check_key(payload.get("key")), "priority": priority, "wait_timeout": float(wait),
            "session_timeout": float(session), "ticket": ticket}


def check_match(payload: dict) -> str:
    match = payload.get("match")
    if not isinstance(match, str) or not 8 <= len(match) <= 128:
        raise ProtocolError("a match token must be a string of 8 to 128 characters")
    return match


# ---------------------------------------------------------------------------------------------------------------
# matching: which devices a request pattern may take

def parse_pattern(pattern: str) -> Dict[str, str]:
    """Split ``"arch=aarch64,os=linux"`` into tag constraints; a pattern without ``=`` constrains the key."""
    out: Dict[str, str] = {}
    for part in pattern.split(","):
        part = part.strip()
        if not part:
            continue
        if "=" in part:
            name, _, value = part.partition("=")
            out[name.strip()] = value.strip()
        else:
            out["key"] = part
    return out


def pattern_matches(pattern: Dict[str, str], key: str, tags: Dict[str, str]) -> bool:
    """True if a device with ``key`` and ``tags`` satisfies every constraint (glob syntax: ``rasp*``)."""
    for name, want in pattern.items():
        have = key if name == "key" else tags.get(name)
        if have is None or not fnmatch.fnmatchcase(have, want):
            return False
    return True


def device_tags(key: str, tags: Dict[str, str], info: Optional[dict]) -> Dict[str, str]:
    """The tags a device is matched by: its own, plus ``arch`` and ``target`` from its device info if absent."""
    out = dict(tags)
    info = info or {}
    for name, field in (("arch", "arch"), ("target", "suggested_target"), ("os", "os")):
        value = info.get(field)
        if isinstance(value, str) and name not in out:
            out[name] = value
    return out
