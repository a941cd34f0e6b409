"""The Go graph executor (bindings/go/graph) on model folders exported by tether.build_graph: the digits CNN,
mobilenet_v2 (scripts/make_mobilenet_v2.py), a densenet-like graph whose concats are entries at byte offsets
(graph JSON version 2) and the digits folder rewritten as version 1. Go's outputs must equal the Python graph
executor's bit for bit on the same inputs."""
from __future__ import annotations

import json
import pathlib
import shutil

import numpy as np
import onnx

import tether
from fixtures.scripts import load_script
from fixtures.golang import GoCases, run_go_test
from tether import graph_executor
from tether.frontend import from_onnx

ROOT = pathlib.Path(__file__).resolve().parent.parent
DIGITS = ROOT / "tests" / "data" / "digits_cnn.onnx"


def _export(model, shape, folder: pathlib.Path) -> None:
    graph, params = from_onnx(model, shape=shape)
    tether.build_graph(graph, params, target="host", opt_level=3).export(str(folder))


def _as_version_1(src: pathlib.Path, dst: pathlib.Path) -> None:
    shutil.copytree(src, dst)
    g = json.loads((dst / "deploy.json").read_text())
    assert all(not e.get("offset") for e in g["entries"]), "a version-1 graph cannot hold offsets"
    for e in g["entries"]:
        e.pop("offset", None)
    g["version"] = 1
    (dst / "deploy.json").write_text(json.dumps(g))


def test_go_graph_executor_matches_python_bit_for_bit(tmp_path):
    from test_graph_concat import densenet_like

    rng = np.random.default_rng(3)
    models = {
        "digits": (onnx.load(str(DIGITS)), {"input": (8, 1, 8, 8)}),
        "mobilenet_v2": (load_script("make_mobilenet_v2").build_mobilenet_v2(seed=1), {}),  # 224x224, 1000 classes
        "densenet_offsets": (densenet_like(), {}),
    }
    for name, (model, shape) in models.items():
        _export(model, shape, tmp_path / name)
    _as_version_1(tmp_path / "digits", tmp_path / "digits_v1")
    offsets = [e.get("offset", 0) for e in json.loads((tmp_path / "densenet_offsets" / "deploy.json").read_text())
               ["entries"]]
    assert any(offsets), "the densenet graph must place entries at byte offsets"

    cases = GoCases(tmp_path / "cases")
    records = []
    for name in ("digits", "digits_v1", "mobilenet_v2", "densenet_offsets"):
        gm = graph_executor.load(str(tmp_path / name))
        runs = []
        for _ in range(2):  # a second input: nothing stale may survive from the first run
            feeds = {inp["name"]: rng.standard_normal(inp["shape"]).astype(inp["dtype"])
                     for inp in gm.info()["inputs"]}
            gm.run(**feeds)
            runs.append(cases.graph_run(gm, feeds))
        records.append({"name": name, "folder": str(tmp_path / name), "runs": runs,
                        "nodes": gm.info()["nodes"]})
    cases.write(models=records)
    # (the "when" tests of ./graph read fixtures of their own: tests/test_go_when.py)
    out = run_go_test(["./graph"], tmp_path / "cases",
                      run="^Test(ModelsMatchPython|Benchmark|Params|RefusesNumpyNodes)$")
    for name in ("TestModelsMatchPython", "TestBenchmark", "TestParams"):
        assert "--- PASS: " + name in out, out
