"""GPU schedules run end to end on OpenCL (pocl here): te schedule -> lower -> split_host_device -> OpenCL C ->
the OpenCL device runtime; results compared with numpy."""
from __future__ import annotations

import numpy as np
import pytest

from fixtures.gpu_kernels import (matmul_gpu, open_opencl_device, rowsum_gpu, run_on_device, scale2d_gpu,
                                  shifted_exp_gpu, softmax_gpu, stencil_gpu, vadd_gpu)


@pytest.fixture(scope="module")
def cl_device():
    dev = open_opencl_device()
    yield dev
    dev.close()


run = run_on_device


RNG = np.random.default_rng(7)


def rand(*shape):
    return RNG.standard_normal(shape).astype("float32")


@pytest.mark.parametrize("n", [1024, 1000])
def test_vector_add(cl_device, n):
    a, b = rand(n), rand(n)
    (c,) = run(cl_device, *vadd_gpu(n, block=64), "vadd", [a, b])
    np.testing.assert_allclose(c, a + b, rtol=1e-5)


def test_2d_elementwise(cl_device):
    a = rand(40, 70)
    (b,) = run(cl_device, *scale2d_gpu(40, 70, th=8, tw=16), "scale2d", [a])
    np.testing.assert_allclose(b, a * 2 + 1, rtol=1e-5)


@pytest.mark.parametrize("m,n,k,kw", [
    (64, 64, 64, {}),
    (50, 40, 70, {}),                                   # partial tiles on every axis
    (64, 48, 80, {"ktile": 8}),                         # a fetch shorter than the work-group (threadIdx.y < 8)
    (50, 40, 70, {"ktile": 8, "cache_local": True}),    # accumulating in a register
])
def test_tiled_matmul(cl_device, m, n, k, kw):
    a, b = rand(m, k), rand(k, n)
    (c,) = run(cl_device, *matmul_gpu(m, n, k, **kw), "mm", [a, b])
    np.testing.assert_allclose(c, a @ b, rtol=1e-5, atol=1e-5 * np.abs(a).sum(1).max())


def test_stencil_through_shared_memory(cl_device):
    a = rand(257)
    (c,) = run(cl_device, *stencil_gpu(256), "stencil", [a])
    np.testing.assert_allclose(c, a[:-1] + a[1:], rtol=1e-5)


def test_row_sum(cl_device):
    a = rand(100, 37)
    (b,) = run(cl_device, *rowsum_gpu(100, 37), "rowsum", [a])
    np.testing.assert_allclose(b, a.sum(1), rtol=1e-5, atol=1e-5)


def test_shifted_exp_two_kernels(cl_device):
    a = rand(100, 37)
    (e,) = run(cl_device, *shifted_exp_gpu(100, 37), "shexp", [a])
    np.testing.assert_allclose(e, np.exp(a - a.max(1, keepdims=True)), rtol=1e-5)


def test_softmax(cl_device):
    a = rand(100, 37) * 4
    (o,) = run(cl_device, *softmax_gpu(100, 37), "softmax", [a])
    e = np.exp(a - a.max(1, keepdims=True))
    np.testing.assert_allclose(o, e / e.sum(1, keepdims=True), rtol=1e-5, atol=1e-7)
