"""Per-session limits (docs/limits.md): device memory for arrays, upload bytes, open handles, one call's wall time.

Each limit a session crosses gives a clear error while the session and the server go on:

==================  ===================  ============================  ================================================
limit               server option        default                       crossing it
==================  ===================  ============================  ================================================
array memory        --session-memory     3/4 of the device's RAM       OutOfMemory (also a MemoryError)
                                         (4 GiB if /proc/meminfo
                                         cannot be read)
upload bytes        --session-disk       4 GiB                         LimitExceeded (the upload is not written)
open handles        --session-handles    65536                         LimitExceeded
one call            --call-timeout       1800 s                        the call is aborted: its worker ends (SIGALRM
                                                                       from setitimer, so even a kernel stuck in
                                                                       native code stops) and the client gets a
                                                                       TetherTimeout naming the limit; new sessions
                                                                       work
==================  ===================  ============================  ================================================

Memory is accounted when an array is made (before it is allocated) and given back when it is freed. As a
backstop for memory nobody accounts (a model's intermediate arrays, a kernel's own buffers), the session worker
sets RLIMIT_DATA to what it already uses plus the array budget plus :data:`BACKSTOP_SLACK`, so an allocation past it
fails with MemoryError in that worker instead of waking the kernel's OOM killer. (qemu-user ignores
RLIMIT_DATA for its guests: there the accounting alone applies.)
"""
from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from typing import Any, Dict, Optional

from .errors import LimitExceeded, OutOfMemory

log = logging.getLogger(__name__)

DEFAULT_DISK = 4 << 30
DEFAULT_HANDLES = 65536
DEFAULT_CALL_TIMEOUT = 1800.0
FALLBACK_MEMORY = 4 << 30
BACKSTOP_SLACK = 512 << 20   # Python's own heap, frame buffers, thread stacks of the native pool

_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 1000 ** 2, "mb": 1000 ** 2, "g": 1000 ** 3, "gb": 1000 ** 3,
          "t": 1000 ** 4, "tb": 1000 ** 4, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?)\s*([a-zA-Z]*)\s*$")


def call_timeout_message(seconds: float) -> str:
    """What the client is told when a call ran past --call-timeout (the same words from server and worker)."""
    return ("a call ran past the server's call timeout of %s s (--call-timeout) and was aborted; the session has "
            "ended, start a new one" % float(seconds))


def parse_size(text: Any) -> int:
    """``"512MB"`` -> 512000000, ``"2GiB"`` -> 2147483648, ``"1024"`` -> 1024 bytes (ValueError naming the text)."""
    if isinstance(text, int):
        return text
    m = _SIZE.match(str(text))
    unit = m.group(2).lower() if m else None
    if m is None or unit not in _UNITS:
        raise ValueError("expected a size such as 512MB, 2GiB or 1048576, got %r (units: %s)"
                         % (text, ", ".join(u for u in _UNITS if u)))
    return int(float(m.group(1)) * _UNITS[unit])


def format_size(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return "%.1f %s" % (n / size, unit)
    return "%d B" % n


def default_memory() -> int:
    """3/4 of this device's RAM (MemTotal), or FALLBACK_MEMORY when it cannot be read."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024 * 3 // 4
    except (OSError, ValueError, IndexError):
        pass
    return FALLBACK_MEMORY


@dataclass(frozen=True)
class SessionLimits:
    """What one session may use. ``None`` in a field means "no limit" (the server's configuration always fills
    every field: tether_rpc.config; an in-process LocalSession has no limits)."""

    memory: Optional[int] = None          # bytes of device arrays (the server's default: default_memory())
    disk: Optional[int] = DEFAULT_DISK    # bytes of uploaded files in the session folder
    handles: Optional[int] = DEFAULT_HANDLES
    call_timeout: Optional[float] = DEFAULT_CALL_TIMEOUT

    def describe(self) -> Dict[str, Any]:
        """The form device_info shows: ``{"memory_bytes", "disk_bytes", "handles", "call_timeout_s"}``."""
        return {"memory_bytes": self.memory, "disk_bytes": self.disk, "handles": self.handles,
                "call_timeout_s": self.call_timeout}

    def check(self) -> None:
        for name, value in (("--session-memory", self.memory), ("--session-disk", self.disk),
                            ("--session-handles", self.handles), ("--call-timeout", self.call_timeout)):
            if value is not None and value <= 0:
                raise ValueError("%s must be positive, got %r" % (name, value))


class Budget:
    """One session's use against its :class:`SessionLimits` (array bytes and handles; disk is measured)."""

    def __init__(self, limits: SessionLimits):
        self.limits = limits
        self.memory_used = 0

    def reserve_memory(self, nbytes: int, what: str) -> None:
        """Charge ``nbytes`` for an array about to be made, or raise OutOfMemory naming the sizes."""
        cap = self.limits.memory
        if cap is not None and self.memory_used + nbytes > cap:
            raise OutOfMemory("%s needs %s but this session already holds %s of its %s array memory "
                              "(the server's --session-memory): free arrays you no longer need, or ask for a "
                              "larger limit" % (what, format_size(nbytes), format_size(self.memory_used),
                                                format_size(cap)))
        self.memory_used += nbytes

    def release_memory(self, nbytes: int) -> None:
        self.memory_used = max(0, self.memory_used - nbytes)

    def check_handles(self, open_handles: int) -> None:
        cap = self.limits.handles
        if cap is not None and open_handles >= cap:
            raise LimitExceeded("this session holds %d handles, its limit (the server's --session-handles): free "
                                "arrays, modules or functions you no longer need" % open_handles)

    def check_disk(self, used: int, nbytes: int, name: str) -> None:
        cap = self.limits.disk
        if cap is not None and used + nbytes > cap:
            raise LimitExceeded("uploading %r (%s) would put this session's files at %s, over its %s (the server's "
                                "--session-disk): remove files you no longer need (remote.remove)"
                                % (name, format_size(nbytes), format_size(used + nbytes), format_size(cap)))


def apply_memory_backstop(limits: SessionLimits) -> Optional[int]:
    """In a session worker: cap RLIMIT_DATA at what the process uses now + the array budget + slack, so memory
    beyond the budget fails with MemoryError here instead of inviting the OOM killer. Returns the cap set."""
    if limits.memory is None:
        return None
    try:
        import resource
    except ImportError:
        return None
    try:
        used = 0
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmData:"):
                    used = int(line.split()[1]) * 1024
                    break
        cap = used + limits.memory + BACKSTOP_SLACK
        soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
        if hard != resource.RLIM_INFINITY:
            cap = min(cap, hard)
        if soft != resource.RLIM_INFINITY and soft < cap:
            return soft
        resource.setrlimit(resource.RLIMIT_DATA, (cap, hard))
        return cap
    except (OSError, ValueError) as exc:
        log.warning("cannot cap this session's memory with RLIMIT_DATA: %s", exc)
        return None


def folder_bytes(folder: str) -> int:
    """Bytes of the regular files directly in ``folder`` (upload names are flat; see files.py)."""
    total = 0
    try:
        with os.scandir(folder) as it:
            for entry in it:
                try:
                    if entry.is_file(follow_symlinks=False):
                        total += entry.stat(follow_symlinks=False).st_size
                except OSError:
                    continue
    except OSError:
        return 0
    return total
