"""The ONNX quantized operators through the whole flow against onnxruntime, bit for bit:
QuantizeLinear/DequantizeLinear (per tensor, per axis, blocked), DynamicQuantizeLinear, MatMulInteger,
ConvInteger, QLinearMatMul, QLinearConv; and the refusals of the element types tether does not implement."""
import numpy as np
import pytest
from fixtures.onnx_struct_compare import make_model

from tether.errors import UnsupportedOpError
from tether.frontend import from_onnx

RNG = np.random.default_rng(12)
EXACT = dict(rtol=0, atol=0)


def _ints(shape, dtype):
    info = np.iinfo(dtype)
    return RNG.integers(info.min, info.max, shape, endpoint=True).astype(dtype)


def _floats_with_ties(shape, scale):
    """Random values plus exact half-way points (k + 0.5) * scale, and values far outside the int8 range."""
    x = RNG.standard_normal(shape).astype(np.float32) * 60 * scale
    flat = x.reshape(-1)
    k = RNG.integers(-300, 300, flat.size // 3)
    flat[:k.size] = ((k + 0.5) * np.float64(scale)).astype(np.float32)
    return x


@pytest.mark.parametrize("dtype", ["uint8", "int8"])
def test_quantize_per_tensor(onnx_compare, dtype):
    x = _floats_with_ties((4, 50), 0.25)
    zp = np.array(7 if dtype == "int8" else 130, dtype)
    model = make_model("QuantizeLinear", {"x": x}, {}, opset=13,
                       initializers={"s": np.array(0.25, np.float32), "z": zp})
    onnx_compare(model, {"x": x}, **EXACT)


def test_quantize_per_axis_runtime_scale(onnx_compare):
    x = RNG.standard_normal((1, 3, 5, 6)).astype(np.float32) * 3
    s = np.array([0.02, 0.05, 0.013], np.float32)
    z = np.array([-3, 0, 20], np.int8)
    model = make_model("QuantizeLinear", {"x": x, "s": s, "z": z}, {"axis": 1}, opset=13)
    onnx_compare(model, {"x": x, "s": s, "z": z}, **EXACT)


def test_quantize_without_zero_point_is_uint8(onnx_compare):
    x = RNG.standard_normal((3, 7)).astype(np.float32)
    model = make_model("QuantizeLinear", {"x": x}, {}, opset=13, initializers={"s": np.array(0.01, np.float32)})
    got, _ = onnx_compare(model, {"x": x}, **EXACT)
    assert got[0].dtype == np.uint8


@pytest.mark.parametrize("dtype", ["uint8", "int8", "int32"])
def test_dequantize(onnx_compare, dtype):
    x = _ints((2, 4, 3, 3), dtype) if dtype != "int32" else RNG.integers(-2 ** 20, 2 ** 20, (2, 4, 3, 3)).astype(dtype)
    if dtype == "int32":    # onnxruntime takes int32 per tensor with a zero point of 0
        inits = {"s": np.array(0.003, np.float32), "z": np.array(0, np.int32)}
        attrs = {}
    else:
        inits = {"s": RNG.uniform(0.001, 0.1, 4).astype(np.float32), "z": _ints((4,), dtype)}
        attrs = {"axis": 1}
    model = make_model("DequantizeLinear", {"x": x}, attrs, opset=13, initializers=inits)
    onnx_compare(model, {"x": x}, **EXACT)


def test_quantize_blocked_matches_numpy(onnx_compare):
    # onnxruntime 1.32 runs blocked QuantizeLinear only for int4: the expected values come from the spec
    x = RNG.standard_normal((3, 8)).astype(np.float32)
    s = RNG.uniform(0.01, 0.03, (3, 2)).astype(np.float32)
    z = _ints((3, 2), "uint8")
    full_s, full_z = np.repeat(s, 4, axis=1), np.repeat(z, 4, axis=1)
    ref = np.clip(np.rint(x / full_s) + full_z, 0, 255).astype(np.uint8)
    model = make_model("QuantizeLinear", {"x": x, "s": s, "z": z}, {"axis": 1, "block_size": 4}, opset=21)
    onnx_compare(model, {"x": x, "s": s, "z": z}, expected=[ref], **EXACT)


def test_dynamic_quantize(onnx_compare):
    for x in (RNG.standard_normal((5, 9)).astype(np.float32), np.abs(RNG.standard_normal((4,))).astype(np.float32),
              np.zeros((3,), np.float32)):
        model = make_model("DynamicQuantizeLinear", {"x": x}, {}, opset=11, n_outputs=3)
        onnx_compare(model, {"x": x}, **EXACT)


@pytest.mark.parametrize("adt,bdt", [("uint8", "int8"), ("uint8", "uint8"), ("int8", "int8")])
def test_matmul_integer(onnx_compare, adt, bdt):
    a, b = _ints((20, 40), adt), _ints((40, 24), bdt)
    inits = {"b": b, "za": _ints((), adt), "zb": _ints((24,), bdt)}
    model = make_model("MatMulInteger", {"a": a}, {}, opset=10, initializers=inits)
    onnx_compare(model, {"a": a}, **EXACT)


def test_conv_integer_runtime_zero_points(onnx_compare):
    x, w = _ints((1, 3, 9, 9), "uint8"), _ints((8, 3, 3, 3), "uint8")
    zx, zw = np.array(128, np.uint8), _ints((), "uint8")   # onnxruntime: per-tensor weight zero points only
    model = make_model("ConvInteger", {"x": x, "w": w, "zx": zx, "zw": zw}, {"pads": [1, 1, 1, 1]}, opset=10)
    onnx_compare(model, {"x": x, "w": w, "zx": zx, "zw": zw}, **EXACT)


@pytest.mark.parametrize("adt,bdt", [("uint8", "int8"), ("int8", "int8"), ("uint8", "uint8")])
@pytest.mark.parametrize("m", [3, 32])
def test_qlinear_matmul(onnx_compare, adt, bdt, m):
    a, b = _ints((m, 64), adt), _ints((64, 40), bdt)
    inits = {"sa": np.array(0.02, np.float32), "za": _ints((), adt), "b": b, "sb": np.array(0.004, np.float32),
             "zb": _ints((), bdt), "sy": np.array(0.3, np.float32), "zy": _ints((), adt)}
    model = make_model("QLinearMatMul", {"a": a}, {}, opset=10, initializers=inits)
    # initializer order after the run-time input: the node's input order must be the spec's
    model.graph.node[0].input[:] = ["a", "sa", "za", "b", "sb", "zb", "sy", "zy"]
    onnx_compare(model, {"a": a}, **EXACT)


CONVS = [  # (x shape, w shape, attrs)
    ((1, 8, 12, 12), (16, 8, 3, 3), {"pads": [1, 1, 1, 1]}),
    ((1, 16, 9, 9), (32, 16, 1, 1), {}),
    ((1, 8, 11, 11), (16, 8, 3, 3), {"strides": [2, 2], "pads": [0, 1, 1, 0]}),
    ((1, 8, 10, 10), (8, 1, 3, 3), {"group": 8, "pads": [1, 1, 1, 1]}),
    ((1, 8, 10, 10), (12, 4, 3, 3), {"group": 2}),
    ((2, 4, 7, 7), (96, 4, 3, 3), {"pads": [1, 1, 1, 1]}),
]


@pytest.mark.parametrize("xshape,wshape,attrs", CONVS)
@pytest.mark.parametrize("xdt", ["uint8", "int8"])
def test_qlinear_conv_per_channel(onnx_compare, xshape, wshape, attrs, xdt):
    x, w = _ints(xshape, xdt), _ints(wshape, "int8")
    oc = wshape[0]
    inits = {"sx": np.array(0.05, np.float32), "zx": _ints((), xdt), "w": w,
             "sw": RNG.uniform(0.001, 0.01, oc).astype(np.float32), "zw": np.zeros(oc, np.int8),
             "sy": np.array(0.7, np.float32), "zy": _ints((), xdt),
             "bias": RNG.integers(-5000, 5000, oc).astype(np.int32)}
    model = make_model("QLinearConv", {"x": x}, attrs, opset=10, initializers=inits)
    model.graph.node[0].input[:] = ["x", "sx", "zx", "w", "sw", "zw", "sy", "zy", "bias"]
    for level in (3, 2):
        onnx_compare(model, {"x": x}, opt_level=level, **EXACT)


@pytest.mark.parametrize("op,inputs,attrs,what", [
    ("QuantizeLinear", {"x": np.zeros(4, np.float32), "s": np.ones((), np.float32)}, {"output_dtype": 21}, "int4"),
    ("QuantizeLinear", {"x": np.zeros(4, np.float32), "s": np.ones((), np.float32)}, {"output_dtype": 17},
     "float8e4m3fn"),
    ("QuantizeLinear", {"x": np.zeros((2, 6), np.float32), "s": np.ones((2, 2), np.float32)},
     {"axis": 1, "block_size": 4}, "block_size 4"),
    ("DequantizeLinear", {"x": np.zeros(4, np.int8), "s": np.ones((), np.float32)}, {"output_dtype": 10},
     "float16"),
    ("QuantizeLinear", {"x": np.zeros(4, np.float32), "s": np.ones((), np.float32)}, {"precision": 10},
     "float16"),
])
def test_refusals_name_the_type(op, inputs, attrs, what):
    model = make_model(op, inputs, attrs, opset=28 if ("precision" in attrs) else 21)
    with pytest.raises(UnsupportedOpError, match=what):
        from_onnx(model)
