"""Device state through a real device server: a board's sysfs files (presented with TETHER_SYSFS_ROOT, as a Pi
4 lays them out) reach every sample, hot and throttled samples are flagged, --cooldown-temp waits on the device
and gives up at its timeout, and fields a board lacks are absent."""
import json
import os
import re

import pytest
from click.testing import CliRunner

from fixtures.sysfs import thermal_zone, throttled_flag
from tether.cli.main import cli

FAST = ["--samples", "5", "--min-sample-ms", "1", "--max-warmup", "2", "-q"]


def pi_board(root, temp_milli=45000, throttled="0x0"):
    zone = thermal_zone(root, temp_milli)
    policy = root / "sys/devices/system/cpu/cpufreq/policy0"
    policy.mkdir(parents=True)
    for name, value in (("scaling_cur_freq", "1500000"), ("cpuinfo_max_freq", "1800000"),
                        ("scaling_min_freq", "600000"), ("scaling_governor", "ondemand"), ("affected_cpus", "0 1 2 3")):
        (policy / name).write_text(value + "\n")
    throttled_flag(root, throttled)
    return zone


@pytest.fixture
def board_server(tmp_path):
    from fixtures.rpc import ServerProcess

    root = tmp_path / "board"
    zone = pi_board(root)
    workdir = tmp_path / "sessions"
    workdir.mkdir()
    env = dict(os.environ, TETHER_SYSFS_ROOT=str(root))
    server = ServerProcess(["--host", "127.0.0.1", "--port", "0", "--workdir", str(workdir)], tmp_path / "srv.log",
                           env=env)
    yield server, root, zone
    server.stop()


def bench(server, kernel, out, *extra):
    res = CliRunner().invoke(cli, ["bench", "%s:vadd" % kernel, "--host", server.host, "--port", str(server.port),
                                   "--json", str(out), *FAST, *extra])
    assert res.exit_code == 0, res.output
    return json.loads(out.read_text()), res.output


def test_board_state_in_every_sample(board_server, rpc_kernels, tmp_path):
    server, root, zone = board_server
    doc, _ = bench(server, rpc_kernels["vadd"], tmp_path / "cool.json", "--cooldown-temp", "50")
    (r,) = doc["results"]
    for s in r["samples"]:
        assert s["temp_c"] == 45.0 and s["hot"] is False and s["freq_khz"] == [1500000]
        assert s["throttle_flags"] == 0 and s["throttled"] is False and "battery_c" not in s
    assert r["cooldown"]["reached"] and r["flags"]["hot"] == 0
    state = doc["devices"][0]["state"]
    assert state["hot_c"] == 60.0 and state["cpufreq"][0]["governor"] == "ondemand"
    assert state["cpufreq"][0]["cpus"] == [0, 1, 2, 3] and doc["devices"][0]["fingerprint"]["governors"] == ["ondemand"]


def test_hot_and_throttled_samples_are_flagged_and_cooldown_gives_up(board_server, rpc_kernels, tmp_path):
    server, root, zone = board_server
    (zone / "temp").write_text("71500\n")
    (root / "sys/devices/platform/soc/soc:firmware/get_throttled").write_text("0x80008\n")
    doc, output = bench(server, rpc_kernels["vadd"], tmp_path / "hot.json", "--cooldown-temp", "50",
                        "--cooldown-timeout", "0.5")
    (r,) = doc["results"]
    steady = [s for s in r["samples"] if not s["warmup"]]
    assert r["flags"]["hot"] == len(steady) and r["flags"]["throttled"] == len(steady)
    assert all(s["temp_c"] == 71.5 and s["throttle_flags"] == 0x80008 for s in r["samples"])
    assert not r["cooldown"]["reached"] and 0.4 <= r["cooldown"]["waited_s"]   # gave up, not before its timeout
    text = " ".join(r["warnings"])
    assert "while hot" in text and "throttling" in text and "did not cool to 50 C" in text
    assert "warning" in output
    # --hot-temp moves the line
    doc, _ = bench(server, rpc_kernels["vadd"], tmp_path / "hot2.json", "--hot-temp", "80")
    assert doc["results"][0]["flags"]["hot"] == 0


def test_state_fields_absent_without_board_files(rpc_server, rpc_kernels, tmp_path):
    if os.path.exists("/sys/class/thermal/thermal_zone0/temp"):
        pytest.skip("this machine has a thermal zone: its samples rightly carry temperatures")
    doc, _ = bench(rpc_server, rpc_kernels["vadd"], tmp_path / "bare.json")
    (r,) = doc["results"]
    assert not {"temp_c", "hot", "freq_khz", "throttled", "battery_c"} & set(r["samples"][0])
    assert "temp_c" not in doc["devices"][0]["state"] and "cpufreq" not in doc["devices"][0]["state"]


def test_bench_on_the_oldest_device_python(tracker_lab, rpc_kernels, tmp_path):
    """The device side of `tether bench` (device_state.py) on Python 3.9 + numpy 1.19 + msgpack 1.0."""
    import glob
    import shutil
    import subprocess

    python = None
    candidates = [shutil.which("python3.9")] + \
        sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.9*/bin/python")))
    for candidate in candidates:
        if candidate and subprocess.run([candidate, "-c", "import numpy, msgpack"], capture_output=True,
                                        timeout=30).returncode == 0:
            python = candidate
            break
    if python is None:
        if os.environ.get("CI"):
            pytest.fail("no Python 3.9 with numpy and msgpack (scripts/test.sh installs them)", pytrace=False)
        pytest.skip("no Python 3.9 with numpy 1.19 and msgpack 1.0 (the oldest device stack)")
    tracker = tracker_lab.tracker()
    tracker_lab.device(tracker, "old", python=python)
    out = tmp_path / "old.json"
    res = CliRunner().invoke(cli, ["bench", "%s:vadd" % rpc_kernels["vadd"], "--tracker", "127.0.0.1:%d" % tracker.port,
                                   "--key", "old", "--json", str(out), "--timeout", "30", *FAST])
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    assert doc["devices"][0]["fingerprint"]["python"].startswith("3.9")
    assert doc["devices"][0]["fingerprint"]["numpy"].startswith("1.19")
    assert doc["results"][0]["stats"]["n"] >= 3


def test_bench_on_a_device_runtime_without_the_bench_builtins(rpc_kernels, model_folder_for_fallback, tmp_path):
    """An older device runtime (here: tether_rpc without device_state.py, which a trimmed install skips): bench
    falls back to time_evaluator / graph benchmark, detects the warm-up on the host and says what is missing."""
    import shutil

    import jsonschema

    from fixtures.rpc import ServerProcess
    from tether.bench import io

    trimmed = tmp_path / "old-device"
    shutil.copytree(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "rpc_server",
                                 "tether_rpc"), trimmed / "tether_rpc", ignore=shutil.ignore_patterns("__pycache__"))
    (trimmed / "tether_rpc" / "device_state.py").unlink()
    # An older runtime does not know the extension at all. Deleting the file is not enough where tether_rpc is
    # installed editable: setuptools' finder then serves the missing submodule from the source tree.
    session_py = trimmed / "tether_rpc" / "session.py"
    source = session_py.read_text()
    trimmed_source = re.sub(r'(?m)^(EXTENSIONS = \(.*)"device_state", ', r"\1", source)
    assert trimmed_source != source, "session.EXTENSIONS no longer lists device_state: update this test"
    session_py.write_text(trimmed_source)
    (tmp_path / "sessions").mkdir()
    env = dict(os.environ, PYTHONPATH=str(trimmed))
    env.pop("TETHER_TEST_DEVICE_PYTHON", None)
    server = ServerProcess(["--host", "127.0.0.1", "--port", "0", "--workdir", str(tmp_path / "sessions")],
                           tmp_path / "old.log", env=env)
    try:
        out = tmp_path / "old.json"
        res = CliRunner().invoke(cli, ["bench", "%s:vadd" % rpc_kernels["vadd"], str(model_folder_for_fallback),
                                       "--host", server.host, "--port", str(server.port), "--json", str(out),
                                       "--cooldown-temp", "50", *FAST])
        assert res.exit_code == 0, res.output
    finally:
        server.stop()
    doc = json.loads(out.read_text())
    jsonschema.validate(doc, io.schema())
    assert len(doc["results"]) == 2
    for r in doc["results"]:
        assert any("no tether.bench.run" in w for w in r["warnings"]), r["warnings"]
        assert len(r["samples"]) == 5 + 2 and r["stats"]["n"] == 7 - r["warmup"]["count"]
        assert r["phases"]["first_run_s"] > 0 and "cooldown" not in r
        assert any("--cooldown-temp ignored" in w for w in r["warnings"])


@pytest.fixture(scope="module")
def model_folder_for_fallback(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench-model") / "digits"
    digits = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "digits_cnn.onnx")
    res = CliRunner().invoke(cli, ["compile", digits, "--target", "host", "--input-shape", "input:4,1,8,8",
                                   "-o", str(out)])
    assert res.exit_code == 0, res.output
    return out
