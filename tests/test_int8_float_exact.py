"""The exact-float32 pass for integer products (graph/passes/quantize_float.py): a QLinearConv/QGemm whose
accumulator provably stays below 2**24 runs as a float32 conv/dense, one that may not keeps its int32 kernel, and
both agree with onnxruntime bit for bit; the bound counts the bias."""
import numpy as np
import pytest
from fixtures.onnx_struct_compare import make_model

from tether.frontend import from_onnx
from tether.graph.passes import optimize

RNG = np.random.default_rng(5)


def _qconv(w, bias):
    # grouped (2 groups): the int8 dot-product pass (passes/quantize_dot.py) takes the ungrouped convs
    oc = w.shape[0]
    x = RNG.integers(0, 256, (1, 2 * w.shape[1], 9, 9)).astype(np.uint8)
    inits = {"sx": np.array(0.05, np.float32), "zx": np.array(3, np.uint8), "w": w,
             "sw": RNG.uniform(1e-5, 1e-4, oc).astype(np.float32), "zw": np.zeros(oc, np.int8),
             "sy": np.array(0.9, np.float32), "zy": np.array(128, np.uint8), "bias": bias}
    model = make_model("QLinearConv", {"x": x}, {"pads": [1, 1, 1, 1], "group": 2}, opset=10, initializers=inits)
    model.graph.node[0].input[:] = ["x", "sx", "zx", "w", "sw", "zw", "sy", "zy", "bias"]
    return model, x


def _conv_weight_dtype(model):
    graph, params = from_onnx(model)
    opt, _ = optimize(graph, params, opt_level=2)
    (dt,) = {str(opt.types[b.inputs[1]].dtype) for n in opt.nodes for b in n.body() if b.op == "conv2d"}
    return dt


@pytest.mark.parametrize("kind", ["small", "large", "large_bias"])
def test_bound_decides_the_accumulator(onnx_compare, kind):
    ic = 64
    if kind == "small":     # 576 products of |x - 3| <= 252 and |w| <= 20: < 2**24
        w = RNG.integers(-20, 21, (8, ic, 3, 3)).astype(np.int8)
        bias = RNG.integers(-1000, 1000, 8).astype(np.int32)
    else:                   # |w| = 127 everywhere: 576 * 127 * 252 > 2**24
        w = np.where(RNG.random((8, ic, 3, 3)) < 0.5, -127, 127).astype(np.int8)
        bias = RNG.integers(-1000, 1000, 8).astype(np.int32)
        if kind == "large_bias":    # weights fit, the bias tips the bound over
            w = (w // 2).astype(np.int8)
            bias = np.full(8, 2 ** 24 - 10, np.int32)
    model, x = _qconv(w, bias)
    expected = "float32" if kind == "small" else "int32"
    assert _conv_weight_dtype(model) == expected
    onnx_compare(model, {"x": x}, rtol=0, atol=0)
