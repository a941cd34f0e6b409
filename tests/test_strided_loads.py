"""Vector loads whose index moves by a constant stride other than one per lane: a small stride is one
contiguous load of the lanes' span plus a shufflevector, a large one is one llvm.masked.gather; neither is a chain
of per-lane scalar loads and insertelements. Results are checked against numpy on the host and on the emulated
aarch64 (rasp4b) and armv7 (armv7-a7) devices."""
from __future__ import annotations

import re

import numpy as np
import pytest

import tether
from tether import runtime, te

N = 64        # outputs per kernel
LANES = 8
PRESETS = ("host", "rasp4b", "armv7-a7")


def _strided(stride: int):
    """C[i] = A[i*stride] * 2 + 1 (a stride-2 conv/pool style read); A is exactly as long as the last read needs,
    so a load past the last element read would leave the buffer."""
    A = te.placeholder(((N - 1) * stride + 1,), "float32", name="A")
    C = te.compute((N,), lambda i: A[i * stride] * 2.0 + 1.0, name="C")
    s = te.create_schedule(C.op)
    _, xi = s[C].split(C.op.axis[0], factor=LANES)
    s[C].vectorize(xi)
    return s, [A, C], lambda a: a[::stride][:N] * 2 + 1


def _transpose():
    """C[i, j] = A[j, i]: the vectorized j moves by A's row pitch (37 elements) per lane."""
    A = te.placeholder((40, 37), "float32", name="A")
    C = te.compute((37, 40), lambda i, j: A[j, i], name="C")
    s = te.create_schedule(C.op)
    _, ji = s[C].split(C.op.axis[1], factor=LANES)
    s[C].vectorize(ji)
    return s, [A, C], lambda a: a.T


def _reversed_stride():
    """C[i] = A[(N-1-i)*2]: a negative constant stride (-2) loads the span from its lowest element."""
    A = te.placeholder(((N - 1) * 2 + 1,), "float32", name="A")
    C = te.compute((N,), lambda i: A[(N - 1 - i) * 2], name="C")
    s = te.create_schedule(C.op)
    _, xi = s[C].split(C.op.axis[0], factor=LANES)
    s[C].vectorize(xi)
    return s, [A, C], lambda a: a[::2][::-1]


KERNELS = {
    "stride2": (lambda: _strided(2), "shufflevector"),
    "stride3": (lambda: _strided(3), "shufflevector"),
    "stride4": (lambda: _strided(4), "shufflevector"),
    "stride_neg2": (_reversed_stride, "shufflevector"),
    "stride9": (lambda: _strided(9), "masked.gather"),
    "transpose": (_transpose, "masked.gather"),
}


def _build(kernel: str, target: str, tmp_path):
    make, _ = KERNELS[kernel]
    s, args, ref = make()
    lib = tether.build(s, args, target=target, name=kernel)
    path = tmp_path / ("%s_%s.so" % (kernel, target))
    lib.export_library(str(path))
    return lib, path, args, ref


def _inputs(args, kernel):
    rng = np.random.default_rng(sorted(KERNELS).index(kernel))
    return [rng.standard_normal(tuple(int(d) for d in t.shape)).astype("float32") for t in args[:-1]]


@pytest.mark.parametrize("target", PRESETS)
@pytest.mark.parametrize("kernel", sorted(KERNELS))
def test_strided_load_is_one_vector_op(kernel, target, tmp_path):
    lib, _, _, _ = _build(kernel, target, tmp_path)
    ll = lib.get_source("ll")
    want = KERNELS[kernel][1]
    assert want in ll, "no %s for the stride load in the %s IR" % (want, target)
    # no lane-by-lane gather: no float loaded as a scalar and inserted into a vector
    assert not re.search(r"insertelement <\d+ x float> [^\n]*, float %", ll), ll
    if want == "shufflevector":
        assert re.search(r"load <\d+ x float>", ll), "no contiguous span load"
    else:
        assert re.search(r'call <%d x float> @"?llvm\.masked\.gather' % LANES, ll), "no %d-lane gather" % LANES


@pytest.mark.parametrize("kernel", sorted(KERNELS))
def test_strided_load_matches_numpy_on_host(kernel, tmp_path):
    lib, path, args, ref = _build(kernel, "host", tmp_path)
    inputs = _inputs(args, kernel)
    out = np.zeros(tuple(int(d) for d in args[-1].shape), "float32")
    runtime.load_module(str(path))[kernel](*inputs, out)
    np.testing.assert_allclose(out, ref(*inputs), rtol=1e-6)


@pytest.mark.emulated
@pytest.mark.parametrize("preset", ["rasp4b", "armv7-a7"])
def test_strided_load_matches_numpy_on_emulated_device(emulated_devices, preset, tmp_path):
    from tether import rpc
    device = emulated_devices.for_preset(preset)
    with rpc.connect(*device.address, timeout=120.0) as remote:
        for kernel in sorted(KERNELS):
            _, path, args, ref = _build(kernel, preset, tmp_path)
            inputs = _inputs(args, kernel)
            remote.upload(str(path))
            f = remote.load_module(path.name)[kernel]
            dev_out = remote.empty(tuple(int(d) for d in args[-1].shape), "float32")
            f(*[remote.array(a) for a in inputs], dev_out)
            np.testing.assert_allclose(dev_out.numpy(), ref(*inputs), rtol=1e-6, err_msg=kernel)
