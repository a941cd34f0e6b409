"""float16 ONNX models through the whole flow: float16 inputs, weights and outputs; every computing node runs in
float32 between casts the graph passes fuse into its kernel (frontend/onnx/half.py); the graph executor holds
float16 inputs, outputs and stored intermediates (constant weights are widened to float32 when imported). Compared
with onnxruntime on the host and with the graph executor on emulated aarch64 (rasp4b) and armv7 (armv7-a7) over
RPC."""
import numpy as np
import pytest
from fixtures.onnx_struct_compare import erf_gelu_nodes
from onnx import TensorProto, helper, numpy_helper

import tether
from tether import graph_executor
from tether.frontend import from_onnx

RNG = np.random.default_rng(5)


def _h(*shape, scale=0.3):
    return (RNG.standard_normal(shape) * scale).astype(np.float16)


def _model():
    """A small CNN and attention-like head in float16: Conv+Relu, depthwise Conv, global ReduceMean pooling,
    Gemm, Softmax, LayerNormalization, Erf GELU, Transpose/Reshape, a MatMul with broadcasting, and a Cast to
    float32 output beside the float16 one."""
    inits = {"w1": _h(8, 3, 3, 3), "b1": _h(8), "wd": _h(8, 1, 3, 3), "bd": _h(8), "hw": np.array([2, 3], np.int64),
             "flat": np.array([1, 8], np.int64), "wf": _h(16, 8), "bf": _h(16), "g": (1 + _h(16)), "be": _h(16),
             "rs": np.array([1, 4, 4], np.int64), "wm": _h(4, 6), "half": np.array(0.5, np.float16),
             "one": np.array(1, np.float16), "r2": np.array(1 / np.sqrt(2), np.float16)}
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["a1"]),
             helper.make_node("Conv", ["a1", "wd", "bd"], ["c2"], pads=[1, 1, 1, 1], group=8),
             helper.make_node("ReduceMean", ["c2", "hw"], ["p"], keepdims=1),
             helper.make_node("Reshape", ["p", "flat"], ["f"]),
             helper.make_node("Gemm", ["f", "wf", "bf"], ["z"], transB=1),
             helper.make_node("LayerNormalization", ["z", "g", "be"], ["n"], axis=-1, epsilon=1e-3),
             helper.make_node("Mul", ["n", "r2"], ["e0"]),
             *erf_gelu_nodes("n", "e0", "gelu"),
             helper.make_node("Reshape", ["gelu", "rs"], ["r"]),
             helper.make_node("Transpose", ["r"], ["t"], perm=[0, 2, 1]),
             helper.make_node("MatMul", ["t", "wm"], ["m"]),
             helper.make_node("Softmax", ["m"], ["y"], axis=-1),
             helper.make_node("Cast", ["m"], ["y32"], to=TensorProto.FLOAT)]
    graph = helper.make_graph(
        nodes, "f16", [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [1, 3, 12, 12])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [1, 4, 6]),
         helper.make_tensor_value_info("y32", TensorProto.FLOAT, [1, 4, 6])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    x = RNG.uniform(-1, 1, (1, 3, 12, 12)).astype(np.float16)
    return model, x


def _reference(model, x):
    import onnxruntime as ort

    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})


def _compare(got, ref):
    for g, r in zip(got, ref):
        assert g.dtype == r.dtype and g.shape == r.shape, (g.dtype, g.shape, r.dtype, r.shape)
        # float16 rounding: onnxruntime rounds after some nodes tether keeps in float32, and vice versa
        np.testing.assert_allclose(g.astype(np.float32), r.astype(np.float32), rtol=4e-3, atol=2e-3)


def _build(target, folder):
    model, x = _model()
    graph, params = from_onnx(model)
    assert graph.types["x"].dtype == "float16" and graph.types["y"].dtype == "float16"
    tether.build_graph(graph, params, target=target).export(str(folder))
    return model, x


def test_float16_model_matches_onnxruntime_on_host(tmp_path):
    model, x = _build("host", tmp_path)
    gm = graph_executor.load(str(tmp_path))
    gm.set_input("x", x)
    gm.run()
    got = [gm.get_output(i) for i in range(gm.get_num_outputs())]
    _compare(got, _reference(model, x))
    # the float16 inputs matter: a different input gives a different answer
    gm.set_input("x", -x)
    gm.run()
    assert not np.array_equal(gm.get_output(0), got[0])


@pytest.mark.emulated
@pytest.mark.parametrize("preset", ["rasp4b", "armv7-a7", "rasp5-fp16"])   # (rasp5-fp16: its casts in half)
def test_float16_model_on_emulated_device(emulated_devices, preset, tmp_path):
    from tether import rpc
    from tether.rpc.graph_client import RemoteGraphExecutor

    model, x = _build(preset, tmp_path)
    device = emulated_devices.for_preset(preset)
    with rpc.connect(*device.address, timeout=300) as sess:
        with RemoteGraphExecutor(sess, str(tmp_path)) as gm:
            gm.run(x=x)
            got = [gm.get_output(i) for i in range(2)]
    _compare(got, _reference(model, x))
