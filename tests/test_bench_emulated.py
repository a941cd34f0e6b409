"""`tether bench` through a real tracker holding a host device server and an emulated aarch64 board (qemu-user,
Cortex-A72, the device zipapp as shipped to a Pi): a kernel cross-built for the board, a model folder compiled
for rasp4b and an ONNX file compiled on the fly for the board's suggested target; the JSON validates."""
import json
import os

import pytest
from click.testing import CliRunner

from tether.cli.main import cli

DIGITS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "digits_cnn.onnx")


@pytest.mark.emulated
@pytest.mark.slow
def test_bench_on_an_emulated_aarch64_board_and_a_host_device(tracker_lab, emulated_devices, emulated_bundle,
                                                               tmp_path):
    import jsonschema

    from kernels import build_kernel, build_kernel_for
    from tether import emulate
    from tether.bench import io

    userland = emulated_devices.userland("aarch64")          # skips with the reason when qemu is unavailable
    tracker = tracker_lab.tracker()
    tracker_lab.device(tracker, "hostdev")
    board = emulate.EmulatedDevice(userland, cpu="cortex-a72", bundle=emulated_bundle, startup_timeout=120.0,
                                   tracker="127.0.0.1:%d" % tracker.port, key="rasp4b")
    with board:
        from fixtures.tracker import wait_until
        wait_until(lambda: tracker.count("rasp4b") == 1, 60, "the emulated board to register")
        kernel = build_kernel_for("vadd", "aarch64", tmp_path)
        model = tmp_path / "digits-rasp4b"
        res = CliRunner().invoke(cli, ["compile", DIGITS, "--target", "rasp4b", "--input-shape", "input:4,1,8,8",
                                       "-o", str(model)])
        assert res.exit_code == 0, res.output
        out = tmp_path / "board.json"
        res = CliRunner().invoke(cli, ["bench", "%s:vadd" % kernel, str(model), DIGITS, "--input-shape",
                                       "input:4,1,8,8", "--tracker", "127.0.0.1:%d" % tracker.port, "--key", "rasp4b",
                                       "--samples", "5", "--min-sample-ms", "2", "--max-warmup", "3", "--profile",
                                       "--timeout", "120", "-q", "--json", str(out), "--html",
                                       str(tmp_path / "board.html")])
        assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    jsonschema.validate(doc, io.schema())
    (dev,) = doc["devices"]
    assert dev["fingerprint"]["arch"] == "aarch64" and dev["connection"]["key"] == "rasp4b"
    kinds = {r["kind"]: r for r in doc["results"]}
    assert set(kinds) == {"kernel", "model", "onnx"}
    # compiled on the fly for what the board says it is: a preset when its cores are known (under qemu-user
    # they often are not), else generic aarch64
    onnx_target = kinds["onnx"]["run"]["target"]
    assert onnx_target == dev["fingerprint"]["suggested_target"] or onnx_target.startswith("aarch64-"), onnx_target
    assert all(r["stats"]["n"] >= 2 and r["stats"]["median"] > 0 for r in doc["results"])
    # and the host device, through the same tracker, with a kernel built for this machine
    res = CliRunner().invoke(cli, ["bench", "%s:vadd" % build_kernel("vadd", tmp_path), "--tracker",
                                   "127.0.0.1:%d" % tracker.port, "--key", "hostdev", "--samples", "5",
                                   "--min-sample-ms", "1", "-q", "--json", str(tmp_path / "host.json")])
    assert res.exit_code == 0, res.output
    host_doc = json.loads((tmp_path / "host.json").read_text())
    jsonschema.validate(host_doc, io.schema())
    assert host_doc["devices"][0]["fingerprint"]["arch"] == "x86_64" or os.uname().machine != "x86_64"
