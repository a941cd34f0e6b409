"""A register block's columns by a network of shuffles (codegen/block_transpose.py): the network alone, run by
LLVM's JIT against numpy's transpose for every block shape it takes, and conv2d_pixels kernels whose write-back
reads their block through it (long reductions on AVX-512 hosts), against numpy, with no lane-by-lane reads left."""
from __future__ import annotations

import ctypes
import re

import numpy as np
import pytest
from llvmlite import binding as llvm
from llvmlite import ir

import tether
from tether import ops, te
from tether.codegen import block_transpose

from fixtures.conv_ref import conv_ref

F32 = ir.FloatType()
I32 = ir.IntType(32)


def _jit_transpose(rows: int, cols: int):
    """A function (rows_in*, cols_out*) that loads ``rows`` rows of ``cols`` floats and stores the columns."""
    mod = ir.Module(name="bt")
    ptr = ir.PointerType(F32)
    fn = ir.Function(mod, ir.FunctionType(ir.VoidType(), [ptr, ptr]), "bt")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    src, dst = fn.args
    row_ty = ir.VectorType(F32, cols)
    row_vectors = [b.load(b.bitcast(b.gep(src, [ir.Constant(I32, r * cols)]), ir.PointerType(row_ty)), align=4)
                   for r in range(rows)]
    for c, col in enumerate(block_transpose.columns(b, row_vectors, cols)):
        b.store(col, b.bitcast(b.gep(dst, [ir.Constant(I32, c * rows)]), ir.PointerType(col.type)), align=4)
    b.ret_void()
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    parsed = llvm.parse_assembly(str(mod))
    parsed.verify()
    engine = llvm.create_mcjit_compiler(parsed, llvm.Target.from_default_triple().create_target_machine())
    engine.finalize_object()
    f = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)(engine.get_function_address("bt"))
    return f, engine


@pytest.mark.parametrize("rows,cols", [(12, 32), (16, 16), (2, 2), (3, 4), (5, 8), (6, 32), (9, 16), (4, 64)])
def test_the_network_transposes_every_block_it_takes(rows, cols):
    assert block_transpose.usable(rows, cols)
    f, engine = _jit_transpose(rows, cols)
    block = np.arange(rows * cols, dtype=np.float32).reshape(rows, cols)
    out = np.zeros((cols, rows), np.float32)
    f(block.ctypes.data, out.ctypes.data)
    del engine
    np.testing.assert_array_equal(out, block.T)


def test_blocks_it_does_not_take():
    assert not block_transpose.usable(1, 32)           # one row: nothing to transpose
    assert not block_transpose.usable(12, 24)          # columns not a power of two
    assert not block_transpose.usable(17, 16)          # more rows (padded to 32) than columns


@pytest.mark.parametrize("panel", [16, 32])
@pytest.mark.parametrize("xs,wk,pad", [((160, 13, 13), (64, 1, 1), 0),     # 169 pixels: a partial block
                                       ((16, 12, 12), (32, 3, 3), 1)])     # 144 products per output
def test_a_long_conv_writes_back_through_the_network(run_ops, rng, xs, wk, pad, panel):
    """A conv2d_pixels reduction long enough for the write-back along the pixels (ops/schedules.py
    CONV_PIXELS_VECTOR_WRITEBACK_MIN_REDUCE) reads its 12-pixel block (a panel of channels per pixel) through the
    network on AVX-512."""
    from tether.target import Target

    oc, kh, kw = wk
    x = rng.standard_normal(xs).astype("float32")
    w = rng.standard_normal((oc, xs[0], kh, kw)).astype("float32")
    bias = rng.standard_normal((oc, 1)).astype("float32")
    X = te.placeholder(x.shape, "float32", name="X")
    W = te.placeholder((oc, xs[0] * kh * kw), "float32", name="W")
    B = te.placeholder(bias.shape, "float32", name="B")
    out_t = ops.relu(ops.add(ops.conv2d_pixels(X, W, (kh, kw), 1, pad, panel=panel), B))
    avx512 = Target("x86_64-linux-gnu -mattr=+avx2,+fma,+avx512f")
    lib = tether.build(ops.schedule([out_t], target=avx512), [X, W, B, out_t], target=avx512, name="c")
    assert "shufflevector <%d x float>" % panel in lib.ir_text, lib.ir_text
    # lane by lane, a column is a chain of inserts into the vector so far (a splat inserts once, into undef)
    assert not re.search(r"insertelement <12 x float> %", lib.ir_text)
    (out,) = run_ops([(X, x), (W, w.reshape(oc, -1)), (B, bias)], [out_t], schedule=ops.schedule([out_t]))
    ref = conv_ref(x[None], w, pad4=(pad,) * 4)[0].reshape(oc, -1)
    np.testing.assert_allclose(out, np.maximum(ref + bias, 0), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("xs,wk,pad", [((24, 13, 13), (64, 3, 3), 1),      # 169 pixels: a partial block
                                       ((40, 8, 12), (32, 1, 1), 0)])
def test_a_costly_epilogue_stores_its_block_by_columns(run_ops, rng, xs, wk, pad):
    """A conv with SiLU runs the epilogue along the block's channels (a vector sigmoid per pixel row); on AVX-512
    the rows are then transposed and each channel's pixels stored as one vector, not element by element."""
    from tether.target import Target

    oc, kh, kw = wk
    x = rng.standard_normal(xs).astype("float32")
    w = (rng.standard_normal((oc, xs[0], kh, kw)) / np.sqrt(xs[0] * kh * kw)).astype("float32")
    bias = rng.standard_normal((oc, 1)).astype("float32")
    X = te.placeholder(x.shape, "float32", name="X")
    W = te.placeholder((oc, xs[0] * kh * kw), "float32", name="W")
    B = te.placeholder(bias.shape, "float32", name="B")
    pre = ops.add(ops.conv2d_pixels(X, W, (kh, kw), 1, pad, panel=32), B)
    out_t = ops.multiply(pre, ops.sigmoid(pre))
    avx512 = Target("x86_64-linux-gnu -mattr=+avx2,+fma,+avx512f")
    text = tether.build(ops.schedule([out_t], target=avx512), [X, W, B, out_t], target=avx512, name="c").ir_text
    # element by element, each of a block's 12 x 32 results is a lane extracted and stored; only the one-pixel
    # partial block of 169 = 14 x 12 + 1 pixels still stores its 32 channels so
    assert "store <12 x float>" in text and text.count("extractelement <32 x float>") <= (32 if xs[1] == 13 else 0)
    (out,) = run_ops([(X, x), (W, w.reshape(oc, -1)), (B, bias)], [out_t], schedule=ops.schedule([out_t]))
    ref = conv_ref(x[None], w, pad4=(pad,) * 4)[0].reshape(oc, -1) + bias
    np.testing.assert_allclose(out, ref / (1 + np.exp(-ref)), rtol=1e-4, atol=1e-4)
