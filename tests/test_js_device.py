"""The JavaScript device server (bindings/js/server.js) under real node, driven by the Python client.

Every test talks to a real `node bindings/js/server.js` process over loopback TCP, directly (`--port`) or through a
real `rpc-tracker` (reverse mode: the tracker relays the session to the device's own outgoing connection). Kernels
are real wasm32 modules built by `tether.build(..., target="wasm32")`; results are compared with numpy.
"""
from __future__ import annotations

import json
import os
import pathlib
import socket
import struct
import subprocess

import numpy as np
import pytest
from fixtures.js_device import ROOT, SERVER_JS, VECTORS_JS, check_model_on, node
from fixtures.polling import wait_until

from tether import rpc
from tether_rpc import errors
from tether_rpc.protocol import RemoteHandle as rpc_handle


# ---------------------------------------------------------------------------------------------------------------
# the codec on its own

def run_vectors(path: pathlib.Path) -> dict:
    out = subprocess.run([node(), str(VECTORS_JS), str(path)], capture_output=True, text=True, timeout=60)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_js_codec_round_trips_every_shared_vector():
    doc = json.loads((ROOT / "tests" / "vectors" / "frames.json").read_text())
    result = run_vectors(ROOT / "tests" / "vectors" / "frames.json")
    assert result == {"checked": len(doc["valid"]) + len(doc["invalid"]), "failures": []}


def test_js_codec_tells_a_float_from_an_int(tmp_path):
    """The runner is not fooled: the float 2.0 decoded as an int (or the int 1 as a float) fails its vector."""
    doc = json.loads((ROOT / "tests" / "vectors" / "frames.json").read_text())
    by_name = {v["name"]: v for v in doc["valid"]}
    assert by_name["call_echo_float_2"]["meaning"]["payload"]["args"] == [{"$float": 2.0}]
    by_name["call_echo_float_2"]["meaning"]["payload"]["args"] = [2]
    by_name["call_echo"]["meaning"]["payload"]["args"] = [{"$float": 1.0}]
    broken = tmp_path / "frames.json"
    broken.write_text(json.dumps(doc))
    result = run_vectors(broken)
    assert sorted(f.split(":")[0] for f in result["failures"]) == ["call_echo", "call_echo_float_2"]


def test_js_frame_decoder_refuses_mutated_frames_cleanly():
    """50,000 mutated vector frames: each decodes or is refused with ProtocolError/FrameTooLarge, nothing else
    (this found a zero-length body reaching past the buffer)."""
    out = subprocess.run([node(), str(ROOT / "bindings" / "js" / "test" / "fuzz_frames.mjs"), "50000"],
                         capture_output=True, text=True, timeout=300)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["crashes"] == [] and result["frames"] == 50000 and result["refused"] > 10000, result


# ---------------------------------------------------------------------------------------------------------------
# a direct session

def test_echo_keeps_floats_ints_and_map_order(js_server):
    with rpc.connect("127.0.0.1", js_server.port) as remote:
        value = remote._call("tether.echo", [2.0])["value"]
        assert type(value) is float and value == 2.0
        got = remote._call("tether.echo", [2, -0.0, 1.5, 2 ** 63, -(2 ** 63), "héllo", b"\x00\xff", None, True,
                                           {"1": 1, "a": [1.0, {"z": 2}]}])["value"]
        assert [type(x) for x in got[:5]] == [int, float, float, int, int]
        assert got == [2, -0.0, 1.5, 2 ** 63, -(2 ** 63), "héllo", b"\x00\xff", None, True,
                       {"1": 1, "a": [1.0, {"z": 2}]}]
        assert list(got[-1]) == ["1", "a"] and type(got[-1]["a"][0]) is float
        t = np.arange(6, dtype=np.float32).reshape(2, 3)
        back = remote._call("tether.echo", [t])["value"]
        assert back.dtype == np.float32 and back.shape == (2, 3)
        np.testing.assert_array_equal(back, t)
        info = remote.device_info()
        assert info["arch"] == "wasm32" and info["runtime"] == "node" and isinstance(info["simd"], bool)
        assert info["session_limits"]["handles"] == 65536
        assert "tether.graph.run" in remote.functions() and remote.functions() == sorted(remote.functions())


def test_arrays_files_and_errors(js_server):
    with rpc.connect("127.0.0.1", js_server.port) as remote:
        x = np.linspace(-1, 1, 1000).astype(np.float32)
        arr = remote.array(x)
        np.testing.assert_array_equal(arr.numpy(), x)
        arr.copyfrom(x * 2)
        np.testing.assert_array_equal(arr.numpy(), x * 2)
        empty = remote.empty((3, 4), "int64")
        assert empty.numpy().shape == (3, 4) and empty.numpy().dtype == np.int64
        arr.free()
        with pytest.raises(Exception, match="does not exist|no such handle"):
            remote._call("tether.array.copy_out", [arr.handle])
        payload = os.urandom(100_000)
        assert remote.upload(payload, "blob.bin") is not None
        assert remote.listdir() == ["blob.bin"]
        assert remote.download("blob.bin") == payload
        for bad in ("../escape", "a/b", "", ".."):
            with pytest.raises(errors.UnsafePathError):
                remote.upload(b"x", bad)
        remote.remove("blob.bin")
        assert remote.listdir() == []
        with pytest.raises(KeyError, match="no built-in function"):
            remote._call("tether.nope", [])
        assert remote._call("tether.host_functions", [])["value"] == []
        with pytest.raises(KeyError, match="a JS device has none"):
            remote._call("tether.get_function", ["myop"])
        assert remote._call("tether.echo", [1])["value"] == 1      # the session goes on after each error


def test_wasm_kernel_call_matches_numpy_and_times_on_device(js_server, vadd_wasm, tmp_path):
    samples = []
    with rpc.connect("127.0.0.1", js_server.port, on_sample=lambda i, s: samples.append((i, s))) as remote:
        remote.upload(str(vadd_wasm), "vadd.wasm")
        mod = remote.load_module("vadd.wasm")
        f = mod.get_function("vadd")
        rng = np.random.default_rng(0)
        a, b = rng.standard_normal(1024).astype(np.float32), rng.standard_normal(1024).astype(np.float32)
        A, B, C = remote.array(a), remote.array(b), remote.empty(1024, "float32")
        f(A, B, C)
        np.testing.assert_allclose(C.numpy(), a + b, rtol=1e-6)
        c = np.zeros(1024, np.float32)                 # tensors by value come back written
        f(a, b, c)
        np.testing.assert_allclose(c, a + b, rtol=1e-6)
        res = f.time_evaluator(number=20, repeat=4)(A, B, C)
        assert [i for i, _ in samples] == [0, 1, 2, 3] and res.number == 20
        assert [s for _, s in samples] == list(res.samples) and all(s > 0 for s in res.samples)
        grown = f.time_evaluator(number=1, repeat=1, min_repeat_ms=5)(A, B, C)
        assert grown.number > 1
        for bad, error in (({"repeat": 0}, ValueError), ({"bogus": 1}, TypeError)):
            with pytest.raises(error):
                remote._call("tether.time_evaluator", [f.fn, [A.handle, B.handle, C.handle], bad])
        with pytest.raises(errors.KernelError, match=r"argument 0 'A' has shape \(10,\), expected \(1024,\)"):
            f(remote.empty(10, "float32"), B, C)
        # a kernel that traps fails its call, and the session goes on
        remote.upload(str(ROOT / "bindings" / "js" / "test" / "fixtures" / "abi_kernels.wasm"), "abi.wasm")
        with pytest.raises(errors.KernelError, match="trap"):
            remote.load_module("abi.wasm").get_function("trap")()
        np.testing.assert_allclose(C.numpy(), a + b, rtol=1e-6)
        # a native library is refused with what the device expects instead
        (tmp_path / "lib.so").write_bytes(b"\x7fELF" + b"\0" * 60)
        remote.upload(str(tmp_path / "lib.so"), "lib.so")
        with pytest.raises(errors.ModuleLoadError, match=r"\.wasm.*wasm32|wasm32"):
            remote.load_module("lib.so")


def test_graph_builtins_run_a_wasm32_model_like_onnxruntime(js_server, wasm_model):
    with rpc.connect("127.0.0.1", js_server.port) as remote:
        check_model_on(remote, wasm_model)
        gm = remote.graph_executor(str(wasm_model[0]), uploaded=True)
        nodes = []
        prof = gm.profile(number=1, on_node=nodes.append)
        assert [n["index"] for n in nodes] == list(range(len(prof["nodes"]))) and len(nodes) > 5
        assert all(type(n["seconds"]) is float for n in prof["nodes"]) and prof["total_seconds"] > 0
        with pytest.raises(TypeError, match="unknown benchmark options"):
            remote._call("tether.graph.benchmark", [gm.handle, {"bogus": 1}])
        gm.close()


def test_bad_frames_close_the_connection_and_the_server_survives(js_server):
    def raw_exchange(data: bytes) -> bytes:
        with socket.create_connection(("127.0.0.1", js_server.port), timeout=10) as s:
            s.sendall(data)
            out = b""
            while True:
                piece = s.recv(65536)
                if not piece:
                    return out
                out += piece

    garbage = raw_exchange(struct.pack(">I", 5) + b"\x93\x01\x00\x80\x00")       # trailing byte after the body
    assert b"ProtocolError" in garbage
    too_big = raw_exchange(struct.pack(">I", 0x7FFFFFFF) + b"\x93")
    assert b"FrameTooLarge" in too_big
    not_hello = raw_exchange(struct.pack(">I", 4) + b"\x93\x05\x01\x80")          # a CALL before WELCOME
    assert b"ProtocolError" in not_hello
    with rpc.connect("127.0.0.1", js_server.port) as remote:
        assert remote._call("tether.echo", ["still here"])["value"] == "still here"


def test_one_session_at_a_time_with_a_queue(js_server):
    import threading

    first = rpc.connect("127.0.0.1", js_server.port)
    try:
        with pytest.raises(errors.DeviceBusy):
            rpc.connect("127.0.0.1", js_server.port, wait=False)
        positions, second = [], {}

        def wait_for_turn():
            second["session"] = rpc.connect("127.0.0.1", js_server.port, on_queued=positions.append,
                                            timeout=60)

        waiter = threading.Thread(target=wait_for_turn, daemon=True)
        waiter.start()
        wait_until(lambda: positions == [1], 20, "the second client to be queued")
        assert first._call("tether.echo", ["first"])["value"] == "first"
    finally:
        first.close()
    waiter.join(30)
    assert not waiter.is_alive() and "session" in second
    with second["session"] as remote:
        assert remote._call("tether.echo", ["second"])["value"] == "second"


def test_session_limits_refuse_and_the_session_goes_on(js_lab):
    dev = js_lab.node(["--port", "0", "--session-disk", "1000", "--session-memory", "4KiB"], "listening on")
    with rpc.connect("127.0.0.1", dev.port) as remote:
        assert remote.device_info()["session_limits"]["disk_bytes"] == 1000
        remote.upload(b"x" * 600, "a.bin")
        with pytest.raises(errors.LimitExceeded, match="--session-disk"):
            remote.upload(b"y" * 600, "b.bin")          # its bytes are read and dropped: the stream stays in step
        remote.upload(b"z" * 900, "a.bin")              # replacing a file counts only the difference
        assert remote.listdir() == ["a.bin"] and remote.download("a.bin") == b"z" * 900
        keep = remote.empty(1000, "float32")
        with pytest.raises(errors.OutOfMemory, match="--session-memory"):
            remote.empty(100, "float32")
        keep.free()
        assert remote.empty(1000, "float32").numpy().shape == (1000,)
        with pytest.raises(ValueError, match="copy_in: 8 bytes sent"):
            remote._call("tether.array.copy_in", [remote.empty(4, "float32").handle], bulk=b"12345678")
        with pytest.raises(KeyError, match="handle 999"):     # bytes for no array are dropped unread
            remote._call("tether.array.copy_in", [rpc_handle(999)], bulk=b"x" * 100_000)
        assert remote._call("tether.echo", [1.5], bulk=b"y" * 1000)["value"] == 1.5   # (and for no copy)


def test_token_is_required_and_a_wrong_one_refused(js_lab):
    dev = js_lab.node(["--port", "0", "--token", "s3cret-tök€n"], "listening on")
    with pytest.raises(errors.AuthenticationError):
        rpc.connect("127.0.0.1", dev.port, token="wrong")
    with pytest.raises(errors.AuthenticationError):
        rpc.connect("127.0.0.1", dev.port, token=None)
    with rpc.connect("127.0.0.1", dev.port, token="s3cret-tök€n") as remote:
        assert remote._call("tether.echo", [3])["value"] == 3


# ---------------------------------------------------------------------------------------------------------------
# through a tracker (reverse mode)

@pytest.mark.parametrize("token", [None, "trk-tok€n"])
def test_node_device_serves_tracker_requests_in_reverse_mode(js_lab, vadd_wasm, token):
    tracker = js_lab.tracker(token=token)
    args = ["--tracker", "127.0.0.1:%d" % tracker.port, "--key", "node", "--tag", "lab=js"]
    if token:
        args += ["--tracker-token", token]
    js_lab.node(args, "registered with")
    devices = tracker.summary()["devices"]
    assert [(d["key"], d["reverse"], d["tags"]["arch"], d["tags"]["lab"]) for d in devices] == \
        [("node", True, "wasm32", "js")]
    with tracker.client() as client:
        for round_ in range(2):         # the device registers again after each session
            with client.request("node", wait_timeout=30) as remote:
                assert remote.device_info()["arch"] == "wasm32"
                remote.upload(str(vadd_wasm), "vadd.wasm")
                f = remote.load_module("vadd.wasm").get_function("vadd")
                a = np.full(1024, round_ + 1, np.float32)
                c = np.zeros(1024, np.float32)
                f(a, a, c)
                np.testing.assert_array_equal(c, 2 * a)
            wait_until(lambda: tracker.count("node", "free") == 1, 15, "the node device to be free again")
    if token:   # a device with the wrong tracker token never registers
        bad = js_lab.node(["--tracker", "127.0.0.1:%d" % tracker.port, "--key", "bad", "--tracker-token", "no"], None)
        wait_until(lambda: "AuthenticationError" in bad.log(), 15, "the tracker to refuse the wrong token")
        assert tracker.count("bad") == 0


def test_node_device_comes_back_after_the_tracker_restarts(js_lab):
    first = js_lab.tracker()
    dev = js_lab.node(["--tracker", "127.0.0.1:%d" % first.port, "--key", "node"], "registered with")
    first.stop()
    tracker = js_lab.tracker(port=first.port)      # the same address, an empty pool
    wait_until(lambda: tracker.count("node", "free") == 1, 30, "the node device to register again")
    with tracker.client() as client, client.request("node", wait_timeout=30) as remote:
        assert remote._call("tether.echo", [2.0])["value"] == 2.0
    assert "reconnecting" in dev.log()


def test_the_grant_session_timeout_ends_the_session_on_the_device(js_lab):
    tracker = js_lab.tracker()
    js_lab.node(["--tracker", "127.0.0.1:%d" % tracker.port, "--key", "node"], "registered with")
    with tracker.client() as client:
        remote = client.request("node", wait_timeout=30, session_timeout=1)
        try:
            def ended() -> bool:
                try:
                    remote._call("tether.echo", [1])
                    return False
                except errors.TetherTimeout as exc:
                    return "session timeout" in str(exc)
            wait_until(ended, 30, "the device to end the session", step=0.2)
        finally:
            remote.close()
        wait_until(lambda: tracker.count("node", "free") == 1, 30, "the device to be free again")


def test_server_js_refuses_bad_options():
    out = subprocess.run([node(), str(SERVER_JS), "--tracker", "nohostport"], capture_output=True, text=True,
                         timeout=30)
    assert out.returncode == 2 and "--tracker takes HOST:PORT" in out.stderr and "Error" not in out.stderr
