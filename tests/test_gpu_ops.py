"""The op library's default GPU schedules (ops.gpu_schedules.schedule_gpu) run on OpenCL (pocl here): each family
built with tether.ops at layer sizes of mobilenet_v2 / resnet / a transformer (scaled to run in seconds on a CPU
device), scheduled for the GPU, lowered, split into kernels, emitted as OpenCL C and run; results compared with
numpy or with the CPU build of the same compute (float32, max relative error <= 1e-4)."""
from __future__ import annotations

import random

import numpy as np
import pytest

import tether
from tether import ops, te
from tether.errors import ScheduleError
from tether.ops.gpu_schedules import GPU_KNOBS, schedule_gpu
from tether.tir.device_split import split_host_device
from tether.tune.space import gpu_space

from fixtures.gpu_kernels import open_opencl_device, run_on_device

RTOL = 1e-4
# the split's verification uses the schedules' default limits: what a Mali-class device allows
LIMITS = {"max_threads_per_block": 256, "max_shared_bytes": 16 * 1024}


@pytest.fixture(scope="module")
def cl_device():
    dev = open_opencl_device()
    yield dev
    dev.close()


RNG = np.random.default_rng(11)


def rand(*shape, scale=1.0):
    return (RNG.standard_normal(shape) * scale).astype("float32")


def P(shape, name):
    return te.placeholder(tuple(shape), "float32", name=name)


def gpu(dev, outs, ins, arrays, config=None, limits=None, name="k"):
    """Schedule ``outs`` with schedule_gpu, run on ``dev``; returns the outputs' arrays."""
    outs = outs if isinstance(outs, list) else [outs]
    lim = dict(LIMITS, **(limits or {}))
    s = schedule_gpu(outs, limits=lim, config=config)
    return run_on_device(dev, s, list(ins) + outs, name, arrays, **lim)


def close(got, want):
    want = np.asarray(want, np.float64)
    err = np.abs(got.astype(np.float64) - want).max() / max(np.abs(want).max(), 1e-30)
    assert err <= RTOL, f"max relative error {err:.3g} > {RTOL}"


def program(outs, ins, config=None, limits=None):
    outs = outs if isinstance(outs, list) else [outs]
    lim = dict(LIMITS, **(limits or {}))
    return split_host_device(tether.lower(schedule_gpu(outs, limits=lim, config=config), list(ins) + outs, "k"),
                             **lim)


def conv_ref(x, w, stride, pad, groups=1):
    n, _, h, wd = x.shape
    o, icg, kh, kw = w.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh, ow = (h + 2 * pad - kh) // stride + 1, (wd + 2 * pad - kw) // stride + 1
    out = np.zeros((n, o, oh, ow))
    ocg = o // groups
    for oc in range(o):
        g = oc // ocg
        for ky in range(kh):
            for kx in range(kw):
                patch = xp[:, g * icg:(g + 1) * icg, ky:ky + stride * oh:stride, kx:kx + stride * ow:stride]
                out[:, oc] += np.einsum("nchw,c->nhw", patch, w[oc, :, ky, kx])
    return out


# ---------------------------------------------------------------- injective: elementwise chains, layout, resize
def _erf(x):
    from math import erf
    return np.vectorize(erf)(x.astype(np.float64))


@pytest.mark.parametrize("kind", ["add_relu", "clip", "sigmoid", "gelu"])
def test_elementwise_chains(cl_device, kind):
    shape = (1, 96, 28, 28)        # mobilenet_v2's expanded 28x28 maps
    x, y = P(shape, "X"), P(shape, "Y")
    a, b = rand(*shape, scale=3), rand(*shape)
    if kind == "add_relu":
        outs, ins, arrays, want = ops.relu(ops.add(x, y)), [x, y], [a, b], np.maximum(a + b, 0)
    elif kind == "clip":
        outs, ins, arrays, want = ops.clip(ops.multiply(x, y), 0.0, 6.0), [x, y], [a, b], np.clip(a * b, 0, 6)
    elif kind == "sigmoid":
        outs, ins, arrays, want = ops.multiply(x, ops.sigmoid(x)), [x], [a], a / (1 + np.exp(-a.astype(np.float64)))
    else:
        outs, ins, arrays, want = ops.gelu(x), [x], [a], 0.5 * a * (1 + _erf(a / np.sqrt(2)))
    prog = program(outs, ins)
    assert len(prog.kernels) == 1          # the chain is one kernel
    (got,) = gpu(cl_device, outs, ins, arrays)
    close(got, want)


def test_transpose_and_concat(cl_device):
    x, y = P((1, 32, 28, 28), "X"), P((1, 64, 28, 28), "Y")
    a, b = rand(1, 32, 28, 28), rand(1, 64, 28, 28)
    (t,) = gpu(cl_device, ops.transpose(x, (0, 2, 3, 1)), [x], [a])
    np.testing.assert_array_equal(t, a.transpose(0, 2, 3, 1))
    (c,) = gpu(cl_device, ops.concat([x, y], 1), [x, y], [a, b])
    np.testing.assert_array_equal(c, np.concatenate([a, b], 1))


def test_resize_linear_2x(cl_device):
    """Bilinear 2x upsampling (align_corners=False) from per-axis tap tables, as the ONNX Resize converter makes."""
    n, ch, h, w = 1, 16, 14, 14
    axes, tables, arrays = [], [], []
    for d, size in ((2, h), (3, w)):
        out = 2 * size
        src = np.clip((np.arange(out) + 0.5) / 2 - 0.5, 0, size - 1)
        lo = np.floor(src).astype(np.int32)
        hi = np.minimum(lo + 1, size - 1)
        frac = (src - lo).astype(np.float32)
        axes.append({"axis": d, "taps": 2, "weights": True, "inside": False})
        tables += [te.placeholder((out, 2), "int32", name=f"idx{d}"), P((out, 2), f"w{d}")]
        arrays += [np.stack([lo, hi], 1).astype(np.int32), np.stack([1 - frac, frac], 1).astype(np.float32)]
    x = P((n, ch, h, w), "X")
    a = rand(n, ch, h, w)
    out = ops.resize_tables(x, (n, ch, 2 * h, 2 * w), axes, tables)
    (got,) = gpu(cl_device, out, [x] + tables, [a] + arrays)
    (iy, wy), (ix, wx) = (arrays[0], arrays[1]), (arrays[2], arrays[3])
    want = sum(wy[:, ty][:, None] * wx[:, tx][None, :] * a[:, :, iy[:, ty]][:, :, :, ix[:, tx]]
               for ty in range(2) for tx in range(2))
    close(got, want)


# ---------------------------------------------------------------- reductions and multi-stage ops
@pytest.mark.parametrize("fn,npfn", [(ops.sum, np.sum), (ops.mean, np.mean), (ops.max, np.max), (ops.min, np.min)])
@pytest.mark.parametrize("axis,keepdims", [((2,), False), ((0, 2), True), (None, True)])
def test_reductions(cl_device, fn, npfn, axis, keepdims):
    x = P((8, 64, 49), "X")
    a = rand(8, 64, 49)
    (got,) = gpu(cl_device, fn(x, axis, keepdims), [x], [a])
    close(got, npfn(a.astype(np.float64), axis=axis, keepdims=keepdims))


def test_reduce_prod(cl_device):
    x = P((64, 12), "X")
    a = (1 + 0.1 * rand(64, 12)).astype("float32")
    (got,) = gpu(cl_device, ops.reduce(x, "prod", (1,), False), [x], [a])
    close(got, a.astype(np.float64).prod(1))


@pytest.mark.parametrize("log", [False, True])
def test_softmax(cl_device, log):
    x = P((4, 64, 64), "X")           # attention scores: 4 heads of 64 x 64
    a = rand(4, 64, 64, scale=4)
    (got,) = gpu(cl_device, ops.log_softmax(x) if log else ops.softmax(x), [x], [a])
    e = np.exp(a - a.max(-1, keepdims=True))
    sm = e / e.sum(-1, keepdims=True)
    close(got, np.log(sm) if log else sm)


def test_layer_norm(cl_device):
    x, g, b = P((128, 384), "X"), P((384,), "G"), P((384,), "B")     # a transformer layer's tokens
    a, ga, ba = rand(128, 384, scale=2), rand(384), rand(384)
    out = ops.normalize(x, 1, 1e-5, g, b)
    assert len(program(out, [x, g, b]).kernels) == 3        # mean, variance, normalize: one kernel per root stage
    (got,) = gpu(cl_device, out, [x, g, b], [a, ga, ba])
    a64 = a.astype(np.float64)
    close(got, (a64 - a64.mean(1, keepdims=True)) / np.sqrt(a64.var(1, keepdims=True) + 1e-5) * ga + ba)


def test_group_norm(cl_device):
    """GroupNormalization as the frontend lowers it: reshape to (N, G, rest), normalize, reshape back, scale/bias
    per channel; also instance norm (one channel per group)."""
    n, ch, h, w = 2, 64, 14, 14
    for groups in (8, ch):
        x, g, b = P((n, ch, h, w), "X"), P((ch, 1, 1), "G"), P((ch, 1, 1), "B")
        a, ga, ba = rand(n, ch, h, w), rand(ch, 1, 1), rand(ch, 1, 1)
        z = ops.normalize(ops.reshape(x, (n, groups, -1)), 2, 1e-5)
        out = ops.add(ops.multiply(ops.reshape(z, (n, ch, h, w)), g), b)
        (got,) = gpu(cl_device, out, [x, g, b], [a, ga, ba])
        r = a.astype(np.float64).reshape(n, groups, -1)
        want = ((r - r.mean(2, keepdims=True)) / np.sqrt(r.var(2, keepdims=True) + 1e-5)).reshape(a.shape)
        close(got, want * ga + ba)


# ---------------------------------------------------------------- matmul family
def test_dense_bias_gelu_one_kernel(cl_device):
    x, w, b = P((64, 384), "X"), P((256, 384), "W"), P((256,), "B")   # a transformer FFN, scaled down
    a, wa, ba = rand(64, 384), rand(256, 384, scale=0.05), rand(256)
    out = ops.gelu(ops.dense(x, w, b))
    prog = program(out, [x, w, b])
    assert len(prog.kernels) == 1          # packing read in place, bias and gelu in the product's write-back
    assert prog.kernels[0].shared_bytes() > 0
    (got,) = gpu(cl_device, out, [x, w, b], [a, wa, ba])
    y = a.astype(np.float64) @ wa.T + ba
    close(got, 0.5 * y * (1 + _erf(y / np.sqrt(2))))


@pytest.mark.parametrize("m,k,n", [(1, 512, 100), (8, 24, 100), (50, 70, 45)])
def test_dense_small_and_ragged(cl_device, m, k, n):
    """One row (the row-dot form), few rows, and a shape no tile divides."""
    x, w = P((m, k), "X"), P((n, k), "W")
    a, wa = rand(m, k), rand(n, k)
    (got,) = gpu(cl_device, ops.dense(x, w), [x, w], [a, wa])
    close(got, a.astype(np.float64) @ wa.T)


@pytest.mark.parametrize("transpose_b", [False, True])
def test_batch_matmul(cl_device, transpose_b):
    a_t, b_t = P((4, 64, 48), "A"), P((4, 48, 64) if not transpose_b else (4, 64, 48), "B")
    a, b = rand(4, 64, 48), rand(*b_t.shape)
    (got,) = gpu(cl_device, ops.batch_matmul(a_t, b_t, transpose_b), [a_t, b_t], [a, b])
    close(got, a.astype(np.float64) @ (b.transpose(0, 2, 1) if transpose_b else b))


def test_pointwise_conv_as_matmul(cl_device):
    """A pointwise conv as the CPU's GEMM plan writes it (graph/conv_gemm.py: weights (oc, ic) @ input (ic, h*w),
    the bias per row, relu): the tiled matmul with shared-memory operands, one kernel."""
    x, w, b = P((32, 196), "X"), P((96, 32), "W"), P((96, 1), "B")       # mobilenet_v2 32 -> 96 @ 14x14
    xa, wa, ba = rand(32, 196), rand(96, 32), rand(96, 1)
    out = ops.relu(ops.add(ops.matmul(w, x), b))
    (kernel,) = program(out, [x, w, b]).kernels
    assert kernel.shared_bytes() > 0
    (got,) = gpu(cl_device, out, [x, w, b], [xa, wa, ba])
    close(got, np.maximum(wa.astype(np.float64) @ xa + ba, 0))


def test_matmul_read_transposed_or_reshaped(cl_device):
    """A product whose reader is a transpose (one element each: computed in the reader's threads, one per output)
    or a reshape (its own kernel, then the copy)."""
    x, w = P((64, 32), "X"), P((32, 48), "W")
    a, wa = rand(64, 32), rand(32, 48)
    (got,) = gpu(cl_device, ops.transpose(ops.matmul(x, w), (1, 0)), [x, w], [a, wa])
    close(got, (a.astype(np.float64) @ wa).T)
    (got,) = gpu(cl_device, ops.reshape(ops.matmul(x, w), (1, 64 * 48)), [x, w], [a, wa])
    close(got, (a.astype(np.float64) @ wa).reshape(1, -1))
    # read at two places per element: a kernel of its own (computed in the reader it would be computed twice)
    y, w2 = P((32, 32), "Y"), P((32, 32), "W2")
    mm = ops.matmul(y, w2)
    out = ops.add(mm, ops.transpose(mm, (1, 0)))
    assert len(program(out, [y, w2]).kernels) == 2
    ya, w2a = rand(32, 32), rand(32, 32)
    (got,) = gpu(cl_device, out, [y, w2], [ya, w2a])
    m = ya.astype(np.float64) @ w2a
    close(got, m + m.T)


# ---------------------------------------------------------------- convolution and pooling
CONVS = {
    # name: (in channels, out channels, size, kernel, stride, padding, groups)
    "3x3_s1": (16, 32, 28, 3, 1, 1, 1),       # resnet-style
    "3x3_s2": (16, 32, 28, 3, 2, 1, 1),
    "depthwise_3x3_s1": (96, 96, 14, 3, 1, 1, 96),     # mobilenet_v2
    "depthwise_3x3_s2": (96, 96, 28, 3, 2, 1, 96),
    "pointwise": (32, 96, 14, 1, 1, 0, 1),
    "grouped": (32, 64, 14, 3, 1, 1, 4),
    "ragged_7x7_s2": (3, 16, 37, 7, 2, 3, 1),           # a stem on a map no block divides
}


@pytest.mark.parametrize("name", list(CONVS))
def test_conv2d_bias_hard_swish(cl_device, name):
    ci, co, hw, k, stride, pad, groups = CONVS[name]
    x, w, b = P((1, ci, hw, hw), "X"), P((co, ci // groups, k, k), "W"), P((co,), "B")
    a, wa, ba = rand(1, ci, hw, hw), rand(co, ci // groups, k, k), rand(co)
    out = ops.hard_swish(ops.conv2d(x, w, stride, pad, groups=groups, bias=b))
    assert len(program(out, [x, w, b]).kernels) == 1    # padding read inline, bias and activation in the write-back
    (got,) = gpu(cl_device, out, [x, w, b], [a, wa, ba])
    y = conv_ref(a, wa, stride, pad, groups) + ba[None, :, None, None]
    close(got, y * np.clip(y + 3, 0, 6) / 6)


def test_conv2d_matches_the_cpu_build(cl_device, run_ops):
    """The same te compute built for the host CPU (ops.schedule, llvmlite) and for the GPU give the same result."""
    x, w, b = P((1, 24, 19, 19), "X"), P((48, 24, 3, 3), "W"), P((48,), "B")
    a, wa, ba = rand(1, 24, 19, 19), rand(48, 24, 3, 3), rand(48)
    out = ops.relu6(ops.conv2d(x, w, 2, 1, bias=b))
    (cpu,) = run_ops([(x, a), (w, wa), (b, ba)], [out])
    (got,) = gpu(cl_device, out, [x, w, b], [a, wa, ba])
    close(got, cpu)


@pytest.mark.parametrize("kind", ["max_3x3_s2", "avg_2x2_s2", "avg_3x3_s1_pad", "global_avg", "global_max"])
def test_pooling(cl_device, kind):
    x = P((1, 64, 28, 28), "X")
    a = rand(1, 64, 28, 28)
    a64 = a.astype(np.float64)
    if kind == "max_3x3_s2":
        out = ops.max_pool2d(x, 3, 2, 1)
        ap = np.pad(a64, ((0, 0), (0, 0), (1, 1), (1, 1)), constant_values=-np.inf)
        want = np.max([ap[:, :, i:i + 28:2, j:j + 28:2] for i in range(3) for j in range(3)], 0)
    elif kind == "avg_2x2_s2":
        out, want = ops.avg_pool2d(x, 2, 2), a64.reshape(1, 64, 14, 2, 14, 2).mean((3, 5))
    elif kind == "avg_3x3_s1_pad":     # count_include_pad: the sum over the zero-padded window / 9
        out = ops.avg_pool2d(x, 3, 1, 1, count_include_pad=True)
        ap = np.pad(a64, ((0, 0), (0, 0), (1, 1), (1, 1)))
        want = sum(ap[:, :, i:i + 28, j:j + 28] for i in range(3) for j in range(3)) / 9
    elif kind == "global_avg":
        out, want = ops.global_avg_pool2d(x), a64.mean((2, 3), keepdims=True)
    else:
        out, want = ops.global_max_pool2d(x), a64.max((2, 3), keepdims=True)
    (got,) = gpu(cl_device, out, [x], [a])
    close(got, want)


# ---------------------------------------------------------------- tuning configs and limits
def test_configs_from_the_space_stay_correct(cl_device):
    """Configs sampled from gpu_space (matmul tiles, work-group sizes, outputs per thread, padding materialized)
    give the same results as the default schedule, on shapes no tile divides."""
    rng = random.Random(5)
    x, w = P((50, 70), "X"), P((70, 45), "W")
    a, wa = rand(50, 70), rand(70, 45)
    mm = ops.matmul(x, w)
    space = gpu_space(mm)
    assert space.kind == "matmul" and {k for k, _ in space.knobs} <= set(GPU_KNOBS)
    assert space.default() == {k: ch[0] for k, ch in space.knobs}
    for cfg in [space.default()] + [space.sample(rng) for _ in range(3)]:
        (got,) = gpu(cl_device, mm, [x, w], [a, wa], config=cfg)
        close(got, a.astype(np.float64) @ wa)

    xc, wc = P((1, 24, 19, 19), "XC"), P((24, 1, 3, 3), "WC")
    ac, wca = rand(1, 24, 19, 19), rand(24, 1, 3, 3)
    dw = ops.depthwise_conv2d(xc, wc, 2, 1)
    space = gpu_space(dw)
    assert {"block", "outputs_per_thread", "pad"} <= {k for k, _ in space.knobs}
    want = conv_ref(ac, wca, 2, 1, 24)
    for cfg in ({"block": 64, "outputs_per_thread": 4, "pad": "materialize"}, {"outputs_per_thread": 2},
                space.sample(rng)):
        prog = program(dw, [xc, wc], config=cfg)
        assert len(prog.kernels) == (2 if cfg.get("pad") == "materialize" else 1)
        (got,) = gpu(cl_device, dw, [xc, wc], [ac, wca], config=cfg)
        close(got, want)


def test_small_device_limits(cl_device):
    """A device with 64 threads and 2 KiB of shared memory per work-group: the defaults shrink to fit."""
    x, w = P((64, 96), "X"), P((96, 80), "W")
    a, wa = rand(64, 96), rand(96, 80)
    small = {"max_threads_per_block": 64, "max_shared_bytes": 2048}
    mm = ops.relu(ops.matmul(x, w))
    prog = program(mm, [x, w], limits=small)
    assert all(k.block[0] * k.block[1] * k.block[2] <= 64 and k.shared_bytes() <= 2048 for k in prog.kernels)
    (got,) = gpu(cl_device, mm, [x, w], [a, wa], limits=small)
    close(got, np.maximum(a.astype(np.float64) @ wa, 0))
    sm = ops.softmax(x)
    assert all(k.block[0] <= 64 for k in program(sm, [x], limits=small).kernels)


def test_bad_configs_and_limits_are_refused():
    x, w = P((64, 96), "X"), P((96, 80), "W")
    mm = ops.matmul(x, w)
    with pytest.raises(ScheduleError, match="unknown GPU schedule knob.*tile_m"):
        schedule_gpu(mm, config={"tile_m": 4})
    with pytest.raises(ScheduleError, match="block=0 is not valid"):
        schedule_gpu(mm, config={"block": 0})
    with pytest.raises(ScheduleError, match="pad='zero' is not valid"):
        schedule_gpu(mm, config={"pad": "zero"})
    with pytest.raises(ScheduleError, match="16 x 16 is over the device's 128 threads"):
        schedule_gpu(mm, limits={"max_threads_per_block": 128}, config={"mm_threads_y": 16, "mm_threads_x": 16})
    with pytest.raises(ScheduleError, match="bytes of shared memory, over the device's 1024"):
        schedule_gpu(mm, limits={"max_shared_bytes": 1024}, config={"mm_ktile": 16})
    with pytest.raises(ScheduleError, match="block=512 is over the device's 256 threads"):
        schedule_gpu(ops.relu(x), config={"block": 512})
    with pytest.raises(ScheduleError, match="max_shared_bytes must be a positive int"):
        schedule_gpu(mm, limits={"max_shared_bytes": -1})


# ---------------------------------------------------------------- int8
@pytest.mark.parametrize("dtype,k,stride", [("uint8", 3, 1), ("int8", 3, 2), ("uint8", 1, 1)])
def test_qconv2d_dot4(cl_device, dtype, k, stride):
    """tether's int8 convolution (ops.qconv.qconv2d, what QLinearConv lowers to): bytes packed four to an int32
    word, te.dot4 products, int32 accumulation, the padding reading the activations' zero point; the pixel form
    (3x3) and the pointwise matmul form (1x1). Exact against numpy's integer convolution."""
    from tether.ops import qconv
    rng = np.random.default_rng(3)
    ci, co, hw, zx = 16, 24, 14, 7
    pad = k // 2
    lo = 0 if dtype == "uint8" else -128
    a = rng.integers(lo, lo + 256, (1, ci, hw, hw)).astype(dtype)
    w = rng.integers(-128, 128, (co, ci, k, k)).astype(np.int8)
    wp = qconv.pack_weights(w) if k > 1 else qconv.pack_rows(w)
    bias = rng.integers(-1000, 1000, co).astype(np.int32)
    x = te.placeholder(a.shape if k > 1 else (ci, hw * hw), dtype, name="X")
    wt, bt = te.placeholder(wp.shape, "int32", name="WP"), te.placeholder((co,), "int32", name="B")
    out = qconv.qconv2d(x, wt, bt, (k, k), stride, pad, 1, co, zx)
    assert len(program(out, [x, wt, bt]).kernels) == 1   # words read inline, the channels-first copy + bias fused
    (got,) = gpu(cl_device, out, [x, wt, bt], [a if k > 1 else a.reshape(ci, -1), wp, bias])
    padded = np.pad(a.astype(np.float64), ((0, 0), (0, 0), (pad, pad), (pad, pad)), constant_values=zx)
    want = conv_ref(padded, w.astype(np.float64), stride, 0) + bias[None, :, None, None]
    np.testing.assert_array_equal(got, want.reshape(co, -1).astype(np.int64))


def test_int8_conv_int32_accumulation_requantized(cl_device):
    """A QLinearConv written with plain ops: int8 -> int32 (minus the zero point), conv2d accumulating in int32,
    the int32 bias, requantized to int8 per output channel: one kernel."""
    from tether.ops import qnn
    from tether.ops.nary import elementwise
    rng = np.random.default_rng(4)
    x = te.placeholder((1, 16, 14, 14), "int8", name="X")
    w = te.placeholder((32, 16, 3, 3), "int8", name="W")
    bias = te.placeholder((32,), "int32", name="B")
    mult = P((32, 1, 1), "M")
    zp, xzp = te.placeholder((1,), "int8", name="Z"), te.placeholder((1,), "int8", name="XZ")
    xi = elementwise(lambda v, z: v.astype("int32") - z.astype("int32"), [x, xzp], "xi")
    wi = elementwise(lambda v: v.astype("int32"), [w], "wi")
    out = qnn.requantize(ops.conv2d(xi, wi, 1, 1, bias=bias), mult, zp, "int8")
    ins = [x, w, bias, mult, zp, xzp]
    arrays = [rng.integers(-128, 128, (1, 16, 14, 14)).astype(np.int8),
              rng.integers(-128, 128, (32, 16, 3, 3)).astype(np.int8), rng.integers(-1000, 1000, 32).astype(np.int32),
              np.full((32, 1, 1), 0.0005, np.float32), np.array([3], np.int8), np.array([-5], np.int8)]
    assert len(program(out, ins).kernels) == 1
    (got,) = gpu(cl_device, out, ins, arrays)
    acc = conv_ref(arrays[0].astype(np.float64) + 5, arrays[1].astype(np.float64), 1, 1)
    acc += arrays[2][None, :, None, None]
    want = np.clip(np.round(acc.astype(np.float32) * np.float32(0.0005)) + 3, -128, 127).astype(np.int8)
    np.testing.assert_array_equal(got, want)


def test_broadcast_readers_are_not_fused():
    """A reduction read by many output elements (softmax's row sums, layer norm's statistics) stays a kernel of its
    own: computing it in each reader's thread would redo the row per element."""
    x = P((4, 64, 64), "X")
    assert len(program(ops.softmax(x), [x]).kernels) == 4      # max, exp, sum, normalize


# ---------------------------------------------------------------- a model's kernels, as the graph lowers them
def _model_tasks(kind):
    from tether.frontend.onnx.model import from_onnx
    from tether.graph.plan import plan_kernels
    from tether.kernels.registry import TeLowering
    from tether.testing.model_kinds import KINDS
    model, _ = KINDS[kind]("test")
    graph, params = from_onnx(model)
    # opt level 2: no build-time packing of conv weights into the CPU's panels (docs/gpu.md)
    plan = plan_kernels(graph, params, "host", opt_level=2)
    return plan, [t for t in plan.tasks if isinstance(t.strategy, TeLowering)]


def _lower_task(plan, task):
    from tether.graph.to_te import lower_kernel
    placeholders, out, _ = lower_kernel(task.node, plan.graph.types, conv_gemm=False, kind=plan.kind)
    return placeholders, out


@pytest.mark.parametrize("kind", ["mobilenetv3_cls", "transformer_encoder"])
def test_every_te_kernel_of_a_model_builds_for_the_gpu(cl_device, kind):
    """Every te kernel of the model (fused conv + bias + activation, depthwise, squeeze-excite pooling, dense,
    attention matmuls, layer norm, gelu...) is scheduled within the default
    limits, split, emitted as OpenCL C and built by the driver."""
    from tether.codegen.opencl_c import opencl_source
    plan, tasks = _model_tasks(kind)
    assert len(tasks) >= 10
    for task in tasks:
        placeholders, out = _lower_task(plan, task)
        prog = program(out, placeholders)
        assert all(k.block[0] * k.block[1] * k.block[2] <= 256 and k.shared_bytes() <= 16 * 1024
                   for k in prog.kernels), task.name
        cl_device.load(opencl_source(prog.kernels).encode(), [k.launch_info() for k in prog.kernels])


def test_transformer_kernels_match_the_cpu_build(cl_device, run_ops):
    """Each te kernel of a transformer encoder, on the model's weights and random activations: the GPU schedule
    on pocl and the CPU build of the same compute agree."""
    rng = np.random.default_rng(8)
    plan, tasks = _model_tasks("transformer_encoder")
    for task in tasks:
        placeholders, out = _lower_task(plan, task)
        arrays = []
        for name, ph in zip(task.node.body_params(), placeholders):
            shape = tuple(int(d) for d in ph.shape)
            const = plan.params.get(name)
            arrays.append(np.asarray(const, ph.dtype).reshape(shape) if const is not None
                          else rng.standard_normal(shape).astype(ph.dtype))
        (cpu,) = run_ops(list(zip(placeholders, arrays)), [out])
        (got,) = gpu(cl_device, out, placeholders, arrays, name=task.name.replace("+", "_"))
        close(got, cpu)
