"""The Java device server (android_app/device, desktop JVM via android_app/run_device.sh) driven by tether's
Python client exactly as the rpc-server tests drive `python -m tether_rpc`: real JVMs, real sockets on loopback,
real gcc- and tether-built kernels, results compared with numpy and onnxruntime.

First, rpc-server's own end-to-end tests (tests/test_rpc_server.py) run unchanged against the Java server: every
message type, token authentication, the queue, files confined to the session folder, kernels, time_evaluator's
sample EVENTs, remote errors, wrong-architecture modules, a segfaulting kernel (SessionCrashed, device back),
the session and idle timeouts. Then what those do not cover: time_evaluator's calibration, a client killed
mid-call, device_info against tether_rpc.device_info, an ONNX model through the graph executor, tracker
registration direct and reverse, sessions in the server process (Android's way), and the native thread pool.
"""
from __future__ import annotations

import pathlib
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import test_rpc_server as rpc_cases
from fixtures.children import stop_process
from fixtures.polling import HANG_S, wait_until
from tether import rpc
from tether_rpc import errors


# -- rpc-server's own tests, run unchanged against the Java server ------------------------------------------------
# Imported, they are collected here with this module's rpc_server/make_rpc_server: the Java server. Left out:
# its Python-only tests (the click entry point, server hooks, pidfd) and the ones that wait for no worker process
# to be left (here a spare worker JVM is always up: test_client_killed_mid_call_frees_the_device below). Also
# rpc-server's CLOSE-mid-kernel tests (tests/test_rpc_close.py) and per-session limit tests (tests/test_limits.py).
from test_limits import (  # noqa: E402,F401
    test_array_memory, test_call_timeout_aborts_a_stuck_kernel, test_defaults_are_finite_and_shown_in_device_info,
    test_open_handles, test_upload_bytes)
from test_rpc_close import (  # noqa: E402,F401
    test_close_behind_pipelined_calls_aborts_them_all, test_close_mid_kernel_frees_the_device)
from test_rpc_server import (  # noqa: E402,F401
    test_every_core_message_type_round_trips_over_a_server, test_files_are_confined_to_the_session_folder,
    test_idle_session_is_ended_and_frees_the_device, test_one_session_at_a_time_with_a_queue,
    test_remote_exception_keeps_the_session_usable, test_repeated_kernel_calls_on_device_arrays,
    test_segfaulting_kernel_ends_only_its_session, test_session_timeout_kills_a_long_kernel,
    test_token_authentication_accepted_and_refused, test_vadd_end_to_end_against_numpy,
    test_version_mismatch_names_both_versions, test_wrong_architecture_module_is_refused_before_dlopen)


@pytest.fixture(scope="module")
def rpc_server(java_device):
    return java_device


@pytest.fixture
def make_rpc_server(make_java_device):
    return make_java_device


# -- beyond rpc-server's tests ------------------------------------------------------------------------------------
def test_time_evaluator_calibration_and_options(java_device, rpc_kernels):
    a = np.arange(1024, dtype="float32")
    with rpc.connect(java_device.host, java_device.port, timeout=20) as remote:
        remote.upload(rpc_kernels["vadd"])
        f = remote.load_module("vadd.so")["vadd"]
        A, B, C = remote.array(a), remote.array(a), remote.empty((1024,), "float32")
        t0 = time.perf_counter()
        res = f.time_evaluator(number=20, repeat=4)(A, B, C)
        wall = time.perf_counter() - t0
        assert sum(res.samples) * res.number < wall  # a sample is the time of one call, not of all `number`
        grown = f.time_evaluator(number=1, repeat=1, min_repeat_ms=5)(A, B, C)
        # number is sized on a calibration sample that lasted >= 5 ms; the reported sample may run faster than that
        # one (the JIT compiles the call path meanwhile, a loaded box gives the core back), so it is bounded loosely
        assert grown.number > 1 and grown.number * grown.samples[0] >= 0.001
        for bad, kind in (({"number": 0}, ValueError), ({"bogus": 1}, TypeError)):
            with pytest.raises(kind):
                remote._call("tether.time_evaluator", [f.fn, [A.handle, B.handle, C.handle], bad])
        np.testing.assert_array_equal(C.numpy(), a + a)


def test_more_refusals(java_device):
    with rpc.connect(java_device.host, java_device.port, timeout=20) as remote:
        remote.upload(b"not an ELF at all", name="junk.so")
        with pytest.raises(errors.ModuleLoadError, match="not an ELF"):
            remote.load_module("junk.so")
        with pytest.raises(errors.KernelError, match="uint16"):
            remote.array(np.zeros(4, np.uint16))
        remote.upload(b"", name="empty")
        assert remote.download("empty") == b""
        with pytest.raises(errors.UnsafePathError):
            remote.upload(b"x", name="tab\tname")
        assert remote.get_function("tether.echo")(2.5, b"\x00\x01", None, True) == [2.5, b"\x00\x01", None, True]


def test_scalar_arguments_reach_the_kernel(java_device, rpc_kernels):
    with rpc.connect(java_device.host, java_device.port, timeout=20) as remote:
        remote.upload(rpc_kernels["misc"])
        mod = remote.load_module("misc.so")
        spin = mod["spin"]
        spin(1000)  # an int64 argument, checked by the kernel's type code test
        with pytest.raises(errors.KernelError, match="must be an array|argument 0"):
            spin(1.5)   # float64: the kernel refuses the type code (ERR 2)
        assert remote.get_function("tether.echo")(2.5, b"\x00\x01", None, True) == [2.5, b"\x00\x01", None, True]


def test_client_killed_mid_call_frees_the_device(java_device, rpc_kernels):
    # (rpc-server's version waits until no worker process is left: here a spare worker JVM is always up)
    client = subprocess.Popen([sys.executable, "-c", rpc_cases.CLIENT_SCRIPT, str(java_device.port),
                               str(rpc_kernels["misc"])], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert client.stdout.readline().strip() == "calling"
        time.sleep(0.3)  # the kernel is running now
        client.kill()
        client.wait(10)
        # the kernel would spin for hours: a session within HANG_S means the device did not wait for it
        with rpc.connect(java_device.host, java_device.port, timeout=HANG_S, wait=True) as remote:
            assert remote.get_function("tether.echo")(3) == 3
    finally:
        stop_process(client)


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
    assert info["pointer_bits"] == 64 and info["java"] and info["session_limits"]["handles"] == 65536
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
def test_registers_with_a_tracker_direct_and_reverse(make_java_device, tracker_lab, rpc_kernels):
    tracker = tracker_lab.tracker(token="trk")
    direct = make_java_device("--tracker", "127.0.0.1:%d" % tracker.port, "--key", "jdirect", "--tracker-token", "trk")
    rev = make_java_device("--tracker", "127.0.0.1:%d" % tracker.port, "--key", "jreverse", "--tracker-token", "trk",
                           "--reverse")
    wait_until(lambda: tracker.count("jdirect") == 1 and tracker.count("jreverse") == 1, 60,
               "both Java devices to register")
    wait_until(lambda: "registered with tracker" in rev.log_path.read_text(), 10, "the reverse device to log it")
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
        with t.request("jdirect", wait_timeout=30, session_timeout=2) as s:   # the grant's limit is kept
            s.upload(rpc_kernels["misc"])
            spin = s.load_module("misc.so")["spin"]
            with pytest.raises(errors.TetherTimeout, match="session timeout of 2.0 s"):   # the device's timer
                spin(1 << 40)
    with pytest.raises(errors.AuthenticationError, match="match token"):   # a registered device serves grants only
        port = int(re.search(r"listening on \S+:(\d+)", direct.log_text()).group(1))
        rpc.connect("127.0.0.1", port, timeout=10)


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


def _running(pid):
    try:
        with open("/proc/%d/status" % pid) as fh:
            return "zombie" not in fh.read()
    except OSError:
        return False


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
        wait_until(lambda: server.worker_pids(), 10, "the session's worker JVM")
        time.sleep(1.5)   # a session may be quiet longer than the handshake timeout
        before = _threads(server.worker_pids())
        remote.upload(tmp_path / "pvadd.so")
        mod = remote.load_module("pvadd.so")
        assert mod.metadata.get("thread_pool") == 1
        # the first module with a pool provides it: two threads (3 - the caller) now sit in its native worker loop
        wait_until(lambda: _threads(server.worker_pids()) >= before + 2, HANG_S, "the pool's two native threads")
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
        assert _threads(server.worker_pids()) == before + 2   # no more threads for the second module


def test_sigterm_stops_the_server_and_its_session_workers(make_java_device, rpc_kernels):
    server = make_java_device()
    remote = rpc.connect(server.host, server.port, timeout=20)
    try:
        assert remote.get_function("tether.echo")(1) == 1
        wait_until(lambda: len(server.worker_pids()) >= 1, 10, "the session's worker JVM")
        workers = server.worker_pids()
        server.proc.terminate()
        server.proc.wait(HANG_S)
        assert server.proc.returncode != -signal.SIGKILL   # it ended on SIGTERM by itself
        server.stop()
        wait_until(lambda: not any(_running(pid) for pid in workers), HANG_S, "the session worker JVMs to be gone")
    finally:
        remote.close()
