"""The onnxruntime contrib ops quantize_static writes in the QOperator form (domain com.microsoft)
against onnxruntime: QLinearAdd and QGemm and QLinearGlobalAveragePool bit for bit (every pair of uint8 inputs
for QLinearAdd), QLinearMul, QLinearConcat and QLinearSigmoid within one quantization step."""
import numpy as np
import pytest

RNG = np.random.default_rng(3)


def _model(op, inputs: dict, inits: dict, order, attrs=None, out_type=2):
    from onnx import helper, numpy_helper
    node = helper.make_node(op, order, ["y"], domain="com.microsoft", **(attrs or {}))
    code = {"uint8": 2, "int8": 3, "float32": 1}
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info(n, code[str(v.dtype)], list(v.shape))
                                        for n, v in inputs.items()],
                          [helper.make_tensor_value_info("y", out_type, None)],
                          [numpy_helper.from_array(np.asarray(v), n) for n, v in inits.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid("com.microsoft", 1)])


def _q(shape, dtype):
    info = np.iinfo(dtype)
    return RNG.integers(info.min, info.max, shape, endpoint=True).astype(dtype)


def _sz(dtype):
    return np.array(RNG.uniform(0.01, 0.2), np.float32), _q((), dtype)


def _check_steps(got, ref, steps):
    d = np.abs(got.astype(np.int32) - ref.astype(np.int32))
    assert d.max() <= steps, d.max()


@pytest.mark.parametrize("dtype", ["uint8", "int8"])
def test_qlinear_add_every_pair(onnx_compare, dtype):
    info = np.iinfo(dtype)
    vals = np.arange(info.min, info.max + 1).astype(dtype)
    a, b = np.repeat(vals, 256), np.tile(vals, 256)
    for _ in range(3):
        (sa, za), (sb, zb), (sc, zc) = _sz(dtype), _sz(dtype), _sz(dtype)
        inits = {"sa": sa, "za": za, "sb": sb, "zb": zb, "sc": sc, "zc": zc}
        model = _model("QLinearAdd", {"a": a, "b": b}, inits, ["a", "sa", "za", "b", "sb", "zb", "sc", "zc"],
                       out_type=2 if dtype == "uint8" else 3)
        onnx_compare(model, {"a": a, "b": b}, rtol=0, atol=0)


def test_qlinear_add_broadcast(onnx_compare):
    a, b = _q((1, 8, 5, 5), "uint8"), _q((1, 8, 1, 1), "uint8")
    (sa, za), (sb, zb), (sc, zc) = _sz("uint8"), _sz("uint8"), _sz("uint8")
    inits = {"sa": sa, "za": za, "sb": sb, "zb": zb, "sc": sc, "zc": zc}
    model = _model("QLinearAdd", {"a": a, "b": b}, inits, ["a", "sa", "za", "b", "sb", "zb", "sc", "zc"])
    onnx_compare(model, {"a": a, "b": b}, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", ["uint8", "int8"])
def test_qlinear_global_average_pool(onnx_compare, dtype):
    x = _q((1, 32, 7, 7), dtype)
    (sx, zx), (sy, zy) = _sz(dtype), _sz(dtype)
    model = _model("QLinearGlobalAveragePool", {"x": x}, {"sx": sx, "zx": zx, "sy": sy, "zy": zy},
                   ["x", "sx", "zx", "sy", "zy"], {"channels_last": 0}, 2 if dtype == "uint8" else 3)
    onnx_compare(model, {"x": x}, rtol=0, atol=0)


@pytest.mark.parametrize("quantized_out", [True, False])
@pytest.mark.parametrize("trans_b", [0, 1])
def test_qgemm(onnx_compare, quantized_out, trans_b):
    a = _q((4, 64), "uint8")
    w = _q((24, 64) if trans_b else (64, 24), "int8")
    sa, za = _sz("uint8")
    inits = {"sa": sa, "za": za, "w": w, "sw": RNG.uniform(0.001, 0.01, 24).astype(np.float32),
             "zw": np.zeros(24, np.int8), "c": RNG.integers(-3000, 3000, 24).astype(np.int32)}
    order = ["a", "sa", "za", "w", "sw", "zw", "c"]
    if quantized_out:
        inits.update(sy=np.array(0.4, np.float32), zy=np.array(100, np.uint8))
        order += ["sy", "zy"]
    model = _model("QGemm", {"a": a}, inits, order, {"transB": trans_b, "alpha": 0.5}, 2 if quantized_out else 1)
    onnx_compare(model, {"a": a}, rtol=0 if quantized_out else 1e-6, atol=0)


def test_qlinear_mul_concat_sigmoid_within_one_step(onnx_compare):
    a, b = _q((2, 6, 5), "uint8"), _q((2, 6, 5), "uint8")
    (sa, za), (sb, zb), (sc, zc) = _sz("uint8"), _sz("uint8"), _sz("uint8")
    inits = {"sa": sa, "za": za, "sb": sb, "zb": zb, "sc": sc, "zc": zc}
    for op, order, attrs in [("QLinearMul", ["a", "sa", "za", "b", "sb", "zb", "sc", "zc"], {}),
                             ("QLinearConcat", ["sc", "zc", "a", "sa", "za", "b", "sb", "zb"], {"axis": 1}),
                             ("QLinearSigmoid", ["a", "sa", "za", "sc", "zc"], {})]:
        feeds = {"a": a, "b": b} if "b" in order else {"a": a}
        got, ref = onnx_compare(_model(op, feeds, inits, order, attrs), feeds, check=False)
        assert got[0].dtype == ref[0].dtype and got[0].shape == ref[0].shape
        _check_steps(got[0], ref[0], 1)


@pytest.mark.parametrize("with_bias", [False, True])
def test_dynamic_quantize_matmul(onnx_compare, with_bias):
    a = RNG.standard_normal((5, 48)).astype(np.float32)
    b = _q((48, 20), "int8")
    inits = {"b": b, "sb": RNG.uniform(0.001, 0.01, 20).astype(np.float32), "zb": np.zeros(20, np.int8)}
    order = ["a", "b", "sb", "zb"]
    if with_bias:
        inits["bias"] = RNG.standard_normal(20).astype(np.float32)
        order.append("bias")
    model = _model("DynamicQuantizeMatMul", {"a": a}, inits, order, out_type=1)
    onnx_compare(model, {"a": a}, rtol=1e-6, atol=1e-6)


def test_matmul_integer_to_float(onnx_compare):
    a, b = _q((6, 32), "uint8"), _q((32, 12), "int8")
    sa, za = _sz("uint8")
    inits = {"b": b, "sa": sa, "sb": np.array(0.004, np.float32), "za": za, "zb": np.array(0, np.int8)}
    model = _model("MatMulIntegerToFloat", {"a": a}, inits, ["a", "b", "sa", "sb", "za", "zb"], out_type=1)
    onnx_compare(model, {"a": a}, rtol=1e-6, atol=1e-6)


def test_quantize_dynamic_mlp(onnx_compare, tmp_path):
    """quantize_dynamic's MatMuls (DynamicQuantizeLinear, MatMulInteger, Cast, Mul) against onnxruntime, which
    fuses them into its DynamicQuantizeMatMul kernel."""
    import onnx
    from fixtures.onnx_struct_compare import make_graph_model
    from onnx import helper
    from onnxruntime.quantization import QuantType, quantize_dynamic
    w1 = RNG.standard_normal((32, 64)).astype(np.float32) * 0.2
    w2 = RNG.standard_normal((64, 10)).astype(np.float32) * 0.2
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["m1"]), helper.make_node("Relu", ["m1"], ["r"]),
             helper.make_node("MatMul", ["r", "w2"], ["y"])]
    x = RNG.standard_normal((4, 32)).astype(np.float32)
    onnx.save(make_graph_model(nodes, {"x": x}, ["y"], {"w1": w1, "w2": w2}, opset=13), str(tmp_path / "f.onnx"))
    quantize_dynamic(str(tmp_path / "f.onnx"), str(tmp_path / "q.onnx"), weight_type=QuantType.QInt8)
    model = onnx.load(str(tmp_path / "q.onnx"))
    assert {n.op_type for n in model.graph.node} >= {"DynamicQuantizeLinear", "MatMulInteger"}
    for _ in range(3):
        x = RNG.standard_normal((4, 32)).astype(np.float32)
        onnx_compare(model, {"x": x}, rtol=1e-6, atol=1e-6)


def test_qlinear_add_rounding_attribute_refusals():
    """tether's own ``rounding`` attribute (the TFLite frontend's "xnnpack") is refused in one line when unknown,
    and when XNNPACK's parameters cannot be made (a run-time scale)."""
    from onnx import TensorProto, helper

    from tether.errors import UnsupportedOpError
    from tether.frontend import from_onnx

    a = _q((1, 4), "int8")
    sz = {"sa": np.float32(0.05), "za": np.int8(3), "sb": np.float32(0.02), "zb": np.int8(-7),
          "sc": np.float32(0.07), "zc": np.int8(1)}
    order = ["a", "sa", "za", "b", "sb", "zb", "sc", "zc"]
    with pytest.raises(UnsupportedOpError, match="rounding 'bogus'"):
        from_onnx(_model("QLinearAdd", {"a": a, "b": a}, sz, order, {"rounding": "bogus"}, out_type=3))
    model = _model("QLinearAdd", {"a": a, "b": a}, {k: v for k, v in sz.items() if k != "sc"}, order,
                   {"rounding": "xnnpack"}, out_type=3)
    model.graph.input.append(helper.make_tensor_value_info("sc", TensorProto.FLOAT, []))
    with pytest.raises(UnsupportedOpError, match="needs constant scales") as info:
        from_onnx(model)
    assert "\n" not in str(info.value)
