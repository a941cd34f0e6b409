"""NonZero, Compress, Unique, NonMaxSuppression (data-dependent output shapes) and Det run as numpy nodes in the
device graph executor (graph/numpy_nodes.py, tether_rpc/numpy_ops.py): against onnxruntime on the host and through
a real forked server; a data-dependent value that would feed a kernel (or a Shape) is refused; a graph JSON with a
bad numpy node is refused by the device."""
import json

import numpy as np
import pytest
from fixtures.onnx_struct_compare import make_graph_model, make_model
from onnx import helper

import tether
from tether import rpc
from tether.errors import UnsupportedOpError
from tether.frontend import from_onnx

RNG = np.random.default_rng(3)


def test_nonzero(onnx_compare):
    x = (RNG.standard_normal((3, 4, 5)) > 0.3).astype(np.float32)
    model = make_model("NonZero", {"x": x}, opset=13)
    onnx_compare(model, {"x": x})


def test_nonzero_changes_shape_between_runs(tmp_path):
    from tether import graph_executor

    x = np.array([[0, 3, 0], [1, 0, 2]], np.int32)
    graph, params = from_onnx(make_model("NonZero", {"x": x}, opset=13))
    factory = tether.build_graph(graph, params, target="host")
    assert factory.graph_json["version"] == 3
    factory.export(str(tmp_path))
    gm = graph_executor.load(str(tmp_path))
    for value in (x, np.zeros_like(x), np.ones_like(x)):
        gm.set_input("x", value)
        gm.run()
        np.testing.assert_array_equal(gm.get_output(0), np.array(np.nonzero(value), np.int64))


@pytest.mark.parametrize("axis", [None, 0, 1, -1])
def test_compress(onnx_compare, axis):
    x = RNG.standard_normal((4, 5)).astype(np.float32)
    n = x.size if axis is None else x.shape[axis]
    cond = RNG.standard_normal(n - 1) > 0
    attrs = {} if axis is None else {"axis": axis}
    onnx_compare(make_model("Compress", {"x": x, "c": cond}, attrs, opset=11), {"x": x, "c": cond})


@pytest.mark.parametrize("axis,sorted_", [(None, 1), (None, 0), (0, 1), (1, 1), (-1, 0)])
def test_unique(onnx_compare, axis, sorted_):
    x = RNG.integers(0, 3, (6, 4)).astype(np.float32)
    x[3] = x[1]
    attrs = {"sorted": sorted_}
    if axis is not None:
        attrs["axis"] = axis
    onnx_compare(make_model("Unique", {"x": x}, attrs, opset=11, n_outputs=4), {"x": x})


@pytest.mark.parametrize("center,score_threshold", [(0, None), (0, 0.3), (1, 0.1)])
def test_non_max_suppression(onnx_compare, center, score_threshold):
    xy = RNG.uniform(0, 10, (2, 12, 2))
    wh = RNG.uniform(1, 5, (2, 12, 2))
    boxes = (np.concatenate([xy, xy + wh], -1) if center == 0 else np.concatenate([xy, wh], -1)).astype(np.float32)
    boxes[0, 3] = boxes[0, 2]                    # an identical box: ties in score and IoU 1
    scores = RNG.uniform(0, 1, (2, 3, 12)).astype(np.float32)
    scores[0, 0, 3] = scores[0, 0, 2]
    inputs = ["boxes", "scores", "max", "iou"] + (["score"] if score_threshold is not None else [])
    inits = {"max": np.array([4], np.int64)}
    feeds = {"boxes": boxes, "scores": scores, "iou": np.array([0.4], np.float32)}
    if score_threshold is not None:
        feeds["score"] = np.array([score_threshold], np.float32)
    model = make_graph_model([helper.make_node("NonMaxSuppression", inputs, ["y"], center_point_box=center)],
                             feeds, ["y"], inits, opset=11)
    onnx_compare(model, feeds)


def test_det(onnx_compare):
    x = RNG.standard_normal((3, 2, 4, 4)).astype(np.float32)
    onnx_compare(make_model("Det", {"x": x}, opset=11), {"x": x}, rtol=1e-4, atol=1e-5)


def test_det_feeds_a_kernel(onnx_compare):
    """Det's output shape is static: a compiled kernel may read it."""
    x = RNG.standard_normal((2, 3, 3)).astype(np.float32)
    model = make_graph_model([helper.make_node("Det", ["x"], ["d"]), helper.make_node("Relu", ["d"], ["y"])],
                             {"x": x}, ["y"], opset=11)
    onnx_compare(model, {"x": x}, rtol=1e-4, atol=1e-5)


def test_unique_of_nonzero_chain(onnx_compare):
    """numpy nodes may feed numpy nodes: Unique of NonZero's rows."""
    x = (RNG.standard_normal((4, 5)) > 0).astype(np.float32)
    model = make_graph_model([helper.make_node("NonZero", ["x"], ["nz"]), helper.make_node("Unique", ["nz"], ["y"])],
                             {"x": x}, ["y"], opset=11)
    onnx_compare(model, {"x": x})


def test_data_dependent_value_into_a_kernel_is_refused():
    """The frontend makes Neg of a data-dependent value a numpy node; a graph where a kernel reads one anyway is
    refused by the build."""
    from tether.graph.ir import Node

    x = RNG.standard_normal((3, 4)).astype(np.float32)
    model = make_graph_model([helper.make_node("NonZero", ["x"], ["nz"]), helper.make_node("Neg", ["nz"], ["y"])],
                             {"x": x}, ["y"], opset=13)
    graph, params = from_onnx(model)
    node = graph.nodes[-1]
    assert node.op == "dyn_unary"
    graph.nodes[-1] = Node("neg", node.name, node.inputs, node.outputs, {})
    with pytest.raises(UnsupportedOpError, match="reads 'nz', whose shape is data-dependent"):
        tether.build_graph(graph, params, target="host")


def test_range_of_a_data_dependent_size_is_refused():
    """Shape of a data-dependent value runs (its values are data-dependent, its rank is not); a Range over it would
    have a data-dependent length with no bound, and is refused naming it."""
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    model = make_graph_model([helper.make_node("NonZero", ["x"], ["nz"]), helper.make_node("Size", ["nz"], ["n"]),
                              helper.make_node("Range", ["zero", "n", "one"], ["y"])], {"x": x}, ["y"],
                             {"zero": np.array(0, np.int64), "one": np.array(1, np.int64)}, opset=13)
    with pytest.raises(UnsupportedOpError, match=r"node \S+ \(Range\) reads 'n', whose shape is data-dependent"):
        from_onnx(model)


def test_constant_inputs_fold_at_import():
    model = make_model("NonZero", {}, opset=13, initializers={"x": np.array([[1, 0], [0, 2]], np.int64)})
    graph, params = from_onnx(model)
    assert not graph.nodes


def _build(tmp_path, x):
    graph, params = from_onnx(make_model("Unique", {"x": x}, {"sorted": 0}, opset=11, n_outputs=4))
    tether.build_graph(graph, params, target="host").export(str(tmp_path))


def test_through_a_real_server(rpc_server, tmp_path):
    x = np.array([3, 1, 3, 2, 1, 3], np.int64)
    _build(tmp_path, x)
    with rpc.connect(rpc_server.host, rpc_server.port, timeout=60) as sess:
        with sess.graph_executor(str(tmp_path)) as gm:
            gm.set_input("x", x)
            gm.run()
            assert [gm.get_output(i).tolist() for i in range(4)] == [[3, 1, 2], [0, 1, 3], [0, 1, 0, 2, 1, 0],
                                                                     [3, 2, 1]]
    assert rpc_server.alive


@pytest.mark.parametrize("mutate,match", [(lambda n: n.update(numpy="os.system"), "numpy op"),
                                         (lambda n: n.update(inputs=[99]), "names entry"),
                                         (lambda n: n.update(attrs=[1]), "attrs")])
def test_device_refuses_bad_numpy_nodes(tmp_path, mutate, match):
    from tether_rpc.graph_executor import GraphExecutor
    from tether_rpc.module import load_module

    _build(tmp_path, np.array([1, 2, 2], np.int64))
    g = json.loads((tmp_path / "deploy.json").read_text())
    node = next(n for n in g["nodes"] if "numpy" in n)
    mutate(node)
    with pytest.raises(ValueError, match=match):
        GraphExecutor(g, load_module(str(tmp_path / g["lib"])))


@pytest.mark.parametrize("k,largest", [(3, 1), (0, 1), (6, 0)])
def test_topk_runtime_k(onnx_compare, k, largest):
    x = RNG.integers(-3, 3, (4, 6)).astype(np.float32)                # ties
    feeds = {"x": x, "k": np.array([k], np.int64)}
    model = make_model("TopK", feeds, {"largest": largest}, opset=11, n_outputs=2)
    onnx_compare(model, feeds)
