"""The QDQ groups onnxruntime runs as integer kernels around pooling, Resize, Concat and activations
(graph/passes/quantize.py): each fused by tether (no quantize/dequantize left around it) and bit for bit equal to
onnxruntime on every input value (uint8 and int8, several scales and zero points); and groups that do not match
a pattern run unfused, still equal to onnxruntime (which leaves them to float as well)."""
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import tether
from tether import graph_executor
from tether.frontend import from_onnx
from tether.graph.passes import dce, fuse_qdq

SHAPE = [1, 16, 16, 16]    # 4096 elements: every int8/uint8 value 16 times
PARAMS = [(0.05, 0.05, 0, 0), (0.031, 0.047, 7, -3), (0.2, 0.013, -21, 11), (0.0117, 0.0089, 100, -100)]
CODE = {"uint8": TensorProto.UINT8, "int8": TensorProto.INT8}


def _zp(z: int, dtype: str) -> np.ndarray:
    return np.array(z + 128 if dtype == "uint8" else z, dtype)


def _model(op, attrs, dtype, sx, sy, zx, zy, n_in=1, extra=(), extra_inits=(), x_axis_scale=None,
           opset=17):
    """DQ(x_k) for each input -> op -> Q, all per tensor (or x's DQ per channel with ``x_axis_scale``)."""
    inits = [numpy_helper.from_array(np.array(sy, np.float32), "sy"),
             numpy_helper.from_array(_zp(zy, dtype), "zy")] + list(extra_inits)
    nodes, ins = [], []
    for k in range(n_in):
        s = np.array(sx * (1 + 0.37 * k), np.float32) if x_axis_scale is None else x_axis_scale
        z = _zp(zx + 5 * k, dtype) if x_axis_scale is None else np.full(s.shape, _zp(zx, dtype))
        inits += [numpy_helper.from_array(s, "sx%d" % k), numpy_helper.from_array(z, "zx%d" % k)]
        nodes.append(helper.make_node("DequantizeLinear", ["x%d" % k, "sx%d" % k, "zx%d" % k], ["f%d" % k]))
        ins.append(helper.make_tensor_value_info("x%d" % k, CODE[dtype], SHAPE))
    nodes.append(helper.make_node(op, ["f%d" % k for k in range(n_in)] + list(extra), ["g"], **attrs))
    nodes.append(helper.make_node("QuantizeLinear", ["g", "sy", "zy"], ["y"]))
    g = helper.make_graph(nodes, "qdq", ins, [helper.make_tensor_value_info("y", CODE[dtype], None)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _feeds(dtype, n_in, seed=0):
    rng = np.random.default_rng(seed)
    info = np.iinfo(dtype)
    return {"x%d" % k: rng.permutation(np.resize(np.arange(info.min, info.max + 1), int(np.prod(SHAPE))))
            .reshape(SHAPE).astype(dtype) for k in range(n_in)}


def _run(model, feeds, tmp_path):
    """(tether's output, onnxruntime's, the op types of tether's graph after the quantize pass)."""
    graph, params = from_onnx(model)
    fused, _ = dce(*fuse_qdq(graph, params))
    tether.build_graph(graph, params, target="host").export(str(tmp_path))
    gm = graph_executor.load(str(tmp_path))
    for k, v in feeds.items():
        gm.set_input(k, v)
    gm.run()
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    return gm.get_output(0), ref, [n.op for n in fused.nodes]


def _assert_fused_exact(model, n_in, dtype, tmp_path, kept=()):
    got, ref, ops = _run(model, _feeds(dtype, n_in), tmp_path)
    assert got.dtype == ref.dtype and got.shape == ref.shape
    np.testing.assert_array_equal(got, ref)
    # (QLinearAveragePool's kernel reads the dequantized input, as onnxruntime's: its dequantize stays)
    left = [o for o in ops if o == "quantize" or (o == "dequantize" and "qavg_pool" not in ops)]
    assert not left, ops
    for op in kept:
        assert op in ops, ops
    return ops


CASES = {
    "maxpool": ("MaxPool", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    "global_maxpool": ("GlobalMaxPool", {}),
    "avgpool": ("AveragePool", {"kernel_shape": [3, 3], "strides": [2, 2]}),
    "avgpool_pads": ("AveragePool", {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}),
    "avgpool_pads_incl": ("AveragePool", {"kernel_shape": [2, 3], "pads": [1, 0, 1, 2], "count_include_pad": 1}),
    "sigmoid": ("Sigmoid", {}),
    "leakyrelu": ("LeakyRelu", {"alpha": 0.13}),
    "transpose": ("Transpose", {"perm": [0, 2, 3, 1]}),
}
SAME_PARAMS = ("maxpool", "global_maxpool", "transpose")     # onnxruntime drops the Q/DQ pair only when they agree


@pytest.mark.parametrize("dtype", ["uint8", "int8"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_unary_groups_fuse_bit_exact(tmp_path, case, dtype):
    op, attrs = CASES[case]
    for k, (sx, sy, zx, zy) in enumerate(PARAMS):
        if case in SAME_PARAMS:
            sy, zy = sx, zx
        elif case == "sigmoid":
            sy = 1.0 / 256      # quantize_static's output range for a sigmoid
        model = _model(op, attrs, dtype, sx, sy, zx, zy)
        _assert_fused_exact(model, 1, dtype, tmp_path / ("m%d" % k))


@pytest.mark.parametrize("dtype", ["uint8", "int8"])
def test_concat_requantizes_each_input(tmp_path, dtype):
    """QLinearConcat: each input to the output's scale (a table per input); none where the input's already is."""
    for k, (sx, sy, zx, zy) in enumerate(PARAMS):
        ops = _assert_fused_exact(_model("Concat", {"axis": 1}, dtype, sx, sy, zx, zy, n_in=3), 3, dtype,
                                  tmp_path / ("m%d" % k), kept=("concat", "gather"))
        differ = sum((sx * (1 + 0.37 * i), zx + 5 * i) != (sy, zy) for i in range(3))
        assert ops.count("gather") == differ, ops
    same = _model("Concat", {"axis": 1}, dtype, 0.05, 0.05, 0, 0, n_in=1)
    assert "gather" not in _assert_fused_exact(same, 1, dtype, tmp_path / "same")


@pytest.mark.parametrize("dtype", ["uint8", "int8"])
def test_nearest_resize_with_equal_params_runs_on_integers(tmp_path, dtype):
    scales = numpy_helper.from_array(np.array([1, 1, 2, 1.5], np.float32), "scales")
    model = _model("Resize", {"mode": "nearest"}, dtype, 0.05, 0.05, 3, 3, extra=["", "scales"],
                   extra_inits=[scales])
    _assert_fused_exact(model, 1, dtype, tmp_path, kept=("resize",))


@pytest.mark.parametrize("dtype", ["uint8", "int8"])
@pytest.mark.parametrize("value", [0.0, 0.37])
def test_constant_pad_with_equal_params_pads_the_integers(tmp_path, dtype, value):
    """Q(pad(DQ(x), value)) is pad(x, Q(value)): exact, whatever the value quantizes to."""
    extra_inits = [numpy_helper.from_array(np.array([0, 1, 2, 0, 0, 3, 1, 2], np.int64), "pads"),
                   numpy_helper.from_array(np.array(value, np.float32), "cval")]
    for k, (sx, _, zx, _) in enumerate(PARAMS):
        model = _model("Pad", {"mode": "constant"}, dtype, sx, sx, zx, zx, extra=["pads", "cval"],
                       extra_inits=extra_inits)
        _assert_fused_exact(model, 1, dtype, tmp_path / ("m%d" % k), kept=("pad",))


def _padded_conv(dtype: str, groups: int, pads: list):
    """DQ(x) -> Pad(zero, ``pads``) -> Q -> DQ -> Conv 3x3 stride 2 (``groups``) -> Q: a TFLite converter's explicit
    Pad ahead of a strided conv, as ONNX QDQ."""
    rng = np.random.default_rng(4)
    ch, oc = 8, (8 if groups > 1 else 12)
    w = rng.integers(-127, 128, (oc, ch // groups, 3, 3)).astype(np.int8)
    inits = [numpy_helper.from_array(a, n) for n, a in (
        ("sx", np.array(0.03, np.float32)), ("zx", _zp(-7, dtype)), ("sy", np.array(0.2, np.float32)),
        ("zy", _zp(4, dtype)), ("w", w), ("sw", np.array(0.004, np.float32)), ("zw", np.array(0, np.int8)),
        ("b", rng.integers(-300, 300, oc).astype(np.int32)), ("sb", np.float32(0.03) * np.float32(0.004)),
        ("zb", np.array(0, np.int32)), ("pads", np.array(pads, np.int64)))]
    nodes = [helper.make_node("DequantizeLinear", ["x0", "sx", "zx"], ["f"]),
             helper.make_node("Pad", ["f", "pads"], ["p"], mode="constant"),
             helper.make_node("QuantizeLinear", ["p", "sx", "zx"], ["pq"]),
             helper.make_node("DequantizeLinear", ["pq", "sx", "zx"], ["pf"]),
             helper.make_node("DequantizeLinear", ["w", "sw", "zw"], ["wf"]),
             helper.make_node("DequantizeLinear", ["b", "sb", "zb"], ["bf"]),
             helper.make_node("Conv", ["pf", "wf", "bf"], ["c"], strides=[2, 2], group=groups),
             helper.make_node("QuantizeLinear", ["c", "sy", "zy"], ["y"])]
    x = helper.make_tensor_value_info("x0", CODE[dtype], [1, ch, 15, 16])
    g = helper.make_graph(nodes, "padded", [x], [helper.make_tensor_value_info("y", CODE[dtype], None)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("dtype", ["uint8", "int8"])
@pytest.mark.parametrize("groups", [1, 8])
def test_a_zero_pad_before_an_int8_conv_becomes_its_padding(tmp_path, dtype, groups):
    """The pad fills with the conv input's zero point, which the int8 conv reads outside the image anyway: it goes
    into the conv's pads, no pad kernel is left, and the output is onnxruntime's bit for bit."""
    model = _padded_conv(dtype, groups, [0, 0, 0, 1, 0, 0, 1, 1])
    feeds = _feeds(dtype, 1)
    feeds["x0"] = feeds["x0"][:, :8, :15, :16]
    got, ref, _ = _run(model, feeds, tmp_path)
    np.testing.assert_array_equal(got, ref)
    graph, params = from_onnx(model)
    planned = tether.build_graph(graph, params, target="host").graph
    body = [b for n in planned.nodes for b in n.body()]
    assert "pad" not in [b.op for b in body], [b.op for b in body]
    (conv,) = [b for b in body if b.op in ("qconv2d", "qdepthwise2d", "qdepthwise2d_nhwc")]
    assert list(conv.attrs["pads"]) == [0, 1, 1, 1], conv.attrs


# ---- groups no pattern matches: unfused, and equal to onnxruntime, which runs them in float too
def _assert_unfused_exact(model, n_in, dtype, tmp_path, op):
    got, ref, ops = _run(model, _feeds(dtype, n_in), tmp_path)
    assert op in ops and "quantize" in ops, ops
    np.testing.assert_array_equal(got, ref)


@pytest.mark.parametrize("dtype", ["uint8", "int8"])
def test_maxpool_with_different_params_stays_unfused(tmp_path, dtype):
    model = _model("MaxPool", CASES["maxpool"][1], dtype, 0.05, 0.07, 3, -2)
    _assert_unfused_exact(model, 1, dtype, tmp_path, "max_pool")


@pytest.mark.parametrize("dtype", ["uint8", "int8"])
def test_activations_onnxruntime_leaves_to_float_stay_unfused(tmp_path, dtype):
    for k, (op, graph_op) in enumerate((("HardSwish", "hard_swish"), ("HardSigmoid", "hard_sigmoid"),
                                        ("Tanh", "tanh"))):
        model = _model(op, {}, dtype, 0.05, 1.0 / 128, 0, 0)
        _assert_unfused_exact(model, 1, dtype, tmp_path / ("m%d" % k), graph_op)


def test_per_channel_input_stays_unfused(tmp_path):
    """A per-channel input dequantize (onnxruntime 1.32 fails to build its QLinearLeakyRelu for one): unfused, as
    ONNX's reference evaluator computes it."""
    from onnx.reference import ReferenceEvaluator
    scale = np.linspace(0.01, 0.08, SHAPE[1]).astype(np.float32)
    model = _model("LeakyRelu", {"alpha": 0.25}, "uint8", 0, 0.05, 0, 0, x_axis_scale=scale,
                   opset=21)
    feeds = _feeds("uint8", 1)
    graph, params = from_onnx(model)
    ops = [n.op for n in dce(*fuse_qdq(graph, params))[0].nodes]
    assert "leaky_relu" in ops and "dequantize" in ops, ops
    tether.build_graph(graph, params, target="host").export(str(tmp_path))
    gm = graph_executor.load(str(tmp_path))
    gm.set_input("x0", feeds["x0"])
    gm.run()
    np.testing.assert_array_equal(gm.get_output(0), ReferenceEvaluator(model).run(None, feeds)[0])


def test_concat_with_a_float_input_stays_unfused(tmp_path):
    const = numpy_helper.from_array(np.random.default_rng(1).normal(0, 1, SHAPE).astype(np.float32), "c")
    model = _model("Concat", {"axis": 1}, "uint8", 0.05, 0.07, 3, -2, extra=["c"], extra_inits=[const])
    _assert_unfused_exact(model, 1, "uint8", tmp_path, "concat")


@pytest.mark.emulated
@pytest.mark.parametrize("preset", ["rasp5", "armv7-a7"])
def test_fused_groups_on_emulated_arm(emulated_devices, tmp_path, preset):
    """The fused kernels (qavg_pool, table lookups, integer max pooling) cross-compiled and run on emulated ARM,
    bit for bit with onnxruntime on the host."""
    from tether import rpc
    from tether.rpc.graph_client import RemoteGraphExecutor
    dev = emulated_devices.for_preset(preset)
    host, port = dev.address
    cases = [("AveragePool", CASES["avgpool_pads"][1], 0.031, 0.047, 7, -3), ("Sigmoid", {}, 0.05, 1 / 256, 0, 0),
             ("MaxPool", CASES["maxpool"][1], 0.05, 0.05, 3, 3), ("LeakyRelu", {"alpha": 0.13}, 0.2, 0.013, -21, 11)]
    with rpc.connect(host, port, timeout=300) as sess:
        for k, (op, attrs, sx, sy, zx, zy) in enumerate(cases):
            for dtype in ("uint8", "int8"):
                model = _model(op, attrs, dtype, sx, sy, zx, zy)
                graph, params = from_onnx(model)
                folder = tmp_path / ("%s_%d_%s" % (op, k, dtype))
                tether.build_graph(graph, params, target=dev.preset).export(str(folder))
                feeds = _feeds(dtype, 1)
                ref = ort.InferenceSession(model.SerializeToString(),
                                           providers=["CPUExecutionProvider"]).run(None, feeds)[0]
                with RemoteGraphExecutor(sess, str(folder)) as gm:
                    gm.set_input("x0", feeds["x0"])
                    gm.run()
                    np.testing.assert_array_equal(gm.get_output(0), ref)
