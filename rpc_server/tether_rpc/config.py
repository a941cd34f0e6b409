"""The device server's configuration: :class:`ServerConfig`, its checks, the text forms of its values (HOST:PORT,
device tags) and the environment variables that supply defaults, read in one place (:func:`config_from_options`).

The host's tools parse HOST:PORT and tags with the same functions, so the two sides accept the same text.
"""
from __future__ import annotations

import ipaddress
import os
import socket
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Dict, Iterable, List, Optional, Tuple, Union

from .errors import TetherError
from .limits import SessionLimits, default_memory, parse_size
from .protocol import DEFAULT_LIMITS, Limits
from .tls import TLSError, server_context

if TYPE_CHECKING:
    from .hooks import ServerHook

#: Environment variables the server reads (only in config_from_options).
ENV_TOKEN = "TETHER_TOKEN"
ENV_TRACKER_TOKEN = "TETHER_TRACKER_TOKEN"
ENV_DEVICE_TAGS = "TETHER_DEVICE_TAGS"

DEFAULT_SESSION_TIMEOUT = 3600.0  # every session is bounded; raise it with --session-timeout for long jobs
DEFAULT_IDLE_TIMEOUT = 300.0     # a client that holds a session and sends nothing frees the device after this
DEFAULT_SPIN = 100e-6  # seconds (see FrameReader.spin)


class ServerConfigError(TetherError, ValueError):
    """The server was asked to start in an unsafe or impossible way."""


@dataclass
class ServerConfig:
    """Everything a device server runs with (the command line's options, plus hooks and limits for embedders)."""

    host: str = "127.0.0.1"
    port: int = 9090
    port_end: Optional[int] = 9199
    token: Optional[str] = None
    insecure: bool = False
    session_timeout: Optional[float] = DEFAULT_SESSION_TIMEOUT  # seconds; None = until the client leaves
    handshake_timeout: float = 5.0
    idle_timeout: Optional[float] = DEFAULT_IDLE_TIMEOUT  # seconds a session may send nothing; None = no limit
    spin: float = DEFAULT_SPIN                  # seconds a worker polls for the next call before it sleeps
    workdir: Optional[str] = None               # parent of the per-session folders (default: system temp)
    max_queue: int = 16
    max_pending: int = 64                       # connections still in their handshake
    tracker: Optional[str] = None               # HOST:PORT
    key: Optional[str] = None
    reverse: bool = False                       # for the tracker hook: dial out instead of listening
    tracker_token: Optional[str] = None         # for the tracker hook
    tags: Dict[str, str] = field(default_factory=dict)  # device tags for the tracker
    advertise_host: Optional[str] = None        # the address the tracker hands to clients (default: as it sees us)
    limits: Limits = DEFAULT_LIMITS
    tls_cert: Optional[str] = None              # PEM certificate (chain): serve TLS (docs/tls.md)
    tls_key: Optional[str] = None               # its private key (default: in the certificate file)
    tracker_tls: bool = False                   # speak TLS to the tracker (the system's CAs, or tracker_ca)
    tracker_ca: Optional[str] = None            # PEM CA certificate to trust for the tracker (implies TLS)
    # per-session limits (tether_rpc.limits, docs/limits.md); by default 3/4 of RAM, 4 GiB, 65536, 1800 s
    session_limits: SessionLimits = field(default_factory=lambda: SessionLimits(memory=default_memory()))
    hooks: List["ServerHook"] = field(default_factory=list)


def is_loopback(host: str) -> bool:
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except socket.gaierror:
        return False
    return bool(infos) and all(ipaddress.ip_address(info[4][0].split("%")[0]).is_loopback for info in infos)


def check_config(config: ServerConfig) -> None:
    if not is_loopback(config.host) and not config.token and not config.insecure:
        raise ServerConfigError(
            "refusing to listen on %s without a token: anyone who can reach it could run code on this device. "
            "Pass --token SECRET (clients then need the same token), or --insecure if the network is trusted."
            % config.host)
    if config.tracker and not config.key:
        raise ServerConfigError("--tracker needs --key (the device key clients request, e.g. rasp4b)")
    if config.session_timeout is not None and config.session_timeout <= 0:
        raise ServerConfigError("--session-timeout must be positive")
    if config.idle_timeout is not None and config.idle_timeout <= 0:
        raise ServerConfigError("--idle-timeout must be positive (or 0 on the command line: no idle limit)")
    if config.reverse and (config.tracker_tls or config.tracker_ca):
        raise ServerConfigError("--reverse cannot be combined with a TLS tracker (--tracker-tls/--tracker-ca): the "
                                "tracker relays a reverse device's sessions as raw bytes")
    if config.tls_key and not config.tls_cert:
        raise ServerConfigError("--tls-key needs --tls-cert (the certificate that goes with the key)")
    if config.tls_cert:
        try:
            server_context(config.tls_cert, config.tls_key)
        except TLSError as exc:
            raise ServerConfigError(str(exc)) from None
    try:
        config.session_limits.check()
    except ValueError as exc:
        raise ServerConfigError(str(exc)) from None


def session_limits_from_options(session_memory: Optional[str] = None, session_disk: Optional[str] = None,
                                session_handles: Optional[int] = None,
                                call_timeout: Optional[float] = None) -> SessionLimits:
    """The --session-* and --call-timeout options (sizes take units: 512MB, 2GiB; 0 = no limit; None = the
    default, see tether_rpc.limits) as SessionLimits."""
    defaults = SessionLimits()

    def size(text: Optional[str], default: Optional[int], flag: str) -> Optional[int]:
        if text is None:
            return default
        try:
            n = parse_size(text)
        except ValueError as exc:
            raise ServerConfigError("%s: %s" % (flag, exc)) from None
        return n or None

    return SessionLimits(
        memory=size(session_memory, default_memory(), "--session-memory"),
        disk=size(session_disk, defaults.disk, "--session-disk"),
        handles=defaults.handles if session_handles is None else (int(session_handles) or None),
        call_timeout=defaults.call_timeout if call_timeout is None else (float(call_timeout) or None))


def parse_hostport(text: str, default_host: Optional[str] = None) -> Tuple[str, int]:
    """``"host:9190"`` or ``"[::1]:9190"`` -> (host, port); ``":9190"`` takes ``default_host`` if one is given.
    ServerConfigError (a ValueError) names the text otherwise."""
    host, sep, port = text.rpartition(":")
    if not host and default_host is not None:
        host = default_host
    if not sep or not host or not port.isdigit():
        raise ServerConfigError("expected HOST:PORT, got %r" % text)
    return host.strip("[]"), int(port)


def parse_tags(items: Union[str, Iterable[str], None]) -> Dict[str, str]:
    """Device tags from ``"board=pi4,lab=b12"`` or a list of such strings (``--tag``, repeatable) -> dict; empty
    parts are ignored."""
    out: Dict[str, str] = {}
    for text in [items] if isinstance(items, str) else list(items or []):
        for part in text.split(","):
            if not part.strip():
                continue
            name, sep, value = part.partition("=")
            if not sep or not name.strip():
                raise ServerConfigError("a device tag must look like name=value, got %r" % part)
            out[name.strip()] = value.strip()
    return out


def config_from_options(host: str = "127.0.0.1", port: int = 9090, port_end: Optional[int] = 9199,
                        tracker: Optional[str] = None, key: Optional[str] = None, token: Optional[str] = None,
                        insecure: bool = False, session_timeout: Optional[float] = DEFAULT_SESSION_TIMEOUT,
                        workdir: Optional[str] = None, reverse: bool = False, handshake_timeout: float = 5.0,
                        tracker_token: Optional[str] = None, tags: Optional[List[str]] = None,
                        advertise_host: Optional[str] = None,
                        idle_timeout: Optional[float] = DEFAULT_IDLE_TIMEOUT,
                        spin_us: float = DEFAULT_SPIN * 1e6, session_memory: Optional[str] = None,
                        session_disk: Optional[str] = None, session_handles: Optional[int] = None,
                        call_timeout: Optional[float] = None, tls_cert: Optional[str] = None,
                        tls_key: Optional[str] = None, tracker_tls: bool = False,
                        tracker_ca: Optional[str] = None) -> ServerConfig:
    """The command line's options as a checked ServerConfig; what they leave out comes from the environment
    (TETHER_TOKEN, TETHER_TRACKER_TOKEN, TETHER_DEVICE_TAGS), read here and nowhere else."""
    if token is None:
        token = os.environ.get(ENV_TOKEN) or None
    if tracker:
        parse_hostport(tracker)
    if workdir:
        os.makedirs(workdir, exist_ok=True)
    config = ServerConfig(host=host, port=port, port_end=port_end, token=token, insecure=insecure,
                          session_timeout=session_timeout, workdir=workdir, tracker=tracker, key=key,
                          reverse=reverse, handshake_timeout=handshake_timeout,
                          tracker_token=tracker_token or os.environ.get(ENV_TRACKER_TOKEN) or None,
                          tags=parse_tags(tags or os.environ.get(ENV_DEVICE_TAGS)), advertise_host=advertise_host,
                          idle_timeout=idle_timeout or None, spin=max(0.0, spin_us) * 1e-6,
                          tls_cert=tls_cert, tls_key=tls_key, tracker_tls=tracker_tls, tracker_ca=tracker_ca,
                          session_limits=session_limits_from_options(session_memory, session_disk, session_handles,
                                                                     call_timeout))
    check_config(config)
    return config
