"""The exception tree shared by the device runtime, the server, the client and the tracker.

Grouped by what the caller can do about it::

    TetherError
    ├── ProtocolError            the peer spoke something we do not accept; the connection is closed
    │   ├── FrameTooLarge        a frame or payload exceeded a limit before anything was allocated
    │   └── VersionMismatch      the two sides speak different protocol versions (both are named)
    ├── AuthenticationError      wrong or missing token
    ├── ConnectionClosed         the peer went away (also a ConnectionError)
    ├── TetherTimeout            a bounded wait ran out (also a TimeoutError)
    ├── RemoteError              the remote side raised; .remote_type and .remote_traceback say what and where
    │   └── SessionCrashed       the session worker died (e.g. a kernel segfault); the server lives on
    ├── ModuleLoadError          a shared library could not be loaded
    │   ├── ArchMismatch         the library was built for another architecture (both are named)
    │   ├── GpuUnavailable       the module (or array) needs a GPU API or feature this device lacks (named)
    │   └── GpuBuildError        the GPU driver refused a module's device code (its build log in the message)
    ├── GpuError                 a GPU driver call failed (the call and the driver's error name)
    ├── KernelError              a packed function refused its arguments or failed
    ├── UnsafePathError          an upload name tried to leave the session folder (also a ValueError)
    ├── LimitExceeded            a per-session limit (upload bytes, handles) was reached; the session goes on
    │   └── OutOfMemory          an array does not fit the session's memory (also a MemoryError)
    └── DeviceBusy               the device serves another session and the caller chose not to wait
The host package adds compiler errors (CompileError, ScheduleError, LinkerNotFound, UnsupportedOpError)
under the same root in ``tether.errors``.
"""
from __future__ import annotations

from typing import Optional


class TetherError(Exception):
    """Root of every error tether raises on purpose."""


class ProtocolError(TetherError):
    pass


class FrameTooLarge(ProtocolError):
    pass


class VersionMismatch(ProtocolError):
    pass


class AuthenticationError(TetherError):
    pass


class ConnectionClosed(TetherError, ConnectionError):
    pass


class TetherTimeout(TetherError, TimeoutError):
    pass


class RemoteError(TetherError):
    """An exception raised on the remote side, carried back with its type and traceback."""

    def __init__(self, message: str, remote_type: str = "Exception", remote_traceback: Optional[str] = None):
        super().__init__(message)
        self.remote_type = remote_type
        self.remote_traceback = remote_traceback

    def __str__(self) -> str:
        base = "%s: %s" % (self.remote_type, self.args[0] if self.args else "")
        if self.remote_traceback:
            base += "\n--- remote traceback ---\n" + self.remote_traceback.rstrip()
        return base


class SessionCrashed(RemoteError):
    pass


class ModuleLoadError(TetherError):
    pass


class ArchMismatch(ModuleLoadError):
    pass


class KernelError(TetherError):
    pass


class UnsafePathError(TetherError, ValueError):
    pass


class LimitExceeded(TetherError):
    pass


class OutOfMemory(LimitExceeded, MemoryError):
    pass


class DeviceBusy(TetherError):
    pass


class GpuError(TetherError):
    """A GPU device API call failed; the message names the call and the driver's error code."""


class GpuUnavailable(ModuleLoadError):
    """This device has no such GPU API (its driver library is missing or lists no device), or lacks a feature a
    module needs; the message names what is missing."""


class GpuBuildError(ModuleLoadError):
    """The GPU driver refused a kernel's code; the message carries the driver's build log."""
