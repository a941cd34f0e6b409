"""What docs/protocol.md states about errors, msgpack details, built-ins and events, checked against real servers.

Each test names the section it pins. Raw sockets speak the protocol by hand, so the bytes on the wire are what is
checked, not what the Python client makes of them.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import pathlib
import re
import socket
import time

import msgpack
import numpy as np
import pytest

from fixtures.polling import HANG_S, wait_until
from tether import rpc
from tether_rpc import dtypes, errors, handshake, protocol as p, transport
from tether_rpc.worker import _Channel, _EventLines
from test_java_protocol import _nested  # a payload nested n levels deep

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOC = (ROOT / "docs" / "protocol.md").read_text()
VECTORS = json.loads((ROOT / "tests" / "vectors" / "frames.json").read_text())
VALID = {v["name"]: v for v in VECTORS["valid"]}


def connect_raw(server, hello=None, handshaken=True):
    """A raw connection after HELLO (and, with ``handshaken``, after reading WELCOME): (sock, reader)."""
    sock = socket.create_connection((server.host, server.port), timeout=10)
    transport.configure_socket(sock)
    reader = transport.FrameReader(sock)
    sock.sendall(p.encode_frame(p.MsgType.HELLO, 0, hello or handshake.hello_payload()))
    if handshaken:
        read_welcome(reader)
    return sock, reader


def read_welcome(reader) -> dict:
    while True:  # (queued behind the previous test's session for a moment, maybe)
        msg_type, _, payload = reader.read_frame()
        if msg_type == p.MsgType.WELCOME:
            return payload
        assert (msg_type, payload["kind"]) == (p.MsgType.EVENT, "queued")


def read_raw_body(sock) -> bytes:
    """One frame's body exactly as the server encoded it."""
    header = b""
    while len(header) < 4:
        chunk = sock.recv(4 - len(header))
        assert chunk, "connection closed"
        header += chunk
    (n,) = p.HEADER.unpack(header)
    body = b""
    while len(body) < n:
        chunk = sock.recv(n - len(body))
        assert chunk, "connection closed"
        body += chunk
    return body


def error_then_closed(sock, reader):
    """The ERROR the server sends before closing: (request_id, payload); fails if the connection stays open."""
    msg_type, rid, payload = reader.read_frame()
    assert msg_type == p.MsgType.ERROR, (msg_type, payload)
    sock.settimeout(5)
    with pytest.raises((errors.ConnectionClosed, ConnectionResetError)):
        reader.read_frame()
    return rid, payload


def load_function(sock, reader, so_path, name):
    transport.send_frame(sock, p.MsgType.CALL, 1, {"fn": "tether.upload", "args": [so_path.name]},
                         bulk=so_path.read_bytes())
    assert reader.read_frame()[0] == p.MsgType.RETURN
    sock.sendall(p.encode_frame(p.MsgType.CALL, 2, {"fn": "tether.module.load", "args": [so_path.name]}))
    module = reader.read_frame()[2]["value"]["handle"]
    sock.sendall(p.encode_frame(p.MsgType.CALL, 3, {"fn": "tether.module.get_function", "args": [module, name]}))
    return reader.read_frame()[2]["value"]["handle"]


# -- Errors -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("payload", [
    {"fn": 3, "args": []},                                  # fn neither a name nor a handle (the fast path)
    {"args": [1]},                                          # no fn at all
    {"fn": "tether.echo", "args": "not a list"},
    {"fn": "tether.echo", "args": [1], "nbytes": -1},
    {"fn": "tether.echo", "args": [1], "nbytes": "12"},
], ids=["fn_int", "fn_missing", "args_not_list", "nbytes_negative", "nbytes_str"])
def test_a_malformed_call_gets_a_fatal_protocol_error_on_its_own_id(rpc_server, payload):
    sock, reader = connect_raw(rpc_server)
    try:
        sock.sendall(p.encode_frame(p.MsgType.CALL, 77, payload))
        rid, err = error_then_closed(sock, reader)
        assert (rid, err["type"]) == (77, "ProtocolError")
    finally:
        sock.close()


def test_bulk_over_the_limit_is_frame_too_large_on_the_calls_id(rpc_server):
    sock, reader = connect_raw(rpc_server)
    try:
        sock.sendall(p.encode_frame(p.MsgType.CALL, 78, {"fn": "tether.upload", "args": ["x"],
                                                         "nbytes": p.DEFAULT_LIMITS.max_bulk + 1}))
        rid, err = error_then_closed(sock, reader)
        assert (rid, err["type"]) == (78, "FrameTooLarge")
    finally:
        sock.close()


@pytest.mark.parametrize("when", ["before_hello", "in_session"])
def test_an_error_frame_from_a_client_is_refused(rpc_server, when):
    sock = socket.create_connection((rpc_server.host, rpc_server.port), timeout=10)
    reader = transport.FrameReader(sock)
    try:
        if when == "in_session":
            sock.sendall(p.encode_frame(p.MsgType.HELLO, 0, handshake.hello_payload()))
            assert reader.read_frame()[0] == p.MsgType.WELCOME
        sock.sendall(p.encode_frame(p.MsgType.ERROR, 5, {"type": "ValueError", "message": "x", "traceback": ""}))
        rid, err = error_then_closed(sock, reader)
        assert (rid, err["type"]) == (0, "ProtocolError")
        assert "message type 7" in err["message"]
    finally:
        sock.close()
    assert "| ERROR | 7 | server -> client |" in DOC


def test_a_remote_exception_keeps_the_session_open(rpc_server):
    sock, reader = connect_raw(rpc_server)
    try:
        sock.sendall(p.encode_frame(p.MsgType.CALL, 9, {"fn": "tether.array.empty", "args": [[2], "complex64"]}))
        msg_type, rid, err = reader.read_frame()
        assert (msg_type, rid, err["type"]) == (p.MsgType.ERROR, 9, "KernelError")  # no kernel takes complex64
        sock.sendall(p.encode_frame(p.MsgType.CALL, 10, {"fn": "tether.echo", "args": ["still here"]}))
        assert reader.read_frame() == (p.MsgType.RETURN, 10, {"value": "still here"})
    finally:
        sock.close()


def test_the_handshake_timeout_sends_tether_timeout(make_rpc_server):
    server = make_rpc_server("--handshake-timeout", "0.5")
    sock = socket.create_connection((server.host, server.port), timeout=HANG_S)
    try:
        t0 = time.monotonic()
        rid, err = error_then_closed(sock, transport.FrameReader(sock))
        assert (rid, err["type"]) == (0, "TetherTimeout")   # the server's timeout, sent to us
        assert 0.4 < time.monotonic() - t0                  # and not before it ran out
    finally:
        sock.close()


def test_device_busy_closes_the_connection(rpc_server):
    first, _ = connect_raw(rpc_server)
    try:
        sock, reader = connect_raw(rpc_server, handshake.hello_payload(wait=False), handshaken=False)
        try:
            rid, err = error_then_closed(sock, reader)
            assert (rid, err["type"]) == (0, "DeviceBusy")
        finally:
            sock.close()
    finally:
        first.close()
    wait_until(lambda: not rpc_server.worker_pids(), HANG_S, "the first session to end")


def test_every_well_known_error_type_is_in_the_errors_table():
    section = DOC.split("### Errors", 1)[1].split("###", 1)[0]
    listed = set(re.findall(r"^\| `(\w+)` \|", section, flags=re.M))
    known = {v for k, v in vars(p.ErrorType).items() if k.isupper()}
    assert known <= listed, known - listed


# -- msgpack details --------------------------------------------------------------------------------------------
def test_floats_travel_as_float64_both_ways(rpc_server):
    assert VALID["call_echo_float_2"]["hex"].endswith("cb4000000000000000")
    sock, reader = connect_raw(rpc_server)
    try:
        # a float32 (ca) is accepted, and every float the server sends is a float64 (cb)
        body = msgpack.packb([5, 4, {"fn": "tether.echo", "args": [1.5]}], use_single_float=True)
        assert b"\xca\x3f\xc0\x00\x00" in body
        sock.sendall(p.HEADER.pack(len(body)) + body)
        reply = read_raw_body(sock)
        assert reply == msgpack.packb([6, 4, {"value": 1.5}]) and b"\xcb\x3f\xf8" in reply
    finally:
        sock.close()


def test_request_ids_are_u64_and_pipelined_calls_run_in_order(rpc_server):
    ids = [(1 << 64) - 1, 5, 1, 1 << 40]
    sock, reader = connect_raw(rpc_server)
    try:
        sock.sendall(b"".join(p.encode_frame(p.MsgType.CALL, rid, {"fn": "tether.echo", "args": [i]})
                              for i, rid in enumerate(ids)))
        assert [reader.read_frame() for _ in ids] == [(p.MsgType.RETURN, rid, {"value": i})
                                                      for i, rid in enumerate(ids)]
    finally:
        sock.close()
    body = msgpack.packb([5, -1, {"fn": "tether.echo", "args": []}])
    buf = p.FrameBuffer()
    buf.feed(p.HEADER.pack(len(body)) + body)
    with pytest.raises(errors.ProtocolError):
        buf.next_frame()


def test_nesting_depth_counts_from_the_payload_map():
    assert "`{\"a\": [[1]]}` is 3 levels deep" in DOC
    for limits in (p.DEFAULT_LIMITS, p.HANDSHAKE_LIMITS):
        deepest = p.encode_frame(p.MsgType.CALL, 1, _nested(limits.max_depth))
        buf = p.FrameBuffer(limits)
        buf.feed(deepest)
        assert buf.next_frame()[2] == _nested(limits.max_depth)
        buf.feed(p.encode_frame(p.MsgType.CALL, 1, _nested(limits.max_depth + 1)))
        with pytest.raises(errors.ProtocolError, match="deeper"):
            buf.next_frame()
    # a tensor is a leaf: it adds no level
    buf = p.FrameBuffer(p.Limits(max_depth=2))
    buf.feed(p.encode_frame(p.MsgType.CALL, 1, {"a": [np.zeros((2, 2), "float32")]}))
    assert buf.next_frame()[2]["a"][0].shape == (2, 2)


def test_auth_vectors_follow_from_the_utf8_token():
    (ex,) = VECTORS["auth_exchanges"]
    key = ex["token"].encode("utf-8")
    assert key != ex["token"].encode("latin-1", "replace")  # a token whose bytes depend on the encoding
    ns, nc = bytes.fromhex(ex["server_nonce"]), bytes.fromhex(ex["client_nonce"])
    assert hmac.new(key, b"tether-auth-v1/client" + ns + nc, hashlib.sha256).hexdigest() == ex["mac"]
    assert hmac.new(key, b"tether-auth-v1/server" + nc + ns, hashlib.sha256).hexdigest() == ex["proof"]
    frames = {}
    for name in ex["frames"]:
        buf = p.FrameBuffer()
        buf.feed(bytes.fromhex(VALID[name]["hex"]))
        frames[name] = buf.next_frame()
    kinds = [f[0] for f in frames.values()]
    assert kinds == [p.MsgType.HELLO, p.MsgType.CHALLENGE, p.MsgType.AUTH, p.MsgType.WELCOME]
    challenge, auth, welcome = (f[2] for f in list(frames.values())[1:])
    assert challenge["nonce"] == ns and auth["nonce"] == nc and auth["mac"].hex() == ex["mac"]
    assert welcome["proof"].hex() == ex["proof"] and welcome["caps"] == list(p.CAPABILITIES)
    assert handshake.check_auth(ex["token"], ns, auth) == nc  # the server's own check accepts it


def test_a_non_ascii_token_authenticates_against_a_real_server(make_rpc_server):
    token = VECTORS["auth_exchanges"][0]["token"]
    server = make_rpc_server("--token", token)
    with rpc.connect(server.host, server.port, token=token, timeout=10) as remote:
        assert remote.get_function("tether.echo")("ok") == "ok"
    with pytest.raises(errors.AuthenticationError):
        rpc.connect(server.host, server.port, token=token.encode("utf-8").decode("latin-1"), timeout=10)


# -- built-ins, caps and events ---------------------------------------------------------------------------------
def test_welcome_caps_are_the_documented_five(rpc_server):
    sock = socket.create_connection((rpc_server.host, rpc_server.port), timeout=10)
    reader = transport.FrameReader(sock)
    try:
        sock.sendall(p.encode_frame(p.MsgType.HELLO, 0, handshake.hello_payload(caps=["no-such-cap"])))
        assert read_welcome(reader)["caps"] == list(p.CAPABILITIES)
    finally:
        sock.close()
    for cap in p.CAPABILITIES:
        assert "`%s`" % cap in DOC


def test_device_array_dtypes_are_the_documented_ones():
    line = re.search(r"Device arrays, and so tensors passed to a kernel, take the dtypes `([^`]+)`",
                     DOC.replace("\n  ", " ")).group(1)
    assert set(line.split()) == set(dtypes.ARRAY_DTYPES)
    assert dtypes.WIRE_DTYPES == dtypes.ARRAY_DTYPES == set(dtypes.DTYPES)


def test_kernel_call_returns_tensors_after_value(rpc_server, rpc_kernels):
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal(1024).astype("float32"), rng.standard_normal(1024).astype("float32")
    sock, reader = connect_raw(rpc_server)
    try:
        vadd = load_function(sock, reader, rpc_kernels["vadd"], "vadd")
        sock.sendall(p.encode_frame(p.MsgType.CALL, 20, {"fn": vadd, "args": [a, b, np.zeros(1024, "float32")]}))
        msg_type, rid, ret = reader.read_frame()
        assert (msg_type, rid, list(ret)) == (p.MsgType.RETURN, 20, ["value", "tensors"])
        assert ret["value"] is None
        np.testing.assert_array_equal(ret["tensors"][0], a)
        np.testing.assert_array_equal(ret["tensors"][2], a + b)
    finally:
        sock.close()


def test_time_evaluator_options_defaults_and_samples(rpc_server, rpc_kernels):
    sock, reader = connect_raw(rpc_server)
    try:
        spin = load_function(sock, reader, rpc_kernels["misc"], "spin")

        def evaluate(rid, options):
            sock.sendall(p.encode_frame(p.MsgType.CALL, rid, {"fn": "tether.time_evaluator",
                                                              "args": [spin, [20000], options]}))
            frames = []
            while not frames or frames[-1][0] == p.MsgType.EVENT:
                frames.append(reader.read_frame())
            assert {f[1] for f in frames} == {rid}
            ret = frames[-1][2]["value"]
            events = [f[2] for f in frames[:-1]]
            assert [list(e) for e in events] == [["kind", "index", "seconds"]] * len(events)  # kind first
            assert [e["seconds"] for e in events] == ret["samples"]
            return ret

        ret = evaluate(30, {})
        assert ret["number"] == 10 and len(ret["samples"]) == 3  # the defaults
        # a sample is the mean of one call: it does not grow with number
        one = min(evaluate(31, {"number": 1, "repeat": 5})["samples"])
        many = min(evaluate(32, {"number": 8, "repeat": 5})["samples"])
        assert 0.3 < many / one < 3, (one, many)
        raised = evaluate(33, {"number": 1, "repeat": 2, "min_repeat_ms": 30})
        assert raised["number"] > 1 and max(raised["samples"]) * raised["number"] > 0.015
        sock.sendall(p.encode_frame(p.MsgType.CALL, 34, {"fn": "tether.time_evaluator",
                                                         "args": [spin, [1], {"numbr": 3}]}))
        assert reader.read_frame()[2]["type"] == "TypeError"
    finally:
        sock.close()


def test_event_vectors_have_the_key_order_the_server_sends(rpc_server, rpc_kernels):
    def vector_keys(name):
        return list(VALID[name]["meaning"]["payload"])

    # queued: a waiting client's event from a real server
    first, _ = connect_raw(rpc_server)
    try:
        sock, reader = connect_raw(rpc_server, handshaken=False)
        try:
            msg_type, rid, event = reader.read_frame()
            assert (msg_type, rid, list(event)) == (p.MsgType.EVENT, 0, vector_keys("event_queued"))
        finally:
            sock.close()
    finally:
        first.close()
    wait_until(lambda: not rpc_server.worker_pids(), HANG_S, "the first session to end")
    # sample: from time_evaluator
    sock, reader = connect_raw(rpc_server)
    try:
        nop = load_function(sock, reader, rpc_kernels["misc"], "nop")
        sock.sendall(p.encode_frame(p.MsgType.CALL, 4, {"fn": "tether.time_evaluator", "args": [nop, [], {}]}))
        msg_type, rid, event = reader.read_frame()
        assert (msg_type, list(event)) == (p.MsgType.EVENT, vector_keys("event_sample"))
    finally:
        sock.close()
    # log: the worker's stdout stream, over a real socket pair, byte for byte
    a, b = socket.socketpair()
    try:
        channel = _Channel(a)
        channel.request_id = 4
        stream = _EventLines(channel, "stdout")
        stream.write("hel")  # a partial line is held back until its newline
        b.settimeout(0.05)
        with pytest.raises(socket.timeout):
            b.recv(1)
        b.settimeout(5)
        stream.write("lo\n")
        body = read_raw_body(b)
        assert p.HEADER.pack(len(body)) + body == bytes.fromhex(VALID["event_log"]["hex"])
    finally:
        a.close()
        b.close()


def test_builtin_examples_of_the_doc_over_a_real_server(rpc_server, rpc_kernels):
    """The example frames of docs/protocol.md's "Built-in functions", replayed: same payload keys and values."""
    sock, reader = connect_raw(rpc_server)

    def call(rid, fn, args, bulk=None):
        transport.send_frame(sock, p.MsgType.CALL, rid, {"fn": fn, "args": args}, bulk=bulk)
        msg_type, got, payload = reader.read_frame()
        assert (msg_type, got) == (p.MsgType.RETURN, rid), payload
        data = reader.read_bulk(payload["nbytes"]) if "nbytes" in payload else None
        return payload, data

    vadd = rpc_kernels["vadd"].read_bytes()
    try:
        assert call(1, "tether.echo", [1, "a"]) == ({"value": [1, "a"]}, None)
        names = call(2, "tether.functions", [])[0]["value"]
        assert names == sorted(names) and names[0] == "tether.array.copy_in"
        ret = call(3, "tether.array.empty", [[2, 3], "float32"])[0]["value"]
        assert list(ret) == ["handle", "shape", "dtype"] and ret["shape"] == [2, 3] and ret["dtype"] == "float32"
        ret = call(4, "tether.array.from_tensor", [np.array([1, 2], "int32")])[0]["value"]
        assert (ret["shape"], ret["dtype"]) == ([2], "int32")
        arr = ret["handle"]
        transport.send_frame(sock, p.MsgType.CALL, 5, {"fn": "tether.array.copy_in", "args": [arr], "nbytes": 8},
                             bulk=np.array([7, 9], "<i4").tobytes())
        assert reader.read_frame() == (p.MsgType.RETURN, 5, {"value": None})
        payload, data = call(6, "tether.array.copy_out", [arr])
        assert payload == {"value": None, "nbytes": 8} and bytes(data) == np.array([7, 9], "<i4").tobytes()
        assert call(7, "tether.free", [arr]) == ({"value": None}, None)
        transport.send_frame(sock, p.MsgType.CALL, 8, {"fn": "tether.upload", "args": ["vadd.so"]}, bulk=vadd)
        assert reader.read_frame() == (p.MsgType.RETURN, 8, {"value": {"name": "vadd.so", "size": len(vadd)}})
        payload, data = call(9, "tether.download", ["vadd.so"])
        assert payload == {"value": {"name": "vadd.so", "size": len(vadd)}, "nbytes": len(vadd)}
        assert bytes(data) == vadd
        assert call(10, "tether.listdir", []) == ({"value": ["vadd.so"]}, None)
        ret = call(12, "tether.module.load", ["vadd.so"])[0]["value"]
        assert list(ret) == ["handle", "functions", "metadata"] and "vadd" in ret["functions"]
        assert [f["name"] for f in ret["metadata"]["functions"]] == ret["functions"]
        ret = call(13, "tether.module.get_function", [ret["handle"], "vadd"])[0]["value"]
        assert list(ret) == ["handle", "name"] and ret["name"] == "vadd"
        assert isinstance(ret["handle"], p.RemoteHandle)
        assert call(11, "tether.remove", ["vadd.so"]) == ({"value": None}, None)
        assert call(14, "tether.listdir", []) == ({"value": []}, None)
    finally:
        sock.close()
