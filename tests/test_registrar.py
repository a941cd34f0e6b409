"""The device side of the tracker (tether_rpc.registrar): thread-free, and no tracker can hurt the server.

Real processes and sockets on loopback: a real `rpc-tracker` process, real `python -m tether_rpc` device servers,
and, for misbehaving trackers, a scripted fake tracker speaking (or mangling) the real framing over real sockets.
"""
from __future__ import annotations

import os
import re
import selectors
import socket
import socketserver
import threading
import time
from typing import Callable, List

import pytest

from fixtures.polling import HANG_S, wait_until
from fixtures.tracker import DeviceProcess
from tether import rpc
from tether_rpc import protocol as p, transport
from tether_rpc.errors import AuthenticationError, TetherTimeout
from tether_rpc.registrar import Registrar
from tether_rpc.tracker_protocol import TrackerMsg


def _threads(pid: int) -> int:
    return len(os.listdir("/proc/%d/task" % pid))


def _echo(session, value):
    return session.get_function("tether.echo")(value)


def _device_port(device) -> int:
    m = wait_until(lambda: re.search(r"listening on \S+:(\d+)", device.log()), 10, "the device to listen")
    return int(m.group(1))


# ------------------------------------------------------------------------------------------- a scripted tracker

class FakeTracker(socketserver.TCPServer):
    """Accepts connections one at a time and runs the next scripted behaviour on each (the last one repeats)."""

    allow_reuse_address = True
    request_queue_size = 16

    def __init__(self, behaviours: List[Callable[[socket.socket], None]]):
        self.behaviours = behaviours
        self.connections = 0
        super().__init__(("127.0.0.1", 0), _ScriptedConnection)
        self.port = self.server_address[1]
        self._thread = threading.Thread(target=self.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.shutdown()
        self._thread.join(5)
        self.server_close()


class _ScriptedConnection(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        tracker = self.server
        behaviour = tracker.behaviours[min(tracker.connections, len(tracker.behaviours) - 1)]
        tracker.connections += 1
        self.request.settimeout(5)
        try:
            behaviour(self.request)
        except OSError:
            pass


def _read_hello(conn: socket.socket) -> None:
    msg_type, _, payload = transport.FrameReader(conn, p.HANDSHAKE_LIMITS).read_frame()
    assert msg_type == TrackerMsg.HELLO and payload["role"] == "device"


def hang_up(conn: socket.socket) -> None:
    pass


def http_garbage(conn: socket.socket) -> None:
    conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")
    time.sleep(0.1)


def huge_frame(conn: socket.socket) -> None:
    _read_hello(conn)
    conn.sendall(b"\xff\xff\xff\xf0")
    time.sleep(0.1)


def unknown_type_after_welcome(conn: socket.socket) -> None:
    _read_hello(conn)
    conn.sendall(p.encode_frame(TrackerMsg.WELCOME, 0, {"version": 1}) + p.encode_frame(99, 0, {}))
    time.sleep(0.1)


def dial_to_a_listening_device(conn: socket.socket) -> None:
    reader = transport.FrameReader(conn, p.DEFAULT_LIMITS)
    _read_hello(conn)
    conn.sendall(p.encode_frame(TrackerMsg.WELCOME, 0, {"version": 1}))
    assert reader.read_frame()[0] == TrackerMsg.REGISTER
    conn.sendall(p.encode_frame(TrackerMsg.REGISTERED, 0, {"device": 1, "heartbeat": 1.0})
                 + p.encode_frame(TrackerMsg.DIAL, 0, {"match": "m" * 24}))
    time.sleep(0.1)


def silent(conn: socket.socket) -> None:
    time.sleep(1.5)


def _drive(reg: Registrar, seconds: float, until: Callable[[], bool] = lambda: False) -> None:
    """Run a registrar the way the device server does: our selector, our loop, no thread."""
    sel = selectors.DefaultSelector()
    reg.attach(sel)
    end = time.monotonic() + seconds
    try:
        while time.monotonic() < end and not until():
            timeout = max(0.0, min(0.05, reg.tick() - time.monotonic()))
            for key, mask in sel.select(timeout):
                key.data(key.fileobj, mask)
    finally:
        reg.close()
        sel.close()


# ------------------------------------------------------------------------------------------------ the tests

def test_server_parent_has_one_thread_while_registered(tracker_lab, monkeypatch):
    # numpy's OpenBLAS starts its own thread pool at import (and shuts it down around fork): pin it to one thread
    # so the count below is the server's own.
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "1")
    tracker = tracker_lab.tracker()
    direct = tracker_lab.device(tracker, "pi")
    reverse = tracker_lab.device(tracker, "phone", reverse=True)
    for dev in (direct, reverse):
        assert _threads(dev.proc.pid) == 1, "registered device server has %d threads" % _threads(dev.proc.pid)
    with tracker.client() as t:
        for key, dev in (("pi", direct), ("phone", reverse)):
            for n in range(2):      # re-registers after each session
                with t.request(key, wait_timeout=10) as s:
                    assert _echo(s, n) == n
                    assert _threads(dev.proc.pid) == 1, "the parent of a running session must stay single-threaded"
                wait_until(lambda: tracker.count(key, "free") == 1, HANG_S, "%s free again" % key)
                assert _threads(dev.proc.pid) == 1


def test_grant_session_timeout_ends_with_tether_timeout(tracker_lab):
    tracker = tracker_lab.tracker()
    tracker_lab.device(tracker, "pi")
    with tracker.client() as t:
        with t.request("pi", wait_timeout=5, session_timeout=0.5) as s:
            assert _echo(s, 1) == 1
            time.sleep(1.0)
            with pytest.raises(TetherTimeout, match="0.5 s"):
                _echo(s, 2)
        wait_until(lambda: tracker.count("pi", "free") == 1, HANG_S, "pi free after its session timeout")
        with t.request("pi", wait_timeout=5) as s:
            assert _echo(s, 3) == 3


def test_misbehaving_tracker_never_hurts_the_server(tracker_lab):
    fake = FakeTracker([hang_up, http_garbage, huge_frame, unknown_type_after_welcome, dial_to_a_listening_device])
    try:
        device = DeviceProcess(fake.port, "pi", tracker_lab.workdir)
        tracker_lab.devices.append(device)      # stopped by the fixture
        port = _device_port(device)
        wait_until(lambda: fake.connections >= 5, 20, "five reconnects to the misbehaving tracker")
        assert device.proc.poll() is None, device.log()
        with pytest.raises(AuthenticationError, match="match token"):   # the server still answers
            rpc.connect("127.0.0.1", port, timeout=HANG_S)
    finally:
        fake.close()
    # a real tracker takes over the same port: the device registers and serves
    tracker = tracker_lab.tracker(port=fake.port)
    wait_until(lambda: tracker.count("pi") == 1, 15, "the device to register with the real tracker")
    with tracker.client() as t, t.request("pi", wait_timeout=5) as s:
        assert _echo(s, "ok") == "ok"
    log = device.log()
    assert "Traceback" not in log, log
    assert "not in reverse mode" in log and "exceeds the limit" in log


def test_silent_tracker_hits_the_handshake_deadline_and_is_retried(caplog):
    fake = FakeTracker([silent])
    reg = Registrar(("127.0.0.1", fake.port), "quiet", port=9, connect_timeout=0.3, max_backoff=0.05)
    try:
        with caplog.at_level("INFO", logger="tether_rpc.registrar"):
            _drive(reg, HANG_S, until=lambda: fake.connections >= 3)
        assert fake.connections >= 3, "the registrar stopped retrying a silent tracker"
        assert reg.registrations == 0
        # each link ended by the registrar's own deadline, not by the tracker hanging up after its silence
        assert "did not complete the handshake within 0.3 s" in caplog.text, caplog.text
    finally:
        fake.close()


def test_connect_deadline_on_a_tracker_that_never_accepts():
    # a listener whose accept queue is full drops further SYNs: a connect to it neither succeeds nor fails
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    fillers = []
    for _ in range(4):
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(listener.getsockname())
        fillers.append(s)
    reg = Registrar(listener.getsockname(), "stuck", port=9, connect_timeout=0.3, max_backoff=0.05)
    states = []
    try:
        sel = selectors.DefaultSelector()
        reg.attach(sel)
        end = time.monotonic() + 1.5
        while time.monotonic() < end:
            for key, mask in sel.select(max(0.0, min(0.02, reg.tick() - time.monotonic()))):
                key.data(key.fileobj, mask)
            states.append(reg.state)
        # it kept trying (connecting -> idle -> connecting ...) without ever blocking this loop
        assert states.count("connecting") > 0 and states.count("idle") > 0
        assert reg.registrations == 0
    finally:
        reg.close()
        sel.close()
        for s in fillers:
            s.close()
        listener.close()


def test_registrar_in_a_plain_loop_registers_and_answers_expect(tracker_lab):
    tracker = tracker_lab.tracker()
    reg = Registrar(("127.0.0.1", tracker.port), "loop", port=9, info=lambda: {"arch": "test-arch"})
    sel = selectors.DefaultSelector()
    reg.attach(sel)
    result = {}

    def client() -> None:
        with tracker.client() as t:
            result["grant"] = t.reserve("loop", wait_timeout=5, session_timeout=7)

    th = None
    threads_before = {t.ident for t in threading.enumerate()}  # earlier tests may leave pool threads behind
    try:
        end = time.monotonic() + 10
        while time.monotonic() < end and "grant" not in result:
            for key, mask in sel.select(max(0.0, min(0.05, reg.tick() - time.monotonic()))):
                key.data(key.fileobj, mask)
            if reg.registered and th is None:
                # the registrar started no thread in this process
                assert {t.ident for t in threading.enumerate()} == threads_before
                th = threading.Thread(target=client)
                th.start()
        assert th is not None and reg.registrations == 1
        th.join(5)
        grant = result["grant"]
        terms = reg.accept_match(grant["match"])
        assert terms == {"match": grant["match"], "client": terms["client"], "session_timeout": 7.0}
        assert reg.accept_match(grant["match"]) is None          # one-time
        (dev,) = [d for d in tracker.summary()["devices"] if d["key"] == "loop"]
        assert dev["tags"]["arch"] == "test-arch" and dev["port"] == 9
    finally:
        reg.close()
        sel.close()
    wait_until(lambda: tracker.count("loop") == 0, HANG_S, "the closed registrar's device to leave")


def test_device_with_a_token_refuses_a_tracker_that_cannot_prove_it(tracker_lab, caplog):
    tracker = tracker_lab.tracker()          # no token: it never challenges, so it cannot prove one either
    reg = Registrar(("127.0.0.1", tracker.port), "careful", port=9, token="s3cret", max_backoff=0.05)
    with caplog.at_level("ERROR", logger="tether_rpc.registrar"):
        _drive(reg, 1.0)
    assert reg.registrations == 0 and tracker.count("careful") == 0
    assert "did not ask for the token" in caplog.text


def test_cli_flags_reach_the_tracker(tracker_lab):
    import subprocess
    import sys

    from fixtures.children import stop_process

    tracker = tracker_lab.tracker(token="flag-token")
    env = {k: v for k, v in os.environ.items() if k not in ("TETHER_TRACKER_TOKEN", "TETHER_DEVICE_TAGS")}
    log = open(os.path.join(tracker_lab.workdir, "flags.log"), "wb")
    proc = subprocess.Popen([sys.executable, "-m", "tether_rpc", "--port", "0", "--tracker",
                             "127.0.0.1:%d" % tracker.port, "--key", "flagged", "--tracker-token", "flag-token",
                             "--tag", "board=pi4", "--tag", "lab=b12,room=3", "--advertise-host", "localhost",
                             "--workdir", tracker_lab.workdir], stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        wait_until(lambda: tracker.count("flagged") == 1 or proc.poll() is not None, 15, "the device to register")
        (dev,) = [d for d in tracker.summary()["devices"] if d["key"] == "flagged"]
        assert {k: dev["tags"][k] for k in ("board", "lab", "room")} == {"board": "pi4", "lab": "b12", "room": "3"}
        assert dev["host"] == "localhost"
    finally:
        stop_process(proc)
        log.close()


def test_tracker_host_name_is_looked_up_in_a_child_process(tracker_lab):
    tracker = tracker_lab.tracker()
    reg = Registrar(("localhost", tracker.port), "named", port=9)
    states = set()
    sel = selectors.DefaultSelector()
    reg.attach(sel)
    try:
        end = time.monotonic() + 10
        while time.monotonic() < end and not reg.registered:
            for key, mask in sel.select(max(0.0, min(0.05, reg.tick() - time.monotonic()))):
                key.data(key.fileobj, mask)
            states.add(reg.state)
        assert reg.registered and "resolving" in states, states
        assert tracker.count("named") == 1
        # tick first: it is what reaps a child that was still dying when the lookup ended
        wait_until(lambda: reg.tick() > 0 and not reg._unreaped, 10, "the lookup child to be reaped")
        zombies = [pid for pid in map(int, filter(str.isdigit, os.listdir("/proc")))
                   if _stat_field(pid, 3) == str(os.getpid()) and _stat_field(pid, 2) == "Z"]
        assert not zombies
    finally:
        reg.close()
        sel.close()


def test_device_server_with_a_named_tracker(tracker_lab):
    import subprocess
    import sys

    from fixtures.children import stop_process

    tracker = tracker_lab.tracker()
    log = open(os.path.join(tracker_lab.workdir, "named.log"), "wb")
    proc = subprocess.Popen([sys.executable, "-m", "tether_rpc", "--port", "0", "--tracker",
                             "localhost:%d" % tracker.port, "--key", "named", "--workdir", tracker_lab.workdir],
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: tracker.count("named") == 1 or proc.poll() is not None, 15, "the device to register")
        assert proc.poll() is None
        with tracker.client() as t, t.request("named", wait_timeout=5) as s:
            assert _echo(s, 1) == 1
    finally:
        stop_process(proc)
        log.close()


def _stat_field(pid: int, index: int) -> str:
    try:
        with open("/proc/%d/stat" % pid) as f:
            text = f.read()
    except OSError:
        return ""
    fields = text[text.rindex(")") + 2:].split()     # after "pid (comm) "
    return fields[index - 2] if index >= 2 else ""
