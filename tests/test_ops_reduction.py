"""Reductions and the softmax family against numpy."""
import numpy as np
import pytest

from tether import ops, te

CASES = [((37,), None, False), ((5, 13), 1, False), ((5, 13), 0, True), ((3, 7, 9), (0, 2), False),
         ((3, 7, 9), -1, True), ((2, 3, 5, 11), (2, 3), True)]


@pytest.mark.parametrize("shape,axis,keepdims", CASES)
def test_reduce(run_ops, rng, shape, axis, keepdims):
    x_np = rng.standard_normal(shape).astype("float32")
    X = te.placeholder(shape, "float32", name="X")
    kinds = ["sum", "mean", "max", "min"]
    outs = run_ops([(X, x_np)], [getattr(ops, k)(X, axis=axis, keepdims=keepdims) for k in kinds])
    for k, out in zip(kinds, outs):
        ref = getattr(np, k)(x_np, axis=axis, keepdims=keepdims)
        np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5, err_msg=k)


def _softmax(x, axis):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


@pytest.mark.parametrize("shape,axis", [((7, 19), -1), ((3, 10), 0), ((2, 5, 13), 1), ((1, 1000), -1)])
def test_softmax_and_log_softmax(run_ops, rng, shape, axis):
    x_np = (rng.standard_normal(shape) * 5).astype("float32")
    X = te.placeholder(shape, "float32", name="X")
    sm, lsm = run_ops([(X, x_np)], [ops.softmax(X, axis=axis), ops.log_softmax(X, axis=axis)])
    ref = _softmax(x_np.astype(np.float64), axis)
    np.testing.assert_allclose(sm, ref, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(lsm, np.log(ref), rtol=1e-5, atol=1e-5)


def test_bad_axis():
    X = te.placeholder((3, 4), "float32", name="X")
    with pytest.raises(ValueError, match="out of range"):
        ops.sum(X, axis=2)
