"""Write the seed inputs of every fuzz target into tests/fuzz/corpus/<target>/ (run once; the files are checked in).

Seeds are valid inputs of each parser (from the protocol vectors, real payloads, a real params file, a real
deploy.json for tests/kernels/vadd.c and the gcc-built vadd.so itself), so the fuzzers start deep inside each
format. Inputs that found bugs are added beside them by hand (named ``bug-*``) and never removed.

    PYTHONPATH=src:rpc_server python3 tests/fuzz/seed_corpus.py
"""
from __future__ import annotations

import hashlib
import json
import pathlib
import sys
import tempfile

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from tether_rpc import handshake, params, protocol as p, tracker_protocol as tp  # noqa: E402


def frames_seeds():
    doc = json.loads((HERE.parent / "vectors" / "frames.json").read_text())
    seeds = [bytes.fromhex(v["hex"]) for v in doc["valid"] + doc["invalid"]]
    seeds.append(p.encode_frame(p.MsgType.CALL, 3, {"fn": "tether.upload", "args": ["a"], "nbytes": 4}) + b"abcd"
                 + p.encode_frame(p.MsgType.CLOSE, 0, {}))
    return seeds


def handshake_seeds():
    hello = p.encode_frame(p.MsgType.HELLO, 0, handshake.hello_payload())
    auth = p.encode_frame(p.MsgType.AUTH, 0, {"nonce": bytes(32), "mac": bytes(32)})
    challenge = p.encode_frame(p.MsgType.CHALLENGE, 0, {"algo": "hmac-sha256", "nonce": bytes(range(32))})
    welcome = p.encode_frame(p.MsgType.WELCOME, 0, {"version": 1, "caps": [], "server": "s", "session": 1,
                                                     "proof": bytes(32)})
    error = p.encode_frame(p.MsgType.ERROR, 0, {"type": "DeviceBusy", "message": "busy", "traceback": ""})
    return [hello, hello + auth, challenge + welcome, welcome, error,
            p.encode_frame(p.MsgType.HELLO, 0, handshake.hello_payload(match="grant-1234", wait=False))]


def tracker_seeds():
    return [
        p.encode_frame(tp.TrackerMsg.HELLO, 0, tp.hello_payload("device", "pi")),
        p.encode_frame(tp.TrackerMsg.REGISTER, 1, {"key": "rasp4b", "port": 9090, "host": "127.0.0.1",
                                                   "tags": {"os": "linux"}, "info": {"arch": "aarch64"},
                                                   "reverse": False, "state": "free"}),
        p.encode_frame(tp.TrackerMsg.REQUEST, 2, {"key": "arch=aarch64,os=lin*", "priority": 1,
                                                  "wait_timeout": 10, "session_timeout": 60}),
        p.encode_frame(tp.TrackerMsg.EXPECTED, 3, {"match": "0123456789abcdef"}),
        p.encode_frame(tp.TrackerMsg.SUMMARY, 4, {}),
    ]


def params_seeds():
    data = params.save_params({"w": np.arange(6, dtype="float32").reshape(2, 3), "b": np.ones(3, "int8"),
                               "s": np.array(7, "int64")})
    return [data, data[:40], params.save_params({})]


def graph_seeds():
    n = 1024 * 4
    graph = {"format": "tether-graph", "version": 2, "lib": "deploy.so", "storages": [n, n, n],
             "entries": [{"name": "A", "dtype": "float32", "shape": [1024], "storage": 0},
                         {"name": "B", "dtype": "float32", "shape": [1024], "storage": 1},
                         {"name": "C", "dtype": "float32", "shape": [1024], "storage": 2, "offset": 0}],
             "inputs": [0], "outputs": [2], "params": [1],
             "nodes": [{"func": "vadd", "args": [0, 1, 2], "name": "add"}]}
    text = json.dumps(graph).encode()
    v1 = dict(graph, version=1)
    return [text, json.dumps(v1).encode(), text.replace(b"1024]", b"512]")]


def elf_seeds():
    from kernels import build_kernel

    with tempfile.TemporaryDirectory() as out:
        vadd = build_kernel("vadd", out).read_bytes()
    return [vadd, vadd[:64], vadd[:1024]]


SEEDS = {"frames": frames_seeds, "handshake": handshake_seeds, "tracker": tracker_seeds, "params": params_seeds,
         "graph": graph_seeds, "elf": elf_seeds}


def main() -> None:
    for name, make in SEEDS.items():
        folder = HERE / "corpus" / name
        folder.mkdir(parents=True, exist_ok=True)
        for data in make():
            (folder / ("seed-" + hashlib.sha1(data).hexdigest()[:16])).write_bytes(data)


if __name__ == "__main__":
    main()
