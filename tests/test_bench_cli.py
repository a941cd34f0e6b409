"""`tether bench` end to end: real device servers (direct and through a real tracker), a kernel, a model folder
and an ONNX file; the JSON is validated against the documented schema and its statistics recomputed with numpy."""
import csv
import json
import os
import shutil

import numpy as np
import pytest
from click.testing import CliRunner

from fixtures.digits import DIGITS, compile_digits
from tether.cli.main import cli

FAST = ["--samples", "6", "--min-sample-ms", "1", "--max-warmup", "3", "--max-seconds", "30", "-q"]


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench-model") / "digits"
    compile_digits(out)
    return out


@pytest.fixture(scope="module")
def schema():
    from tether.bench import io
    return io.schema()


def run_bench(*args):
    res = CliRunner(mix_stderr=False).invoke(cli, ["bench", *[str(a) for a in args]]) if _has_mix_stderr() else \
        CliRunner().invoke(cli, ["bench", *[str(a) for a in args]])
    return res


def _has_mix_stderr():
    import inspect
    return "mix_stderr" in inspect.signature(CliRunner.__init__).parameters


def check_document(doc, schema):
    import jsonschema

    jsonschema.validate(doc, schema)
    ids = {d["id"] for d in doc["devices"]}
    for r in doc["results"]:
        assert r["device"] in ids
        steady = np.array([s["s"] for s in r["samples"] if s["used"]])
        assert len(steady) == r["stats"]["n"] >= doc["options"]["samples"] // 2
        assert not any(s["used"] and s["warmup"] for s in r["samples"])
        if r["stats"]["n"] < len(r["samples"]) - r["warmup"]["count"]:
            assert all(not s["disturbed"] for s in r["samples"] if s["used"]), "left out: interrupted samples"
        assert r["stats"]["median"] == pytest.approx(np.median(steady))
        assert r["stats"]["p90"] == pytest.approx(np.percentile(steady, 90))
        assert r["stats"]["min"] == pytest.approx(steady.min())
        assert [s["i"] for s in r["samples"]] == list(range(len(r["samples"])))
        assert sum(s["warmup"] for s in r["samples"]) == r["warmup"]["count"]
        # the calibration stops at the first round of `number` runs that lasts --min-sample-ms; the samples after
        # it are timed runs too, and on a loaded box may run faster than that round, so only the round is checked
        if not doc["options"]["number"]:
            assert r["number"] >= 1
            assert r["phases"]["calibration_s"] >= doc["options"]["min_sample_ms"] / 1e3
        assert r["phases"]["upload_s"] > 0 and r["phases"]["load_s"] > 0 and r["phases"]["first_run_s"] > 0
        assert r["memory"]["peak_rss_bytes"] >= r["memory"]["rss_start_bytes"] > 0


def test_bench_kernel_model_and_onnx_on_a_server(rpc_server, rpc_kernels, model_folder, schema, tmp_path):
    out_json, out_csv = tmp_path / "run.json", tmp_path / "run.csv"
    res = run_bench("%s:vadd" % rpc_kernels["vadd"], model_folder, DIGITS, "--input-shape", "input:4,1,8,8",
                    "--host", rpc_server.host, "--port", rpc_server.port, "--profile", "--json", out_json,
                    "--csv", out_csv, *FAST)
    assert res.exit_code == 0, res.output + (res.stderr if hasattr(res, "stderr") else "")
    doc = json.loads(out_json.read_text())
    check_document(doc, schema)
    kinds = {r["kind"]: r for r in doc["results"]}
    assert set(kinds) == {"kernel", "model", "onnx"}
    kernel = kinds["kernel"]
    assert kernel["target"] == "vadd.so:vadd" and kernel["run"]["inputs"] == [{"shape": [1024], "dtype": "float32"}] * 3
    import hashlib
    assert kernel["run"]["artifact_sha256"] == hashlib.sha256(rpc_kernels["vadd"].read_bytes()).hexdigest()
    assert kinds["model"]["memory"]["arena_bytes"] > 0 and kinds["model"]["profile"]
    onnx = kinds["onnx"]
    assert onnx["run"]["target"] == doc["devices"][0]["fingerprint"]["suggested_target"], "compiled for the device"
    assert onnx["phases"]["compile_s"] > 0 and onnx["run"]["compile_options"]["input_shapes"] == {"input": [4, 1, 8, 8]}
    dev = doc["devices"][0]
    assert dev["connection"]["mode"] == "direct" and dev["fingerprint"]["kernel"] == os.uname().release
    assert doc["host"]["git_commit"] and doc["host"]["python"]
    rows = list(csv.DictReader(out_csv.open()))
    assert [r["target"] for r in rows] == [r["target"] for r in doc["results"]]
    assert float(rows[0]["median_s"]) == pytest.approx(kernel["stats"]["median"])
    assert "tether bench" in res.output and "vadd.so:vadd" in res.output


def test_bench_through_a_tracker_on_all_devices(tracker_lab, rpc_kernels, schema, tmp_path):
    tracker = tracker_lab.tracker()
    tracker_lab.device(tracker, "benchdev")
    tracker_lab.device(tracker, "benchdev")
    out = tmp_path / "pool.json"
    res = run_bench("%s:vadd" % rpc_kernels["vadd"], "--tracker", "127.0.0.1:%d" % tracker.port, "--key", "benchdev",
                    "--all-devices", "--json", out, "--html", tmp_path / "pool.html", "--timeout", "30", *FAST)
    assert res.exit_code == 0, res.output
    page = (tmp_path / "pool.html").read_text()
    assert "Across devices" in page and "between-device share" in page and page.count('data-plot="timeline"') == 2
    doc = json.loads(out.read_text())
    check_document(doc, schema)
    assert len(doc["devices"]) == 2 and len({d["id"] for d in doc["devices"]}) == 2
    assert all(d["connection"]["mode"] == "tracker" for d in doc["devices"])
    (pool,) = doc["pool"]
    assert pool["target"] == "vadd.so:vadd" and len(pool["medians"]) == 2
    assert pool["within_var"] >= 0 and 0 <= pool["between_share"] <= 1
    assert "across 2 devices" in res.output
    # a single request through the tracker
    res = run_bench("%s:vadd" % rpc_kernels["vadd"], "--tracker", "127.0.0.1:%d" % tracker.port, "--key", "benchdev",
                    "--json", out, "--timeout", "30", *FAST)
    assert res.exit_code == 0, res.output
    assert len(json.loads(out.read_text())["results"]) == 1


def test_bench_locally_with_explicit_shapes_and_pinning(rpc_kernels, schema, tmp_path):
    out = tmp_path / "local.json"
    cpu = sorted(os.sched_getaffinity(0))[-1]
    res = run_bench("%s:vadd" % rpc_kernels["vadd"], "--local", "--shape", "1024", "--shape", "1024", "--shape", "1024",
                    "--dtype", "float32", "--pin", str(cpu), "--seed", "7", "--number", "37", "--json", out, *FAST)
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    check_document(doc, schema)
    (r,) = doc["results"]
    assert r["pinned"] == [cpu] and r["run"]["input_seed"] == 7 and doc["devices"][0]["id"] == "local"
    assert r["number"] == 37 and r["phases"]["calibration_s"] == 0


def test_compare_two_builds_in_folders_of_different_names(model_folder, tmp_path):
    """Two builds of one model in folders named differently share no target name: compare says nothing was
    compared (exit 2, nothing written) until the results are paired by order or by name."""
    docs = {}
    for side in ("base", "new"):
        folder = tmp_path / ("digits-%s" % side)
        shutil.copytree(model_folder, folder)
        docs[side] = tmp_path / ("%s.json" % side)
        res = run_bench(folder, "--local", "--json", docs[side], *FAST)
        assert res.exit_code == 0, res.output
    names = {side: json.loads(docs[side].read_text())["results"][0]["target"] for side in docs}
    assert names["base"] != names["new"]
    out = tmp_path / "cmp.json"
    res = run_bench("compare", docs["base"], docs["new"], "--json", out)
    assert res.exit_code == 2 and "nothing was compared" in res.output, res.output
    assert not out.exists()
    for pairing in (["--pair-by-order"], ["--pair", "%s=%s" % (names["base"], names["new"])]):
        # the fail-above gate is wide: these are two runs of one build on a busy machine
        res = run_bench("compare", docs["base"], docs["new"], "--fail-above", "500", "--json", out, *pairing)
        assert res.exit_code == 0, res.output
        (row,) = json.loads(out.read_text())["rows"]
        assert (row["target"], row["new_target"]) == (names["base"], names["new"])
        assert row["same_artifact"], "the same deploy.so on both sides"
    res = run_bench("compare", docs["base"], docs["new"], "--pair", "%s=nosuch" % names["base"])
    assert res.exit_code == 2 and "no target 'nosuch'" in res.output, res.output


def test_bench_usage_errors(rpc_kernels, tmp_path):
    res = run_bench("nothing-here.so:f", "--local")
    assert res.exit_code == 2 and "no such library" in res.output
    res = run_bench("%s:nosuch" % rpc_kernels["vadd"], "--local", "-q")
    assert res.exit_code == 1 and "has no function 'nosuch'" in res.output
    res = run_bench("%s:vadd" % rpc_kernels["vadd"], "--local", "--shape", "1024", "--shape", "16", "--shape", "1024",
                    "-q")
    assert res.exit_code == 1 and "shape" in res.output.lower()
    res = run_bench("%s:vadd" % rpc_kernels["vadd"], "--local", "--pin", "4095", "-q")
    assert res.exit_code == 1 and "cannot pin to CPUs [4095]" in res.output
    res = run_bench("%s:vadd" % rpc_kernels["vadd"], "--tracker", "127.0.0.1:1")
    assert res.exit_code == 2 and "--key" in res.output


def test_live_progress_display():
    """The rich progress: one bar per (device, target), moved by the device's (rate-limited) sample events."""
    import io

    from rich.console import Console

    from tether.cli.bench_cmd import _Live

    buf = io.StringIO()
    live = _Live(Console(file=buf, force_terminal=True, width=120), expected=10, enabled=True)
    with live.progress:
        for i in (0, 4, 9, 12):
            live.on_sample("pi/device-1", "vadd.so:vadd", {"index": i, "seconds": 2.5e-6, "temp_c": 51.5})
        live.on_sample("pi/device-2", "vadd.so:vadd", {"index": 3, "seconds": 3e-6})
    text = buf.getvalue()
    assert "vadd.so:vadd on pi/device-1" in text and "vadd.so:vadd on pi/device-2" in text
    assert "2.5 us" in text and "51.5 C" in text
    tasks = {t.description: t for t in live.progress.tasks}
    assert tasks["vadd.so:vadd on pi/device-1"].completed == 10 and tasks["vadd.so:vadd on pi/device-2"].completed == 4


def test_bench_through_the_relay_to_a_reverse_device(tracker_lab, rpc_kernels, schema, tmp_path):
    """A device that can only dial out (--reverse): the grant has no host, the session goes through the tracker."""
    tracker = tracker_lab.tracker()
    tracker_lab.device(tracker, "behind-nat", reverse=True)
    out = tmp_path / "relay.json"
    res = run_bench("%s:vadd" % rpc_kernels["vadd"], "--tracker", "127.0.0.1:%d" % tracker.port, "--key",
                    "behind-nat", "--json", out, "--timeout", "30", *FAST)
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    check_document(doc, schema)
    assert doc["devices"][0]["connection"]["relay"] is True
