"""The device server end to end: real server processes, real sockets, real gcc-built kernels.

Covers every message type on the wire, remote exceptions, wrong-architecture modules, a segfaulting kernel,
a client killed mid-call, session timeout, the one-session queue, token authentication and the bind policy.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from fixtures.children import stop_process
from fixtures.polling import HANG_S, wait_until
from fixtures.rpc import ServerProcess, misc_function
from tether import rpc
from tether_rpc import errors, handshake, protocol as p, transport


def raw_connect(server, hello=None):
    """A hand-driven protocol client: returns (sock, reader) after HELLO (and before WELCOME is read)."""
    sock = socket.create_connection((server.host, server.port), timeout=5)
    transport.configure_socket(sock)
    sock.sendall(p.encode_frame(p.MsgType.HELLO, 0, hello or handshake.hello_payload()))
    return sock, transport.FrameReader(sock)


def session_dirs(server):
    workdir = server.log_path.parent / (server.log_path.stem + "-sessions")
    return os.listdir(workdir)


# -- message types over a real connection -----------------------------------------------------------------------
def test_every_core_message_type_round_trips_over_a_server(make_rpc_server, rpc_kernels):
    server = make_rpc_server("--token", "s3cret")
    sock, reader = raw_connect(server)
    try:
        t, rid, challenge = reader.read_frame()
        assert (t, rid, challenge["algo"]) == (p.MsgType.CHALLENGE, 0, "hmac-sha256")
        nc = handshake.make_nonce()
        mac = handshake.client_mac("s3cret", challenge["nonce"], nc)
        sock.sendall(p.encode_frame(p.MsgType.AUTH, 0, {"nonce": nc, "mac": mac}))
        t, _, welcome = reader.read_frame()
        assert t == p.MsgType.WELCOME and welcome["version"] == p.PROTOCOL_VERSION
        assert handshake.macs_equal(welcome["proof"], handshake.server_proof("s3cret", challenge["nonce"], nc))

        arr = np.arange(12, dtype=np.int16).reshape(3, 4)
        sock.sendall(p.encode_frame(p.MsgType.CALL, 5, {"fn": "tether.echo", "args": [arr]}))
        t, rid, ret = reader.read_frame()
        assert (t, rid) == (p.MsgType.RETURN, 5)
        np.testing.assert_array_equal(ret["value"], arr)

        sock.sendall(p.encode_frame(p.MsgType.CALL, 6, {"fn": "tether.no_such_thing", "args": []}))
        t, rid, err = reader.read_frame()
        assert (t, rid, err["type"]) == (p.MsgType.ERROR, 6, "KeyError")
        assert "tether.echo" in err["message"] and "Traceback" in err["traceback"]

        # EVENT: time a real kernel; one sample event per repeat precedes the RETURN.
        transport.send_frame(sock, p.MsgType.CALL, 7, {"fn": "tether.upload", "args": ["misc.so"]},
                     bulk=rpc_kernels["misc"].read_bytes())
        assert reader.read_frame()[0] == p.MsgType.RETURN
        sock.sendall(p.encode_frame(p.MsgType.CALL, 8, {"fn": "tether.module.load", "args": ["misc.so"]}))
        mod = reader.read_frame()[2]["value"]
        sock.sendall(p.encode_frame(p.MsgType.CALL, 9, {"fn": "tether.module.get_function",
                                                        "args": [mod["handle"], "nop"]}))
        fn = reader.read_frame()[2]["value"]["handle"]
        sock.sendall(p.encode_frame(p.MsgType.CALL, 10, {"fn": "tether.time_evaluator",
                                                         "args": [fn, [], {"number": 5, "repeat": 3}]}))
        frames = [reader.read_frame() for _ in range(4)]
        assert [(f[0], f[1]) for f in frames] == [(p.MsgType.EVENT, 10)] * 3 + [(p.MsgType.RETURN, 10)]
        assert [f[2]["index"] for f in frames[:3]] == [0, 1, 2]
        assert [f[2]["seconds"] for f in frames[:3]] == frames[3][2]["value"]["samples"]

        sock.sendall(p.encode_frame(p.MsgType.CLOSE, 0, {}))
        sock.settimeout(5)
        assert sock.recv(1) == b""  # the session ends and the connection closes
    finally:
        sock.close()
    wait_until(lambda: not session_dirs(server), HANG_S, "the session folder to be deleted")


def test_version_mismatch_names_both_versions(rpc_server):
    sock, reader = raw_connect(rpc_server, handshake.hello_payload(version=7))
    try:
        t, _, err = reader.read_frame()
        assert t == p.MsgType.ERROR and err["type"] == "VersionMismatch"
        assert "version 7" in err["message"] and "version %d" % p.PROTOCOL_VERSION in err["message"]
        assert sock.recv(1) == b""
    finally:
        sock.close()


# -- calls ------------------------------------------------------------------------------------------------------
def test_vadd_end_to_end_against_numpy(rpc_server, rpc_kernels):
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal(1024).astype("float32"), rng.standard_normal(1024).astype("float32")
    samples = []
    with rpc.connect(rpc_server.host, rpc_server.port, timeout=10,
                     on_sample=lambda i, s: samples.append((i, s))) as remote:
        assert remote.upload(rpc_kernels["vadd"]) == "vadd.so"
        mod = remote.load_module("vadd.so")
        assert "vadd" in mod.function_names and mod.metadata["abi_version"] == 1
        f = mod["vadd"]
        A, B, C = remote.array(a), remote.array(b), remote.empty((1024,), "float32")
        f(A, B, C)
        np.testing.assert_array_equal(C.numpy(), a + b)
        c = np.zeros(1024, "float32")
        f(a, b, c)  # numpy arrays directly: copied in, and back out
        np.testing.assert_array_equal(c, a + b)
        C.copyfrom(np.ones(1024, "float32"))
        np.testing.assert_array_equal(C.numpy(), np.ones(1024, "float32"))
        res = f.time_evaluator(number=50, repeat=4, min_repeat_ms=0)(A, B, C)
        assert len(res.samples) == 4 and res.number == 50 and all(s > 0 for s in res.samples)
        assert [s for _, s in samples] == list(res.samples) and [i for i, _ in samples] == [0, 1, 2, 3]
        assert res.min <= res.median <= res.max
        assert remote.get_function("tether.echo")(1) == 1


def test_remote_exception_keeps_the_session_usable(rpc_server, rpc_kernels):
    with rpc.connect(rpc_server.host, rpc_server.port, timeout=10) as remote:
        remote.upload(rpc_kernels["vadd"])
        f = remote.load_module("vadd.so")["vadd"]
        short = remote.empty((1000,), "float32")
        with pytest.raises(errors.KernelError, match=r"'B'.*\(1000,\).*\(1024,\)") as info:
            f(remote.empty(1024), short, remote.empty(1024))
        assert isinstance(info.value, errors.RemoteError) and info.value.remote_type == "KernelError"
        assert "Traceback" in info.value.remote_traceback
        with pytest.raises(FileNotFoundError):
            remote.download("missing.bin")
        with pytest.raises(KeyError):
            remote.get_function("tether.nope")()
        assert remote.get_function("tether.echo")("still here") == "still here"
        assert not remote.closed


def test_wrong_architecture_module_is_refused_before_dlopen(rpc_server, rpc_kernels):
    from tether_rpc.elf import host_arch

    with rpc.connect(rpc_server.host, rpc_server.port, timeout=10) as remote:
        remote.upload(rpc_kernels["wrong_arch"])
        with pytest.raises(errors.ArchMismatch) as info:
            remote.load_module("vadd_wrong_arch.so")
        other = "x86_64" if host_arch() != "x86_64" else "aarch64"
        assert other in str(info.value) and host_arch() in str(info.value)
        assert remote.get_function("tether.echo")(2) == 2


def test_segfaulting_kernel_ends_only_its_session(rpc_server, rpc_kernels):
    with rpc.connect(rpc_server.host, rpc_server.port, timeout=10) as remote:
        crash = misc_function(remote, rpc_kernels, "crash")
        with pytest.raises(errors.SessionCrashed, match="SIGSEGV"):
            crash()
        assert remote.closed
        wait_until(lambda: session_dirs(rpc_server) == [], HANG_S, "the crashed session's folder to be deleted")
        with pytest.raises(errors.ConnectionClosed):
            remote.listdir()
    assert rpc_server.alive
    with rpc.connect(rpc_server.host, rpc_server.port, timeout=10) as remote:
        assert remote.get_function("tether.echo")("next") == "next"
        assert remote.listdir() == []  # a fresh folder


CLIENT_SCRIPT = textwrap.dedent("""
    import sys
    from tether import rpc
    remote = rpc.connect("127.0.0.1", int(sys.argv[1]), timeout=60)
    remote.upload(sys.argv[2])
    spin = remote.load_module("misc.so")["spin"]
    print("calling", flush=True)
    spin(1 << 40)   # minutes of work; this process is killed long before
""")


def test_client_killed_mid_call_frees_the_server(rpc_server, rpc_kernels):
    client = subprocess.Popen([sys.executable, "-c", CLIENT_SCRIPT, str(rpc_server.port), str(rpc_kernels["misc"])],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert client.stdout.readline().strip() == "calling"
        wait_until(lambda: rpc_server.worker_pids(), HANG_S, "a worker process")
        time.sleep(0.2)  # the kernel is running now
        client.send_signal(signal.SIGKILL)
        client.wait(5)
        # the kernel would spin for hours: the worker ends because its client died, not because the call did
        wait_until(lambda: not rpc_server.worker_pids(), HANG_S, "the worker to exit after its client died")
        wait_until(lambda: session_dirs(rpc_server) == [], HANG_S, "the session folder to be deleted")
        with rpc.connect(rpc_server.host, rpc_server.port, timeout=5, wait=False) as remote:
            assert remote.get_function("tether.echo")(3) == 3
    finally:
        stop_process(client)


def test_session_timeout_kills_a_long_kernel(make_rpc_server, rpc_kernels):
    server = make_rpc_server("--session-timeout", "1")
    with rpc.connect(server.host, server.port, timeout=10) as remote:
        spin = misc_function(remote, rpc_kernels, "spin")
        with pytest.raises(errors.TetherTimeout, match="session timeout"):   # the server's, not the client's
            spin(1 << 40)
    with rpc.connect(server.host, server.port, timeout=5) as remote:
        assert remote.get_function("tether.echo")(4) == 4


def test_one_session_at_a_time_with_a_queue(rpc_server):
    first = rpc.connect(rpc_server.host, rpc_server.port, timeout=10)
    try:
        with pytest.raises(errors.DeviceBusy):
            rpc.connect(rpc_server.host, rpc_server.port, timeout=5, wait=False)
        positions = []
        import threading

        result = {}

        def second():
            with rpc.connect(rpc_server.host, rpc_server.port, timeout=10, on_queued=positions.append) as remote:
                result["echo"] = remote.get_function("tether.echo")("second")

        th = threading.Thread(target=second)
        th.start()
        wait_until(lambda: positions == [1], HANG_S, "the queue position event")
        assert first.get_function("tether.echo")("first") == "first"  # the queue does not disturb the session
        assert "echo" not in result
        first.close()
        th.join(10)
        assert result == {"echo": "second"}
    finally:
        first.close()


def test_files_are_confined_to_the_session_folder(rpc_server, tmp_path):
    payload = os.urandom(3 << 20)
    progress = []
    with rpc.connect(rpc_server.host, rpc_server.port, timeout=10) as remote:
        remote.upload(payload, name="blob.bin", progress=lambda done, total: progress.append((done, total)))
        assert progress[-1] == (len(payload), len(payload))
        src = tmp_path / "data.txt"
        src.write_bytes(b"x" * 1000)
        assert remote.upload(src) == "data.txt"
        assert remote.listdir() == ["blob.bin", "data.txt"]
        assert remote.download("blob.bin") == payload
        out = remote.download("data.txt", tmp_path / "back.txt")
        assert pathlib_read(out) == b"x" * 1000
        for bad in ("../../x", "/etc/passwd", "a\x00b", "", ".", "..", "dir/file", "..\\x"):
            with pytest.raises(errors.UnsafePathError):
                remote.upload(b"evil", name=bad)
            with pytest.raises(errors.UnsafePathError):
                remote.download(bad)
        remote.remove("blob.bin")
        assert remote.listdir() == ["data.txt"]
        assert not (tmp_path.parent / "x").exists()


def pathlib_read(path):
    with open(path, "rb") as fh:
        return fh.read()


# -- authentication and bind policy -----------------------------------------------------------------------------
def test_token_authentication_accepted_and_refused(make_rpc_server):
    server = make_rpc_server("--token", "right")
    with rpc.connect(server.host, server.port, timeout=5, token="right") as remote:
        assert remote.get_function("tether.echo")("in") == "in"
    with pytest.raises(errors.AuthenticationError, match="wrong token"):
        rpc.connect(server.host, server.port, timeout=5, token="wrong")
    with pytest.raises(errors.AuthenticationError, match="requires a token"):
        rpc.connect(server.host, server.port, timeout=5, token=None)
    with rpc.connect(server.host, server.port, timeout=5, token="right") as remote:
        assert remote.get_function("tether.echo")("again") == "again"


def test_listening_beyond_loopback_needs_a_token_or_insecure(tmp_path):
    env = dict(os.environ)
    env.pop("TETHER_TOKEN", None)
    proc = subprocess.run([sys.executable, "-m", "tether_rpc", "--host", "0.0.0.0", "--port", "0"],
                          capture_output=True, text=True, timeout=20, env=env)
    assert proc.returncode == 2
    assert "without a token" in proc.stderr and "--insecure" in proc.stderr


def test_click_entry_point_shares_the_implementation():
    from click.testing import CliRunner

    from tether.cli.server import main

    result = CliRunner().invoke(main, ["--help"])
    assert result.exit_code == 0
    for flag in ("--host", "--port", "--port-end", "--tracker", "--key", "--token", "--insecure",
                 "--session-timeout", "--workdir"):
        assert flag in result.output
    result = CliRunner().invoke(main, ["--host", "0.0.0.0", "--port", "0"], env={"TETHER_TOKEN": ""})
    assert result.exit_code == 2


# -- the hook for pluggable components (tracker registration) ---------------------------------------------------
HOOK_SERVER = textwrap.dedent("""
    import json, logging, socket, sys
    from tether_rpc import config, hooks, server as S

    logging.basicConfig(level=logging.INFO)

    report = open(sys.argv[1], "a", buffering=1)

    class Hook(hooks.ServerHook):
        def attach(self, server):
            # reverse mode in miniature: dial out, and let the server serve the dialled connection
            sock = socket.create_connection(("127.0.0.1", int(sys.argv[2])), timeout=5)
            server.adopt(sock, "dialled")
            report.write(json.dumps(["attach"]) + "\\n")

        def check_match(self, match, hello):
            report.write(json.dumps(["match", match]) + "\\n")
            return match != "bad"

        def session_started(self, info):
            report.write(json.dumps(["started", info["session"], info["match"]]) + "\\n")

        def session_ended(self, info):
            report.write(json.dumps(["ended", info["session"], info["error"]]) + "\\n")

    S.serve(config.ServerConfig(port=0, hooks=[Hook()]))
""")


def test_server_hook_sees_matches_sessions_and_can_hand_over_connections(tmp_path):
    import json

    relay = socket.socket()
    relay.bind(("127.0.0.1", 0))
    relay.listen(1)
    relay.settimeout(20)
    report = tmp_path / "hook.jsonl"
    proc = None
    try:
        # the hook dials us as the server starts (the connection waits in relay's backlog until accepted)
        proc = ServerProcess([str(report), str(relay.getsockname()[1])], tmp_path / "hook-server.log",
                             command=[sys.executable, "-c", HOOK_SERVER])
        dialled, _ = relay.accept()  # the device dialled us: we are its client now
        dialled.settimeout(5)
        reader = transport.FrameReader(dialled)
        dialled.sendall(p.encode_frame(p.MsgType.HELLO, 0, handshake.hello_payload(match="good")))
        assert reader.read_frame()[0] == p.MsgType.WELCOME
        dialled.sendall(p.encode_frame(p.MsgType.CALL, 1, {"fn": "tether.echo", "args": ["via adopt"]}))
        assert reader.read_frame() == (p.MsgType.RETURN, 1, {"value": "via adopt"})
        dialled.sendall(p.encode_frame(p.MsgType.CLOSE, 0, {}))
        assert dialled.recv(1) == b""
        dialled.close()
        with pytest.raises(errors.AuthenticationError, match="match token"):
            rpc.connect(proc.host, proc.port, timeout=5, match="bad")
        wait_until(lambda: report.read_text().count("ended") == 1, HANG_S, "the hook to report the session ended")
        lines = [json.loads(line) for line in report.read_text().splitlines()]
        assert lines[0] == ["attach"]
        assert ["match", "good"] in lines and ["match", "bad"] in lines
        assert ["started", 1, "good"] in lines and ["ended", 1, None] in lines
        assert not any(line[0] == "started" and line[2] == "bad" for line in lines)
    finally:
        relay.close()
        if proc is not None:
            proc.stop()


# -- session end without pidfd, idle sessions -------------------------------------------------------------------
NO_PIDFD_SERVER = textwrap.dedent("""
    import sys
    from tether_rpc import server as S

    S._USE_PIDFD = False   # as on Linux < 5.3: no pidfd to wake the loop when a worker exits
    S._LOOP_TICK = 600.0   # and a tick so long that only the SIGCHLD wake-up can hand off within the test
    sys.exit(S.run(port=0, workdir=sys.argv[1]))
""")


def test_handoff_is_prompt_without_pidfd(tmp_path):
    server = ServerProcess([str(tmp_path)], tmp_path / "server.log", command=[sys.executable, "-c", NO_PIDFD_SERVER])
    try:
        host, port = server.host, server.port
        for _ in range(3):
            first = rpc.connect(host, port, timeout=10)
            # a read of the queued connection times out long before the server's 10-minute tick
            queued = socket.create_connection((host, port), timeout=HANG_S)
            try:
                queued.sendall(p.encode_frame(p.MsgType.HELLO, 0, handshake.hello_payload()))
                reader = transport.FrameReader(queued)
                assert reader.read_frame()[2].get("kind") == "queued"
                first.close()  # the worker exits; the parent must notice without waiting for its tick
                assert reader.read_frame()[0] == p.MsgType.WELCOME
                queued.sendall(p.encode_frame(p.MsgType.CLOSE, 0, {}))
                assert queued.recv(1) == b""
            finally:
                first.close()
                queued.close()
            # the next round starts on a free device
            wait_until(lambda: not server.worker_pids(), HANG_S, "the server's session workers to exit")
        assert server.alive
    finally:
        server.stop()


def test_idle_session_is_ended_and_frees_the_device(make_rpc_server, rpc_kernels):
    server = make_rpc_server("--idle-timeout", "0.5")
    with rpc.connect(server.host, server.port, timeout=10) as busy:
        # a call that runs longer than the idle timeout is not idleness
        spin = misc_function(busy, rpc_kernels, "spin")
        t0 = time.monotonic()
        n = 1 << 20
        while time.monotonic() - t0 < 0.05 and n < 1 << 34:  # calibrate to about 0.8 s (bounded)
            t0 = time.monotonic()
            spin(n)
            n *= 4
        per = (time.monotonic() - t0) / (n // 4)
        spin(int(0.8 / per))
        # calls in a row, each gap far below the timeout, for longer than the timeout
        t0 = time.monotonic()
        for _ in range(30):
            assert busy.get_function("tether.echo")(1) == 1
            time.sleep(0.05)
        assert time.monotonic() - t0 > 1.0
    idle = rpc.connect(server.host, server.port, timeout=10)
    try:
        t0 = time.monotonic()
        waiting = rpc.connect(server.host, server.port, timeout=HANG_S, wait=True)  # queued behind the idle one
        try:
            assert 0.3 < time.monotonic() - t0  # admitted once the idle session was ended, not before
            assert waiting.get_function("tether.echo")("next") == "next"
        finally:
            waiting.close()
        with pytest.raises(errors.TetherTimeout, match="idle"):
            idle.get_function("tether.echo")(1)
    finally:
        idle.close()
    assert server.alive


def test_repeated_kernel_calls_on_device_arrays(rpc_server, rpc_kernels):
    # the worker reuses the ctypes arguments of a (function, arrays) call: results must follow the data, a
    # freed array must be refused, and a wrong call must still name its problem
    rng = np.random.default_rng(7)
    with rpc.connect(rpc_server.host, rpc_server.port, timeout=10) as remote:
        remote.upload(rpc_kernels["vadd"])
        f = remote.load_module("vadd.so")["vadd"]
        A, B, C = remote.empty(1024), remote.empty(1024), remote.empty(1024)
        for _ in range(3):
            a, b = rng.standard_normal(1024).astype("float32"), rng.standard_normal(1024).astype("float32")
            A.copyfrom(a)
            B.copyfrom(b)
            f(A, B, C)
            f(A, B, C)
            np.testing.assert_array_equal(C.numpy(), a + b)
        f(B, B, C)  # another combination of the same arrays
        np.testing.assert_array_equal(C.numpy(), b + b)
        handle = B.handle
        B.free()
        with pytest.raises(KeyError, match="does not exist"):
            remote._call(f.fn, [A.handle, handle, C.handle])
        with pytest.raises(errors.KernelError, match="expected 3 arguments"):
            remote._call(f.fn, [A.handle, C.handle])
        f(A, A, C)
        np.testing.assert_array_equal(C.numpy(), a + a)
        assert remote.get_function("tether.echo")(1) == 1
