"""Real models through the whole flow (ONNX -> graph -> passes -> one .so -> graph executor) on the host:
the digits CNN trained in this repo (real weights) and mobilenet_v2 with random weights, against onnxruntime."""
import pathlib

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import tether
from fixtures.scripts import load_script
from tether import graph_executor
from tether.frontend import from_onnx

ROOT = pathlib.Path(__file__).resolve().parent.parent
DIGITS = ROOT / "tests" / "data" / "digits_cnn.onnx"


def _compile(model, shape, folder):
    graph, params = from_onnx(model, shape=shape)
    factory = tether.build_graph(graph, params, target="host", opt_level=3)
    factory.export(str(folder))
    return factory, graph_executor.load(str(folder))


def test_digits_cnn_accuracy_equals_onnxruntime(tmp_path):
    pytest.importorskip("sklearn", reason="scikit-learn ships the digits data set (pip install scikit-learn)")
    digits = load_script("make_digits_model")
    x, y = digits.load_digits_nchw()
    _, _, x_test, y_test = digits.held_out_split(x, y)
    model = onnx.load(str(DIGITS))
    factory, gm = _compile(model, {"input": (len(x_test), 1, 8, 8)}, tmp_path)
    # batch norm folded into the conv, conv+bias+relu fused
    assert "batch_norm" not in str(factory.graph) and "fused[conv2d+add+relu]" in str(factory.graph)
    gm.set_input("input", x_test)
    gm.run()
    probs = gm.get_output(0)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"input": x_test})[0]
    np.testing.assert_allclose(probs, ref, rtol=1e-4, atol=1e-5)
    acc_tether = float((probs.argmax(axis=1) == y_test).mean())
    acc_ort = float((ref.argmax(axis=1) == y_test).mean())
    assert acc_tether == acc_ort and acc_tether > 0.9, (acc_tether, acc_ort)


def test_mobilenet_v2_random_weights_matches_onnxruntime(tmp_path):
    """A narrow, small-input mobilenet_v2 keeps the compile short; the structure is the full network's."""
    model = load_script("make_mobilenet_v2").build_mobilenet_v2(seed=1, size=64, width=0.5, classes=100)
    factory, gm = _compile(model, {}, tmp_path)
    ops_used = factory.graph.ops_used()
    # (channels last from the stem's output on, graph/passes/float_layout.py: the global pool is a mean over the
    # pixels, no transpose anywhere)
    assert set(ops_used) <= {"fused", "reduce", "reshape"}, ops_used
    x = np.random.default_rng(0).standard_normal((1, 3, 64, 64)).astype(np.float32)
    gm.run(input=x)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"input": x})[0]
    np.testing.assert_allclose(gm.get_output(0), ref, rtol=1e-3, atol=1e-4 * float(np.abs(ref).max()))
