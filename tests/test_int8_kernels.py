"""The int8 conv kernels: qconv2d (dot4: the pixel form and the pointwise matmul form) and
qdepthwise2d, each taken by passes/quantize_dot.py for the convs it covers, bit for bit onnxruntime's
QLinearConv: odd channel counts, strides, pads, dilation, per-channel and per-tensor weights, uint8 and int8
activations, uint8 weights with a zero point; what the pass leaves (a grouped conv) still matches. Then the choice
of dot-product kind per target (flip + bias correction) and the same convs on emulated rasp5 (sdot in its
disassembly) and armv7."""
import re

import numpy as np
import onnxruntime as ort
import pytest
from fixtures.int8_models import assert_remote_equals_onnxruntime
from fixtures.onnx_struct_compare import make_graph_model, make_model
from onnx import helper

import tether
from tether import rpc
from tether.frontend import from_onnx
from tether.graph import op_info
from tether.kernels import qconv_ops
from tether.graph.passes import optimize
from tether.rpc.graph_client import RemoteGraphExecutor

RNG = np.random.default_rng(12)

# name: (C, O, H, W, kernel, attrs, activations, per_channel, weights, expected op)
CASES = {
    "pointwise_matmul_form": (24, 40, 8, 8, 1, {}, "uint8", True, "int8", "qconv2d"),
    "pointwise_odd_pixels": (13, 17, 7, 7, 1, {}, "uint8", True, "int8", "qconv2d"),
    "pointwise_padded_pixels": (16, 32, 9, 9, 1, {}, "int8", True, "int8", "qconv2d"),    # 81 -> 96 pixels
    "pointwise_int8_acts": (20, 33, 4, 8, 1, {}, "int8", False, "int8", "qconv2d"),
    "3x3_s1_pad": (7, 33, 9, 9, 3, {"pads": [1, 1, 1, 1]}, "uint8", True, "int8", "qconv2d"),
    "3x3_s2_asym_pads": (16, 16, 10, 11, 3, {"pads": [0, 1, 1, 0], "strides": [2, 2]}, "uint8", False, "int8",
                         "qconv2d"),
    "3x3_int8_acts": (5, 9, 6, 6, 3, {"pads": [1, 1, 1, 1]}, "int8", True, "int8", "qconv2d"),
    # a stem: 3 input channels (one word, three of its bytes), 8 output channels (the widened form's 8-wide panel)
    "stem_3_to_8": (3, 8, 11, 10, 3, {"pads": [1, 1, 1, 1], "strides": [2, 2]}, "uint8", True, "int8", "qconv2d"),
    "5x5_dilated": (6, 20, 12, 12, 5, {"pads": [2, 2, 2, 2], "dilations": [2, 1]}, "uint8", True, "int8", "qconv2d"),
    "uint8_weights": (9, 18, 6, 6, 3, {"pads": [1, 1, 1, 1]}, "uint8", False, "uint8", "qconv2d"),
    "depthwise_s1": (19, 19, 9, 9, 3, {"pads": [1, 1, 1, 1], "group": 19}, "uint8", True, "int8", "qdepthwise2d"),
    "depthwise_s2": (32, 32, 14, 15, 3, {"pads": [1, 1, 1, 1], "strides": [2, 2], "group": 32}, "uint8", True,
                     "int8", "qdepthwise2d"),
    "depthwise_int8_acts": (8, 8, 7, 7, 3, {"pads": [0, 1, 2, 1], "group": 8}, "int8", False, "int8",
                            "qdepthwise2d"),
    # 2- and 3-column rows: the narrow (unrolled scalar) form of the depthwise window
    "depthwise_5x5_3x3_map": (40, 40, 3, 3, 5, {"pads": [2, 2, 2, 2], "group": 40}, "uint8", True, "int8",
                              "qdepthwise2d"),
    "depthwise_2x2_map": (17, 17, 2, 2, 3, {"pads": [1, 1, 1, 1], "group": 17}, "int8", False, "int8",
                          "qdepthwise2d"),
    "grouped_stays": (8, 8, 6, 6, 3, {"pads": [1, 1, 1, 1], "group": 2}, "uint8", True, "int8", None),
}


def _qlinearconv(c, o, h, w, k, attrs, acts, per_channel, weights):
    lo, hi = (0, 256) if acts == "uint8" else (-128, 128)
    x = RNG.integers(lo, hi, (1, c, h, w)).astype(acts)
    groups = attrs.get("group", 1)
    wshape = (o, c // groups, k, k)
    n_scales = o if per_channel else 1
    if weights == "int8":
        wt = RNG.integers(-127, 128, wshape).astype(np.int8)
        zw = np.zeros(n_scales, np.int8)
    else:
        wt = RNG.integers(0, 256, wshape).astype(np.uint8)
        zw = np.full(n_scales, 128, np.uint8)
    fan_in = c // groups * k * k
    inits = {"sx": np.array(0.02, np.float32), "zx": np.array(7 if acts == "uint8" else -5, acts), "w": wt,
             "sw": RNG.uniform(0.5, 1.5, n_scales).astype(np.float32) / (60.0 * fan_in),
             "zw": zw if per_channel else zw.reshape(()),
             "sy": np.array(0.05, np.float32), "zy": np.array(120 if acts == "uint8" else 3, acts),
             "bias": RNG.integers(-3000, 3000, o).astype(np.int32)}
    if not per_channel:
        inits["sw"] = inits["sw"].reshape(())
    model = make_model("QLinearConv", {"x": x}, attrs, opset=10, initializers=inits)
    model.graph.node[0].input[:] = ["x", "sx", "zx", "w", "sw", "zw", "sy", "zy", "bias"]
    return model, x


def _ops(model):
    graph, params = from_onnx(model)
    opt, _ = optimize(graph, params, opt_level=3)
    return {b.op for n in opt.nodes for b in n.body()}


@pytest.mark.parametrize("case", sorted(CASES))
def test_qlinearconv_bit_exact(onnx_compare, case):
    *shape, expected = CASES[case]
    model, x = _qlinearconv(*shape)
    ops_used = _ops(model)
    if expected is None:
        assert not ops_used & {"qconv2d", "qdepthwise2d"}, ops_used
    else:
        assert expected in ops_used, ops_used
    onnx_compare(model, {"x": x}, rtol=0, atol=0)


def test_qdq_gemm_head_runs_as_a_qconv(onnx_compare):
    """quantize_static's classifier head, DQ(x) -> Gemm(DQ(w), DQ(bias)) -> Q, one row: a 1x1 qconv2d."""
    k, n = 52, 37
    x = RNG.integers(0, 256, (1, k)).astype(np.uint8)
    sw = RNG.uniform(1e-4, 2e-4, n).astype(np.float32)
    inits = {"sx": np.array(0.03, np.float32), "zx": np.array(11, np.uint8),
             "w": RNG.integers(-127, 128, (n, k)).astype(np.int8), "sw": sw, "zw": np.zeros(n, np.int8),
             "b": RNG.integers(-900, 900, n).astype(np.int32), "sb": (np.float32(0.03) * sw).astype(np.float32),
             "zb": np.zeros(n, np.int32), "sy": np.array(0.02, np.float32), "zy": np.array(128, np.uint8)}
    nodes = [helper.make_node("DequantizeLinear", ["x", "sx", "zx"], ["xf"]),
             helper.make_node("DequantizeLinear", ["w", "sw", "zw"], ["wf"], axis=0),
             helper.make_node("DequantizeLinear", ["b", "sb", "zb"], ["bf"], axis=0),
             helper.make_node("Gemm", ["xf", "wf", "bf"], ["yf"], transB=1),
             helper.make_node("QuantizeLinear", ["yf", "sy", "zy"], ["y"])]
    model = make_graph_model(nodes, {"x": x}, ["y"], inits, opset=13)
    assert "qconv2d" in _ops(model)
    onnx_compare(model, {"x": x}, rtol=0, atol=0)


def _graph_for(case, target):
    model, x = _qlinearconv(*CASES[case][:-1])
    graph, params = from_onnx(model)
    factory = tether.build_graph(graph, params, target=target)
    (node,) = [b for n in factory.graph.nodes for b in n.body() if b.op == "qconv2d"]
    return model, x, factory, node


# A CPU with AVX512-VNNI named explicitly: the flip is checked in its code whatever CPU runs the tests (the
# build is a cross-compile; nothing of it runs here).
VNNI_CPU = "x86_64-linux-gnu -mcpu=icelake-server"


def test_vnni_kind_flips_int8_activations_for_vpdpbusd():
    # AVX512-VNNI's (and AVX-VNNI's) vpdpbusd reads uint8 activations
    assert qconv_ops.int8_dot_native(VNNI_CPU) == ("u8s8",)
    _, _, _, node = _graph_for("pointwise_matmul_form", VNNI_CPU)
    assert (node.attrs["kind"], node.attrs["flip"]) == ("u8s8", 0)
    _, _, factory, node = _graph_for("3x3_int8_acts", VNNI_CPU)
    assert (node.attrs["kind"], node.attrs["flip"]) == ("u8s8", 1)
    assert "vpdpbusd" in factory.lib.get_source("asm")


def test_flip_keeps_the_integers():
    """for_target's kind and bias correction compute the integers of the plain kernel (the op's numpy meaning)."""
    for case, target in (("3x3_s1_pad", "rasp5"), ("3x3_int8_acts", VNNI_CPU),
                         ("pointwise_matmul_form", "android-arm64")):
        model, x = _qlinearconv(*CASES[case][:-1])
        graph, params = from_onnx(model)
        opt, p = optimize(graph, params, opt_level=3)
        moved, p2 = qconv_ops.for_target(opt, p, target)
        (plain,) = [b for n in opt.nodes for b in n.body() if b.op == "qconv2d"]
        (flipped,) = [b for n in moved.nodes for b in n.body() if b.op == "qconv2d"]
        assert flipped.attrs["flip"] == 1 and flipped.attrs["kind"] in ("s8s8", "u8s8")
        want = op_info.evaluate("qconv2d", plain.attrs, [x] + [p[v] for v in plain.inputs[1:]])[0]
        got = op_info.evaluate("qconv2d", flipped.attrs, [x] + [p2[v] for v in flipped.inputs[1:]])[0]
        assert not np.array_equal(p[plain.inputs[2]], p2[flipped.inputs[2]])
        np.testing.assert_array_equal(got, want)


@pytest.fixture(params=("rasp5", "rasp4b", "armv7-a7"))
def arm_device(request, emulated_devices):
    return emulated_devices.for_preset(request.param)


@pytest.mark.emulated
def test_emulated_arm_int8_convs(arm_device, tmp_path):
    """The int8 conv kernels built for rasp5 (sdot, u8 activations flipped to s8), rasp4b (the widened form: int16
    weights, smlal by element) and armv7 (dot4's widening multiplies), run on the emulated devices, equal
    onnxruntime's output bit for bit."""
    host, port = arm_device.address
    with rpc.connect(host, port, timeout=300) as sess:
        for case in ("pointwise_matmul_form", "3x3_s2_asym_pads", "3x3_int8_acts", "stem_3_to_8", "depthwise_s2"):
            model, x = _qlinearconv(*CASES[case][:-1])
            graph, params = from_onnx(model)
            factory = tether.build_graph(graph, params, target=arm_device.preset)
            asm = factory.lib.get_source("asm")
            if arm_device.preset == "rasp5" and CASES[case][-1] == "qconv2d":
                assert "sdot" in asm, case
            if arm_device.preset == "rasp4b" and CASES[case][-1] == "qconv2d" and "matmul" not in case:
                assert re.search(r"\bsmlal2?\s+v\d+\.4s, v\d+\.[48]h", asm) and "saddlp" not in asm, case
                if case == "stem_3_to_8":
                    weights = [factory.params[b.inputs[1]] for n in factory.graph.nodes for b in n.body()
                               if b.op == "qconv2d"]
                    assert [w.shape for w in weights] == [(1, 36, 8)], case   # 9 taps x 4 bytes, 8 wide
            assert_remote_equals_onnxruntime(sess, factory, tmp_path / case, model, {"x": x}, case)


@pytest.mark.emulated
def test_emulated_aarch64_quantize_special_values(emulated_devices, tmp_path):
    """On aarch64 a quantize's clamp, whose bounds are a constant minus the zero point converted, is fmaxnm/fminnm
    (no compare and select) and its rounding conversion one fcvtns: NaN, infinities, signed zeros, ties and values
    far outside the range quantize as onnxruntime's QuantizeLinear does, bit for bit, on the emulated rasp5."""
    device = emulated_devices.for_preset("rasp5")
    special = [np.nan, np.inf, -np.inf, 0.0, -0.0, 0.025, -0.025, 0.075, -0.075, 1e30, -1e30, 6.375, 12.7, -6.4,
               3.4e38, -3.4e38, 1e-40, -1e-40]
    x = np.concatenate([np.array(special, np.float32), RNG.uniform(-8, 8, 64 - len(special)).astype(np.float32)])
    inits = {"s": np.array(0.05, np.float32), "zu": np.array(10, np.uint8), "zs": np.array(-3, np.int8)}
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "zu"], ["yu"]),
             helper.make_node("QuantizeLinear", ["x", "s", "zs"], ["ys"])]
    model = make_graph_model(nodes, {"x": x.reshape(1, 64)}, ["yu", "ys"], inits, opset=13)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x.reshape(1, 64)})
    graph, params = from_onnx(model)
    factory = tether.build_graph(graph, params, target="rasp5")
    asm = factory.lib.get_source("asm")
    assert "fmaxnm" in asm and "fminnm" in asm and "fcmgt" not in asm
    assert "fcvtns" in asm and "frintn" not in asm
    factory.export(str(tmp_path / "q"))
    host, port = device.address
    with rpc.connect(host, port, timeout=300) as sess, RemoteGraphExecutor(sess, str(tmp_path / "q")) as gm:
        gm.set_input("x", x.reshape(1, 64))
        gm.run()
        for k in range(2):
            np.testing.assert_array_equal(gm.get_output(k), want[k])
