"""Narrow float layers on Arm. A dense layer over one row: its constant weight is packed into panels at build time
(graph/dense_panels.py), so the product is a multiply-add by element of each weight vector (on x86 one row keeps the
row dot products). A conv into at most 8 channels (a stem): 8-wide weight panels (graph/conv_gemm.panel_width) and
a register block of more pixels. The emulated rasp4b (A72) and armv7 (A7) match onnxruntime."""
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


def _stem():
    """x (1, 3, 15, 16) -> Conv 3 -> 8 (3x3, pads 1) + Relu -> Conv 8 -> 5 (3x3, stride 2): pixel counts that the
    wider register block does not divide."""
    x = RNG.standard_normal((1, 3, 15, 16)).astype(np.float32)
    f32 = np.float32
    inits = {"w1": RNG.standard_normal((8, 3, 3, 3)).astype(f32), "b1": RNG.standard_normal(8).astype(f32),
             "w2": RNG.standard_normal((5, 8, 3, 3)).astype(f32), "b2": RNG.standard_normal(5).astype(f32)}
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Conv", ["r", "w2", "b2"], ["y"], pads=[1, 1, 1, 1], strides=[2, 2])]
    return make_graph_model(nodes, {"x": x}, ["y"], inits), x


def _panel_widths(factory) -> list:
    return sorted(int(factory.params[b.inputs[1]].shape[-1]) for n in factory.graph.nodes for b in n.body()
                  if b.op == "conv2d" and factory.params[b.inputs[1]].ndim == 3)


def test_a_stem_conv_takes_8_wide_panels_on_arm():
    model, _ = _stem()
    graph, params = from_onnx(model)
    assert _panel_widths(tether.build_graph(graph, params, target="rasp4b")) == [8, 8]
    assert 8 not in _panel_widths(tether.build_graph(graph, params, target="x86_64"))


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
def test_narrow_layers_on_emulated_arm(emulated_devices, preset, tmp_path):
    device = emulated_devices.for_preset(preset)
    with rpc.connect(*device.address, timeout=300) as sess:
        for name, (model, x) in (("mlp", _mlp()), ("stem", _stem())):
            want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
                None, {"x": x})[0]
            graph, params = from_onnx(model)
            factory = tether.build_graph(graph, params, target=preset)
            assert len(_packed(factory)) == 2 if name == "mlp" else _panel_widths(factory) == [8, 8]
            factory.export(str(tmp_path / name))
            with RemoteGraphExecutor(sess, str(tmp_path / name)) as gm:
                gm.set_input("x", x)
                gm.run()
                np.testing.assert_allclose(gm.get_output(0), want, rtol=1e-4, atol=1e-4, err_msg=name)
