"""ONNX Gather (run-time indices), GatherElements, GatherND, OneHot, Trilu (constant or run-time k), EyeLike,
DepthToSpace and SpaceToDepth through the whole flow against onnxruntime."""
import numpy as np
import pytest
from fixtures.onnx_struct_compare import make_graph_model, make_model
from onnx import helper

RNG = np.random.default_rng(0)


def _r(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("dshape,ishape,axis,dtype", [((50, 16), (2, 7), 0, np.int64), ((3, 9, 4), (5,), 1, np.int32),
                                                      ((4, 6), (), 1, np.int64), ((5, 3), (2, 2), -1, np.int64)])
def test_gather_runtime_indices(onnx_compare, dshape, ishape, axis, dtype):
    n = dshape[axis]
    idx = RNG.integers(-n, n, ishape).astype(dtype)
    node = helper.make_node("Gather", ["table", "ids"], ["y"], axis=axis)
    model = make_graph_model([node], {"ids": idx}, ["y"], {"table": _r(*dshape)}, opset=13)
    onnx_compare(model, {"ids": idx})


def test_gather_constant_indices_runtime_data(onnx_compare):
    x = _r(4, 5, 6)
    model = make_model("Gather", {"x": x}, {"axis": 2}, opset=13,
                       initializers={"i": np.array([[0, 5], [-1, 2]], np.int64)})
    onnx_compare(model, {"x": x})


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_gather_elements(onnx_compare, axis):
    x = _r(3, 4, 5)
    n = x.shape[axis]
    shape = list(x.shape)
    shape[axis] = 2
    idx = RNG.integers(-n, n, shape).astype(np.int64)
    model = make_model("GatherElements", {"x": x, "i": idx}, {"axis": axis}, opset=13)
    onnx_compare(model, {"x": x, "i": idx})


@pytest.mark.parametrize("dshape,ishape,b", [((4, 5, 6), (3, 2), 0), ((4, 5, 6), (2, 3, 1), 0),
                                             ((2, 5, 6), (2, 3, 1), 1),
                                             ((3, 4, 5, 2), (3, 4, 1), 2), ((4, 5), (7, 2), 0)])
def test_gather_nd(onnx_compare, dshape, ishape, b):
    x = _r(*dshape)
    k = ishape[-1]
    cols = [RNG.integers(0, dshape[b + j], ishape[:-1]) for j in range(k)]
    idx = np.stack(cols, axis=-1).astype(np.int64)
    model = make_model("GatherND", {"x": x, "i": idx}, {"batch_dims": b}, opset=13)
    onnx_compare(model, {"x": x, "i": idx})


@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_one_hot(onnx_compare, axis):
    idx = np.array([[1, -1, 9], [0, 3, 4]], np.int64)     # 9 is out of range: all off
    model = make_model("OneHot", {"i": idx}, {"axis": axis}, opset=11,
                       initializers={"depth": np.array(5, np.int64), "values": np.array([-2.0, 3.0], np.float32)})
    onnx_compare(model, {"i": idx})


@pytest.mark.parametrize("upper", [0, 1])
@pytest.mark.parametrize("k", [None, 0, 2, -1])
def test_trilu(onnx_compare, upper, k):
    x = _r(2, 4, 6)
    inits = {"k": np.array(k, np.int64)} if k is not None else {}
    model = make_model("Trilu", {"x": x}, {"upper": upper}, opset=14, initializers=inits)
    onnx_compare(model, {"x": x})


@pytest.mark.parametrize("upper", [0, 1])
def test_trilu_with_a_run_time_k(upper, tmp_path):
    """k as a graph input: one build, every diagonal offset (past the corners too) against onnxruntime."""
    import onnxruntime as ort

    import tether
    from tether import graph_executor
    from tether.frontend import from_onnx

    x = _r(2, 4, 6)
    model = make_model("Trilu", {"x": x, "k": np.array(0, np.int64)}, {"upper": upper}, opset=14)
    graph, params = from_onnx(model)
    tether.build_graph(graph, params, target="host").export(str(tmp_path / "m"))
    gm = graph_executor.load(str(tmp_path / "m"))
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for k in (-7, -2, 0, 1, 5, 9):
        feeds = {"x": x, "k": np.array(k, np.int64)}
        gm.run(**feeds)
        np.testing.assert_array_equal(gm.get_output(0), sess.run(None, feeds)[0])


def test_eye_like(onnx_compare):
    x = _r(3, 5)
    nodes = [helper.make_node("EyeLike", ["x"], ["e"], k=1), helper.make_node("Add", ["x", "e"], ["y"])]
    onnx_compare(make_graph_model(nodes, {"x": x}, ["y"], opset=13), {"x": x})


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
def test_depth_space(onnx_compare, mode):
    x = _r(2, 8, 3, 4)
    onnx_compare(make_model("DepthToSpace", {"x": x}, {"blocksize": 2, "mode": mode}, opset=13), {"x": x})


def test_space_to_depth(onnx_compare):
    x = _r(1, 3, 6, 4)
    onnx_compare(make_model("SpaceToDepth", {"x": x}, {"blocksize": 2}, opset=13), {"x": x})
