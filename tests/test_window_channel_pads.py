"""Strided depthwise convs and pools on AVX-512 make their column-phase split per channel, inside the channel
loop (ops/schedules.py _channel_pads), instead of as a pass over the whole input; results against numpy on this
host, and the lowered loop nest of an AVX-512 CPU named explicitly shows where the split is made (ARM presets keep
the whole-input pass), whatever CPU runs the tests."""
import numpy as np
import pytest

import tether
from fixtures.host_cpu import AVX512_TARGET
from tether import ops, te


def _dw_ref(x, w, stride, pad, dilation):
    c, kh, kw = w.shape[0], w.shape[2], w.shape[3]
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad))).astype(np.float64)
    oh = (xp.shape[2] - (kh - 1) * dilation - 1) // stride + 1
    ow = (xp.shape[3] - (kw - 1) * dilation - 1) // stride + 1
    out = np.zeros((x.shape[0], c, oh, ow))
    for ky in range(kh):
        for kx in range(kw):
            patch = xp[:, :, ky * dilation: ky * dilation + (oh - 1) * stride + 1: stride,
                       kx * dilation: kx * dilation + (ow - 1) * stride + 1: stride]
            out += patch * w[None, :, 0, ky, kx][..., None, None]
    return out


def _phases_inside_channel_loop(out, args, target) -> bool:
    """True when the column-phase buffer is allocated inside the kernel's (parallel) channel loop."""
    lines = str(tether.lower(ops.schedule(out, target=target), args)).splitlines()
    alloc = next(i for i, ln in enumerate(lines) if "allocate" in ln and "_phases" in ln)
    loop = next(i for i, ln in enumerate(lines) if ln.lstrip().startswith("for "))
    return loop < alloc


# whole phase tensors above schedules._WHOLE_PASS_BYTES (1 MB), so the per-channel form is the one run
@pytest.mark.parametrize("shape,k,stride,pad,dilation", [((1, 64, 80, 80), 3, 2, 1, 1),
                                                          ((2, 24, 90, 89), 5, 2, 2, 1),
                                                          ((1, 40, 100, 99), 3, 2, 2, 2),
                                                          ((1, 48, 96, 96), 3, 3, 1, 1)])
def test_strided_depthwise_matches_numpy(run_ops, rng, shape, k, stride, pad, dilation):
    x = rng.standard_normal(shape).astype("float32")
    w = rng.standard_normal((shape[1], 1, k, k)).astype("float32")
    bias = rng.standard_normal(shape[1]).astype("float32")
    X = te.placeholder(x.shape, "float32", name="X")
    W = te.placeholder(w.shape, "float32", name="W")
    B = te.placeholder(bias.shape, "float32", name="B")
    plain = ops.depthwise_conv2d(X, W, stride, pad, dilation)
    fused = ops.relu6(ops.depthwise_conv2d(X, W, stride, pad, dilation, bias=B))
    assert _phases_inside_channel_loop(plain, [X, W, plain], AVX512_TARGET)
    assert _phases_inside_channel_loop(fused, [X, W, B, fused], AVX512_TARGET)
    got_plain, = run_ops([(X, x), (W, w)], [plain])
    got_fused, = run_ops([(X, x), (W, w), (B, bias)], [fused])
    ref = _dw_ref(x, w, stride, pad, dilation)
    np.testing.assert_allclose(got_plain, ref, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got_fused, np.clip(ref + bias[None, :, None, None], 0, 6), rtol=1e-4, atol=1e-4)


def test_strided_max_pool_matches_numpy(run_ops, rng):
    x = rng.standard_normal((1, 32, 111, 111)).astype("float32")
    X = te.placeholder(x.shape, "float32", name="X")
    pool = ops.max_pool2d(X, 3, 2, 1)
    assert _phases_inside_channel_loop(pool, [X, pool], AVX512_TARGET)
    got, = run_ops([(X, x)], [pool])
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)), constant_values=-np.inf)
    ref = np.max([xp[:, :, ky: ky + 111: 2, kx: kx + 111: 2] for ky in range(3) for kx in range(3)], axis=0)
    np.testing.assert_array_equal(got, ref)


def test_small_strided_window_keeps_the_whole_input_pass():
    """192->192 @28x28 s2 (0.7 MB of phases, cached anyway) measured slower per channel."""
    X = te.placeholder((1, 192, 28, 28), "float32", name="X")
    W = te.placeholder((192, 1, 3, 3), "float32", name="W")
    out = ops.depthwise_conv2d(X, W, 2, 1)
    assert not _phases_inside_channel_loop(out, [X, W, out], AVX512_TARGET)


@pytest.mark.parametrize("target,inside", [(AVX512_TARGET, True), ("rasp4b", False), ("armv7-a7", False)])
def test_where_the_column_phases_are_made(target, inside):
    X = te.placeholder((1, 96, 112, 112), "float32", name="X")
    W = te.placeholder((96, 1, 3, 3), "float32", name="W")
    out = ops.relu6(ops.depthwise_conv2d(X, W, 2, 1))
    assert _phases_inside_channel_loop(out, [X, W, out], target) is inside
