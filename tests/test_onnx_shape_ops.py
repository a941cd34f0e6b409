"""ONNX Split, Expand, Tile, Range, ConstantOfShape, Shape (start/end), Size and folded shape subgraphs, through
the whole flow against onnxruntime."""
import numpy as np
import pytest
from fixtures.onnx_struct_compare import make_graph_model, make_model
from onnx import helper, numpy_helper

from tether.frontend import from_onnx

RNG = np.random.default_rng(0)


def _r(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("opset,attrs,inits,n", [
    (11, {"axis": 1, "split": [2, 3, 1]}, {}, 3),
    (13, {"axis": -1}, {"split": np.array([4, 3], np.int64)}, 2),
    (13, {"axis": 0}, {}, 2),
    (18, {"axis": 1, "num_outputs": 4}, {}, 4),      # on a (4, 7, 3) input: 7 -> 2, 2, 2, 1
    (18, {"axis": 2, "num_outputs": 3}, {}, 3),      # 7 -> 3, 3, 1
])
def test_split(onnx_compare, opset, attrs, inits, n):
    x = _r(4, 6, 7)
    if opset == 18 and attrs["axis"] == 1:
        x = _r(4, 7, 3)       # 7 -> 2, 2, 2, 1
    model = make_model("Split", {"x": x}, attrs, opset=opset, n_outputs=n, initializers=inits)
    onnx_compare(model, {"x": x})


@pytest.mark.parametrize("xshape,shape", [((3, 1), (2, 3, 4)), ((1, 4), (3, 1)), ((2, 1, 5), (2, 3, 1)),
                                          ((4,), (4,))])
def test_expand(onnx_compare, xshape, shape):
    x = _r(*xshape)
    model = make_model("Expand", {"x": x}, {}, opset=13, initializers={"shape": np.array(shape, np.int64)})
    onnx_compare(model, {"x": x})


@pytest.mark.parametrize("xshape,reps", [((2, 3), (2, 2)), ((2, 3, 4), (1, 3, 1)), ((5,), (3,)), ((2, 2), (1, 1))])
def test_tile(onnx_compare, xshape, reps):
    x = _r(*xshape)
    model = make_model("Tile", {"x": x}, {}, opset=13, initializers={"repeats": np.array(reps, np.int64)})
    onnx_compare(model, {"x": x})


def test_shape_subgraph_folds_to_reshape(onnx_compare):
    """Shape -> Gather -> Unsqueeze -> Concat -> Reshape (and Size, Range, ConstantOfShape, Shape start/end)
    fold at import: the compiled graph is only the reshape, the add and the expand."""
    x = _r(2, 3, 4)
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "i0"], ["d0"], axis=0),
        helper.make_node("Unsqueeze", ["d0", "ax0"], ["d0u"]),
        helper.make_node("Concat", ["d0u", "minus1"], ["newshape"], axis=0),
        helper.make_node("Reshape", ["x", "newshape"], ["flat"]),
        helper.make_node("Shape", ["x"], ["tail"], start=1, end=-1),           # [3]
        helper.make_node("Size", ["x"], ["n"]),                                  # 24
        helper.make_node("Cast", ["n"], ["nf"], to=1),
        helper.make_node("Range", ["zero", "twelve", "one"], ["r"]),              # 0..11
        helper.make_node("Cast", ["r"], ["rf"], to=1),
        helper.make_node("Add", ["flat", "rf"], ["y0"]),
        helper.make_node("ConstantOfShape", ["tail"], ["c"],
                         value=numpy_helper.from_array(np.array([2.0], np.float32))),
        helper.make_node("Unsqueeze", ["c", "ax1"], ["cu"]),                     # (3, 1)
        helper.make_node("Mul", ["cu", "nf"], ["c2"]),
        helper.make_node("Expand", ["c2", "s"], ["y1"]),
        helper.make_node("Add", ["y1", "x"], ["y"]),
    ]
    model = make_graph_model(nodes, {"x": x}, ["y0", "y"], {
        "i0": np.array(0, np.int64), "ax0": np.array([0], np.int64), "ax1": np.array([1], np.int64),
        "minus1": np.array([-1], np.int64), "zero": np.array(0, np.int64), "twelve": np.array(12, np.int64),
        "one": np.array(1, np.int64)}, opset=18)
    graph, _ = from_onnx(model)
    assert set(graph.ops_used()) <= {"reshape", "add"}, graph
    onnx_compare(model, {"x": x})


def test_range_float(onnx_compare):
    x = _r(7)
    nodes = [helper.make_node("Range", ["a", "b", "d"], ["r"]), helper.make_node("Add", ["x", "r"], ["y"])]
    model = make_graph_model(nodes, {"x": x}, ["y"], {"a": np.array(1.5, np.float32), "b": np.array(-2.0, np.float32),
                                                    "d": np.array(-0.5, np.float32)}, opset=13)
    onnx_compare(model, {"x": x})


def test_range_of_one_element_tensors(onnx_compare):
    """Bounds sliced out of a shape are one-element vectors, which onnxruntime's kernel takes as scalars
    (AffineGrid's function body computes its Range limits so). Its shape inference refuses them where it knows the
    shape, as here, so onnx's reference evaluator gives the expected outputs."""
    x = _r(4, 9)
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Slice", ["s", "one", "two"], ["b"]),                   # [9], shape (1,)
             helper.make_node("Range", ["one", "b", "two_scalar"], ["r"]),
             helper.make_node("Cast", ["r"], ["rf"], to=1),
             helper.make_node("Unsqueeze", ["rf", "one"], ["col"]),                    # (4, 1): 1, 3, 5, 7
             helper.make_node("Add", ["x", "col"], ["y"])]
    model = make_graph_model(nodes, {"x": x}, ["y"], {"one": np.array([1], np.int64), "two": np.array([2], np.int64),
                                                    "two_scalar": np.array(2, np.int64)}, opset=13)
    from onnx.reference import ReferenceEvaluator

    onnx_compare(model, {"x": x}, expected=ReferenceEvaluator(model).run(None, {"x": x}))


@pytest.mark.parametrize("bounds,named", [(([0, 1], [4], [1]), r"start of shape \(2,\)"),
                                          ((0, 4, 0), "delta is 0")])
def test_range_with_bad_bounds_is_one_line(bounds, named):
    from tether.errors import UnsupportedOpError

    x = _r(4)
    nodes = [helper.make_node("Range", ["a", "b", "d"], ["y"])]
    inits = {k: np.array(v, np.int64) for k, v in zip("abd", bounds)}
    model = make_graph_model([helper.make_node("Identity", ["x"], ["xi"])] + nodes, {"x": x}, ["y", "xi"], inits,
                             opset=13)
    with pytest.raises(UnsupportedOpError, match=named) as info:
        from_onnx(model)
    assert len(str(info.value).splitlines()) == 1
