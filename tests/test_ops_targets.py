"""The op library's default schedules for every target family: cross-compile for each preset (vector FMA in the
matmul micro-kernel), and run a mix of ops on emulated ARM boards against numpy."""
import numpy as np
import pytest

import tether
from tether import ops, te

# What the matmul micro-kernel's inner loop must contain on each preset: a vector multiply-add.
VECTOR_FMA = {
    "host": ("vfmadd", "fmla\tv", "vmulps"),
    "x86_64": ("mulps",),                # SSE2 only: no FMA instruction, but packed multiplies
    "rasp4b": ("fmla\tv",),
    "rasp5": ("fmla\tv",),
    "jetson-nano": ("fmla\tv",),
    "android-arm64": ("fmla\tv",),
    "rasp3b": ("vfma.f32\tq", "vmla.f32\tq"),
    "armv7-a7": ("vfma.f32\tq", "vmla.f32\tq", "vmul.f32\tq"),  # LLVM splits vmla on Cortex-A7 (slow there)
}


@pytest.mark.parametrize("preset", sorted(VECTOR_FMA))
def test_matmul_micro_kernel_is_vector_fma(preset):
    X = te.placeholder((48, 64), "float32", name="X")
    W = te.placeholder((64, 64), "float32", name="W")
    Y = ops.matmul(X, W)
    lib = tether.build(ops.schedule([Y], target=preset), [X, W, Y], target=preset, name="mm")
    asm = lib.get_source("asm")
    assert any(pat in asm for pat in VECTOR_FMA[preset]), f"no vector FMA/multiply in the {preset} matmul"


def _mixed():
    """Inputs and outputs exercising every schedule family (odd sizes on purpose)."""
    x = te.placeholder((1, 6, 11, 13), "float32", name="x")
    wd = te.placeholder((6, 1, 3, 3), "float32", name="wd")
    bd = te.placeholder((6,), "float32", name="bd")
    wp = te.placeholder((10, 6, 1, 1), "float32", name="wp")
    a = te.placeholder((19, 23), "float32", name="a")
    wl = te.placeholder((17, 23), "float32", name="wl")
    outs = [ops.relu6(ops.conv2d(x, wd, padding=1, groups=6, bias=bd)),
            ops.conv2d(x, wp),
            ops.max_pool2d(x, 3, 2, 1),
            ops.avg_pool2d(x, 2, 2, ceil_mode=True),
            ops.global_avg_pool2d(x),
            ops.gelu(ops.dense(a, wl)),
            ops.softmax(a),
            ops.concat([a, a], axis=1)]
    return [x, wd, bd, wp, a, wl], outs


def _mixed_reference(x, wd, bd, wp, a, wl):
    from fixtures.conv_ref import conv_ref
    from test_ops_elementwise import ACTIVATIONS
    dw = conv_ref(x, wd, (1, 1), (1,) * 4, (1, 1), 6) + bd[None, :, None, None]
    pw = conv_ref(x, wp, (1, 1), (0,) * 4, (1, 1), 1)
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)), constant_values=-np.inf)
    mp = np.stack([np.stack([xp[:, :, 2 * i:2 * i + 3, 2 * j:2 * j + 3].max(axis=(2, 3)) for j in range(7)], -1)
                   for i in range(6)], -2)
    ap = np.stack([np.stack([x[:, :, 2 * i:2 * i + 2, 2 * j:2 * j + 2].mean(axis=(2, 3)) for j in range(7)], -1)
                   for i in range(6)], -2)
    e = np.exp(a - a.max(axis=1, keepdims=True))
    return [np.clip(dw, 0, 6), pw, mp, ap, x.mean(axis=(2, 3), keepdims=True), ACTIVATIONS["gelu"](a @ wl.T),
            e / e.sum(axis=1, keepdims=True), np.concatenate([a, a], axis=1)]


def test_mixed_ops_on_host(run_ops, rng):
    ins, outs = _mixed()
    arrays = [rng.standard_normal(t.shape).astype("float32") for t in ins]
    got = run_ops(list(zip(ins, arrays)), outs)
    for g, r in zip(got, _mixed_reference(*arrays)):
        np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-4)


@pytest.mark.emulated
def test_mixed_ops_on_emulated_arm(emulated_device, tmp_path, rng):
    """The aarch64 and armv7 schedule families, run on qemu-user boards through the device server."""
    from tether import rpc
    ins, outs = _mixed()
    preset = emulated_device.preset
    lib = tether.build(ops.schedule(outs, target=preset), ins + outs, target=preset, name="mixed")
    path = tmp_path / f"mixed_{preset}.so"
    lib.export_library(str(path))
    arrays = [rng.standard_normal(t.shape).astype("float32") for t in ins]
    with rpc.connect(*emulated_device.address, timeout=120.0) as remote:
        remote.upload(str(path))
        f = remote.load_module(path.name)["mixed"]
        dev_in = [remote.array(a) for a in arrays]
        dev_out = [remote.empty(tuple(int(d) for d in t.shape), "float32") for t in outs]
        f(*dev_in, *dev_out)
        got = [d.numpy() for d in dev_out]
    for g, r, t in zip(got, _mixed_reference(*arrays), outs):
        np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-4, err_msg=f"{t.name} on {preset}")
