"""Integer index arithmetic once per basic block (codegen/intcse.py): constants fold with the type's wrap-around,
an identical instruction in the same block is reused and one in another block is not, and kernels whose indices
are full of repeated sub-expressions (unrolled, split, fused loops; integer division) still compute what numpy
does, with no constant-only arithmetic left in their IR."""
from __future__ import annotations

import re

import numpy as np
from llvmlite import ir

import tether
from tether import ops, te
from tether.codegen.intcse import IntCSE

I32 = ir.IntType(32)


def _builder():
    fn = ir.Function(ir.Module(), ir.FunctionType(I32, [I32, I32]), "f")
    return fn, ir.IRBuilder(fn.append_basic_block("entry"))


def test_constants_fold_with_wraparound():
    cse = IntCSE()
    _, B = _builder()
    never = lambda: (_ for _ in ()).throw(AssertionError("a constant expression was emitted"))  # noqa: E731
    assert cse.emit(B, "add", ir.Constant(I32, 2), ir.Constant(I32, 3), ("nsw",), never).constant == 5
    assert cse.emit(B, "mul", ir.Constant(I32, 1 << 30), ir.Constant(I32, 4), (), never).constant == 0
    assert cse.emit(B, "sub", ir.Constant(I32, -(1 << 31)), ir.Constant(I32, 1), (), never).constant == (1 << 31) - 1
    assert not B.block.instructions


def test_adding_zero_and_multiplying_by_one_emit_nothing():
    cse = IntCSE()
    fn, B = _builder()
    x, _ = fn.args
    never = lambda: (_ for _ in ()).throw(AssertionError("an identity was emitted"))  # noqa: E731
    assert cse.emit(B, "add", x, ir.Constant(I32, 0), ("nsw",), never) is x
    assert cse.emit(B, "add", ir.Constant(I32, 0), x, ("nsw",), never) is x
    assert cse.emit(B, "sub", x, ir.Constant(I32, 0), ("nsw",), never) is x
    assert cse.emit(B, "mul", ir.Constant(I32, 1), x, ("nsw",), never) is x
    assert not B.block.instructions
    minus = cse.emit(B, "sub", ir.Constant(I32, 0), x, ("nsw",), lambda: B.sub(ir.Constant(I32, 0), x))
    assert minus is not x and minus.parent is B.block        # 0 - x is not x


def test_reuse_within_a_block_only():
    cse = IntCSE()
    fn, B = _builder()
    x, y = fn.args
    first = cse.emit(B, "mul", x, ir.Constant(I32, 12), ("nsw",), lambda: B.mul(x, ir.Constant(I32, 12)))
    again = cse.emit(B, "mul", x, ir.Constant(I32, 12), ("nsw",), lambda: B.mul(x, ir.Constant(I32, 12)))
    assert again is first
    other = cse.emit(B, "mul", y, ir.Constant(I32, 12), ("nsw",), lambda: B.mul(y, ir.Constant(I32, 12)))
    assert other is not first
    no_flags = cse.emit(B, "mul", x, ir.Constant(I32, 12), (), lambda: B.mul(x, ir.Constant(I32, 12)))
    assert no_flags is not first
    B.position_at_end(fn.append_basic_block("next"))
    fresh = cse.emit(B, "mul", x, ir.Constant(I32, 12), ("nsw",), lambda: B.mul(x, ir.Constant(I32, 12)))
    assert fresh is not first and fresh.parent is B.block


def _no_constant_arithmetic(ir_text: str) -> None:
    folded = re.findall(r"= (?:add|sub|mul)(?: nsw)? i(?:32|64) -?\d+, -?\d+\n", ir_text)
    assert not folded, folded[:3]


def test_unrolled_split_kernel_matches_numpy():
    a = te.placeholder((6, 10, 12), "float32", name="a")
    b = te.compute((6, 12, 10), lambda i, j, k: a[i, k, j] * 2.0 + a[i, (k + 3) % 10, j], name="b")
    s = te.create_schedule(b.op)
    i, j, k = s[b].op.axis
    fused = s[b].fuse(i, j)
    fo, fi = s[b].split(fused, factor=4)
    s[b].unroll(fi)
    s[b].unroll(k)
    mod = tether.build(s, [a, b], name="perm")
    _no_constant_arithmetic(mod.ir_text)
    x = np.random.default_rng(0).standard_normal((6, 10, 12)).astype(np.float32)
    y = np.zeros((6, 12, 10), np.float32)
    mod.load()["perm"](x, y)
    ref = x.transpose(0, 2, 1) * 2 + np.roll(x, -3, axis=1).transpose(0, 2, 1)
    np.testing.assert_allclose(y, ref, rtol=1e-6)


def test_integer_division_kernels_match_numpy():
    for dtype in ("int32", "uint32"):
        a = te.placeholder((257,), dtype, name="a")
        b = te.compute((257,), lambda i: a[i] // 7 + a[i] % 7 + (a[i] // 7) * 3 + a[i] % 7, name="b")
        s = ops.schedule([b], "host")
        mod = tether.build(s, [a, b], name="div_" + dtype)
        x = np.random.default_rng(1).integers(0 if dtype == "uint32" else -1000, 1000, 257).astype(dtype)
        y = np.zeros_like(x)
        mod.load()["div_" + dtype](x, y)
        np.testing.assert_array_equal(y, x // 7 + x % 7 + (x // 7) * 3 + x % 7)


def test_a_conv_kernel_matches_numpy():
    data = te.placeholder((1, 8, 13, 11), "float32", name="data")
    weight = te.placeholder((16, 8, 3, 3), "float32", name="weight")
    out = ops.conv2d(data, weight, stride=(2, 1), padding=1)
    mod = tether.build(ops.schedule([out], "host"), [data, weight, out], name="conv")
    _no_constant_arithmetic(mod.ir_text)
    rng = np.random.default_rng(2)
    x = rng.standard_normal((1, 8, 13, 11)).astype(np.float32)
    w = rng.standard_normal((16, 8, 3, 3)).astype(np.float32)
    y = np.zeros([int(d) for d in out.shape], np.float32)
    mod.load()["conv"](x, w, y)
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    ref = np.zeros_like(y)
    for r in range(3):
        for c in range(3):
            patch = xp[:, :, r:r + 2 * y.shape[2]:2, c:c + y.shape[3]]
            ref += np.einsum("nchw,kc->nkhw", patch, w[:, :, r, c])
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)
