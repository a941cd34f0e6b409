"""Whole models compiled for wasm32 (deploy.json + deploy.params + deploy.wasm) and run in node through the JS
runtime's GraphExecutor (bindings/js), against onnxruntime: mobilenet_v2, a YOLOv8-style detector, a CRNN (LSTM)
and an SVTR (attention) text recognizer, a transformer encoder, a voice-activity detector. Every output has
onnxruntime's dtype and shape and a max relative error (max |tether - ort| / max |ort|, as
tests/test_model_kinds.py) <= 1e-4."""
import json
import re

import pytest
from wasm_cases import MODELS, compare_model, ort_reference
from wasm_node import run_model, wasm_imports_and_exports, wasm_metadata

import tether
from tether.frontend import from_onnx
from tether.target import WASM_STACK_BYTES


@pytest.mark.parametrize("name", list(MODELS))
def test_model_in_node_matches_onnxruntime(name, tmp_path):
    model, feeds = MODELS[name]()
    ref = ort_reference(model, feeds, threads=1)
    graph, params = from_onnx(model)
    factory = tether.build_graph(graph, params, target="wasm32", opt_level=3)
    factory.export(str(tmp_path))
    deploy = json.loads((tmp_path / "deploy.json").read_text())
    assert deploy["lib"] == "deploy.wasm"
    data = (tmp_path / "deploy.wasm").read_bytes()
    assert wasm_imports_and_exports(data)[0] == [] and wasm_metadata(data)["target"]["arch"] == "wasm32"
    compare_model(run_model(str(tmp_path), feeds), ref)


def test_mobilenet_v2_kernels_are_simd128():
    """Every conv kernel of mobilenet_v2 (regular, depthwise, pointwise) multiplies and adds in f32x4; no atomics;
    kernel stack frames far below the module's stack."""
    model, _ = MODELS["mobilenet_v2"]()
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
