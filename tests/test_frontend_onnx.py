"""ONNX import: shapes, constants, shape-subgraph folding, the unsupported-op report; checked against
onnxruntime through the numpy reference interpreter (compiled kernels are covered by test_graph_build)."""
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from tether.errors import UnsupportedOpError
from tether.frontend import from_onnx
from tether.graph import reference


def _ort(model, feeds):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def _shape_subgraph_model():
    """x -> conv -> (Shape -> Gather(0) -> Unsqueeze, const -1) -> Concat -> Reshape: what exporters write."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node("Shape", ["c"], ["s"], name="shape"),
        helper.make_node("Constant", [], ["i0"], value=numpy_helper.from_array(np.array(0, np.int64)), name="k0"),
        helper.make_node("Gather", ["s", "i0"], ["n"], axis=0, name="gather"),
        helper.make_node("Unsqueeze", ["n", "ax"], ["n1"], name="unsq"),
        helper.make_node("Concat", ["n1", "minus1"], ["newshape"], axis=0, name="concat"),
        helper.make_node("Reshape", ["c", "newshape"], ["r"], name="reshape"),
        helper.make_node("Relu", ["r"], ["y"], name="relu"),
    ]
    inits = [w, numpy_helper.from_array(np.array([0], np.int64), "ax"),
             numpy_helper.from_array(np.array([-1], np.int64), "minus1")]
    g = helper.make_graph(nodes, "shapes", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def test_shape_subgraph_folds_to_a_constant_reshape():
    model = _shape_subgraph_model()
    graph, params = from_onnx(model, shape={"x": (2, 3, 8, 8)})
    ops_used = graph.ops_used()
    assert ops_used == {"conv2d": 1, "reshape": 1, "relu": 1}, str(graph)
    reshape = next(n for n in graph.nodes if n.op == "reshape")
    assert tuple(reshape.attrs["shape"]) == (2, 4 * 8 * 8)
    x = np.random.default_rng(1).standard_normal((2, 3, 8, 8)).astype(np.float32)
    (y,) = reference.run(graph, params, {"x": x})
    np.testing.assert_allclose(y, _ort(model, {"x": x})[0], rtol=1e-4, atol=1e-5)


def test_symbolic_input_without_shape_is_a_clear_error():
    with pytest.raises(ValueError, match="symbolic shape"):
        from_onnx(_shape_subgraph_model())


def test_every_unsupported_op_is_listed_with_node_names_before_converting():
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="ok"),
             helper.make_node("StringNormalizer", ["a"], ["b"], name="e1"),
             helper.make_node("StringNormalizer", ["b"], ["c"], name="e2"),
             helper.make_node("TfIdfVectorizer", ["c"], ["y"], name="nz")]
    g = helper.make_graph(nodes, "bad", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2])],
                          [helper.make_tensor_value_info("y", TensorProto.INT64, None)])
    with pytest.raises(UnsupportedOpError) as info:
        from_onnx(helper.make_model(g))
    msg = str(info.value)
    assert "2 unsupported op type(s)" in msg
    assert "StringNormalizer (e1, e2)" in msg and "TfIdfVectorizer (nz)" in msg


def test_gemm_variants_and_initializers_match_onnxruntime():
    rng = np.random.default_rng(2)
    a = rng.standard_normal((4, 5)).astype(np.float32)
    b = rng.standard_normal((6, 5)).astype(np.float32)
    c = rng.standard_normal((6,)).astype(np.float32)
    node = helper.make_node("Gemm", ["a", "b", "c"], ["y"], alpha=0.5, beta=2.0, transB=1)
    g = helper.make_graph([node], "gemm", [helper.make_tensor_value_info("a", TensorProto.FLOAT, [4, 5])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 6])],
                          [numpy_helper.from_array(b, "b"), numpy_helper.from_array(c, "c")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    graph, params = from_onnx(model)
    assert "dense" in graph.ops_used()
    (y,) = reference.run(graph, params, {"a": a})
    np.testing.assert_allclose(y, _ort(model, {"a": a})[0], rtol=1e-5, atol=1e-5)


def test_graph_prints_readably():
    graph, params = from_onnx(_shape_subgraph_model(), shape={"x": (1, 3, 8, 8)})
    text = str(graph)
    assert text.startswith("graph shapes(%x: float32[1,3,8,8])")
    assert "conv2d(%x, %w)" in text and "return %y" in text
