"""The tracker's bookkeeping without any I/O: registered devices, queued requests, and who gets what next.

Invariant kept by :class:`Pool`: after every call, no free device matches any pending request. So a new request
only has to look at free devices, and a device that becomes free only has to look at the head of each queue.

Requests are queued per pattern (the string the client asked for: ``rasp4b``, ``rasp*``, ``arch=aarch64``) in a
heap ordered by (higher priority first, then arrival order). Withdrawn requests are dropped lazily when they reach
a heap's head, so cancelling is O(1) even with ten thousand requests waiting.

Nothing is matched by scanning every device per request. A plain key (``rasp4b``) is a dictionary lookup. Every
other pattern (a glob, tags) gets a match set: the ids of the devices it matches, computed once over all devices
and then kept up to date as devices come, go or change tags. So a queued ``arch=aarch64`` request, its QUEUED
notice and every summary cost a set lookup, not a thousand globs; a device that becomes free looks at its own key's
queue and, per pattern queue, at one set membership.
"""
from __future__ import annotations

import functools
import heapq
import itertools
import time
from collections import OrderedDict
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

from tether_rpc.protocol import new_packer
from tether_rpc.tracker_protocol import device_tags, parse_pattern, pattern_matches

_GLOB_CHARS = frozenset("*?[")


def _nothing() -> None:
    pass

#: Match sets kept for patterns no request waits on (recently used ones are kept, the oldest dropped).
MAX_IDLE_PATTERNS = 256


@functools.lru_cache(maxsize=4096)
def _parse(pattern_text: str) -> Dict[str, str]:
    return parse_pattern(pattern_text)      # shared by every request with the same text: never mutate it


def plain_key(pattern_text: str) -> bool:
    """True if the pattern is exactly one device key (no glob, no tags): served from the per-key indexes."""
    pattern = _parse(pattern_text)
    return len(pattern) == 1 and pattern.get("key") == pattern_text and not _GLOB_CHARS.intersection(pattern_text)


class Device:
    """One registered device server, as the tracker sees it."""

    __slots__ = ("id", "key", "tags", "info", "host", "port", "reverse", "conn", "state", "holder", "since",
                 "match", "grant_timer", "last_seen", "registered_at", "session_timeout", "encoded")

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
        self.encoded: Optional[bytes] = None   # describe() as msgpack, kept until the device changes

    def describe(self) -> dict:
        return {"id": self.id, "key": self.key, "host": self.host, "port": self.port, "reverse": self.reverse,
                "state": self.state, "holder": self.holder, "since": self.since, "tags": self.tags,
                "info": self.info, "registered_at": self.registered_at}


class Request:
    """A client's wish for a device: waits in its pattern's queue until granted, withdrawn or timed out."""

    __slots__ = ("id", "conn", "rid", "pattern_text", "pattern", "priority", "seq", "wait_timeout",
                 "session_timeout", "name", "state", "timer", "created", "ticket")

    def __init__(self, id: int, conn: Any, rid: int, pattern_text: str, priority: float, wait_timeout: float,
                 session_timeout: float, name: str):
        self.id = id
        self.conn = conn
        self.rid = rid
        self.pattern_text = pattern_text
        self.pattern = _parse(pattern_text)
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
        self.ticket = ""               # its place in line, for a client that comes back (tracker.state)

    def deadline(self) -> float:
        """The end of its wait, as a unix time."""
        return time.time() + self.created + self.wait_timeout - time.monotonic()

    def order(self) -> Tuple[float, int]:
        return (-self.priority, self.seq)


class Pool:
    def __init__(self) -> None:
        self.devices: Dict[int, Device] = {}
        # key -> free devices in the order they became free (dicts keep insertion order): longest-idle first
        self._free: Dict[str, Dict[int, Device]] = {}
        # pattern text -> heap of (-priority, seq, request); plain keys and other patterns apart, so that a device
        # becoming free looks at its own key's queue and the pattern queues only
        self._key_queues: Dict[str, List[Tuple[float, int, Request]]] = {}
        self._pattern_queues: Dict[str, List[Tuple[float, int, Request]]] = {}
        self._pending_count: Dict[str, int] = {}
        self._total: Dict[str, int] = {}                        # key -> registered devices with it
        self._by_address: Dict[Tuple[str, str, int], Device] = {}
        # pattern text (not a plain key) -> ids of the devices it matches; least recently used first
        self._matches: "OrderedDict[str, Set[int]]" = OrderedDict()
        self.last_id = 0
        self._packer = new_packer()
        #: called after every change of a queue or of a device's state (the state file's cue to save)
        self.changed: Callable[[], None] = _nothing

    def next_id(self) -> int:
        self.last_id += 1
        return self.last_id

    def skip_ids(self, last: int) -> None:
        """Continue numbering after ``last``: ids (and so arrival order) restored from a state file stay older."""
        self.last_id = max(self.last_id, last)

    # ----------------------------------------------------------------------------------------------- devices
    def add_device(self, device: Device) -> None:
        self.devices[device.id] = device
        self._total[device.key] = self._total.get(device.key, 0) + 1
        if not device.reverse:
            self._by_address[(device.key, device.host, device.port)] = device
        if device.state == "free":
            self._free.setdefault(device.key, {})[device.id] = device
        self._rematch(device)
        self.changed()

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
        for ids in self._matches.values():
            ids.discard(device.id)
        self.changed()

    def set_tags(self, device: Device, tags: Dict[str, str]) -> None:
        """A device re-registered with other tags (or info): the match sets follow."""
        device.encoded = None             # its info may have changed too
        if tags != device.tags:
            device.tags = tags
            self._rematch(device)

    def _rematch(self, device: Device) -> None:
        for text, ids in self._matches.items():
            if pattern_matches(_parse(text), device.key, device.tags):
                ids.add(device.id)
            else:
                ids.discard(device.id)

    def _drop_free(self, device: Device) -> None:
        free = self._free.get(device.key)
        if free is not None:
            free.pop(device.id, None)
            if not free:
                del self._free[device.key]

    def set_state(self, device: Device, state: str, holder: str = "") -> None:
        device.encoded = None
        device.state = state
        device.holder = holder
        device.since = time.time()
        if state == "free":
            device.match = None
            self._free.setdefault(device.key, {})[device.id] = device
        else:
            self._drop_free(device)
        self.changed()

    def find_by_address(self, key: str, host: str, port: int) -> Optional[Device]:
        return self._by_address.get((key, host, port))

    # ------------------------------------------------------------------------------------------- match sets
    def matching(self, pattern_text: str) -> Set[int]:
        """Ids of the devices a pattern (not a plain key) matches; computed once, then maintained."""
        ids = self._matches.get(pattern_text)
        if ids is not None:
            self._matches.move_to_end(pattern_text)
            return ids
        pattern = _parse(pattern_text)
        ids = {d.id for d in self.devices.values() if pattern_matches(pattern, d.key, d.tags)}
        self._matches[pattern_text] = ids
        if len(self._matches) > MAX_IDLE_PATTERNS:
            # forget the least recently used sets no request waits on (each costs an upkeep per device change)
            for text in [t for t in self._matches if t not in self._pending_count][:len(self._matches) -
                                                                                      MAX_IDLE_PATTERNS]:
                del self._matches[text]
        return ids

    # ---------------------------------------------------------------------------------------------- requests
    def _free_matching(self, request: Request) -> Optional[Device]:
        text = request.pattern_text
        if plain_key(text):
            free = self._free.get(text)
            return next(iter(free.values())) if free else None
        best: Optional[Device] = None
        devices = self.devices
        for device_id in self.matching(text):
            device = devices[device_id]
            if device.state == "free" and (best is None or device.since < best.since):
                best = device
        return best

    def add_request(self, request: Request) -> Optional[Device]:
        """Queue ``request``, or return the free device it takes at once (the caller then grants it)."""
        device = self._free_matching(request)
        if device is not None:
            request.state = "expecting"
            return device
        text = request.pattern_text
        queues = self._key_queues if plain_key(text) else self._pattern_queues
        heapq.heappush(queues.setdefault(text, []), (-request.priority, request.seq, request))
        self._pending_count[text] = self._pending_count.get(text, 0) + 1
        self.changed()
        return None

    def withdraw(self, request: Request, state: str = "withdrawn") -> None:
        if request.state == "pending":
            request.state = state
            text = request.pattern_text
            n = self._pending_count.get(text, 1) - 1
            if n:
                self._pending_count[text] = n
            else:
                self._pending_count.pop(text, None)
                # only withdrawn entries were left in it
                (self._key_queues if plain_key(text) else self._pattern_queues).pop(text, None)
            self.changed()

    @staticmethod
    def _head(heap: List[Tuple[float, int, Request]]) -> Optional[Request]:
        while heap and heap[0][2].state != "pending":
            heapq.heappop(heap)
        return heap[0][2] if heap else None

    def next_request_for(self, device: Device) -> Optional[Request]:
        """The best pending request that ``device`` can serve, taken off its queue (or None)."""
        best: Optional[Request] = None
        best_heap: Optional[List[Tuple[float, int, Request]]] = None
        heap = self._key_queues.get(device.key)
        if heap is not None:
            best = self._head(heap)
            best_heap = heap if best is not None else None
        for text, heap in self._pattern_queues.items():
            if device.id not in self.matching(text):
                continue
            head = self._head(heap)
            if head is not None and (best is None or head.order() < best.order()):
                best, best_heap = head, heap
        if best is None or best_heap is None:
            return None
        heapq.heappop(best_heap)
        self.withdraw(best, "expecting")
        return best

    def pending(self, pattern_text: str) -> int:
        return self._pending_count.get(pattern_text, 0)

    def pending_requests(self) -> List[Request]:
        """Every request waiting in a queue, best first within each pattern (for the state file)."""
        out: List[Request] = []
        for queues in (self._key_queues, self._pattern_queues):
            for heap in queues.values():
                out.extend(r for _, _, r in sorted(heap) if r.state == "pending")
        return out

    # ---------------------------------------------------------------------------------------------- summary
    def queue_state(self, pattern_text: str) -> dict:
        if plain_key(pattern_text):
            return {"total": self._total.get(pattern_text, 0), "free": len(self._free.get(pattern_text, ())),
                    "pending": self.pending(pattern_text)}
        ids = self.matching(pattern_text)
        devices = self.devices
        free = sum(1 for i in ids if devices[i].state == "free")
        return {"total": len(ids), "free": free, "pending": self.pending(pattern_text)}

    def encoded_devices(self) -> List[bytes]:
        """Every device's describe() as msgpack: a summary of a thousand devices re-encodes only those that
        changed since the last one, instead of building and encoding a thousand maps in the event loop."""
        pack = self._packer.pack
        out = []
        for device in self.devices.values():
            if device.encoded is None:
                device.encoded = pack(device.describe())
            out.append(device.encoded)
        return out

    def summary(self) -> dict:
        return {"devices": [d.describe() for d in self.devices.values()], "queues": self.queues()}

    def queues(self) -> Dict[str, Dict[str, int]]:
        """Per key and per pattern someone waits on: ``{total, free, pending}``."""
        queues: Dict[str, Dict[str, int]] = {}
        for key, total in self._total.items():
            queues[key] = {"total": total, "free": len(self._free.get(key, ())), "pending": 0}
        for text, n in self._pending_count.items():
            if text in queues:
                queues[text]["pending"] = n
            else:
                queues[text] = self.queue_state(text)
        return queues

    def waiting(self, limit: int = 20) -> Dict[str, dict]:
        """Per pattern with requests pending: ``{"pending": n, "first": [...]}``, the first ``limit`` of them in
        the order they will be served (client name, priority, seconds waited); for the dashboard."""
        now = time.monotonic()
        out: Dict[str, dict] = {}
        for text, heap in itertools.chain(self._key_queues.items(), self._pattern_queues.items()):
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
