"""int8 kernels on emulated ARM devices: ONNX's quantized node cases and quantize_static models
compiled for rasp4b (aarch64 Cortex-A72), rasp5 (aarch64 Cortex-A76, with the dot product) and armv7-a7 (armv7
Cortex-A7), run there through the graph executor, against ONNX's expected data and onnxruntime on the host."""
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from fixtures import remote_cases
from fixtures.int8_models import assert_within_one_step, output_step

import tether
from tether import rpc
from tether.frontend import from_onnx
from tether.rpc.graph_client import RemoteGraphExecutor

PRESETS = ("rasp4b", "rasp5", "armv7-a7")
CASES = """qlinearconv qlinearmatmul_3D_uint8_float32 qlinearmatmul_2D_int8_float32 convinteger_with_padding
matmulinteger dequantizelinear_axis quantizelinear_axis quantizelinear dynamicquantizelinear_min_adjusted""".split()


@pytest.fixture(params=PRESETS)
def int8_device(request, emulated_devices):
    return emulated_devices.for_preset(request.param)


@pytest.mark.emulated
def test_emulated_quantized_node_cases(int8_device, tmp_path):
    host, port = int8_device.address
    with rpc.connect(host, port, timeout=120) as sess:
        for name, case in remote_cases.node_cases(*CASES).items():
            remote_cases.check_case_on_device(sess, name, case, str(tmp_path / name), int8_device.preset,
                                              lambda k, v: False, atol=0)


@pytest.mark.emulated
@pytest.mark.parametrize("fmt", ["qdq", "qoperator"])
def test_emulated_quantized_mobilenet_v2(int8_device, int8_model, tmp_path, fmt):
    size = 64
    path = int8_model("mobilenet_v2", fmt, size)
    model = onnx.load(path)
    graph, params = from_onnx(model)
    tether.build_graph(graph, params, target=int8_device.preset).export(str(tmp_path))
    sess_ort = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(11)
    host, port = int8_device.address
    with rpc.connect(host, port, timeout=300) as sess, RemoteGraphExecutor(sess, str(tmp_path)) as gm:
        for _ in range(2):
            x = rng.random((1, 3, size, size), dtype=np.float32)
            gm.set_input("input", x)
            gm.run()
            assert_within_one_step(gm.get_output(0), sess_ort.run(None, {"input": x})[0], output_step(model))
