"""Hostile input against a real server: none of it may block or kill the server, or cost it memory.

After each attack the same server must still answer a well-behaved client. "Not blocked" is shown without a
stopwatch: the silent connections are held by a server that would wait ten minutes for them, so a client served at
all was served past them.
"""
from __future__ import annotations

import os
import socket
import struct

import numpy as np
import pytest

from fixtures.polling import HANG_S
from tether import rpc
from tether_rpc import errors, handshake, protocol as p, transport


@pytest.fixture(scope="module")
def hostile_server(tmp_path_factory):
    from fixtures.rpc import start_server

    # A short handshake timeout keeps the silent-connection test quick.
    server = start_server(tmp_path_factory.mktemp("hostile"), "--handshake-timeout", "1")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def patient_server(tmp_path_factory):
    """A server that gives a silent connection ten minutes to say hello: one blocked by such a connection would
    not answer another client within any test's patience."""
    from fixtures.rpc import start_server

    server = start_server(tmp_path_factory.mktemp("patient"), "--handshake-timeout", "600")
    yield server
    server.stop()


def assert_serves(server, timeout=HANG_S):
    """A normal client gets a session and a correct answer (its waits bounded by ``timeout``)."""
    with rpc.connect(server.host, server.port, timeout=timeout, wait=True) as remote:
        assert remote.get_function("tether.echo")([1, "ok"]) == [1, "ok"]
    assert server.alive


def assert_session_refuses(server, data: bytes, error=errors.ProtocolError) -> None:
    """Raw ``data`` sent inside an open session is answered with ``error``, and the server serves others on."""
    remote = rpc.connect(server.host, server.port, timeout=HANG_S)
    try:
        remote.sock.sendall(data)
        with pytest.raises(error):
            remote._receive_reply(1, None, None)
    finally:
        remote.close()
    assert_serves(server)


def closes_with_error(sock, timeout=HANG_S):
    """Read until EOF; returns the ERROR payloads the server sent before closing."""
    sock.settimeout(timeout)
    data = b""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    buf = p.FrameBuffer()
    buf.feed(data)
    frames = []
    while True:
        frame = buf.next_frame()
        if frame is None:
            break
        frames.append(frame)
    return [f[2] for f in frames if f[0] == p.MsgType.ERROR]


def connect_raw(server):
    sock = socket.create_connection((server.host, server.port), timeout=5)
    return sock


@pytest.mark.parametrize("garbage", [
    b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
    os.urandom(4096),
    b"\x00\x00\x00\x05\xc1\xc1\xc1\xc1\xc1",                 # a frame of reserved msgpack bytes
    p.encode_frame(p.MsgType.CALL, 1, {"fn": "tether.echo", "args": [1]}),  # a CALL before any handshake
    p.HEADER.pack(3) + b"\x93\x01\x00",                     # a truncated body inside a complete frame
    struct.pack("<ii", 0xFF271, 4),                         # TVM's RPC magic and a key length: not a tether frame
], ids=["http", "random", "reserved-bytes", "call-before-hello", "truncated-msgpack", "tvm-magic"])
def test_garbage_is_refused_and_the_server_carries_on(hostile_server, garbage):
    sock = connect_raw(hostile_server)
    try:
        sock.sendall(garbage)
        errs = closes_with_error(sock)
        assert errs and errs[0]["type"] in ("ProtocolError", "FrameTooLarge")
    finally:
        sock.close()
    assert_serves(hostile_server)


def test_truncated_frame_then_silence_is_timed_out(hostile_server):
    sock = connect_raw(hostile_server)
    try:
        frame = p.encode_frame(p.MsgType.HELLO, 0, handshake.hello_payload())
        sock.sendall(frame[:len(frame) // 2])
        # the server is not blocked by the half frame
        assert_serves(hostile_server)
        errs = closes_with_error(sock)
        assert errs and errs[0]["type"] == "TetherTimeout"      # the server's handshake timeout, sent to us
    finally:
        sock.close()


def test_connections_that_never_speak_do_not_block_others(patient_server, hostile_server):
    idle = [connect_raw(patient_server) for _ in range(20)]
    try:
        assert_serves(patient_server)
    finally:
        for s in idle:
            s.close()
    # each silent connection is told and closed after the handshake timeout (1 s on this server)
    idle = [connect_raw(hostile_server) for _ in range(20)]
    try:
        for s in idle:
            errs = closes_with_error(s)
            assert [e["type"] for e in errs] == ["TetherTimeout"]
    finally:
        for s in idle:
            s.close()


def test_a_flood_of_idle_connections_cannot_lock_out_a_client(patient_server):
    idle = []
    try:
        for _ in range(100):  # more than the server's pending-handshake limit (64): the oldest is dropped for us
            idle.append(connect_raw(patient_server))
        assert_serves(patient_server)
    finally:
        for s in idle:
            s.close()


def test_oversized_frame_is_refused_before_allocation(hostile_server):
    # Before the handshake: a 2 GiB header is refused at once (no 2 GiB buffer, no waiting for the body).
    sock = connect_raw(hostile_server)
    try:
        sock.sendall(p.HEADER.pack(0x7FFFFFFF) + b"\x93")
        errs = closes_with_error(sock)     # refused from the header, not after waiting for the body
        assert errs[0]["type"] == "FrameTooLarge" and "2147483647" in errs[0]["message"]
    finally:
        sock.close()
    # Inside a session: a frame over the session limit, and a bulk announcement over the bulk limit.
    for attack in (p.HEADER.pack(p.DEFAULT_LIMITS.max_frame + 1),
                   p.encode_frame(p.MsgType.CALL, 1, {"fn": "tether.upload", "args": ["x"],
                                                      "nbytes": p.DEFAULT_LIMITS.max_bulk + 1})):
        assert_session_refuses(hostile_server, attack, errors.FrameTooLarge)


def test_garbage_inside_a_session_ends_only_that_session(hostile_server):
    assert_session_refuses(hostile_server, p.HEADER.pack(8) + os.urandom(8))


def test_unknown_ext_type_and_deep_nesting_in_a_session(hostile_server):
    with rpc.connect(hostile_server.host, hostile_server.port, timeout=5) as remote:
        deep = 0
        for _ in range(100):
            deep = [deep]
        with pytest.raises(errors.ProtocolError):
            remote.get_function("tether.echo")(deep)
        assert remote.closed  # a protocol violation ends the session
    assert_serves(hostile_server)


def test_unsafe_upload_names_are_refused_and_nothing_is_written(hostile_server, tmp_path):
    marker = "tether_hostile_%d" % os.getpid()
    with rpc.connect(hostile_server.host, hostile_server.port, timeout=5) as remote:
        for bad in ("../../" + marker, "/tmp/" + marker, marker + "\x00.so", "", ".", "..", "a/b", 7, None):
            with pytest.raises(errors.UnsafePathError):
                remote._call("tether.upload", [bad], bulk=memoryview(b"payload"))
        assert remote.listdir() == []
        assert remote.get_function("tether.echo")("fine") == "fine"  # the bulk bytes were drained
    assert not os.path.exists("/tmp/" + marker)
    assert not os.path.exists(os.path.join(os.path.dirname(os.path.dirname(str(tmp_path))), marker))


def test_copy_in_with_the_wrong_size_is_refused_and_drained(hostile_server):
    with rpc.connect(hostile_server.host, hostile_server.port, timeout=5) as remote:
        arr = remote.empty((16,), "float32")
        with pytest.raises(ValueError, match="64"):
            remote._call("tether.array.copy_in", [arr.handle], bulk=memoryview(b"\x00" * 100))
        arr.copyfrom(np.arange(16, dtype="float32"))
        np.testing.assert_array_equal(arr.numpy(), np.arange(16, dtype="float32"))


def test_safe_names_and_planted_symlinks(tmp_path):
    from tether_rpc.files import SessionFolder, safe_name

    for ok in ("vadd.so", ".hidden", "a..b", "ünïcode.bin", "x" * 255):
        assert safe_name(ok) == ok
    for bad in ("", ".", "..", "../x", "a/b", "a\\b", "/abs", "nul\x00", "tab\tname", "x" * 256, b"bytes", 3):
        with pytest.raises(errors.UnsafePathError):
            safe_name(bad)
    folder = SessionFolder(str(tmp_path / "session"))
    os.symlink(str(tmp_path), os.path.join(folder.path, "escape"))  # planted from outside the protocol
    with pytest.raises(errors.UnsafePathError, match="outside"):
        folder.path_for("escape")
    assert folder.listdir() == []  # symlinks are not listed as files


# -- the small-call fast path (hook-free decode of plain frames) must refuse exactly what the full decoder does ----
def _crafted_bodies():
    import msgpack

    call = {"fn": "tether.echo", "args": [1]}
    return {
        "timestamp_in_args": msgpack.packb([5, 1, {"fn": "tether.echo", "args": [msgpack.Timestamp(1, 0)]}]),
        "timestamp_as_value": msgpack.packb([5, 1, {"fn": "tether.echo", "args": [], "t": msgpack.Timestamp(1)}]),
        "bin_key": msgpack.packb([5, 1, {b"fn": "tether.echo", "args": [1]}], use_bin_type=True),
        "int_key": msgpack.packb([5, 1, {1: "x", "args": [1]}]),
        "trailing_nil": msgpack.packb([5, 1, call]) + b"\xc0",
        "bool_request_id": msgpack.packb([5, True, call]),
        "negative_request_id": msgpack.packb([5, -1, call]),
        "msg_type_zero": msgpack.packb([0, 1, call]),
        "bad_handle_ext": msgpack.packb([5, 1, {"fn": msgpack.ExtType(2, b"\x00" * 7), "args": []}]),
        "unknown_ext_in_args": msgpack.packb([5, 1, {"fn": "tether.echo", "args": [msgpack.ExtType(9, b"x")]}]),
        "four_elements": msgpack.packb([5, 1, call, 0]),
    }


def _read_both_ways(data):
    """Decode ``data`` with FrameReader over a real socket pair: plain path first, then the full one."""
    a, b = socket.socketpair()
    try:
        a.sendall(data)
        a.close()
        reader = transport.FrameReader(b)
        frame = reader.read_plain_frame()
        return frame if frame is not None else reader.read_frame()
    finally:
        b.close()


@pytest.mark.parametrize("name", sorted(_crafted_bodies()))
def test_fast_path_refuses_what_the_full_decoder_refuses(name):
    body = _crafted_bodies()[name]
    with pytest.raises(errors.ProtocolError):
        p.decode_body(body)  # the reference: the checked decoder
    buf = p.FrameBuffer()
    assert buf.decode_plain(memoryview(body)) is None  # the fast decoder declines it...
    with pytest.raises(errors.ProtocolError):  # ...and the reader then reports the error
        _read_both_ways(p.HEADER.pack(len(body)) + body)


def test_fast_path_agrees_with_the_vectors():
    import json
    import pathlib

    vectors = json.loads((pathlib.Path(__file__).parent / "vectors" / "frames.json").read_text())
    plain = 0
    for vector in vectors["valid"]:
        raw = bytes.fromhex(vector["hex"])
        expected = p.decode_body(raw[4:])
        got = p.FrameBuffer().decode_plain(memoryview(raw[4:]))
        if got is not None:
            plain += 1
            assert got == expected, vector["name"]
        frame = _read_both_ways(raw)
        assert (frame[0], frame[1]) == expected[:2] and list(frame[2]) == list(expected[2]), vector["name"]
    assert plain >= 5  # the plain path is really taken for the simple frames
    for vector in vectors["invalid"]:
        if vector["error"] == "Incomplete":
            continue
        with pytest.raises(getattr(errors, vector["error"])):
            _read_both_ways(bytes.fromhex(vector["hex"]))


@pytest.mark.parametrize("name", ["timestamp_in_args", "bin_key", "trailing_nil", "bad_handle_ext"])
def test_hostile_plain_sized_calls_inside_a_session(hostile_server, name):
    body = _crafted_bodies()[name]
    assert_session_refuses(hostile_server, p.HEADER.pack(len(body)) + body)


def test_fast_path_errors_keep_the_session(hostile_server):
    with rpc.connect(hostile_server.host, hostile_server.port, timeout=5) as remote:
        with pytest.raises(KeyError, match="no built-in"):
            remote.get_function("tether.nope")(1)
        with pytest.raises(KeyError, match="does not exist"):
            remote._call(p.RemoteHandle(12345), [1])
        with pytest.raises(TypeError):  # an unknown built-in argument count: a Python error, reported
            remote.get_function("tether.listdir")(1, 2, 3)
        assert remote.get_function("tether.echo")(2.5) == 2.5
        assert not remote.closed


def test_upload_cut_off_midway_ends_only_that_session(hostile_server):
    remote = rpc.connect(hostile_server.host, hostile_server.port, timeout=5)
    try:
        frame = p.encode_frame(p.MsgType.CALL, 1, {"fn": "tether.upload", "args": ["half.bin"], "nbytes": 8 << 20})
        remote.sock.sendall(frame + os.urandom(3 << 20))
    finally:
        remote.sock.close()  # gone with 5 MiB still owed
    assert_serves(hostile_server)
    with rpc.connect(hostile_server.host, hostile_server.port, timeout=5) as remote:
        assert remote.listdir() == []  # a fresh session folder; the partial file never became visible


def test_stalled_upload_is_ended_by_the_idle_timeout(make_rpc_server):
    server = make_rpc_server("--idle-timeout", "0.5")
    remote = rpc.connect(server.host, server.port, timeout=HANG_S)
    try:
        frame = p.encode_frame(p.MsgType.CALL, 1, {"fn": "tether.upload", "args": ["slow.bin"], "nbytes": 4 << 20})
        remote.sock.sendall(frame + os.urandom(1 << 20))  # then silence, connection open
        # the worker's own receive timeout (the idle timeout), sent as an ERROR; a client-side timeout has no such end
        # ("the session has ended" from rpc-server, "... and has ended" from the Java device server)
        with pytest.raises(errors.TetherTimeout, match="has ended"):
            remote._receive_reply(1, None, None)
    finally:
        remote.close()
    assert_serves(server)
