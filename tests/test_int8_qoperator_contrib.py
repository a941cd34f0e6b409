"""More com.microsoft QOperator ops (frontend/onnx/qoperator_contrib.py) against onnxruntime, bit for
bit over every int8/uint8 input value: QLinearLeakyRelu, QLinearAveragePool, QLinearWhere, QLinearSoftmax; the
refusals; and QuickGelu (float, frontend/onnx/contrib_activations.py)."""
import numpy as np
import pytest
from onnx import helper, numpy_helper

from tether.errors import UnsupportedOpError
from tether.frontend import from_onnx

SHAPE = (1, 16, 16, 16)
CODE = {"uint8": 2, "int8": 3, "bool": 9}


def _model(op, inputs: dict, inits: dict, order, attrs=None, out_dtype="uint8"):
    node = helper.make_node(op, order, ["y"], domain="com.microsoft", **(attrs or {}))
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info(n, CODE[str(v.dtype)], list(v.shape))
                                        for n, v in inputs.items()],
                          [helper.make_tensor_value_info("y", CODE[out_dtype], None)],
                          [numpy_helper.from_array(np.asarray(v), n) for n, v in inits.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid("com.microsoft", 1)])


def _every_value(dtype, seed=0):
    info = np.iinfo(dtype)
    v = np.resize(np.arange(info.min, info.max + 1), int(np.prod(SHAPE)))
    return np.random.default_rng(seed).permutation(v).reshape(SHAPE).astype(dtype)


def _params(dtype, k):
    rng = np.random.default_rng(k)
    off = 128 if dtype == "uint8" else 0
    return (np.array(rng.uniform(0.005, 0.1), np.float32), np.array(rng.integers(-40, 40) + off, dtype),
            np.array(rng.uniform(0.005, 0.1), np.float32), np.array(rng.integers(-40, 40) + off, dtype))


@pytest.mark.parametrize("dtype", ["uint8", "int8"])
def test_qlinear_leaky_relu(onnx_compare, dtype):
    x = _every_value(dtype)
    for k in range(3):
        sx, zx, sy, zy = _params(dtype, k)
        model = _model("QLinearLeakyRelu", {"x": x}, {"sx": sx, "zx": zx, "sy": sy, "zy": zy},
                       ["x", "sx", "zx", "sy", "zy"], {"alpha": 0.1 + 0.2 * k}, dtype)
        onnx_compare(model, {"x": x}, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", ["uint8", "int8"])
@pytest.mark.parametrize("attrs", [{"kernel_shape": [3, 3], "strides": [2, 2]},
                                   {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]},
                                   {"kernel_shape": [2, 4], "pads": [1, 0, 0, 2], "strides": [1, 2],
                                    "count_include_pad": 1}])
def test_qlinear_average_pool(onnx_compare, dtype, attrs):
    x = _every_value(dtype)
    for k in range(3):
        sx, zx, sy, zy = _params(dtype, k)
        model = _model("QLinearAveragePool", {"x": x}, {"sx": sx, "zx": zx, "sy": sy, "zy": zy},
                       ["x", "sx", "zx", "sy", "zy"], attrs, dtype)
        onnx_compare(model, {"x": x}, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", ["uint8", "int8"])
def test_qlinear_where(onnx_compare, dtype):
    x, b = _every_value(dtype, 1), _every_value(dtype, 2)
    cond = np.random.default_rng(3).random(SHAPE) < 0.5
    for k in range(3):
        sx, zx, sy, zy = _params(dtype, k)
        sz, zz = _params(dtype, k + 10)[:2]
        inits = {"sx": sx, "zx": zx, "sy": sy, "zy": zy, "sz": sz, "zz": zz}
        model = _model("QLinearWhere", {"c": cond, "x": x, "b": b}, inits,
                       ["c", "x", "sx", "zx", "b", "sy", "zy", "sz", "zz"], out_dtype=dtype)
        onnx_compare(model, {"c": cond, "x": x, "b": b}, rtol=0, atol=0)


def test_qlinear_average_pool_refusals():
    x = _every_value("uint8")
    inits = {"sx": np.array(0.1, np.float32), "zx": np.array(3, np.uint8), "sy": np.array(0.1, np.float32),
             "zy": np.array(3, np.uint8)}
    for attrs in ({"kernel_shape": [3, 3], "ceil_mode": 1}, {"kernel_shape": [3, 3], "channels_last": 1},
                  {"kernel_shape": [3, 3], "auto_pad": "SAME_UPPER"}):
        model = _model("QLinearAveragePool", {"x": x}, inits, ["x", "sx", "zx", "sy", "zy"], attrs)
        with pytest.raises(UnsupportedOpError, match="QLinearAveragePool"):
            from_onnx(model)


@pytest.mark.parametrize("dtype", ["uint8", "int8"])
@pytest.mark.parametrize("opset,axis", [(13, -1), (13, 1), (12, 2)])
def test_qlinear_softmax(onnx_compare, dtype, opset, axis):
    """Including quantize_static's output params (1/256, zero point at the type's minimum), where a row that one
    element dominates reaches 256 steps and saturates. Bit for bit along the last axis; along another axis
    onnxruntime (which transposes the row last) once rounded an exact tie (53.5 in tether's float32) down, so
    there: within one step on >= 99.9% of the elements, the rest exact."""
    x = _every_value(dtype)
    low = 0 if dtype == "uint8" else -128
    for k, (sx, sy, zy) in enumerate([(0.1, 1 / 256, low), (0.02, 1 / 256, low), (0.5, 0.0071, low + 9)]):
        inits = {"sx": np.array(sx, np.float32), "zx": np.array(low + 37, dtype), "sy": np.array(sy, np.float32),
                 "zy": np.array(zy, dtype)}
        model = _model("QLinearSoftmax", {"x": x}, inits, ["x", "sx", "zx", "sy", "zy"],
                       {"axis": axis, "opset": opset}, dtype)
        if axis == 1 and opset >= 13:
            (got,), (ref,) = onnx_compare(model, {"x": x}, check=False)
            d = np.abs(got.astype(np.int32) - ref.astype(np.int32))
            assert d.max() <= 1 and np.mean(d == 0) >= 0.999, (d.max(), np.mean(d == 0))
        else:
            onnx_compare(model, {"x": x}, rtol=0, atol=0)


@pytest.mark.parametrize("alpha", [None, 1.0, 0.5])
def test_quick_gelu(onnx_compare, alpha):
    """QuickGelu (a float op of the same domain): within float32 rounding of onnxruntime's (its sigmoid is
    MLAS's approximation, a few ulp from tether's)."""
    x = np.random.default_rng(4).normal(0, 3, (4, 64)).astype(np.float32)
    node = helper.make_node("QuickGelu", ["x"], ["y"], domain="com.microsoft",
                            **({} if alpha is None else {"alpha": alpha}))
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", 1, list(x.shape))],
                          [helper.make_tensor_value_info("y", 1, None)])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid("com.microsoft", 1)])
    onnx_compare(model, {"x": x}, rtol=1e-5, atol=1e-6)
