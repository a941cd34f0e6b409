"""Every wasm32 op family (tests/wasm_cases.py CASES: float32, int8, float16, LSTM, ...) and every whole model of
the wasm32 tests (MODELS: mobilenet_v2, a YOLOv8-style detector, CRNN and SVTR text recognizers, a transformer
encoder, a voice-activity detector) compiled for wasm32 and run in headless Chromium, against onnxruntime, with
the builders, inputs, build options and comparisons of the node tests (tests/test_wasm_target.py,
tests/test_wasm_models.py).

One tab, opened on the page `rpc-tracker --web` serves, is the device for the whole module; each test requests it
from that real tracker as a Python client would (`tracker.request(key)`), uploads the model folder and runs it
through the graph built-ins (`remote.graph_executor`), which drive the JavaScript graph executor in the tab.
"""
from __future__ import annotations

import numpy as np
import pytest
from fixtures.web_device import BROWSER_KEY
from wasm_cases import CASES, INT8_CASES, MODELS, compare_case, compare_model, ort_reference

import tether
from tether.frontend import from_onnx

REQUEST_TIMEOUT = 120.0   # the tab serves one session at a time; a slow earlier one must not fail the next


def _run_in_tab(tracker, folder: str, feeds: dict, n_outputs: int) -> list:
    with tracker.client() as client, client.request(BROWSER_KEY, wait_timeout=REQUEST_TIMEOUT) as remote:
        info = remote.device_info()
        assert info["runtime"] == "browser" and "Chrome" in info["user_agent"], info
        with remote.graph_executor(folder) as gm:
            gm.run(**feeds)
            assert gm.get_num_outputs() == n_outputs
            return [np.asarray(gm.get_output(i)) for i in range(n_outputs)]


@pytest.mark.parametrize("name", list(CASES))
def test_op_family_in_chromium_matches_onnxruntime(name, browser_tab, tmp_path):
    model, feeds = CASES[name]()
    ref = ort_reference(model, feeds)
    graph, params = from_onnx(model)
    tether.build_graph(graph, params, target="wasm32").export(str(tmp_path))
    worst = compare_case(name, _run_in_tab(browser_tab, str(tmp_path), feeds, len(ref)), ref)
    print("%s: max %s %.3g in Chromium" % (name, "step difference" if name in INT8_CASES else "relative error", worst))


@pytest.mark.parametrize("name", list(MODELS))
def test_model_in_chromium_matches_onnxruntime(name, browser_tab, tmp_path):
    model, feeds = MODELS[name]()
    ref = ort_reference(model, feeds, threads=1)
    graph, params = from_onnx(model)
    tether.build_graph(graph, params, target="wasm32", opt_level=3).export(str(tmp_path))
    worst = compare_model(_run_in_tab(browser_tab, str(tmp_path), feeds, len(ref)), ref)
    print("%s: max relative error %.3g in Chromium" % (name, worst))
