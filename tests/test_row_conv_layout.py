"""1-D convolutions channels last (graph/passes/float_layout.py, ``_row_conv``): an audio encoder's feature extractor
(a 1 -> 32 conv with too short a reduction to move, Erf GELUs written as torch exports them, strided 1-D convs with
and without bias, one padded, a relu) checked against onnxruntime and against tether's own build without the pass;
which convs read and write channels last, and that nothing is transposed between them; the reshape pairs an
exported Conv1d leaves between two convs collapsed (passes/identity_reshape.py); the same model on the emulated
aarch64 device."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from fixtures.pass_builds import assert_outputs_close, assert_pass_keeps_results, run_host, run_on_device
from onnx import TensorProto, helper, numpy_helper

import tether
from tether.frontend import from_onnx
from tether.graph.passes import drop_identity_reshapes, float_channels_last, optimize

SAMPLES = 805
OUTPUTS = ("frames", "features")


def _gelu(nodes, inits, x: str, name: str) -> str:
    """x * 0.5 * (1 + erf(x / sqrt 2)), node for node as torch.onnx writes nn.GELU."""
    inits[name + "_s2"] = np.array(np.sqrt(2.0), np.float32)
    inits[name + "_one"] = np.array(1.0, np.float32)
    inits[name + "_half"] = np.array(0.5, np.float32)
    nodes += [helper.make_node("Div", [x, name + "_s2"], [name + "_d"]),
              helper.make_node("Erf", [name + "_d"], [name + "_e"]),
              helper.make_node("Add", [name + "_e", name + "_one"], [name + "_a"]),
              helper.make_node("Mul", [x, name + "_a"], [name + "_m"]),
              helper.make_node("Mul", [name + "_m", name + "_half"], [name])]
    return name


def _encoder(seed: int = 0) -> onnx.ModelProto:
    """input (1, 805) audio -> unsqueeze -> Conv1d 1->32 k10 s5 + GELU (160 frames) -> Conv1d 32->48 k3 s2, no bias,
    + GELU (79) -> Conv1d 48->48 k2 s2 + bias + relu (39) -> Conv1d 48->40 k5 pads 2 + bias ("features", 39)
    -> transpose to (1, 39, 40) ("frames")."""
    rng = np.random.default_rng(seed)
    nodes, inits = [], {}
    inits["axis"] = np.array([1], np.int64)
    nodes.append(helper.make_node("Unsqueeze", ["input", "axis"], ["wave"]))

    def conv(x, cin, cout, k, stride, pads=(0, 0), bias=True, name=""):
        inits[name + "_w"] = rng.normal(0, 1.0 / np.sqrt(cin * k), (cout, cin, k)).astype(np.float32)
        ins = [x, name + "_w"]
        if bias:
            inits[name + "_b"] = rng.normal(0, 0.1, cout).astype(np.float32)
            ins.append(name + "_b")
        nodes.append(helper.make_node("Conv", ins, [name], kernel_shape=[k], strides=[stride], pads=list(pads)))
        return name

    t = _gelu(nodes, inits, conv("wave", 1, 32, 10, 5, name="c0"), "g0")
    t = _gelu(nodes, inits, conv(t, 32, 48, 3, 2, bias=False, name="c1"), "g1")
    t = conv(t, 48, 48, 2, 2, name="c2")
    nodes.append(helper.make_node("Relu", [t], ["r2"]))
    conv("r2", 48, 40, 5, 1, pads=(2, 2), name="features")
    nodes.append(helper.make_node("Transpose", ["features"], ["frames"], perm=[0, 2, 1]))
    graph = helper.make_graph(nodes, "encoder", [helper.make_tensor_value_info("input", TensorProto.FLOAT,
                                                                               [1, SAMPLES])],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in OUTPUTS],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


@pytest.fixture(scope="module")
def model_path(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("row_conv") / "encoder.onnx"
    onnx.save(_encoder(), str(path))
    return str(path)


def _inputs(n: int = 2):
    rng = np.random.default_rng(3)
    return [rng.normal(0, 0.5, (1, SAMPLES)).astype(np.float32) for _ in range(n)]


def _assert_close(got, want) -> None:
    assert_outputs_close(OUTPUTS, got, want)


def test_row_convs_match_onnxruntime_and_the_nchw_build(model_path, tmp_path):
    assert_pass_keeps_results(model_path, tmp_path, _inputs(), OUTPUTS, float_channels_last)


def test_row_convs_read_and_write_channels_last(model_path):
    """c1, c2 and the padded conv read (1, 1, W, C) and write (W', O); the 1 -> 32 conv (10 products per output)
    stays NCHW, so its GELU'd output is transposed in once; the GELU and relu between the row convs run on the
    channels-last values, and only the graph output "features" goes back to NCHW."""
    graph, params = from_onnx(onnx.load(model_path))
    opt, p = optimize(graph, params, opt_level=3)
    opt.validate(p)
    bodies = [b for n in opt.nodes for b in n.body()]
    convs = [b for b in bodies if b.op == "conv2d"]
    assert len(convs) == 4
    assert not convs[0].attrs.get("channels_last_in") and not convs[0].attrs.get("channels_last_out")
    for conv, (w, c) in zip(convs[1:], [(160, 32), (79, 48), (39, 48)]):
        assert conv.attrs.get("channels_last_in") and conv.attrs.get("channels_last_out"), conv.attrs
        assert tuple(opt.types[conv.inputs[0]].shape) == (1, 1, w, c), (conv.name, opt.types[conv.inputs[0]])
    assert tuple(opt.types[convs[-1].outputs[0]].shape) == (39, 40)
    transposes = [b for b in bodies if b.op == "transpose"]
    assert [list(t.attrs["axes"]) for t in transposes] == [[0, 2, 3, 1], [0, 3, 1, 2], [0, 2, 1]], \
        [(t.inputs, t.outputs, t.attrs) for t in transposes]
    assert transposes[1].outputs[0] != "frames"
    erf_inputs = [b.inputs[0] for b in bodies if b.op == "div"]
    assert len(opt.types[erf_inputs[1]].shape) == 2     # the GELU after c1 runs on its (79, 48) pixels


def _conv1d_pair(graph_output_between: bool):
    """x (1, 64, 1, 20) -> reshape (1, 64, 20) -> reshape (1, 64, 1, 20) -> conv 64 -> 16, k3: what a Conv1d
    exported between two others leaves after lift_over_unit_reshapes."""
    rng = np.random.default_rng(5)
    inits = {"s3": np.array([1, 64, 20], np.int64), "s4": np.array([1, 64, 1, 20], np.int64),
             "w": rng.normal(0, 0.1, (16, 64, 1, 3)).astype(np.float32)}
    nodes = [helper.make_node("Reshape", ["x", "s3"], ["flat"]), helper.make_node("Reshape", ["flat", "s4"], ["img"]),
             helper.make_node("Conv", ["img", "w"], ["y"], kernel_shape=[1, 3])]
    outs = ["y", "flat"] if graph_output_between else ["y"]
    graph = helper.make_graph(nodes, "pair", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64, 1, 20])],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outs],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return from_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]))


def test_a_reshape_of_a_reshape_reads_the_first_ones_input():
    g, p = _conv1d_pair(False)
    before, p = optimize(g, p, opt_level=0)
    assert [n.op for n in before.nodes] == ["reshape", "reshape", "conv2d"]
    after, _ = drop_identity_reshapes(before, p)
    assert [n.op for n in after.nodes] == ["conv2d"] and after.nodes[0].inputs[0] == "x"
    # a graph output between the two keeps its reshape; the second still goes
    g, p = _conv1d_pair(True)
    before, p = optimize(g, p, opt_level=0)
    after, _ = drop_identity_reshapes(before, p)
    assert [n.op for n in after.nodes] == ["reshape", "conv2d"] and after.nodes[1].inputs[0] == "x"
    assert after.nodes[0].outputs == ["flat"]


def test_a_grouped_positional_conv_runs_as_a_gemm_on_8_wide_panels(onnx_compare):
    """wav2vec2's positional conv in small: 8 groups of 24 channels, 33 taps padded 16 each side, over 30 frames.
    24 channels fill no 16-wide panel; it runs as conv2d_pixels on 8-wide ones, packed at build time."""
    from tether.graph import conv_gemm
    from tether.target import Target

    rng = np.random.default_rng(9)
    w = rng.normal(0, 0.05, (192, 24, 33)).astype(np.float32)
    b = rng.normal(0, 0.1, 192).astype(np.float32)
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], kernel_shape=[33], pads=[16, 16], group=8)
    graph = helper.make_graph([node], "pos", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 192, 30])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    g, p = from_onnx(model)
    g, p = optimize(g, p, opt_level=3)
    packed = conv_gemm.pack_conv_weights(g, dict(p), Target("host"))
    assert list(packed.values()) == [(192, 24, 1, 33)]
    x = rng.normal(size=(1, 192, 30)).astype(np.float32)
    onnx_compare(model, {"x": x}, rtol=1e-4)


def test_a_channels_last_conv_outside_the_gemm_reads_its_input_through_a_transpose(run_ops):
    """``conv2d {channels_last_in}`` without ``channels_last_out`` does not run as a GEMM (graph/conv_gemm.py): its
    lowering (kernels/core_te.py) reads the (1, H, W, C) input as NCHW for the direct kernel."""
    from tether import te
    from tether.graph.to_te import lower_node
    from tether.kernels.core import DEFINITIONS

    rng = np.random.default_rng(11)
    x = rng.standard_normal((1, 1, 20, 8)).astype(np.float32)
    w = rng.standard_normal((6, 8, 1, 3)).astype(np.float32)
    attrs = {"strides": [1, 2], "pads": [0, 1, 0, 1], "dilations": [1, 1], "groups": 1, "channels_last_in": 1}
    X, W = te.placeholder(x.shape, "float32", name="X"), te.placeholder(w.shape, "float32", name="W")
    (out,) = run_ops([(X, x), (W, w)], [lower_node("conv2d", attrs, [X, W])])
    (ref,) = DEFINITIONS["conv2d"].ref(attrs, x, w)
    assert out.shape == (1, 6, 1, 10)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.emulated
def test_row_convs_on_emulated_aarch64(emulated_devices, model_path, tmp_path):
    """The channels-last row convs built for the rasp4b (NEON, 4 lanes) match the host build on the emulated
    device."""
    device = emulated_devices.for_preset("rasp4b")
    xs = _inputs(1)
    want = run_host(model_path, tmp_path / "host", xs, len(OUTPUTS))
    graph, params = from_onnx(onnx.load(model_path))
    factory = tether.build_graph(graph, params, target=device.preset)
    assert any(b.attrs.get("channels_last_in") for n in factory.graph.nodes for b in n.body())
    factory.export(str(tmp_path / "arm"))
    for got, w in zip(run_on_device(device, tmp_path / "arm", xs, len(OUTPUTS)), want):
        _assert_close(got, w)


@pytest.mark.emulated
def test_row_convs_in_half_on_the_emulated_a76(emulated_devices, model_path, tmp_path):
    """--precision fp16 on the rasp5-fp16 (half arithmetic): the row convs read and write float16 channels last;
    the encoder's outputs on the emulated A76 stay within half precision's error of the host's float32 build."""
    device = emulated_devices.for_preset("rasp5-fp16")
    xs = _inputs(1)
    want = run_host(model_path, tmp_path / "host", xs, len(OUTPUTS))
    graph, params = from_onnx(onnx.load(model_path))
    factory = tether.build_graph(graph, params, target="rasp5-fp16", precision="fp16")
    rows = [b for n in factory.graph.nodes for b in n.body() if b.attrs.get("channels_last_in")]
    assert len(rows) == 3 and all(str(factory.graph.types[b.inputs[0]].dtype) == "float16" for b in rows)
    factory.export(str(tmp_path / "a76"))
    for got, w in zip(run_on_device(device, tmp_path / "a76", xs, len(OUTPUTS)), want):
        assert_outputs_close(OUTPUTS, got, w, limit=1e-2)
