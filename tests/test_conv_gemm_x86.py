"""The x86 AVX-512 conv-as-GEMM choices (graph/conv_gemm.py): every pointwise conv as conv2d_pixels, 32-wide weight
panels, and the in-place matmul for pointwise convs with few input channels on large maps; other targets keep
their 16-wide panels and the 64-channel pointwise bound. The choices are checked per target without running
(pack_conv_weights' layouts), and one-conv models taking each path are compiled for the host and compared with
onnxruntime (max relative error <= 1e-4; on an AVX-512 host these are the new kernels)."""
import numpy as np
import pytest
from fixtures.onnx_struct_compare import make_graph_model
from onnx import helper

from tether.frontend import from_onnx
from tether.graph import conv_gemm
from tether.graph.plan import prepare_graph
from tether.target import Target

AVX512 = Target("x86_64-linux-gnu -mattr=+avx2,+fma,+avx512f")
AVX2 = Target("x86_64-linux-gnu -mattr=+avx2,+fma")
ARM = Target("rasp4b")
RNG = np.random.default_rng(5)


def _conv_model(ic, oc, hw, k=1, stride=1, act="Relu"):
    pad = k // 2
    w = (RNG.standard_normal((oc, ic, k, k)) / np.sqrt(ic * k * k)).astype(np.float32)
    b = (RNG.standard_normal(oc) * 0.1).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], strides=[stride] * 2, pads=[pad] * 4),
             helper.make_node(act, ["c"], ["y"]) if act != "Clip" else
             helper.make_node("Clip", ["c", "lo", "hi"], ["y"])]
    inits = {"w": w, "b": b}
    if act == "Clip":
        inits.update(lo=np.array(0, np.float32), hi=np.array(6, np.float32))
    return make_graph_model(nodes, {"x": np.zeros((1, ic, hw, hw), np.float32)}, ["y"], inits)


def _packed(model, target):
    graph, params = from_onnx(model)
    _, params, panel_weights = prepare_graph(graph, params, 3, target)
    (wname,) = panel_weights or [None]
    return None if wname is None else params[wname].shape


def test_choices_per_target():
    assert conv_gemm.pointwise_pixels_max(AVX512) is None
    for t in (AVX2, ARM, None):
        assert conv_gemm.pointwise_pixels_max(t) == conv_gemm.POINTWISE_PIXELS_MAX_CHANNELS
        assert conv_gemm.panel_width(t, 64, 1) == 16
        assert not conv_gemm.pointwise_direct(t, 16, 112 * 112)
    # 32 wide unless that pads the channels more than 16-wide panels plus 1/16, or the conv is grouped
    assert [conv_gemm.panel_width(AVX512, oc, 1) for oc in (24, 48, 64, 144, 1000)] == [32, 16, 32, 16, 32]
    assert conv_gemm.panel_width(AVX512, 64, 2) == 16
    assert conv_gemm.pointwise_direct(AVX512, 16, 112 * 112)
    assert conv_gemm.pointwise_direct(AVX512, 256, 56 * 56)           # whole 32-pixel column blocks
    assert not conv_gemm.pointwise_direct(AVX512, 512, 56 * 56)       # a long reduction: conv2d_pixels
    assert not conv_gemm.pointwise_direct(AVX512, 64, 55 * 55)        # a partial column block
    assert not conv_gemm.pointwise_direct(AVX512, 16, 28 * 28)        # a small map: conv2d_pixels


@pytest.mark.parametrize("ic, oc, hw, k, avx512, other", [
    (16, 96, 64, 1, (96, 16), None),                 # in place: the weight stays (oc, ic); elsewhere a matmul
    (96, 160, 7, 1, (5, 96, 32), None),              # pointwise as conv2d_pixels, 32-wide panels
    (32, 48, 14, 3, (3, 288, 16), (3, 288, 16)),     # 48 channels: 16-wide panels everywhere
    (32, 64, 14, 3, (2, 288, 32), (4, 288, 16)),
])
def test_weight_layout_per_target(ic, oc, hw, k, avx512, other):
    model = _conv_model(ic, oc, hw, k)
    assert _packed(model, AVX512) == avx512
    assert _packed(model, AVX2) == other
    assert _packed(model, ARM) == other


@pytest.mark.parametrize("ic, oc, hw, k, stride, act", [
    (16, 96, 64, 1, 1, "Clip"),       # in-place matmul (AVX-512 host)
    (24, 40, 48, 1, 1, "Relu"),       # in place, a partial 12-row block of channels
    (96, 160, 7, 1, 1, "Relu"),       # pointwise conv2d_pixels, 32-wide panels, 49 pixels (a partial block)
    (160, 72, 7, 1, 1, "Clip"),       # 16-wide panels, vector write-back (reduction 160)
    (32, 64, 14, 3, 1, "Relu"),       # 3x3, reduction 288: vector write-back
    (8, 64, 15, 3, 2, "Relu"),        # 3x3 stride 2, reduction 72: unrolled write-back
])
def test_conv_matches_onnxruntime(onnx_compare, ic, oc, hw, k, stride, act):
    model = _conv_model(ic, oc, hw, k, stride, act)
    x = RNG.uniform(-1, 1, (1, ic, hw, hw)).astype(np.float32)
    got, ref = onnx_compare(model, {"x": x}, check=False)
    rel = float(np.abs(got[0].astype(np.float64) - ref[0]).max() / np.abs(ref[0]).max())
    assert got[0].shape == ref[0].shape and rel <= 1e-4, rel
