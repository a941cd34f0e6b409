"""A small FPN / DB-text-detector style head built from the structural ops together with convolutions, so the
graph passes (fusion, view concats, memory planning) see them in context: Conv -> Resize (nearest 2x) + lateral
Conv, Concat, ConvTranspose x2 -> Sigmoid, a ReduceMean squeeze-excitation branch, ArgMax over classes,
against onnxruntime."""
import numpy as np
import pytest
from fixtures.onnx_struct_compare import make_graph_model
from onnx import helper

RNG = np.random.default_rng(0)


def _w(*shape):
    return (RNG.standard_normal(shape) * 0.3).astype(np.float32)


@pytest.mark.parametrize("opt_level", [0, 3])
def test_fpn_db_head(onnx_compare, opt_level):
    x = RNG.standard_normal((1, 8, 16, 16)).astype(np.float32)
    inits = {"w_c1": _w(16, 8, 3, 3), "b_c1": _w(16), "w_c2": _w(16, 16, 3, 3), "w_lat": _w(16, 8, 1, 1),
             "roi": np.zeros(0, np.float32), "scales": np.array([1, 1, 2, 2], np.float32),
             "axes_hw": np.array([2, 3], np.int64), "w_se": _w(32, 32, 1, 1),
             "w_up1": _w(32, 8, 2, 2), "b_up1": _w(8), "w_up2": _w(8, 3, 4, 4), "ln_s": 1 + _w(3), "ln_b": _w(3)}
    nodes = [
        helper.make_node("Conv", ["x", "w_c1", "b_c1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w_c2"], ["c2"], pads=[1, 1, 1, 1], strides=[2, 2]),          # 8x8
        helper.make_node("Resize", ["c2", "roi", "scales"], ["up"], mode="nearest"),                   # 16x16
        helper.make_node("Conv", ["x", "w_lat"], ["lat"]),
        helper.make_node("Add", ["up", "lat"], ["p"]),
        helper.make_node("Concat", ["p", "r1"], ["cat"], axis=1),                                     # 32 ch
        helper.make_node("ReduceMean", ["cat", "axes_hw"], ["se0"], keepdims=1),
        helper.make_node("Conv", ["se0", "w_se"], ["se1"]),
        helper.make_node("Sigmoid", ["se1"], ["se"]),
        helper.make_node("Mul", ["cat", "se"], ["att"]),
        helper.make_node("ConvTranspose", ["att", "w_up1", "b_up1"], ["u1"], strides=[2, 2]),         # 32x32
        helper.make_node("Relu", ["u1"], ["u1r"]),
        helper.make_node("ConvTranspose", ["u1r", "w_up2"], ["u2"], strides=[2, 2], pads=[1, 1, 1, 1]),  # 64x64
        helper.make_node("Sigmoid", ["u2"], ["prob"]),
        helper.make_node("ArgMax", ["u2"], ["cls"], axis=1, keepdims=0),
        helper.make_node("Transpose", ["u2"], ["u2t"], perm=[0, 2, 3, 1]),
        helper.make_node("LayerNormalization", ["u2t", "ln_s", "ln_b"], ["ln"], axis=-1),
    ]
    model = make_graph_model(nodes, {"x": x}, ["prob", "cls", "ln"], inits, opset=18)
    onnx_compare(model, {"x": x}, rtol=1e-4, atol=1e-4, opt_level=opt_level)
