"""Convolutions of a batch as one implicit GEMM (graph/conv_gemm.py, ops.conv2d_pixels over every image's
pixels): a video net's spatial convs (its frames a batch) and any batched model took the direct kernel before.
Checked against numpy at the op level and against onnxruntime through the whole build: strides, padding, groups on
8-wide panels, a per-image residual and a per-channel bias in the fused epilogue; the weights packed at build
time."""
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from tether import ops, te
from tether.frontend import from_onnx
from tether.graph import conv_gemm
from tether.graph.passes import optimize
from tether.target import Target


def _ref(x, w, stride, pad, groups=1):
    import onnxruntime as ort

    node = helper.make_node("Conv", ["x", "w"], ["y"], strides=[stride] * 2, pads=[pad] * 4, group=groups)
    graph = helper.make_graph([node], "c", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


@pytest.mark.parametrize("batch,ch,oc,hw,k,stride,pad", [(3, 5, 20, 9, 3, 1, 1), (2, 16, 32, 11, 3, 2, 0),
                                                          (4, 3, 16, 7, 1, 1, 0)])
def test_conv2d_pixels_over_a_batch(run_ops, rng, batch, ch, oc, hw, k, stride, pad):
    from tether.ops.linear import pack_panels_array

    x = rng.standard_normal((batch, ch, hw, hw)).astype("float32")
    w = rng.standard_normal((oc, ch, k, k)).astype("float32")
    bias = rng.standard_normal((oc, 1)).astype("float32")
    packed = pack_panels_array(w.reshape(oc, -1))
    X = te.placeholder(x.shape, "float32", name="X")
    W = te.placeholder(packed.shape, "float32", name="W")
    B = te.placeholder(bias.shape, "float32", name="B")
    conv = ops.conv2d_pixels(X, W, (k, k), stride, pad, out_channels=oc)
    (out,) = run_ops([(X, x), (W, packed), (B, bias)], [ops.relu(ops.add(conv, B))])
    ref = np.maximum(_ref(x, w, stride, pad) + bias.reshape(1, oc, 1, 1), 0)
    np.testing.assert_allclose(out, ref.reshape(batch, oc, -1), rtol=1e-4, atol=1e-4)


def _model(batch: int, groups: int):
    """x (batch, 48, 10, 10) -> conv 3x3 48 -> 48 (groups) + bias -> + r (another input, per image) -> relu."""
    rng = np.random.default_rng(4)
    w = rng.normal(0, 0.2, (48, 48 // groups, 3, 3)).astype(np.float32)
    b = rng.normal(0, 0.1, 48).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1] * 4, group=groups),
             helper.make_node("Add", ["c", "r"], ["s"]), helper.make_node("Relu", ["s"], ["y"])]
    graph = helper.make_graph(nodes, "res", [helper.make_tensor_value_info(v, TensorProto.FLOAT, [batch, 48, 10, 10])
                                             for v in ("x", "r")],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


@pytest.mark.parametrize("groups", [1, 2], ids=["dense", "groups-of-24"])
def test_a_batched_residual_block_runs_as_a_gemm(onnx_compare, groups):
    model = _model(3, groups)
    g, p = optimize(*from_onnx(model), opt_level=3)
    packed = conv_gemm.pack_conv_weights(g, dict(p), Target("host"))
    assert list(packed.values()) == [(48, 48 // groups, 3, 3)]     # packed: it runs as conv2d_pixels
    rng = np.random.default_rng(8)
    feeds = {v: rng.normal(size=(3, 48, 10, 10)).astype(np.float32) for v in ("x", "r")}
    onnx_compare(model, feeds, rtol=1e-4, atol=1e-4)
