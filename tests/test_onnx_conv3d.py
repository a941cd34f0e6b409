"""ONNX 3-D Conv and ConvTranspose (video and volume models: strides, dilations, pads, auto_pad, groups, bias,
output_padding, output_shape) through the whole flow against onnxruntime."""
import numpy as np
import pytest
from fixtures.onnx_struct_compare import make_graph_model, make_model

RNG = np.random.default_rng(3)


def _r(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


CONV_CASES = [
    ({}, (3, 3, 3), 1, True),
    ({"pads": [1, 1, 1, 1, 1, 1]}, (3, 3, 3), 1, False),                             # C3D / 3-D U-Net
    ({"strides": [1, 2, 2], "pads": [1, 3, 3, 1, 3, 3]}, (3, 7, 7), 1, True),         # r3d stem
    ({"strides": [2, 1, 1], "pads": [1, 0, 0, 1, 0, 0]}, (3, 1, 1), 1, False),        # (2+1)D temporal conv
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


def _bn(nodes, inits, x, c, name):
    inits[name + "_s"], inits[name + "_b"] = (1 + 0.1 * _r(c)), 0.1 * _r(c)
    inits[name + "_m"], inits[name + "_v"] = 0.1 * _r(c), (1 + 0.1 * np.abs(_r(c)))
    nodes.append(_node("BatchNormalization", [x, name + "_s", name + "_b", name + "_m", name + "_v"], [name]))
    return name


def _node(op, ins, outs, **attrs):
    from onnx import helper

    return helper.make_node(op, ins, outs, **attrs)


def _conv(nodes, inits, x, cin, cout, k, name, strides=(1, 1, 1), pads=None, relu=True):
    inits[name + "_w"] = (_r(cout, cin, *k) * (2.0 / (cin * int(np.prod(k)))) ** 0.5).astype(np.float32)
    pads = list(pads) if pads is not None else [ki // 2 for ki in k] * 2
    nodes.append(_node("Conv", [x, name + "_w"], [name + "_c"], strides=list(strides), pads=pads))
    y = _bn(nodes, inits, name + "_c", cout, name + "_bn")
    if relu:
        nodes.append(_node("Relu", [y], [name]))
        return name
    return y


def test_r2plus1d_style_video_classifier(onnx_compare):
    """A video classifier shaped like torchvision's r2plus1d_18, scaled down: a (2+1)D stem (1x7x7 spatial, then
    3x1x1 temporal), residual blocks of (2+1)D convs with a strided 1x1x1 shortcut, 3-D pooling, a linear head."""
    nodes, inits = [], {}
    y = _conv(nodes, inits, "x", 3, 16, (1, 7, 7), "stem_s", strides=(1, 2, 2), pads=[0, 3, 3, 0, 3, 3])
    y = _conv(nodes, inits, y, 16, 16, (3, 1, 1), "stem_t")
    nodes.append(_node("MaxPool", [y], ["pool"], kernel_shape=[1, 3, 3], strides=[1, 2, 2], pads=[0, 1, 1, 0, 1, 1]))
    y, cin = "pool", 16
    for i, (cout, stride) in enumerate([(16, 1), (32, 2)]):
        a = _conv(nodes, inits, y, cin, cout, (1, 3, 3), "b%d_s1" % i, strides=(1, stride, stride))
        a = _conv(nodes, inits, a, cout, cout, (3, 1, 1), "b%d_t1" % i, strides=(stride, 1, 1))
        a = _conv(nodes, inits, a, cout, cout, (1, 3, 3), "b%d_s2" % i)
        a = _conv(nodes, inits, a, cout, cout, (3, 1, 1), "b%d_t2" % i, relu=False)
        short = y if stride == 1 and cin == cout else _conv(nodes, inits, y, cin, cout, (1, 1, 1), "b%d_down" % i,
                                                            strides=(stride,) * 3, pads=[0] * 6, relu=False)
        nodes += [_node("Add", [a, short], ["b%d_sum" % i]), _node("Relu", ["b%d_sum" % i], ["b%d" % i])]
        y, cin = "b%d" % i, cout
    inits["fc_w"], inits["fc_b"] = 0.1 * _r(10, cin), 0.1 * _r(10)
    nodes += [_node("GlobalAveragePool", [y], ["gap"]), _node("Flatten", ["gap"], ["flat"]),
              _node("Gemm", ["flat", "fc_w", "fc_b"], ["logits"], transB=1)]
    x = _r(2, 3, 8, 32, 32)
    model = make_graph_model(nodes, {"x": x}, ["logits"], inits, opset=13)
    onnx_compare(model, {"x": x}, rtol=1e-4, atol=1e-4)


def test_unet_3d_segmenter(onnx_compare):
    """A two-level 3-D U-Net (volume segmentation): 3x3x3 convs, max pooling, a stride-2 ConvTranspose back up,
    the skip concatenated, a 1x1x1 head and a softmax over classes."""
    nodes, inits = [], {}
    e1 = _conv(nodes, inits, "x", 1, 8, (3, 3, 3), "e1")
    nodes.append(_node("MaxPool", [e1], ["p1"], kernel_shape=[2, 2, 2], strides=[2, 2, 2]))
    e2 = _conv(nodes, inits, "p1", 8, 16, (3, 3, 3), "e2")
    inits["up_w"], inits["up_b"] = 0.2 * _r(16, 8, 2, 2, 2), 0.1 * _r(8)
    nodes.append(_node("ConvTranspose", [e2, "up_w", "up_b"], ["up"], strides=[2, 2, 2]))
    nodes.append(_node("Concat", ["up", e1], ["cat"], axis=1))
    d1 = _conv(nodes, inits, "cat", 16, 8, (3, 3, 3), "d1")
    inits["head_w"], inits["head_b"] = 0.3 * _r(3, 8, 1, 1, 1), 0.1 * _r(3)
    nodes += [_node("Conv", [d1, "head_w", "head_b"], ["head"]), _node("Softmax", ["head"], ["prob"], axis=1)]
    x = _r(1, 1, 8, 16, 16)
    model = make_graph_model(nodes, {"x": x}, ["prob"], inits, opset=13)
    onnx_compare(model, {"x": x}, rtol=1e-4, atol=1e-4)
