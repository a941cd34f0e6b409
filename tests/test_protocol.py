"""The wire protocol on its own: framing, ext types, limits, handshake helpers and the shared test vectors."""
from __future__ import annotations

import json
import pathlib
import re
import socket
import threading

import numpy as np
import pytest

from tether_rpc import dtypes, errors, handshake, protocol as p, transport
from vectors.generate import to_wire  # the same JSON -> wire-value mapping that wrote the vectors

ROOT = pathlib.Path(__file__).resolve().parents[1]
VECTORS = json.loads((ROOT / "tests" / "vectors" / "frames.json").read_text())


def assert_same(decoded, expected):
    if isinstance(expected, np.ndarray):
        assert isinstance(decoded, np.ndarray)
        assert decoded.dtype == expected.dtype and decoded.shape == expected.shape
        np.testing.assert_array_equal(decoded, expected)
    elif isinstance(expected, dict):
        assert isinstance(decoded, dict) and list(decoded) == list(expected)
        for k in expected:
            assert_same(decoded[k], expected[k])
    elif isinstance(expected, list):
        assert isinstance(decoded, list) and len(decoded) == len(expected)
        for a, b in zip(decoded, expected):
            assert_same(a, b)
    else:
        assert type(decoded) is type(expected) and decoded == expected


@pytest.mark.parametrize("vector", VECTORS["valid"], ids=lambda v: v["name"])
def test_valid_vector_round_trips(vector):
    raw = bytes.fromhex(vector["hex"])
    meaning = vector["meaning"]
    buf = p.FrameBuffer()
    buf.feed(raw)
    msg_type, request_id, payload = buf.next_frame()
    assert (msg_type, request_id) == (meaning["msg_type"], meaning["request_id"])
    assert_same(payload, to_wire(meaning["payload"]))
    assert buf.buffered == 0
    # and back to the very same bytes
    assert p.encode_frame(msg_type, request_id, to_wire(meaning["payload"])) == raw


@pytest.mark.parametrize("vector", VECTORS["invalid"], ids=lambda v: v["name"])
def test_invalid_vector_is_refused(vector):
    buf = p.FrameBuffer()
    buf.feed(bytes.fromhex(vector["hex"]))
    if vector["error"] == "Incomplete":
        assert buf.missing() > 0 and buf.next_frame() is None
        return
    with pytest.raises(getattr(errors, vector["error"])):
        buf.next_frame()


def test_every_message_type_has_a_vector_and_round_trips():
    covered = {v["meaning"]["msg_type"] for v in VECTORS["valid"]}
    assert {int(m) for m in p.MsgType} <= covered
    assert VECTORS["msg_types"] == {m.name: int(m) for m in p.MsgType}
    for m in p.MsgType:
        buf = p.FrameBuffer()
        buf.feed(p.encode_frame(m, 77, {"x": [1, "a", b"b", 2.5, None]}))
        assert buf.next_frame() == (int(m), 77, {"x": [1, "a", b"b", 2.5, None]})


def test_docs_table_agrees_with_the_enum():
    text = (ROOT / "docs" / "protocol.md").read_text()
    rows = dict(re.findall(r"^\| ([A-Z]+) \| (\d+) \|", text, flags=re.M))
    assert {k: int(v) for k, v in rows.items()} == {m.name: int(m) for m in p.MsgType}
    assert "(version %d)" % p.PROTOCOL_VERSION in text
    assert p.PROTOCOL_MAGIC in text


@pytest.mark.parametrize("dtype", sorted(dtypes.WIRE_DTYPES))
def test_tensor_ext_round_trips_every_dtype(dtype):
    rng = np.random.default_rng(0)
    arr = (rng.standard_normal((3, 4, 5)) * 50).astype(dtype)
    buf = p.FrameBuffer()
    buf.feed(p.encode_frame(p.MsgType.RETURN, 1, {"value": arr, "empty": np.zeros((0, 3), dtype)}))
    _, _, payload = buf.next_frame()
    np.testing.assert_array_equal(payload["value"], arr)
    assert payload["value"].dtype == arr.dtype and payload["empty"].shape == (0, 3)


def test_non_contiguous_and_big_endian_arrays_are_sent_by_value():
    arr = np.arange(20, dtype=">i4").reshape(4, 5)[:, ::2]
    buf = p.FrameBuffer()
    buf.feed(p.encode_frame(p.MsgType.CALL, 1, {"a": arr}))
    np.testing.assert_array_equal(buf.next_frame()[2]["a"], arr)


def test_unsendable_objects_and_dtypes_are_refused():
    with pytest.raises(TypeError, match="cannot send"):
        p.encode_frame(p.MsgType.CALL, 1, {"x": object()})
    with pytest.raises(errors.ProtocolError, match="complex64"):
        p.encode_frame(p.MsgType.CALL, 1, {"x": np.zeros(2, np.complex64)})


def test_oversized_header_is_refused_before_allocating():
    buf = p.FrameBuffer(p.Limits(max_frame=1000))
    buf.feed(p.HEADER.pack(1001))
    size_before = len(buf._buf)
    with pytest.raises(errors.FrameTooLarge, match="1001"):
        buf.missing()
    assert len(buf._buf) == size_before


def test_limits_on_depth_strings_and_arrays():
    deep = 1
    for _ in range(40):
        deep = [deep]
    buf = p.FrameBuffer()
    buf.feed(p.encode_frame(p.MsgType.CALL, 1, {"a": deep}))
    with pytest.raises(errors.ProtocolError, match="deeper"):
        buf.next_frame()
    small = p.Limits(max_str=10, max_array=4)
    for payload in ({"s": "x" * 11}, {"a": [1, 2, 3, 4, 5]}):
        buf = p.FrameBuffer(small)
        buf.feed(p.encode_frame(p.MsgType.CALL, 1, payload))
        with pytest.raises(errors.ProtocolError):
            buf.next_frame()


def test_bulk_size_is_checked_against_the_limit():
    assert p.bulk_size({"nbytes": 10}) == 10
    assert p.bulk_size({}) == 0
    with pytest.raises(errors.FrameTooLarge):
        p.bulk_size({"nbytes": 11}, p.Limits(max_bulk=10))
    for bad in (-1, "3", 1.5):
        with pytest.raises(errors.ProtocolError):
            p.bulk_size({"nbytes": bad})


def test_frames_split_and_coalesced_over_a_real_socket():
    """Frames + bulk over a socketpair: many small frames in one recv, bulk read straight into a numpy array."""
    a, b = socket.socketpair()
    a.settimeout(5)
    b.settimeout(5)
    try:
        big = np.arange(1 << 20, dtype=np.float32)
        sender = threading.Thread(target=lambda: [
            transport.send_frame(a, p.MsgType.EVENT, i, {"kind": "log", "line": "l%d" % i}) for i in range(100)
        ] + [transport.send_frame(a, p.MsgType.RETURN, 100, {"value": None}, bulk=big),
             transport.send_frame(a, p.MsgType.CLOSE, 0, {})])
        sender.start()
        reader = transport.FrameReader(b)
        for i in range(100):
            assert reader.read_frame() == (p.MsgType.EVENT, i, {"kind": "log", "line": "l%d" % i})
        t, rid, payload = reader.read_frame()
        assert (t, rid, payload["nbytes"]) == (p.MsgType.RETURN, 100, big.nbytes)
        out = np.empty_like(big)
        reader.read_into(memoryview(out))
        np.testing.assert_array_equal(out, big)
        assert reader.read_frame()[0] == p.MsgType.CLOSE
        sender.join(5)
        a.close()
        with pytest.raises(errors.ConnectionClosed):
            reader.read_frame()
    finally:
        a.close()
        b.close()


def test_reader_times_out():
    a, b = socket.socketpair()
    b.settimeout(0.05)
    try:
        with pytest.raises(errors.TetherTimeout):
            transport.FrameReader(b).read_frame()
    finally:
        a.close()
        b.close()


def test_handshake_helpers():
    hello = handshake.check_hello(handshake.hello_payload(match="m1", wait=False))
    assert hello["match"] == "m1" and hello["wait"] is False
    with pytest.raises(errors.VersionMismatch, match=r"version 99.*version 1"):
        handshake.check_hello(handshake.hello_payload(version=99))
    with pytest.raises(errors.ProtocolError, match="magic"):
        handshake.check_hello({"magic": "GET / HTTP", "version": 1})
    ns, nc = handshake.make_nonce(), handshake.make_nonce()
    assert ns != nc and len(ns) == handshake.NONCE_SIZE
    mac = handshake.client_mac("secret", ns, nc)
    assert handshake.check_auth("secret", ns, {"nonce": nc, "mac": mac}) == nc
    with pytest.raises(errors.AuthenticationError):
        handshake.check_auth("other", ns, {"nonce": nc, "mac": mac})
    with pytest.raises(errors.AuthenticationError):
        handshake.check_auth("secret", ns, {"nonce": b"short", "mac": mac})
    assert handshake.server_proof("secret", ns, nc) != mac
    assert not handshake.macs_equal("str", "str")


def test_docs_list_every_built_in_function():
    from tether_rpc.session import BUILTINS

    text = (ROOT / "docs" / "protocol.md").read_text()
    missing = [name for name in BUILTINS if "`%s`" % name not in text]
    assert not missing, "docs/protocol.md does not document: %s" % missing
