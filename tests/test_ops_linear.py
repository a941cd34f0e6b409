"""matmul / dense / batch_matmul against numpy: packed and unpacked paths, sizes the micro-kernel does not divide,
and fused epilogues."""
import numpy as np
import pytest

from tether import ops, te


def _mm_inputs(rng, m, k, n):
    return rng.standard_normal((m, k)).astype("float32"), rng.standard_normal((k, n)).astype("float32")


@pytest.mark.parametrize("m,k,n", [(1, 7, 5), (3, 17, 9), (16, 16, 16), (37, 29, 45), (64, 128, 96), (50, 3, 33)])
def test_matmul(run_ops, rng, m, k, n):
    a, b = _mm_inputs(rng, m, k, n)
    A = te.placeholder((m, k), "float32", name="A")
    B = te.placeholder((k, n), "float32", name="B")
    (out,) = run_ops([(A, a), (B, b)], [ops.matmul(A, B)])
    np.testing.assert_allclose(out, a @ b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("m,k,n", [(2, 9, 7), (33, 40, 19)])
def test_dense_bias_relu(run_ops, rng, m, k, n):
    x = rng.standard_normal((m, k)).astype("float32")
    w = rng.standard_normal((n, k)).astype("float32")
    bias = rng.standard_normal(n).astype("float32")
    X = te.placeholder((m, k), "float32", name="X")
    W = te.placeholder((n, k), "float32", name="W")
    Bs = te.placeholder((n,), "float32", name="bias")
    out_plain, out_fused = run_ops([(X, x), (W, w), (Bs, bias)],
                                   [ops.dense(X, W), ops.relu(ops.dense(X, W, Bs))])
    np.testing.assert_allclose(out_plain, x @ w.T, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(out_fused, np.maximum(x @ w.T + bias, 0), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("ba,bb,m,k,n,tb", [(3, 3, 5, 7, 9, False), (2, 1, 17, 8, 20, False), (4, 4, 6, 11, 3, True)])
def test_batch_matmul(run_ops, rng, ba, bb, m, k, n, tb):
    a = rng.standard_normal((ba, m, k)).astype("float32")
    b = rng.standard_normal((bb, n, k) if tb else (bb, k, n)).astype("float32")
    A = te.placeholder(a.shape, "float32", name="A")
    B = te.placeholder(b.shape, "float32", name="B")
    (out,) = run_ops([(A, a), (B, b)], [ops.batch_matmul(A, B, transpose_b=tb)])
    ref = a @ (np.swapaxes(b, 1, 2) if tb else b)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)


def test_matmul_shape_error():
    A = te.placeholder((3, 4), "float32", name="A")
    B = te.placeholder((5, 6), "float32", name="B")
    with pytest.raises(ValueError, match="inner dimensions"):
        ops.matmul(A, B)


@pytest.mark.parametrize("m,k,n", [(1, 1280, 37), (3, 77, 10), (2, 32, 5)])
def test_dense_few_rows_row_dot_path(run_ops, rng, m, k, n):
    """Few rows, long k: the partial-sum (row dot) formulation, with and without a k tail."""
    x = rng.standard_normal((m, k)).astype("float32")
    w = rng.standard_normal((n, k)).astype("float32")
    X = te.placeholder((m, k), "float32", name="X")
    W = te.placeholder((n, k), "float32", name="W")
    y = ops.dense(X, W)
    assert ops.tag_of(y.op) == "rowdot_final"
    (out,) = run_ops([(X, x), (W, w)], [y])
    np.testing.assert_allclose(out, x @ w.T, rtol=1e-4, atol=1e-3)
