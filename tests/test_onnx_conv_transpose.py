"""ONNX ConvTranspose (groups, strides, dilations, pads, output_padding, output_shape, auto_pad, 1-D) through the
whole flow against onnxruntime; the 3-D one is in test_onnx_conv3d.py."""
import numpy as np
import pytest
from fixtures.onnx_struct_compare import make_model


RNG = np.random.default_rng(0)


def _r(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


CASES = [
    ({"strides": [2, 2], "pads": [1, 1, 1, 1]}, 4, 1, True),                       # U-Net / DB upsampling
    ({"strides": [2, 2]}, 2, 1, True),
    ({"strides": [2, 3], "output_padding": [1, 2]}, 3, 1, False),
    ({"strides": [1, 1], "pads": [0, 1, 2, 0]}, 3, 1, True),
    ({"dilations": [2, 2], "strides": [2, 1]}, 3, 1, False),
    ({"strides": [2, 2], "pads": [1, 1, 1, 1]}, 4, 2, True),                       # grouped
    ({"strides": [2, 2], "pads": [1, 1, 1, 1]}, 4, 4, False),                      # depthwise
    ({"strides": [2, 2], "auto_pad": "SAME_UPPER"}, 3, 1, False),
    ({"strides": [2, 2], "auto_pad": "SAME_LOWER"}, 3, 1, False),
    ({"strides": [3, 2], "output_shape": [10, 8]}, 3, 1, True),
    ({"strides": [2, 2], "output_shape": [10, 9], "output_padding": [1, 0]}, 3, 2, False),
    ({"auto_pad": "VALID", "strides": [2, 2]}, 3, 1, False),
    ({"strides": [2, 2], "pads": [3, 3, 3, 3]}, 3, 1, False),                       # pads > kernel: crops
]


@pytest.mark.parametrize("attrs,k,group,bias", CASES)
def test_conv_transpose_2d(onnx_compare, attrs, k, group, bias):
    x = _r(1, 4, 5, 4)
    w = _r(4, 6 // group if group in (1, 2) else 1, k, k)
    inits = {"w": w}
    if bias:
        inits["b"] = _r(w.shape[1] * group)
    model = make_model("ConvTranspose", {"x": x}, dict(attrs, group=group), opset=11, initializers=inits)
    onnx_compare(model, {"x": x}, rtol=1e-4, atol=1e-4)


def test_conv_transpose_batch2_runtime_weight(onnx_compare):
    x, w = _r(2, 3, 4, 4), _r(3, 2, 3, 3)
    model = make_model("ConvTranspose", {"x": x, "w": w}, {"strides": [2, 2], "pads": [1, 1, 0, 0]}, opset=11)
    onnx_compare(model, {"x": x, "w": w}, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("attrs", [{"strides": [2]}, {"strides": [3], "pads": [1, 2], "output_padding": [1]}])
def test_conv_transpose_1d(onnx_compare, attrs):
    x = _r(1, 3, 7)
    model = make_model("ConvTranspose", {"x": x}, attrs, opset=11, initializers={"w": _r(3, 5, 4), "b": _r(5)})
    onnx_compare(model, {"x": x}, rtol=1e-4, atol=1e-4)
