"""`tether compile` and `tether run` on the committed digits CNN: locally, and against a real loopback server."""
import json
import os

import numpy as np
import pytest
from click.testing import CliRunner

from fixtures.digits import DIGITS, compile_digits
from tether.cli.main import cli


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    out = tmp_path_factory.mktemp("cli") / "out"
    return out, compile_digits(out).output


def test_compile_writes_the_deploy_folder_and_a_summary(compiled):
    out, text = compiled
    assert sorted(os.listdir(out)) == ["deploy.json", "deploy.params", "deploy.so"]
    assert "input  input: float32[4,1,8,8]" in text and "kernels" in text
    doc = json.loads((out / "deploy.json").read_text())
    assert doc["format"] == "tether-graph"


def test_compile_reports_bad_shapes_clearly(tmp_path):
    res = CliRunner().invoke(cli, ["compile", DIGITS, "--input-shape", "input:4,x,8", "-o", str(tmp_path)])
    assert res.exit_code != 0 and "must be integers" in res.output
    res = CliRunner().invoke(cli, ["compile", DIGITS, "--input-shape", "nope:1,1,8,8", "-o", str(tmp_path)])
    assert res.exit_code != 0 and "not run-time inputs" in res.output


def test_run_locally_with_an_input_file(compiled, tmp_path):
    out, _ = compiled
    x = np.random.default_rng(0).uniform(0, 1, (4, 1, 8, 8)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    res = CliRunner().invoke(cli, ["run", str(out), "--input", str(tmp_path / "x.npy"), "--number", "2",
                                   "--repeat", "2", "--profile", "--save-output", str(tmp_path / "y.npy")])
    assert res.exit_code == 0, res.output
    assert "output 0: float32 (4, 10)" in res.output and "latency: median" in res.output
    from tether import graph_executor
    gm = graph_executor.load(str(out))
    gm.run(input=x)
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), gm.get_output(0))


def test_run_on_a_loopback_server(compiled, rpc_server):
    from tether import rpc
    with rpc.connect(rpc_server.host, rpc_server.port, timeout=30) as sess:
        assert "tether.graph.create" in sess.functions()
    res = CliRunner().invoke(cli, ["run", str(compiled[0]), "--host", rpc_server.host, "--port",
                                   str(rpc_server.port), "--number", "1", "--repeat", "2"])
    assert res.exit_code == 0, res.output
    assert "on %s:%d" % (rpc_server.host, rpc_server.port) in res.output


def test_run_through_a_tracker(compiled, tracker_lab):
    """`tether run --tracker --key`: a real tracker process, a real device server registered under a key."""
    tracker = tracker_lab.tracker()
    tracker_lab.device(tracker, "hostdev")
    res = CliRunner().invoke(cli, ["run", str(compiled[0]), "--tracker", "127.0.0.1:%d" % tracker.port,
                                   "--key", "hostdev", "--number", "1", "--repeat", "2", "--timeout", "30"])
    assert res.exit_code == 0, res.output
    assert "tracker 127.0.0.1:%d key hostdev" % tracker.port in res.output
    assert "output 0: float32 (4, 10)" in res.output
