"""scripts/bench_wasm.py end to end on the digits CNN with tiny repeat counts (no timing asserts): tether's wasm32
build run in real node, the native build beside it, the table printed and the JSON rows written; onnxruntime-web
(installed with npm on first use) in a test of its own, so the others need only node; and the opcode counter it
profiles with, on real wasm32 and wasm32-nosimd builds."""
import os
import sys

import pytest

from fixtures.prereq import require_tool, unavailable
from fixtures.scripts import run_bench_script

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ["--models", "digits", "--size", "test", "--repeat", "1", "--sample-ms", "1", "--max-seconds", "5"]


def run_bench(tmp_path, *args, timeout=900):
    return run_bench_script("bench_wasm", tmp_path, *args, timeout=timeout)


def test_tether_wasm_and_native_end_to_end(tmp_path):
    require_tool("node", "apt-get install nodejs (node >= 18)")
    proc, rows = run_bench(tmp_path, *TINY, "--no-ort-web", "--profile", "3")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert any(ln.split()[:5] == ["model", "kern", "wasm", "KB", "wasm"] for ln in lines), proc.stdout
    assert any(ln.startswith("digits ") for ln in lines), proc.stdout
    assert "geometric mean ratio" in proc.stdout and "tether-wasm / native tether" in proc.stdout
    [row] = rows
    assert row["reference"] == "native tether"
    assert row["max_rel_err"] <= 1e-3
    assert row["wasm_ms"] > 0 and row["native_ms"] > 0 and "ort_web_ms" not in row
    assert row["rounds"] >= 1 and row["wasm_bytes"] > 0
    assert row["wasm_ops"]["f32x4_arith"] > 0          # the default wasm32 target emits SIMD arithmetic
    prof = row["profile"]
    assert 1 <= len(prof) <= 3 and all(p["wasm_ms"] >= 0 and p["func"] for p in prof)


def test_wrong_outputs_are_reported_not_timed(tmp_path):
    """A tolerance no result meets stands for a wrong result: the row says so, has no times, and the status is 1."""
    require_tool("node", "apt-get install nodejs (node >= 18)")
    proc, rows = run_bench(tmp_path, *TINY, "--no-ort-web", "--tolerance", "-1")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "outputs differ" in proc.stdout and "not timed" in proc.stdout
    [row] = rows
    assert row["wrong"] is True and "wasm_ms" not in row and "native_ms" not in row


def test_against_onnxruntime_web(tmp_path):
    """onnxruntime-web in node: needs npm (and the npm registry the first time); missing under CI is a failure."""
    require_tool("node", "apt-get install nodejs (node >= 18)")
    require_tool("npm", "apt-get install npm")
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    import bench_wasm

    try:        # the package into its cache first: a failed install says why (skip here, failure under CI)
        bench_wasm.ort_web_package()
    except bench_wasm.BenchError as exc:
        unavailable("onnxruntime-web@%s (%s)" % (bench_wasm.ORT_WEB_VERSION, exc), "npm and the npm registry")
    proc, rows = run_bench(tmp_path, *TINY)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "onnxruntime-web 1." in proc.stdout and "SIMD build" in proc.stdout
    assert "tether-wasm / onnxruntime-web" in proc.stdout
    [row] = rows
    assert row["reference"] == "onnxruntime-web"
    assert row["max_rel_err"] <= 1e-3
    assert row["ort_web_ms"] > 0 and row["ratio_wasm_ort_web"] > 0


def test_unknown_model_is_one_line(tmp_path):
    proc, rows = run_bench(tmp_path, "--models", "nope", "--no-ort-web", timeout=300)
    assert proc.returncode == 2 and rows is None
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith("bench_wasm.py: unknown model 'nope' (choose from mobilenet_v2, ")


@pytest.mark.parametrize("target, simd", [("wasm32", True), ("wasm32-nosimd", False)])
def test_opcode_counter_sees_simd_only_where_enabled(tmp_path, target, simd):
    """wasm_ops decodes every function of a real build to its last byte; SIMD instructions only with simd128."""
    sys.path.insert(0, os.path.join(ROOT, "scripts", "wasm_bench"))
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    import onnx

    import tether
    from tether.frontend import from_onnx
    from wasm_ops import module_summary

    model = onnx.load(os.path.join(ROOT, "tests", "data", "digits_cnn.onnx"))
    graph, params = from_onnx(model, shape={"input": (1, 1, 8, 8)})
    paths = tether.build_graph(graph, params, target=target, opt_level=3).export(str(tmp_path))
    with open(paths["so"], "rb") as fh:
        s = module_summary(fh.read())
    assert s["functions"] > 0 and s["instructions"] > 0
    if simd:
        assert s["f32x4_arith"] > 0 and s["v128_memory"] > 0
    else:
        assert s["simd"] == 0 and s["f32_arith"] > 0
