"""ONNX GridSample and AffineGrid through the whole flow against onnxruntime: every mode, padding mode and
align_corners, 2-D and 3-D, with grid points inside, on and far outside the borders (where reflection folds many
times); and the numpy meaning (constant folding) against ONNX's reference implementation."""
import itertools

import numpy as np
import pytest
from fixtures.onnx_struct_compare import make_model

from tether.errors import UnsupportedOpError
from tether.frontend import from_onnx
from tether.ops.grid_sample import grid_sample_np

RNG = np.random.default_rng(11)


def _grid(n, out, nd):
    g = RNG.uniform(-1.3, 1.3, (n,) + out + (nd,)).astype(np.float32)
    flat = g.reshape(-1)
    flat[:6] = [-1.0, 1.0, -3.7, 4.2, 0.0, -1.0001]      # borders and far outside
    return g


CASES_2D = list(itertools.product(["bilinear", "nearest", "bicubic"], ["zeros", "border", "reflection"], [0, 1]))


@pytest.mark.parametrize("mode,padding,align", CASES_2D)
def test_gridsample_2d(onnx_compare, mode, padding, align):
    x = RNG.standard_normal((2, 3, 5, 7)).astype(np.float32)
    grid = _grid(2, (4, 6), 2)
    model = make_model("GridSample", {"x": x, "grid": grid},
                       {"mode": mode, "padding_mode": padding, "align_corners": align}, opset=16)
    onnx_compare(model, {"x": x, "grid": grid}, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mode,padding,align", list(itertools.product(["linear", "nearest"],
                                                                      ["zeros", "border", "reflection"], [0, 1])))
def test_gridsample_3d(onnx_compare, mode, padding, align):
    x = RNG.standard_normal((1, 2, 3, 4, 5)).astype(np.float32)
    grid = _grid(1, (2, 3, 4), 3)
    model = make_model("GridSample", {"x": x, "grid": grid},
                       {"mode": mode, "padding_mode": padding, "align_corners": align}, opset=20)
    onnx_compare(model, {"x": x, "grid": grid}, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mode,padding,align", [("linear", "reflection", 0), ("linear", "border", 1),
                                                ("nearest", "zeros", 0), ("nearest", "reflection", 1),
                                                ("cubic", "zeros", 0)])
def test_numpy_meaning_matches_onnx_reference(mode, padding, align):
    # (cubic with border/reflection padding follows onnxruntime and PyTorch instead: the reference also moves
    # the coordinate into the border, test_gridsample_2d checks those against onnxruntime)
    from onnx.reference import ReferenceEvaluator

    x = RNG.standard_normal((1, 2, 4, 5)).astype(np.float32)
    grid = _grid(1, (3, 3), 2)
    model = make_model("GridSample", {"x": x, "grid": grid},
                       {"mode": mode, "padding_mode": padding, "align_corners": align}, opset=20)
    ref = ReferenceEvaluator(model).run(None, {"x": x, "grid": grid})[0]
    np.testing.assert_allclose(grid_sample_np(x, grid, mode, padding, bool(align)), ref, rtol=1e-5, atol=1e-6)


def test_gridsample_constant_inputs_fold():
    x = RNG.standard_normal((1, 1, 3, 3)).astype(np.float32)
    grid = _grid(1, (2, 2), 2)
    model = make_model("GridSample", {}, {"mode": "bilinear"}, opset=16, initializers={"x": x, "grid": grid})
    graph, params = from_onnx(model)
    assert not graph.nodes


def test_gridsample_refuses_cubic_3d():
    x = RNG.standard_normal((1, 1, 2, 3, 4)).astype(np.float32)
    grid = _grid(1, (2, 2, 2), 3)
    model = make_model("GridSample", {"x": x, "grid": grid}, {"mode": "cubic"}, opset=20)
    with pytest.raises(UnsupportedOpError, match="cubic 2-D only"):
        from_onnx(model)


@pytest.mark.parametrize("size,align", [((2, 3, 4, 5), 0), ((2, 3, 4, 5), 1), ((1, 2, 3, 4, 2), 0),
                                        ((1, 2, 3, 4, 2), 1)])
def test_affine_grid(onnx_compare, size, align):
    nd = len(size) - 2
    theta = RNG.standard_normal((size[0], nd, nd + 1)).astype(np.float32)
    model = make_model("AffineGrid", {"theta": theta}, {"align_corners": align}, opset=20,
                       initializers={"size": np.array(size, np.int64)})
    onnx_compare(model, {"theta": theta}, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("group,offset_group,attrs,with_mask,with_bias", [
    (1, 1, {}, False, False),
    (2, 2, {"strides": [2, 1], "pads": [1, 1, 0, 1]}, True, True),
    (1, 2, {"dilations": [2, 1], "pads": [1, 0, 1, 0]}, True, False),
])
def test_deform_conv(onnx_compare, group, offset_group, attrs, with_mask, with_bias):
    from fixtures.onnx_struct_compare import make_graph_model
    from onnx import helper

    from tether.ops.deform_conv import deform_conv2d_np

    x = RNG.standard_normal((2, 4, 6, 5)).astype(np.float32)
    w = RNG.standard_normal((4, 4 // group, 3, 2)).astype(np.float32)
    s, p, d = attrs.get("strides", [1, 1]), attrs.get("pads", [0, 0, 0, 0]), attrs.get("dilations", [1, 1])
    oh = (6 + p[0] + p[2] - 2 * d[0] - 1) // s[0] + 1
    ow = (5 + p[1] + p[3] - 1 * d[1] - 1) // s[1] + 1
    feeds = {"x": x, "w": w, "off": (RNG.standard_normal((2, offset_group * 12, oh, ow)) * 1.5).astype(np.float32)}
    names = ["x", "w", "off", "", ""]
    if with_bias:
        feeds["b"] = RNG.standard_normal(4).astype(np.float32)
        names[3] = "b"
    if with_mask:
        feeds["m"] = RNG.uniform(0, 1, (2, offset_group * 6, oh, ow)).astype(np.float32)
        names[4] = "m"
    while names[-1] == "":
        names.pop()
    node = helper.make_node("DeformConv", names, ["y"], group=group, offset_group=offset_group, **attrs)
    model = make_graph_model([node], feeds, ["y"], opset=19)
    got, ref = onnx_compare(model, feeds, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(deform_conv2d_np(x, w, feeds["off"], feeds.get("m"), feeds.get("b"), s, p, d, group,
                                                offset_group), ref[0], rtol=1e-4, atol=1e-4)
