"""The tracker protocol module on its own: docs in step with the enum, payload checks, pattern matching."""
from __future__ import annotations

import pathlib
import re

import pytest

from tether_rpc import protocol as p
from tether_rpc.errors import ProtocolError
from tether_rpc.tracker_protocol import (TrackerMsg, check_hello, check_register, check_request, hello_payload,
                                         parse_pattern, pattern_matches)

DOC = (pathlib.Path(__file__).resolve().parents[1] / "docs" / "tracker.md").read_text()


def test_docs_list_every_message_type_with_its_value():
    rows = dict(re.findall(r"^\| ([A-Z_]+) \| (\d+) \|", DOC, re.M))
    assert rows == {m.name: str(m.value) for m in TrackerMsg}


def test_tracker_types_stay_in_their_reserved_range():
    assert all(p.TRACKER_TYPE_MIN <= m <= p.TRACKER_TYPE_MAX for m in TrackerMsg)
    assert not {int(m) for m in TrackerMsg} & {int(m) for m in p.MsgType}


def test_hello_round_trip_and_refusals():
    frame = p.encode_frame(TrackerMsg.HELLO, 0, hello_payload("device", "pi"))
    buf = p.FrameBuffer(p.HANDSHAKE_LIMITS)
    buf.feed(frame)
    msg_type, rid, payload = buf.next_frame()
    assert (msg_type, rid) == (TrackerMsg.HELLO, 0)
    assert check_hello(payload) == {"role": "device", "name": "pi"}
    with pytest.raises(ProtocolError, match="magic"):
        check_hello(dict(payload, magic="tether-rpc"))
    with pytest.raises(ProtocolError, match="version"):
        check_hello(dict(payload, version=2))
    with pytest.raises(ProtocolError, match="role"):
        check_hello(dict(payload, role="admin"))


@pytest.mark.parametrize("payload, message", [
    ({"port": 9090}, "key"),
    ({"key": "", "port": 9090}, "key"),
    ({"key": "pi"}, "port"),
    ({"key": "pi", "port": 70000}, "TCP port"),
    ({"key": "pi", "port": "9090"}, "wrong type"),
    ({"key": "pi", "port": 9090, "tags": {"a": [1]}}, "tags"),
    ({"key": "pi", "port": 9090, "state": "dancing"}, "state"),
    ({"key": "pi", "port": True}, "wrong type"),
])
def test_register_refuses_malformed_payloads(payload, message):
    with pytest.raises(ProtocolError, match=message):
        check_register(payload)


def test_register_and_request_defaults():
    reg = check_register({"key": "phone", "reverse": True, "tags": {"lab": 12}})
    assert reg == {"key": "phone", "port": 0, "host": None, "tags": {"lab": "12"}, "info": {}, "reverse": True,
                   "state": "free"}
    assert check_request({"key": "rasp*"}) == {"key": "rasp*", "priority": 1, "wait_timeout": 60.0,
                                               "session_timeout": 600.0, "ticket": ""}
    assert check_request({"key": "pi", "ticket": "abc"})["ticket"] == "abc"
    for bad in ({"wait_timeout": -1}, {"wait_timeout": float("inf")}, {"priority": float("nan")},
                {"session_timeout": 0}, {"session_timeout": 1e12}, {"priority": "high"}, {"ticket": 5},
                {"ticket": "x" * 65}):
        with pytest.raises(ProtocolError):
            check_request(dict({"key": "pi"}, **bad))


@pytest.mark.parametrize("pattern, key, tags, expected", [
    ("rasp4b", "rasp4b", {}, True),
    ("rasp4b", "rasp4", {}, False),
    ("rasp*", "rasp5", {}, True),
    ("rasp*", "jetson", {}, False),
    ("arch=aarch64", "anything", {"arch": "aarch64"}, True),
    ("arch=aarch64", "anything", {"arch": "armv7l"}, False),
    ("arch=aarch64", "anything", {}, False),
    ("rasp*,board=pi4", "rasp4b", {"board": "pi4"}, True),
    ("rasp*,board=pi4", "rasp4b", {"board": "pi5"}, False),
    ("arch=arm*", "x", {"arch": "armv7l"}, True),
])
def test_pattern_matching(pattern, key, tags, expected):
    assert pattern_matches(parse_pattern(pattern), key, tags) is expected
