"""What a tracker remembers across a restart: places in line and who holds which device (``--state FILE``).

The tracker's live state is its connections, and those die with it: devices reconnect and re-register by
themselves, clients reconnect and ask again. What cannot be rebuilt from them is *order*: which waiting request
came first, and who a busy device was lent to. This module keeps exactly that, in a small JSON file::

    {"version": 1, "saved_at": <unix time>, "last_id": <highest request/device id handed out>,
     "tickets": [{"ticket", "key", "priority", "seq", "deadline"}],      # queued requests, with their place
     "holds":   [{"key", "host", "port", "holder", "since"}]}           # busy devices and their holders

Every queued request has a ticket (sent to its client in QUEUED). A client that comes back with its ticket
(after a tracker restart, or after its own connection dropped) is queued again with its old place (``seq``)
while the ticket is fresh: until the request's own wait deadline, and at most ``TICKET_GRACE`` seconds after it
was left behind. A device that re-registers as busy from an address with a saved hold gets its holder back.

The file is written atomically (a temporary file, fsync, rename) from a worker thread at most every
``interval`` seconds while something changed, so a tracker killed outright loses at most the last
``interval`` of changes; the snapshot itself is taken in the event loop, so it is always consistent.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

log = logging.getLogger(__name__)

STATE_VERSION = 1
#: How long a left-behind ticket (its client gone, or the tracker restarted) keeps its place, at most.
TICKET_GRACE = 60.0
#: How long a saved hold waits for its device to re-register after a restart.
HOLD_GRACE = 120.0


class Ticket:
    """A place in line that outlives its connection: the request's pattern, priority and arrival number."""

    __slots__ = ("ticket", "key", "priority", "seq", "deadline")

    def __init__(self, ticket: str, key: str, priority: float, seq: int, deadline: float):
        self.ticket, self.key, self.priority, self.seq, self.deadline = ticket, key, priority, seq, deadline

    def to_json(self) -> dict:
        return {"ticket": self.ticket, "key": self.key, "priority": self.priority, "seq": self.seq,
                "deadline": self.deadline}


Address = Tuple[str, str, int]


class Restored:
    """Tickets and holds waiting to be claimed (from the state file, or left behind by a dropped client)."""

    def __init__(self) -> None:
        self.tickets: Dict[str, Ticket] = {}
        self.holds: Dict[Address, dict] = {}
        self.last_id = 0

    def leave_ticket(self, ticket: Ticket) -> None:
        ticket.deadline = min(ticket.deadline, time.time() + TICKET_GRACE)
        if ticket.deadline > time.time():
            self.tickets[ticket.ticket] = ticket

    def claim_ticket(self, ticket: Optional[str], key: str) -> Optional[Ticket]:
        """The place a returning request gets back, if its ticket is known, fresh and for the same pattern."""
        if not ticket:
            return None
        entry = self.tickets.get(ticket)
        if entry is None or entry.key != key or entry.deadline < time.time():
            return None
        del self.tickets[ticket]
        return entry

    def claim_hold(self, address: Address) -> Optional[dict]:
        return self.holds.pop(address, None)

    def expire(self) -> bool:
        """Drop stale entries; True if any went."""
        now = time.time()
        stale = [t for t, e in self.tickets.items() if e.deadline < now]
        for t in stale:
            del self.tickets[t]
        gone = [a for a, h in self.holds.items() if h["expires"] < now]
        for a in gone:
            del self.holds[a]
        return bool(stale or gone)


def load(path: str) -> Restored:
    """Read a state file; a missing one is an empty state, a damaged one is reported and ignored."""
    restored = Restored()
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        return restored
    except (OSError, ValueError) as exc:
        log.warning("tracker state file %s unreadable (%s): starting with an empty queue", path, exc)
        return restored
    try:
        if not isinstance(data, dict) or data.get("version") != STATE_VERSION:
            raise ValueError("version %r, expected %d" % (data.get("version") if isinstance(data, dict) else None,
                                                          STATE_VERSION))
        now = time.time()
        restored.last_id = int(data.get("last_id", 0))
        for t in data.get("tickets", []):
            entry = Ticket(str(t["ticket"]), str(t["key"]), float(t["priority"]), int(t["seq"]),
                           min(float(t["deadline"]), now + TICKET_GRACE))
            if entry.deadline > now:
                restored.tickets[entry.ticket] = entry
        for h in data.get("holds", []):
            address = (str(h["key"]), str(h["host"]), int(h["port"]))
            restored.holds[address] = {"holder": str(h["holder"]), "since": float(h["since"]),
                                       "expires": now + HOLD_GRACE}
    except (KeyError, TypeError, ValueError) as exc:
        log.warning("tracker state file %s is not a tracker state (%s): starting with an empty queue", path, exc)
        return Restored()
    log.info("tracker state restored from %s: %d queued request(s), %d held device(s)", path,
             len(restored.tickets), len(restored.holds))
    return restored


def _write_atomically(path: str, text: str) -> None:
    tmp = "%s.tmp%d" % (path, os.getpid())
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class StateWriter:
    """Writes ``snapshot()`` to ``path`` after changes, at most every ``interval`` seconds, one write at a time."""

    def __init__(self, path: str, snapshot: Callable[[], Dict[str, Any]], interval: float = 0.2):
        self.path = path
        self.snapshot = snapshot
        self.interval = interval
        self._timer: Optional[asyncio.TimerHandle] = None
        self._writing: Optional["asyncio.Future[None]"] = None
        self._dirty = False
        self.writes = 0

    def changed(self) -> None:
        self._dirty = True
        if self._timer is None and self._writing is None:
            self._timer = asyncio.get_running_loop().call_later(self.interval, self._save)

    def _save(self) -> None:
        self._timer = None
        if not self._dirty:
            return
        self._dirty = False
        text = json.dumps(self.snapshot(), separators=(",", ":"))
        loop = asyncio.get_running_loop()
        self._writing = loop.run_in_executor(None, _write_atomically, self.path, text)
        self._writing.add_done_callback(self._written)

    def _written(self, future: "asyncio.Future[None]") -> None:
        self._writing = None
        exc = future.exception()
        if exc is not None:
            log.warning("could not write the tracker state file %s: %s", self.path, exc)
        self.writes += 1
        if self._dirty:
            self._timer = asyncio.get_running_loop().call_later(self.interval, self._save)

    def flush(self) -> None:
        """Write now, synchronously (a clean shutdown)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        try:
            _write_atomically(self.path, json.dumps(self.snapshot(), separators=(",", ":")))
        except OSError as exc:
            log.warning("could not write the tracker state file %s: %s", self.path, exc)


def snapshot(last_id: int, tickets: List[Ticket], holds: List[dict]) -> Dict[str, Any]:
    return {"version": STATE_VERSION, "saved_at": time.time(), "last_id": last_id,
            "tickets": [t.to_json() for t in tickets], "holds": holds}
