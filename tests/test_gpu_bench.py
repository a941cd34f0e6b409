"""Measuring GPUs on pocl: time_evaluator of GPU functions on the device's clock (locally and over a forked device
server on loopback), `tether bench` with a GPU build beside the CPU build, scripts/bench_gpu.py, and `tether tune`
for GPU kernels whose best config a later build uses. No wall-clock assertions: only which clock, how many samples,
that they are positive, and that results match numpy."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner
from fixtures.prereq import require_module, unavailable

import tether
from tether import rpc, te
from tether.bench.op_kernels import parse_op
from tether.rpc.local import LocalSession

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(ROOT, "src"), os.path.join(ROOT, "rpc_server")]))
TIMEOUT = 120.0
POCL = "apt-get install pocl-opencl-icd ocl-icd-libopencl1"
SCHEMA = os.path.join(ROOT, "src", "tether", "bench", "schema", "bench.schema.json")
DIGITS = os.path.join(ROOT, "tests", "data", "digits_cnn.onnx")


@pytest.fixture(scope="module")
def opencl():
    from tether_rpc.gpu.opencl import OpenCLDevice

    if not OpenCLDevice.available():
        unavailable("an OpenCL driver", POCL)


def _vadd(n: int, folder) -> str:
    a = te.placeholder((n,), name="A")
    b = te.placeholder((n,), name="B")
    c = te.compute((n,), lambda i: a[i] + b[i], name="C")
    s = te.create_schedule(c.op)
    bx, tx = s[c].split(c.op.axis[0], factor=64)
    s[c].bind(bx, te.thread_axis("blockIdx.x"))
    s[c].bind(tx, te.thread_axis("threadIdx.x"))
    path = os.path.join(str(folder), "vadd.so")
    tether.build(s, [a, b, c], target="opencl", name="vadd").export_library(path)
    return path


def _time_on(remote, lib: str) -> None:
    n = 1000
    x = np.random.default_rng(0).standard_normal(n).astype("float32")
    y = np.random.default_rng(1).standard_normal(n).astype("float32")
    remote.upload(lib)
    f = remote.load_module("vadd.so")["vadd"]
    a, b = remote.array(x, device="opencl:0"), remote.array(y, device="opencl:0")
    c = remote.empty((n,), "float32", device="opencl:0")
    res = f.time_evaluator(number=2, repeat=4, min_repeat_ms=0)(a, b, c)
    assert res.clock == "device" and len(res.samples) == 4 and res.number == 2
    assert all(s > 0 for s in res.samples)
    np.testing.assert_allclose(c.numpy(), x + y, rtol=1e-6)
    # numpy arguments: copied outside the timed spans, still the device clock
    out = np.zeros(n, "float32")
    res = f.time_evaluator(number=1, repeat=2)(x, y, out)
    assert res.clock == "device" and all(s > 0 for s in res.samples)


def test_time_evaluator_of_a_gpu_function_locally(opencl, tmp_path):
    with LocalSession() as remote:
        _time_on(remote, _vadd(1000, tmp_path))


def test_time_evaluator_of_a_gpu_function_over_rpc(opencl, rpc_server, tmp_path):
    with rpc.connect(rpc_server.host, rpc_server.port, timeout=TIMEOUT) as remote:
        _time_on(remote, _vadd(1000, tmp_path))


def test_a_matmul_on_the_device_clock_and_its_cpu_build_on_the_host_clock(opencl, rpc_server, tmp_path):
    op = parse_op("op:matmul:32,24,16")
    gpu_lib = op.export("opencl", str(tmp_path), tag="gpu")
    cpu_lib = op.export("host", str(tmp_path), tag="cpu")
    rng = np.random.default_rng(2)
    xa, xb = rng.standard_normal((32, 24)).astype("float32"), rng.standard_normal((24, 16)).astype("float32")
    with rpc.connect(rpc_server.host, rpc_server.port, timeout=TIMEOUT) as remote:
        for lib, device, clock in ((gpu_lib, "opencl:0", "device"), (cpu_lib, None, "host")):
            remote.upload(lib)
            f = remote.load_module(os.path.basename(lib))[op.func_name]
            arrays = [remote.array(xa, device=device), remote.array(xb, device=device),
                      remote.empty((32, 16), "float32", device=device)]
            res = f.time_evaluator(number=1, repeat=3)(*arrays)
            assert res.clock == clock and len(res.samples) == 3 and all(s > 0 for s in res.samples)
            np.testing.assert_allclose(arrays[2].numpy(), xa @ xb, rtol=1e-4, atol=1e-5)


def _bench(args, tmp_path):
    from tether.cli.main import cli

    out = os.path.join(str(tmp_path), "run.json")
    result = CliRunner().invoke(cli, ["bench", *args, "--samples", "3", "--min-sample-ms", "1", "--max-warmup", "2",
                                      "--max-seconds", "30", "--json", out, "--html", out + ".html", "-q"])
    assert result.exit_code == 0, result.output
    with open(out, encoding="utf-8") as fh:
        doc = json.load(fh)
    jsonschema = require_module("jsonschema")
    with open(SCHEMA, encoding="utf-8") as fh:
        jsonschema.validate(doc, json.load(fh))
    return doc, result.output


@pytest.mark.parametrize("where", ["local", "server"])
def test_bench_an_op_on_the_gpu_beside_the_cpu(opencl, tmp_path, where, request):
    if where == "local":
        device = ["--local"]
    else:   # a forked device server on loopback: tether.bench.run measures there, on the device's clock
        server = request.getfixturevalue("rpc_server")
        device = ["--host", server.host, "--port", str(server.port), "--timeout", "120"]
    csv_path = os.path.join(str(tmp_path), "run.csv")
    doc, text = _bench(["op:matmul:48,32,40", "--gpu", "opencl", "--csv", csv_path, *device], tmp_path)
    import csv
    with open(csv_path, encoding="utf-8") as fh:
        assert [(r["placement"], r["clock"]) for r in csv.DictReader(fh)] == [("gpu", "device"), ("cpu", "host")]
    assert doc["schema"] == "tether-bench/3"
    rows = {r["placement"]: r for r in doc["results"]}
    assert set(rows) == {"gpu", "cpu"}
    assert rows["gpu"]["clock"] == "device" and rows["gpu"]["compute"] == "opencl"
    assert rows["cpu"]["clock"] == "host" and rows["cpu"]["compute"] == "cpu"
    assert rows["gpu"]["run"]["target"].startswith("opencl") and rows["gpu"]["stats"]["median"] > 0
    (pair,) = doc["pairs"]
    assert pair["pair"] == "op:matmul:48,32,40" and pair["gpu_clock"] == "device"
    assert pair["speedup"] == pytest.approx(pair["cpu_median_s"] / pair["gpu_median_s"])
    assert "GPU and CPU builds" in text and "op:matmul:48,32,40 (opencl)" in text
    with open(os.path.join(str(tmp_path), "run.json.html"), encoding="utf-8") as fh:
        assert 'id="pairs"' in fh.read()


def test_bench_a_model_on_the_gpu_beside_the_cpu(opencl, tmp_path):
    doc, _ = _bench([DIGITS, "--input-shape", "input:1,1,8,8", "--target", "opencl", "--local"], tmp_path)
    rows = {r["placement"]: r for r in doc["results"]}
    assert set(rows) == {"gpu", "cpu"} and rows["gpu"]["compute"] == "opencl"
    assert rows["gpu"]["run"]["target"].startswith("opencl") and not rows["cpu"]["run"]["target"].startswith("opencl")
    assert doc["pairs"][0]["pair"] == "digits_cnn.onnx"


def test_bench_a_prebuilt_gpu_module(opencl, tmp_path):
    lib = _vadd(4096, tmp_path)
    doc, _ = _bench([lib + ":vadd", "--local"], tmp_path)
    (r,) = doc["results"]
    assert (r["placement"], r["compute"], r["clock"]) == ("gpu", "opencl", "device")
    assert all(s["s"] > 0 for s in r["samples"])


def test_bench_gpu_script_prints_both_builds(opencl, tmp_path):
    out = os.path.join(str(tmp_path), "rows.json")
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "bench_gpu.py"), "--models",
                           "op:add:4096,digits", "--samples", "3", "--max-seconds", "60", "--json", out],
                          env=ENV, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "not a GPU figure" in proc.stdout             # pocl is a CPU
    assert "onnxruntime GPU for digits: none" in proc.stdout
    with open(out, encoding="utf-8") as fh:
        rows = json.load(fh)["rows"]
    assert [r["target"] for r in rows] == ["op:add:4096", "digits"]
    for r in rows:
        assert r["gpu_median_s"] > 0 and r["cpu_median_s"] > 0 and r["cpu_clock"] == "host"
    assert rows[0]["gpu_clock"] == "device"


def test_tune_an_op_on_the_gpu_and_build_with_the_best(opencl, tmp_path):
    from tether.cli.main import cli
    from tether.tune import log as tlog
    from tether.tune.gpu import GpuOpTask, best_config

    log_path = os.path.join(str(tmp_path), "tune.jsonl")
    result = CliRunner().invoke(cli, ["tune", "--op", "op:matmul:40,24,36", "--target", "opencl", "--local",
                                      "--log", log_path, "--trials", "3", "--repeat", "2", "--min-repeat-ms", "0"])
    assert result.exit_code == 0, result.output
    records = tlog.read_log(log_path)
    results = tlog.results(records)
    assert len(results) == 3 and all(r["status"] == "ok" and r["clock"] == "device" for r in results)
    assert len({tlog.config_text(r["config"]) for r in results}) == 3
    # the same log again: refused without --resume; with it, only configs it does not have are measured
    args = ["tune", "--op", "op:matmul:40,24,36", "--target", "opencl", "--local", "--log", log_path,
            "--repeat", "2", "--min-repeat-ms", "0"]
    again = CliRunner().invoke(cli, args + ["--trials", "3"])
    assert again.exit_code == 1 and "--resume" in again.output
    resumed = CliRunner().invoke(cli, args + ["--trials", "4", "--resume"])
    assert resumed.exit_code == 0, resumed.output
    results = tlog.results(tlog.read_log(log_path))
    assert len(results) == 4 and len({tlog.config_text(r["config"]) for r in results}) == 4
    task = GpuOpTask(parse_op("op:matmul:40,24,36"), "opencl")
    best = best_config(log_path, task)
    want = min(results, key=lambda r: r["latency_s"])["config"]
    assert best == want
    # a later build uses it: its launch is the tuned work-group, and it still computes the matmul
    lib = task.op.build("opencl", best)
    block = lib.metadata["device"]["kernels"][0]["block"]
    assert block[0] * block[1] * block[2] == best["mm_threads_x"] * best["mm_threads_y"]
    path = os.path.join(str(tmp_path), "tuned.so")
    lib.export_library(path)
    rng = np.random.default_rng(3)
    xa, xb = rng.standard_normal((40, 24)).astype("float32"), rng.standard_normal((24, 36)).astype("float32")
    with LocalSession() as remote:
        remote.upload(path)
        out = np.zeros((40, 36), "float32")
        remote.load_module("tuned.so")[task.func](xa, xb, out)
    np.testing.assert_allclose(out, xa @ xb, rtol=1e-4, atol=1e-5)


def test_tune_a_models_gpu_kernels_and_build_with_the_log(opencl, tmp_path):
    """`tether tune MODEL --target opencl --local`: the GPU tasks of the digits CNN's plan, 2 configs each; the log's
    best configs are keyed by the plan's task keys, and build_graph(tuning_log=) builds a model that still computes
    what onnxruntime does."""
    onnx = require_module("onnx")
    ort = require_module("onnxruntime")
    from tether.cli.main import cli
    from tether.frontend import from_onnx
    from tether.graph.plan import plan_kernels
    from tether.target import Target
    from tether.tune import log as tlog
    from tether_rpc.graph_executor import GraphExecutor

    log_path = os.path.join(str(tmp_path), "model.jsonl")
    result = CliRunner().invoke(cli, ["tune", DIGITS, "-s", "input:1,1,8,8", "--target", "opencl", "--local",
                                      "--log", log_path, "--trials", "2", "--repeat", "2", "--min-repeat-ms", "0"])
    assert result.exit_code == 0, result.output
    graph, params = from_onnx(onnx.load(DIGITS), shape={"input": (1, 1, 8, 8)})
    gpu_keys = {t.key for t in plan_kernels(graph, params, Target("opencl")).tasks if t.device == "gpu"}
    best = tlog.best_configs(log_path, Target("opencl"))
    assert best and set(best) <= gpu_keys
    assert all(r["clock"] == "device" for r in tlog.results(tlog.read_log(log_path)) if r["status"] == "ok")
    folder = os.path.join(str(tmp_path), "tuned")
    tether.build_graph(graph, params, target="opencl", tuning_log=log_path).export(folder)
    x = np.random.default_rng(4).standard_normal((1, 1, 8, 8)).astype("float32")
    want = ort.InferenceSession(DIGITS, providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]
    with GraphExecutor.from_folder(folder) as ge:
        ge.set_input("input", x)
        ge.run()
        got = ge.get_output(0)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
