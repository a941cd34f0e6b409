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
