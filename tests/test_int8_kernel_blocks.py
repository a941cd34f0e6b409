"""The int8 conv kernels' register blocks on x86 AVX-512 (ops/qschedules.py): the pixel form's blocks of 4..8
output pixels x 1..4 channel panels (and its fallback when no count from 4 to 8 divides the pixels), the matmul
form's pixels padded to two vectors with the requantize fused into each block (a vector tail, and a tail that is
not a vector, written back one vector at a time), each bit for bit onnxruntime's QLinearConv: odd channel counts,
strides 2, asymmetric pads, dilation, uint8 and int8 activations."""
import re

import pytest
from fixtures.host_cpu import AVX512_TARGET
from test_int8_kernels import _ops, _qlinearconv

from tether.ops import qconv as qops
from tether.ops import qschedules
from tether.ops.schedules import family_of, schedule
from tether.target import Target

# name: ((C, O, H, W, kernel, attrs, activations, per_channel, weights), the pixel form's (pixels, panels) on
# AVX512_TARGET, None for the matmul form)
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
        # on an AVX-512 CPU the case takes the block it is named for; the host (with or without AVX-512) runs it
        fam = family_of(Target(AVX512_TARGET))
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


@pytest.mark.parametrize("order", ["pixels", "panels"])
def test_the_pixel_form_takes_the_conv_order_knob(order):
    """conv_order picks the int8 pixel form's outer loop as it does conv2d_pixels': the pixel blocks (the
    weights streamed once per block) or the channel panels (the input once per panel)."""
    import tether

    x = qops.te.placeholder((1, 64, 14, 14), "uint8", name="x")
    wq = qops.te.placeholder((8, 9 * 16, qops.PANEL), "int32", name="w")
    bias = qops.te.placeholder((128,), "int32", name="b")
    out = qops.qconv2d(x, wq, bias, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 128, 0)
    text = str(tether.lower(schedule([out], target=AVX512_TARGET, config={"conv_order": order}),
                            [x, wq, bias, out], "q"))
    loops = re.findall(r"for (\S+) in range\((\d+)\)", text)
    (block,) = [k for k, (var, _) in enumerate(loops) if var == "rc"][:1]
    outer = [var for var, _ in loops[:block] if var.startswith(("p.", "o."))]
    assert outer and outer[0].startswith("p." if order == "pixels" else "o."), text
