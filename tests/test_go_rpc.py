"""The pure-Go RPC client (bindings/go/rpc) against the shared protocol vectors, the limit edge cases with the
Python implementation's verdicts (as the Java library is checked in tests/test_java_protocol.py), a real
device server with a token (and a host function from --functions), and a real tracker with a direct and a reverse
(relayed) device: upload a kernel, run it on device arrays and on tensors, stream time_evaluator samples,
device_info, remote errors."""
from __future__ import annotations

import json
import socket
import struct
import threading

import numpy as np

from fixtures.golang import GoCases, run_go_test
from fixtures.rpc import start_server
from test_java_protocol import _edge_cases, python_verdict

TOKEN = "go-s3cret"
N = 1024


class HostileServer:
    """A loopback listener that answers every client's first bytes with ``reply`` (then keeps the connection
    open until the test ends), to check that the Go client refuses it with a clear error and no hang."""

    def __init__(self, reply: bytes):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(4)
        self.sock.settimeout(0.2)
        self.reply, self.conns, self.stopping = reply, [], False
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    @property
    def addr(self) -> str:
        return "127.0.0.1:%d" % self.sock.getsockname()[1]

    def _serve(self) -> None:
        for _ in range(600):  # bounded: at most 2 minutes
            if self.stopping:
                return
            try:
                conn, _ = self.sock.accept()
            except socket.timeout:
                continue
            self.conns.append(conn)
            conn.settimeout(5)
            try:
                conn.recv(4096)
                if self.reply:
                    conn.sendall(self.reply)
            except OSError:
                pass

    def close(self) -> None:
        self.stopping = True
        self.thread.join(5)
        for c in self.conns:
            c.close()
        self.sock.close()


def test_go_rpc_client(tmp_path, rpc_kernels, tracker_lab):
    valid, invalid = [], []
    for name, data in _edge_cases():
        verdict = python_verdict(data)
        (valid if verdict == "ok" else invalid).append(
            dict({"name": name, "hex": data.hex()}, **({} if verdict == "ok" else {"error": verdict})))
    assert len(valid) >= 6 and len(invalid) >= 6
    cases = GoCases(tmp_path / "cases")
    (cases.folder / "edges.json").write_text(json.dumps({"valid": valid, "invalid": invalid}))

    rng = np.random.default_rng(11)
    a, b = rng.standard_normal(N).astype("float32"), rng.standard_normal(N).astype("float32")
    functions = tmp_path / "functions.py"
    functions.write_text("from tether_rpc.host_functions import register_func\n"
                         "register_func('device.greet', lambda name, times: len(name) * times + 0.5)\n")
    server = start_server(tmp_path, "--token", TOKEN, "--functions", str(functions))
    tracker = tracker_lab.tracker()
    tracker_lab.device(tracker, "go-direct")
    tracker_lab.device(tracker, "go-reverse", reverse=True)
    hostile = {"oversized": HostileServer(struct.pack(">I", (64 << 10) + 1) + b"\x93"),
               "garbage": HostileServer(struct.pack(">I", 3) + b"\xc1\xc1\xc1"),
               "silent": HostileServer(b"")}
    try:
        cases.write(hostile={k: v.addr for k, v in hostile.items()}, server="%s:%d" % (server.host, server.port),
                    token=TOKEN, tracker="127.0.0.1:%d" % tracker.port, vadd=str(rpc_kernels["vadd"]),
                    a=cases.tensor(a), b=cases.tensor(b), sum=cases.tensor(a + b))
        out = run_go_test(["./rpc"], cases.folder)
    finally:
        server.stop()
        for h in hostile.values():
            h.close()
    for name in ("TestHostileServers", "TestSharedVectors", "TestVectorCheckNoticesBrokenVectors", "TestEdgeVectors",
                 "TestServer", "TestTracker"):
        assert "--- PASS: " + name in out, out
