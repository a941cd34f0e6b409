"""The Java device server (android_app/device, desktop JVM via android_app/run_device.sh) driven by tether's
Python client exactly as the rpc-server tests drive `python -m tether_rpc`: real JVMs, real sockets on loopback,
real gcc-built kernels, results compared with numpy.

Covers the handshake with and without a token, the one-session queue, files confined to the session folder,
load_module with its ELF checks, device arrays and packed calls (handles, tensors, scalars), time_evaluator's
sample EVENTs, remote errors, a segfaulting kernel (SessionCrashed, device back at once), the idle and session
timeouts, and a client killed mid-call.
"""
from __future__ import annotations

import os
import pathlib
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from fixtures.polling import wait_until
from tether import rpc
from tether_rpc import errors, handshake, protocol as p, transport


def session_dirs(server):
    workdir = server.log_path.parent / (server.log_path.stem + "-sessions")
    return [d for d in os.listdir(workdir) if d.startswith("tether-session-")]


def test_handshake_frames_and_the_close_of_a_session(make_java_device, rpc_kernels):
    server = make_java_device("--token", "s3cret")
    sock = socket.create_connection((server.host, server.port), timeout=10)
    try:
        transport.configure_socket(sock)
        reader = transport.FrameReader(sock)
        sock.sendall(p.encode_frame(p.MsgType.HELLO, 0, handshake.hello_payload()))
        t, rid, challenge = reader.read_frame()
        assert (t, rid, challenge["algo"]) == (p.MsgType.CHALLENGE, 0, "hmac-sha256")
        nc = handshake.make_nonce()
        sock.sendall(p.encode_frame(p.MsgType.AUTH, 0, {"nonce": nc,
                                                        "mac": handshake.client_mac("s3cret", challenge["nonce"], nc)}))
        t, _, welcome = reader.read_frame()
        assert t == p.MsgType.WELCOME and welcome["version"] == p.PROTOCOL_VERSION
        assert welcome["caps"] == list(p.CAPABILITIES)
        assert handshake.macs_equal(welcome["proof"], handshake.server_proof("s3cret", challenge["nonce"], nc))

        arr = np.arange(12, dtype=np.int16).reshape(3, 4)
        sock.sendall(p.encode_frame(p.MsgType.CALL, 5, {"fn": "tether.echo", "args": [arr]}))
        t, rid, ret = reader.read_frame()
        assert (t, rid) == (p.MsgType.RETURN, 5)
        np.testing.assert_array_equal(ret["value"], arr)
        sock.sendall(p.encode_frame(p.MsgType.CALL, 6, {"fn": "tether.no_such_thing", "args": []}))
        t, rid, err = reader.read_frame()
        assert (t, rid, err["type"]) == (p.MsgType.ERROR, 6, "KeyError") and "tether.echo" in err["message"]

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
        assert list(frames[0][2]) == ["kind", "index", "seconds"]

        sock.sendall(p.encode_frame(p.MsgType.CLOSE, 0, {}))
        sock.settimeout(10)
        assert sock.recv(1) == b""  # the session ends and the connection closes
    finally:
        sock.close()
    wait_until(lambda: not session_dirs(server), 5, "the session folder to be deleted")


def test_version_mismatch_and_a_bad_magic(java_device):
    for hello, kind, words in ((handshake.hello_payload(version=7), "VersionMismatch", ("version 7", "version 1")),
                               (dict(handshake.hello_payload(), magic="http"), "ProtocolError", ("magic",))):
        sock = socket.create_connection((java_device.host, java_device.port), timeout=10)
        try:
            sock.sendall(p.encode_frame(p.MsgType.HELLO, 0, hello))
            t, rid, err = transport.FrameReader(sock).read_frame()
            assert (t, rid, err["type"]) == (p.MsgType.ERROR, 0, kind)
            assert all(w in err["message"] for w in words), err
            assert sock.recv(1) == b""
        finally:
            sock.close()


def test_token_authentication_accepted_and_refused(make_java_device):
    server = make_java_device("--token", "right")
    with rpc.connect(server.host, server.port, timeout=10, token="right") as remote:
        assert remote.get_function("tether.echo")("in") == "in"
    with pytest.raises(errors.AuthenticationError, match="wrong token"):
        rpc.connect(server.host, server.port, timeout=10, token="wrong")
    with pytest.raises(errors.AuthenticationError, match="requires a token"):
        rpc.connect(server.host, server.port, timeout=10, token=None)
    with rpc.connect(server.host, server.port, timeout=10, token="right") as remote:
        assert remote.get_function("tether.echo")("again") == "again"


def test_vadd_against_numpy_with_handles_tensors_and_timing(java_device, rpc_kernels):
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal(1024).astype("float32"), rng.standard_normal(1024).astype("float32")
    samples = []
    with rpc.connect(java_device.host, java_device.port, timeout=20,
                     on_sample=lambda i, s: samples.append((i, s))) as remote:
        assert remote.upload(rpc_kernels["vadd"]) == "vadd.so"
        mod = remote.load_module("vadd.so")
        assert "vadd" in mod.function_names and mod.metadata["abi_version"] == 1
        f = mod["vadd"]
        A, B, C = remote.array(a), remote.array(b), remote.empty((1024,), "float32")
        f(A, B, C)
        np.testing.assert_array_equal(C.numpy(), a + b)
        c = np.zeros(1024, "float32")
        f(a, b, c)  # numpy arrays: copied in, and back out (RETURN "tensors")
        np.testing.assert_array_equal(c, a + b)
        C.copyfrom(np.ones(1024, "float32"))
        np.testing.assert_array_equal(C.numpy(), np.ones(1024, "float32"))
        t0 = time.perf_counter()
        res = f.time_evaluator(number=20, repeat=4)(A, B, C)
        wall = time.perf_counter() - t0
        assert len(res.samples) == 4 and res.number == 20 and all(s > 0 for s in res.samples)
        assert sum(res.samples) * res.number < wall  # a sample is the time of one call, not of all `number`
        assert [s for _, s in samples] == list(res.samples) and [i for i, _ in samples] == [0, 1, 2, 3]
        grown = f.time_evaluator(number=1, repeat=1, min_repeat_ms=5)(A, B, C)
        assert grown.number > 1 and grown.number * grown.samples[0] >= 0.004
        for bad, kind in (({"number": 0}, errors.RemoteError), ({"bogus": 1}, TypeError)):
            with pytest.raises(kind):
                remote._call("tether.time_evaluator", [f.fn, [A.handle, B.handle, C.handle], bad])
        B.free()
        with pytest.raises(KeyError, match="does not exist"):
            remote._call(f.fn, [A.handle, B.handle, C.handle])


def test_scalar_arguments_reach_the_kernel(java_device, rpc_kernels):
    with rpc.connect(java_device.host, java_device.port, timeout=20) as remote:
        remote.upload(rpc_kernels["misc"])
        mod = remote.load_module("misc.so")
        spin = mod["spin"]
        spin(1000)  # an int64 argument, checked by the kernel's type code test
        with pytest.raises(errors.KernelError, match="must be an array|argument 0"):
            spin(1.5)   # float64: the kernel refuses the type code (ERR 2)
        assert remote.get_function("tether.echo")(2.5, b"\x00\x01", None, True) == [2.5, b"\x00\x01", None, True]


def test_remote_errors_keep_the_session_usable(java_device, rpc_kernels):
    from tether_rpc.elf import host_arch

    with rpc.connect(java_device.host, java_device.port, timeout=20) as remote:
        remote.upload(rpc_kernels["vadd"])
        f = remote.load_module("vadd.so")["vadd"]
        with pytest.raises(errors.KernelError, match=r"'B'.*\(1000,\).*\(1024,\)") as info:
            f(remote.empty(1024), remote.empty((1000,), "float32"), remote.empty(1024))
        assert info.value.remote_type == "KernelError" and "Traceback" in info.value.remote_traceback
        with pytest.raises(errors.KernelError, match="expected 3 arguments"):
            remote._call(f.fn, [remote.empty(1024).handle])
        with pytest.raises(FileNotFoundError):
            remote.download("missing.bin")
        with pytest.raises(KeyError):
            remote.get_function("tether.nope")()
        remote.upload(rpc_kernels["wrong_arch"])
        with pytest.raises(errors.ArchMismatch) as arch:
            remote.load_module("vadd_wrong_arch.so")
        assert "aarch64" in str(arch.value) and host_arch() in str(arch.value)
        remote.upload(b"not an ELF at all", name="junk.so")
        with pytest.raises(errors.ModuleLoadError, match="not an ELF"):
            remote.load_module("junk.so")
        with pytest.raises(errors.KernelError, match="uint16"):
            remote.array(np.zeros(4, np.uint16))
        assert remote.get_function("tether.echo")("still here") == "still here"
        assert not remote.closed


def test_files_are_confined_to_the_session_folder(java_device, tmp_path):
    payload = os.urandom(3 << 20)
    with rpc.connect(java_device.host, java_device.port, timeout=20) as remote:
        remote.upload(payload, name="blob.bin")
        src = tmp_path / "data.txt"
        src.write_bytes(b"x" * 1000)
        assert remote.upload(src) == "data.txt"
        assert remote.listdir() == ["blob.bin", "data.txt"]
        assert remote.download("blob.bin") == payload
        out = remote.download("data.txt", tmp_path / "back.txt")
        assert pathlib.Path(out).read_bytes() == b"x" * 1000
        remote.upload(b"", name="empty")
        assert remote.download("empty") == b""
        for bad in ("../../x", "/etc/passwd", "a\x00b", "", ".", "..", "dir/file", "..\\x", "tab\tname"):
            with pytest.raises(errors.UnsafePathError):
                remote.upload(b"evil", name=bad)
            with pytest.raises(errors.UnsafePathError):
                remote.download(bad)
        remote.remove("blob.bin")
        assert remote.listdir() == ["data.txt", "empty"]
        assert remote.get_function("tether.echo")(1) == 1  # the stream stayed in step after refused uploads
    assert not (tmp_path.parent / "x").exists()


def test_segfaulting_kernel_ends_only_its_session(java_device, rpc_kernels):
    with rpc.connect(java_device.host, java_device.port, timeout=20) as remote:
        remote.upload(rpc_kernels["misc"])
        crash = remote.load_module("misc.so")["crash"]
        with pytest.raises(errors.SessionCrashed, match="SIGSEGV"):
            crash()
        t0 = time.monotonic()
        assert remote.closed
    assert java_device.alive
    wait_until(lambda: session_dirs(java_device) == [], 2, "the crashed session's folder to be deleted")
    with rpc.connect(java_device.host, java_device.port, timeout=10) as remote:
        assert remote.get_function("tether.echo")("next") == "next"
        assert remote.listdir() == []  # a fresh folder
    assert time.monotonic() - t0 < 2.0   # the device serves again within 2 s of the crash


def test_one_session_at_a_time_with_a_queue(java_device):
    first = rpc.connect(java_device.host, java_device.port, timeout=20)
    try:
        with pytest.raises(errors.DeviceBusy):
            rpc.connect(java_device.host, java_device.port, timeout=10, wait=False)
        positions, result = [], {}

        def second():
            with rpc.connect(java_device.host, java_device.port, timeout=20, on_queued=positions.append) as remote:
                result["echo"] = remote.get_function("tether.echo")("second")

        th = threading.Thread(target=second)
        th.start()
        wait_until(lambda: positions == [1], 10, "the queue position event")
        assert first.get_function("tether.echo")("first") == "first"
        assert "echo" not in result
        first.close()
        th.join(20)
        assert result == {"echo": "second"}
    finally:
        first.close()


CLIENT_SCRIPT = """
import sys
from tether import rpc
remote = rpc.connect("127.0.0.1", int(sys.argv[1]), timeout=60)
remote.upload(sys.argv[2])
spin = remote.load_module("misc.so")["spin"]
print("calling", flush=True)
spin(1 << 40)
"""


def test_client_killed_mid_call_frees_the_device(java_device, rpc_kernels):
    client = subprocess.Popen([sys.executable, "-c", CLIENT_SCRIPT, str(java_device.port), str(rpc_kernels["misc"])],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert client.stdout.readline().strip() == "calling"
        time.sleep(0.3)  # the kernel is running now
        client.kill()
        client.wait(10)
        t0 = time.monotonic()
        with rpc.connect(java_device.host, java_device.port, timeout=10, wait=True) as remote:
            assert remote.get_function("tether.echo")(3) == 3
        assert time.monotonic() - t0 < 2.0
    finally:
        if client.poll() is None:
            client.kill()
            client.wait(10)


def test_idle_and_session_timeouts_free_the_device(make_java_device, rpc_kernels):
    server = make_java_device("--idle-timeout", "1", "--session-timeout", "3")
    idle = rpc.connect(server.host, server.port, timeout=20)
    try:
        t0 = time.monotonic()
        with rpc.connect(server.host, server.port, timeout=20, wait=True) as waiting:  # queued behind the idle one
            assert 0.8 < time.monotonic() - t0 < 5.0
            assert waiting.get_function("tether.echo")("next") == "next"
            waiting.upload(rpc_kernels["misc"])
            spin = waiting.load_module("misc.so")["spin"]
            with pytest.raises(errors.TetherTimeout, match="session timeout"):
                spin(1 << 40)   # runs past the 3 s session limit: the worker is killed
        with pytest.raises(errors.TetherTimeout, match="idle"):
            idle.get_function("tether.echo")(1)
    finally:
        idle.close()
    with rpc.connect(server.host, server.port, timeout=20) as remote:
        assert remote.get_function("tether.echo")(4) == 4
    assert server.alive


# -- device_info and the graph executor ---------------------------------------------------------------------------
def test_device_info_matches_the_python_server(java_device):
    from tether_rpc import device_info as py_info

    with rpc.connect(java_device.host, java_device.port, timeout=20) as remote:
        info = remote.get_function("tether.device_info")()
    ref = py_info.device_info()
    for key in ("arch", "cpu_model", "cpu_cores", "cpu_features", "num_cores", "suggested_target", "memory_bytes"):
        assert info[key] == ref[key], key
    assert info["cpu_capabilities"] == ref["cpu_capabilities"]
    assert info["os"]["android"] is False and info["os"]["android_version"] is None
    assert info["pointer_bits"] == 64 and info["java"] and info["session_limits"]["handles"] is None
    assert set(ref) - set(info) == set(), "keys of the Python server's device_info missing here"


def test_graph_executor_runs_an_onnx_model_like_onnxruntime(java_device, tmp_path):
    import onnx
    import onnxruntime as ort

    import tether
    from tether.frontend import from_onnx

    model = onnx.load(str(pathlib.Path(__file__).parent / "data" / "digits_cnn.onnx"))
    graph, params = from_onnx(model, shape={"input": (4, 1, 8, 8)})
    folder = str(tmp_path / "digits")
    tether.build_graph(graph, params, target="host").export(folder)
    x = np.random.default_rng(0).uniform(0, 1, (4, 1, 8, 8)).astype(np.float32)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]
    samples, nodes = [], []
    with rpc.connect(java_device.host, java_device.port, timeout=60) as remote:
        assert "tether.graph.create" in remote.functions()
        with remote.graph_executor(folder) as gm:
            assert gm.input_names == ["input"] and gm.output_names == ["probs"]
            gm.set_input("input", x)
            gm.run()
            np.testing.assert_allclose(gm.get_output(0), ref, rtol=1e-4, atol=1e-6)
            gm.set_input(0, x.astype(np.float64))    # same_kind cast, as the Python server allows
            gm.run()
            np.testing.assert_allclose(gm.get_output("probs"), ref, rtol=1e-4, atol=1e-6)
            gm.set_input(0, np.zeros_like(x))
            gm.run()
            assert not np.allclose(gm.get_output(0), ref)
            res = gm.benchmark(number=2, repeat=3, on_sample=samples.append)
            assert len(res["samples"]) == 3 and [s["index"] for s in samples] == [0, 1, 2]
            assert res["min_ms"] <= res["median_ms"]
            prof = gm.profile(number=1, on_node=nodes.append)
            assert len(prof["nodes"]) == len(nodes) >= 3 and all(r["seconds"] > 0 for r in prof["nodes"])
            with pytest.raises(KeyError, match="no input"):
                gm.set_input("nope", x)
            with pytest.raises(ValueError, match="expects"):
                gm.set_input("input", x[:2])


# -- a tracker: direct and reverse registration ------------------------------------------------------------------
def test_registers_with_a_tracker_direct_and_reverse(make_java_device, tracker_lab):
    tracker = tracker_lab.tracker(token="trk")
    make_java_device("--tracker", "127.0.0.1:%d" % tracker.port, "--key", "jdirect", "--tracker-token", "trk")
    rev = make_java_device("--tracker", "127.0.0.1:%d" % tracker.port, "--key", "jreverse", "--tracker-token", "trk",
                           "--reverse")
    wait_until(lambda: tracker.count("jdirect") == 1 and tracker.count("jreverse") == 1, 60,
               "both Java devices to register")
    assert "registered with tracker" in rev.log_path.read_text()
    devices = {d["key"]: d for d in tracker.summary()["devices"]}
    assert devices["jreverse"]["reverse"] is True and devices["jdirect"]["reverse"] is False
    assert devices["jdirect"]["info"]["os"] == "linux" and devices["jdirect"]["info"]["arch"] == "x86_64"
    a = np.arange(1 << 16, dtype=np.float32)
    with tracker.client() as t:
        for key in ("jdirect", "jreverse", "jreverse"):   # a device re-registers as free after each session
            with t.request(key, wait_timeout=30) as s:
                if key == "jreverse":
                    assert (s.host, s.port) == ("127.0.0.1", tracker.port)   # through the tracker's relay
                assert s.get_function("tether.echo")(key) == key
                np.testing.assert_array_equal(s.array(a).numpy(), a)
        wait_until(lambda: tracker.count("jreverse", "free") == 1, 10, "the reverse device to be free again")


def test_sessions_in_the_server_process(make_java_device, rpc_kernels):
    # --isolation thread: what the Android app runs (a phone cannot start a child JVM); same protocol
    server = make_java_device("--isolation", "thread", "--idle-timeout", "2", "--handshake-timeout", "1")
    assert "sessions in this process" in server.log_text()
    a = np.arange(1024, dtype=np.float32)
    for _ in range(2):   # the second session starts clean
        with rpc.connect(server.host, server.port, timeout=20) as remote:
            assert remote.listdir() == []
            remote.upload(rpc_kernels["vadd"])
            time.sleep(1.3)   # quiet for longer than the handshake timeout, less than the idle timeout
            f = remote.load_module("vadd.so")["vadd"]
            c = np.zeros(1024, np.float32)
            f(a, a, c)
            np.testing.assert_array_equal(c, a + a)
    idle = rpc.connect(server.host, server.port, timeout=20)
    try:
        time.sleep(2.5)
        with pytest.raises(errors.TetherTimeout, match="idle"):
            idle.get_function("tether.echo")(1)
    finally:
        idle.close()
    with rpc.connect(server.host, server.port, timeout=20) as remote:
        assert remote.get_function("tether.echo")("after idle") == "after idle"


def _children(server):
    """PIDs of the server JVM's children (the session worker JVMs), whichever of its threads started them."""
    pids = []
    for task in pathlib.Path("/proc/%d/task" % server.proc.pid).glob("*"):
        try:
            pids += [int(x) for x in (task / "children").read_text().split()]
        except OSError:
            pass
    return pids


def _threads(pids):
    total = 0
    for pid in pids:
        try:
            with open("/proc/%d/status" % pid) as fh:
                total += int(next(line for line in fh if line.startswith("Threads:")).split()[1])
        except (OSError, StopIteration):
            pass
    return total


def test_tether_built_parallel_kernels_use_the_modules_native_pool(make_java_device, tmp_path):
    import tether
    from fixtures.te_kernels import matmul, vadd_schedule
    from tether import te

    server = make_java_device("--handshake-timeout", "1", env_extra={"TETHER_NUM_THREADS": "3"})
    s, args = vadd_schedule(1 << 14, factor=8, parallel=True)
    tether.build(s, args, target="host", name="pvadd").export_library(str(tmp_path / "pvadd.so"))
    a, b, c = matmul(64, 48, 32)
    sched = te.create_schedule(c.op)
    sched[c].parallel(c.op.axis[0])
    tether.build(sched, [a, b, c], target="host", name="pmm").export_library(str(tmp_path / "pmm.so"))
    rng = np.random.default_rng(5)
    with rpc.connect(server.host, server.port, timeout=30) as remote:
        assert remote.get_function("tether.device_info")()["parallel_threads"] == 3
        wait_until(lambda: _children(server), 10, "the session's worker JVM")
        time.sleep(1.5)   # a session may be quiet longer than the handshake timeout
        before = _threads(_children(server))
        remote.upload(tmp_path / "pvadd.so")
        mod = remote.load_module("pvadd.so")
        assert mod.metadata.get("thread_pool") == 1
        # the first module with a pool provides it: two threads (3 - the caller) now sit in its native worker loop
        wait_until(lambda: _threads(_children(server)) >= before + 2, 5, "the pool's two native threads")
        x, y = rng.standard_normal(1 << 14).astype("float32"), rng.standard_normal(1 << 14).astype("float32")
        z = np.zeros(1 << 14, "float32")
        mod["pvadd"](x, y, z)
        np.testing.assert_array_equal(z, x + y)
        remote.upload(tmp_path / "pmm.so")
        mm = remote.load_module("pmm.so")["pmm"]   # a second module gets the same pool as its launcher
        p, q = rng.standard_normal((64, 32)).astype("float32"), rng.standard_normal((32, 48)).astype("float32")
        r = np.zeros((64, 48), "float32")
        for _ in range(3):
            mm(p, q, r)
            np.testing.assert_allclose(r, p @ q, rtol=1e-5, atol=1e-5)
        assert _threads(_children(server)) == before + 2   # no more threads for the second module
