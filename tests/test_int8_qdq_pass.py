"""The quantize pass on hand-written QDQ graphs (graph/passes/quantize.py): what it fuses into integer kernels,
and that a group it cannot fuse still runs, unfused, exactly as the ONNX graph says (ONNX's reference evaluator)
and within one step of onnxruntime's integer kernel."""
import numpy as np
import onnx
import pytest
from fixtures.onnx_struct_compare import make_graph_model
from onnx import helper

from tether.frontend import from_onnx
from tether.graph.passes import fuse_qdq

RNG = np.random.default_rng(9)


def _qdq(nodes, x, inits, out="y"):
    return make_graph_model(nodes, {"x": x}, [out], inits, opset=21)


def _scales(**kw):
    return {k: np.array(v, np.float32 if isinstance(v, float) else np.uint8) for k, v in kw.items()}


def test_unfusable_mul_runs_unfused(onnx_compare):
    """DQ -> Mul -> Q (onnxruntime: QLinearMul) has no integer pattern in tether: dequantize, multiply, quantize."""
    x = RNG.integers(0, 256, (2, 8, 5)).astype(np.uint8)
    inits = _scales(sx=0.05, zx=120, sy=0.2, zy=10)
    inits["c"] = RNG.integers(0, 256, (2, 8, 5)).astype(np.uint8)
    nodes = [helper.make_node("DequantizeLinear", ["x", "sx", "zx"], ["xf"]),
             helper.make_node("DequantizeLinear", ["c", "sx", "zx"], ["cf"]),
             helper.make_node("Mul", ["xf", "cf"], ["m"]),
             helper.make_node("QuantizeLinear", ["m", "sy", "zy"], ["y"])]
    model = _qdq(nodes, x, inits)
    graph, params = from_onnx(model)
    fused, _ = fuse_qdq(graph, params)
    assert [n.op for n in fused.nodes if n.op in ("quantize", "mul")] == ["mul", "quantize"]
    from onnx.reference import ReferenceEvaluator
    (expected,) = ReferenceEvaluator(model).run(None, {"x": x})
    onnx_compare(model, {"x": x}, expected=[expected], rtol=0, atol=0)
    got, ref = onnx_compare(model, {"x": x}, check=False)
    assert np.abs(got[0].astype(int) - ref[0].astype(int)).max() <= 1


@pytest.mark.parametrize("bias_scale", ["sx*sw", "other"])
def test_conv_with_per_channel_weights(onnx_compare, bias_scale):
    """Fused (bit for bit with onnxruntime) when the int32 bias is in the accumulator's scale sx * sw, as
    quantize_static writes it; with another bias scale the bias integers mean something else: left unfused, the
    graph computes what the ONNX graph says (the reference evaluator)."""
    x = RNG.integers(0, 256, (1, 4, 8, 8)).astype(np.uint8)
    w = RNG.integers(-127, 128, (6, 4, 3, 3)).astype(np.int8)
    inits = _scales(sx=0.02, zx=128, sy=0.1, zy=5)
    sw = RNG.uniform(0.001, 0.01, 6).astype(np.float32)
    sb = inits["sx"] * sw if bias_scale == "sx*sw" else RNG.uniform(0.0001, 0.001, 6).astype(np.float32)
    inits.update(w=w, sw=sw, zw=np.zeros(6, np.int8), b=RNG.integers(-500, 500, 6).astype(np.int32), sb=sb,
                 zb=np.zeros(6, np.int32))
    nodes = [helper.make_node("DequantizeLinear", ["x", "sx", "zx"], ["xf"]),
             helper.make_node("DequantizeLinear", ["w", "sw", "zw"], ["wf"], axis=0),
             helper.make_node("DequantizeLinear", ["b", "sb", "zb"], ["bf"], axis=0),
             helper.make_node("Conv", ["xf", "wf", "bf"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("QuantizeLinear", ["c", "sy", "zy"], ["y"])]
    model = _qdq(nodes, x, inits)
    graph, params = from_onnx(model)
    fused, _ = fuse_qdq(graph, params)
    onnx.checker.check_model(model)
    if bias_scale == "sx*sw":
        assert "requantize" in [n.op for n in fused.nodes]
        onnx_compare(model, {"x": x}, rtol=0, atol=0)
        return
    assert "requantize" not in [n.op for n in fused.nodes]
    from onnx.reference import ReferenceEvaluator
    (expected,) = ReferenceEvaluator(model).run(None, {"x": x})
    got, _ = onnx_compare(model, {"x": x}, expected=[expected], check=False)
    assert np.abs(got[0].astype(int) - expected.astype(int)).max() <= 1   # float conv sums in another order


@pytest.mark.parametrize("act", ["Relu", "Clip"])
def test_activation_that_the_quantize_saturates_is_looked_through(onnx_compare, act):
    x = RNG.integers(0, 256, (1, 4, 8, 8)).astype(np.uint8)
    inits = _scales(sx=0.02, zx=128, sy=0.02, zy=0)
    sw = RNG.uniform(0.001, 0.01, 6).astype(np.float32)
    inits.update(w=RNG.integers(-127, 128, (6, 4, 3, 3)).astype(np.int8), sw=sw, zw=np.zeros(6, np.int8),
                 lo=np.array(0.0, np.float32), hi=np.array(6.0, np.float32))
    nodes = [helper.make_node("DequantizeLinear", ["x", "sx", "zx"], ["xf"]),
             helper.make_node("DequantizeLinear", ["w", "sw", "zw"], ["wf"], axis=0),
             helper.make_node("Conv", ["xf", "wf"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node(act, ["c"] + (["lo", "hi"] if act == "Clip" else []), ["r"]),
             helper.make_node("QuantizeLinear", ["r", "sy", "zy"], ["y"])]
    model = _qdq(nodes, x, inits)
    graph, params = from_onnx(model)
    fused, _ = fuse_qdq(graph, params)
    assert "requantize" in [n.op for n in fused.nodes]     # 0.02 * 255 = 5.1 <= 6: the clip changes nothing
    onnx_compare(model, {"x": x}, rtol=0, atol=0)
