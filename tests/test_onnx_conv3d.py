"""ONNX 3-D Conv and ConvTranspose (video and volume models: strides, dilations, pads, auto_pad, groups, bias,
output_padding, output_shape) through the whole flow against onnxruntime; whole video and volume models are model
kinds (tests/test_model_kinds.py)."""
import numpy as np
import pytest
from fixtures.onnx_struct_compare import make_model

RNG = np.random.default_rng(3)


def _r(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


CONV_CASES = [
    ({}, (3, 3, 3), 1, True),
    ({"pads": [1, 1, 1, 1, 1, 1]}, (3, 3, 3), 1, False),                             # C3D / 3-D U-Net
    ({"strides": [1, 2, 2], "pads": [1, 3, 3, 1, 3, 3]}, (3, 7, 7), 1, True),         # r3d stem
    ({"strides": [2, 1, 1], "pads": [1, 0, 0, 1, 0, 0]}, (3, 1, 1), 1, False),        # (2+1)D temporal conv
    # depth-only kernels run as a 2-D conv over (depth, H*W): dilated, grouped, biased, padded unevenly; 1x1x1
    ({"dilations": [2, 1, 1], "pads": [2, 0, 0, 1, 0, 0]}, (3, 1, 1), 2, True),
    ({}, (1, 1, 1), 1, True),
    ({"strides": [1, 1, 1], "pads": [0, 1, 1, 0, 1, 1]}, (1, 3, 3), 1, True),         # (2+1)D spatial conv
    ({"dilations": [2, 1, 2], "pads": [2, 1, 0, 1, 0, 2]}, (2, 3, 2), 1, True),
    ({"strides": [2, 2, 2]}, (1, 1, 1), 1, False),                                     # downsampling shortcut
    ({"pads": [1, 1, 1, 1, 1, 1]}, (3, 3, 3), 2, True),                              # grouped
    ({"pads": [1, 1, 1, 1, 1, 1]}, (3, 3, 3), 4, False),                             # depthwise (X3D)
    ({"auto_pad": "SAME_UPPER", "strides": [2, 2, 1]}, (2, 3, 3), 1, True),
    ({"auto_pad": "SAME_LOWER", "strides": [2, 1, 2]}, (2, 3, 3), 1, False),
]


@pytest.mark.parametrize("attrs,kernel,group,bias", CONV_CASES)
def test_conv_3d(onnx_compare, attrs, kernel, group, bias):
    x = _r(2, 4, 5, 6, 7)
    inits = {"w": _r(8, 4 // group, *kernel)}
    if bias:
        inits["b"] = _r(8)
    model = make_model("Conv", {"x": x}, dict(attrs, group=group), opset=11, initializers=inits)
    onnx_compare(model, {"x": x}, rtol=1e-4, atol=1e-4)


def test_conv_3d_with_a_run_time_weight(onnx_compare):
    x, w = _r(1, 3, 4, 5, 5), _r(2, 3, 2, 2, 2)
    model = make_model("Conv", {"x": x, "w": w}, {"strides": [1, 2, 2]}, opset=11)
    onnx_compare(model, {"x": x, "w": w}, rtol=1e-4, atol=1e-4)


TRANSPOSE_CASES = [
    ({}, 2, 1, True),
    ({"strides": [2, 2, 2]}, 2, 1, False),                                             # 3-D U-Net upsampling
    ({"strides": [2, 2, 2], "pads": [1, 0, 1, 0, 1, 0], "output_padding": [1, 0, 1]}, 2, 1, True),
    ({"strides": [3, 3, 3], "pads": [0, 1, 0, 2, 0, 1]}, 3, 1, True),
    ({"strides": [2, 2, 2], "pads": [1, 1, 1, 1, 1, 1]}, 4, 1, True),
    ({"strides": [1, 2, 3], "output_padding": [0, 1, 2]}, 3, 1, False),
    ({"dilations": [2, 1, 1], "strides": [1, 2, 1], "pads": [0, 1, 2, 1, 0, 0]}, 3, 1, True),
    ({"strides": [2, 2, 2], "pads": [1, 1, 1, 1, 1, 1]}, 3, 2, True),                # grouped
    ({"strides": [2, 2, 2], "auto_pad": "SAME_UPPER"}, 3, 1, False),
    ({"strides": [2, 3, 2], "output_shape": [7, 10, 8]}, 3, 1, True),
    ({"strides": [2, 2, 2], "pads": [3, 3, 3, 3, 3, 3]}, 3, 1, False),              # pads > kernel: crops
]


@pytest.mark.parametrize("attrs,k,group,bias", TRANSPOSE_CASES)
def test_conv_transpose_3d(onnx_compare, attrs, k, group, bias):
    x = _r(2, 4, 3, 4, 3)
    w = _r(4, 6 // group, k, k, k)
    inits = {"w": w}
    if bias:
        inits["b"] = _r(6)
    model = make_model("ConvTranspose", {"x": x}, dict(attrs, group=group), opset=11, initializers=inits)
    onnx_compare(model, {"x": x}, rtol=1e-4, atol=1e-4)


def test_conv_3d_kernel_deeper_than_its_input_is_one_line():
    from tether.errors import UnsupportedOpError
    from tether.frontend import from_onnx

    x = _r(1, 2, 2, 4, 4)
    model = make_model("Conv", {"x": x}, {}, opset=11, initializers={"w": _r(3, 2, 3, 3, 3)})
    with pytest.raises(UnsupportedOpError, match="deeper than the padded input"):
        from_onnx(model)
