"""GPU thread indices as schedule axes: ``te.thread_axis("threadIdx.x")``, what ``Stage.bind`` binds a loop to."""
from __future__ import annotations

from typing import Any

from tether.errors import ScheduleError
from tether.te.expr import IterVar
from tether.tir.device import THREAD_TAGS


class ThreadAxis(IterVar):
    """An IterVar of kind ``"thread"`` naming one launch index (``thread_tag``); ``extent`` is None unless the
    axis was declared with a domain, and then every loop bound to it must have that extent."""

    __slots__ = ("thread_tag",)

    def __init__(self, tag: str, extent: int | None = None, name: str = ""):
        super().__init__(name or tag, extent, "thread")
        self.thread_tag = tag


def thread_axis(dom: Any = None, tag: str = "", name: str = "") -> ThreadAxis:
    """A thread index to bind loops to: ``thread_axis("blockIdx.x")`` or, TVM style, ``thread_axis((0, 64),
    "threadIdx.x")`` / ``thread_axis(64, "threadIdx.x")`` with the extent every bound loop must have."""
    if isinstance(dom, str):
        dom, tag = None, dom
    if tag not in THREAD_TAGS:
        raise ScheduleError(f"thread_axis: unknown thread tag {tag!r} (valid: {', '.join(THREAD_TAGS)})")
    extent = None
    if dom is not None:
        lo, hi = (0, dom) if not isinstance(dom, (list, tuple)) else dom
        if int(lo) != 0 or int(hi) <= 0:
            raise ScheduleError(f"thread_axis {tag}: the domain must be [0, n) with n > 0, got {dom!r}")
        extent = int(hi)
    return ThreadAxis(tag, extent, name)
