"""Regenerate tests/vectors/frames.json from the meanings below (run only when the wire format changes on purpose).

The JSON file, not this script, is the reference: every implementation (Python, the Android app's Java) must
decode each ``valid`` frame's hex to its meaning, encode the meaning back to the same bytes, and reject each
``invalid`` frame with the named error (``Incomplete``: the decoder must wait for more bytes).

JSON encoding of a meaning's values: numbers, strings, booleans, null, lists and maps as themselves;
``{"$bin": hex}`` for msgpack bin; ``{"$tensor": {"dtype", "shape", "data": hex}}`` for ext 1 (little-endian
element bytes); ``{"$handle": id}`` for ext 2; ``{"$float": x}`` for every msgpack float, so a reader whose JSON
(or whose language) does not tell 2.0 from 2 still knows which values are floats: a bare JSON number in a meaning
is always an int.
"""
from __future__ import annotations

import json
import pathlib

from tether_rpc import handshake, protocol as p
from tether_rpc.dtypes import for_host, name_of, numpy_dtype, storage_of

HERE = pathlib.Path(__file__).parent

NONCE_S = "00" * 31 + "01"
NONCE_C = "ff" * 31 + "02"

# A whole authenticated handshake with a known token and nonces. The token is not ASCII: its UTF-8 bytes are the
# HMAC key (docs/protocol.md, "Handshake").
AUTH_TOKEN = "s3cret-tök€n"
AUTH_NONCE_S = bytes(range(32)).hex()
AUTH_NONCE_C = bytes(range(255, 223, -1)).hex()
AUTH_MAC = handshake.client_mac(AUTH_TOKEN, bytes.fromhex(AUTH_NONCE_S), bytes.fromhex(AUTH_NONCE_C)).hex()
AUTH_PROOF = handshake.server_proof(AUTH_TOKEN, bytes.fromhex(AUTH_NONCE_S), bytes.fromhex(AUTH_NONCE_C)).hex()
AUTH_EXCHANGE = [
    ("auth_exchange_hello", p.MsgType.HELLO, 0, {"magic": "tether-rpc", "version": 1, "caps": ["auth-hmac-sha256"],
                                                 "wait": True, "client": "tether-py"}),
    ("auth_exchange_challenge", p.MsgType.CHALLENGE, 0, {"algo": "hmac-sha256", "nonce": {"$bin": AUTH_NONCE_S}}),
    ("auth_exchange_auth", p.MsgType.AUTH, 0, {"nonce": {"$bin": AUTH_NONCE_C}, "mac": {"$bin": AUTH_MAC}}),
    ("auth_exchange_welcome", p.MsgType.WELCOME, 0, {"version": 1, "caps": list(p.CAPABILITIES),
                                                     "server": "tether-rpc/0.1.0", "session": 1,
                                                     "proof": {"$bin": AUTH_PROOF}}),
]

VALID = [
    ("hello", p.MsgType.HELLO, 0, {"magic": "tether-rpc", "version": 1, "caps": ["bulk", "events"], "wait": True,
                                   "client": "tether-java"}),
    ("hello_with_match", p.MsgType.HELLO, 0, {"magic": "tether-rpc", "version": 1, "caps": [], "wait": False,
                                              "client": "x", "match": "grant-1234"}),
    ("challenge", p.MsgType.CHALLENGE, 0, {"algo": "hmac-sha256", "nonce": {"$bin": NONCE_S}}),
    ("auth", p.MsgType.AUTH, 0, {"nonce": {"$bin": NONCE_C}, "mac": {"$bin": "ab" * 32}}),
    ("welcome", p.MsgType.WELCOME, 0, {"version": 1, "caps": ["bulk"], "server": "tether-rpc/0.1.0",
                                       "session": 3}),
    ("call_echo", p.MsgType.CALL, 1, {"fn": "tether.echo", "args": [1]}),
    ("call_echo_values", p.MsgType.CALL, 2, {"fn": "tether.echo", "args": [
        -1, 300, 1 << 40, 1.5, "héllo", None, True, {"$bin": "00ff"}, [1, [2, {"k": "v"}]]]}),
    ("call_handle", p.MsgType.CALL, 9, {"fn": {"$handle": 42}, "args": [{"$handle": 1}, {"$handle": 2}]}),
    ("call_tensor", p.MsgType.CALL, 10, {"fn": "tether.echo", "args": [
        {"$tensor": {"dtype": "float32", "shape": [2, 2], "data": "0000803f000000400000404000008040"}}]}),
    ("call_tensor_int8_scalar", p.MsgType.CALL, 11, {"fn": "tether.echo", "args": [
        {"$tensor": {"dtype": "int8", "shape": [], "data": "fe"}}]}),
    ("call_tensor_uint8_scalar", p.MsgType.CALL, 14, {"fn": "tether.echo", "args": [
        {"$tensor": {"dtype": "uint8", "shape": [], "data": "c8"}}]}),
    # bfloat16 1.0, -2.5, 3.0: each element the upper half of its float32, little-endian
    ("call_tensor_bfloat16", p.MsgType.CALL, 16, {"fn": "tether.echo", "args": [
        {"$tensor": {"dtype": "bfloat16", "shape": [3], "data": "803f20c04040"}}]}),
    ("call_echo_float_2", p.MsgType.CALL, 15, {"fn": "tether.echo", "args": [2.0]}),  # float64, always
    ("call_copy_in_bulk_header", p.MsgType.CALL, 12, {"fn": "tether.array.copy_in", "args": [{"$handle": 7}],
                                                      "nbytes": 4096}),
    ("return_value", p.MsgType.RETURN, 1, {"value": 1}),
    ("return_bulk_header", p.MsgType.RETURN, 13, {"value": None, "nbytes": 65536}),
    ("error", p.MsgType.ERROR, 5, {"type": "ValueError", "message": "bad", "traceback": "Traceback ...\n"}),
    ("error_crash", p.MsgType.ERROR, 0, {"type": "SessionCrashed",
                                         "message": "the session worker died from signal 11 (SIGSEGV)",
                                         "traceback": ""}),
    ("event_sample", p.MsgType.EVENT, 4, {"kind": "sample", "index": 0, "seconds": 0.00125}),
    ("event_log", p.MsgType.EVENT, 4, {"kind": "log", "stream": "stdout", "line": "hello"}),
    ("event_progress", p.MsgType.EVENT, 6, {"kind": "progress", "done": 512, "total": 1024}),
    ("event_queued", p.MsgType.EVENT, 0, {"kind": "queued", "position": 1}),
    ("close", p.MsgType.CLOSE, 0, {"reason": "bye"}),
    ("tracker_range_type", 64, 3, {"key": "rasp4b"}),
    # arrays on GPUs (docs/protocol.md, "Device arrays on GPUs"): the device argument, the RETURN's device key,
    # the device-to-device copy and the two refusals a client must show as they are
    ("call_array_empty_device", p.MsgType.CALL, 17, {"fn": "tether.array.empty",
                                                     "args": [[2, 2], "float32", "opencl:0"]}),
    ("return_array_device", p.MsgType.RETURN, 17, {"value": {"handle": {"$handle": 8}, "shape": [2, 2],
                                                             "dtype": "float32", "device": "opencl:0"}}),
    ("call_array_from_tensor_device", p.MsgType.CALL, 19, {"fn": "tether.array.from_tensor", "args": [
        {"$tensor": {"dtype": "int32", "shape": [2], "data": "0100000002000000"}}, "vulkan:0"]}),
    ("call_array_copy_to", p.MsgType.CALL, 18, {"fn": "tether.array.copy_to",
                                                "args": [{"$handle": 8}, {"$handle": 9}]}),
    ("error_gpu_unavailable", p.MsgType.ERROR, 17, {
        "type": "GpuUnavailable", "message": "opencl:0: this device has no OpenCL: libOpenCL.so.1 not found",
        "traceback": ""}),
    ("error_cpu_modules_only", p.MsgType.ERROR, 17, {
        "type": "GpuUnavailable", "message": "this device runs CPU modules only; opencl:0 is not available",
        "traceback": ""}),
] + AUTH_EXCHANGE

INVALID = [
    ("unknown_ext_type", "0000000993050181a161d40300", "ProtocolError"),
    ("body_not_array", "00000001c0", "ProtocolError"),
    ("body_wrong_arity", "000000039201 02", "ProtocolError"),
    ("payload_not_map", "000000049305 0101", "ProtocolError"),
    ("msg_type_not_int", "0000000593a1780180", "ProtocolError"),
    ("int_map_key", "0000000693050181 0101", "ProtocolError"),
    ("trailing_bytes", "000000059305018000", "ProtocolError"),
    ("truncated_msgpack", "000000049305 0182", "ProtocolError"),
    ("incomplete_frame", "000000069305018182", "Incomplete"),
    ("tensor_size_mismatch", "0000001a93050181a161c7110107666c6f617433320100000000000000 02", "ProtocolError"),
    ("tensor_object_dtype", "0000001193050181a161c70801 066f626a656374 00", "ProtocolError"),
    ("oversized_frame", "7fffffff930501", "FrameTooLarge"),
]


def to_wire(value):
    import numpy as np
    if isinstance(value, dict):
        if set(value) == {"$bin"}:
            return bytes.fromhex(value["$bin"])
        if set(value) == {"$handle"}:
            return p.RemoteHandle(value["$handle"])
        if set(value) == {"$float"}:
            return float(value["$float"])
        if set(value) == {"$tensor"}:
            t = value["$tensor"]
            return for_host(np.frombuffer(bytes.fromhex(t["data"]), dtype=numpy_dtype(t["dtype"]).newbyteorder("<"))
                            .reshape(t["shape"]))
        return {k: to_wire(v) for k, v in value.items()}
    if isinstance(value, list):
        return [to_wire(v) for v in value]
    if isinstance(value, float):
        raise ValueError("a float in a vector meaning must be tagged {\"$float\": %r}" % value)
    return value


def to_json(value):
    import numpy as np
    if isinstance(value, bytes):
        return {"$bin": value.hex()}
    if isinstance(value, p.RemoteHandle):
        return {"$handle": value.id}
    if isinstance(value, float):
        return {"$float": value}
    if isinstance(value, np.ndarray):
        stored = storage_of(value)
        return {"$tensor": {"dtype": name_of(value.dtype), "shape": list(value.shape),
                            "data": stored.astype(stored.dtype.newbyteorder("<")).tobytes().hex()}}
    if isinstance(value, dict):
        return {k: to_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [to_json(v) for v in value]
    return value


def tag_floats(value):
    """A meaning as written above (plain Python floats) -> the file's form, each float as {"$float": x}."""
    if isinstance(value, float):
        return {"$float": value}
    if isinstance(value, dict):
        return {k: tag_floats(v) for k, v in value.items()}
    if isinstance(value, list):
        return [tag_floats(v) for v in value]
    return value


def main() -> None:
    valid = [{"name": name, "hex": p.encode_frame(t, rid, to_wire(tag_floats(payload))).hex(),
              "meaning": {"msg_type": int(t), "request_id": rid, "payload": tag_floats(payload)}}
             for name, t, rid, payload in VALID]
    invalid = [{"name": name, "hex": hx.replace(" ", ""), "error": err} for name, hx, err in INVALID]
    auth = [{"name": "auth_exchange", "token": AUTH_TOKEN, "server_nonce": AUTH_NONCE_S,
             "client_nonce": AUTH_NONCE_C, "mac": AUTH_MAC, "proof": AUTH_PROOF,
             "frames": [name for name, *_ in AUTH_EXCHANGE]}]
    doc = {"protocol_version": p.PROTOCOL_VERSION,
           "msg_types": {m.name: int(m) for m in p.MsgType},
           "valid": valid, "invalid": invalid, "auth_exchanges": auth}
    (HERE / "frames.json").write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
