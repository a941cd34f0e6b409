"""The pytest plugin's `remote_benchmark` fixture, run by a real pytest process against a real tracker and device
server; and its `pytest11` entry point, which makes it load after `pip install` with no `-p`."""
import json
import os
import pathlib
import subprocess
import sys

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]

TEST_FILE = '''
import os
import numpy as np

def test_vadd(tether_session, remote_benchmark):
    tether_session.upload(os.environ["BENCH_VADD"], name="vadd.so")
    f = tether_session.load_module("vadd.so")["vadd"]
    x = np.arange(1024, dtype="float32"); y = np.ones(1024, "float32")
    a, b, c = tether_session.array(x), tether_session.array(y), tether_session.empty((1024,), "float32")
    result = remote_benchmark(f, a, b, c, samples=5, min_sample_ms=1, max_warmup=2)
    assert result["stats"]["n"] >= 3 and result["stats"]["median"] > 0
    np.testing.assert_array_equal(c.numpy(), x + y)   # the measured calls computed the right thing

def test_spec(tether_session, remote_benchmark):
    result = remote_benchmark(os.environ["BENCH_VADD"] + ":vadd", samples=3, min_sample_ms=1)
    assert result["kind"] == "kernel" and result["run"]["artifact_sha256"]

def test_twice(tether_session, remote_benchmark):
    tether_session.upload(os.environ["BENCH_VADD"], name="vadd.so")
    f = tether_session.load_module("vadd.so")["vadd"]
    args = [tether_session.empty((1024,), "float32") for _ in range(3)]
    remote_benchmark(f, *args, samples=3, min_sample_ms=1, name="vadd-empty")
    remote_benchmark(f, *args, samples=3, min_sample_ms=1)
'''


def test_remote_benchmark_fixture_writes_the_bench_json(tracker_lab, rpc_kernels, tmp_path):
    import jsonschema

    from tether.bench import io

    tracker = tracker_lab.tracker()
    tracker_lab.device(tracker, "plugindev")
    (tmp_path / "test_speed.py").write_text(TEST_FILE)
    out = tmp_path / "bench.json"
    env = dict(os.environ, BENCH_VADD=str(rpc_kernels["vadd"]))
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "tether.testing.pytest_plugin", "-p", "no:cacheprovider",
           "--tether-tracker", "127.0.0.1:%d" % tracker.port, "--tether-key", "plugindev",
           "--tether-bench-json", str(out), "test_speed.py"]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "tether remote benchmarks" in proc.stdout and "test_speed.py::test_vadd" in proc.stdout
    doc = json.loads(out.read_text())
    jsonschema.validate(doc, io.schema())
    names = [r["target"] for r in doc["results"]]
    assert names == ["test_speed.py::test_vadd", "vadd.so:vadd", "vadd-empty", "test_speed.py::test_twice#1"]
    assert {r["test"] for r in doc["results"]} == {"test_speed.py::test_vadd", "test_speed.py::test_spec",
                                                   "test_speed.py::test_twice"}
    assert len(doc["devices"]) == 1 and doc["devices"][0]["connection"]["mode"] == "pytest"
    first = doc["results"][0]
    steady = np.array([s["s"] for s in first["samples"] if s["used"]])
    assert first["stats"]["median"] == np.median(steady)


def test_pytest11_entry_point_names_the_plugin():
    import importlib

    import tomllib

    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    entry = meta["project"]["entry-points"]["pytest11"]
    (name, module), = entry.items()
    # named after the module: `-p tether.testing.pytest_plugin` then finds it registered, not a duplicate
    assert name == module == "tether.testing.pytest_plugin"
    plugin = importlib.import_module(module)
    assert hasattr(plugin, "remote_benchmark") and hasattr(plugin, "pytest_addoption")


def test_the_entry_point_loads_the_plugin_without_p(tmp_path):
    """What `pip install` writes for the pyproject's pytest11 table (a dist-info with entry_points.txt) makes
    pytest load the plugin by itself: its options show up in `pytest --help` with no `-p`."""
    import tomllib

    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    dist = tmp_path / "site" / "tether_entrypoint_check-0.0.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: tether-entrypoint-check\nVersion: 0.0.0\n")
    (dist / "entry_points.txt").write_text(
        "[pytest11]\n" + "".join("%s = %s\n" % kv for kv in meta["project"]["entry-points"]["pytest11"].items()))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path / "site"), env.get("PYTHONPATH", "")])
    env.pop("PYTEST_DISABLE_PLUGIN_AUTOLOAD", None)
    proc = subprocess.run([sys.executable, "-m", "pytest", "--help", "-p", "no:cacheprovider"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "--tether-bench-json" in proc.stdout and "--tether-tracker" in proc.stdout
    # and an explicit -p on top of the entry point is not a double registration
    proc = subprocess.run([sys.executable, "-m", "pytest", "--help", "-p", "tether.testing.pytest_plugin", "-p",
                           "no:cacheprovider"], cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
