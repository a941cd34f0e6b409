"""conv2d_pixels' one-pixel larger block (ops/schedules.py pixel_block): a 416 x 416 detector's maps of
13 * 2**k pixels on a side take blocks of 13 on x86 AVX-512, and those convs (with a SiLU prologue, as YOLOX
runs them) still match onnxruntime at 1 and 2 threads."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import tether
from tether import graph_executor
from tether.frontend import from_onnx
from tether.ops.schedules import Family, family_of, pixel_block
from tether.target import as_target
from tether.testing.model_kinds import relative_error
from tether_rpc import parallel

AVX512 = Family("x86", 16, mm_rows=6, acc_regs=24, max_col_vectors=2, conv_pixels=12)


def test_maps_that_13_divides_take_blocks_of_13():
    assert pixel_block(AVX512, 52 * 52) == 13      # 225 blocks of 12 and one of 4 -> 208 of 13
    assert pixel_block(AVX512, 26 * 26) == 13      # 56 of 12 and one of 4 -> 52 of 13
    assert pixel_block(AVX512, 104 * 104) == 13
    assert pixel_block(AVX512, 13 * 13) == 12      # 13 blocks: measured 1.4x slower with 13
    assert pixel_block(AVX512, 156) == 12          # 12 divides it: no tail to remove


def test_other_maps_keep_their_block():
    for side in (112, 56, 28, 14, 7, 320, 160, 80, 40, 20):     # the zoo CNNs', YOLOv8-640's
        assert pixel_block(AVX512, side * side) == 12, side
    assert pixel_block(AVX512, 320) == 10          # the near-smaller block (4 x 80) still comes first
    avx2 = Family("x86", 8, mm_rows=6, acc_regs=12, max_col_vectors=2, conv_pixels=4)
    assert pixel_block(avx2, 52 * 52) == 4
    neon = Family("aarch64", 4, mm_rows=6, acc_regs=24, max_col_vectors=4)
    assert pixel_block(neon, 52 * 52) == 6


def test_the_host_family_grows_only_on_avx512():
    fam = family_of(as_target("host"))
    rows = fam.conv_pixels or fam.mm_rows
    avx512 = fam.name == "x86" and fam.lanes >= 16
    assert pixel_block(fam, 52 * 52) == (13 if avx512 and rows == 12 else rows)


def _silu_conv(cin: int, cout: int, side: int, k: int, stride: int, seed: int):
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((cout, cin, k, k)) / np.sqrt(cin * k * k)).astype(np.float32)
    b = rng.standard_normal(cout).astype(np.float32)
    nodes = [helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Mul", ["x", "s"], ["a"]),
             helper.make_node("Conv", ["a", "w", "b"], ["c"], kernel_shape=[k, k], pads=[k // 2] * 4,
                              strides=[stride, stride]),
             helper.make_node("Sigmoid", ["c"], ["cs"]), helper.make_node("Mul", ["c", "cs"], ["y"])]
    g = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, cin, side, side))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    return model, {"x": rng.standard_normal((1, cin, side, side)).astype(np.float32)}


@pytest.mark.parametrize("cin,cout,side,k,stride", [
    (16, 48, 52, 3, 1),      # 2704 pixels: blocks of 13
    (24, 40, 26, 3, 1),      # 676 pixels, a partial channel panel
    (8, 32, 52, 3, 2),       # 26 x 26 out of a stride-2 conv
    (32, 16, 26, 1, 1),      # pointwise on a 13-divisible map
    (16, 32, 13, 3, 1),      # 169 pixels: keeps 12 and its tail
])
def test_convs_on_13_divisible_maps_match_onnxruntime(cin, cout, side, k, stride, tmp_path):
    model, feeds = _silu_conv(cin, cout, side, k, stride, seed=cin * side + k)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    graph, params = from_onnx(model)
    tether.build_graph(graph, params, target="host", opt_level=3).export(str(tmp_path))
    gm = graph_executor.load(str(tmp_path))
    try:
        for threads in (1, 2):
            parallel.set_num_threads(threads)
            gm.run(**feeds)
            got = gm.get_output(0)
            assert got.shape == ref[0].shape
            assert relative_error(got, ref[0]) <= 1e-5, (threads, relative_error(got, ref[0]))
    finally:
        parallel.set_num_threads(1)


def test_yolox_at_416_matches_onnxruntime(tmp_path):
    """The model the rule is for, at its real input size (its 208/104/52/26 maps take blocks of 13 here)."""
    from tether.testing.model_kinds import KINDS
    model, feeds = KINDS["yolox_detector"]("bench")
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    graph, params = from_onnx(model)
    tether.build_graph(graph, params, target="host", opt_level=3).export(str(tmp_path))
    gm = graph_executor.load(str(tmp_path))
    gm.run(**feeds)
    for i, r in enumerate(ref):
        assert relative_error(gm.get_output(i), r) <= 1e-4, (i, relative_error(gm.get_output(i), r))
