"""ONNX Sin/Cos/Tan/Asin/Acos/Atan, the window functions, MelWeightMatrix, BitCast, Mod fmod=0 on floats and
LpPool through the whole flow against onnxruntime (MelWeightMatrix: ONNX's reference)."""
import numpy as np
import pytest
from fixtures.onnx_struct_compare import make_graph_model, make_model
from onnx import helper

from tether.errors import UnsupportedOpError
from tether.frontend import from_onnx

RNG = np.random.default_rng(21)
WIDE = np.concatenate([np.linspace(-20, 20, 200), [0.0, -0.0, 1e4, -3e5, 1e7, 3.14159265, 1.5707964]])


@pytest.mark.parametrize("op,points", [("Sin", WIDE), ("Cos", WIDE), ("Tan", WIDE), ("Atan", WIDE),
                                       ("Asin", np.linspace(-1, 1, 101)), ("Acos", np.linspace(-1, 1, 101))])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_trig(onnx_compare, op, points, dtype):
    x = points.astype(dtype).reshape(1, -1)
    # onnxruntime has no float64 Tan/Asin/Acos/Atan kernels: numpy's answer there
    fn = {"Sin": np.sin, "Cos": np.cos, "Tan": np.tan, "Atan": np.arctan, "Asin": np.arcsin, "Acos": np.arccos}[op]
    expected = [fn(x)] if dtype == np.float64 else None
    onnx_compare(make_model(op, {"x": x}, opset=7), {"x": x}, rtol=2e-6 if dtype == np.float32 else 1e-12,
                 atol=1e-7 if dtype == np.float32 else 1e-14, expected=expected)


@pytest.mark.parametrize("op", ["HannWindow", "HammingWindow", "BlackmanWindow"])
@pytest.mark.parametrize("periodic,dtype", [(1, 1), (0, 1), (1, 11), (0, 7)])
def test_windows(onnx_compare, op, periodic, dtype):
    model = make_model(op, {}, {"periodic": periodic, "output_datatype": dtype}, opset=17,
                       initializers={"size": np.array(10, np.int64)})
    onnx_compare(model, {}, rtol=1e-6, atol=1e-7)


def test_mel_weight_matrix():
    from onnx.reference import ReferenceEvaluator

    from tether.frontend.onnx.signal import mel_weight_matrix
    args = [np.array(8, np.int64), np.array(64, np.int64), np.array(16000, np.int64), np.array(100.0, np.float32),
            np.array(6000.0, np.float32)]
    names = ["bins", "dft", "rate", "lo", "hi"]
    model = make_model("MelWeightMatrix", {}, {}, opset=17, initializers=dict(zip(names, args)))
    ref = ReferenceEvaluator(model).run(None, {})[0]
    graph, params = from_onnx(model)
    assert not graph.nodes and graph.outputs[0] in params
    np.testing.assert_allclose(params[graph.outputs[0]], ref, rtol=1e-6)
    np.testing.assert_allclose(mel_weight_matrix(8, 64, 16000, 100.0, 6000.0), ref, rtol=1e-6)


@pytest.mark.parametrize("src,to", [(np.float32, 6), (np.int32, 1), (np.float64, 7), (np.int64, 11),
                                    (np.int8, 2), (np.uint8, 3)])
def test_bitcast(onnx_compare, src, to):
    x = (RNG.standard_normal((3, 4)) * 100).astype(src)
    onnx_compare(make_model("BitCast", {"x": x}, {"to": to}, opset=26), {"x": x}, rtol=0, atol=0)


def test_bitcast_between_kernels(onnx_compare):
    """A BitCast is a view with another dtype: the kernel after it reads the same bytes as integers."""
    x = RNG.standard_normal((2, 5)).astype(np.float32)
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("BitCast", ["r"], ["b"], to=6),
             helper.make_node("Add", ["b", "one"], ["y"])]
    model = make_graph_model(nodes, {"x": x}, ["y"], {"one": np.array([1], np.int32)}, opset=26)
    onnx_compare(model, {"x": x}, rtol=0, atol=0)


def test_bitcast_refuses_width_change():
    x = RNG.standard_normal((2, 2)).astype(np.float32)
    with pytest.raises(UnsupportedOpError, match="width"):
        from_onnx(make_model("BitCast", {"x": x}, {"to": 7}, opset=26))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_float_mod_sign_of_divisor(onnx_compare, dtype):
    a = np.concatenate([RNG.uniform(-50, 50, 60), [0.0, -0.0, 5.0, -5.0, 7.5, -7.5, 3.0, -3.0, np.inf, 1.0]])
    b = np.concatenate([RNG.uniform(-9, 9, 60), [2.0, -2.0, 2.5, 2.5, -2.5, -2.5, np.inf, np.inf, 2.0, -np.inf]])
    a, b = a.astype(dtype), b.astype(dtype)
    onnx_compare(make_model("Mod", {"a": a, "b": b}, {"fmod": 0}, opset=28), {"a": a, "b": b}, rtol=1e-6, atol=1e-6)


def test_float_mod_fmod_0_refused_before_opset_28():
    a = np.ones(3, np.float32)
    with pytest.raises(UnsupportedOpError, match="opset 28"):
        from_onnx(make_model("Mod", {"a": a, "b": a}, {"fmod": 0}, opset=13))


@pytest.mark.parametrize("attrs", [{"kernel_shape": [3, 3]}, {"kernel_shape": [2, 2], "p": 1, "strides": [2, 2]},
                                   {"kernel_shape": [3, 2], "p": 3, "pads": [1, 0, 1, 1]},
                                   {"kernel_shape": [2, 2], "dilations": [2, 1]},
                                   {"kernel_shape": [3, 2], "auto_pad": "SAME_LOWER"}])
def test_lp_pool(onnx_compare, attrs):
    x = RNG.standard_normal((1, 2, 6, 7)).astype(np.float32)
    onnx_compare(make_model("LpPool", {"x": x}, attrs, opset=18), {"x": x}, rtol=1e-5, atol=1e-5)
