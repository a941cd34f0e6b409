"""A tracker killed outright (SIGKILL) and restarted on the same port, with real device servers and real clients.

What must survive (docs/tracker.md, "Restarts"): with ``--state``, a waiting request's place in line (its ticket)
and a running session's holder; without it, the waiting request itself (the client reconnects and asks again).
"""
from __future__ import annotations

import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading

from fixtures.polling import HANG_S, wait_until

# One waiting client: queue for "pi", say what happens on stdout, hold the session until told on stdin.
CLIENT = """
import sys
from tether import rpc
name, port, backoff = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
t = rpc.connect_tracker("127.0.0.1", port, name=name, reconnect_backoff=backoff)
with t.request("pi", priority=1, wait_timeout=120,
               on_queued=lambda info: print("QUEUED", info["ticket"], flush=True)) as s:
    print("GRANTED", s.get_function("tether.echo")(name), t.reconnects, flush=True)
    sys.stdin.readline()
print("DONE", flush=True)
"""


class Client:
    """A real client process, its stdout lines read by a thread into a queue (every read has a timeout)."""

    def __init__(self, name: str, port: int):
        self.name = name
        self.proc = subprocess.Popen([sys.executable, "-c", CLIENT, name, str(port), "0.1"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: "queue.Queue[str]" = queue.Queue()
        self.seen = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))

    def expect(self, word: str) -> list:
        """The next line that starts with ``word``, split (other lines, e.g. logging, are kept in ``seen``)."""
        while True:
            try:
                line = self.lines.get(timeout=HANG_S)
            except queue.Empty:
                raise AssertionError("client %s: no %s line within %.0f s; saw %s" % (self.name, word, HANG_S,
                                                                                      self.seen))
            self.seen.append(line)
            if line == word or line.startswith(word + " "):
                return line.split()

    def release(self) -> None:
        self.proc.stdin.write("release\n")
        self.proc.stdin.flush()

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.kill()
        self.proc.wait(10)


def _pi(tracker) -> dict:
    """The one "pi" device as the summary shows it (state "" while it has not re-registered), plus its queue."""
    summary = tracker.summary()
    devices = [d for d in summary["devices"] if d["key"] == "pi"]
    assert len(devices) <= 1, devices
    device = devices[0] if devices else {"state": "", "holder": ""}
    return dict(device, pending=summary["queues"].get("pi", {}).get("pending", 0))


def _saved(path: str) -> dict:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def test_places_in_line_and_holds_survive_a_killed_tracker(tracker_lab, tmp_path):
    state = str(tmp_path / "tracker-state.json")
    tracker = tracker_lab.tracker(state=state)
    port = tracker.port
    tracker_lab.device(tracker, "pi")
    clients = []
    try:
        with tracker.client(name="holder-A") as holder:
            session = holder.request("pi", wait_timeout=HANG_S)
            wait_until(lambda: _pi(tracker)["state"] == "busy", HANG_S, "the device to report A's session")
            # B queues first, then C: B's place is ahead of C's
            b = Client("client-B", port)
            clients.append(b)
            ticket_b = b.expect("QUEUED")[1]
            c = Client("client-C", port)
            clients.append(c)
            ticket_c = c.expect("QUEUED")[1]
            wait_until(lambda: len(_saved(state).get("tickets", [])) == 2 and _saved(state).get("holds"), HANG_S,
                       "the state file to hold both places and A's hold")

            # B is slow to come back (stopped); the tracker dies outright and restarts on the same port
            os.kill(b.proc.pid, signal.SIGSTOP)
            tracker.kill()
            again = tracker_lab.tracker(port=port, state=state)
            assert c.expect("QUEUED")[1] == ticket_c, "C must come back with its own ticket"
            wait_until(lambda: _pi(again)["state"] == "busy", HANG_S, "the device to re-register busy")
            pi = _pi(again)
            assert pi["holder"].startswith("holder-A@"), "the held device must stay with its holder: %r" % pi
            assert pi["pending"] == 1          # C is back in line first
            os.kill(b.proc.pid, signal.SIGCONT)
            assert b.expect("QUEUED")[1] == ticket_b, "B must come back with its own ticket"
            wait_until(lambda: _pi(again)["pending"] == 2, HANG_S, "both clients back in line")

            # A's session (which outlived the tracker) ends: B's old place beats C's earlier return
            assert session.get_function("tether.echo")(7) == 7
            session.close()
        granted = b.expect("GRANTED")
        assert granted[1:] == ["client-B", "1"], granted      # the echo works, and B reconnected once
        pi = _pi(again)
        assert pi["holder"].startswith("client-B@") and pi["pending"] == 1, pi
        b.release()
        b.expect("DONE")
        assert c.expect("GRANTED")[1:] == ["client-C", "1"]
        c.release()
        c.expect("DONE")
        wait_until(lambda: _pi(again)["state"] == "free", HANG_S, "the device free at the end")
        assert _pi(again)["pending"] == 0
    finally:
        for client in clients:
            client.stop()


def test_waiting_request_survives_a_restart_without_a_state_file(tracker_lab):
    tracker = tracker_lab.tracker()
    port = tracker.port
    tracker_lab.device(tracker, "pi")
    b = None
    try:
        with tracker.client(name="holder-A") as holder:
            session = holder.request("pi", wait_timeout=HANG_S)
            b = Client("client-B", port)
            b.expect("QUEUED")
            tracker.kill()
            again = tracker_lab.tracker(port=port)
            b.expect("QUEUED")                 # asked again: a new place, since this tracker kept nothing
            wait_until(lambda: _pi(again)["state"] == "busy", HANG_S, "the device to re-register busy")
            assert _pi(again)["holder"] == "", "without a state file the holder of a running session is unknown"
            session.close()
        assert b.expect("GRANTED")[1:] == ["client-B", "1"]
        b.release()
        b.expect("DONE")
        wait_until(lambda: _pi(again)["state"] == "free", HANG_S, "the device free at the end")
    finally:
        if b is not None:
            b.stop()


def test_a_damaged_state_file_is_reported_and_ignored(tracker_lab, tmp_path):
    state = tmp_path / "tracker-state.json"
    state.write_text('{"version": 1, "tickets": [{"ticket": 5}]')       # cut off mid-write by hand
    tracker = tracker_lab.tracker(state=str(state))
    tracker_lab.device(tracker, "pi")
    with tracker.client() as t, t.request("pi", wait_timeout=HANG_S) as s:
        assert s.get_function("tether.echo")(1) == 1
    wait_until(lambda: "unreadable" in tracker.log(), HANG_S, "the damaged file to be reported")
    assert "Traceback" not in tracker.log()
    # and the tracker writes a good one over it
    wait_until(lambda: _saved(str(state)).get("version") == 1, HANG_S, "a fresh state file")


def _raw_client(port: int):
    from tether_rpc import protocol as p, transport
    from tether_rpc.tracker_protocol import TrackerMsg, hello_payload

    sock = socket.create_connection(("127.0.0.1", port), timeout=HANG_S)
    reader = transport.FrameReader(sock, p.DEFAULT_LIMITS)
    transport.send_frame(sock, TrackerMsg.HELLO, 0, hello_payload("client", "raw"))
    assert reader.read_frame()[0] == TrackerMsg.WELCOME
    return sock, reader


def test_a_client_whose_connection_broke_gets_its_place_back(tracker_lab):
    from tether_rpc import transport
    from tether_rpc.tracker_protocol import TrackerMsg

    tracker = tracker_lab.tracker()
    tracker_lab.device(tracker, "pi")
    request = {"key": "pi", "priority": 1, "wait_timeout": HANG_S, "session_timeout": 60}
    with tracker.client(name="holder-A") as holder, holder.request("pi", wait_timeout=HANG_S):
        first, reader = _raw_client(tracker.port)
        transport.send_frame(first, TrackerMsg.REQUEST, 1, request)
        msg_type, _, queued = reader.read_frame()
        assert msg_type == TrackerMsg.QUEUED and queued["ticket"]
        first.close()                           # its connection breaks: the request is withdrawn at once
        wait_until(lambda: _pi(tracker)["pending"] == 0, HANG_S, "the request to be withdrawn")
        granted_y = threading.Event()

        def later():
            with tracker.client(name="client-Y") as t, t.request("pi", wait_timeout=HANG_S):
                granted_y.set()

        th = threading.Thread(target=later)
        th.start()
        wait_until(lambda: _pi(tracker)["pending"] == 1, HANG_S, "Y to queue")
        back, reader = _raw_client(tracker.port)
        transport.send_frame(back, TrackerMsg.REQUEST, 1, dict(request, ticket=queued["ticket"]))
        msg_type, _, again = reader.read_frame()
        assert msg_type == TrackerMsg.QUEUED and again["ticket"] == queued["ticket"]
    # A left: the device goes to the returning request (its old place is ahead of Y's)
    msg_type, _, grant = reader.read_frame()
    assert msg_type == TrackerMsg.GRANT and grant["key"] == "pi"
    assert not granted_y.is_set()              # Y waits until that grant lapses unused (1 s)
    back.close()
    th.join(HANG_S)
    assert granted_y.is_set()
