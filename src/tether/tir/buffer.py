"""Buffers: the flat arrays a lowered kernel reads and writes (its parameters and its scratch memory)."""
from __future__ import annotations

from typing import Sequence


class Buffer:
    """A flat array: a kernel parameter ("param"), or an internal buffer ("local" scratch)."""

    __hash__ = object.__hash__

    def __init__(self, name: str, shape: Sequence[int], dtype: str, scope: str = "param"):
        self.name = name
        self.shape = tuple(int(d) for d in shape)
        self.dtype = dtype
        self.scope = scope

    @property
    def size(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    def __repr__(self) -> str:
        return f"Buffer({self.name}, {self.shape}, {self.dtype}, {self.scope})"
