"""int8 models end to end on the host: mobilenet_v2 and resnet50 quantized by onnxruntime's
quantize_static in the QDQ form (per channel; the quantize pass runs each DQ -> op -> Q group as an integer kernel)
and the QOperator form (QLinearConv and the com.microsoft contrib ops), compiled by tether and compared with
onnxruntime on random inputs: within one quantization step on >= 99.9% of the outputs and the same top-1
(they agree bit for bit today)."""
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from fixtures.int8_models import assert_within_one_step, output_step

import tether
from tether import graph_executor
from tether.frontend import from_onnx
from tether.graph.passes import optimize

N_INPUTS = 4


@pytest.mark.parametrize("name,size,fmt,activations", [
    ("mobilenet_v2", 224, "qdq", "uint8"), ("mobilenet_v2", 224, "qoperator", "uint8"),
    ("resnet50", 112, "qdq", "uint8"), ("resnet50", 112, "qoperator", "uint8")])
def test_quantized_model_matches_onnxruntime(int8_model, tmp_path, name, size, fmt, activations):
    path = int8_model(name, fmt, size, activations)
    model = onnx.load(path)
    graph, params = from_onnx(model)
    tether.build_graph(graph, params, target="host").export(str(tmp_path))
    gm = graph_executor.load(str(tmp_path))
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(7)
    step = output_step(model)
    for _ in range(N_INPUTS):
        x = rng.random((1, 3, size, size), dtype=np.float32)
        gm.set_input("input", x)
        gm.run()
        assert_within_one_step(gm.get_output(0), sess.run(None, {"input": x})[0], step)


def test_qdq_groups_become_integer_kernels(int8_model):
    """Every conv and the classifier of the QDQ mobilenet_v2 run on integers: no float conv/dense is left, and
    the only quantize left is the input's."""
    graph, params = from_onnx(onnx.load(int8_model("mobilenet_v2", "qdq", 224)))
    opt, _ = optimize(graph, params, opt_level=0)
    ops = opt.ops_used()
    assert ops.get("quantize") == 1, ops
    for n in opt.nodes:
        if n.op in ("conv2d", "dense"):
            assert all(str(opt.types[i].dtype) == "int32" for i in n.inputs), n
    assert ops.get("requantize", 0) >= 53 and ops.get("qadd", 0) == 10, ops
