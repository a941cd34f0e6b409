"""int8 activations channels last between int8 kernels (graph/passes/int8_layout.py): a small network of
int8 convs (3x3, depthwise at strides 1 and 2, pointwise, odd channel counts), a max pool, residual adds and a
global pool,
quantized by onnxruntime's quantize_static in the QDQ and the QOperator form, with uint8 and int8 activations.
The pass must change the layout only: tether's output with the pass equals tether's output without it bit for bit,
and both match onnxruntime; the values between int8 kernels are channels last and read back as NCHW only where a
non-int8 reader (global pooling, the graph output) needs them. The same network runs on emulated rasp5 (aarch64
with sdot) and armv7."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from fixtures.int8_models import assert_within_one_step
from fixtures.onnx_struct_compare import make_graph_model
from fixtures.pass_builds import run_host, run_on_device
from fixtures.scripts import load_script
from onnx import TensorProto, helper, numpy_helper

import tether
from tether.frontend import from_onnx
from tether.graph.passes import int8_channels_last, int8_dot_convs, optimize

SIZE = 12


def _float_net(seed: int = 0) -> onnx.ModelProto:
    """x (1, 6, 12, 12) -> 3x3 conv 6->19 + relu -> 3x3 max pool -> depthwise s1 -> pointwise 19->20 (a)
    -> pointwise 20->36 + relu -> depthwise s2 -> pointwise 36->20 -> ... and a residual block:
    y = a' + pw(dw(pw(a'))) at 6x6; outputs y and its global average pool."""
    rng = np.random.default_rng(seed)
    nodes, inits = [], {}

    def conv(x, cin, cout, k, stride=1, group=1, relu=True, name=""):
        w = rng.normal(0, 1.0 / np.sqrt(cin // group * k * k), (cout, cin // group, k, k)).astype(np.float32)
        inits[name + "_w"] = w
        inits[name + "_b"] = rng.normal(0, 0.1, cout).astype(np.float32)
        out = name + "_y"
        nodes.append(helper.make_node("Conv", [x, name + "_w", name + "_b"], [out], kernel_shape=[k, k],
                                      pads=[k // 2] * 4, strides=[stride, stride], group=group))
        if relu:
            nodes.append(helper.make_node("Relu", [out], [name + "_r"]))
            out = name + "_r"
        return out

    t = conv("input", 6, 19, 3, name="c1")
    nodes.append(helper.make_node("MaxPool", [t], ["mp"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]))
    t = conv("mp", 19, 19, 3, group=19, name="dw1")
    a = conv(t, 19, 20, 1, relu=False, name="pw1")
    t = conv(a, 20, 36, 1, name="pw2")
    t = conv(t, 36, 36, 3, stride=2, group=36, name="dw2")
    a2 = conv(t, 36, 20, 1, relu=False, name="pw3")
    t = conv(a2, 20, 40, 1, name="pw4")
    t = conv(t, 40, 40, 3, group=40, name="dw3")
    t = conv(t, 40, 20, 1, relu=False, name="pw5")
    nodes.append(helper.make_node("Add", [a2, t], ["y"]))
    nodes.append(helper.make_node("GlobalAveragePool", ["y"], ["pooled"]))
    graph = helper.make_graph(nodes, "net", [helper.make_tensor_value_info("input", TensorProto.FLOAT,
                                                                           [1, 6, SIZE, SIZE])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
                               helper.make_tensor_value_info("pooled", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


@pytest.fixture(scope="module")
def quantized(tmp_path_factory):
    """quantized(fmt, activations) -> path of the network quantized by quantize_static (per-channel weights)."""
    folder = tmp_path_factory.mktemp("int8_layout")
    fp32 = folder / "net.onnx"
    onnx.save(_float_net(), str(fp32))
    cache = {}

    def get(fmt: str, activations: str) -> str:
        if (fmt, activations) not in cache:
            out = folder / ("net_%s_%s.onnx" % (fmt, activations))
            load_script("quantize_model").quantize(str(fp32), str(out), fmt, per_channel=True,
                                                   activations=activations)
            cache[fmt, activations] = str(out)
        return cache[fmt, activations]
    return get


def _inputs(n: int = 3):
    rng = np.random.default_rng(5)
    return [rng.random((1, 6, SIZE, SIZE), dtype=np.float32) for _ in range(n)]


def _run_host(path: str, folder, xs, layout: bool = True):
    """tether's outputs on the host for each input, built with or without the channels-last pass."""
    return run_host(path, folder, xs, 2, without=None if layout else int8_channels_last)


def _assert_matches_ort(path: str, outs, xs) -> None:
    """Bit for bit onnxruntime's outputs where the form agrees bit for bit without the pass (the QOperator form,
    uint8 QDQ); at most one output step apart otherwise (docs/graph.md: int8 QDQ convs onnxruntime leaves float)."""
    model = onnx.load(path)
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    for x, got in zip(xs, outs):
        want = sess.run(None, {"input": x})
        for name, g, w in zip(("y", "pooled"), got, want):
            (dq,) = [n for n in model.graph.node if n.op_type == "DequantizeLinear" and n.output[0] == name]
            assert_within_one_step(g, w, float(inits[dq.input[1]]))


@pytest.mark.parametrize("fmt,activations", [("qdq", "uint8"), ("qoperator", "uint8"), ("qdq", "int8"),
                                             ("qoperator", "int8")])
def test_channels_last_changes_only_the_layout(quantized, tmp_path, fmt, activations):
    path = quantized(fmt, activations)
    xs = _inputs()
    with_pass = _run_host(path, tmp_path / "last", xs)
    without = _run_host(path, tmp_path / "first", xs, layout=False)
    for a, b in zip(with_pass, without):
        for u, v in zip(a, b):
            np.testing.assert_array_equal(u, v)
    _assert_matches_ort(path, with_pass, xs)
    if fmt == "qoperator" or activations == "uint8":
        sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        for x, got in zip(xs, with_pass):
            for g, w in zip(got, sess.run(None, {"input": x})):
                np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("fmt", ["qdq", "qoperator"])
def test_int8_kernels_pass_channels_last_values(quantized, fmt):
    """Every depthwise conv runs channels last; every conv after the first reads channels last; the values go back
    to NCHW once each, for the readers that are not int8 kernels: the residual sum (graph output and global pool)
    and the last pointwise conv's input has none."""
    graph, params = from_onnx(onnx.load(quantized(fmt, "uint8")))
    opt, p = optimize(graph, params, opt_level=1)
    opt.validate(p)
    ops = opt.ops_used()
    assert ops.get("qdepthwise2d_nhwc") == 3 and "qdepthwise2d" not in ops, ops
    convs = [n for n in opt.nodes if n.op == "qconv2d"]
    assert len(convs) == 6
    assert not convs[0].attrs.get("channels_last_in") and all(n.attrs.get("channels_last_in") for n in convs[1:])
    assert all(n.attrs.get("channels_last_out") for n in convs[:-1])
    # the last pointwise conv (pw5) writes channels last for the add; the add's sum goes back once
    transposes = [n for n in opt.nodes if n.op == "transpose"]
    assert len(transposes) == 1 and opt.types[transposes[0].outputs[0]].shape == (1, 20, SIZE // 2, SIZE // 2)
    assert "qadd" in ops and ops.get("max_pool_nhwc") == 1 and "max_pool" not in ops, ops


def test_without_int8_readers_nothing_changes():
    """A single int8 conv (its output is the graph's) keeps its layout: the pass leaves the graph as it is."""
    rng = np.random.default_rng(3)
    inits = {"sx": np.array(0.02, np.float32), "zx": np.array(9, np.uint8),
             "w": rng.integers(-127, 128, (8, 4, 3, 3)).astype(np.int8), "sw": np.array(0.003, np.float32),
             "zw": np.array(0, np.int8), "sy": np.array(0.05, np.float32), "zy": np.array(100, np.uint8)}
    node = helper.make_node("QLinearConv", ["x", "sx", "zx", "w", "sw", "zw", "sy", "zy"], ["y"], pads=[1] * 4)
    x = rng.integers(0, 256, (1, 4, 6, 6)).astype(np.uint8)
    model = make_graph_model([node], {"x": x}, ["y"], inits, opset=13)
    graph, params = from_onnx(model)
    before, p = optimize(graph, params, opt_level=0)
    before, p = int8_dot_convs(before, p)
    after, _ = int8_channels_last(before, p)
    assert [n.op for n in after.nodes] == [n.op for n in before.nodes]
    assert not any(n.attrs.get("channels_last_out") for n in after.nodes)


@pytest.fixture(params=("rasp5", "rasp4b", "armv7-a7"))
def arm_device(request, emulated_devices):
    return emulated_devices.for_preset(request.param)


@pytest.mark.emulated
def test_channels_last_on_emulated_arm(arm_device, quantized, tmp_path):
    """The channels-last kernels built for rasp5 (sdot, the activations flipped to int8), rasp4b (the widened form:
    convs by smlal by element, depthwise convs on int16 planes) and armv7 give the host build's outputs bit for
    bit, on the emulated devices."""
    # rasp4b also with int8 activations: its widened kernels flip them to uint8 (convs) and widen them signed
    # (depthwise)
    for activations in ("uint8", "int8") if arm_device.preset == "rasp4b" else ("uint8",):
        path = quantized("qoperator", activations)
        xs = _inputs(2)
        want = _run_host(path, tmp_path / ("host" + activations), xs)
        graph, params = from_onnx(onnx.load(path))
        factory = tether.build_graph(graph, params, target=arm_device.preset)
        assert "qdepthwise2d_nhwc" in {b.op for n in factory.graph.nodes for b in n.body()}
        asm = factory.lib.get_source("asm")
        if arm_device.preset == "rasp5":
            assert "sdot" in asm
        if arm_device.preset == "rasp4b":
            assert ".h[3]" in asm and "saddlp" not in asm
            dw_weights = [factory.params[b.inputs[1]] for n in factory.graph.nodes for b in n.body()
                          if b.op == "qdepthwise2d_nhwc"]
            assert dw_weights and all(w.dtype == np.int16 for w in dw_weights)
        factory.export(str(tmp_path / ("arm" + activations)))
        for got, w in zip(run_on_device(arm_device, tmp_path / ("arm" + activations), xs, 2), want):
            for k in range(2):
                np.testing.assert_array_equal(got[k], w[k], err_msg=activations)


@pytest.mark.parametrize("dtype", ["int8", "uint8"])
def test_planar_max_pool_pads_with_the_lowest_value(onnx_compare, dtype):
    """The NCHW max pool of 8-bit values (what the pass leaves: its input is the graph's) pads with the dtype's
    lowest value; it once padded int8 with float32's lowest, which converted to 0, above every negative value."""
    lo, hi = (-128, 128) if dtype == "int8" else (0, 256)
    x = np.random.default_rng(4).integers(lo, hi, (1, 5, 7, 9)).astype(dtype)
    node = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2])
    onnx_compare(make_graph_model([node], {"x": x}, ["y"], opset=13), {"x": x}, rtol=0, atol=0)


def _clipped_chain(seed: int = 4):
    """QOperator uint8: pointwise 8->16, Clip, depthwise 3x3 over 16, Clip, pointwise 16->8 (the clips are a fused
    ReLU6 whose bounds the output's range does not make a no-op, as in converted MobileNets)."""
    rng = np.random.default_rng(seed)
    inits = {"sx": np.array(0.02, np.float32), "zx": np.array(100, np.uint8),
             "sa": np.array(0.05, np.float32), "za": np.array(90, np.uint8),
             "sb": np.array(0.04, np.float32), "zb": np.array(120, np.uint8),
             "sy": np.array(0.06, np.float32), "zy": np.array(128, np.uint8),
             "lo_a": np.array(90, np.uint8), "hi_a": np.array(210, np.uint8),
             "lo_b": np.array(120, np.uint8), "hi_b": np.array(240, np.uint8)}
    nodes = []
    for name, cin, cout, k, group, x, sx, zx, sy, zy in (("pw1", 8, 16, 1, 1, "input", "sx", "zx", "sa", "za"),
                                                         ("dw", 16, 16, 3, 16, "a", "sa", "za", "sb", "zb"),
                                                         ("pw2", 16, 8, 1, 1, "b", "sb", "zb", "sy", "zy")):
        inits[name + "_w"] = rng.integers(-127, 128, (cout, cin // group, k, k)).astype(np.int8)
        inits[name + "_sw"] = rng.uniform(0.002, 0.004, cout).astype(np.float32)
        inits[name + "_zw"] = np.zeros(cout, np.int8)
        out = {"pw1": "a_raw", "dw": "b_raw", "pw2": "y"}[name]
        nodes.append(helper.make_node("QLinearConv", [x, sx, zx, name + "_w", name + "_sw", name + "_zw", sy, zy],
                                      [out], pads=[k // 2] * 4, group=group))
        if name != "pw2":
            clipped = out[0]
            nodes.append(helper.make_node("Clip", [out, "lo_" + clipped, "hi_" + clipped], [clipped]))
    x = rng.integers(0, 256, (1, 8, 10, 10)).astype(np.uint8)
    return make_graph_model(nodes, {"input": x}, ["y"], inits, opset=13), x


def test_clips_between_int8_kernels_stay_channels_last(tmp_path):
    """A clip an int8 conv's output goes through stays with the conv: the depthwise conv runs channels last, the
    convs write and read channels last, nothing goes back to NCHW in between; bit for bit onnxruntime's output
    and the build without the pass."""
    model, x = _clipped_chain()
    graph, params = from_onnx(model)
    opt, p = optimize(graph, params, opt_level=1)
    opt.validate(p)
    ops = opt.ops_used()
    assert ops.get("qdepthwise2d_nhwc") == 1 and "qdepthwise2d" not in ops and ops.get("clip") == 2, ops
    convs = [n for n in opt.nodes if n.op == "qconv2d"]
    assert convs[0].attrs.get("channels_last_out") and convs[1].attrs.get("channels_last_in"), convs
    assert "transpose" not in ops, ops
    path = str(tmp_path / "clipped.onnx")
    onnx.save(model, path)
    want = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]
    assert (want != want.flat[0]).any()
    for layout in (True, False):
        (got,), = run_host(path, tmp_path / str(layout), [x], 1, without=None if layout else int8_channels_last)
        np.testing.assert_array_equal(got, want)
