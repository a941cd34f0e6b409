"""A dense layer over one row on Arm: its constant weight is packed into panels at build time (graph/dense_panels.py),
so the product is a multiply-add by element of each weight vector, and the emulated rasp4b (A72) and armv7 (A7)
match onnxruntime; on x86 one row keeps the row dot products."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from fixtures.onnx_struct_compare import make_graph_model
from onnx import helper

import tether
from tether import rpc
from tether.frontend import from_onnx
from tether.rpc.graph_client import RemoteGraphExecutor

RNG = np.random.default_rng(5)


def _mlp():
    """x (1, 37) -> Gemm 37 -> 70 (transB), Relu -> MatMul 70 -> 10, Add: odd sizes, both weight layouts."""
    x = RNG.standard_normal((1, 37)).astype(np.float32)
    inits = {"w1": RNG.standard_normal((70, 37)).astype(np.float32), "b1": RNG.standard_normal(70).astype(np.float32),
             "w2": RNG.standard_normal((70, 10)).astype(np.float32), "b2": RNG.standard_normal(10).astype(np.float32)}
    nodes = [helper.make_node("Gemm", ["x", "w1", "b1"], ["h"], transB=1), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("MatMul", ["r", "w2"], ["m"]), helper.make_node("Add", ["m", "b2"], ["y"])]
    return make_graph_model(nodes, {"x": x}, ["y"], inits), x


def _packed(factory) -> list:
    return [b for n in factory.graph.nodes for b in n.body() if b.op == "dense" and "packed_n" in b.attrs]


def test_one_row_packs_on_arm_not_on_x86():
    model, _ = _mlp()
    graph, params = from_onnx(model)
    assert len(_packed(tether.build_graph(graph, params, target="rasp4b"))) == 2
    assert len(_packed(tether.build_graph(graph, params, target="armv7-a7"))) == 2
    assert not _packed(tether.build_graph(graph, params, target="x86_64"))


@pytest.mark.emulated
@pytest.mark.parametrize("preset", ["rasp4b", "armv7-a7"])
def test_one_row_dense_on_emulated_arm(emulated_devices, preset, tmp_path):
    device = emulated_devices.for_preset(preset)
    model, x = _mlp()
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    graph, params = from_onnx(model)
    factory = tether.build_graph(graph, params, target=preset)
    assert len(_packed(factory)) == 2
    factory.export(str(tmp_path / "mlp"))
    with rpc.connect(*device.address, timeout=300) as sess:
        with RemoteGraphExecutor(sess, str(tmp_path / "mlp")) as gm:
            gm.set_input("x", x)
            gm.run()
            np.testing.assert_allclose(gm.get_output(0), want, rtol=1e-5, atol=1e-5)
