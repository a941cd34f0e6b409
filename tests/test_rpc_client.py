"""The client API: value objects, error mapping, and LocalSession agreeing with RemoteSession on real kernels."""
from __future__ import annotations

import os

import numpy as np
import pytest

from tether import rpc
from tether.rpc import client as rpc_client
from tether_rpc import errors


def test_timeout_value_object():
    t = rpc.Timeout.coerce(rpc.Timeout.DEFAULT)
    assert all(0 < getattr(t, ph) < float("inf") for ph in ("connect", "read", "write", "session"))
    assert t == rpc.Timeout()
    assert rpc.Timeout.coerce(3) == rpc.Timeout(connect=3, read=3, write=3, session=3)
    # only an explicit None disables waiting limits (httpx's rule): timeout=None means no limit on any phase
    assert rpc.Timeout.coerce(None) == rpc.Timeout(connect=None, read=None, write=None, session=None)
    custom = rpc.Timeout(connect=1, read=100)
    assert rpc.Timeout.coerce(custom) is custom
    unlimited = rpc.Timeout(read=None, session=None)  # None: that phase waits without limit
    assert unlimited.read is None and unlimited.session is None and unlimited.connect == rpc.Timeout().connect
    for bad in (0, -1, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="Timeout"):
            rpc.Timeout(read=bad)


def test_a_phase_set_to_none_waits_without_limit(rpc_server):
    import socket
    import struct

    unlimited = rpc.Timeout(connect=None, read=None, write=None, session=None)
    for timeout in (unlimited, None):  # timeout=None is the same as every phase None
        with rpc.connect(rpc_server.host, rpc_server.port, timeout=timeout) as remote:
            size = struct.calcsize("ll")
            for opt in (socket.SO_RCVTIMEO, socket.SO_SNDTIMEO):
                assert remote.sock.getsockopt(socket.SOL_SOCKET, opt, size) == bytes(size)
            assert remote.sock.gettimeout() is None
            assert remote.get_function("tether.echo")(3) == 3


def test_timing_result_statistics_match_numpy():
    samples = (0.003, 0.001, 0.002, 0.010)
    r = rpc.TimingResult(samples, 7)
    assert r.median == np.median(samples) and r.mean == np.mean(samples) and r.std == np.std(samples)
    assert (r.min, r.max, r.number) == (0.001, 0.010, 7)
    assert "median" in repr(r)


def test_remote_errors_are_also_their_original_class():
    exc = rpc.remote_exception({"type": "KeyError", "message": "k", "traceback": "tb"})
    assert isinstance(exc, KeyError) and isinstance(exc, errors.RemoteError) and exc.remote_traceback == "tb"
    exc = rpc.remote_exception({"type": "ArchMismatch", "message": "aarch64 vs x86_64"})
    assert isinstance(exc, errors.ArchMismatch) and isinstance(exc, errors.ModuleLoadError)
    exc = rpc.remote_exception({"type": "SessionCrashed", "message": "SIGSEGV"})
    assert type(exc) is errors.SessionCrashed
    exc = rpc.remote_exception({"type": "SomethingCustom", "message": "m"})
    assert type(exc) is errors.RemoteError and exc.remote_type == "SomethingCustom"
    # must never build arbitrary objects from a name: only exception classes qualify
    exc = rpc.remote_exception({"type": "print", "message": "m"})
    assert type(exc) is errors.RemoteError


def test_connection_refused_and_connect_timeout_are_clear():
    from fixtures.rpc import free_port

    port = free_port()
    with pytest.raises(errors.ConnectionClosed, match="127.0.0.1:%d" % port):
        rpc.connect("127.0.0.1", port, timeout=2)


def test_close_is_idempotent_and_objects_refuse_afterwards(rpc_server):
    remote = rpc.connect(rpc_server.host, rpc_server.port, timeout=5)
    arr = remote.empty(4, "int32")
    remote.close()
    remote.close()
    assert remote.closed
    with pytest.raises(errors.ConnectionClosed):
        arr.numpy()
    arr.free()  # a no-op once the session is gone
    local = rpc.LocalSession()
    folder = local.folder
    local.close()
    local.close()
    assert not os.path.exists(folder)


def test_arrays_belong_to_their_session(rpc_server):
    with rpc.LocalSession() as a_session, rpc.connect(rpc_server.host, rpc_server.port, timeout=5) as remote:
        foreign = a_session.empty(4)
        with pytest.raises(ValueError, match="another session"):
            remote.get_function("tether.echo")(foreign)
        mine = remote.empty(4)
        mine.free()
        mine.free()
        with pytest.raises(ValueError, match="freed"):
            remote.get_function("tether.echo")(mine)


def test_big_numpy_arguments_go_through_temporary_device_arrays(rpc_server, rpc_kernels, monkeypatch):
    monkeypatch.setattr(rpc_client, "INLINE_TENSOR_LIMIT", 1024)  # force the device-array path for 12 KiB
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal(1024).astype("float32"), rng.standard_normal(1024).astype("float32")
    c = np.zeros(1024, "float32")
    with rpc.connect(rpc_server.host, rpc_server.port, timeout=5) as remote:
        remote.upload(rpc_kernels["vadd"])
        remote.load_module("vadd.so")["vadd"](a, b, c)
        np.testing.assert_array_equal(c, a + b)
        # the temporaries were freed: only new handles exist, and the session still works
        assert remote.get_function("tether.echo")(5) == 5


def exercise(session, kernels):
    """Run the same workload on any session; returns everything observable for comparison."""
    out = {}
    events = []
    session.on_event = events.append
    echo = session.get_function("tether.echo")
    out["echo"] = [echo(1), echo("s"), echo(b"b"), echo(None), echo(1.5, [2, {"k": 3}])]
    t = echo(np.arange(6, dtype="int16").reshape(2, 3))
    out["echo_tensor"] = (t.dtype.name, t.shape, t.tolist())
    out["functions"] = session.functions()
    session.upload(kernels["vadd"])
    session.upload(b"abc", name="f.txt")
    out["listdir"] = session.listdir()
    out["download"] = session.download("f.txt")
    session.remove("f.txt")
    out["listdir_after"] = session.listdir()
    mod = session.load_module("vadd.so")
    out["functions_in_module"] = mod.function_names
    f = mod["vadd"]
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal(1024).astype("float32"), rng.standard_normal(1024).astype("float32")
    A, B, C = session.array(a), session.array(b), session.empty((1024,), "float32")
    f(A, B, C)
    out["vadd"] = C.numpy()
    c = np.zeros(1024, "float32")
    f(a, b, c)
    out["vadd_numpy"] = c
    res = f.time_evaluator(number=3, repeat=2)(A, B, C)
    out["timing"] = (len(res.samples), res.number)
    out["sample_events"] = [e["index"] for e in events if e["kind"] == "sample"]
    errs = []
    session.upload(kernels["wrong_arch"])
    for bad in (lambda: session.load_module("missing.so"), lambda: session.upload(b"x", name="../x"),
                lambda: f(A, B), lambda: session.get_function("tether.nope")(),
                lambda: session.load_module(os.path.basename(kernels["wrong_arch"]))):
        try:
            bad()
        except Exception as exc:  # compare the classes the caller can catch
            errs.append(sorted(c.__name__ for c in (FileNotFoundError, errors.UnsafePathError, errors.KernelError,
                                                    KeyError, errors.ArchMismatch) if isinstance(exc, c)))
    out["errors"] = errs
    out["info_keys"] = sorted(session.device_info())
    return out


def test_local_and_remote_sessions_agree(rpc_server, rpc_kernels):
    with rpc.LocalSession() as local:
        expected = exercise(local, rpc_kernels)
    with rpc.connect(rpc_server.host, rpc_server.port, timeout=10) as remote:
        got = exercise(remote, rpc_kernels)
    assert got.keys() == expected.keys()
    for key in expected:
        if isinstance(expected[key], np.ndarray):
            np.testing.assert_array_equal(got[key], expected[key])
        else:
            assert got[key] == expected[key], key
    # and both are right, not just equal
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal(1024).astype("float32"), rng.standard_normal(1024).astype("float32")
    np.testing.assert_array_equal(expected["vadd"], a + b)
    assert expected["errors"] == [["FileNotFoundError"], ["UnsafePathError"], ["KernelError"], ["KeyError"],
                                  ["ArchMismatch"]]
    assert expected["sample_events"] == [0, 1]
    assert expected["echo"] == [1, "s", b"b", None, [1.5, [2, {"k": 3}]]]


def test_local_session_upload_from_path_with_progress(tmp_path):
    src = tmp_path / "blob.bin"
    data = os.urandom(100000)
    src.write_bytes(data)
    seen = []
    with rpc.LocalSession() as local:
        assert local.upload(src, progress=lambda d, t: seen.append((d, t))) == "blob.bin"
        assert local.download("blob.bin") == data
    assert seen and seen[-1] == (len(data), len(data))


def test_streamed_events_reach_the_callbacks_over_a_real_socket():
    """A scripted device (the worker's own event channel on a real socket) streams log and progress EVENTs
    before its RETURN; the client delivers them to on_log / on_event in order, then returns the value."""
    import socket
    import threading

    from tether_rpc import protocol as p, transport
    from tether_rpc.worker import _Channel, _EventLines

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)

    def device():
        conn, _ = listener.accept()
        with conn:
            reader = transport.FrameReader(conn)
            assert reader.read_frame()[0] == p.MsgType.HELLO
            conn.sendall(p.encode_frame(p.MsgType.WELCOME, 0, {"version": p.PROTOCOL_VERSION, "session": 1}))
            _, rid, payload = reader.read_frame()
            channel = _Channel(conn)
            channel.request_id = rid
            out = _EventLines(channel, "stdout")
            out.write("first line\nsecond ")
            out.write("line\n")
            channel.emit("progress", {"kind": "progress", "done": 1, "total": 2})
            conn.sendall(p.encode_frame(p.MsgType.RETURN, rid, {"value": payload["args"][0]}))
            reader.read_frame()  # CLOSE

    th = threading.Thread(target=device, daemon=True)
    th.start()
    logs, events = [], []
    try:
        with rpc.connect("127.0.0.1", listener.getsockname()[1], timeout=5,
                         on_log=lambda stream, line: logs.append((stream, line)),
                         on_event=lambda e: events.append(e["kind"])) as remote:
            assert remote.get_function("tether.echo")("v") == "v"
        th.join(5)
    finally:
        listener.close()
    assert logs == [("stdout", "first line"), ("stdout", "second line")]
    assert events == ["log", "log", "progress"]


@pytest.mark.parametrize("kind", ["local", "remote"])
def test_empty_arrays_and_files(kind, rpc_server):
    session = rpc.LocalSession() if kind == "local" else rpc.connect(rpc_server.host, rpc_server.port, timeout=5)
    with session:
        arr = session.array(np.zeros((0, 3), "float64"))
        assert arr.shape == (0, 3) and arr.numpy().shape == (0, 3)
        session.upload(b"", name="empty.bin")
        assert session.download("empty.bin") == b""
        assert session.listdir() == ["empty.bin"]
        scalar = session.array(np.array(7, "int64"))
        assert scalar.shape == () and scalar.numpy() == 7


def test_reuploading_a_loaded_library_keeps_the_loaded_one_working(rpc_server, rpc_kernels):
    """An upload replaces the file by rename: a library already loaded from that name keeps running (writing over
    a mapped library in place would change its code under the session)."""
    n = 1024
    a, b = np.arange(n, dtype="float32"), np.ones(n, dtype="float32")
    with rpc.connect(rpc_server.host, rpc_server.port, timeout=10) as remote:
        remote.upload(str(rpc_kernels["vadd"]), name="k.so")
        vadd = remote.load_module("k.so")["vadd"]
        remote.upload(str(rpc_kernels["misc"]), name="k.so")       # a different library under the same name
        assert remote.listdir() == ["k.so"]                          # no temporary left behind
        c = remote.empty((n,), "float32")
        vadd(remote.array(a), remote.array(b), c)
        np.testing.assert_array_equal(c.numpy(), a + b)
        assert "nop" in remote.load_module("k.so").function_names    # the new file is what loads now


# -- adaptive polling for replies (tether_rpc.protocol.FrameReader.spin) -----------------------------------------
def _modes_per_epoch(intervals_by_mode, epochs):
    """Drive a FrameReader's mode choice epoch by epoch, feeding measuring epochs the given frame intervals
    (seconds) for their mode; returns the mode of each epoch and the reader."""
    import socket

    from tether_rpc import transport

    a, b = socket.socketpair()
    try:
        reader = transport.FrameReader(b, spin=100e-6)
        modes = []
        for _ in range(epochs):
            modes.append(reader.polling)
            if reader._timing:
                reader._intervals = [intervals_by_mode[reader.polling]] * (reader.EPOCH + 1)
                reader._next_phase()
            else:  # staying: no timing; the phase lasts STAY epochs
                reader._left -= reader.EPOCH
                if reader._left <= 0:
                    reader._next_phase()
        return modes, reader
    finally:
        a.close()
        b.close()


def test_polling_is_kept_only_while_it_measures_faster():
    from tether_rpc import transport

    stay = transport.FrameReader.STAY
    # polling twice as fast: measured first, sleeping once, then polling for STAY epochs, then both again
    modes, reader = _modes_per_epoch({True: 25e-6, False: 50e-6}, 2 + stay + 3)
    assert modes[:2] == [True, False] and modes[2:2 + stay] == [True] * stay
    assert modes[2 + stay:] == [True, False, True]
    assert reader.medians == {True: 25e-6, False: 50e-6}
    # polling slower (a busy machine): sleeping wins, and the next round measures sleeping first
    modes, _ = _modes_per_epoch({True: 60e-6, False: 50e-6}, 2 + stay + 2)
    assert modes[:2] == [True, False] and modes[2:2 + stay] == [False] * stay and modes[2 + stay:] == [False, True]
    # polling barely faster (within the margin) is not worth its CPU time
    modes, _ = _modes_per_epoch({True: 48e-6, False: 50e-6}, 4)
    assert modes[2:] == [False, False]


def test_polling_client_and_server_answer_correctly(rpc_server):
    # many small calls with polling at both ends (the defaults), across several measurement epochs
    with rpc.connect(rpc_server.host, rpc_server.port, timeout=10, spin=100e-6) as remote:
        echo = remote.get_function("tether.echo")
        for i in range(3 * remote._reader.EPOCH):
            assert echo(i) == i
        assert remote._reader.medians  # it measured
        assert echo("x" * 5000) == "x" * 5000  # a frame beyond the plain-frame size still works
    with rpc.connect(rpc_server.host, rpc_server.port, timeout=10, spin=0) as remote:
        assert remote.get_function("tether.echo")([1, 2]) == [1, 2] and not remote._reader.medians
