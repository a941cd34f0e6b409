"""The op patterns PyTorch's two ONNX exporters write (TorchScript, opset 17; dynamo, opset 18+), as small models
of the same structure built with onnx.helper (no torch in CI; scripts/bench_pytorch.py runs the real torchvision
and nn.TransformerEncoder exports): a CNN whose global pooling is ReduceMean over H, W with keepdims (axes as an
input) and a squeeze-excitation block with HardSigmoid/HardSwish; opset-18 Split/Pad/Resize taking their
arguments as inputs; a transformer encoder layer as the dynamo exporter writes it (fused in-projection split by
Unsqueeze/Transpose/Squeeze/Gather, Reshape with allowzero, scaled Q and K, broadcasting MatMul, Where key-padding
mask, Softmax, Gemm with transB, LayerNormalization, Gelu or Erf-based GELU, Expand/Range). Each is compiled for
the host and compared with onnxruntime: max relative error (max |tether - ort| / max |ort|) <= 1e-4."""
import numpy as np
import pytest
from fixtures.onnx_struct_compare import erf_gelu_nodes, make_graph_model
from onnx import helper

RNG = np.random.default_rng(11)


def _w(*shape, scale=0.3):
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def _i64(*values):
    return np.array(values, np.int64)


def _check(onnx_compare, model, feeds):
    got, ref = onnx_compare(model, feeds, check=False)
    assert len(got) == len(ref)
    for g, r in zip(got, ref):
        r = np.asarray(r)
        assert g.dtype == r.dtype and g.shape == r.shape, (g.dtype, g.shape, r.dtype, r.shape)
        assert np.isfinite(r).all()
        rel = float(np.abs(g.astype(np.float64) - r).max() / max(np.abs(r).max(), 1e-30))
        assert rel <= 1e-4, rel


# ---------------------------------------------------------------- CNN: ReduceMean pooling + squeeze-excitation
@pytest.mark.parametrize("act", ["Clip", "HardSwish"])
def test_cnn_reducemean_pooling(onnx_compare, act):
    """mobilenet_v2/v3 and resnet18 from the dynamo exporter: adaptive average pooling is ReduceMean(axes=[-1,-2],
    keepdims=1), then Reshape to (1, C) and Gemm(transB=1); v3's SE block is ReduceMean -> Conv -> Relu -> Conv ->
    HardSigmoid -> Mul."""
    inits = {"w1": _w(16, 3, 3, 3), "b1": _w(16), "wd": _w(16, 1, 3, 3), "bd": _w(16),
             "ws1": _w(8, 16, 1, 1), "bs1": _w(8), "ws2": _w(16, 8, 1, 1), "bs2": _w(16),
             "hw": _i64(-1, -2), "flat": _i64(1, 16), "wf": _w(10, 16), "bf": _w(10),
             "lo": np.array(0, np.float32), "hi": np.array(6, np.float32)}

    def activation(x, y):
        if act == "Clip":
            return helper.make_node("Clip", [x, "lo", "hi"], [y])
        return helper.make_node("HardSwish", [x], [y])

    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], strides=[2, 2]),
             activation("c1", "a1"),
             helper.make_node("Conv", ["a1", "wd", "bd"], ["c2"], pads=[1, 1, 1, 1], group=16),
             activation("c2", "a2"),
             helper.make_node("ReduceMean", ["a2", "hw"], ["se0"], keepdims=1),
             helper.make_node("Conv", ["se0", "ws1", "bs1"], ["se1"]),
             helper.make_node("Relu", ["se1"], ["se2"]),
             helper.make_node("Conv", ["se2", "ws2", "bs2"], ["se3"]),
             helper.make_node("HardSigmoid", ["se3"], ["se4"], alpha=1 / 6, beta=0.5),
             helper.make_node("Mul", ["a2", "se4"], ["a3"]),
             helper.make_node("Add", ["a3", "a1"], ["res"]),
             helper.make_node("ReduceMean", ["res", "hw"], ["pool"], keepdims=1),
             helper.make_node("Reshape", ["pool", "flat"], ["f"], allowzero=1),
             helper.make_node("Gemm", ["f", "wf", "bf"], ["y"], transB=1)]
    x = RNG.uniform(0, 1, (1, 3, 32, 32)).astype(np.float32)
    _check(onnx_compare, make_graph_model(nodes, {"x": x}, ["y"], inits, opset=18), {"x": x})


# ---------------------------------------------------------------- opset 18: arguments as inputs
def test_opset18_split_pad_resize_inputs(onnx_compare):
    inits = {"split": _i64(2, 6), "pads": _i64(0, 1, 2, 0, 1, 2), "axes": _i64(1, 2, 3)[1:],
             "pads2": _i64(1, 2, 1, 2), "cval": np.array(0.5, np.float32),
             "scales": np.array([1, 1, 2, 2], np.float32), "sizes": _i64(1, 4, 7, 9)}
    inits["pad_axes"] = _i64(2, 3)
    nodes = [helper.make_node("Split", ["x", "split"], ["s0", "s1"], axis=1),
             helper.make_node("Split", ["x"], ["h0", "h1"], axis=1, num_outputs=2),
             helper.make_node("Pad", ["s0", "pads2", "cval", "pad_axes"], ["p0"], mode="constant"),
             helper.make_node("Pad", ["s1", "pads2", "", "pad_axes"], ["p1"], mode="reflect"),
             helper.make_node("Resize", ["h0", "", "scales"], ["r0"], mode="nearest"),
             helper.make_node("Resize", ["h1", "", "", "sizes"], ["r1"], mode="linear",
                              coordinate_transformation_mode="half_pixel")]
    x = RNG.standard_normal((1, 8, 5, 6)).astype(np.float32)
    model = make_graph_model(nodes, {"x": x}, ["p0", "p1", "r0", "r1"], inits, opset=18)
    _check(onnx_compare, model, {"x": x})


# ---------------------------------------------------------------- transformer encoder layer (dynamo exporter)
SEQ, D, HEADS, FF = 6, 16, 2, 32
DH = D // HEADS


def _encoder_layer(gelu: str, masked: bool):
    inits = {"w_in": _w(D, 3 * D), "b_in": _w(3 * D), "w_out": _w(D, D), "b_out": _w(D),
             "g1": 1 + _w(D), "be1": _w(D), "g2": 1 + _w(D), "be2": _w(D),
             "w1": _w(D, FF), "b1": _w(FF), "w2": _w(FF, D), "b2": _w(D),
             "qkv_shape": _i64(SEQ, 1, 3, D), "ax0": _i64(0), "ax3": _i64(-2),
             "i0": np.array(0, np.int64), "i1": np.array(1, np.int64), "i2": np.array(2, np.int64),
             "heads": _i64(SEQ, HEADS, DH), "bh": _i64(1, HEADS, SEQ, DH), "kt": _i64(1, HEADS, DH, SEQ),
             "scale": np.array([DH ** -0.25], np.float32), "merge": _i64(SEQ, D), "back": _i64(SEQ, 1, D),
             "neg": np.array(-np.inf, np.float32), "zero": np.array(0, np.float32),
             "start": np.array(0, np.int64), "delta": np.array(1, np.int64), "seq": np.array(SEQ, np.int64),
             "mshape": _i64(1, HEADS, SEQ, SEQ), "half": np.array(0.5, np.float32),
             "one": np.array(1, np.float32), "rsqrt2": np.array(1 / np.sqrt(2), np.float32)}
    nodes = [helper.make_node("Transpose", ["x"], ["xt"], perm=[1, 0, 2]),             # (SEQ, 1, D)
             helper.make_node("MatMul", ["xt", "w_in"], ["qkv0"]),
             helper.make_node("Add", ["qkv0", "b_in"], ["qkv1"]),
             helper.make_node("Reshape", ["qkv1", "qkv_shape"], ["qkv2"], allowzero=1),
             helper.make_node("Unsqueeze", ["qkv2", "ax0"], ["qkv3"]),
             helper.make_node("Transpose", ["qkv3"], ["qkv4"], perm=[3, 1, 2, 0, 4]),
             helper.make_node("Squeeze", ["qkv4", "ax3"], ["qkv5"])]                  # (3, SEQ, 1, D)
    for n, idx in (("q", "i0"), ("k", "i1"), ("v", "i2")):
        nodes += [helper.make_node("Gather", ["qkv5", idx], [n + "0"], axis=0),
                  helper.make_node("Reshape", [n + "0", "heads"], [n + "1"], allowzero=1),
                  helper.make_node("Transpose", [n + "1"], [n + "2"], perm=[1, 0, 2])]   # (HEADS, SEQ, DH)
    nodes += [helper.make_node("Reshape", ["q2", "bh"], ["q3"], allowzero=1),
              helper.make_node("Reshape", ["v2", "bh"], ["v3"], allowzero=1),
              helper.make_node("Transpose", ["k2"], ["k3"], perm=[0, 2, 1]),
              helper.make_node("Reshape", ["k3", "kt"], ["k4"]),
              helper.make_node("Mul", ["q3", "scale"], ["qs"]),
              helper.make_node("Mul", ["k4", "scale"], ["ks"]),
              helper.make_node("MatMul", ["qs", "ks"], ["scores"])]
    feeds = {"x": RNG.standard_normal((1, SEQ, D)).astype(np.float32)}
    scores = "scores"
    if masked:
        # key padding mask: keys at positions >= valid are masked with -inf (Range/Less/Expand, as torch writes it)
        feeds["valid"] = np.array([SEQ - 2], np.int64)
        nodes += [helper.make_node("Range", ["start", "seq", "delta"], ["pos"]),
                  helper.make_node("Less", ["pos", "valid"], ["keep0"]),
                  helper.make_node("Not", ["keep0"], ["pad0"]),
                  helper.make_node("Expand", ["pad0", "mshape"], ["pad"]),
                  helper.make_node("Where", ["pad", "neg", "scores"], ["scores_m"])]
        scores = "scores_m"
    nodes += [helper.make_node("Softmax", [scores], ["attn"], axis=-1),
              helper.make_node("MatMul", ["attn", "v3"], ["ctx"]),                       # (1, HEADS, SEQ, DH)
              helper.make_node("Transpose", ["ctx"], ["ctx1"], perm=[2, 0, 1, 3]),
              helper.make_node("Reshape", ["ctx1", "merge"], ["ctx2"], allowzero=1),
              helper.make_node("Gemm", ["ctx2", "w_out_t", "b_out"], ["o0"], transB=1),
              helper.make_node("Reshape", ["o0", "back"], ["o1"], allowzero=1),
              helper.make_node("Transpose", ["o1"], ["o2"], perm=[1, 0, 2]),
              helper.make_node("Add", ["x", "o2"], ["r1"]),
              helper.make_node("LayerNormalization", ["r1", "g1", "be1"], ["h1"], axis=-1, epsilon=1e-5,
                               stash_type=1),
              helper.make_node("MatMul", ["h1", "w1"], ["f0"]),
              helper.make_node("Add", ["f0", "b1"], ["f1"])]
    inits["w_out_t"] = np.ascontiguousarray(inits.pop("w_out").T)
    if gelu == "op":
        nodes.append(helper.make_node("Gelu", ["f1"], ["f2"], approximate="none"))
    else:   # the TorchScript exporter's decomposition: x * 0.5 * (1 + erf(x / sqrt(2)))
        nodes += [helper.make_node("Mul", ["f1", "rsqrt2"], ["e0"]), *erf_gelu_nodes("f1", "e0", "f2")]
    nodes += [helper.make_node("MatMul", ["f2", "w2"], ["f3"]),
              helper.make_node("Add", ["f3", "b2"], ["f4"]),
              helper.make_node("Add", ["h1", "f4"], ["r2"]),
              helper.make_node("LayerNormalization", ["r2", "g2", "be2"], ["y"], axis=-1, epsilon=1e-5)]
    opset = 20 if gelu == "op" else 18
    return make_graph_model(nodes, feeds, ["y"], inits, opset=opset), feeds


@pytest.mark.parametrize("gelu, masked", [("op", False), ("erf", False), ("op", True)])
def test_transformer_encoder_layer_dynamo_pattern(onnx_compare, gelu, masked):
    model, feeds = _encoder_layer(gelu, masked)
    _check(onnx_compare, model, feeds)
