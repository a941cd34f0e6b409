"""The int8 conv kernels' register blocks on x86 AVX-512 (ops/qschedules.py): the pixel form's blocks of 4..8
output pixels x 1..4 channel panels (and its fallback when no count from 4 to 8 divides the pixels), the matmul
form's pixels padded to two vectors with the requantize fused into each block (a vector tail, and a tail that is
not a vector, written back one vector at a time), each bit for bit onnxruntime's QLinearConv: odd channel counts,
strides 2, asymmetric pads, dilation, uint8 and int8 activations."""
import numpy as np
import pytest
from test_int8_kernels import _ops, _qlinearconv

from tether.ops import qconv as qops
from tether.ops import qschedules
from tether.ops.schedules import family_of
from tether.target import Target

# name: ((C, O, H, W, kernel, attrs, activations, per_channel, weights), the pixel form's (pixels, panels) on the
# host, None for the matmul form)
CASES = {
    "pixel_4x4_odd_channels": ((21, 64, 8, 8, 3, {"pads": [1, 1, 1, 1]}, "uint8", True, "int8"), (4, 4)),
    "pixel_4x3": ((12, 48, 6, 6, 3, {"pads": [1, 1, 1, 1]}, "uint8", True, "int8"), (4, 3)),
    "pixel_5x2_stride2_asym_pads": ((9, 32, 10, 11, 3, {"pads": [0, 1, 1, 0], "strides": [2, 2]}, "uint8", False,
                                     "int8"), (5, 2)),
    "pixel_7x3_dilated": ((17, 96, 7, 7, 3, {"pads": [2, 2, 2, 2], "dilations": [2, 2]}, "uint8", True, "int8"),
                          (7, 3)),
    "pixel_4x1_five_panels_int8_acts": ((10, 70, 4, 4, 3, {"pads": [1, 1, 1, 1]}, "int8", True, "int8"), (4, 1)),
    "pixel_1x1_stride2": ((37, 64, 12, 12, 1, {"strides": [2, 2]}, "uint8", True, "int8"), (4, 4)),
    "pixel_fallback_9_pixels": ((6, 33, 5, 5, 3, {}, "uint8", True, "int8"), (12, 1)),
    "matmul_7x7_tail_not_a_vector": ((45, 40, 7, 7, 1, {}, "uint8", True, "int8"), None),
    "matmul_14x14_vector_tail": ((24, 50, 14, 14, 1, {}, "uint8", True, "int8"), None),
    "matmul_28x28": ((16, 24, 28, 28, 1, {}, "int8", False, "int8"), None),
    "matmul_5x5_int8_acts": ((8, 16, 5, 5, 1, {}, "int8", True, "int8"), None),
    "matmul_4x5_uint8_weights": ((11, 19, 4, 5, 1, {}, "uint8", False, "uint8"), None),
}


def _out_pixels(c, o, h, w, k, attrs, *_):
    s = attrs.get("strides", [1, 1])
    d = attrs.get("dilations", [1, 1])
    p = attrs.get("pads", [0, 0, 0, 0])
    oh = (h + p[0] + p[2] - (d[0] * (k - 1) + 1)) // s[0] + 1
    ow = (w + p[1] + p[3] - (d[1] * (k - 1) + 1)) // s[1] + 1
    return oh * ow


@pytest.mark.parametrize("case", sorted(CASES))
def test_block_bit_exact(onnx_compare, case):
    shape, block = CASES[case]
    if block is not None:
        # the case takes the block it is named for (the host preset's CPU has AVX-512)
        fam = family_of(Target("host"))
        got = qschedules._pixel_block(fam, _out_pixels(*shape), -(-shape[1] // qops.PANEL) * qops.PANEL, qops.PANEL)
        assert got == block, got
    model, x = _qlinearconv(*shape)
    assert "qconv2d" in _ops(model)
    onnx_compare(model, {"x": x}, rtol=0, atol=0)


def test_matmul_form_pads_pixels_to_two_vectors():
    for npix, padded in ((49, 64), (196, 224), (784, 800), (3136, 3136), (20, 32)):
        x = qops.te.placeholder((8, npix), "uint8", name="x")
        wq = qops.te.placeholder((8, 2), "int32", name="w")
        bias = qops.te.placeholder((8,), "int32", name="b")
        out = qops.qconv2d(x, wq, bias, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 8, 0)
        (mm,) = [t for t in out.op.input_tensors if t.op.name.endswith("_mm")]
        assert int(mm.shape[-1]) == padded, (npix, mm.shape)


# ---- the requantize's rounding: tir round_even (codegen/mathlib), one instruction where the target rounds
# natively (the host), the add-and-remove of 2**mant elsewhere (the generic x86_64 preset, as armv7)
_TIES = np.concatenate([np.arange(-600, 600) * 0.5, np.random.default_rng(5).uniform(-3e4, 3e4, 600),
                        [0.0, -0.0, -0.4, 0.49999997, -0.49999997, 8388607.5, -8388607.5, 8388608.0, 8388609.0,
                         16777215.0, 1e10, -1e10, np.inf, -np.inf, np.nan]])


@pytest.mark.parametrize("preset,tname", [("host", t) for t in ("f32", "v16f32", "v4f32", "f64")]
                         + [("x86_64", t) for t in ("f32", "v4f32", "f64")])   # (no 512-bit vectors there)
def test_round_even_against_numpy(tmp_path, host_linker, preset, tname):
    from fixtures.backend import PackedCaller, math_kernel
    from llvmlite import ir

    from tether.codegen.module import ModuleBuilder
    from tether.driver import build_ir

    f32, f64 = ir.FloatType(), ir.DoubleType()
    ty = {"f32": f32, "v16f32": ir.VectorType(f32, 16), "v4f32": ir.VectorType(f32, 4), "f64": f64}[tname]
    n = 2048
    mb = ModuleBuilder(preset, "roundtest")
    impl, kf = math_kernel(mb, "round_even_k", "round_even", n, ty)
    mb.add_packed(kf, impl)
    module = build_ir(mb)
    lib = __import__("ctypes").CDLL(module.export_library(str(tmp_path / "round.so")))
    dtype = np.float64 if tname == "f64" else np.float32
    x = np.concatenate([_TIES, np.ones(n - _TIES.size)]).astype(dtype)
    out = np.full(n, -12345.0, dtype)
    assert PackedCaller(lib, "round_even_k")([x, out]) == 0
    want = np.rint(x)
    np.testing.assert_array_equal(out, want)
    keep = ~np.isnan(x)
    np.testing.assert_array_equal(np.signbit(out[keep]), np.signbit(want[keep]))
    assert module.target.native_rounding == (preset == "host")
