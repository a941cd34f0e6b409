"""The session folder: the only place remote file operations may touch, and the rule for safe file names.

A remote peer names files (upload, download, remove, module.load) by a plain file name. Anything that could
reach outside the folder is refused with UnsafePathError before the file system is touched.
"""
from __future__ import annotations

import os
from typing import BinaryIO, List

from .errors import UnsafePathError

MAX_NAME_BYTES = 255  # NAME_MAX on every file system a device is likely to use

_SEPARATORS = ("/", "\\")


def safe_name(name: object) -> str:
    """Return ``name`` if it is a plain file name; raise UnsafePathError naming the problem otherwise."""
    if not isinstance(name, str):
        raise UnsafePathError("a file name must be a string, got %s" % type(name).__name__)
    if not name:
        raise UnsafePathError("a file name must not be empty")
    if "\x00" in name:
        raise UnsafePathError("file name %r contains a NUL byte" % name)
    if name in (".", ".."):
        raise UnsafePathError("file name %r is not a file" % name)
    if os.path.isabs(name) or any(sep in name for sep in _SEPARATORS):
        raise UnsafePathError("file name %r must be a plain name inside the session folder (no directories)" % name)
    if any(ord(c) < 32 for c in name):
        raise UnsafePathError("file name %r contains control characters" % name)
    if len(name.encode("utf-8", "surrogateescape")) > MAX_NAME_BYTES:
        raise UnsafePathError("file name is longer than %d bytes" % MAX_NAME_BYTES)
    return name


class SessionFolder:
    """A directory owned by one session (created and deleted by whoever owns the session)."""

    def __init__(self, path: str):
        self.path = os.path.realpath(path)
        os.makedirs(self.path, exist_ok=True)

    def path_for(self, name: object) -> str:
        full = os.path.join(self.path, safe_name(name))
        # Belt and braces: a symlink planted some other way must not lead outside either.
        if os.path.dirname(os.path.realpath(full)) != self.path:
            raise UnsafePathError("file name %r resolves outside the session folder" % (name,))
        return full

    def existing(self, name: object) -> str:
        full = self.path_for(name)
        if not os.path.isfile(full):
            raise FileNotFoundError("no file %r in the session folder (have: %s)"
                                    % (name, ", ".join(self.listdir()) or "nothing"))
        return full

    def listdir(self) -> List[str]:
        return sorted(e.name for e in os.scandir(self.path) if e.is_file(follow_symlinks=False))

    def size(self, name: object) -> int:
        return os.path.getsize(self.existing(name))

    def remove(self, name: object) -> None:
        os.remove(self.existing(name))

    def open_read(self, name: object) -> BinaryIO:
        return open(self.existing(name), "rb")
