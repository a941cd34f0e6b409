"""ONNX Reduce* and ArgMax/ArgMin through the whole flow (import, build, graph executor) against onnxruntime."""
import numpy as np
import pytest
from fixtures.onnx_struct_compare import make_model

from tether.errors import UnsupportedOpError
from tether.frontend import from_onnx

KINDS = ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
         "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare"]


def _data(op, shape, seed=0):
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    if op in ("ReduceLogSum",):
        x = np.abs(x) + 0.1
    if op == "ReduceProd":
        x = (np.sign(x) * (0.5 + np.abs(x) % 1.0)).astype(np.float32)
    return x


@pytest.mark.parametrize("op", KINDS)
@pytest.mark.parametrize("axes,keepdims", [([1], 1), ([-1], 0), ([0, 2], 1), (None, 0)])
def test_reduce_opset18_axes_input(onnx_compare, op, axes, keepdims):
    x = _data(op, (3, 4, 5))
    inits = {"axes": np.array(axes, np.int64)} if axes is not None else {}
    model = make_model(op, {"x": x}, {"keepdims": keepdims}, opset=18, initializers=inits)
    onnx_compare(model, {"x": x})


@pytest.mark.parametrize("op", KINDS)
def test_reduce_opset13_axes_attribute(onnx_compare, op):
    x = _data(op, (2, 3, 4))
    opset = 11 if op == "ReduceSum" else 13
    model = make_model(op, {"x": x}, {"axes": [0, -1], "keepdims": 0}, opset=opset)
    onnx_compare(model, {"x": x})


def test_reduce_sum_opset13_axes_input_and_noop(onnx_compare):
    x = _data("ReduceSum", (2, 3, 4))
    model = make_model("ReduceSum", {"x": x}, {"keepdims": 1, "noop_with_empty_axes": 1}, opset=13,
                       initializers={"axes": np.zeros((0,), np.int64)})
    onnx_compare(model, {"x": x})
    model = make_model("ReduceSum", {"x": x}, {"keepdims": 0}, opset=13,
                       initializers={"axes": np.zeros((0,), np.int64)})
    onnx_compare(model, {"x": x})


@pytest.mark.parametrize("op", ["ReduceMax", "ReduceSum", "ReduceMin"])
def test_reduce_int(onnx_compare, op):
    x = np.random.default_rng(1).integers(-50, 50, (3, 5)).astype(np.int64)
    model = make_model(op, {"x": x}, {"keepdims": 0}, opset=18, initializers={"axes": np.array([1], np.int64)})
    onnx_compare(model, {"x": x})


@pytest.mark.parametrize("keepdims", [0, 1])
def test_reduce_mean_spatial_is_global_pool(onnx_compare, keepdims):
    """torch's adaptive average pool: ReduceMean over H, W runs as the global-pool kernel."""
    x = _data("ReduceMean", (1, 32, 14, 14))
    model = make_model("ReduceMean", {"x": x}, {"keepdims": keepdims}, opset=18,
                       initializers={"axes": np.array([-2, -1], np.int64)})
    graph, _ = from_onnx(model)
    assert set(graph.ops_used()) == ({"global_avg_pool"} if keepdims else {"global_avg_pool", "reshape"})
    onnx_compare(model, {"x": x})


def test_reduce_refuses_int_mean():
    x = np.zeros((2, 3), np.int32)
    with pytest.raises(UnsupportedOpError, match="ReduceMean on int32"):
        from_onnx(make_model("ReduceMean", {"x": x}, {}, opset=18))


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("axis,keepdims,last", [(0, 1, 0), (1, 0, 0), (-1, 1, 1), (1, 0, 1)])
def test_arg_reduce(onnx_compare, op, axis, keepdims, last):
    # repeated values so first/last index differ
    x = np.random.default_rng(2).integers(0, 4, (3, 6, 5)).astype(np.float32)
    model = make_model(op, {"x": x}, {"axis": axis, "keepdims": keepdims, "select_last_index": last}, opset=13)
    onnx_compare(model, {"x": x})


@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin", "ReduceSum", "ReduceProd"])
@pytest.mark.parametrize("dtype", [np.float32, np.int64])
def test_reduce_empty_set_identity(onnx_compare, op, dtype):
    """Reducing over an axis of extent 0 gives the reduction's identity (opset 18)."""
    x = np.zeros((2, 0, 3), dtype)
    model = make_model(op, {"x": x}, {"keepdims": 1}, opset=18, initializers={"axes": np.array([1], np.int64)})
    graph, params = from_onnx(model)
    ref = np.full((2, 1, 3), {"ReduceMax": np.iinfo(np.int64).min if dtype == np.int64 else -np.inf,
                              "ReduceMin": np.iinfo(np.int64).max if dtype == np.int64 else np.inf,
                              "ReduceSum": 0, "ReduceProd": 1}[op], dtype)
    np.testing.assert_array_equal(params["y0"], ref)


@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin"])
@pytest.mark.parametrize("keepdims", [0, 1])
def test_reduce_bool_any_all(onnx_compare, op, keepdims):
    x = np.random.default_rng(3).random((3, 4, 5)) > 0.7
    model = make_model(op, {"x": x}, {"keepdims": keepdims}, opset=20, initializers={"axes": np.array([1], np.int64)})
    onnx_compare(model, {"x": x})


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceLogSumExp", "ReduceL2"])
def test_reduce_float64(onnx_compare, op):
    x = np.random.default_rng(4).standard_normal((2, 3, 4))
    model = make_model(op, {"x": x}, {"keepdims": 0}, opset=18, initializers={"axes": np.array([0, 2], np.int64)})
    onnx_compare(model, {"x": x}, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.float64])
def test_arg_reduce_dtypes(onnx_compare, dtype):
    x = np.random.default_rng(5).integers(-3, 3, (4, 5)).astype(dtype)
    onnx_compare(make_model("ArgMax", {"x": x}, {"axis": 1}, opset=13), {"x": x})
