"""Darknet's .weights binary: a header (int32 major, minor, revision; then the images seen in training, 64-bit from
version 0.2 on, 32-bit before), then the float32 arrays of every layer that has weights, in layer order and with
no separators, so the .cfg alone says where each array starts.
"""
from __future__ import annotations

from typing import Tuple

import numpy as np

from tether.errors import InvalidInput


class WeightsFile:
    """A read cursor over the float32 arrays of a .weights file."""

    def __init__(self, path: str) -> None:
        self.path = path
        with open(path, "rb") as fh:
            data = fh.read()
        if len(data) < 16:
            raise InvalidInput("%s is not a Darknet .weights file: %d bytes, expected a 16- or 20-byte header and "
                               "the layers' float32 weights" % (path, len(data)))
        major, minor, revision = (int(v) for v in np.frombuffer(data, "<i4", 3))
        seen64 = major * 10 + minor >= 2 and major < 1000 and minor < 1000
        self.version: Tuple[int, int, int] = (major, minor, revision)
        # darknet writes fully connected weights as [inputs, outputs] when either version number is above 1000
        self.transposed = major > 1000 or minor > 1000
        self._data = data
        self._pos = 20 if seen64 else 16

    @property
    def version_text(self) -> str:
        return "darknet weights %d.%d.%d" % self.version

    def take(self, count: int, what: str) -> np.ndarray:
        """The next ``count`` floats; a file that ends first is truncated or belongs to another .cfg."""
        end = self._pos + 4 * count
        if end > len(self._data):
            raise InvalidInput("%s ends at byte %d, expected %d more float32 values for %s: the file is truncated or "
                               "was written for another .cfg" % (self.path, len(self._data),
                                                                 count - (len(self._data) - self._pos) // 4, what))
        arr = np.frombuffer(self._data, "<f4", count, self._pos).astype(np.float32)
        self._pos = end
        return arr

    @property
    def remaining(self) -> int:
        return (len(self._data) - self._pos) // 4
