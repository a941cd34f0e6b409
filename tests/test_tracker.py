"""The tracker with real processes on loopback: an `rpc-tracker` process and `python -m tether_rpc` devices."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from fixtures.prereq import unavailable
from fixtures.polling import HANG_S, wait_until
from tether import rpc
from tether_rpc import protocol as p, transport
from tether_rpc.errors import AuthenticationError, TetherError, TetherTimeout
from tether_rpc.tracker_protocol import TrackerMsg, hello_payload


def _echo(session, value):
    return session.get_function("tether.echo")(value)


# ----------------------------------------------------------------------------------------------- sharing, order

def test_two_devices_four_clients_share_fairly(shared_lab):
    tracker = shared_lab.trackers[0]
    lock = threading.Lock()
    active = [0]
    peak = [0]
    served = {i: 0 for i in range(4)}
    ports = set()
    errors = []

    def client(i: int) -> None:
        try:
            with tracker.client(name="client%d" % i) as t:
                for n in range(3):
                    with t.request("rasp4b", wait_timeout=20) as s:
                        with lock:
                            active[0] += 1
                            peak[0] = max(peak[0], active[0])
                            ports.add(s.port)
                        assert _echo(s, i * 10 + n) == i * 10 + n
                        time.sleep(0.05)
                        with lock:
                            active[0] -= 1
                    served[i] += 1
        except Exception as exc:  # reported below, with the client's number
            errors.append((i, exc))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert not errors, errors
    assert served == {0: 3, 1: 3, 2: 3, 3: 3}
    assert peak[0] == 2, "two rasp4b devices: sessions at once were %d" % peak[0]
    assert len(ports) == 2, "both devices must have been used"


def test_fifo_within_priority_and_priority_first(shared_lab):
    tracker = shared_lab.trackers[0]
    order = []
    threads = []
    with tracker.client() as holder_tracker:
        holder_a = holder_tracker.request("rasp4b", wait_timeout=10)
        with tracker.client() as other:
            holder_b = other.request("rasp4b", wait_timeout=10)
            try:
                # queue A, B, C at priority 1 in that order, then D at priority 5
                for name, prio in (("A", 1), ("B", 1), ("C", 1), ("D", 5)):
                    queued = threading.Event()

                    def run(name=name, prio=prio, queued=queued):
                        with tracker.client(name=name) as t:
                            with t.request("rasp4b", priority=prio, wait_timeout=30,
                                           on_queued=lambda info: queued.set()) as s:
                                order.append(name)
                                _echo(s, name)

                    th = threading.Thread(target=run)
                    th.start()
                    threads.append(th)
                    assert queued.wait(10), "request %s was not queued" % name
                assert tracker.summary()["queues"]["rasp4b"]["pending"] == 4
            finally:
                holder_a.close()      # one device serves the queue one by one; the other stays held
            for th in threads:
                th.join(30)
            holder_b.close()
    assert order == ["D", "A", "B", "C"]


# ------------------------------------------------------------------------------------------- timeouts, leavers

def test_unknown_key_times_out_in_about_the_wait_timeout(shared_lab):
    tracker = shared_lab.trackers[0]
    with tracker.client() as t:
        t0 = time.monotonic()
        with pytest.raises(TimeoutError) as info:
            t.request("no-such-board", wait_timeout=1)
        elapsed = time.monotonic() - t0
        assert isinstance(info.value, TetherTimeout)
        assert 0.9 <= elapsed < HANG_S, elapsed   # not before the wait timeout; fired, not hung
        assert "no-such-board" in str(info.value) and "0 device(s) match" in str(info.value)
        # the connection stays usable after a timed-out request
        assert t.summary()["queues"].get("no-such-board", {}).get("pending", 0) == 0


def test_wait_timeout_names_busy_queue(shared_lab):
    tracker = shared_lab.trackers[0]
    with tracker.client() as holder, holder.request("rasp5", wait_timeout=10):
        with tracker.client() as t:
            with pytest.raises(TetherTimeout, match=r"'rasp5'.*1 device\(s\) match \(1 busy"):
                t.request("rasp5", wait_timeout=0.5)


def test_killed_queued_client_leaves_no_pending_entry(shared_lab, tmp_path):
    tracker = shared_lab.trackers[0]
    with tracker.client() as holder, holder.request("rasp5", wait_timeout=10):
        code = ("from tether import rpc; t = rpc.connect_tracker('127.0.0.1', %d); "
                "t.request('rasp5', wait_timeout=60)" % tracker.port)
        proc = subprocess.Popen([sys.executable, "-c", code])
        try:
            wait_until(lambda: tracker.summary()["queues"]["rasp5"]["pending"] == 1, 15, "the client to queue")
            proc.kill()
            proc.wait(5)
            # gone when its connection closes, long before the dead request's 60 s wait timeout
            wait_until(lambda: tracker.summary()["queues"]["rasp5"]["pending"] == 0, 30, "the entry to go")
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(5)
    # and the device is not swallowed by the dead request
    wait_until(lambda: tracker.count("rasp5", "free") == 1, HANG_S, "rasp5 free again")


def test_unused_grant_returns_the_device(shared_lab):
    tracker = shared_lab.trackers[0]
    with tracker.client() as t:
        grant = t.reserve("rasp5", wait_timeout=5)
        assert tracker.count("rasp5", "granted") == 1
        wait_until(lambda: tracker.count("rasp5", "free") == 1, HANG_S, "the grant to lapse")
        # the lapsed match token is refused by the device itself
        with pytest.raises(AuthenticationError):
            rpc.connect("127.0.0.1", grant["port"], match=grant["match"], timeout=5)
        with t.request("rasp5", wait_timeout=5) as s:
            assert _echo(s, 7) == 7


def test_device_refuses_sessions_without_a_match(shared_lab):
    tracker = shared_lab.trackers[0]
    port = next(d["port"] for d in tracker.summary()["devices"] if d["key"] == "rasp5")
    with pytest.raises(AuthenticationError):
        rpc.connect("127.0.0.1", port, timeout=5)
    with pytest.raises(AuthenticationError):
        rpc.connect("127.0.0.1", port, match="made-up-token-123", timeout=5)


def test_session_timeout_ends_the_session(shared_lab):
    tracker = shared_lab.trackers[0]
    with tracker.client() as t:
        with t.request("rasp5", wait_timeout=5, session_timeout=0.5) as s:
            assert _echo(s, 1) == 1
            time.sleep(1.0)
            with pytest.raises((TetherError, OSError)):
                _echo(s, 2)
        wait_until(lambda: tracker.count("rasp5", "free") == 1, HANG_S, "rasp5 free after its session timeout")


# ----------------------------------------------------------------------------------------------- matching

def test_prefix_and_tag_matching(shared_lab):
    tracker = shared_lab.trackers[0]
    summary = tracker.summary()
    arch = next(d for d in summary["devices"] if d["key"] == "rasp5")["tags"]["arch"]
    with tracker.client() as t:
        with t.request("rasp*", wait_timeout=5) as a, t.request("rasp*", wait_timeout=5) as b, \
                t.request("rasp*", wait_timeout=5) as c:
            assert len({a.port, b.port, c.port}) == 3      # all three rasp devices
        with t.request("board=pi5", wait_timeout=5) as s:
            assert s.port == next(d["port"] for d in tracker.summary()["devices"] if d["key"] == "rasp5")
        with t.request("arch=%s,lab=b12" % arch, wait_timeout=5) as s:
            ports = {d["port"] for d in tracker.summary()["devices"] if d["key"] == "rasp4b"}
            assert s.port in ports
        other = "aarch64" if arch != "aarch64" else "armv7l"
        with pytest.raises(TetherTimeout, match="arch=%s" % other):
            t.request("arch=%s" % other, wait_timeout=0.3)


def test_summary_shape(shared_lab):
    tracker = shared_lab.trackers[0]
    t_name = "summary-test"
    with tracker.client(name=t_name) as t, t.request("rasp5", wait_timeout=5):
        # the device reports its session start itself, a moment after the client's WELCOME
        wait_until(lambda: tracker.count("rasp5", "busy") == 1, HANG_S, "rasp5 to report its session")
        s = t.summary()
        assert s["queues"]["rasp4b"] == {"total": 2, "free": 2, "pending": 0}
        assert s["queues"]["rasp5"] == {"total": 1, "free": 0, "pending": 0}
        (busy,) = [d for d in s["devices"] if d["key"] == "rasp5"]
        assert busy["state"] == "busy" and busy["holder"].startswith(t_name)
        assert abs(busy["since"] - time.time()) < 30
        assert busy["info"]["arch"] and busy["host"] == "127.0.0.1"


# ----------------------------------------------------------------------------------------------- liveness

def test_killed_and_frozen_devices_leave_and_come_back(tracker_lab):
    # killed: its connection closes, and that alone removes it (this tracker would wait 10 minutes for heartbeats)
    patient = tracker_lab.tracker(dead_after=600.0)
    a = tracker_lab.device(patient, "pi")
    assert patient.count("pi") == 1
    a.proc.kill()
    a.proc.wait(5)
    wait_until(lambda: patient.count("pi") == 0, HANG_S, "the killed device to leave")
    # frozen: alive but silent, its connection open: only missed heartbeats reveal it
    tracker = tracker_lab.tracker(dead_after=2.0)
    b = tracker_lab.device(tracker, "pi")
    assert tracker.count("pi") == 1
    os.kill(b.proc.pid, signal.SIGSTOP)
    try:
        wait_until(lambda: tracker.count("pi") == 0, HANG_S, "the frozen device to be dropped")
    finally:
        os.kill(b.proc.pid, signal.SIGCONT)
    wait_until(lambda: tracker.count("pi") == 1, HANG_S, "the thawed device to re-register")


def test_devices_come_back_after_tracker_restart(tracker_lab):
    tracker = tracker_lab.tracker()
    port = tracker.port
    tracker_lab.device(tracker, "pi")
    tracker_lab.device(tracker, "pi", reverse=True)
    tracker.kill()
    time.sleep(2.5)       # an outage: the registrars retry with backoff meanwhile
    again = tracker_lab.tracker(port=port)
    wait_until(lambda: again.count("pi") == 2, 10, "both devices to re-register")
    with again.client() as t, t.request("pi", wait_timeout=5) as s:
        assert _echo(s, 3) == 3


# ----------------------------------------------------------------------------------------------- robustness

def test_garbage_frames_and_idle_connections(shared_lab):
    tracker = shared_lab.trackers[0]
    idle = []
    try:
        for _ in range(200):
            idle.append(socket.create_connection(("127.0.0.1", tracker.port), timeout=5))
        garbage = [b"\x00\x00\x00\x08garbage!", b"\xff\xff\xff\xff", b"GET / HTTP/1.1\r\n\r\n",
                   p.encode_frame(99, 0, {}), p.encode_frame(TrackerMsg.HELLO, 0, {"magic": "nope"}),
                   p.encode_frame(TrackerMsg.HELLO, 0, hello_payload("client")) + b"\x00\x00\x00\x03\xc1\xc1\xc1",
                   p.encode_frame(TrackerMsg.RELAY, 0, {"match": "x" * 20}),
                   p.encode_frame(TrackerMsg.HELLO, 0, hello_payload("device"))
                   + p.encode_frame(TrackerMsg.REGISTER, 0, {"key": 5})]
        for data in garbage:
            with socket.create_connection(("127.0.0.1", tracker.port), timeout=5) as s:
                s.sendall(data)
                s.settimeout(2)
                try:
                    while s.recv(65536):
                        pass                  # the tracker answers with ERROR and closes
                except socket.timeout:
                    pytest.fail("the tracker kept a connection that sent garbage %r open" % data[:20])
        with tracker.client() as t:
            assert t.summary()["queues"]["rasp4b"]["total"] == 2
            with t.request("rasp4b", wait_timeout=5) as s:
                assert _echo(s, 42) == 42
    finally:
        for s in idle:
            s.close()


# ----------------------------------------------------------------------------------------------- reverse mode

def test_reverse_mode_device_through_the_relay(tracker_lab):
    tracker = tracker_lab.tracker()
    tracker_lab.device(tracker, "phone", reverse=True)
    (dev,) = [d for d in tracker.summary()["devices"] if d["key"] == "phone"]
    assert dev["reverse"] is True
    with tracker.client() as t:
        for _ in range(2):       # re-registers after each relayed session
            with t.request("phone", wait_timeout=5) as s:
                assert (s.host, s.port) == ("127.0.0.1", tracker.port)
                assert _echo(s, "hi") == "hi"
                a = np.arange(1 << 18, dtype=np.float32)
                r = s.array(a)
                np.testing.assert_array_equal(r.numpy(), a)


# ----------------------------------------------------------------------------------------------- auth

def test_token_authentication(tracker_lab):
    tracker = tracker_lab.tracker(token="s3cret")
    tracker_lab.device(tracker, "pi", tracker_token="s3cret")
    intruder = tracker_lab.device(tracker, "pi", tracker_token="wrong", wait=False)
    anonymous = tracker_lab.device(tracker, "pi", tracker_token="", wait=False)
    with pytest.raises(AuthenticationError):
        tracker.client(token="")
    with pytest.raises(AuthenticationError):
        tracker.client(token="wrong")
    wait_until(lambda: "refused" in intruder.log() and "token" in anonymous.log(), 10, "both refusals to be logged")
    assert tracker.count("pi") == 1           # only the device with the right token
    assert intruder.proc.poll() is None and anonymous.proc.poll() is None, "a refused device keeps retrying"
    with tracker.client() as t, t.request("pi", wait_timeout=5) as s:
        assert _echo(s, 1) == 1


def test_device_that_never_acknowledges_does_not_lose_the_request(tracker_lab):
    tracker = tracker_lab.tracker()
    # a device that registers, then ignores its EXPECT (hung right after registering)
    mute = socket.create_connection(("127.0.0.1", tracker.port), timeout=5)
    reader = transport.FrameReader(mute, p.DEFAULT_LIMITS)
    transport.send_frame(mute, TrackerMsg.HELLO, 0, hello_payload("device", "mute"))
    assert reader.read_frame()[0] == TrackerMsg.WELCOME
    transport.send_frame(mute, TrackerMsg.REGISTER, 0,
                         {"key": "pi", "port": 9, "tags": {}, "info": {}, "state": "free"})
    assert reader.read_frame()[0] == TrackerMsg.REGISTERED
    try:
        tracker_lab.device(tracker, "pi")          # registered second: the mute one is first in line
        with tracker.client() as t:
            # granted the second device once the mute one's grant lapses, well within the wait timeout
            with t.request("pi", wait_timeout=HANG_S) as s:
                assert _echo(s, 5) == 5
        seen = [reader.read_frame()[0] for _ in range(2)]
        assert seen == [TrackerMsg.EXPECT, TrackerMsg.REVOKE]
    finally:
        mute.close()


# ----------------------------------------------------------------------------------------------- CLI and plugin

def test_query_cli_prints_devices_and_queues(shared_lab):
    from click.testing import CliRunner

    from tether.cli.query import command

    tracker = shared_lab.trackers[0]
    runner = CliRunner()
    result = runner.invoke(command, ["--tracker", "127.0.0.1:%d" % tracker.port, "--json"])
    assert result.exit_code == 0, result.output
    import json

    summary = json.loads(result.output)
    assert summary["queues"]["rasp4b"]["total"] == 2 and len(summary["devices"]) == 3
    table = runner.invoke(command, ["--tracker", "127.0.0.1:%d" % tracker.port])
    assert table.exit_code == 0 and "rasp4b" in table.output and "pending" in table.output
    refused = runner.invoke(command, ["--tracker", "127.0.0.1:1"])
    assert refused.exit_code != 0 and "could not connect to the tracker" in refused.output


def test_pytest_plugin_runs_tests_on_granted_devices(shared_lab, tmp_path):
    tracker = shared_lab.trackers[0]
    (tmp_path / "test_on_device.py").write_text(
        "import pytest\n"
        "def test_echo(tether_session):\n"
        "    assert tether_session.get_function('tether.echo')(41) == 41\n"
        "@pytest.mark.tether_device('board=pi5')\n"
        "def test_marker(tether_session):\n"
        "    assert tether_session.device_info()['arch']\n"
        "@pytest.mark.tether_device('no-such-device')\n"
        "def test_missing(tether_session):\n"
        "    pass\n")
    cmd = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "tether.testing.pytest_plugin", "-p", "no:cacheprovider",
           "--rootdir", str(tmp_path), "--tether-tracker", "127.0.0.1:%d" % tracker.port, "--tether-key", "rasp*",
           str(tmp_path / "test_on_device.py")]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=str(tmp_path))
    assert "2 passed, 1 skipped" in out.stdout, out.stdout + out.stderr
    assert "no device matching 'no-such-device'" in out.stdout
    skipped = subprocess.run(cmd[:9] + [str(tmp_path / "test_on_device.py")], capture_output=True, text=True,
                             timeout=120, cwd=str(tmp_path))
    assert "3 skipped" in skipped.stdout and "--tether-tracker" in skipped.stdout, skipped.stdout


def test_registrar_never_gives_up_on_a_missing_tracker(tracker_lab):
    from tether_rpc.registrar import Registrar

    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()                    # nothing listens there now
    reg = Registrar(("127.0.0.1", port), "lonely", port=9, max_backoff=0.05, connect_timeout=1.0)
    with reg:
        time.sleep(2.0)              # dozens of refused attempts with this short backoff cap
        assert reg.registrations == 0 and reg._thread.is_alive()
        tracker = tracker_lab.tracker(port=port)
        assert reg.wait_registered(5.0), "the registrar stopped retrying"
        assert tracker.count("lonely") == 1


def _old_device_python():
    """A Python 3.9 with numpy 1.19 and msgpack 1.0 (the oldest device this project supports), if installed."""
    import glob
    import shutil

    pyenv = sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.9*/bin/python")))
    for candidate in [shutil.which("python3.9")] + pyenv:
        if not candidate:
            continue
        probe = subprocess.run([candidate, "-c", "import numpy, msgpack; print(numpy.__version__)"],
                               capture_output=True, text=True, timeout=30)
        if probe.returncode == 0:
            return candidate
    return None


def test_registrar_on_the_oldest_device_python(tracker_lab):
    python = _old_device_python()
    if python is None:  # skipped on a developer's machine, a failure under CI
        unavailable("a Python 3.9 with numpy 1.19 and msgpack 1.0 (the oldest device stack)",
                    "pyenv install 3.9 && ~/.pyenv/versions/3.9*/bin/python -m pip install numpy==1.19.5 "
                    "msgpack==1.0.2")
    tracker = tracker_lab.tracker()
    tracker_lab.device(tracker, "old", python=python)
    tracker_lab.device(tracker, "old-rev", reverse=True, python=python)
    with tracker.client() as t:
        for key in ("old", "old-rev"):
            with t.request(key, wait_timeout=5, session_timeout=30) as s:
                assert s.device_info()["python"].startswith("3.9")
                assert _echo(s, [1, 2]) == [1, 2]
