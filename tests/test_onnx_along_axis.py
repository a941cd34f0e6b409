"""ONNX CumSum, CumProd and TopK (constant k) through the whole flow against onnxruntime: every axis, exclusive
and reverse, integer types, ties (TopK keeps the lower index first, as onnxruntime does)."""
import itertools

import numpy as np
import pytest
from fixtures.onnx_struct_compare import make_model

from tether.errors import UnsupportedOpError
from tether.frontend import from_onnx

RNG = np.random.default_rng(8)


@pytest.mark.parametrize("op,axis,exclusive,reverse",
                         [(op, ax, e, r) for op in ("CumSum", "CumProd") for ax in (0, 1, -1)
                          for e, r in itertools.product((0, 1), (0, 1))])
def test_cumulative(onnx_compare, op, axis, exclusive, reverse):
    x = RNG.uniform(0.5, 1.5, (3, 5, 4)).astype(np.float32)
    model = make_model(op, {"x": x}, {"exclusive": exclusive, "reverse": reverse}, opset=14 if op == "CumSum" else 26,
                       initializers={"axis": np.array(axis, np.int64)})
    onnx_compare(model, {"x": x}, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.float64])
def test_cumsum_types(onnx_compare, dtype):
    x = RNG.integers(-50, 50, (4, 7)).astype(dtype)
    model = make_model("CumSum", {"x": x}, {"reverse": 1}, opset=14, initializers={"axis": np.array([1], np.int32)})
    onnx_compare(model, {"x": x})


def test_cumsum_refuses_runtime_axis():
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    model = make_model("CumSum", {"x": x, "axis": np.array(0, np.int64)}, opset=14)
    with pytest.raises(UnsupportedOpError, match="axis"):
        from_onnx(model)


@pytest.mark.parametrize("k,axis,largest", [(3, -1, 1), (1, 0, 1), (4, 1, 0), (6, -1, 0), (2, 0, 0)])
def test_topk(onnx_compare, k, axis, largest):
    x = RNG.integers(-4, 4, (5, 6)).astype(np.float32)           # many ties
    model = make_model("TopK", {"x": x}, {"axis": axis, "largest": largest}, opset=11, n_outputs=2,
                       initializers={"k": np.array([k], np.int64)})
    onnx_compare(model, {"x": x})


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint8])
def test_topk_integers(onnx_compare, dtype):
    x = RNG.integers(0, 5, (3, 8)).astype(dtype)
    model = make_model("TopK", {"x": x}, {}, opset=11, n_outputs=2, initializers={"k": np.array([5], np.int64)})
    onnx_compare(model, {"x": x})


def test_topk_refuses_k_past_the_axis():
    x = RNG.standard_normal((2, 3)).astype(np.float32)
    model = make_model("TopK", {"x": x}, {}, opset=11, n_outputs=2, initializers={"k": np.array([4], np.int64)})
    with pytest.raises(UnsupportedOpError, match="k=4"):
        from_onnx(model)
