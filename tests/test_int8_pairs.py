"""The int8 pairs form (ops/qconv.py): on Arm cores without a dot product (rasp4b), pointwise convs over at least
128 input channels, channels last or one pixel (a dense row), whose weights stay within [-127, 127], multiply 16
bytes per step with smull + smlal + sadalp (te.pair_dot) and add each output's four lanes with addp (te.quad_sum).
kernels/qconv_ops.for_target picks it and packs the weights as int16 pairs; the integers are the plain kernel's
(numpy meaning, flip and bias correction included); built for the emulated A72 they equal onnxruntime (a head) or
the host build (a channels-last network) bit for bit; convs it does not cover keep the widened form."""
from __future__ import annotations

import re

import numpy as np
import pytest
from fixtures.int8_models import assert_remote_equals_onnxruntime
from fixtures.onnx_struct_compare import make_graph_model
from onnx import helper

import tether
from tether import rpc
from tether.frontend import from_onnx
from tether.graph import op_info
from tether.graph.passes import optimize
from tether.kernels import qconv_ops


def _head(k: int, n: int, acts: str, seed: int = 0, weight_low: int = -127):
    """quantize_static's one-row classifier head, DQ(x) -> Gemm(DQ(w), DQ(bias)) -> Q, and an input."""
    rng = np.random.default_rng(seed)
    lo, hi = (0, 256) if acts == "uint8" else (-128, 128)
    x = rng.integers(lo, hi, (1, k)).astype(acts)
    w = rng.integers(-127, 128, (n, k)).astype(np.int8)
    w[0, :3] = [weight_low, 127, weight_low]
    sw = rng.uniform(1e-4, 2e-4, n).astype(np.float32)
    inits = {"sx": np.array(0.03, np.float32), "zx": np.array(11 if acts == "uint8" else -9, acts),
             "w": w, "sw": sw, "zw": np.zeros(n, np.int8),
             "b": rng.integers(-900, 900, n).astype(np.int32), "sb": (np.float32(0.03) * sw).astype(np.float32),
             "zb": np.zeros(n, np.int32), "sy": np.array(0.02, np.float32),
             "zy": np.array(128 if acts == "uint8" else 0, acts)}
    nodes = [helper.make_node("DequantizeLinear", ["x", "sx", "zx"], ["xf"]),
             helper.make_node("DequantizeLinear", ["w", "sw", "zw"], ["wf"], axis=0),
             helper.make_node("DequantizeLinear", ["b", "sb", "zb"], ["bf"], axis=0),
             helper.make_node("Gemm", ["xf", "wf", "bf"], ["yf"], transB=1),
             helper.make_node("QuantizeLinear", ["yf", "sy", "zy"], ["y"])]
    return make_graph_model(nodes, {"x": x}, ["y"], inits, opset=13), x


def _qconvs(graph):
    return [b for n in graph.nodes for b in n.body() if b.op == "qconv2d"]


def _for_rasp4b(model):
    graph, params = from_onnx(model)
    opt, p = optimize(graph, params, opt_level=3)
    moved, p2 = qconv_ops.for_target(opt, p, "rasp4b")
    return _qconvs(opt), p, _qconvs(moved), p2


@pytest.mark.parametrize("acts", ["uint8", "int8"])
@pytest.mark.parametrize("k,n", [(130, 37), (128, 8), (256, 64)])
def test_heads_take_the_pairs_form_with_the_same_integers(acts, k, n):
    """A one-row head over >= 128 channels: weights (ceil(n/8), ceil(k/16), 8, 8) int16, kind s8s8 (uint8 bytes
    flipped, the bias corrected), and the numpy meaning of the node gives the plain node's integers."""
    model, x = _head(k, n, acts)
    (plain,), p, (pairs,), p2 = _for_rasp4b(model)
    wp = p2[pairs.inputs[1]]
    assert wp.dtype == np.int16 and wp.shape == (-(-n // 8), -(-k // 16), 8, 8), wp.shape
    assert (pairs.attrs["kind"], pairs.attrs["flip"]) == ("s8s8", int(acts == "uint8"))
    xs = np.random.default_rng(3).integers(*((0, 256) if acts == "uint8" else (-128, 128)), (1, k, 1, 1))
    xs = xs.astype(acts)
    want = op_info.evaluate("qconv2d", plain.attrs, [xs] + [p[v] for v in plain.inputs[1:]])[0]
    got = op_info.evaluate("qconv2d", pairs.attrs, [xs] + [p2[v] for v in pairs.inputs[1:]])[0]
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("why,k,weight_low", [("a weight of -128", 160, -128), ("96 channels", 96, -127)])
def test_other_convs_keep_the_widened_form(why, k, weight_low):
    """A weight of -128 (two such products can leave int16) or fewer than 128 channels: the widened form's 3-D
    int16 panels."""
    model, _ = _head(k, 24, "uint8", weight_low=weight_low)
    _, _, (node,), p2 = _for_rasp4b(model)
    assert p2[node.inputs[1]].ndim == 3, why


def test_pair_weights_round_trip():
    w = np.random.default_rng(1).integers(-127, 128, (37, 52, 1, 1)).astype(np.int32)
    from tether.ops import qconv as qops
    wp = qops.pair_weights(w)
    np.testing.assert_array_equal(qops.unpack_weights(wp, 37, 52, (1, 1)), w)
    np.testing.assert_array_equal(qops.weight_sums(wp, 37), w.reshape(37, -1).sum(axis=1))
    with pytest.raises(ValueError, match=r"\[-127, 127\]"):
        qops.pair_weights(np.full((8, 16, 1, 1), -128))


@pytest.mark.emulated
def test_heads_on_the_emulated_a72_equal_onnxruntime(emulated_devices, tmp_path):
    """Built for rasp4b the heads run smull/smlal + sadalp and give onnxruntime's output bit for bit on the emulated
    Cortex-A72: uint8 and int8 activations, output counts that are not a multiple of 8, channel counts that are
    not a multiple of 16."""
    device = emulated_devices.for_preset("rasp4b")
    with rpc.connect(*device.address, timeout=300) as sess:
        for acts in ("uint8", "int8"):
            for k, n in ((130, 37), (512, 64), (144, 10)):
                model, x = _head(k, n, acts, seed=k + n)
                graph, params = from_onnx(model)
                factory = tether.build_graph(graph, params, target="rasp4b")
                assert [w.ndim for w in (factory.params[b.inputs[1]] for b in _qconvs(factory.graph))] == [4]
                asm = factory.lib.get_source("asm")
                assert re.search(r"\bsadalp\s+v\d+\.4s, v\d+\.8h", asm) and re.search(r"\bsmlal2?\s+v\d+\.8h", asm)
                assert_remote_equals_onnxruntime(sess, factory, tmp_path / ("%s_%d_%d" % (acts, k, n)), model,
                                                 {"x": x}, "%s %d %d" % (acts, k, n))


NETWORK = [(8, 144, 3, True), (144, 24, 1, False), (24, 136, 1, True), (136, 20, 1, False)]
# the first conv a pointwise one over 128 channels of the (NCHW) input, writing channels last for the depthwise conv
NCHW_FIRST = [(128, 32, 1, True), (32, 32, 3, False), (32, 16, 1, False)]


def _network(path, layers=NETWORK, channels: int = 8) -> None:
    """x (1, channels, 10, 10) -> the convs of ``layers`` ((cin, cout, kernel, relu); a 3x3 conv with cin == cout
    is depthwise), in float32 (quantized by the test). NETWORK: 3x3 conv 8->144 + relu -> pointwise 144->24 ->
    pointwise 24->136 + relu -> pointwise 136->20."""
    import onnx
    from onnx import TensorProto, numpy_helper
    rng = np.random.default_rng(7)
    nodes, inits, x = [], [], "input"
    for i, (cin, cout, k, relu) in enumerate(layers):
        group = cin if (k == 3 and cin == cout and i) else 1
        w = rng.normal(0, 1.0 / np.sqrt(cin // group * k * k), (cout, cin // group, k, k)).astype(np.float32)
        inits += [numpy_helper.from_array(w, "w%d" % i),
                  numpy_helper.from_array(rng.normal(0, 0.1, cout).astype(np.float32), "b%d" % i)]
        nodes.append(helper.make_node("Conv", [x, "w%d" % i, "b%d" % i], ["c%d" % i], kernel_shape=[k, k],
                                      pads=[k // 2] * 4, group=group))
        x = "c%d" % i
        if relu:
            nodes.append(helper.make_node("Relu", [x], ["r%d" % i]))
            x = "r%d" % i
    g = helper.make_graph(nodes, "net", [helper.make_tensor_value_info("input", TensorProto.FLOAT,
                                                                       [1, channels, 10, 10])],
                          [helper.make_tensor_value_info(x, TensorProto.FLOAT, None)], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), str(path))


@pytest.mark.emulated
def test_channels_last_pointwise_convs_on_the_emulated_a72(emulated_devices, tmp_path):
    """int8 activations channels last between convs: the 144 -> 24 and 136 -> 20 pointwise convs (100 pixels) run
    in pairs on rasp4b and give the host build's outputs bit for bit; the 24 -> 136 one stays widened."""
    from fixtures.pass_builds import run_host, run_on_device
    from fixtures.scripts import load_script
    import onnx

    _network(tmp_path / "net.onnx")
    quantized = str(tmp_path / "net_int8.onnx")
    load_script("quantize_model").quantize(str(tmp_path / "net.onnx"), quantized, "qdq", per_channel=True,
                                           activations="int8")
    rng = np.random.default_rng(5)
    xs = [rng.random((1, 8, 10, 10), dtype=np.float32) for _ in range(2)]
    want = run_host(quantized, tmp_path / "host", xs, 1)
    graph, params = from_onnx(onnx.load(quantized))
    factory = tether.build_graph(graph, params, target="rasp4b")
    pairs = sorted(b.attrs["channels"] for b in _qconvs(factory.graph) if factory.params[b.inputs[1]].ndim == 4)
    assert pairs == [136, 144], pairs
    asm = factory.lib.get_source("asm")
    assert re.search(r"\baddp\s+v\d+\.4s", asm) and re.search(r"\bsadalp\s+v\d+\.4s", asm)
    factory.export(str(tmp_path / "arm"))
    device = emulated_devices.for_preset("rasp4b")
    for got, w in zip(run_on_device(device, tmp_path / "arm", xs, 1), want):
        np.testing.assert_array_equal(got[0], w[0])


@pytest.mark.emulated
def test_a_pointwise_conv_reading_nchw_pixels_stays_widened(emulated_devices, tmp_path):
    """A pointwise conv over 128 channels whose input is NCHW (the graph's) and whose output goes channels last:
    the pairs form reads channels-last pixels or one pixel only, so it keeps the widened form, and the network
    gives the host build's outputs bit for bit on the emulated A72."""
    from fixtures.pass_builds import run_host, run_on_device
    from fixtures.scripts import load_script
    import onnx

    _network(tmp_path / "net.onnx", NCHW_FIRST, channels=128)
    quantized = str(tmp_path / "net_int8.onnx")
    load_script("quantize_model").quantize(str(tmp_path / "net.onnx"), quantized, "qdq", per_channel=True,
                                           activations="int8")
    rng = np.random.default_rng(6)
    xs = [rng.random((1, 128, 10, 10), dtype=np.float32)]
    want = run_host(quantized, tmp_path / "host", xs, 1)
    graph, params = from_onnx(onnx.load(quantized))
    factory = tether.build_graph(graph, params, target="rasp4b")
    first = [b for b in _qconvs(factory.graph) if b.attrs["channels"] == 128]
    assert len(first) == 1 and not first[0].attrs.get("channels_last_in"), [b.attrs for b in first]
    assert factory.params[first[0].inputs[1]].ndim == 3
    factory.export(str(tmp_path / "arm"))
    device = emulated_devices.for_preset("rasp4b")
    for got, w in zip(run_on_device(device, tmp_path / "arm", xs, 1), want):
        np.testing.assert_array_equal(got[0], w[0])
