"""The kernel changes that the model kinds users bring needed, each against numpy or onnxruntime: a split's single
partial tile keeps its unrolled loops (a matmul whose rows MR does not divide), dense weights packed into panels
at build time, softmax rows reduced in vector lanes with exp terms under float32's normal range flushed to zero
(masked attention rows), and Pow(x, 2) imported as x * x."""
import numpy as np
import pytest
from fixtures.host_cpu import AVX2_TARGET, AVX512_TARGET
from fixtures.onnx_struct_compare import make_graph_model
from onnx import helper

import tether
from tether import driver, ops, te
from tether.frontend import from_onnx
from tether.tir.stmt import For
from tether.tir.visit import walk
from tether_rpc.module import load_module

RNG = np.random.default_rng(5)


def _run(outs, args, arrays, tmp_path):
    sch = ops.schedule(outs, "host")
    lib = tether.build(sch, args, target="host", name="k")
    path = str(tmp_path / "k.so")
    lib.export_library(path)
    mod = load_module(path)
    fn = mod[mod.function_names[0]]
    res = np.zeros(tuple(int(d) for d in outs[0].shape), np.float32)
    fn(*arrays, res)
    return res


@pytest.mark.parametrize("m, n, k", [(64, 512, 128), (13, 40, 33), (200, 192, 64)])
def test_dense_with_a_partial_row_tile(m, n, k, tmp_path):
    x = te.placeholder((m, k), "float32", name="x")
    w = te.placeholder((n, k), "float32", name="w")
    out = ops.dense(x, w)
    a, b = RNG.standard_normal((m, k)).astype(np.float32), RNG.standard_normal((n, k)).astype(np.float32)
    np.testing.assert_allclose(_run([out], [x, w, out], [a, b], tmp_path), a @ b.T, rtol=1e-4, atol=1e-4)


# AVX2 (8 lanes) computes the rows in place ("i.inner"), AVX-512 (16 lanes) in a cache stage ("i.c"): both named
# here, so the check holds whichever of them (or neither) the host has.
@pytest.mark.parametrize("target,row_var", [(AVX2_TARGET, "i.inner"), (AVX512_TARGET, "i.c")])
def test_the_partial_row_tile_stays_unrolled(target, row_var):
    """64 rows in tiles of 6: the last tile's 4 rows are an unrolled loop of constant extent, not a serial tail."""
    x = te.placeholder((64, 128), "float32", name="x")
    w = te.placeholder((512, 128), "float32", name="w")
    out = ops.dense(x, w)
    fam = ops.schedules.family_of(tether.target.as_target(target))
    func = driver.lower(ops.schedule([out], target, config={"mm_rows": 6}), [x, w, out])
    extents = sorted({(f.var.name, f.extent.value) for f in walk(func.body) if isinstance(f, For)
                      and f.kind == "unrolled" and f.var.name.startswith("i.")})
    assert (row_var, 4) in extents and (row_var, 6) in extents, (fam, extents)
    tails = [f for f in walk(func.body) if isinstance(f, For) and getattr(f, "tail", False)]
    assert not tails


def test_dense_weights_are_packed_at_build_time(onnx_compare):
    x = RNG.standard_normal((40, 48)).astype(np.float32)
    inits = {"w": RNG.standard_normal((48, 70)).astype(np.float32), "b": RNG.standard_normal(70).astype(np.float32),
             "w2": RNG.standard_normal((70, 8)).astype(np.float32)}
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["h1"]),
             helper.make_node("Relu", ["h1"], ["h2"]), helper.make_node("MatMul", ["h2", "w2"], ["y"])]
    model = make_graph_model(nodes, {"x": x}, ["y"], inits)
    graph, params = from_onnx(model)
    factory = tether.build_graph(graph, params, target="host")
    shapes = sorted(tuple(np.asarray(v).shape) for v in factory.params.values())
    from tether.graph.dense_panels import panel_block
    from tether.target import as_target
    width = panel_block(as_target("host"), 70, 40)[0]     # 16 (32-wide panels would pad 70 to 96: crnn tests)
    assert (-(-70 // width), 48, width) in shapes, shapes   # 70 rows of 48 in panels (the last one padded)
    if as_target("host").vector_lanes(32) >= 16 and as_target("host").arch == "x86_64":
        assert (1, 70, 8) in shapes, shapes                  # 8 columns: one 8-wide panel
    onnx_compare(model, {"x": x}, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("shape", [(80, 6625), (3, 33), (2, 3, 31), (4, 16)])
def test_softmax_rows(shape, tmp_path):
    x = te.placeholder(shape, "float32", name="x")
    out = ops.softmax(x, axis=-1)
    a = (RNG.standard_normal(shape) * 3).astype(np.float32)
    e = np.exp(a - a.max(-1, keepdims=True))
    np.testing.assert_allclose(_run([out], [x, out], [a], tmp_path), e / e.sum(-1, keepdims=True), rtol=1e-5,
                               atol=1e-7)


def test_masked_softmax_flushes_terms_below_the_normal_range(tmp_path):
    shape = (2, 200, 200)
    x = te.placeholder(shape, "float32", name="x")
    out = ops.softmax(x, axis=-1)
    a = RNG.standard_normal(shape).astype(np.float32)
    a[..., ::3] = -1e4
    a[0, 0, 1] = a[0, 0].max() - 86.0                 # exp(-86): a normal float, kept
    got = _run([out], [x, out], [a], tmp_path)
    e = np.exp((a - a.max(-1, keepdims=True)).astype(np.float64))
    ref = e / e.sum(-1, keepdims=True)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-30)
    assert (got[..., ::3] == 0).all() and got[0, 0, 1] > 0


@pytest.mark.parametrize("exponent, squared", [(2.0, True), (3.0, False), (0.5, False)])
def test_pow_by_two_is_a_product(onnx_compare, exponent, squared):
    x = RNG.standard_normal((3, 7)).astype(np.float32) * 4
    model = make_graph_model([helper.make_node("Pow", ["x", "e"], ["y"])], {"x": np.abs(x) if exponent == 0.5 else x},
                             ["y"], {"e": np.array(exponent, np.float32)})
    graph, _ = from_onnx(model)
    assert ("pow" not in graph.ops_used()) == squared
    got, _ = onnx_compare(model, {"x": np.abs(x) if exponent == 0.5 else x}, rtol=1e-6, atol=0)
    if squared:
        assert np.array_equal(got[0], x * x)

