"""Lowering to loop IR: loop structure and kinds, tails, simplified index arithmetic, the printed form."""
from __future__ import annotations

import importlib

import numpy as np
import pytest

import tether
from tether import te, tir
from tether.tir import Binary, Const
from tether.tir.simplify import const_bound, simplify

from fixtures.te_kernels import matmul, vadd, vadd_schedule


def loops(pf):
    return [s for s in tir.walk(pf.body) if isinstance(s, tir.For)]


def test_split_vectorize_parallel_structure_and_text():
    s, args = vadd_schedule(1024, factor=8)
    pf = tether.lower(s, args, "vadd")
    assert pf.name == "vadd"
    assert [p.name for p in pf.params] == ["A", "B", "C"]
    assert pf.params[2].shape == (1024,) and pf.params[2].dtype == "float32"
    ls = loops(pf)
    assert [(l.var.name, l.kind, l.extent.value) for l in ls] == [("i.outer", "parallel", 128),
                                                                 ("i.inner", "vectorized", 8)]
    text = str(pf)
    assert text.splitlines() == [
        "def vadd(A: float32[1024], B: float32[1024], C: float32[1024]):",
        "  for i.outer in range(128) parallel:",
        "    for i.inner in range(8) vectorized:",
        "      C[i.outer * 8 + i.inner] = A[i.outer * 8 + i.inner] + B[i.outer * 8 + i.inner]",
    ]
    assert pf.parallel


def test_non_dividing_split_gets_clamped_tail_and_partition():
    """A constant outer loop splits into its full iterations (constant vector body, no checks) and the one
    partial iteration (scalar remainder) after it."""
    a, b, c = vadd(1003)
    s = te.create_schedule(c.op)
    xo, xi = s[c].split(c.op.axis[0], factor=8)
    s[c].vectorize(xi)
    pf = tether.lower(s, [a, b, c], "vadd")
    head, tail = [f for f in loops(pf) if f.var.name == "i.outer"]
    assert head.extent.value == 125 and head.min.value == 0             # floor(1003 / 8) full vectors
    assert tail.min.value == 125 and tail.extent.value == 1             # ceil(1003 / 8) - 125
    full, rest = head.body, tail.body
    assert isinstance(full, tir.For) and full.kind == "vectorized" and full.extent.value == 8
    assert isinstance(rest, tir.For) and rest.kind == "serial" and rest.tail
    assert str(rest.extent) == "min(8, 1003 - i.outer * 8)"
    np_a, np_b = np.arange(1003, dtype=np.float32), np.ones(1003, np.float32)
    out = np.zeros(1003, np.float32)
    tether.build(s, [a, b, c], name="vadd").load()["vadd"](np_a, np_b, out)
    np.testing.assert_array_equal(out, np_a + 1)


def test_partition_stays_an_if_when_the_outer_loop_is_not_constant():
    """Inside another loop's clamp the partial test cannot be resolved at compile time: if full / else."""
    a = te.placeholder((37, 29), "float32", name="A")
    c = te.compute((37, 29), lambda i, j: a[i, j] * 2.0, name="C")
    s = te.create_schedule(c.op)
    f = s[c].fuse(*c.op.axis)
    fo, fi = s[c].split(f, factor=64)
    fio, fii = s[c].split(fi, factor=8)
    s[c].vectorize(fii)
    text = str(tether.lower(s, [a, c], "k"))
    assert "if " in text and "== 8:" in text, text


def test_the_remainder_copy_does_not_unroll_around_its_remainder_loops():
    """In the partial copy an unrolled loop around a remainder loop runs as a loop (it would only copy that loop:
    conv2d_pixels' write-back of a partial pixel block); the full copy keeps it unrolled."""
    a = te.placeholder((41, 8), "float32", name="A")       # 41 = 3 x 12 + 5: a remainder of 5 lanes
    c = te.compute((8, 41), lambda i, j: a[j, i] + 1.0, name="C")
    s = te.create_schedule(c.op)
    jo, ji = s[c].split(c.op.axis[1], factor=12)
    s[c].reorder(jo, c.op.axis[0], ji)
    s[c].unroll(c.op.axis[0])
    s[c].vectorize(ji)
    pf = tether.lower(s, [a, c], "k")
    copies = [f for f in loops(pf) if f.var.name == "i"]
    assert sorted(f.kind for f in copies) == ["serial", "unrolled"], [f.kind for f in copies]
    rest = next(f for f in copies if f.kind == "serial")
    assert rest.tail and isinstance(rest.body, tir.For) and rest.body.tail
    x = np.arange(328, dtype=np.float32).reshape(41, 8)
    out = np.zeros((8, 41), np.float32)
    tether.build(s, [a, c], name="k").load()["k"](x, out)
    np.testing.assert_array_equal(out, x.T + 1)


def test_fused_index_simplifies_back_to_linear():
    a = te.placeholder((7, 9), "float32", name="A")
    c = te.compute((7, 9), lambda i, j: a[i, j] * 2.0, name="C")
    s = te.create_schedule(c.op)
    f = s[c].fuse(*c.op.axis)
    s[c].split(f, factor=5)   # 63 = 12*5 + 3: the guard is linear in the inner loop -> a clamp
    text = str(tether.lower(s, [a, c], "k"))
    assert "for i.j.fused.inner in range(min(5, 63 - i.j.fused.outer * 5)):" in text
    # (x // 9) * 9 + x % 9 folds back to x
    assert "C[i.j.fused.outer * 5 + i.j.fused.inner] = A[i.j.fused.outer * 5 + i.j.fused.inner] * 2.0f" in text


def test_non_linear_guard_becomes_if():
    a = te.placeholder((7, 9), "float32", name="A")
    c = te.compute((7, 9), lambda i, j: a[i, j] * 2.0, name="C")
    s = te.create_schedule(c.op)
    io, ii = s[c].split(c.op.axis[0], factor=2)       # 7 rows: a tail
    s[c].fuse(ii, c.op.axis[1])                       # the tail guard now divides the fused index
    pf = tether.lower(s, [a, c], "k")
    ifs = [x for x in tir.walk(pf.body) if isinstance(x, tir.IfThenElse)]
    assert len(ifs) == 1 and str(ifs[0].cond) == "i.outer * 2 + i.inner.j.fused // 9 < 7"


def test_reduction_init_and_update_nests():
    a, b, c = matmul(6, 10, 5)
    s = te.create_schedule(c.op)
    i, j = c.op.axis
    s[c].reorder(i, c.op.reduce_axis[0], j)
    pf = tether.lower(s, [a, b, c], "mm")
    text = str(pf).splitlines()
    assert text[1:] == [
        "  for i in range(6):",
        "    for j in range(10):",
        "      C[i * 10 + j] = 0.0f",
        "    for k in range(5):",
        "      for j in range(10):",
        "        C[i * 10 + j] = C[i * 10 + j] + A[i * 5 + k] * B[k * 10 + j]",
    ]


def test_reduction_init_reads_a_tensor_at_the_output_index(tmp_path):
    """te.sum(..., init=bias[j]): the init store reads the tensor at the (split, cached) output's own index, and
    the built kernel gives numpy's bias + a @ b."""
    n, m, k = 6, 20, 5
    a = te.placeholder((n, k), "float32", name="A")
    b = te.placeholder((k, m), "float32", name="B")
    bias = te.placeholder((m,), "float32", name="Bias")
    r = te.reduce_axis((0, k), name="k")
    c = te.compute((n, m), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r, init=bias[j]), name="C")
    s = te.create_schedule(c.op)
    cl = s.cache_write(c, "local")
    jo, ji = s[c].split(c.op.axis[1], factor=8)
    s[cl].compute_at(s[c], jo)
    s[cl].reorder(s[cl].op.reduce_axis[0], *s[cl].op.axis)
    s[cl].vectorize(s[cl].op.axis[1])
    pf = tether.lower(s, [a, b, bias, c], "mm_bias")
    assert "Bias[j.outer * 8 + j.c]" in str(pf), str(pf)
    lib = tether.build(pf, target="host", name="mm_bias")
    lib.export_library(str(tmp_path / "mm_bias.so"))
    from tether import runtime
    f = runtime.load_module(str(tmp_path / "mm_bias.so"))["mm_bias"]
    rng = np.random.default_rng(0)
    av, bv, biasv = (rng.standard_normal(sh).astype(np.float32) for sh in ((n, k), (k, m), (m,)))
    out = np.zeros((n, m), np.float32)
    f(av, bv, biasv, out)
    np.testing.assert_allclose(out, biasv + av @ bv, rtol=1e-5, atol=1e-5)


def test_cache_write_compute_at_allocates_tile_buffer():
    a, b, c = matmul(16, 32, 8)
    s = te.create_schedule(c.op)
    cl = s.cache_write(c, "local")
    io, jo, ii, ji = s[c].tile(c.op.axis[0], c.op.axis[1], 4, 8)
    s[cl].compute_at(s[c], jo)
    ci, cj = s[cl].op.axis
    s[cl].reorder(s[cl].op.reduce_axis[0], ci, cj)
    s[cl].unroll(ci)
    s[cl].vectorize(cj)
    pf = tether.lower(s, [a, b, c], "mm")
    allocs = [x for x in tir.walk(pf.body) if isinstance(x, tir.Allocate)]
    assert len(allocs) == 1 and allocs[0].buffer.size == 32 and allocs[0].buffer.name == "C.local"
    kinds = [(l.var.name, l.kind, l.extent.value) for l in loops(pf)]
    assert kinds == [("i.outer", "serial", 4), ("j.outer", "serial", 4),
                     ("i.c", "unrolled", 4), ("j.c", "vectorized", 8),          # init
                     ("k", "serial", 8), ("i.c", "unrolled", 4), ("j.c", "vectorized", 8),   # update
                     ("i.inner", "serial", 4), ("j.inner", "serial", 8)]        # copy out
    text = str(pf)
    # the local tile is addressed relative to the tile origin: constant offsets once i.c is unrolled
    assert "C.local[i.c * 8 + j.c] = C.local[i.c * 8 + j.c] + A[i.outer * 32 + i.c * 8 + k]" in text


def test_index_arithmetic_is_simplified():
    a = te.placeholder((4, 6), "float32", name="A")
    c = te.compute((4, 6), lambda i, j: a[i * 1 + 0, (j + 2) - 2], name="C")
    s = te.create_schedule(c.op)
    text = str(tether.lower(s, [a, c], "k"))
    assert "C[i * 6 + j] = A[i * 6 + j]" in text
    assert "* 1" not in text and "+ 0" not in text


def test_simplifier_rules():
    i, j = te.var("i"), te.var("j")
    assert str(simplify((i * 4 + 3) - i * 4 + 1)) == "4"
    assert str(simplify(i * 1 + 0 + j * 2 - j)) == "i + j"
    assert str(simplify((i * 8 + j) // 8, {j: (0, 7)})) == "i"
    assert str(simplify((i * 8 + j) % 8, {j: (0, 7)})) == "j"
    assert str(simplify((i * 8 + j + 3) // 4)) == "i * 2 + (j + 3) // 4"
    assert str(simplify(te.min(8, 10 - i * 8), {i: (0, 0)})) == "8"
    assert simplify(i * 8 + j < 10, {i: (0, 0), j: (0, 7)}).value is True
    assert const_bound(i * 3 - j, {i: (0, 2), j: (1, 4)}) == (-4, 5)
    assert isinstance(simplify(Binary("add", Const(2, "int32"), Const(3, "int32"))), Const)
    assert str(simplify(te.const(2.0) * te.const(3.0) + 1.0)) == "7.0f"


def test_products_of_two_unknowns_are_bounded_by_their_factors():
    """A product of two non-constant factors is one atom of the linear form: its bound is the product of the
    factors' bounds (bounding it by re-linearising it never ended, as in an int8 resize's fused rounding)."""
    i, j, k = te.var("i"), te.var("j"), te.var("k")
    ranges = {i: (-2, 3), j: (4, 5), k: (0, 7)}
    assert const_bound(i * j, ranges) == (-10, 15)
    assert const_bound(i * j * 2 + k - 1, ranges) == (-21, 36)
    assert const_bound(i * j + te.var("free"), ranges) is None
    assert simplify(i * j + k < 23, ranges).value is True
    assert simplify(i * j - k > 15, ranges).value is False
    assert str(simplify(te.max(te.min(i * j, 20), -30), ranges)) == "i * j"


def test_tether_lower_is_the_lowering_entry_point():
    a, b, c = vadd(16)
    s = te.create_schedule(c.op)
    mod = importlib.import_module("tether.te.lower")
    assert str(mod.lower(s, [a, b, c], "f")) == str(tether.lower(s, [a, b, c], "f"))


def test_compute_at_region_for_stencil_and_guards():
    n = 20
    a = te.placeholder((n + 2,), "float32", name="A")
    p = te.compute((n + 2,), lambda i: a[i] + 1.0, name="P")
    c = te.compute((n,), lambda i: p[i] + p[i + 2], name="C")
    s = te.create_schedule(c.op)
    xo, xi = s[c].split(c.op.axis[0], factor=6)   # 20 = 3*6 + 2: the last region runs past P's end
    s[p].compute_at(s[c], xo)
    pf = tether.lower(s, [a, c], "k")
    text = str(pf)
    assert "allocate P: float32[8]" in text
    # P's loop is clamped to P's extent (22) in the last tile
    assert "min(8, 22 - i.outer * 6)" in text


@pytest.mark.parametrize("kind", ["vectorize", "unroll", "parallel"])
def test_loop_kind_annotations_in_text(kind):
    a, b, c = vadd(32)
    s = te.create_schedule(c.op)
    xo, xi = s[c].split(c.op.axis[0], factor=4)
    getattr(s[c], kind)(xi if kind != "parallel" else xo)
    word = {"vectorize": "vectorized", "unroll": "unrolled", "parallel": "parallel"}[kind]
    assert f") {word}:" in str(tether.lower(s, [a, b, c], "k"))


def test_unit_extent_loops_are_not_emitted():
    a = te.placeholder((1, 8), "float32", name="A")
    c = te.compute((1, 8), lambda b, j: a[b, j] + 1.0, name="C")
    s = te.create_schedule(c.op)
    pf = tether.lower(s, [a, c], "k")
    assert [l.var.name for l in loops(pf)] == ["j"]
    assert "C[j] = A[j] + 1.0f" in str(pf)


def test_zero_dimensional_output():
    a = te.placeholder((10,), "float32", name="A")
    k = te.reduce_axis((0, 10), name="k")
    out = te.compute((), lambda: te.sum(a[k], axis=k), name="S")
    pf = tether.lower(te.create_schedule(out.op), [a, out], "k")
    assert str(pf).splitlines()[1:] == ["  S[0] = 0.0f", "  for k in range(10):", "    S[0] = S[0] + A[k]"]
