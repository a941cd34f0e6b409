"""AVX-512: pointwise convs on maps of at least 400 pixels that end in a partial 32-pixel block run as the
in-place matmul (its last column tile shifted back to whole vectors) when they have 16+ output channels and no
more input channels than 5/4 of the pixels, at most 512 (graph/conv_gemm.py pointwise_direct_partial). The
choice per target and shape (the weight layout pack_conv_weights leaves), and one-conv models taking the path
compiled for the host and compared with onnxruntime (max relative error <= 1e-4)."""
import numpy as np
import pytest
from fixtures.onnx_struct_compare import make_graph_model
from onnx import helper

from test_conv_gemm_x86 import AVX2, AVX512, _packed

from tether.graph import conv_gemm

RNG = np.random.default_rng(11)


def _pointwise_model(ic, oc, h, w, act="HardSwish"):
    wt = (RNG.standard_normal((oc, ic, 1, 1)) / np.sqrt(ic)).astype(np.float32)
    b = (RNG.standard_normal(oc) * 0.1).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"]), helper.make_node(act, ["c"], ["y"])]
    return make_graph_model(nodes, {"x": np.zeros((1, ic, h, w), np.float32)}, ["y"], {"w": wt, "b": b})


def test_rule():
    # picodet's maps: 50x38 = 1900 and 100x76 = 7600 pixels, neither whole 32-pixel blocks
    assert conv_gemm.pointwise_direct(AVX512, 256, 50 * 38, 256)
    assert conv_gemm.pointwise_direct(AVX512, 128, 100 * 76, 37)
    assert conv_gemm.pointwise_direct(AVX512, 512, 25 * 19, 512)
    assert not conv_gemm.pointwise_direct(AVX512, 600, 50 * 38, 256)     # a long reduction
    assert not conv_gemm.pointwise_direct(AVX512, 512, 20 * 20, 512)     # much longer than the map
    assert not conv_gemm.pointwise_direct(AVX512, 128, 55 * 55, 8)       # few output channels
    assert not conv_gemm.pointwise_direct(AVX512, 64, 14 * 14, 64)       # a small map
    assert not conv_gemm.pointwise_direct(AVX512, 128, 50 * 38)          # output channels not given
    assert not conv_gemm.pointwise_direct(AVX2, 128, 100 * 76, 128)
    assert not conv_gemm.pointwise_direct(None, 128, 100 * 76, 128)


@pytest.mark.parametrize("ic, oc, h, w, direct", [(128, 37, 50, 38, True), (64, 48, 40, 39, True),
                                                  (128, 16, 55, 55, True), (128, 8, 50, 38, False),
                                                  (600, 64, 50, 38, False), (64, 64, 14, 14, False)])
def test_weight_layout(ic, oc, h, w, direct):
    shape = _packed(_pointwise_model(ic, oc, h, w), AVX512)
    assert (shape == (oc, ic)) == direct, shape          # the in-place matmul keeps the weight (oc, ic)
    assert _packed(_pointwise_model(ic, oc, h, w), AVX2) != (oc, ic)


@pytest.mark.parametrize("ic, oc, h, w, act", [(128, 37, 50, 38, "HardSwish"), (64, 48, 40, 39, "Relu"),
                                               (256, 40, 41, 41, "HardSwish"), (512, 64, 25, 21, "Relu"),
                                               (32, 16, 20, 21, "Relu")])
def test_matches_onnxruntime(onnx_compare, ic, oc, h, w, act):
    model = _pointwise_model(ic, oc, h, w, act)
    x = RNG.uniform(-1, 1, (1, ic, h, w)).astype(np.float32)
    got, ref = onnx_compare(model, {"x": x}, check=False)
    rel = float(np.abs(got[0].astype(np.float64) - ref[0]).max() / np.abs(ref[0]).max())
    assert got[0].shape == ref[0].shape and rel <= 1e-4, rel
