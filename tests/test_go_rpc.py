"""The pure-Go RPC client (bindings/go/rpc) against the shared protocol vectors, the limit edge cases with the
Python implementation's verdicts (as the Java library is checked in tests/test_java_protocol.py), a real
device server with a token (and a host function from --functions), and a real tracker with a direct and a reverse (relayed) device: upload a kernel,
run it on device arrays and on tensors, stream time_evaluator samples, device_info, remote errors."""
from __future__ import annotations

import json

import numpy as np

from fixtures.golang import GoCases, run_go_test
from fixtures.rpc import start_server
from test_java_protocol import DOC_OVER_PYTHON, _edge_cases, python_verdict

TOKEN = "go-s3cret"
N = 1024


def test_go_rpc_client(tmp_path, rpc_kernels, tracker_lab):
    valid, invalid = [], []
    for name, data in _edge_cases():
        verdict = python_verdict(data)
        (valid if verdict == "ok" else invalid).append(
            dict({"name": name, "hex": data.hex()}, **({} if verdict == "ok" else {"error": verdict})))
    invalid += [{"name": n, "hex": d.hex(), "error": e} for n, d, e in DOC_OVER_PYTHON]
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
    try:
        cases.write(server="%s:%d" % (server.host, server.port), token=TOKEN, tracker="127.0.0.1:%d" % tracker.port,
                    vadd=str(rpc_kernels["vadd"]), a=cases.tensor(a), b=cases.tensor(b), sum=cases.tensor(a + b))
        out = run_go_test(["./rpc"], cases.folder)
    finally:
        server.stop()
    for name in ("TestSharedVectors", "TestVectorCheckNoticesBrokenVectors", "TestEdgeVectors", "TestServer",
                 "TestTracker"):
        assert "--- PASS: " + name in out, out
