"""The ONNX elementwise family (comparison, logic, Where, Mod, Div, rounding, activations with attributes,
IsNaN/IsInf, hyperbolic functions, variadic Min/Max/Mean/Sum, LogSoftmax, Hardmax, Cast, Pow) on small
onnx.helper models, compiled for the host and compared with onnxruntime on inputs that include the edge cases
(NaN, infinities, negative operands, exact halves, ties)."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from tether.errors import UnsupportedOpError
from tether.testing.onnx_cases import TetherCase

ort = pytest.importorskip("onnxruntime")

NP2ONNX = {np.dtype(k): v for k, v in {
    "float32": TensorProto.FLOAT, "float64": TensorProto.DOUBLE, "int8": TensorProto.INT8,
    "uint8": TensorProto.UINT8, "int16": TensorProto.INT16, "int32": TensorProto.INT32,
    "int64": TensorProto.INT64, "bool": TensorProto.BOOL}.items()}
RNG = np.random.default_rng(11)


def model_of(op, inputs, out_dtype=None, opset=17, n_out=1, **attrs):
    """One ``op`` node over named numpy inputs; the output dtype/shape are inferred by onnx."""
    names = list(inputs)
    node = helper.make_node(op, names, ["y%d" % i for i in range(n_out)], **attrs)
    vis = [helper.make_tensor_value_info(n, NP2ONNX[v.dtype], v.shape) for n, v in inputs.items()]
    outs = [helper.make_tensor_value_info("y%d" % i, TensorProto.UNDEFINED, None) for i in range(n_out)]
    g = helper.make_graph([node], op.lower(), vis, outs)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return onnx.shape_inference.infer_shapes(m)


def expected(model, feeds):
    """onnxruntime's outputs; where it has no kernel for the dtype/opset (float64 activations, old opsets),
    those of onnx's reference implementation of the spec."""
    try:
        sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        return sess.run(None, feeds)
    except (ort.capi.onnxruntime_pybind11_state.NotImplemented, ort.capi.onnxruntime_pybind11_state.InvalidGraph,
            ort.capi.onnxruntime_pybind11_state.Fail):
        from onnx.reference import ReferenceEvaluator
        return ReferenceEvaluator(model).run(None, feeds)


def check(model, feeds, exact=None, rtol=1e-5, atol=1e-6):
    want = expected(model, feeds)
    case = TetherCase(model, feeds)
    try:
        got = case.run(feeds)
    finally:
        case.close()
    for w, g in zip(want, got):
        assert g.dtype == w.dtype and g.shape == w.shape, (g.dtype, g.shape, w.dtype, w.shape)
        if exact or w.dtype.kind in "biu":
            np.testing.assert_array_equal(g, w)
        else:
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, equal_nan=True)


def floats(shape, dtype="float32", lo=-4.0, hi=4.0, specials=True):
    x = RNG.uniform(lo, hi, shape).astype(dtype)
    if specials:
        flat = x.reshape(-1)
        sp = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 0.5, -0.5, 2.5, -2.5], dtype)
        flat[:min(len(sp), flat.size)] = sp[:flat.size]
    return x


def ints(shape, dtype, lo=-100, hi=100):
    info = np.iinfo(dtype)
    return RNG.integers(max(lo, info.min), min(hi, info.max) + 1, shape).astype(dtype)


# ---------------------------------------------------------------- comparison and logic
@pytest.mark.parametrize("op", ["Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual"])
@pytest.mark.parametrize("dtype", ["float32", "float64", "int8", "uint8", "int16", "int32", "int64"])
def test_comparisons_broadcast(op, dtype):
    if "float" in dtype:
        a, b = floats((3, 4, 5), dtype), floats((4, 1), dtype, specials=False).round()
        a[0, 0, :] = b[0, 0]     # equal elements
    else:
        a, b = ints((3, 4, 5), dtype, -5, 5), ints((4, 1), dtype, -5, 5)
    check(model_of(op, {"a": a, "b": b}, opset=16), {"a": a, "b": b})


def test_equal_on_bools():
    a, b = RNG.random((2, 3)) > 0.5, RNG.random((3,)) > 0.5
    check(model_of("Equal", {"a": a, "b": b}), {"a": a, "b": b})


@pytest.mark.parametrize("op", ["And", "Or", "Xor"])
def test_logical_broadcast(op):
    a, b = RNG.random((2, 3, 4)) > 0.5, RNG.random((3, 1)) > 0.5
    check(model_of(op, {"a": a, "b": b}), {"a": a, "b": b})


def test_not():
    a = RNG.random((5, 6)) > 0.5
    check(model_of("Not", {"a": a}), {"a": a})


@pytest.mark.parametrize("dtype", ["float32", "int64", "uint8", "bool"])
def test_where_broadcasts_three_ways(dtype):
    c = RNG.random((4, 1)) > 0.5
    if dtype == "bool":
        x, y = RNG.random((1, 5)) > 0.5, RNG.random((5,)) > 0.5
    elif "float" in dtype:
        x, y = floats((1, 5), dtype), floats((5,), dtype)
    else:
        x, y = ints((1, 5), dtype), ints((5,), dtype)
    check(model_of("Where", {"c": c, "x": x, "y": y}), {"c": c, "x": x, "y": y})


def test_logic_refuses_non_bool():
    a = ints((3,), "int32")
    with pytest.raises(UnsupportedOpError, match="And on int32"):
        TetherCase(model_of("And", {"a": a, "b": a}), {"a": a, "b": a})


# ---------------------------------------------------------------- integer arithmetic: Div, Mod, Pow
@pytest.mark.parametrize("dtype", ["int8", "int16", "int32", "int64", "uint8"])
def test_integer_div_truncates_toward_zero(dtype):
    a = ints((40,), dtype, -100, 100)
    b = ints((40,), dtype, -9, 9)
    b[b == 0] = 3
    check(model_of("Div", {"a": a, "b": b}), {"a": a, "b": b})


@pytest.mark.parametrize("dtype", ["int8", "int16", "int32", "int64", "uint8"])
@pytest.mark.parametrize("fmod", [0, 1])
def test_integer_mod_signs(dtype, fmod):
    a = ints((3, 20), dtype, -100, 100)
    b = ints((20,), dtype, -9, 9)
    b[b == 0] = -4 if dtype != "uint8" else 4
    check(model_of("Mod", {"a": a, "b": b}, fmod=fmod), {"a": a, "b": b})


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_float_fmod(dtype):
    a = floats((30,), dtype, -50, 50, specials=False)
    b = floats((30,), dtype, -7, 7, specials=False)
    a[:4] = [5.0, -5.0, 5.0, -5.0]
    b[:4] = [2.5, 2.5, -2.5, -2.5]
    check(model_of("Mod", {"a": a, "b": b}, fmod=1), {"a": a, "b": b})


def test_float_mod_without_fmod_is_refused():
    a = floats((3,), specials=False)
    with pytest.raises(UnsupportedOpError, match="fmod=0 .defined from opset 28"):
        TetherCase(model_of("Mod", {"a": a, "b": a}), {"a": a, "b": a})


@pytest.mark.parametrize("base, exp", [("int32", "int32"), ("int64", "int64"), ("int32", "float32"),
                                       ("float32", "int32"), ("float32", "int64"), ("float64", "float32")])
def test_pow_has_the_base_dtype(base, exp):
    x = ints((12,), base, -6, 6) if "int" in base else floats((12,), base, 0.5, 3, specials=False)
    y = ints((12,), exp, -2 if "int" in base else 0, 4) if "int" in exp else (RNG.integers(-2, 4, 12) * 0.5).astype(exp)
    if "int" in base and "float" in exp:    # a negative base to a fraction is NaN, whose integer is undefined
        x = np.abs(x)
        x[x == 0] = 2
    check(model_of("Pow", {"x": x, "y": y}, opset=15), {"x": x, "y": y}, rtol=1e-5)


# ---------------------------------------------------------------- rounding and simple math
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_round_half_to_even(dtype):
    x = np.concatenate([np.arange(-4, 4.25, 0.25), [0.49999997, -0.49999997, 1.5000001, 2 ** 23 + 1.0,
                                                     2 ** 52 + 1.0, 1e30, np.nan, np.inf, -np.inf]]).astype(dtype)
    check(model_of("Round", {"x": x}, opset=11), {"x": x}, exact=True)


@pytest.mark.parametrize("op", ["Floor", "Ceil", "Reciprocal", "Erf", "Neg", "Abs"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_float_unary(op, dtype):
    x = floats((6, 7), dtype)
    check(model_of(op, {"x": x}, opset=13), {"x": x})


@pytest.mark.parametrize("dtype", ["float32", "float64", "int8", "int32", "int64", "uint8"])
def test_sign(dtype):
    x = floats((30,), dtype) if "float" in dtype else ints((30,), dtype)
    check(model_of("Sign", {"x": x}, opset=13), {"x": x})


@pytest.mark.parametrize("op", ["Sinh", "Cosh", "Asinh", "Acosh", "Atanh"])
def test_hyperbolic(op):
    lo, hi = {"Acosh": (1.0, 5.0), "Atanh": (-0.99, 0.99)}.get(op, (-5.0, 5.0))
    x = floats((50,), lo=lo, hi=hi, specials=False)
    x[:3] = [lo, 1e-6 if op != "Acosh" else 1.0, hi]
    check(model_of(op, {"x": x}, opset=9), {"x": x}, rtol=1e-5, atol=1e-7)


def test_isnan_and_isinf_flags():
    x = floats((4, 5))
    check(model_of("IsNaN", {"x": x}, opset=13), {"x": x})
    for pos in (0, 1):
        for neg in (0, 1):
            check(model_of("IsInf", {"x": x}, opset=10, detect_positive=pos, detect_negative=neg), {"x": x})


# ---------------------------------------------------------------- activations with attributes
ACTIVATIONS = [
    ("Elu", {}, 6), ("Elu", {"alpha": 0.3}, 6), ("Selu", {}, 6), ("Selu", {"alpha": 2.0, "gamma": 3.0}, 6),
    ("Celu", {}, 12), ("Celu", {"alpha": 2.5}, 12), ("Softplus", {}, 1), ("Softsign", {}, 1), ("Mish", {}, 18),
    ("ThresholdedRelu", {}, 10), ("ThresholdedRelu", {"alpha": 0.5}, 10), ("Gelu", {}, 20),
    ("Gelu", {"approximate": "tanh"}, 20), ("Gelu", {"approximate": "none"}, 20),
]


@pytest.mark.parametrize("op, attrs, opset", ACTIVATIONS)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_activation(op, attrs, opset, dtype):
    x = floats((5, 40), dtype, -30, 30, specials=False)
    x[0, :6] = [-1e-5, 1e-5, 0.0, 100.0, -100.0, 1.0]
    check(model_of(op, {"x": x}, opset=opset, **attrs), {"x": x}, rtol=2e-5, atol=1e-6)


@pytest.mark.parametrize("slope_shape", [(1, 3, 1, 1), (3, 1, 1), (1,), (4,), (2, 3, 5, 4)])
def test_prelu_slope_broadcasting(slope_shape):
    x, s = floats((2, 3, 5, 4), specials=False), floats(slope_shape, specials=False)
    check(model_of("PRelu", {"x": x, "s": s}, opset=16), {"x": x, "s": s})


# ---------------------------------------------------------------- variadic and softmax-like
@pytest.mark.parametrize("op", ["Min", "Max", "Mean", "Sum"])
def test_variadic_broadcast(op):
    feeds = {"a": floats((3, 1, 4), specials=False), "b": floats((2, 1), specials=False),
             "c": floats((4,), specials=False)}
    check(model_of(op, feeds, opset=13), feeds)


@pytest.mark.parametrize("op", ["LogSoftmax", "Hardmax"])
@pytest.mark.parametrize("opset, axis", [(11, 1), (11, 0), (11, -1), (13, 1), (13, -1), (13, 0)])
def test_softmax_like_axes(op, opset, axis):
    x = floats((3, 4, 5), specials=False)
    x[1, 2, :] = 2.0       # ties: Hardmax picks the first
    x[:, :, 3] = 9.0
    check(model_of(op, {"x": x}, opset=opset, axis=axis), {"x": x})


# ---------------------------------------------------------------- Cast
CASTS = ["float32", "float64", "int8", "uint8", "int16", "int32", "int64", "bool"]


@pytest.mark.parametrize("src", CASTS)
@pytest.mark.parametrize("dst", CASTS)
def test_cast(src, dst):
    if src == "bool":
        x = RNG.random((24,)) > 0.5
    elif "float" in src:
        lo = 0 if dst == "uint8" else -100   # out-of-range float -> int is undefined in ONNX
        x = floats((24,), src, lo, 100, specials=(dst in ("bool", "float32", "float64")))
        x[-4:] = [2.7, 0.5, 99.9, lo + 0.3]
    else:
        x = ints((24,), src, -300, 300)
    check(model_of("Cast", {"x": x}, opset=13, to=NP2ONNX[np.dtype(dst)]), {"x": x}, exact=True)


def test_cast_to_float8_is_refused():
    # float16 and bfloat16 casts are implemented (tests/test_float16.py, tests/test_bfloat16.py); float8 is not
    x = floats((3,))
    with pytest.raises(UnsupportedOpError, match="Cast to elem_type_17"):
        TetherCase(model_of("Cast", {"x": x}, to=TensorProto.FLOAT8E4M3FN), {"x": x})


# ---------------------------------------------------------------- fused chains change dtype inside one kernel
def test_fused_compare_where_cast_chain():
    x = floats((1, 3, 8, 8), specials=False)
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Greater", ["r", "t"], ["m"]),
             helper.make_node("Where", ["m", "r", "z"], ["w"]), helper.make_node("Cast", ["m"], ["mi"], to=6),
             helper.make_node("Cast", ["w"], ["y"], to=7)]
    g = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
                          [helper.make_tensor_value_info("y", TensorProto.INT64, None),
                           helper.make_tensor_value_info("mi", TensorProto.INT32, None)],
                          [helper.make_tensor("t", TensorProto.FLOAT, (), [1.0]),
                           helper.make_tensor("z", TensorProto.FLOAT, (), [-7.0])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    check(onnx.shape_inference.infer_shapes(m), {"x": x})


# ---------------------------------------------------------------- bitwise and shifts
@pytest.mark.parametrize("op", ["BitwiseAnd", "BitwiseOr", "BitwiseXor"])
@pytest.mark.parametrize("dtype", ["int8", "uint8", "int16", "int32", "int64"])
def test_bitwise_binary(op, dtype):
    a, b = ints((3, 8), dtype, -128, 255), ints((8,), dtype, -128, 255)
    check(model_of(op, {"a": a, "b": b}, opset=18), {"a": a, "b": b})


@pytest.mark.parametrize("dtype", ["int8", "uint8", "int16", "int32", "int64"])
def test_bitwise_not(dtype):
    a = ints((3, 8), dtype, -128, 255)
    check(model_of("BitwiseNot", {"a": a}, opset=18), {"a": a})


@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
@pytest.mark.parametrize("dtype", ["uint8", "int8", "int32", "int64"])
def test_bit_shift_including_out_of_range_amounts(direction, dtype):
    bits = np.iinfo(dtype).bits
    x = ints((4, 10), dtype, -128, 255)
    y = np.array([0, 1, 3, bits - 1, bits, bits + 5, 2, 7, 0, 1], dtype)
    if dtype.startswith("int"):
        y[-1] = -1
    opset = 11 if dtype == "uint8" else 28
    feeds = {"x": x, "y": y}
    m = model_of("BitShift", feeds, opset=opset, direction=direction)
    if opset == 28:     # newer than onnxruntime's opset: the reference implementation of the spec decides
        from onnx.reference import ReferenceEvaluator
        case = TetherCase(m, feeds)
        try:
            np.testing.assert_array_equal(case.run(feeds)[0], ReferenceEvaluator(m).run(None, feeds)[0])
        finally:
            case.close()
    else:
        check(m, feeds)


@pytest.mark.parametrize("op", ["Max", "Min"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_max_min_propagate_nan(op, dtype):
    a = np.array([np.nan, 1, 2, np.nan, -np.inf, 0.0], dtype)
    b = np.array([1, np.nan, 3, np.nan, 0, -0.0], dtype)
    check(model_of(op, {"a": a, "b": b}, opset=13), {"a": a, "b": b})


@pytest.mark.parametrize("op", ["Max", "Min"])
@pytest.mark.parametrize("dtype", ["int8", "uint8", "int32", "int64"])
def test_max_min_integers(op, dtype):
    feeds = {"a": ints((2, 5), dtype), "b": ints((5,), dtype), "c": ints((1, 1), dtype)}
    check(model_of(op, feeds, opset=13), feeds)


@pytest.mark.parametrize("elem, name", [(TensorProto.FLOAT8E4M3FN, "float8e4m3fn"), (TensorProto.STRING, "string")])
def test_inputs_of_dtypes_without_kernels_are_refused_by_name(elem, name):
    from tether.frontend import from_onnx
    g = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", elem, [3])],
                          [helper.make_tensor_value_info("y", elem, [3])])
    with pytest.raises(UnsupportedOpError, match="element type %s" % name):
        from_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))


# ---------------------------------------------------------------- Dropout
def _dropout_model(ratio: float):
    node = helper.make_node("Dropout", ["x", "ratio", "t"], ["y0", "y1"])
    g = helper.make_graph([node], "dropout", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4]),
                                              helper.make_tensor_value_info("t", TensorProto.BOOL, [])],
                          [helper.make_tensor_value_info("y0", TensorProto.FLOAT, [3, 4]),
                           helper.make_tensor_value_info("y1", TensorProto.BOOL, [3, 4])],
                          [helper.make_tensor("ratio", TensorProto.FLOAT, [], [ratio])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    return m


@pytest.mark.parametrize("training", [True, False])
def test_dropout_with_a_zero_ratio_is_the_identity_whatever_the_run_time_training_mode(training):
    check(_dropout_model(0.0), {"x": floats((3, 4), specials=False), "t": np.array(training)}, exact=True)


def test_dropout_that_would_drop_at_random_is_refused_in_one_line():
    case = None
    with pytest.raises(UnsupportedOpError, match="training_mode") as info:
        case = TetherCase(_dropout_model(0.5), {"x": floats((3, 4)), "t": np.array(True)})
    assert case is None and len(str(info.value).splitlines()) == 1
