"""The graph executor through RPC: a LocalSession, a real forked device server on loopback, and emulated
aarch64 / armv7 devices (qemu-user) running ONNX conformance cases and light models compiled for them."""
import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

import tether
from tether import rpc
from tether.frontend import from_onnx
from tether.rpc.graph_client import RemoteGraphExecutor

from fixtures import remote_cases

HERE = os.path.dirname(os.path.abspath(__file__))
DIGITS = os.path.join(HERE, "data", "digits_cnn.onnx")


def _wired(session) -> bool:
    return "tether.graph.create" in session.functions()


def _digits_build(target, folder, batch=16):
    model = onnx.load(DIGITS)
    graph, params = from_onnx(model, shape={"input": (batch, 1, 8, 8)})
    tether.build_graph(graph, params, target=target).export(folder)
    x = np.random.default_rng(0).uniform(0, 1, (batch, 1, 8, 8)).astype(np.float32)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"input": x})
    return x, ref[0]


@pytest.fixture(scope="module")
def digits_host(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("digits-host"))
    x, ref = _digits_build("host", folder)
    return folder, x, ref


def _exercise(session, folder, x, ref):
    samples, nodes = [], []
    with session.graph_executor(folder) as gm:      # the documented surface: remote.graph_executor("out/")
        assert gm.input_names == ["input"] and gm.output_names == ["probs"]
        gm.set_input("input", x)
        gm.run()
        np.testing.assert_allclose(gm.get_output(0), ref, rtol=1e-4, atol=1e-6)
        gm.set_input(0, np.zeros_like(x))
        gm.run()
        assert not np.allclose(gm.get_output(0), ref)
        res = gm.benchmark(number=2, repeat=3, on_sample=samples.append)
        assert len(res["samples"]) == 3 and [s["index"] for s in samples] == [0, 1, 2]
        prof = gm.profile(number=1, on_node=nodes.append)
        assert len(prof["nodes"]) == len(nodes) >= 3 and all(r["seconds"] > 0 for r in prof["nodes"])


def test_local_session(digits_host):
    with rpc.LocalSession() as sess:
        assert _wired(sess), "every session registers the tether.graph.* built-ins (session.EXTENSIONS)"
        _exercise(sess, *digits_host)


def test_real_server_on_loopback(rpc_server, digits_host):
    with rpc.connect(rpc_server.host, rpc_server.port, timeout=30) as sess:
        assert _wired(sess), "the device server must offer the tether.graph.* built-ins"
        _exercise(sess, *digits_host)
        with pytest.raises(tether.errors.TetherError, match="no input"):
            gm = RemoteGraphExecutor(sess, None, uploaded=True)
            gm.set_input("nope", digits_host[1])
    assert rpc_server.alive


# ---------------------------------------------------------------- emulated devices
# 34 node cases covering every op family of the 30-op set (the host runs all 165 in test_onnx_backend.py)
REMOTE_NODE_CASES = """add_bcast averagepool_2d_pads_count_include_pad averagepool_2d_ceil averagepool_3d_default
batchnorm_example clip_splitbounds concat_3d_axis_1 basic_conv_with_padding conv_with_strides_and_asymmetric_padding
conv_with_autopad_same div_bcast dropout_default flatten_axis2 gemm_all_attributes gemm_transposeA globalaveragepool
globalmaxpool hardsigmoid hardswish identity leakyrelu matmul_3d matmul_bcast maxpool_2d_dilations maxpool_2d_ceil
maxpool_1d_default mul_bcast relu sigmoid softmax_axis_1 softmax_large_number sub_bcast tanh
transpose_all_permutations_3 reshape_negative_dim unsqueeze_two_axes constant_pad""".split()


@pytest.fixture(scope="module")
def node_cases():
    return remote_cases.node_cases(*REMOTE_NODE_CASES)


@pytest.mark.emulated
def test_emulated_onnx_node_cases(emulated_device, node_cases, tmp_path):
    host, port = emulated_device.address
    passed = []
    with rpc.connect(host, port, timeout=120) as sess:
        assert _wired(sess), "the device server must offer the tether.graph.* built-ins"
        for name, case in node_cases.items():
            remote_cases.check_case_on_device(sess, name, case, str(tmp_path / name), emulated_device.preset,
                                              lambda _, v: v.dtype == np.int64, atol=1e-6)
            passed.append(name)
    assert len(passed) >= 30


@pytest.mark.emulated
@pytest.mark.slow
@pytest.mark.parametrize("model_name", ["squeezenet", "resnet50"])
def test_emulated_aarch64_light_models(emulated_devices, model_name, tmp_path):
    device = emulated_devices.for_preset("rasp4b")
    path = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light",
                        "light_%s.onnx" % model_name)
    model = onnx.load(path)
    ref = numpy_helper.to_array(onnx.load_tensor(path.replace(".onnx", "_output_0.pb")))
    graph, params = from_onnx(model)
    tether.build_graph(graph, params, target="rasp4b").export(str(tmp_path))
    shape = graph.types[graph.inputs[0]].shape
    n = int(np.prod(shape))
    x = (np.arange(n).reshape(shape) / n).astype(np.float32)   # the suite's dummy input for light models
    with rpc.connect(*device.address, timeout=300) as sess:
        assert _wired(sess), "the device server must offer the tether.graph.* built-ins"
        with RemoteGraphExecutor(sess, str(tmp_path)) as gm:
            gm.run(**{graph.inputs[0]: x})
            np.testing.assert_allclose(gm.get_output(0), ref, rtol=1e-3, atol=1e-7)


def test_large_tensors_travel_as_bulk(rpc_server, tmp_path):
    """Inputs/outputs above one frame's limit (16 MiB) go through device arrays."""
    from onnx import TensorProto, helper
    shape = [1, 3, 1200, 1200]        # 17.3 MB of float32
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "big",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)])
    graph, params = from_onnx(helper.make_model(g, ir_version=8))
    tether.build_graph(graph, params).export(str(tmp_path))
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    with rpc.connect(rpc_server.host, rpc_server.port, timeout=60) as sess:
        with sess.graph_executor(str(tmp_path)) as gm:
            gm.run(x=x)
            np.testing.assert_array_equal(gm.get_output(0), np.maximum(x, 0))
