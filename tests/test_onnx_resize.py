"""ONNX Resize (opsets 10-19) and Upsample through the whole flow against onnxruntime: every mode, nearest_mode
and coordinate_transformation_mode, scales or sizes, axes, keep_aspect_ratio_policy, antialias."""
import numpy as np
import pytest
from fixtures.onnx_struct_compare import make_model

from tether.errors import UnsupportedOpError
from tether.frontend import from_onnx

RNG = np.random.default_rng(0)
X = RNG.standard_normal((1, 3, 6, 7)).astype(np.float32)
EMPTY = np.zeros((0,), np.float32)

COORDS = ["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric"]


def _resize(onnx_compare, attrs, scales=None, sizes=None, roi=None, opset=13, x=X, rtol=1e-4, atol=1e-5):
    inits = {"roi": np.asarray(roi, np.float32) if roi is not None else EMPTY,
             "scales": np.asarray(scales, np.float32) if scales is not None else EMPTY}
    if sizes is not None:
        inits["sizes"] = np.asarray(sizes, np.int64)
    model = make_model("Resize", {"x": x}, attrs, opset=opset, initializers=inits)
    onnx_compare(model, {"x": x}, rtol=rtol, atol=atol)


@pytest.mark.parametrize("coord", COORDS)
@pytest.mark.parametrize("nearest_mode", ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"])
@pytest.mark.parametrize("scales", [(1, 1, 2, 2), (1, 1, 0.6, 1.7)])
def test_nearest(onnx_compare, coord, nearest_mode, scales):
    _resize(onnx_compare, {"mode": "nearest", "coordinate_transformation_mode": coord, "nearest_mode": nearest_mode},
            scales=scales)


@pytest.mark.parametrize("coord", COORDS + ["half_pixel_symmetric"])
@pytest.mark.parametrize("mode", ["linear", "cubic"])
@pytest.mark.parametrize("sizes", [(1, 3, 12, 14), (1, 3, 4, 5), (1, 3, 1, 9)])
def test_linear_cubic_sizes(onnx_compare, coord, mode, sizes):
    _resize(onnx_compare, {"mode": mode, "coordinate_transformation_mode": coord}, sizes=sizes, opset=19)


@pytest.mark.parametrize("a,exclude", [(-0.5, 1), (-0.75, 0), (-0.6, 1)])
def test_cubic_coeff_exclude_outside(onnx_compare, a, exclude):
    _resize(onnx_compare, {"mode": "cubic", "cubic_coeff_a": a, "exclude_outside": exclude}, scales=(1, 1, 1.5, 0.8))


@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_tf_crop_and_resize(onnx_compare, mode):
    _resize(onnx_compare, {"mode": mode, "coordinate_transformation_mode": "tf_crop_and_resize",
                           "extrapolation_value": 7.5}, sizes=(1, 3, 5, 5), roi=(0, 0, -0.2, 0.3, 1, 1, 0.7, 1.4))


def test_linear_3d_volume(onnx_compare):
    x = RNG.standard_normal((1, 2, 3, 4, 5)).astype(np.float32)
    _resize(onnx_compare, {"mode": "linear"}, scales=(1, 1, 2, 1.5, 0.8), x=x)


@pytest.mark.parametrize("policy", ["not_larger", "not_smaller", "stretch"])
def test_axes_and_aspect_ratio(onnx_compare, policy):
    _resize(onnx_compare, {"mode": "linear", "axes": [3, 2], "keep_aspect_ratio_policy": policy},
            sizes=(10, 9), opset=18)


@pytest.mark.parametrize("mode", ["linear", "cubic"])
def test_antialias(onnx_compare, mode):
    _resize(onnx_compare, {"mode": mode, "antialias": 1}, sizes=(1, 3, 3, 4), opset=18)


@pytest.mark.parametrize("mode,scales", [("nearest", (1, 1, 2, 3)), ("linear", (1, 1, 2, 2)),
                                         ("nearest", (1, 1, 0.5, 0.5))])
def test_resize10_and_upsample9(onnx_compare, mode, scales):
    sc = {"scales": np.asarray(scales, np.float32)}
    onnx_compare(make_model("Resize", {"x": X}, {"mode": mode}, opset=10, initializers=sc), {"x": X})
    if min(scales) >= 1:
        onnx_compare(make_model("Upsample", {"x": X}, {"mode": mode}, opset=9, initializers=sc), {"x": X})


def test_yolo_nearest_2x_is_one_kernel(onnx_compare):
    x = RNG.standard_normal((1, 16, 10, 10)).astype(np.float32)
    model = make_model("Resize", {"x": x}, {"mode": "nearest"}, opset=13,
                       initializers={"roi": EMPTY, "scales": np.array([1, 1, 2, 2], np.float32)})
    graph, params = from_onnx(model)
    assert set(graph.ops_used()) == {"resize"}
    onnx_compare(model, {"x": x})


def test_refusals():
    model = make_model("Resize", {"x": X},
                       {"mode": "nearest", "coordinate_transformation_mode": "tf_half_pixel_for_nn"},
                       opset=11, initializers={"roi": EMPTY, "scales": np.array([1, 1, 2, 2], np.float32)})
    with pytest.raises(UnsupportedOpError, match="tf_half_pixel_for_nn"):
        from_onnx(model)
    model = make_model("Resize", {"x": X}, {"mode": "nearest", "antialias": 1}, opset=18,
                       initializers={"roi": EMPTY, "scales": np.array([1, 1, 0.5, 0.5], np.float32)})
    with pytest.raises(UnsupportedOpError, match="antialias"):
        from_onnx(model)


def test_upsample7_scales_attribute(onnx_compare):
    onnx_compare(make_model("Upsample", {"x": X}, {"mode": "nearest", "scales": [1.0, 1.0, 2.0, 3.0]}, opset=7),
                 {"x": X})
    onnx_compare(make_model("Upsample", {"x": X}, {"mode": "linear", "scales": [1.0, 1.0, 2.0, 2.0]}, opset=7),
                 {"x": X})
