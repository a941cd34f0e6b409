"""ONNX MatMul with numpy broadcasting (N-D x N-D, 1-D operands) through the whole flow against onnxruntime."""
import numpy as np
import pytest
from fixtures.onnx_struct_compare import make_model

RNG = np.random.default_rng(0)


@pytest.mark.parametrize("a,b", [((2, 1, 3, 4), (5, 4, 6)), ((3, 4), (2, 4, 5)), ((4,), (2, 4, 3)),
                                 ((2, 3, 4), (4,)), ((4,), (4,)), ((1, 3, 4), (2, 4, 5)), ((2, 3, 5, 4), (4, 7))])
def test_matmul_broadcast(onnx_compare, a, b):
    x, y = RNG.standard_normal(a).astype(np.float32), RNG.standard_normal(b).astype(np.float32)
    model = make_model("MatMul", {"a": x, "b": y}, {}, opset=13)
    onnx_compare(model, {"a": x, "b": y})


def test_matmul_constant_weight_3d(onnx_compare):
    x = RNG.standard_normal((2, 5, 8)).astype(np.float32)
    w = RNG.standard_normal((8, 3)).astype(np.float32)
    model = make_model("MatMul", {"a": x}, {}, opset=13, initializers={"w": w})
    onnx_compare(model, {"a": x})
