"""The tracker's bookkeeping without any I/O: registered devices, queued requests, and who gets what next.

Invariant kept by :class:`Pool`: after every call, no free device matches any pending request. So a new request
only has to look at free devices, and a device that becomes free only has to look at the head of each queue.

Requests are queued per pattern (the string the client asked for: ``rasp4b``, ``rasp*``, ``arch=aarch64``) in a
heap ordered by (higher priority first, then arrival order). Withdrawn requests are dropped lazily when they reach
a heap's head, so cancelling is O(1) even with ten thousand requests waiting.
"""
from __future__ import annotations

import heapq
import itertools
import time
from typing import Any, Dict, List, Optional, Tuple

from tether_rpc.tracker_protocol import device_tags, parse_pattern, pattern_matches

_GLOB_CHARS = frozenset("*?[")


class Device:
    """One registered device server, as the tracker sees it."""

    __slots__ = ("id", "key", "tags", "info", "host", "port", "reverse", "conn", "state", "holder", "since",
                 "match", "grant_timer", "last_seen", "registered_at", "session_timeout")

    def __init__(self, id: int, key: str, tags: Dict[str, str], info: dict, host: str, port: int, reverse: bool,
                 conn: Any):
        self.id = id
        self.key = key
        self.tags = device_tags(key, tags, info)
        self.info = info
        self.host = host
        self.port = port
        self.reverse = reverse
        self.conn = conn
        self.state = "free"            # free -> granted (match issued) -> busy (session running) -> free
        self.holder = ""               # name of the client holding it
        self.since = time.time()       # when it entered its current state (wall clock, for humans)
        self.match: Optional[str] = None
        self.grant_timer: Any = None
        self.last_seen = time.monotonic()
        self.registered_at = time.time()
        self.session_timeout = 0.0

    def describe(self) -> dict:
        return {"id": self.id, "key": self.key, "host": self.host, "port": self.port, "reverse": self.reverse,
                "state": self.state, "holder": self.holder, "since": self.since, "tags": self.tags,
                "info": self.info, "registered_at": self.registered_at}


class Request:
    """A client's wish for a device: waits in its pattern's queue until granted, withdrawn or timed out."""

    __slots__ = ("id", "conn", "rid", "pattern_text", "pattern", "priority", "seq", "wait_timeout",
                 "session_timeout", "name", "state", "timer", "created")

    def __init__(self, id: int, conn: Any, rid: int, pattern_text: str, priority: float, wait_timeout: float,
                 session_timeout: float, name: str):
        self.id = id
        self.conn = conn
        self.rid = rid
        self.pattern_text = pattern_text
        self.pattern = parse_pattern(pattern_text)
        self.priority = priority
        self.seq = id
        self.wait_timeout = wait_timeout
        self.session_timeout = session_timeout
        self.name = name
        # pending -> expecting (device told, not yet acknowledged) -> granted (client told); or withdrawn / timed_out.
        # An "expecting" request whose device falls through goes back to pending with its original place.
        self.state = "pending"
        self.timer: Any = None
        self.created = time.monotonic()

    def order(self) -> Tuple[float, int]:
        return (-self.priority, self.seq)


class Pool:
    def __init__(self) -> None:
        self.devices: Dict[int, Device] = {}
        # key -> free devices in the order they became free (dicts keep insertion order): longest-idle first
        self._free: Dict[str, Dict[int, Device]] = {}
        self._queues: Dict[str, List[Tuple[float, int, Request]]] = {}
        self._pending_count: Dict[str, int] = {}
        self._total: Dict[str, int] = {}                        # key -> registered devices with it
        self._by_address: Dict[Tuple[str, str, int], Device] = {}
        self._ids = itertools.count(1)

    def next_id(self) -> int:
        return next(self._ids)

    # ----------------------------------------------------------------------------------------------- devices
    def add_device(self, device: Device) -> None:
        self.devices[device.id] = device
        self._total[device.key] = self._total.get(device.key, 0) + 1
        if not device.reverse:
            self._by_address[(device.key, device.host, device.port)] = device
        if device.state == "free":
            self._free.setdefault(device.key, {})[device.id] = device

    def remove_device(self, device: Device) -> None:
        if self.devices.pop(device.id, None) is None:
            return
        n = self._total.get(device.key, 1) - 1
        if n:
            self._total[device.key] = n
        else:
            self._total.pop(device.key, None)
        if self._by_address.get((device.key, device.host, device.port)) is device:
            del self._by_address[(device.key, device.host, device.port)]
        self._drop_free(device)

    def _drop_free(self, device: Device) -> None:
        free = self._free.get(device.key)
        if free is not None:
            free.pop(device.id, None)
            if not free:
                del self._free[device.key]

    def set_state(self, device: Device, state: str, holder: str = "") -> None:
        device.state = state
        device.holder = holder
        device.since = time.time()
        if state == "free":
            device.match = None
            self._free.setdefault(device.key, {})[device.id] = device
        else:
            self._drop_free(device)

    def find_by_address(self, key: str, host: str, port: int) -> Optional[Device]:
        return self._by_address.get((key, host, port))

    # ---------------------------------------------------------------------------------------------- requests
    def _free_matching(self, request: Request) -> Optional[Device]:
        pattern = request.pattern
        key = pattern.get("key")
        if key is not None and len(pattern) == 1 and not _GLOB_CHARS.intersection(key):
            free = self._free.get(key)
            return next(iter(free.values())) if free else None
        best: Optional[Device] = None
        for free in self._free.values():
            for device in free.values():
                if pattern_matches(pattern, device.key, device.tags):
                    if best is None or device.since < best.since:
                        best = device
                    break    # within one key, the first is the longest idle
        return best

    def add_request(self, request: Request) -> Optional[Device]:
        """Queue ``request``, or return the free device it takes at once (the caller then grants it)."""
        device = self._free_matching(request)
        if device is not None:
            request.state = "expecting"
            return device
        heapq.heappush(self._queues.setdefault(request.pattern_text, []), (-request.priority, request.seq, request))
        self._pending_count[request.pattern_text] = self._pending_count.get(request.pattern_text, 0) + 1
        return None

    def withdraw(self, request: Request, state: str = "withdrawn") -> None:
        if request.state == "pending":
            request.state = state
            n = self._pending_count.get(request.pattern_text, 1) - 1
            if n:
                self._pending_count[request.pattern_text] = n
            else:
                self._pending_count.pop(request.pattern_text, None)
                self._queues.pop(request.pattern_text, None)   # only withdrawn entries were left in it

    def next_request_for(self, device: Device) -> Optional[Request]:
        """The best pending request that ``device`` can serve, taken off its queue (or None)."""
        best_heap: Optional[List[Tuple[float, int, Request]]] = None
        best_text = ""
        for text, heap in list(self._queues.items()):
            while heap and heap[0][2].state != "pending":
                heapq.heappop(heap)
            if not heap:
                del self._queues[text]
                continue
            head = heap[0][2]
            if (best_heap is None or head.order() < best_heap[0][2].order()) and \
                    pattern_matches(head.pattern, device.key, device.tags):
                best_heap, best_text = heap, text
        if best_heap is None:
            return None
        request = heapq.heappop(best_heap)[2]
        self.withdraw(request, "expecting")
        if not best_heap:
            self._queues.pop(best_text, None)
        return request

    def pending(self, pattern_text: str) -> int:
        return self._pending_count.get(pattern_text, 0)

    # ---------------------------------------------------------------------------------------------- summary
    def queue_state(self, pattern_text: str) -> dict:
        pattern = parse_pattern(pattern_text)
        key = pattern.get("key")
        if key is not None and len(pattern) == 1 and not _GLOB_CHARS.intersection(key):
            return {"total": self._total.get(key, 0), "free": len(self._free.get(key, ())),
                    "pending": self.pending(pattern_text)}
        total = free = 0
        for device in self.devices.values():
            if pattern_matches(pattern, device.key, device.tags):
                total += 1
                free += device.state == "free"
        return {"total": total, "free": free, "pending": self.pending(pattern_text)}

    def summary(self) -> dict:
        queues: Dict[str, Dict[str, int]] = {}
        for device in self.devices.values():
            q = queues.setdefault(device.key, {"total": 0, "free": 0, "pending": 0})
            q["total"] += 1
            q["free"] += device.state == "free"
        for text, n in self._pending_count.items():
            if text in queues:
                queues[text]["pending"] = n
            else:
                state = self.queue_state(text)
                queues[text] = state
        return {"devices": [d.describe() for d in self.devices.values()], "queues": queues}

    def waiting(self, limit: int = 20) -> Dict[str, dict]:
        """Per pattern with requests pending: ``{"pending": n, "first": [...]}``, the first ``limit`` of them in
        the order they will be served (client name, priority, seconds waited); for the dashboard."""
        now = time.monotonic()
        out: Dict[str, dict] = {}
        for text, heap in self._queues.items():
            out[text] = {"pending": self.pending(text),
                         "first": [{"client": r.name, "priority": r.priority, "waited": round(now - r.created, 3)}
                                   for r in _first_pending(heap, limit)]}
        return out


def _first_pending(heap: List[Tuple[float, int, Request]], limit: int) -> List[Request]:
    """The ``limit`` best pending requests of a heap without sorting it: a walk down from its root, best first,
    so ten thousand waiting cost no more than the few shown (plus the withdrawn ones passed on the way)."""
    out: List[Request] = []
    frontier = [(heap[0], 0)] if heap else []
    while frontier and len(out) < limit:
        entry, i = heapq.heappop(frontier)
        if entry[2].state == "pending":
            out.append(entry[2])
        for child in (2 * i + 1, 2 * i + 2):
            if child < len(heap):
                heapq.heappush(frontier, (heap[child], child))
    return out
