"""Whole models compiled for wasm32 (deploy.json + deploy.params + deploy.wasm) and run in node through the JS
runtime's GraphExecutor (bindings/js), against onnxruntime: mobilenet_v2, a YOLOv8-style detector, a CRNN (LSTM)
and an SVTR (attention) text recognizer, a transformer encoder, a voice-activity detector. Every output has
onnxruntime's dtype and shape and a max relative error (max |tether - ort| / max |ort|, as
tests/test_model_kinds.py) <= 1e-4."""
import json
import re

import numpy as np
import onnxruntime as ort
import pytest
from fixtures.scripts import load_script
from wasm_node import run_model, wasm_imports_and_exports, wasm_metadata

import tether
from tether.frontend import from_onnx
from tether.target import WASM_STACK_BYTES
from tether.testing.model_kinds import KINDS, relative_error


def _mobilenet_v2():
    model = load_script("make_mobilenet_v2").build_mobilenet_v2(seed=1, size=64, width=0.5, classes=100)
    return model, {"input": np.random.default_rng(0).standard_normal((1, 3, 64, 64)).astype(np.float32)}


MODELS = {"mobilenet_v2": _mobilenet_v2,
          "yolov8_detector": lambda: KINDS["yolov8_detector"]("test"),
          "crnn_recognizer": lambda: KINDS["crnn_recognizer"]("test"),
          "svtr_recognizer": lambda: KINDS["svtr_recognizer"]("test"),
          "transformer_encoder": lambda: KINDS["transformer_encoder"]("test"),
          "vad": lambda: KINDS["vad"]("test")}   # (LSTM state inputs, a run-time If: guarded nodes)


@pytest.mark.parametrize("name", list(MODELS))
def test_model_in_node_matches_onnxruntime(name, tmp_path):
    model, feeds = MODELS[name]()
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    ref = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)
    graph, params = from_onnx(model)
    factory = tether.build_graph(graph, params, target="wasm32", opt_level=3)
    factory.export(str(tmp_path))
    deploy = json.loads((tmp_path / "deploy.json").read_text())
    assert deploy["lib"] == "deploy.wasm"
    data = (tmp_path / "deploy.wasm").read_bytes()
    assert wasm_imports_and_exports(data)[0] == [] and wasm_metadata(data)["target"]["arch"] == "wasm32"
    got = run_model(str(tmp_path), feeds)
    assert len(got) == len(ref)
    for i, r in enumerate(ref):
        g = got[i]
        assert g.dtype == r.dtype and g.shape == r.shape, (i, g.dtype, g.shape, r.dtype, r.shape)
        assert np.isfinite(r).all() and np.abs(r).max() > 0, "degenerate reference output %d" % i
        assert relative_error(g, r) <= 1e-4, (i, relative_error(g, r))


def test_mobilenet_v2_kernels_are_simd128():
    """Every conv kernel of mobilenet_v2 (regular, depthwise, pointwise) multiplies and adds in f32x4; no atomics;
    kernel stack frames far below the module's stack."""
    model, _ = _mobilenet_v2()
    graph, params = from_onnx(model)
    lib = tether.build_graph(graph, params, target="wasm32").lib
    asm = lib.get_source("asm")
    bodies = dict(re.findall(r"\n(deploy_k\d+_[a-z0-9_]*conv2d[a-z0-9_]*__impl):\n(.*?)end_function", asm, re.S))
    assert len(bodies) >= 10, sorted(bodies)
    scalar = [name for name, body in bodies.items() if "f32x4.mul" not in body or "f32x4.add" not in body]
    assert not scalar, scalar
    assert "atomic" not in asm
    # the 1 MiB stack (docs/web.md "The module") holds a kernel's frame many times over
    frames = [int(n) for n in re.findall(r"global\.get\s+__stack_pointer\s*\n\s*i32\.const\s+(\d+)\s*\n\s*i32\.sub",
                                         asm)]
    assert frames and max(frames) <= WASM_STACK_BYTES // 8, max(frames)
