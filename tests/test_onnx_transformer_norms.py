"""ONNX RMSNormalization (one fused kernel on float32; other dtypes through the spec's function body) and
RotaryEmbedding, through the whole flow against onnxruntime."""
import numpy as np
import pytest
from fixtures.onnx_struct_compare import make_model

import tether
from tether.errors import UnsupportedOpError
from tether.frontend import from_onnx

RNG = np.random.default_rng(7)


def _r(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("shape,axis,scale_shape", [((2, 5, 16), -1, (16,)), ((2, 3, 4, 5), 1, (3, 4, 5)),
                                                     ((3, 4), 0, (3, 4)), ((2, 3, 8), -2, (1, 8)),
                                                     ((2, 3, 8), 2, (2, 3, 8))])
def test_rms_normalization_is_one_kernel(onnx_compare, shape, axis, scale_shape):
    x = _r(*shape)
    model = make_model("RMSNormalization", {"x": x}, {"axis": axis, "epsilon": 1e-3}, opset=23,
                       initializers={"scale": _r(*scale_shape)})
    onnx_compare(model, {"x": x})
    graph, params = from_onnx(model)
    assert [n.op for n in graph.nodes] == ["rms_normalize"]
    assert tether.build_graph(graph, params, target="host").kernel_count == 1


def test_rms_normalization_float64_goes_through_the_function_body(onnx_compare):
    x = _r(2, 6, dtype=np.float64)
    model = make_model("RMSNormalization", {"x": x}, {}, opset=23, initializers={"scale": _r(6, dtype=np.float64)})
    onnx_compare(model, {"x": x})
    assert "rms_normalize" not in [n.op for n in from_onnx(model)[0].nodes]


def test_rms_normalization_refuses_a_scale_that_does_not_broadcast():
    x = _r(2, 6)
    model = make_model("RMSNormalization", {"x": x}, {"axis": 1}, opset=23, initializers={"scale": _r(3, 6)})
    with pytest.raises(UnsupportedOpError, match="scale"):
        from_onnx(model)


# ---------------------------------------------------------------- RotaryEmbedding
def _rotary_model(x, attrs, cos, sin, pos=None, pos_runtime=False):
    from fixtures.onnx_struct_compare import make_graph_model
    from onnx import helper, numpy_helper
    names = ["x", "cos", "sin"] + (["pos"] if pos is not None else [])
    node = helper.make_node("RotaryEmbedding", names, ["y"], **attrs)
    feeds = {"x": x, "pos": pos} if pos_runtime else {"x": x}
    m = make_graph_model([node], feeds, ["y"], initializers={"cos": cos, "sin": sin}, opset=23)
    if pos is not None and not pos_runtime:
        m.graph.initializer.append(numpy_helper.from_array(pos, "pos"))
    return m, feeds


@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("rotary_dim", [0, 4])
@pytest.mark.parametrize("rank", [3, 4])
@pytest.mark.parametrize("positions", ["runtime", "constant", "none"])
def test_rotary_embedding_is_one_kernel(onnx_compare, interleaved, rotary_dim, rank, positions):
    b, n, s, h = 2, 3, 5, 8
    half = (rotary_dim or h) // 2
    x = _r(b, n, s, h) if rank == 4 else _r(b, s, n * h)
    attrs = {"interleaved": interleaved, "rotary_embedding_dim": rotary_dim}
    if rank == 3:
        attrs["num_heads"] = n
    if positions == "none":
        m, feeds = _rotary_model(x, attrs, _r(b, s, half), _r(b, s, half))
    else:
        pos = RNG.integers(0, 10, (b, s)).astype(np.int64)
        m, feeds = _rotary_model(x, attrs, _r(10, half), _r(10, half), pos, positions == "runtime")
    onnx_compare(m, feeds)
    graph, params = from_onnx(m)
    assert "rotary_embedding" in [n.op for n in graph.nodes]
    assert tether.build_graph(graph, params, target="host").kernel_count <= 3


def test_rotary_embedding_refuses_an_odd_rotary_dim():
    m, _ = _rotary_model(_r(1, 2, 3, 8), {"rotary_embedding_dim": 3}, _r(1, 3, 1), _r(1, 3, 1))
    with pytest.raises(UnsupportedOpError, match="rotary_embedding_dim=3"):
        from_onnx(m)
