"""The wasm32 test models: small ONNX models, one per op family (CASES), and whole models (MODELS), with the
reference (onnxruntime) and the comparison every wasm32 run must pass. tests/test_wasm_target.py and
tests/test_wasm_models.py run them in node, tests/test_browser_models.py in a Chromium tab."""
from __future__ import annotations

from typing import Callable, Dict, List, Sequence, Tuple

import numpy as np
from fixtures.onnx_struct_compare import make_graph_model, make_model
from fixtures.scripts import load_script
from onnx import TensorProto, helper, numpy_helper

from tether.testing.model_kinds import KINDS, relative_error

RNG = np.random.default_rng(11)


def _f(*shape: int, scale: float = 1.0) -> np.ndarray:
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def _node(op: str, ins: list, outs: list, **attrs) -> object:
    return helper.make_node(op, ins, outs, **attrs)


def elementwise_chain():
    x, y = _f(1, 8, 16, 16), _f(1, 8, 1, 16)
    nodes = [_node("Add", ["x", "y"], ["a"]), _node("Sigmoid", ["a"], ["s"]), _node("Mul", ["a", "s"], ["m"]),
             _node("Tanh", ["m"], ["t"]), _node("Exp", ["t"], ["e"]), _node("Div", ["e", "c"], ["d"]),
             _node("Clip", ["d", "lo", "hi"], ["out"])]
    inits = {"c": np.float32(1.7), "lo": np.float32(0.5), "hi": np.float32(2.0)}
    return make_graph_model(nodes, {"x": x, "y": y}, ["out"], inits), {"x": x, "y": y}


def erf_gelu_pow():
    x = _f(2, 37, 19)
    nodes = [_node("Div", ["x", "r2"], ["q"]), _node("Erf", ["q"], ["e"]), _node("Add", ["e", "one"], ["a"]),
             _node("Mul", ["x", "a"], ["m"]), _node("Mul", ["m", "half"], ["g"]), _node("Abs", ["g"], ["ab"]),
             _node("Sqrt", ["ab"], ["sq"]), _node("Pow", ["sq", "three"], ["p"]), _node("Add", ["p", "one"], ["p1"]),
             _node("Log", ["p1"], ["out"])]
    inits = {"r2": np.float32(np.sqrt(2)), "one": np.float32(1), "half": np.float32(0.5), "three": np.float32(3)}
    return make_graph_model(nodes, {"x": x}, ["out"], inits), {"x": x}


def matmul_batched():
    a, b = _f(2, 3, 17, 33), _f(2, 3, 33, 19)
    return make_model("MatMul", {"a": a, "b": b}), {"a": a, "b": b}


def dense_gemm():
    x = _f(4, 64)
    return make_model("Gemm", {"x": x}, {"transB": 1}, initializers={"w": _f(48, 64), "b": _f(48)}), {"x": x}


def matmul_weights():
    x = _f(1, 24, 96)
    return make_model("MatMul", {"x": x}, initializers={"w": _f(96, 80, scale=0.1)}), {"x": x}


def _conv(cin: int, cout: int, k: int, group: int = 1, stride: int = 1, hw: int = 14, **attrs):
    x = _f(1, cin, hw, hw)
    pad = k // 2
    inits = {"w": _f(cout, cin // group, k, k, scale=0.2), "b": _f(cout)}
    return make_model("Conv", {"x": x}, dict(pads=[pad] * 4, strides=[stride, stride], group=group, **attrs),
                      initializers=inits), {"x": x}


def conv_regular():
    return _conv(8, 16, 3)


def conv_strided():
    return _conv(6, 12, 3, stride=2, hw=15)


def conv_depthwise():
    return _conv(16, 16, 3, group=16)


def conv_pointwise():
    return _conv(24, 40, 1, hw=10)


def conv_grouped():
    return _conv(16, 24, 3, group=4)


def conv_relu_pool_chain():
    x = _f(1, 4, 16, 16)
    nodes = [_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]), _node("Relu", ["c"], ["r"]),
             _node("MaxPool", ["r"], ["p"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
             _node("AveragePool", ["p"], ["a"], kernel_shape=[2, 2], strides=[2, 2]),
             _node("GlobalAveragePool", ["a"], ["out"])]
    return make_graph_model(nodes, {"x": x}, ["out"], {"w": _f(8, 4, 3, 3, scale=0.3), "b": _f(8)}), {"x": x}


def pooling():
    x = _f(1, 6, 17, 17)
    nodes = [_node("MaxPool", ["x"], ["m"], kernel_shape=[3, 3], strides=[2, 2]),
             _node("AveragePool", ["x"], ["a"], kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1],
                   count_include_pad=0),
             _node("GlobalMaxPool", ["x"], ["g"])]
    return make_graph_model(nodes, {"x": x}, ["m", "a", "g"]), {"x": x}


def reductions():
    x = _f(3, 10, 7, 5)
    nodes = [_node("ReduceMean", ["x", "ax1"], ["m"], keepdims=1), _node("ReduceSum", ["x", "ax2"], ["s"],
                                                                          keepdims=0),
             _node("ReduceMax", ["x", "ax3"], ["x3"], keepdims=1), _node("ReduceL2", ["x", "ax1"], ["l2"])]
    inits = {"ax1": np.array([1], np.int64), "ax2": np.array([2, 3], np.int64), "ax3": np.array([-1], np.int64)}
    return make_graph_model(nodes, {"x": x}, ["m", "s", "x3", "l2"], inits), {"x": x}


def softmax():
    x = _f(2, 4, 13, 50, scale=3.0)
    nodes = [_node("Softmax", ["x"], ["s"], axis=-1), _node("LogSoftmax", ["x"], ["l"], axis=1)]
    return make_graph_model(nodes, {"x": x}, ["s", "l"]), {"x": x}


def layer_norm():
    x = _f(2, 9, 48)
    return make_model("LayerNormalization", {"x": x}, {"axis": -1, "epsilon": 1e-5},
                      initializers={"g": 1 + _f(48, scale=0.1), "b": _f(48)}), {"x": x}


def instance_norm():
    x = _f(2, 6, 9, 11)
    return make_model("InstanceNormalization", {"x": x}, {"epsilon": 1e-5},
                      initializers={"g": 1 + _f(6, scale=0.1), "b": _f(6)}), {"x": x}


def group_norm():
    x = _f(1, 8, 7, 9)
    return make_model("GroupNormalization", {"x": x}, {"num_groups": 4, "epsilon": 1e-5},
                      initializers={"g": 1 + _f(4, scale=0.1), "b": _f(4)}), {"x": x}   # (opset 18: per group)


def resize():
    x = _f(1, 3, 7, 9)
    nodes = [_node("Resize", ["x", "", "sc"], ["n"], mode="nearest"),
             _node("Resize", ["x", "", "sc"], ["l"], mode="linear", coordinate_transformation_mode="half_pixel")]
    inits = {"sc": np.array([1, 1, 2, 2], np.float32)}
    return make_graph_model(nodes, {"x": x}, ["n", "l"], inits), {"x": x}


def layout_transforms():
    x, y = _f(2, 3, 4, 5), _f(2, 3, 4, 2)
    nodes = [_node("Concat", ["x", "y"], ["c"], axis=3), _node("Transpose", ["c"], ["t"], perm=[0, 2, 3, 1]),
             _node("Reshape", ["t", "shape"], ["r"]), _node("Slice", ["r", "st", "en", "axs"], ["s"]),
             _node("DepthToSpace", ["x4"], ["d"], blocksize=2, mode="CRD"), _node("Flatten", ["d"], ["out2"]),
             _node("Transpose", ["s"], ["out1"], perm=[1, 0, 2])]
    inits = {"shape": np.array([2, 28, 3], np.int64), "st": np.array([1], np.int64),
             "en": np.array([20], np.int64), "axs": np.array([1], np.int64)}
    x4 = _f(1, 8, 3, 3)
    return (make_graph_model(nodes, {"x": x, "y": y, "x4": x4}, ["out1", "out2"], inits),
            {"x": x, "y": y, "x4": x4})


def indexing():
    x = _f(10, 6)
    upd = _f(3, 6)
    nodes = [_node("Gather", ["x", "idx"], ["g"], axis=0), _node("GatherElements", ["x", "gi"], ["ge"], axis=1),
             _node("ScatterND", ["x", "si", "upd"], ["sn"]),
             _node("ScatterElements", ["x", "gi", "ge"], ["se"], axis=1)]
    inits = {"idx": np.array([[3, 0], [9, 3]], np.int64), "gi": RNG.integers(0, 6, (10, 2)).astype(np.int64),
             "si": np.array([[1], [7], [4]], np.int64)}
    return make_graph_model(nodes, {"x": x, "upd": upd}, ["g", "ge", "sn", "se"], inits), {"x": x, "upd": upd}


def _q(name: str, scale: float, zp: int, dtype=np.uint8) -> Dict[str, np.ndarray]:
    return {name + "_s": np.float32(scale), name + "_z": np.array(zp, dtype)}


def qdq_conv():
    """QDQ: quantized activations (u8) and per-channel weights (s8) around a Conv, as quantize_static writes."""
    x = RNG.uniform(-1, 1, (1, 8, 12, 12)).astype(np.float32)
    wq = RNG.integers(-60, 60, (16, 8, 3, 3)).astype(np.int8)
    ws = (RNG.uniform(0.5, 1.5, 16) * 0.004).astype(np.float32)
    inits = dict(_q("x", 1 / 127, 128), **_q("y", 0.02, 128), w_q=wq, w_s=ws, w_z=np.zeros(16, np.int8),
                 b=_f(16, scale=0.1))
    nodes = [_node("QuantizeLinear", ["x", "x_s", "x_z"], ["xq"]),
             _node("DequantizeLinear", ["xq", "x_s", "x_z"], ["xd"]),
             _node("DequantizeLinear", ["w_q", "w_s", "w_z"], ["wd"], axis=0),
             _node("Conv", ["xd", "wd", "b"], ["c"], pads=[1, 1, 1, 1]), _node("Relu", ["c"], ["r"]),
             _node("QuantizeLinear", ["r", "y_s", "y_z"], ["yq"]),
             _node("DequantizeLinear", ["yq", "y_s", "y_z"], ["out"])]
    return make_graph_model(nodes, {"x": x}, ["out"], inits), {"x": x}


def qlinear_ops():
    """QOperator form: QLinearConv and QLinearMatMul on uint8 tensors."""
    x = RNG.integers(0, 255, (1, 8, 10, 10)).astype(np.uint8)
    a = RNG.integers(0, 255, (1, 12, 40)).astype(np.uint8)
    inits = dict(_q("x", 0.02, 120), **_q("w", 0.01, 0, np.int8), **_q("y", 0.05, 100),
                 w=RNG.integers(-100, 100, (12, 8, 3, 3)).astype(np.int8), b=RNG.integers(-500, 500, 12).astype(
                     np.int32), **_q("a", 0.03, 128), **_q("m", 0.02, 0, np.int8), **_q("o", 0.4, 128),
                 m=RNG.integers(-100, 100, (40, 24)).astype(np.int8))
    nodes = [_node("QLinearConv", ["x", "x_s", "x_z", "w", "w_s", "w_z", "y_s", "y_z", "b"], ["yc"],
                   pads=[1, 1, 1, 1]),
             _node("QLinearMatMul", ["a", "a_s", "a_z", "m", "m_s", "m_z", "o_s", "o_z"], ["ym"])]
    return make_graph_model(nodes, {"x": x, "a": a}, ["yc", "ym"], inits), {"x": x, "a": a}


def float16_chain():
    """float16 input, weights and output: a Conv, Softmax and a MatMul, computed in float32 between casts."""
    x = RNG.uniform(-1, 1, (1, 3, 10, 10)).astype(np.float16)
    inits = {"w": (RNG.standard_normal((8, 3, 3, 3)) * 0.3).astype(np.float16),
             "m": (RNG.standard_normal((10, 6)) * 0.3).astype(np.float16)}
    nodes = [_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), _node("Relu", ["c"], ["r"]),
             _node("MatMul", ["r", "m"], ["mm"]), _node("Softmax", ["mm"], ["out"], axis=-1)]
    graph = helper.make_graph(nodes, "f16", [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [1, 3, 10, 10])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT16, [1, 8, 10, 6])],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), {"x": x}


def lstm():
    x = _f(7, 1, 12)
    hid = 16
    inits = {"W": _f(1, 4 * hid, 12, scale=0.3), "R": _f(1, 4 * hid, hid, scale=0.3), "B": _f(1, 8 * hid, scale=0.1)}
    return make_graph_model([_node("LSTM", ["x", "W", "R", "B"], ["y"], hidden_size=hid)], {"x": x}, ["y"],
                            inits), {"x": x}


# name -> builder of (model, feeds); int8 families are compared in output quantization steps
CASES: Dict[str, Callable[[], Tuple[object, Dict[str, np.ndarray]]]] = {
    "elementwise_chain": elementwise_chain, "erf_gelu_pow": erf_gelu_pow, "matmul_batched": matmul_batched,
    "dense_gemm": dense_gemm, "matmul_weights": matmul_weights, "conv_regular": conv_regular,
    "conv_strided": conv_strided, "conv_depthwise": conv_depthwise, "conv_pointwise": conv_pointwise,
    "conv_grouped": conv_grouped, "conv_relu_pool_chain": conv_relu_pool_chain, "pooling": pooling,
    "reductions": reductions, "softmax": softmax, "layer_norm": layer_norm, "instance_norm": instance_norm,
    "group_norm": group_norm, "resize": resize, "layout_transforms": layout_transforms, "indexing": indexing,
    "lstm": lstm, "qdq_conv": qdq_conv, "qlinear_ops": qlinear_ops, "float16_chain": float16_chain,
}
INT8_CASES = ("qdq_conv", "qlinear_ops")
FLOAT16_CASES = ("float16_chain",)


def _mobilenet_v2():
    model = load_script("make_mobilenet_v2").build_mobilenet_v2(seed=1, size=64, width=0.5, classes=100)
    return model, {"input": np.random.default_rng(0).standard_normal((1, 3, 64, 64)).astype(np.float32)}


# whole models: name -> builder of (model, feeds); compared by max relative error <= 1e-4 (fp32)
MODELS: Dict[str, Callable[[], Tuple[object, Dict[str, np.ndarray]]]] = {
    "mobilenet_v2": _mobilenet_v2,
    "yolov8_detector": lambda: KINDS["yolov8_detector"]("test"),
    "crnn_recognizer": lambda: KINDS["crnn_recognizer"]("test"),
    "svtr_recognizer": lambda: KINDS["svtr_recognizer"]("test"),
    "transformer_encoder": lambda: KINDS["transformer_encoder"]("test"),
    "vad": lambda: KINDS["vad"]("test")}   # (LSTM state inputs, a run-time If: guarded nodes)


def ort_reference(model, feeds: Dict[str, np.ndarray], threads: int = 0) -> List[np.ndarray]:
    """onnxruntime's outputs for ``feeds`` (``threads`` intra-op threads; 0: its default)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)


def compare_case(name: str, got: Sequence[np.ndarray], ref: Sequence[np.ndarray]) -> float:
    """Assert that a CASES model's outputs match onnxruntime's. Returns the largest error over the outputs in the
    case's own measure: quantization steps for the int8 cases, max relative error otherwise (float16 in float32)."""
    assert len(got) == len(ref)
    worst = 0.0
    for i, (g, r) in enumerate(zip(got, ref)):
        assert g.dtype == r.dtype and g.shape == r.shape, (i, g.dtype, g.shape, r.dtype, r.shape)
        if name in INT8_CASES:      # quantized outputs: onnxruntime rounds the same sums the same way
            steps = int(np.abs(g.astype(np.int32) - r.astype(np.int32)).max())
            assert steps <= 1, (i, steps)
            worst = max(worst, steps)
        elif name in FLOAT16_CASES:
            np.testing.assert_allclose(g.astype(np.float32), r.astype(np.float32), rtol=4e-3, atol=2e-3)
            worst = max(worst, relative_error(g.astype(np.float32), r.astype(np.float32)))
        elif r.dtype.kind == "f":
            assert np.isfinite(r).all() and np.abs(r).max() > 0
            err = relative_error(g, r)
            assert err <= 1e-4, (i, err)
            worst = max(worst, err)
        else:
            np.testing.assert_array_equal(g, r)
    return worst


def compare_model(got: Sequence[np.ndarray], ref: Sequence[np.ndarray]) -> float:
    """Assert that a MODELS model's outputs have onnxruntime's dtypes and shapes and a max relative error <= 1e-4;
    the largest of those errors."""
    assert len(got) == len(ref)
    worst = 0.0
    for i, r in enumerate(ref):
        g = got[i]
        assert g.dtype == r.dtype and g.shape == r.shape, (i, g.dtype, g.shape, r.dtype, r.shape)
        assert np.isfinite(r).all() and np.abs(r).max() > 0, "degenerate reference output %d" % i
        err = relative_error(g, r)
        assert err <= 1e-4, (i, err)
        worst = max(worst, err)
    return worst
