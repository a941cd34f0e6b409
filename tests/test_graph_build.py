"""build_graph end to end on the host: export, load with the graph executor (the device runtime's), and compare
with onnxruntime; the executor's API (inputs by name/index, errors, benchmark, profile); kernel sharing."""
import json
import tempfile

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import tether
from tether import graph_executor
from tether.frontend import from_onnx

RNG = np.random.default_rng(0)


def _model():
    """Two identical conv blocks (one kernel), a residual add, pooling, a dense head and softmax."""
    inits = []

    def w(name, *shape):
        inits.append(numpy_helper.from_array((RNG.standard_normal(shape) * 0.3).astype(np.float32), name))
        return name
    nodes = [
        helper.make_node("Conv", ["x", w("w0", 8, 3, 3, 3), w("b0", 8)], ["c0"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c0"], ["r0"]),
        helper.make_node("Conv", ["r0", w("w1", 8, 8, 3, 3), w("b1", 8)], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", w("w2", 8, 8, 3, 3), w("b2", 8)], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("Add", ["r2", "r0"], ["s"]),
        helper.make_node("Conv", ["s", w("w3", 8, 8, 3, 3), w("b3", 8)], ["c3"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c3"], ["r3"]),
        helper.make_node("AveragePool", ["r3"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("Gemm", ["f", w("fc", 10, 8 * 8 * 8), w("fcb", 10)], ["logits"], transB=1),
        helper.make_node("Softmax", ["logits"], ["probs"], axis=1),
    ]
    g = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 16, 16])],
                          [helper.make_tensor_value_info("probs", TensorProto.FLOAT, [2, 10]),
                           helper.make_tensor_value_info("logits", TensorProto.FLOAT, [2, 10])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    model = _model()
    graph, params = from_onnx(model)
    factory = tether.build_graph(graph, params, target="host", opt_level=3)
    out = tmp_path_factory.mktemp("deploy")
    factory.export(str(out))
    return model, factory, out


def test_export_writes_three_files_and_shares_kernels(built):
    _, factory, out = built
    assert sorted(p.name for p in out.iterdir()) == ["deploy.json", "deploy.params", "deploy.so"]
    doc = json.loads((out / "deploy.json").read_text())
    funcs = [n["func"] for n in doc["nodes"]]
    # conv1 and conv3 have the same signature: one kernel, two nodes
    assert len(set(funcs)) < len(funcs)
    assert factory.kernel_count == len(set(funcs))
    assert any(n["ops"] == "conv2d+add+relu" for n in doc["nodes"])


def test_outputs_match_onnxruntime_by_name_and_index(built):
    model, _, out = built
    x = RNG.standard_normal((2, 3, 16, 16)).astype(np.float32)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    gm = graph_executor.load(str(out))
    gm.set_input("x", x)
    gm.run()
    np.testing.assert_allclose(gm.get_output(0), ref[0], rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(gm.get_output("logits"), ref[1], rtol=1e-4, atol=1e-5)
    gm.set_input(0, np.zeros_like(x))
    gm.run()
    assert not np.allclose(gm.get_output(1), ref[1])
    gm.run(x=x)
    np.testing.assert_allclose(gm.get_output(1), ref[1], rtol=1e-4, atol=1e-5)


def test_from_factory_runs_the_build_and_leaves_no_folder(built, tmp_path, monkeypatch):
    model, factory, _ = built
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))   # where TemporaryDirectory puts its folder
    gm = graph_executor.from_factory(factory)
    assert list(tmp_path.iterdir()) == []
    x = RNG.standard_normal((2, 3, 16, 16)).astype(np.float32)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    gm.run(x=x)
    np.testing.assert_allclose(gm.get_output("logits"), ref[1], rtol=1e-4, atol=1e-5)


def test_bad_inputs_give_clear_errors(built):
    gm = graph_executor.load(str(built[2]))
    with pytest.raises(KeyError, match="no input 'nope'.*inputs: x"):
        gm.set_input("nope", np.zeros((2, 3, 16, 16), np.float32))
    with pytest.raises(ValueError, match="expects float32 \\(2, 3, 16, 16\\)"):
        gm.set_input("x", np.zeros((2, 3, 16, 15), np.float32))
    with pytest.raises(IndexError, match="2 output"):
        gm.get_output(5)


def test_benchmark_and_profile_report_real_timings(built):
    gm = graph_executor.load(str(built[2]))
    gm.set_input("x", RNG.standard_normal((2, 3, 16, 16)).astype(np.float32))
    seen = []
    res = gm.benchmark(number=3, repeat=4, on_sample=lambda i, s, n: seen.append((i, s)))
    assert len(res["samples"]) == 4 and [i for i, _ in seen] == [0, 1, 2, 3]
    assert all(s > 0 for s in res["samples"]) and res["median_ms"] > 0
    streamed = []
    prof = gm.profile(number=2, on_node=streamed.append)
    doc = json.loads((built[2] / "deploy.json").read_text())
    assert [r["name"] for r in prof["nodes"]] == [n["name"] for n in doc["nodes"]] == [r["name"] for r in streamed]
    assert all(r["seconds"] > 0 for r in prof["nodes"])


def test_model_without_kernels_still_builds(tmp_path):
    """An Identity / Constant-only model: outputs are the input's storage or a param."""
    nodes = [helper.make_node("Identity", ["x"], ["y"]),
             helper.make_node("Constant", [], ["k"], value=numpy_helper.from_array(np.arange(3, dtype=np.float32)))]
    g = helper.make_graph(nodes, "noop", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4]),
                           helper.make_tensor_value_info("k", TensorProto.FLOAT, [3])])
    graph, params = from_onnx(helper.make_model(g, ir_version=8))
    tether.build_graph(graph, params).export(str(tmp_path))
    gm = graph_executor.load(str(tmp_path))
    gm.run(x=np.array([1, 2, 3, 4], np.float32))
    np.testing.assert_array_equal(gm.get_output(0), [1, 2, 3, 4])
    np.testing.assert_array_equal(gm.get_output(1), [0, 1, 2])


@pytest.mark.parametrize("opt_level", [2, 3])
def test_convs_as_gemm_match_onnxruntime(tmp_path, opt_level):
    """Random weights through the GEMM forms (opt_level 3) and the direct kernels (2): a grouped pointwise conv
    with a residual epilogue, a strided 3x3 conv with asymmetric padding, a plain pointwise conv."""
    rng = np.random.default_rng(3)
    inits = []

    def w(name, *shape):
        inits.append(numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name))
        return name
    nodes = [
        helper.make_node("Conv", ["x", w("wg", 16, 4, 1, 1), w("bg", 16)], ["g"], group=4),
        helper.make_node("Add", ["g", "r"], ["gs"]),
        helper.make_node("Relu", ["gs"], ["gr"]),
        helper.make_node("Conv", ["gr", w("w3", 12, 16, 3, 3), w("b3", 12)], ["c3"], strides=[2, 2],
                         pads=[1, 0, 2, 1]),
        helper.make_node("Clip", ["c3", "lo", "hi"], ["c3r"]),
        helper.make_node("Conv", ["c3r", w("w1", 20, 12, 1, 1)], ["y"]),
    ]
    inits += [numpy_helper.from_array(np.array(0.0, np.float32), "lo"),
              numpy_helper.from_array(np.array(6.0, np.float32), "hi")]
    g = helper.make_graph(nodes, "convs", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 13, 11]),
                                           helper.make_tensor_value_info("r", TensorProto.FLOAT, [1, 16, 13, 11])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    graph, params = from_onnx(model)
    tether.build_graph(graph, params, opt_level=opt_level).export(str(tmp_path))
    doc = json.loads((tmp_path / "deploy.json").read_text())
    assert sum("shapes" in n for n in doc["nodes"]) == (3 if opt_level == 3 else 0)
    # the 3x3 conv's constant weights ship packed into 16-wide panels at opt_level 3 (12 channels -> 1 panel)
    w3 = next(e for e in doc["entries"] if e["name"] == "w3")
    assert w3["shape"] == ([1, 16 * 3 * 3, 16] if opt_level == 3 else [12, 16, 3, 3])
    x, r = rng.standard_normal((2, 1, 16, 13, 11)).astype(np.float32)
    gm = graph_executor.load(str(tmp_path))
    gm.run(x=x, r=r)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x, "r": r})[0]
    np.testing.assert_allclose(gm.get_output(0), ref, rtol=1e-4, atol=1e-4)


def test_pre_activation_batchnorm_relu_joins_the_next_conv(tmp_path):
    """densenet's BN -> ReLU -> conv: at opt_level 3 the elementwise chain becomes the conv kernel's prologue (one
    kernel instead of two), for a 3x3 conv (conv2d_pixels) and a wide 1x1 conv (matmul); outputs still match
    onnxruntime. A chain whose result is also read by another node stays its own kernel."""
    rng = np.random.default_rng(5)
    inits = []

    def w(name, *shape, positive=False):
        a = rng.standard_normal(shape).astype(np.float32)
        inits.append(numpy_helper.from_array(np.abs(a) + 0.5 if positive else a, name))
        return name

    def bn(x, c, tag):
        return helper.make_node("BatchNormalization", [x, w("s" + tag, c), w("b" + tag, c), w("m" + tag, c),
                                                       w("v" + tag, c, positive=True)], ["bn" + tag])
    nodes = [
        bn("x", 24, "x"), helper.make_node("Relu", ["bnx"], ["rx"]),
        helper.make_node("Conv", ["rx", w("w3", 16, 24, 3, 3), w("c3", 16)], ["y3"], pads=[1, 1, 1, 1]),
        bn("z", 32, "z"), helper.make_node("Relu", ["bnz"], ["rz"]),
        helper.make_node("Conv", ["rz", w("w1", 96, 32, 1, 1)], ["y1"]),
        bn("u", 8, "u"), helper.make_node("Relu", ["bnu"], ["ru"]),
        helper.make_node("Conv", ["ru", w("wu", 16, 8, 1, 1)], ["yu"]),
        helper.make_node("Add", ["ru", "ru"], ["yv"]),
    ]
    shape = {"x": [1, 24, 9, 11], "z": [1, 32, 9, 11], "u": [1, 8, 9, 11]}
    g = helper.make_graph(nodes, "preact", [helper.make_tensor_value_info(k, TensorProto.FLOAT, v)
                                            for k, v in shape.items()],
                          [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in ("y3", "y1", "yu", "yv")],
                          inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    graph, params = from_onnx(model)
    tether.build_graph(graph, params, opt_level=3).export(str(tmp_path))
    doc = json.loads((tmp_path / "deploy.json").read_text())
    labels = sorted(n["ops"] for n in doc["nodes"])
    assert labels == sorted(["mul+add+relu+conv2d+add", "mul+add+relu+conv2d", "mul+add+relu", "conv2d", "add"]), \
        labels
    feeds = {k: rng.standard_normal(v).astype(np.float32) for k, v in shape.items()}
    gm = graph_executor.load(str(tmp_path))
    gm.run(**feeds)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    for k in range(4):
        np.testing.assert_allclose(gm.get_output(k), ref[k], rtol=1e-4, atol=1e-4)
