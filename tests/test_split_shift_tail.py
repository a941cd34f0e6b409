"""te Stage.split(..., shift_tail=True): the last tile of a non-dividing split is shifted back to end at the
extent (whole vectors, points of the overlap computed twice) instead of clamped loops; the in-place pointwise
matmul's column tiles use it (ops/schedules.py _tile_shifted). Results against numpy, and the lowered loops."""
import numpy as np
import pytest

import tether
from tether import ops, te
from tether.errors import ScheduleError


@pytest.mark.parametrize("m, k, n", [(40, 64, 1900), (12, 16, 33), (7, 9, 100), (24, 8, 32), (5, 3, 20)])
def test_blocked_matmul_with_a_shifted_tile_matches_numpy(run_ops, rng, m, k, n):
    a = rng.standard_normal((m, k)).astype("float32")
    b = rng.standard_normal((k, n)).astype("float32")
    A = te.placeholder(a.shape, "float32", name="A")
    B = te.placeholder(b.shape, "float32", name="B")
    out = ops.relu(ops.matmul(A, B, block=(12, 32)))
    text = str(tether.lower(ops.schedule(out, target="host"), [A, B, out]))
    if n > 32 and n % 32:
        assert "min(32," not in text, text                   # no clamped (partial) column loop
        assert "* 32, %d)" % (n - 32) in text, text          # the shifted start: min(jo * 32, n - 32)
    got, = run_ops([(A, a), (B, b)], [out])
    np.testing.assert_allclose(got, np.maximum(a @ b, 0), rtol=1e-4, atol=1e-4)


def test_shifted_split_of_an_elementwise_stage(run_ops, rng):
    x = rng.standard_normal((3, 45)).astype("float32")
    X = te.placeholder(x.shape, "float32", name="X")
    Y = te.compute(x.shape, lambda i, j: X[i, j] * 2.0 + 1.0, name="Y")
    s = te.create_schedule(Y.op)
    jo, ji = s[Y].split(Y.op.axis[1], factor=16, shift_tail=True)
    s[Y].vectorize(ji)
    text = str(tether.lower(s, [X, Y]))
    assert "min(16," not in text and "range(3)" in text, text       # 3 whole tiles: 0, 16, 29
    got, = run_ops([(X, x)], [Y], schedule=s)
    np.testing.assert_allclose(got, x * 2 + 1, rtol=1e-6)


def test_shift_tail_needs_a_factor():
    X = te.placeholder((4, 40), "float32", name="X")
    Y = te.compute((4, 40), lambda i, j: X[i, j] + 1.0, name="Y")
    s = te.create_schedule(Y.op)
    with pytest.raises(ScheduleError, match="shift_tail"):
        s[Y].split(Y.op.axis[1], nparts=3, shift_tail=True)
