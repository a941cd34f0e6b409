"""Call lists (docs/abi.md "Call lists"): a graph's kernels run as one native call of the module's
``tether_run_calls``, with the results of calling them one by one and the same errors; modules without the export
(hand-written C) run the same list from Python."""
import numpy as np
import onnxruntime as ort
import pytest
from fixtures.onnx_struct_compare import make_graph_model
from onnx import helper

import tether
from kernels import build_kernel
from tether import graph_executor
from tether.frontend import from_onnx
from tether_rpc.errors import KernelError, ModuleLoadError
from tether_rpc.module import load_module

RNG = np.random.default_rng(5)


def _model():
    """Convs, a residual add, pooling and a dense head: several kernels, none of them numpy nodes."""
    weights = {name: (RNG.standard_normal(shape) * 0.3).astype(np.float32) for name, shape in (
        ("w0", (8, 3, 3, 3)), ("b0", (8,)), ("w1", (8, 8, 3, 3)), ("b1", (8,)), ("fc", (10, 8)), ("fcb", (10,)))}
    nodes = [
        helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c0"], ["r0"]),
        helper.make_node("Conv", ["r0", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Tanh", ["c1"], ["t1"]),
        helper.make_node("MaxPool", ["r0"], ["p0"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Add", ["t1", "p0"], ["s"]),
        helper.make_node("GlobalAveragePool", ["s"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("Gemm", ["f", "fc", "fcb"], ["logits"], transB=1),
        helper.make_node("Softmax", ["logits"], ["probs"], axis=1),
    ]
    return make_graph_model(nodes, {"x": np.zeros((1, 3, 16, 16), np.float32)}, ["probs"], weights, opset=13)


@pytest.fixture(scope="module")
def deployed(tmp_path_factory):
    model = _model()
    graph, params = from_onnx(model)
    out = tmp_path_factory.mktemp("calls")
    tether.build_graph(graph, params, target="host", opt_level=3).export(str(out))
    return model, out


def test_a_model_runs_as_one_native_call_with_onnxruntime_results(deployed):
    model, out = deployed
    x = RNG.standard_normal((1, 3, 16, 16)).astype(np.float32)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    gm = graph_executor.load(str(out))
    assert gm.module.metadata["call_list"] == 1
    kernels = sum("func" in n and "numpy" not in n for n in gm.graph["nodes"])
    assert kernels >= 4, gm.graph["nodes"]
    assert gm.info()["calls_per_run"] == 1
    gm.set_input("x", x)
    gm.run()
    np.testing.assert_allclose(gm.get_output(0), ref, rtol=1e-5, atol=1e-6)
    # the list's result is the one-by-one result, bit for bit
    listed = gm.get_output(0).copy()
    gm.get_output(0)[...] = 0
    for node, call in zip(gm._nodes, gm._calls):
        call()
    np.testing.assert_array_equal(gm.get_output(0), listed)
    # a timed run is a run: one foreign call per repetition
    res = gm.benchmark(number=2, repeat=2)
    assert len(res["samples"]) == 2


def _bound_kernels(module, rng):
    """Each of ``module``'s functions bound to fresh arrays of its argument shapes, with their outputs."""
    bound = []
    for name in module.function_names:
        info = module[name].arg_info
        arrays = [rng.standard_normal(tuple(a["shape"])).astype(a["dtype"]) for a in info]
        bound.append((name, module[name].bind(*arrays), arrays))
    return bound


def test_sequence_stops_at_the_failing_call_and_names_it(deployed):
    _, out = deployed
    module = load_module(str(out / "deploy.so"))
    try:
        rng = np.random.default_rng(0)
        (n0, good0, a0), (n1, good1, a1) = _bound_kernels(module, rng)[:2]
        # the same function bound to an array one element short: its own shape check fails inside the list
        info = module[n1].arg_info
        short = [rng.standard_normal(tuple(a["shape"])).astype(a["dtype"]) for a in info]
        short[0] = short[0].reshape(-1)[:-1].copy()
        bad = module[n1].bind(*short)
        after = a1[-1].copy()
        run = module.sequence([good0, bad, good1])
        with pytest.raises(KernelError) as err:
            run()
        assert n1 in str(err.value) and "\n" not in str(err.value), err.value
        # nothing after the failing call ran
        np.testing.assert_array_equal(a1[-1], after)
        # the list is reusable: the good calls alone run and agree with calling them one by one
        module.sequence([good0, good1])()
        once = [a0[-1].copy(), a1[-1].copy()]
        good0()
        good1()
        np.testing.assert_array_equal(a0[-1], once[0])
        np.testing.assert_array_equal(a1[-1], once[1])
        listed = module.sequence([good0, good1])
    finally:
        module.close()
    with pytest.raises(ModuleLoadError, match="closed"):
        listed()


def test_a_module_without_the_export_runs_the_list_from_python(tmp_path):
    module = load_module(str(build_kernel("vadd", tmp_path)))
    try:
        assert "call_list" not in module.metadata
        a, b = np.arange(1024, dtype=np.float32), np.full(1024, 2, np.float32)
        c, d = np.zeros(1024, np.float32), np.zeros(1024, np.float32)
        run = module.sequence([module["vadd"].bind(a, b, c), module["vadd"].bind(c, b, d)])
        run()
        np.testing.assert_array_equal(d, a + 4)
        bad = module.sequence([module["vadd"].bind(a, b, np.zeros(7, np.float32)), module["vadd"].bind(a, a, d)])
        with pytest.raises(KernelError, match="vadd"):
            bad()
        np.testing.assert_array_equal(d, a + 4)
    finally:
        module.close()
