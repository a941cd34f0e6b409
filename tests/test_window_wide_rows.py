"""Depthwise convs whose output width has no divisor near a vector compute whole 16-column blocks and copy the
valid columns out (ops.conv.window_columns), and 5x5 windows on AVX-512 accumulate a block of output rows
(ops/schedules.py _window_rows): results against numpy on this host, with and without a fused epilogue,
and the lowered loop nest of an AVX-512 CPU named explicitly shows the whole blocks (no scalar tail inside the
window)."""
import numpy as np
import pytest

import tether
from fixtures.host_cpu import AVX512_TARGET
from tether import ops, te
from tether.ops import schedules
from tether.ops.conv import window_columns
from tether.target import Target
from test_window_channel_pads import _dw_ref


def _depthwise_inputs(rng, shape, k, mult=1):
    """(array, placeholder) pairs of a depthwise conv's input, weight (channel multiplier ``mult``) and bias."""
    arrays = [rng.standard_normal(shape), rng.standard_normal((shape[1] * mult, 1, k, k)),
              rng.standard_normal(shape[1] * mult)]
    return [(a.astype("float32"), te.placeholder(a.shape, "float32", name=n)) for a, n in zip(arrays, "XWB")]


def _hard_swish(v):
    return v * np.clip(v + 3.0, 0.0, 6.0) / 6.0


@pytest.mark.parametrize("ow,wide", [(38, 48), (76, 80), (19, 32), (56, 56), (28, 28), (48, 48), (13, 13),
                                     (50, 50), (16, 16), (17, 32)])
def test_window_columns(ow, wide):
    assert window_columns(ow) == wide


# picodet's widths (38, 76, 19: 608 over strides 16, 8, 32), strides 1 and 2, 3x3 and 5x5, a dilation, channel
# multiplier 2, and a height with no small divisor (row blocks of 1)
@pytest.mark.parametrize("shape,k,stride,pad,dilation,mult", [((1, 8, 50, 38), 5, 1, 2, 1, 1),
                                                               ((1, 4, 20, 76), 5, 1, 2, 1, 1),
                                                               ((1, 6, 25, 19), 5, 1, 2, 1, 1),
                                                               ((1, 5, 23, 38), 3, 1, 1, 1, 1),
                                                               ((1, 4, 40, 76), 5, 2, 2, 1, 1),
                                                               ((1, 3, 12, 41), 5, 1, 4, 2, 1),
                                                               ((2, 3, 10, 38), 5, 1, 2, 1, 2),
                                                               ((1, 4, 17, 38), 5, 1, 2, 1, 1)])
def test_wide_depthwise_matches_numpy(run_ops, rng, shape, k, stride, pad, dilation, mult):
    (x, X), (w, W), (bias, B) = _depthwise_inputs(rng, shape, k, mult)
    plain = ops.depthwise_conv2d(X, W, stride, pad, dilation)
    fused = ops.hard_swish(ops.depthwise_conv2d(X, W, stride, pad, dilation, bias=B))
    got_plain, = run_ops([(X, x), (W, w)], [plain])
    got_fused, = run_ops([(X, x), (W, w), (B, bias)], [fused])
    xr = np.repeat(x, mult, axis=1) if mult > 1 else x
    ref = _dw_ref(xr, w, stride, pad, dilation)
    assert got_plain.shape == ref.shape
    np.testing.assert_allclose(got_plain, ref, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got_fused, _hard_swish(ref + bias[None, :, None, None]), rtol=1e-4, atol=1e-4)


def test_wide_block_has_no_scalar_tail_in_the_window():
    """38 columns: blocks of 16 over 48 computed columns; only the write-back of the last block is clamped."""
    X = te.placeholder((1, 8, 50, 38), "float32", name="X")
    W = te.placeholder((8, 1, 5, 5), "float32", name="W")
    out = ops.depthwise_conv2d(X, W, 1, 2)
    text = str(tether.lower(ops.schedule(out, target=AVX512_TARGET), [X, W, out]))
    accumulate = [ln for ln in text.splitlines() if "_wide[" in ln and "+" in ln and "W[" in ln]
    assert accumulate, text
    # every accumulating loop is a whole vector: no min(...) extent around the window's taps
    lines = text.splitlines()
    for i, ln in enumerate(lines):
        if ln in accumulate:
            loop = lines[i - 1]
            assert "vectorized" in loop and "min(" not in loop, loop


def test_five_by_five_accumulates_a_block_of_rows():
    fam = schedules.family_of(Target(AVX512_TARGET))
    X = te.placeholder((1, 8, 50, 48), "float32", name="X")
    W5 = te.placeholder((8, 1, 5, 5), "float32", name="W")
    W3 = te.placeholder((8, 1, 3, 3), "float32", name="W")
    five = ops.depthwise_conv2d(X, W5, 1, 2)
    three = ops.depthwise_conv2d(X, W3, 1, 1)
    assert schedules._window_rows(fam, five, 16) == 5        # 50 rows: blocks of 5 (x 1 vector)
    assert schedules._window_rows(fam, five, 32) == 2        # 2 vectors: at most 3 rows -> 2 divides 50
    assert schedules._window_rows(fam, three, 16) == 1
    arm = schedules.family_of(Target("rasp4b"))
    assert schedules._window_rows(arm, five, 16) == 1        # measured on AVX-512 only


# channels whose column phases exceed schedules._CHANNEL_PAD_BYTES (64 KB), whole passes above 1 MB: made per chunk
# of output rows
@pytest.mark.parametrize("shape,k,stride,pad", [((1, 4, 400, 304), 3, 2, 1), ((1, 12, 201, 150), 5, 2, 2),
                                                ((1, 8, 150, 250), 3, 3, 1)])
def test_large_strided_channel_makes_its_phases_per_row_chunk(run_ops, rng, shape, k, stride, pad):
    (x, X), (w, W), (bias, B) = _depthwise_inputs(rng, shape, k)
    fused = ops.hard_swish(ops.depthwise_conv2d(X, W, stride, pad, bias=B))
    text = str(tether.lower(ops.schedule(fused, target=AVX512_TARGET), [X, W, B, fused]))
    lines = text.splitlines()
    alloc = next(i for i, ln in enumerate(lines) if "allocate" in ln and "_phases" in ln)
    loops = [ln for ln in lines[:alloc] if ln.lstrip().startswith("for ")]
    assert len(loops) >= 2, text          # inside the channel loop and a loop over row chunks
    size = int(lines[alloc].split("[")[1].split("]")[0])
    assert 4 * size <= schedules._CHANNEL_PAD_BYTES
    got, = run_ops([(X, x), (W, w), (B, bias)], [fused])
    ref = _dw_ref(x, w, stride, pad, 1)
    np.testing.assert_allclose(got, _hard_swish(ref + bias[None, :, None, None]), rtol=1e-4, atol=1e-4)
