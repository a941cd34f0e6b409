"""ONNX LayerNormalization, InstanceNormalization, GroupNormalization and the exporters' decomposed layer norm,
through the whole flow against onnxruntime."""
import numpy as np
import pytest
from fixtures.onnx_struct_compare import make_graph_model, make_model
from onnx import helper

from tether.errors import UnsupportedOpError
from tether.frontend import from_onnx

RNG = np.random.default_rng(0)


def _r(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("shape,axis", [((2, 5, 16), -1), ((2, 5, 16), 1), ((3, 4, 6, 8), -2), ((4, 33), 0)])
@pytest.mark.parametrize("bias", [True, False])
def test_layer_norm(onnx_compare, shape, axis, bias):
    x = _r(*shape)
    norm = shape[axis:] if axis >= 0 else shape[len(shape) + axis:]
    inits = {"scale": _r(*norm)}
    if bias:
        inits["bias"] = _r(*norm)
    model = make_model("LayerNormalization", {"x": x}, {"axis": axis, "epsilon": 1e-3}, opset=17,
                       initializers=inits)
    onnx_compare(model, {"x": x})


def test_layer_norm_statistics_outputs(onnx_compare):
    x = _r(2, 3, 10)
    model = make_model("LayerNormalization", {"x": x}, {"axis": -1}, opset=17, n_outputs=3,
                       initializers={"scale": _r(10), "bias": _r(10)})
    onnx_compare(model, {"x": x})


def test_layer_norm_refuses_other_stash_type():
    x = _r(2, 4)
    model = make_model("LayerNormalization", {"x": x}, {"stash_type": 11}, opset=17, initializers={"scale": _r(4)})
    with pytest.raises(UnsupportedOpError, match="stash_type=11"):
        from_onnx(model)


@pytest.mark.parametrize("shape", [(2, 3, 7), (1, 4, 5, 6), (2, 2, 3, 4, 5)])
def test_instance_norm(onnx_compare, shape):
    x = _r(*shape)
    model = make_model("InstanceNormalization", {"x": x}, {"epsilon": 1e-4}, opset=13,
                       initializers={"scale": _r(shape[1]), "bias": _r(shape[1])})
    onnx_compare(model, {"x": x})


@pytest.mark.parametrize("groups", [1, 2, 4])
def test_group_norm_opset21_per_channel(onnx_compare, groups):
    x = _r(2, 4, 5, 6)
    model = make_model("GroupNormalization", {"x": x}, {"num_groups": groups, "epsilon": 1e-4}, opset=21,
                       initializers={"scale": _r(4), "bias": _r(4)})
    onnx_compare(model, {"x": x})


def test_group_norm_opset18_per_group(onnx_compare):
    """opset 18 took scale/bias per group: compared with numpy (onnxruntime runs the opset 21 form)."""
    x, scale, bias = _r(2, 6, 4, 3), _r(3), _r(3)
    model = make_model("GroupNormalization", {"x": x}, {"num_groups": 3}, opset=18,
                       initializers={"scale": scale, "bias": bias})
    g = x.reshape(2, 3, -1).astype(np.float64)
    y = (g - g.mean(-1, keepdims=True)) / np.sqrt(g.var(-1, keepdims=True) + 1e-5)
    y = y * scale[None, :, None] + bias[None, :, None]
    onnx_compare(model, {"x": x}, expected=[y.reshape(x.shape).astype(np.float32)])


def test_group_norm_refuses_uneven_groups():
    x = _r(1, 6, 4)
    model = make_model("GroupNormalization", {"x": x}, {"num_groups": 4}, opset=21,
                       initializers={"scale": _r(6), "bias": _r(6)})
    with pytest.raises(UnsupportedOpError, match="num_groups=4"):
        from_onnx(model)


def test_decomposed_layer_norm(onnx_compare):
    """What torch.onnx writes for nn.LayerNorm without the fused op: ReduceMean, Sub, Pow, ReduceMean, Add, Sqrt,
    Div, Mul, Add."""
    x = _r(2, 6, 32)
    nodes = [
        helper.make_node("ReduceMean", ["x", "axes"], ["m"], keepdims=1),
        helper.make_node("Sub", ["x", "m"], ["d"]),
        helper.make_node("Pow", ["d", "two"], ["d2"]),
        helper.make_node("ReduceMean", ["d2", "axes"], ["v"], keepdims=1),
        helper.make_node("Add", ["v", "eps"], ["ve"]),
        helper.make_node("Sqrt", ["ve"], ["sd"]),
        helper.make_node("Div", ["d", "sd"], ["n"]),
        helper.make_node("Mul", ["n", "gamma"], ["s"]),
        helper.make_node("Add", ["s", "beta"], ["y"]),
    ]
    model = make_graph_model(nodes, {"x": x}, ["y"], {
        "axes": np.array([-1], np.int64), "two": np.array(2.0, np.float32), "eps": np.array(1e-5, np.float32),
        "gamma": _r(32), "beta": _r(32)}, opset=18)
    onnx_compare(model, {"x": x})
