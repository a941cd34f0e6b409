"""Elementwise math and activations against numpy, on shapes the vector width does not divide."""
import math

import numpy as np
import pytest

from tether import ops, te

_erf = np.vectorize(math.erf, otypes=[np.float32])

BINARY = {
    "add": np.add, "subtract": np.subtract, "multiply": np.multiply, "divide": np.divide,
    "maximum": np.maximum, "minimum": np.minimum,
}


@pytest.mark.parametrize("sa,sb", [((37,), (37,)), ((5, 19), (19,)), ((3, 1, 13), (1, 7, 1)), ((2, 33), (2, 1))])
def test_binary_broadcast(run_ops, rng, sa, sb):
    """Every binary op on one pair of shapes, built as one module with one output per op."""
    a_np = rng.standard_normal(sa).astype("float32")
    b_np = rng.standard_normal(sb).astype("float32")
    b_np = np.where(np.abs(b_np) < 0.1, 1.0, b_np).astype("float32")  # divide
    A = te.placeholder(sa, "float32", name="A")
    B = te.placeholder(sb, "float32", name="B")
    kinds = sorted(BINARY)
    outs = run_ops([(A, a_np), (B, b_np)], [getattr(ops, kind)(A, B) for kind in kinds])
    for kind, out in zip(kinds, outs):
        np.testing.assert_allclose(out, BINARY[kind](a_np, b_np), rtol=1e-6, atol=1e-6, err_msg=kind)


def test_binary_with_scalar(run_ops, rng):
    a_np = rng.standard_normal((3, 11)).astype("float32")
    A = te.placeholder((3, 11), "float32", name="A")
    (o1, o2) = run_ops([(A, a_np)], [ops.multiply(A, 2.5), ops.subtract(1.0, A)])
    np.testing.assert_allclose(o1, a_np * 2.5, rtol=1e-6)
    np.testing.assert_allclose(o2, 1.0 - a_np, rtol=1e-6)


def test_power(run_ops, rng):
    a_np = rng.uniform(0.1, 3.0, (29,)).astype("float32")
    b_np = rng.uniform(-2.0, 2.0, (29,)).astype("float32")
    A = te.placeholder((29,), "float32", name="A")
    B = te.placeholder((29,), "float32", name="B")
    (out,) = run_ops([(A, a_np), (B, b_np)], [ops.power(A, B)])
    np.testing.assert_allclose(out, np.power(a_np, b_np), rtol=1e-5)


UNARY = {
    "exp": (np.exp, (-5, 5)), "log": (np.log, (0.01, 50)), "sqrt": (np.sqrt, (0, 100)),
    "rsqrt": (lambda x: 1 / np.sqrt(x), (0.01, 100)), "abs": (np.abs, (-5, 5)), "floor": (np.floor, (-5, 5)),
    "ceil": (np.ceil, (-5, 5)), "negative": (np.negative, (-5, 5)), "erf": (_erf, (-4, 4)),
}


def test_unary(run_ops, rng):
    kinds = sorted(UNARY)
    xs = [rng.uniform(*UNARY[k][1], (3, 23)).astype("float32") for k in kinds]
    Xs = [te.placeholder((3, 23), "float32", name=f"X{i}") for i in range(len(kinds))]
    outs = run_ops(list(zip(Xs, xs)), [getattr(ops, k)(X) for k, X in zip(kinds, Xs)])
    for k, x_np, out in zip(kinds, xs, outs):
        np.testing.assert_allclose(out, UNARY[k][0](x_np), rtol=2e-6 if k != "rsqrt" else 1e-5, atol=1e-6,
                                   err_msg=k)


def _hard_sigmoid(x):
    return np.clip(0.2 * x + 0.5, 0, 1)


ACTIVATIONS = {
    "relu": lambda x: np.maximum(x, 0),
    "relu6": lambda x: np.clip(x, 0, 6),
    "leaky_relu": lambda x: np.where(x > 0, x, 0.01 * x),
    "hard_sigmoid": _hard_sigmoid,
    "hard_swish": lambda x: x * np.clip(x + 3, 0, 6) / 6,
    "sigmoid": lambda x: 1 / (1 + np.exp(-x.astype(np.float64))),
    "tanh": np.tanh,
    "gelu": lambda x: 0.5 * x * (1 + _erf(x / np.sqrt(2.0))),
}


@pytest.mark.parametrize("shape", [(45,), (2, 3, 17)])
def test_activation(run_ops, rng, shape):
    x_np = (rng.standard_normal(shape) * 4).astype("float32")
    X = te.placeholder(shape, "float32", name="X")
    kinds = sorted(ACTIVATIONS)
    outs = run_ops([(X, x_np)], [getattr(ops, k)(X) for k in kinds])
    for k, out in zip(kinds, outs):
        np.testing.assert_allclose(out, ACTIVATIONS[k](x_np), rtol=1e-5, atol=1e-6, err_msg=k)


def test_leaky_relu_alpha_and_clip(run_ops, rng):
    x_np = (rng.standard_normal((31,)) * 3).astype("float32")
    X = te.placeholder((31,), "float32", name="X")
    o1, o2 = run_ops([(X, x_np)], [ops.leaky_relu(X, alpha=0.2), ops.clip(X, -1.0, 0.5)])
    np.testing.assert_allclose(o1, np.where(x_np > 0, x_np, 0.2 * x_np), rtol=1e-6)
    np.testing.assert_allclose(o2, np.clip(x_np, -1.0, 0.5), rtol=1e-6)


def test_fused_chain_relu_a_mul_b_plus_c(run_ops, rng):
    """The benchmark kernel: three elementwise ops inlined into one loop, odd length."""
    n = 1003
    a, b, cc = (rng.standard_normal(n).astype("float32") for _ in range(3))
    A, B, C = (te.placeholder((n,), "float32", name=nm) for nm in "ABC")
    out = ops.relu(ops.add(ops.multiply(A, B), C))
    (res,) = run_ops([(A, a), (B, b), (C, cc)], [out])
    np.testing.assert_allclose(res, np.maximum(a * b + cc, 0), rtol=1e-6, atol=1e-6)


def test_broadcast_shape_error():
    A = te.placeholder((3, 4), "float32", name="A")
    B = te.placeholder((5,), "float32", name="B")
    with pytest.raises(ValueError, match="cannot be broadcast"):
        ops.add(A, B)


def test_int32_elementwise_and_reduce(run_ops, rng):
    a = rng.integers(-50, 50, 37).astype("int32")
    b = rng.integers(-50, 50, 37).astype("int32")
    A = te.placeholder((37,), "int32", name="A")
    B = te.placeholder((37,), "int32", name="B")
    outs = run_ops([(A, a), (B, b)], [ops.add(A, B), ops.relu(A), ops.maximum(A, B), ops.multiply(A, 3),
                                      ops.sum(A, axis=0, keepdims=True), ops.max(B, axis=0)])
    refs = [a + b, np.maximum(a, 0), np.maximum(a, b), a * 3, a.sum(keepdims=True), b.max()]
    for got, ref in zip(outs, refs):
        assert got.dtype == np.int32
        np.testing.assert_array_equal(got, ref)
