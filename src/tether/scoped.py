"""An attribute set for the length of a ``with`` block and restored after it, also when the block raises.

Code generation keeps a little state of this kind (the CPU variant being emitted, the names Vars print under),
read by code far down the call stack that should not have to pass it along.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator


@contextmanager
def attribute_set(obj: Any, name: str, value: Any) -> Iterator[None]:
    """``obj.name = value`` inside the block; its earlier value (None if it had none) after it."""
    saved = getattr(obj, name, None)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, saved)
