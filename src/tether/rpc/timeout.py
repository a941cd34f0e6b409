"""How long a client waits, phase by phase: the :class:`Timeout` value object every client takes."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Union


class UseDefault:
    """The type of :data:`DEFAULT`."""

    def __repr__(self) -> str:
        return "Timeout.DEFAULT"


#: "Use the default limits" (a client's ``timeout=`` default).
DEFAULT = UseDefault()


@dataclass(frozen=True)
class Timeout:
    """Per-phase time limits in seconds; a phase set to None waits without limit.

    connect: TCP connect + handshake; read / write: the longest a single receive / send may stall (a running
    kernel counts as a stall); session: the longest to wait in the device's queue for a session.
    """

    connect: Optional[float] = 10.0
    read: Optional[float] = 300.0
    write: Optional[float] = 60.0
    session: Optional[float] = 600.0

    DEFAULT = DEFAULT

    def __post_init__(self) -> None:
        for name in ("connect", "read", "write", "session"):
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, bool) or not (isinstance(value, (int, float)) and 0 < value < math.inf):
                raise ValueError("Timeout.%s must be a positive finite number of seconds or None (no limit), got %r"
                                 % (name, value))

    @classmethod
    def coerce(cls, value: Union["Timeout", float, None, UseDefault]) -> "Timeout":
        """DEFAULT -> the defaults; None -> no limit on any phase (only an explicit None disables a wait);
        a number -> that many seconds for every phase; a Timeout as is."""
        if value is DEFAULT:
            return cls()
        if value is None:
            return cls(connect=None, read=None, write=None, session=None)
        if isinstance(value, Timeout):
            return value
        return cls(connect=value, read=value, write=value, session=value)  # type: ignore[arg-type]
