"""Tensor expressions: every expression kind and dtype, compiled for the host and checked against numpy."""
from __future__ import annotations

import numpy as np
import pytest

import tether
from tether import runtime, te
from tether.errors import CompileError

RNG = np.random.default_rng(7)


def np_dtype(dtype: str):
    return np.bool_ if dtype == "bool" else np.dtype(dtype)


def run(tmp_path, s, args, inputs, name="k", vectorize_last=False, **build_kw):
    """Build ``s`` for the host, load the .so through the device runtime, run it, return the outputs."""
    lib = tether.build(s, args, target="host", name=name, **build_kw)
    path = lib.export_library(str(tmp_path / f"{name}.so"))
    f = runtime.load_module(path)[name]
    outs = [np.zeros(t.shape, dtype=np_dtype(t.dtype)) for t in args[len(inputs):]]
    f(*[np.ascontiguousarray(x) for x in inputs], *outs)
    return outs


def elementwise(tmp_path, shape, in_dtypes, fn, out_name="C", vec=8):
    """Build out = fn(*inputs) with the innermost axis split by ``vec`` and vectorized (tail included)."""
    ins = [te.placeholder(shape, dt, name=f"I{n}") for n, dt in enumerate(in_dtypes)]
    out = te.compute(shape, lambda *i: fn(*[x[i] for x in ins]), name=out_name)
    s = te.create_schedule(out.op)
    if vec:
        _, xi = s[out].split(out.op.axis[-1], factor=vec)
        s[out].vectorize(xi)
    return ins, out, s


def rand(shape, dtype):
    if dtype.startswith("float"):
        return RNG.uniform(-2, 2, shape).astype(dtype)
    if dtype == "bool":
        return RNG.integers(0, 2, shape).astype(bool)
    lo, hi = (-100, 100) if dtype == "int8" else (-1000, 1000)
    return RNG.integers(lo, hi, shape).astype(dtype)


@pytest.mark.parametrize("vec", [0, 8])
def test_arithmetic_float32_odd_size(tmp_path, vec):
    ins, out, s = elementwise(tmp_path, (3, 37), ["float32"] * 3,
                              lambda a, b, c: (a + b) * c - a / (te.abs(b) + 1.0) + (-c), vec=vec)
    a, b, c = (rand((3, 37), "float32") for _ in range(3))
    (got,) = run(tmp_path, s, ins + [out], [a, b, c])
    np.testing.assert_allclose(got, (a + b) * c - a / (np.abs(b) + 1) - c, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name,npfn,lo,hi", [
    ("exp", np.exp, -5, 5), ("log", np.log, 0.01, 10), ("sqrt", np.sqrt, 0, 10),
    ("rsqrt", lambda x: 1 / np.sqrt(x), 0.1, 10), ("tanh", np.tanh, -5, 5),
    ("sigmoid", lambda x: 1 / (1 + np.exp(-x)), -8, 8), ("floor", np.floor, -5, 5), ("ceil", np.ceil, -5, 5),
    ("abs", np.abs, -5, 5),
])
def test_math_functions_vectorized(tmp_path, name, npfn, lo, hi):
    ins, out, s = elementwise(tmp_path, (45,), ["float32"], lambda a: getattr(te, name)(a))
    a = RNG.uniform(lo, hi, 45).astype("float32")
    (got,) = run(tmp_path, s, ins + [out], [a])
    np.testing.assert_allclose(got, npfn(a), rtol=2e-5, atol=2e-6)


def test_erf_and_pow(tmp_path):
    import math
    ins, out, s = elementwise(tmp_path, (29,), ["float32", "float32"], lambda a, b: te.erf(a) + te.pow(b, a))
    a = RNG.uniform(-2, 2, 29).astype("float32")
    b = RNG.uniform(0.5, 3, 29).astype("float32")
    (got,) = run(tmp_path, s, ins + [out], [a, b])
    want = np.array([math.erf(x) for x in a], dtype="float64") + np.power(b.astype("float64"), a)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", ["int8", "int32", "int64"])
def test_integer_arithmetic_floor_division(tmp_path, dtype):
    shape = (21,)
    ins, out, s = elementwise(tmp_path, shape, [dtype, dtype],
                              lambda a, b: a * 3 - b + a // 7 + b % 5 + te.max(a, b) - te.min(a, b) // 2)
    a, b = rand(shape, dtype), rand(shape, dtype)
    (got,) = run(tmp_path, s, ins + [out], [a, b])
    a64, b64 = a.astype(np.int64), b.astype(np.int64)
    want = (a64 * 3 - b64 + a64 // 7 + b64 % 5 + np.maximum(a64, b64) - np.minimum(a64, b64) // 2).astype(dtype)
    np.testing.assert_array_equal(got, want)


def test_integer_division_by_tensor_negative_operands(tmp_path):
    ins, out, s = elementwise(tmp_path, (40,), ["int32", "int32"], lambda a, b: a // b * 1000 + a % b)
    a = RNG.integers(-50, 50, 40).astype("int32")
    b = RNG.choice([-7, -3, -1, 2, 5], 40).astype("int32")
    (got,) = run(tmp_path, s, ins + [out], [a, b])
    np.testing.assert_array_equal(got, a // b * 1000 + a % b)


def test_comparisons_logic_select_and_bool(tmp_path):
    shape = (33,)
    a_t = te.placeholder(shape, "float32", name="A")
    m_t = te.placeholder(shape, "bool", name="M")
    cond = te.compute(shape, lambda i: te.all(a_t[i] > -0.5, a_t[i] <= 1.0) | ~m_t[i] | (a_t[i] == 0.0),
                      name="Cond")
    out = te.compute(shape, lambda i: te.if_then_else(cond[i] & te.any(a_t[i] != 1.5, m_t[i]), a_t[i] * 2.0,
                                                      te.const(-1.0, "float32")), name="Out")
    s = te.create_schedule([cond.op, out.op])
    for t in (cond, out):
        _, xi = s[t].split(t.op.axis[0], factor=8)
        s[t].vectorize(xi)
    a = rand(shape, "float32")
    a[3] = 0.0
    m = rand(shape, "bool")
    got_cond, got = run(tmp_path, s, [a_t, m_t, cond, out], [a, m])
    want_cond = ((a > -0.5) & (a <= 1.0)) | ~m | (a == 0.0)
    np.testing.assert_array_equal(got_cond, want_cond)
    np.testing.assert_allclose(got, np.where(want_cond & ((a != 1.5) | m), a * 2, -1.0))


def test_casts_between_dtypes(tmp_path):
    shape = (19,)
    a_t = te.placeholder(shape, "float32", name="A")
    b_t = te.placeholder(shape, "int8", name="B")
    out_i = te.compute(shape, lambda i: a_t[i].astype("int32") + b_t[i].astype("int32"), name="OI")
    out_f64 = te.compute(shape, lambda i: a_t[i].astype("float64") * 2 + b_t[i].astype("float64"), name="OD")
    out_i8 = te.compute(shape, lambda i: (a_t[i] * 10.0).astype("int8"), name="OB")
    out_i64 = te.compute(shape, lambda i: b_t[i].astype("int64") * 100000000, name="OL")
    out_b = te.compute(shape, lambda i: a_t[i].astype("bool"), name="OBool")
    outs = [out_i, out_f64, out_i8, out_i64, out_b]
    s = te.create_schedule([o.op for o in outs])
    _, xi = s[out_i].split(out_i.op.axis[0], factor=4)
    s[out_i].vectorize(xi)
    a = rand(shape, "float32") * 5
    a[0] = 0.0
    b = rand(shape, "int8")
    got = run(tmp_path, s, [a_t, b_t] + outs, [a, b])
    np.testing.assert_array_equal(got[0], a.astype("int32") + b.astype("int32"))
    np.testing.assert_allclose(got[1], a.astype("float64") * 2 + b)
    np.testing.assert_array_equal(got[2], (a * 10).astype("int8"))
    np.testing.assert_array_equal(got[3], b.astype("int64") * 100000000)
    np.testing.assert_array_equal(got[4], a.astype(bool))


def test_reductions_sum_max_min_multi_axis(tmp_path):
    shape = (5, 7, 9)
    a_t = te.placeholder(shape, "float32", name="A")
    k1 = te.reduce_axis((0, 7), name="k1")
    k2 = te.reduce_axis((0, 9), name="k2")
    s_t = te.compute((5,), lambda i: te.sum(a_t[i, k1, k2], axis=[k1, k2]), name="S")
    r = te.reduce_axis((0, 9), name="r")
    mx = te.compute((5, 7), lambda i, j: te.max(a_t[i, j, r], axis=r), name="Mx")
    r2 = te.reduce_axis((2, 7), name="r2")  # a reduction over a sub-range
    mn = te.compute((5, 9), lambda i, j: te.min(a_t[i, r2, j], axis=r2), name="Mn")
    sch = te.create_schedule([s_t.op, mx.op, mn.op])
    a = rand(shape, "float32")
    got = run(tmp_path, sch, [a_t, s_t, mx, mn], [a])
    np.testing.assert_allclose(got[0], a.sum(axis=(1, 2)), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(got[1], a.max(axis=2))
    np.testing.assert_array_equal(got[2], a[:, 2:7, :].min(axis=1))


def test_sum_with_where_and_int_reduction(tmp_path):
    a_t = te.placeholder((6, 11), "int32", name="A")
    k = te.reduce_axis((0, 11), name="k")
    out = te.compute((6,), lambda i: te.sum(a_t[i, k], axis=k, where=a_t[i, k] > 0), name="Pos")
    s = te.create_schedule(out.op)
    a = rand((6, 11), "int32")
    (got,) = run(tmp_path, s, [a_t, out], [a])
    np.testing.assert_array_equal(got, np.where(a > 0, a, 0).sum(axis=1))


def test_index_arithmetic_in_compute(tmp_path):
    n = 23
    a_t = te.placeholder((n,), "float32", name="A")
    # reversed, shifted with clamping, and a strided read: index expressions, not just identity.
    out = te.compute((n,), lambda i: a_t[n - 1 - i] + te.if_then_else(i > 0, a_t[te.max(i - 1, 0)], 0.0)
                     + a_t[(i * 3) % n] + i.astype("float32"), name="O")
    s = te.create_schedule(out.op)
    _, xi = s[out].split(out.op.axis[0], factor=4)
    s[out].vectorize(xi)
    a = rand((n,), "float32")
    (got,) = run(tmp_path, s, [a_t, out], [a])
    idx = np.arange(n)
    want = a[::-1] + np.where(idx > 0, a[np.maximum(idx - 1, 0)], 0) + a[(idx * 3) % n] + idx
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_max_min_value_constants():
    assert te.max_value("int8").value == 127 and te.min_value("int8").value == -128
    assert te.max_value("float32").value == pytest.approx(3.4028235e38)
    assert te.min_value("int32").value == -(2 ** 31)


def test_expression_surface_types():
    a = te.placeholder((4, 4), "float32", name="A")
    i, j = te.var("i"), te.var("j")
    e = a[i, j] + 1
    assert e.dtype == "float32"
    assert (i + 1).dtype == "int32"
    assert (a[i, j] < 2.0).dtype == "bool"
    assert a[i, j].astype("int8").dtype == "int8"
    with pytest.raises(TypeError, match="Python bool"):
        bool(a[i, j] < 1.0)
    with pytest.raises(IndexError):
        a[i]
    with pytest.raises(TypeError, match="integer"):
        a[i, 1.5]
    with pytest.raises(TypeError, match="unsupported dtype"):
        te.placeholder((2,), "complex64")


def test_reduction_must_be_top_level():
    a = te.placeholder((4, 4), "float32", name="A")
    k = te.reduce_axis((0, 4), name="k")
    with pytest.raises(CompileError, match="whole body"):
        te.compute((4,), lambda i: te.sum(a[i, k], axis=k) * 2.0, name="Bad")


def test_compute_arg_count_mismatch():
    with pytest.raises(TypeError, match="2 dimensions"):
        te.compute((3, 4), lambda i: i, name="Bad")


def test_literals_adopt_the_expression_dtype():
    a = te.placeholder((4,), "float32", name="A")
    b = te.placeholder((4,), "int8", name="B")
    i = te.var("i")
    for e, want in [(np.float32(2) * a[i], "float32"), (a[i] + np.int64(3), "float32"), (i + 0.5, "float32"),
                    (b[i] + 3, "int8"), (b[i] + 3.5, "float32"), (a[i] + b[i], "float32"), (i + 2 ** 40, "int64")]:
        assert e.dtype == want and e.a.dtype == e.b.dtype == want, (str(e), e.a.dtype, e.b.dtype)
    wide = b[i] < 200      # 200 does not fit int8: the comparison happens in int32
    assert wide.a.dtype == wide.b.dtype == "int32"


def test_int8_compare_with_out_of_range_literal(tmp_path):
    b_t = te.placeholder((16,), "int8", name="B")
    out = te.compute((16,), lambda i: te.if_then_else(b_t[i] < 200, b_t[i] + 1, b_t[i]), name="O")
    s = te.create_schedule(out.op)
    b = rand((16,), "int8")
    b[0] = 127
    (got,) = run(tmp_path, s, [b_t, out], [b])
    np.testing.assert_array_equal(got, (b.astype(np.int32) + 1).astype(np.int8))
