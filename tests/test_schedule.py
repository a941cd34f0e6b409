"""Schedule primitives: each one compiled for the host and checked against numpy (odd sizes included), and
illegal schedules rejected with a ScheduleError that says why."""
from __future__ import annotations

import numpy as np
import pytest

import tether
from tether import runtime, te
from tether.errors import CompileError, ScheduleError

from fixtures.te_kernels import matmul, vadd as _vadd

RNG = np.random.default_rng(11)


def run(tmp_path, s, args, inputs, name="k"):
    lib = tether.build(s, args, target="host", name=name)
    path = lib.export_library(str(tmp_path / f"{name}.so"))
    f = runtime.load_module(path)[name]
    outs = [np.zeros(t.shape, dtype=t.dtype) for t in args[len(inputs):]]
    f(*inputs, *outs)
    return outs


def vadd(n):
    return _vadd(n, lambda x, y: x * 2.0 + y)


def rand(*shape):
    return RNG.uniform(-1, 1, shape).astype("float32")


@pytest.mark.parametrize("n,factor", [(64, 8), (67, 8), (5, 8), (100, 7)])
def test_split_vectorize_parallel_any_size(tmp_path, n, factor):
    a, b, c = vadd(n)
    s = te.create_schedule(c.op)
    xo, xi = s[c].split(c.op.axis[0], factor=factor)
    s[c].vectorize(xi)
    s[c].parallel(xo)
    x, y = rand(n), rand(n)
    (got,) = run(tmp_path, s, [a, b, c], [x, y])
    np.testing.assert_allclose(got, x * 2 + y, rtol=1e-6)


def test_split_nparts_and_nested_split_with_tails(tmp_path):
    a, b, c = vadd(103)
    s = te.create_schedule(c.op)
    xo, xi = s[c].split(c.op.axis[0], nparts=3)
    xio, xii = s[c].split(xi, factor=4)
    s[c].unroll(xii)
    x, y = rand(103), rand(103)
    (got,) = run(tmp_path, s, [a, b, c], [x, y])
    np.testing.assert_allclose(got, x * 2 + y, rtol=1e-6)


def test_tile_reorder_unroll_2d(tmp_path):
    m, n = 13, 21
    a = te.placeholder((m, n), "float32", name="A")
    c = te.compute((n, m), lambda j, i: a[i, j] + 1.0, name="T")  # transpose: strided (gathered) loads
    s = te.create_schedule(c.op)
    jo, io, ji, ii = s[c].tile(c.op.axis[0], c.op.axis[1], 4, 8)
    s[c].vectorize(ii)
    s[c].unroll(ji)
    x = rand(m, n)
    (got,) = run(tmp_path, s, [a, c], [x])
    np.testing.assert_allclose(got, x.T + 1)


def test_fuse_then_split_parallel(tmp_path):
    shape = (7, 9, 5)
    a = te.placeholder(shape, "float32", name="A")
    c = te.compute(shape, lambda i, j, k: a[i, j, k] * a[i, j, k], name="Sq")
    s = te.create_schedule(c.op)
    f = s[c].fuse(c.op.axis[0], c.op.axis[1])
    fo, fi = s[c].split(f, factor=4)   # 63 is not a multiple of 4: an if-guard on fused indices
    s[c].parallel(fo)
    s[c].vectorize(c.op.axis[2])
    x = rand(*shape)
    (got,) = run(tmp_path, s, [a, c], [x])
    np.testing.assert_allclose(got, x * x, rtol=1e-6)


def test_fuse_all_axes_and_vectorize_fused_tail(tmp_path):
    shape = (3, 11)
    a = te.placeholder(shape, "float32", name="A")
    c = te.compute(shape, lambda i, j: a[i, j] - 3.0, name="C")
    s = te.create_schedule(c.op)
    f = s[c].fuse(*c.op.axis)
    _, fi = s[c].split(f, factor=8)
    s[c].vectorize(fi)
    x = rand(*shape)
    (got,) = run(tmp_path, s, [a, c], [x])
    np.testing.assert_allclose(got, x - 3)


def test_vectorized_loop_with_lane_dependent_guard_falls_back_to_scalar(tmp_path):
    a = te.placeholder((7, 9), "float32", name="A")
    c = te.compute((7, 9), lambda i, j: a[i, j] + 0.5, name="C")
    s = te.create_schedule(c.op)
    io, ii = s[c].split(c.op.axis[0], factor=2)
    f = s[c].fuse(ii, c.op.axis[1])
    s[c].vectorize(f)                                   # guard `io*2 + f // 9 < 7` depends on the lane
    x = rand(7, 9)
    (got,) = run(tmp_path, s, [a, c], [x])
    np.testing.assert_allclose(got, x + 0.5)


def test_compute_inline_chain(tmp_path):
    a, b, _ = vadd(50)
    t1 = te.compute((50,), lambda i: a[i] * b[i], name="T1")
    t2 = te.compute((50,), lambda i: te.exp(t1[i]) + t1[i], name="T2")
    out = te.compute((50,), lambda i: te.max(t2[i], 0.5), name="Out")
    s = te.create_schedule(out.op)
    s[t1].compute_inline()
    s[t2].compute_inline()
    _, xi = s[out].split(out.op.axis[0], factor=8)
    s[out].vectorize(xi)
    text = str(tether.lower(s, [a, b, out], "fused"))
    assert "T1" not in text and "T2" not in text and "allocate" not in text
    x, y = rand(50), rand(50)
    (got,) = run(tmp_path, s, [a, b, out], [x, y])
    np.testing.assert_allclose(got, np.maximum(np.exp(x * y) + x * y, 0.5), rtol=1e-5)


def test_intermediate_stage_at_root_gets_a_buffer(tmp_path):
    a, b, _ = vadd(37)
    t = te.compute((37,), lambda i: a[i] + b[i], name="T")
    out = te.compute((37,), lambda i: t[36 - i] * 2.0, name="Out")
    s = te.create_schedule(out.op)
    x, y = rand(37), rand(37)
    (got,) = run(tmp_path, s, [a, b, out], [x, y])
    np.testing.assert_allclose(got, (x + y)[::-1] * 2, rtol=1e-6)


def test_compute_at_stencil_region(tmp_path):
    n = 45
    a = te.placeholder((n + 2,), "float32", name="A")
    p = te.compute((n + 2,), lambda i: a[i] * 3.0, name="P")
    c = te.compute((n,), lambda i: p[i] + p[i + 1] + p[i + 2], name="C")
    s = te.create_schedule(c.op)
    xo, xi = s[c].split(c.op.axis[0], factor=8)
    s[p].compute_at(s[c], xo)
    s[c].vectorize(xi)
    text = str(tether.lower(s, [a, c], "stencil"))
    assert "allocate P: float32[10]" in text    # 8 outputs need 8 + 2 inputs
    x = rand(n + 2)
    (got,) = run(tmp_path, s, [a, c], [x])
    y = x * 3
    np.testing.assert_allclose(got, y[:-2] + y[1:-1] + y[2:], rtol=1e-5)


@pytest.mark.parametrize("m,n,k", [(64, 48, 32), (67, 45, 33), (3, 5, 7)])
def test_cache_write_register_blocked_matmul(tmp_path, m, n, k):
    a, b, c = matmul(m, n, k)
    s = te.create_schedule(c.op)
    cl = s.cache_write(c, "local")
    io, jo, ii, ji = s[c].tile(c.op.axis[0], c.op.axis[1], 4, 16)
    s[c].vectorize(ji)
    s[c].parallel(io)
    s[cl].compute_at(s[c], jo)
    ci, cj = s[cl].op.axis
    (ck,) = s[cl].op.reduce_axis
    ko, ki = s[cl].split(ck, factor=4)
    s[cl].reorder(ko, ki, ci, cj)
    s[cl].unroll(ki)
    s[cl].unroll(ci)
    s[cl].vectorize(cj)
    x, y = rand(m, k), rand(k, n)
    (got,) = run(tmp_path, s, [a, b, c], [x, y])
    np.testing.assert_allclose(got, x @ y, rtol=1e-4, atol=1e-4)


def test_reduction_axis_split_and_reordered_outside_spatial(tmp_path):
    a, b, c = matmul(9, 19, 13)
    s = te.create_schedule(c.op)
    i, j = c.op.axis
    (k,) = c.op.reduce_axis
    ko, ki = s[c].split(k, factor=5)
    jo, ji = s[c].split(j, factor=8)
    s[c].reorder(i, jo, ko, ki, ji)
    s[c].vectorize(ji)
    s[c].parallel(i)
    x, y = rand(9, 13), rand(13, 19)
    (got,) = run(tmp_path, s, [a, b, c], [x, y])
    np.testing.assert_allclose(got, x @ y, rtol=1e-4, atol=1e-5)


def test_compute_root_undoes_inline(tmp_path):
    a, b, _ = vadd(10)
    t = te.compute((10,), lambda i: a[i] + b[i], name="T")
    out = te.compute((10,), lambda i: t[i] * t[i], name="Out")
    s = te.create_schedule(out.op)
    s[t].compute_inline()
    s[t].compute_root()
    assert "allocate T" in str(tether.lower(s, [a, b, out], "k"))
    x, y = rand(10), rand(10)
    (got,) = run(tmp_path, s, [a, b, out], [x, y])
    np.testing.assert_allclose(got, (x + y) ** 2, rtol=1e-6)


# ---- illegal schedules -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("primitive, why", [("vectorize", "reduction axis"), ("parallel", "race")])
def test_error_vectorize_or_parallel_reduction_axis(primitive, why):
    _, _, c = matmul(4, 4, 4)
    s = te.create_schedule(c.op)
    with pytest.raises(ScheduleError, match=why):
        getattr(s[c], primitive)(c.op.reduce_axis[0])


def test_error_split_axis_of_another_stage():
    a, b, c = vadd(8)
    d = te.compute((8,), lambda i: c[i] + 1.0, name="D")
    s = te.create_schedule(d.op)
    with pytest.raises(ScheduleError, match="does not belong to stage 'D'"):
        s[d].split(c.op.axis[0], factor=2)


def test_error_split_twice_and_bad_factor():
    _, _, c = vadd(8)
    s = te.create_schedule(c.op)
    s[c].split(c.op.axis[0], factor=2)
    with pytest.raises(ScheduleError, match="already split"):
        s[c].split(c.op.axis[0], factor=2)
    s2 = te.create_schedule(c.op)
    with pytest.raises(ScheduleError, match="positive int"):
        s2[c].split(c.op.axis[0], factor=0)
    with pytest.raises(ScheduleError, match="exactly one"):
        s2[c].split(c.op.axis[0])


def test_error_compute_inline_reduction_and_output():
    a, b, c = matmul(4, 4, 4)
    s = te.create_schedule(c.op)
    with pytest.raises(ScheduleError, match="reduction"):
        s[c].compute_inline()
    x, y, z = vadd(4)
    s = te.create_schedule(z.op)
    s[z].compute_inline()
    with pytest.raises(ScheduleError, match="kernel argument"):
        tether.lower(s, [x, y, z], "k")


def test_error_parallel_inside_vectorized():
    _, _, c = vadd(64)
    s = te.create_schedule(c.op)
    xo, xi = s[c].split(c.op.axis[0], factor=8)
    s[c].vectorize(xo)
    s[c].parallel(xi)
    a, b = c.op.input_tensors
    with pytest.raises(ScheduleError, match="inside vectorized loop"):
        tether.lower(s, [a, b, c], "k")


def test_error_vectorize_too_wide_and_nested():
    a, b, c = vadd(1000)
    s = te.create_schedule(c.op)
    s[c].vectorize(c.op.axis[0])
    with pytest.raises(ScheduleError, match="too wide"):
        tether.lower(s, [a, b, c], "k")
    s = te.create_schedule(c.op)
    xo, xi = s[c].split(c.op.axis[0], factor=4)
    s[c].vectorize(xo)
    with pytest.raises(ScheduleError, match="too wide"):
        tether.lower(s, [a, b, c], "k")


def test_error_nested_parallel():
    a = te.placeholder((8, 8), "float32", name="A")
    c = te.compute((8, 8), lambda i, j: a[i, j], name="C")
    s = te.create_schedule(c.op)
    s[c].parallel(c.op.axis[0])
    s[c].parallel(c.op.axis[1])
    with pytest.raises(ScheduleError, match="nested inside parallel"):
        tether.lower(s, [a, c], "k")


def test_error_fuse_not_adjacent_or_mixed():
    a, b, c = matmul(4, 4, 4)
    s = te.create_schedule(c.op)
    i, j = c.op.axis
    with pytest.raises(ScheduleError, match="adjacent"):
        s[c].fuse(j, i)
    with pytest.raises(ScheduleError, match="data and reduction"):
        s[c].fuse(j, c.op.reduce_axis[0])


def test_error_compute_at_non_consumer():
    a, b, c = vadd(8)
    t = te.compute((8,), lambda i: a[i] + 1.0, name="T")
    u = te.compute((8,), lambda i: t[i] * 2.0, name="U")
    d = te.compute((8,), lambda i: u[i] + t[i], name="D")
    s = te.create_schedule(d.op)
    s[t].compute_at(s[u], u.op.axis[0])   # T is also read by D
    with pytest.raises(ScheduleError, match="read by"):
        tether.lower(s, [a, d], "k")
    with pytest.raises(ScheduleError, match="itself"):
        s[t].compute_at(s[t], t.op.axis[0])


def test_error_placeholder_stage_and_cache_write_after_split():
    a, b, c = vadd(8)
    s = te.create_schedule(c.op)
    with pytest.raises(ScheduleError, match="placeholder"):
        s[a].split(a.op.output(0).shape[0], factor=2) if False else s[a].compute_inline()
    s[c].split(c.op.axis[0], factor=2)
    with pytest.raises(ScheduleError, match="before splitting"):
        s.cache_write(c, "local")


def test_error_missing_input_and_unused_stage():
    a, b, c = vadd(8)
    s = te.create_schedule(c.op)
    with pytest.raises(CompileError, match="not in args"):
        tether.lower(s, [a, c], "k")
    t = te.compute((8,), lambda i: a[i], name="T")
    d = te.compute((8,), lambda i: t[i], name="D")
    s = te.create_schedule(d.op)
    with pytest.raises(CompileError, match="neither passed"):
        tether.lower(s, [a, t], "k")


def test_compute_at_of_an_output_and_nested_compute_at(tmp_path):
    n = 21
    a = te.placeholder((n,), "float32", name="A")
    t = te.compute((n,), lambda i: a[i] * 2.0, name="T")          # an output computed inside C's loop
    c = te.compute((n,), lambda i: t[i] + 1.0, name="C")
    s = te.create_schedule(c.op)
    xo, _ = s[c].split(c.op.axis[0], factor=4)
    s[t].compute_at(s[c], xo)
    x = rand(n)
    got_t, got_c = run(tmp_path, s, [a, t, c], [x], name="two")
    np.testing.assert_allclose(got_t, x * 2)
    np.testing.assert_allclose(got_c, x * 2 + 1, rtol=1e-6)

    p = te.compute((n,), lambda i: a[i] + 3.0, name="P")
    q = te.compute((n,), lambda i: p[i] * p[i], name="Q")
    r = te.compute((n,), lambda i: q[i] - 1.0, name="R")
    s = te.create_schedule(r.op)
    ro, ri = s[r].split(r.op.axis[0], factor=8)
    s[q].compute_at(s[r], ro)
    qo, _ = s[q].split(q.op.axis[0], factor=2)
    s[p].compute_at(s[q], qo)                                      # P inside Q inside R
    s[r].vectorize(ri)
    text = str(tether.lower(s, [a, r], "nest"))
    assert "allocate Q: float32[8]" in text and "allocate P: float32[2]" in text
    assert "i.outer_1" in text                                     # same-named loops print distinctly
    (got,) = run(tmp_path, s, [a, r], [x], name="nest")
    np.testing.assert_allclose(got, (x + 3) ** 2 - 1, rtol=1e-5)


def _random_schedule(rng, s, st, prod):
    """Apply random splits/fuses/reorders/annotations (and inline/compute_at of ``prod``) to stage ``st``;
    ``rng`` is a random.Random."""
    for _ in range(rng.randint(0, 3)):
        leaves = list(st.leaf_iter_vars)
        ax = rng.choice(leaves)
        op = rng.choice(["split", "split", "fuse", "reorder"])
        if op == "split":
            if rng.random() < 0.7:
                st.split(ax, factor=rng.randint(1, 9))
            else:
                st.split(ax, nparts=rng.randint(1, 5))
        elif op == "fuse":
            n = leaves.index(ax)
            if n + 1 < len(leaves) and leaves[n + 1].kind == ax.kind:
                st.fuse(ax, leaves[n + 1])
        else:
            rng.shuffle(leaves)
            st.reorder(*leaves)
    leaves = list(st.leaf_iter_vars)
    data = [lv for lv in leaves if lv.kind == "data"]
    if data and rng.random() < 0.6:
        st.vectorize(data[-1])
    if data and rng.random() < 0.4 and data[0] not in list(st.iter_kind):
        st.parallel(data[0])
    if rng.random() < 0.3:
        u = rng.choice(leaves)
        if u not in list(st.iter_kind):
            st.unroll(u)
    if prod is not None:
        c = rng.random()
        if c < 0.3:
            s[prod].compute_inline()
        elif c < 0.6:
            s[prod].compute_at(st, rng.choice(list(st.leaf_iter_vars)))


@pytest.mark.parametrize("seed", [11, 12, 13])
def test_random_schedules_match_numpy(tmp_path, seed):
    """Random legal schedules of an elementwise pair, a matmul and a max-reduction, on random (odd) shapes."""
    import random
    rng = random.Random(seed)
    ran = 0
    for case in range(6):
        kind = ("ew", "mm", "red")[case % 3]
        if kind == "ew":
            shape = (rng.randint(1, 9), rng.randint(1, 40))
            a, b = te.placeholder(shape, name="A"), te.placeholder(shape, name="B")
            prod = te.compute(shape, lambda i, j: a[i, j] * b[i, j], name="T")
            out = te.compute(shape, lambda i, j: prod[i, j] + a[i, shape[1] - 1 - j], name="C")
            ref = lambda x, y: x * y + x[:, ::-1]  # noqa: E731
        elif kind == "mm":
            m, n, k = rng.randint(1, 20), rng.randint(1, 40), rng.randint(1, 17)
            a, b, out = matmul(m, n, k)
            prod, ref = None, lambda x, y: x @ y  # noqa: E731
        else:
            m, n = rng.randint(1, 12), rng.randint(1, 30)
            a, b = te.placeholder((m, n), name="A"), te.placeholder((n,), name="B")
            r = te.reduce_axis((0, n), name="r")
            out = te.compute((m,), lambda i: te.max(a[i, r] + b[r], axis=r), name="C")
            prod, ref = None, lambda x, y: (x + y).max(axis=1)  # noqa: E731
        s = te.create_schedule(out.op)
        try:
            _random_schedule(rng, s, s[out], prod)
            tether.lower(s, [a, b, out], "k")
        except ScheduleError:
            continue   # an illegal combination, rejected with a reason: fine
        x, y = rand(*a.shape), rand(*b.shape)
        (got,) = run(tmp_path, s, [a, b, out], [x, y], name=f"k{case}")
        np.testing.assert_allclose(got, ref(x, y), rtol=1e-4, atol=1e-5)
        ran += 1
    assert ran >= 3
