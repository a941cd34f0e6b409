"""float activations channels last through depthwise-separable blocks (graph/passes/float_layout.py): a network of
the MobileNet/BlazeFace kind (a 3x3 stem, depthwise convs at strides 1 and 2 with asymmetric padding, pointwise
convs into 8, 24, 40 and 56 channels, a channel padding, a 2x2 max pool, residual adds, a squeeze-excite scale, a
global pool and a classifier) with channel counts that fill no 16-lane vector, checked against onnxruntime and
against tether's own build without the pass; which kernels run channels last and where values go back to NCHW; a
region with a depthwise conv over 28 channels left NCHW; and the same network on the emulated aarch64 device."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from fixtures.pass_builds import assert_outputs_close, assert_pass_keeps_results, run_host, run_on_device
from onnx import TensorProto, helper, numpy_helper

import tether
from tether import graph_executor
from tether.frontend import from_onnx
from tether.graph.passes import float_channels_last, optimize

SIZE = 20
OUTPUTS = ("logits", "block", "pooled")


def _net(seed: int = 0) -> onnx.ModelProto:
    """x (1, 3, 20, 20) -> 3x3 conv 3->16 s1 + relu -> depthwise s1 -> pointwise 16->8 (a: 8 channels)
    -> pointwise 8->24 + relu6 -> depthwise s2 (pads 0, 0, 1, 1) -> pointwise 24->24 (b, 10x10)
    -> squeeze-excite (global pool, 1x1 24->6 relu, 1x1 6->24 sigmoid) scaling b -> + b -> relu ("block")
    -> max pool 2x2 and a channel pad 24->40 of it -> + pointwise 40 of the depthwise of the pool -> relu
    -> pointwise 40->56 -> depthwise 5x5 s1 -> global pool ("pooled") -> flatten -> gemm 56->10 ("logits").
    Depthwise convs over 24 and 56 channels run on 8-lane vectors where AVX-512 has 16."""
    rng = np.random.default_rng(seed)
    nodes, inits = [], {}

    def conv(x, cin, cout, k, stride=1, group=1, act=None, pads=None, name=""):
        w = rng.normal(0, 1.0 / np.sqrt(cin // group * k * k), (cout, cin // group, k, k)).astype(np.float32)
        inits[name + "_w"] = w
        inits[name + "_b"] = rng.normal(0, 0.1, cout).astype(np.float32)
        out = name + "_y"
        nodes.append(helper.make_node("Conv", [x, name + "_w", name + "_b"], [out], kernel_shape=[k, k],
                                      pads=pads or [k // 2] * 4, strides=[stride, stride], group=group))
        if act == "relu":
            nodes.append(helper.make_node("Relu", [out], [name + "_r"]))
            out = name + "_r"
        elif act == "relu6":
            nodes.append(helper.make_node("Clip", [out, "zero", "six"], [name + "_r"]))
            out = name + "_r"
        elif act == "sigmoid":
            nodes.append(helper.make_node("Sigmoid", [out], [name + "_r"]))
            out = name + "_r"
        return out

    inits["zero"], inits["six"] = np.array(0, np.float32), np.array(6, np.float32)
    t = conv("input", 3, 16, 3, act="relu", name="stem")
    t = conv(t, 16, 16, 3, group=16, act="relu", name="dw1")
    t = conv(t, 16, 8, 1, name="pw1")
    t = conv(t, 8, 24, 1, act="relu6", name="pw2")
    t = conv(t, 24, 24, 3, stride=2, group=24, act="relu6", pads=[0, 0, 1, 1], name="dw2")
    b = conv(t, 24, 24, 1, name="pw3")
    nodes.append(helper.make_node("GlobalAveragePool", [b], ["se_pool"]))
    s = conv("se_pool", 24, 6, 1, act="relu", name="se1")
    s = conv(s, 6, 24, 1, act="sigmoid", name="se2")
    nodes.append(helper.make_node("Mul", [b, s], ["se_scaled"]))
    nodes.append(helper.make_node("Add", ["se_scaled", b], ["block_sum"]))
    nodes.append(helper.make_node("Relu", ["block_sum"], ["block"]))
    nodes.append(helper.make_node("MaxPool", ["block"], ["mp"], kernel_shape=[2, 2], strides=[2, 2]))
    inits["chan_pads"] = np.array([0, 0, 0, 0, 0, 16, 0, 0], np.int64)
    nodes.append(helper.make_node("Pad", ["mp", "chan_pads"], ["mp_padded"], mode="constant"))
    t = conv("mp", 24, 24, 3, group=24, name="dw3")
    t = conv(t, 24, 40, 1, name="pw4")
    nodes.append(helper.make_node("Add", ["mp_padded", t], ["res"]))
    nodes.append(helper.make_node("Relu", ["res"], ["res_r"]))
    t = conv("res_r", 40, 56, 1, act="relu", name="pw5")
    t = conv(t, 56, 56, 5, group=56, act="relu", name="dw4")
    nodes.append(helper.make_node("GlobalAveragePool", [t], ["pooled"]))
    nodes.append(helper.make_node("Flatten", ["pooled"], ["flat"]))
    inits["fc_w"] = rng.normal(0, 0.2, (10, 56)).astype(np.float32)
    inits["fc_b"] = rng.normal(0, 0.1, 10).astype(np.float32)
    nodes.append(helper.make_node("Gemm", ["flat", "fc_w", "fc_b"], ["logits"], transB=1))
    graph = helper.make_graph(nodes, "net", [helper.make_tensor_value_info("input", TensorProto.FLOAT,
                                                                           [1, 3, SIZE, SIZE])],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in OUTPUTS],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


@pytest.fixture(scope="module")
def model_path(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("float_layout") / "net.onnx"
    onnx.save(_net(), str(path))
    return str(path)


def _inputs(n: int = 3):
    rng = np.random.default_rng(7)
    return [rng.uniform(-1, 1, (1, 3, SIZE, SIZE)).astype(np.float32) for _ in range(n)]


def _run_host(path: str, folder, xs):
    """tether's outputs on the host for each input."""
    return run_host(path, folder, xs, len(OUTPUTS))


def _assert_close(got, want) -> None:
    assert_outputs_close(OUTPUTS, got, want)


def test_channels_last_matches_onnxruntime_and_the_nchw_build(model_path, tmp_path):
    assert_pass_keeps_results(model_path, tmp_path, _inputs(), OUTPUTS, float_channels_last)


def test_kernels_run_channels_last(model_path):
    """Every depthwise and pointwise conv, the max pool and the channel pad run channels last, the stem writes
    channels last; values go back to NCHW only for the graph output "block" (its other readers take it as it
    is): no transpose in at all."""
    graph, params = from_onnx(onnx.load(model_path))
    opt, p = optimize(graph, params, opt_level=3)
    opt.validate(p)
    bodies = [b for n in opt.nodes for b in n.body()]
    ops = {}
    for b in bodies:
        ops[b.op] = ops.get(b.op, 0) + 1
    assert ops.get("depthwise_conv2d_nhwc") == 4, ops
    assert ops.get("max_pool_nhwc") == 1 and "max_pool" not in ops, ops
    convs = [b for b in bodies if b.op == "conv2d"]
    # the stem reads the NCHW input and writes its pixels channels last, (400, 16); the squeeze-excite's 1x1
    # convs over the pooled (1, 24, 1, 1) vector stay as they are
    assert [c.inputs[0] for c in convs] == ["input", "se_pool", "se1_r"], [c.inputs for c in convs]
    assert convs[0].attrs.get("channels_last_out") and opt.types[convs[0].outputs[0]].shape == (SIZE * SIZE, 16)
    assert not any(c.attrs.get("channels_last_out") for c in convs[1:])
    assert ops.get("dense") == 6, ops         # pw1..pw5 and the classifier
    transposes = [b for b in bodies if b.op == "transpose"]
    assert [t.outputs[0] for t in transposes] == ["block"] and list(transposes[0].attrs["axes"]) == [0, 3, 1, 2]
    pads = [b for b in bodies if b.op == "pad"]
    assert len(pads) == 1 and list(pads[0].attrs["pads"]) == [0, 0, 0, 0, 0, 0, 0, 16]


def test_a_lone_depthwise_conv_keeps_its_layout():
    """A depthwise conv that no pointwise conv reads (its output is the graph's) is left NCHW: channels last
    would cost a transpose in and one out for one kernel."""
    rng = np.random.default_rng(1)
    w = rng.normal(0, 0.3, (6, 1, 3, 3)).astype(np.float32)
    node = helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[3, 3], pads=[1] * 4, group=6)
    graph = helper.make_graph([node], "dw", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 6, 9, 9])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(w, "w")])
    g, p = from_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]))
    before, p = optimize(g, p, opt_level=0)
    after, _ = float_channels_last(before, p)
    assert [n.op for n in after.nodes] == [n.op for n in before.nodes]


def test_a_region_with_a_depthwise_conv_over_odd_channels_stays_nchw():
    """A depthwise conv over 28 channels (no 8-lane vector divides them) keeps its whole region NCHW, the 16-channel
    depthwise conv and the pointwise convs around it included; a separate region of 16 channels goes channels
    last."""
    rng = np.random.default_rng(2)
    nodes, inits = [], {}

    def conv(x, cin, cout, k, group=1, name=""):
        inits[name + "_w"] = rng.normal(0, 0.3, (cout, cin // group, k, k)).astype(np.float32)
        nodes.append(helper.make_node("Conv", [x, name + "_w"], [name], kernel_shape=[k, k], pads=[k // 2] * 4,
                                      group=group))
        return name

    t = conv("x", 16, 16, 3, 16, "dw_a")
    t = conv(t, 16, 28, 1, name="pw_a")
    t = conv(t, 28, 28, 3, 28, "dw_b")
    odd = conv(t, 28, 16, 1, name="pw_b")
    t = conv("x2", 16, 16, 3, 16, "dw_c")
    even = conv(t, 16, 8, 1, name="pw_c")
    graph = helper.make_graph(nodes, "odd", [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 16, 9, 9])
                                             for n in ("x", "x2")],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in (odd, even)],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    g, p = from_onnx(model)
    before, p = optimize(g, p, opt_level=0)
    after, p2 = float_channels_last(before, p)
    ops = [n.op for n in after.nodes]
    assert ops.count("depthwise_conv2d_nhwc") == 1 and ops.count("conv2d") == 4 and ops.count("dense") == 1, ops
    feeds = {"x": rng.normal(size=(1, 16, 9, 9)).astype(np.float32),
             "x2": rng.normal(size=(1, 16, 9, 9)).astype(np.float32)}
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    gm = graph_executor.from_factory(tether.build_graph(g, p, target="host"))
    gm.run(**feeds)
    _assert_close([gm.get_output(0), gm.get_output(1)], want)


def test_half_precision_builds_run_channels_last(model_path):
    """With --precision fp16 (rasp5-fp16: half arithmetic) the float16 convs go channels last as well, in half:
    the depthwise kernels and the dense products read and write float16."""
    graph, params = from_onnx(onnx.load(model_path))
    factory = tether.build_graph(graph, params, target="rasp5-fp16", precision="fp16")
    g = factory.graph
    dws = [b for n in g.nodes for b in n.body() if b.op == "depthwise_conv2d_nhwc"]
    denses = [b for n in g.nodes for b in n.body() if b.op == "dense"]
    assert len(dws) == 4 and len(denses) >= 5
    assert all(str(g.types[b.inputs[0]].dtype) == "float16" for b in dws + denses)
    assert "fmla" in factory.lib.get_source("asm") and ".8h" in factory.lib.get_source("asm")


@pytest.mark.emulated
def test_channels_last_on_emulated_aarch64(emulated_devices, model_path, tmp_path):
    """The channels-last kernels built for the rasp4b (NEON, 4 lanes) match the host build on the emulated
    device."""
    device = emulated_devices.for_preset("rasp4b")
    xs = _inputs(2)
    want = _run_host(model_path, tmp_path / "host", xs)
    graph, params = from_onnx(onnx.load(model_path))
    factory = tether.build_graph(graph, params, target=device.preset)
    assert "depthwise_conv2d_nhwc" in {b.op for n in factory.graph.nodes for b in n.body()}
    factory.export(str(tmp_path / "arm"))
    for got, w in zip(run_on_device(device, tmp_path / "arm", xs, len(OUTPUTS)), want):
        _assert_close(got, w)


def _neck(mode: str, tail: str) -> onnx.ModelProto:
    """An FPN neck on channels-last blocks (PicoDet's): two depthwise-separable blocks at 16x12 and 8x6, the
    coarse one upsampled 2x (Resize ``mode``) and concatenated with the fine one along the channels, then read
    by ``tail``: "dw" (a depthwise + pointwise block: channels last) or "conv" (a 3x3 conv, which reads NCHW).
    Outputs "out" and the concat "cat"'s reader's result only."""
    rng = np.random.default_rng(3)
    nodes, inits = [], {}

    def conv(x, cin, cout, k, stride=1, group=1, name=""):
        inits[name + "_w"] = rng.normal(0, 1 / np.sqrt(cin // group * k * k), (cout, cin // group, k, k)) \
            .astype(np.float32)
        nodes.append(helper.make_node("Conv", [x, name + "_w"], [name], kernel_shape=[k, k], pads=[k // 2] * 4,
                                      strides=[stride, stride], group=group))
        return name

    fine = conv(conv("input", 16, 16, 3, 1, 16, "dw1"), 16, 24, 1, name="pw1")
    coarse = conv(conv(fine, 24, 24, 3, 2, 24, "dw2"), 24, 16, 1, name="pw2")
    inits["scales"] = np.array([1, 1, 2, 2], np.float32)
    attrs = {"mode": mode} if mode == "nearest" else {"mode": mode, "coordinate_transformation_mode": "half_pixel"}
    nodes.append(helper.make_node("Resize", [coarse, "", "scales"], ["up"], **attrs))
    nodes.append(helper.make_node("Concat", ["up", fine], ["cat"], axis=1))
    if tail == "dw":
        conv(conv("cat", 40, 40, 5, 1, 40, "dw3"), 40, 8, 1, name="out")
    else:
        conv("cat", 40, 8, 3, name="out")
    graph = helper.make_graph(nodes, "neck", [helper.make_tensor_value_info("input", TensorProto.FLOAT,
                                                                            [1, 16, 16, 12])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


@pytest.mark.parametrize("mode", ["nearest", "linear"])
@pytest.mark.parametrize("tail", ["dw", "conv"])
def test_an_fpn_neck_upsamples_and_concatenates_channels_last(tmp_path, mode, tail):
    """Where a channels-last block reads the concat, the resize and the concat run channels last: nothing goes
    back to NCHW and out again between the blocks (PicoDet's neck: 14 transposes, 3.5 ms of 65). Where a 3x3
    conv (NCHW) reads it, they stay NCHW and the transposes come before the resize, on the smaller maps. Both
    against onnxruntime and the build without the pass."""
    model = _neck(mode, tail)
    path = str(tmp_path / "neck.onnx")
    onnx.save(model, path)
    g, p = from_onnx(model)
    opt, p2 = optimize(g, p, opt_level=3)
    bodies = [b for n in opt.nodes for b in n.body()]
    resize = next(b for b in bodies if b.op == "resize")
    # (the graph's input goes channels last once; the output comes back)
    moved = sorted(t.inputs[0] for t in bodies if t.op == "transpose" and t.inputs[0] != "input"
                   and t.outputs[0] != "out")
    if tail == "dw":
        assert opt.types[resize.outputs[0]].shape == (1, 16, 12, 16), opt.types[resize.outputs[0]]
        assert [a["axis"] for a in resize.attrs["axes"]] == [1, 2]
        concat = next(b for b in bodies if b.op == "concat")
        assert concat.attrs["axis"] == 3 and opt.types[concat.outputs[0]].shape == (1, 16, 12, 40)
        assert not moved, moved
    else:
        assert opt.types[resize.outputs[0]].shape == (1, 16, 16, 12)          # NCHW, (1, C, 2H, 2W)
        # back to NCHW: the coarse map before its upsampling, and the fine one
        assert sorted(opt.types[v].shape for v in moved) == [(1, 8, 6, 16), (1, 16, 12, 24)], moved
    rng = np.random.default_rng(5)
    xs = [rng.uniform(-1, 1, (1, 16, 16, 12)).astype(np.float32) for _ in range(2)]
    assert_pass_keeps_results(path, tmp_path, xs, ("out",), float_channels_last)
