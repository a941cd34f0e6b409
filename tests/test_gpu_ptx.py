"""tether.codegen.ptx: DeviceKernels -> PTX through llvmlite's NVPTX backend.

There is no NVIDIA GPU here, so these check structure, strictly: the entry and its parameters in launch order,
the launch bounds, shared arrays, barriers, thread-index reads, the instructions each expression becomes (the
CPU emitters' meaning), no external call left; the unoptimised IR verifies; and NVIDIA's own assembler, ptxas
(pip nvidia-cuda-nvcc-cu12, a test extra), accepts every module for sm_80. The semantics are checked one step
before the NVPTX backend: the kernels' LLVM IR, retargeted to this CPU, runs every thread (real barriers between
Python threads) against numpy. Running the PTX itself is scripts/gpu_cuda_check.py's job on a machine with a GPU.
"""
from __future__ import annotations

import re

import llvmlite.binding as llvm
import numpy as np
import pytest
from fixtures.ptx import run_on_host

from tether.codegen import mathlib
from tether.codegen.ptx import kernel_ir, ptx_module
from tether.errors import CompileError
from tether.tir import (Allocate, Binary, Buffer, Call, Cast, Compare, Const, For, IfThenElse, Load, Select, Store,
                        Var, call_packed, seq)
from tether.tir.device import Barrier, DeviceKernel

I32 = "int32"


def c(v, dtype=I32):
    return Const(v, dtype)


def add(a, b):
    return Binary("add", a, b)


def mul(a, b):
    return Binary("mul", a, b)


def vadd_kernel(name="vadd", block=(128, 1, 1), grid=(8, 1, 1)):
    """C[i] = A[i] + B[i] for i < n, one thread per element; n is the int32 scalar."""
    A, B, C = (Buffer(x, (1024,), "float32") for x in "ABC")
    bx, tx, n = Var("bx"), Var("tx"), Var("n")
    i = add(mul(bx, c(block[0])), tx)
    body = IfThenElse(Compare("lt", i, n), Store(C, i, Binary("add", Load(A, i), Load(B, i))))
    return DeviceKernel(name, [A, B, C], body, {bx: "blockIdx.x", tx: "threadIdx.x"}, grid, block, scalars=[n])


def reduce_kernel():
    """Per block: a tile of A into shared memory, a barrier, a tree sum (with barriers), one result per block."""
    A, R = Buffer("A", (1024,), "float32"), Buffer("R", (4,), "float32")
    S = Buffer("S", (256,), "float32", "shared")
    T = Buffer("T", (100,), "float16", "shared")
    bx, tx = Var("bx"), Var("tx")
    steps = []
    for half in (128, 64, 32, 16, 8, 4, 2, 1):
        steps += [IfThenElse(Compare("lt", tx, c(half)),
                             Store(S, tx, Binary("add", Load(S, tx), Load(S, add(tx, c(half)))))), Barrier()]
    body = Allocate(S, Allocate(T, seq(
        Store(S, tx, Load(A, add(mul(bx, c(256)), tx))),
        IfThenElse(Compare("lt", tx, c(100)), Store(T, tx, Cast("float16", Load(S, tx)))),
        Barrier(),
        *steps,
        IfThenElse(Compare("eq", tx, c(0)), Store(R, bx, add(Load(S, c(0)), Cast("float32", Load(T, c(1)))))))))
    return DeviceKernel("block_sum", [A, R], body, {bx: "blockIdx.x", tx: "threadIdx.x"}, (4, 1, 1), (256, 1, 1))


def params_of(ptx: str, name: str):
    m = re.search(r"\.visible \.entry %s\((.*?)\)" % re.escape(name), ptx, re.S)
    assert m, "no entry %s in\n%s" % (name, ptx)
    return [p.strip() for p in m.group(1).split(",") if p.strip()]


def body_of(ptx: str, name: str) -> str:
    start = ptx.index(".visible .entry %s(" % name)
    nxt = ptx.find(".visible .entry", start + 1)
    return ptx[start:nxt if nxt >= 0 else len(ptx)]


def test_entry_params_in_launch_order_and_the_module_header(ptxas):
    text = ptx_module([vadd_kernel()])
    assert ".target sm_80" in text and ".address_size 64" in text
    assert re.search(r"^\.version \d+\.\d+$", text, re.M)
    params = params_of(text, "vadd")
    # the three buffers as 64-bit global pointers, then the int32 scalar (LLVM types it .u32; both are 32 bits)
    assert len(params) == 4
    for k in range(3):
        assert re.fullmatch(r"\.param \.u64 (\.ptr \.global (\.align \d+ )?)?vadd_param_%d" % k, params[k]), params
    assert re.fullmatch(r"\.param \.[usb]32 vadd_param_3", params[3]), params
    body = body_of(text, "vadd")
    assert "mov.u32" in body and "%ctaid.x" in body and "%tid.x" in body
    assert re.search(r"ld\.global(\.nc)?\.[bf]32", body) and re.search(r"st\.global\.[bf]32", body)
    assert re.search(r"add(\.rn)?\.f32", body)
    assert ".extern" not in text
    ptxas(text)


def test_launch_bounds_are_the_block():
    k = vadd_kernel(block=(8, 4, 2), grid=(3, 2, 1))
    k.thread_of[Var("ty")] = "threadIdx.y"
    text = ptx_module([k])
    assert re.search(r"\.reqntid 8, 4, 2\b", text)


def test_shared_arrays_barriers_and_thread_indices(ptxas):
    text = ptx_module([reduce_kernel()])
    shared = dict((name, int(size)) for name, size in re.findall(r"\.shared \.align \d+ \.b8 (\w+)\[(\d+)\]", text))
    assert sorted(shared.values()) == [200, 1024], text    # 100 float16, 256 float32
    assert text.count("bar.sync \t0;") + text.count("bar.sync 0;") == 9, text
    assert re.search(r"ld\.shared\.", text) and re.search(r"st\.shared\.", text)
    assert "%ctaid.x" in text and "%tid.x" in text
    assert ".local" not in text
    info = ptxas(text)
    assert "1224 bytes smem" in info, info


def test_two_kernels_one_module_and_other_arch(ptxas):
    text = ptx_module([vadd_kernel("first"), vadd_kernel("second", block=(64, 1, 1))], arch="sm_90")
    assert ".target sm_90" in text
    assert params_of(text, "first") and params_of(text, "second")
    assert re.search(r"\.reqntid 64, 1, 1", body_of(text, "second"))
    ptxas(text, "sm_90")


def test_every_thread_index():
    A = Buffer("A", (4096,), "int32")
    tags = ("blockIdx.x", "blockIdx.y", "blockIdx.z", "threadIdx.x", "threadIdx.y", "threadIdx.z")
    vs = [Var(t.replace(".", "_")) for t in tags]
    idx = vs[0]
    for v in vs[1:]:
        idx = Binary("bitxor", mul(idx, c(3)), v)
    body = Store(A, Binary("floormod", idx, c(4096)), idx)
    text = ptx_module([DeviceKernel("tags", [A], body, dict(zip(vs, tags)), (2, 2, 2), (4, 4, 4))])
    for reg in ("%ctaid.x", "%ctaid.y", "%ctaid.z", "%tid.x", "%tid.y", "%tid.z"):
        assert reg in text, reg


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_every_math_function_is_inline_code(dtype, ptxas):
    """Every function of the CPU math library, in one kernel: no call, no .extern (no libdevice, no libm)."""
    X = Buffer("X", (256,), dtype)
    Y = Buffer("Y", (len(mathlib.NAMES) * 256,), dtype)
    tx = Var("tx")
    x = Load(X, tx)
    stores = [Store(Y, add(tx, c(256 * k)), Call(name, [x] * mathlib.arity(name), dtype))
              for k, name in enumerate(mathlib.NAMES)]
    k = DeviceKernel("math_" + dtype, [X, Y], seq(*stores), {tx: "threadIdx.x"}, (1, 1, 1), (256, 1, 1))
    ir_text = kernel_ir([k])
    for name in mathlib.NAMES:
        assert "tether.math.%s." % name in ir_text, name
    mod = llvm.parse_assembly(ir_text)
    mod.verify()
    text = ptx_module([k])
    assert ".extern" not in text and not re.search(r"\bcall(\.uni)?\b", text), text
    assert not re.search(r"^\.(visible )?\.func", text, re.M)
    # the rounding functions are single instructions
    suffix = "f32" if dtype == "float32" else "f64"
    for insn in ("cvt.rmi.%s.%s" % (suffix, suffix), "cvt.rpi.%s.%s" % (suffix, suffix),
                 "cvt.rni.%s.%s" % (suffix, suffix), "sqrt.rn.%s" % suffix):
        assert insn in text, insn
    ptxas(text)


def expressions_kernel():
    A = Buffer("A", (64,), "int32")
    F = Buffer("F", (64,), "float32")
    O = Buffer("O", (64 * 10,), "int32")
    L = Buffer("L", (64,), "int64")
    Bm = Buffer("Bm", (64,), "bool")
    tx, d = Var("tx"), Var("d")
    a, f = Load(A, tx), Load(F, tx)
    rows = [Binary("floordiv", a, d), Binary("floormod", a, d), Cast(I32, f),
            Select(Compare("ne", f, Const(0.5, "float32")), c(1), c(2)),
            Binary("bitand", a, c(12)), Binary("bitor", a, d), Binary("shl", a, c(3)), Binary("shr", a, c(2)),
            Binary("min", a, d), Binary("max", a, d)]
    stores = [Store(O, add(mul(tx, c(10)), c(k)), e) for k, e in enumerate(rows)]
    stores.append(Store(L, tx, Binary("mul", Cast("int64", a), Cast("int64", d))))
    stores.append(Store(Bm, tx, Compare("lt", f, Const(1.0, "float32"))))
    return DeviceKernel("exprs", [A, F, O, L, Bm], seq(*stores), {tx: "threadIdx.x"}, (1, 1, 1), (64, 1, 1),
                        scalars=[d])


def test_expressions_mean_what_they_mean_on_the_cpu(ptxas):
    """Integer floor division and modulo of values of unknown sign (not truncation), float->int casts that
    truncate, unordered != on floats, selects, bit operations, shifts, min/max, int64 and bool storage."""
    k = expressions_kernel()
    text = ptx_module([k])
    # floor semantics: the truncating quotient, then the adjustment where remainder and divisor differ in sign
    assert "div.s32" in text and "div.u32" not in text
    assert re.search(r"xor\.b32", text) and re.search(r"setp\.lt\.s32", text)
    assert "cvt.rzi.s32.f32" in text                         # float -> int truncates
    assert "setp.neu.f32" in text                            # != is unordered: NaN != x
    assert re.search(r"\bselp\.", text)
    assert re.search(r"and\.b32", text) and re.search(r"or\.b32", text)
    assert re.search(r"shl\.b32", text) and re.search(r"shr\.s32", text)
    assert re.search(r"(min|max)\.s32", text)
    assert re.search(r"mul\.(lo|wide)\.s(64|32)", text)
    assert re.search(r"st\.global\.(b|u)8", text)             # bool is a byte in memory
    ptxas(text)


def test_loops_locals_and_vectorized_bodies(ptxas):
    """A serial loop, an unrolled one and a vectorized one (unrolled on a GPU) over a local accumulator block
    that stays in registers."""
    A, B = Buffer("A", (4096,), "float32"), Buffer("B", (1024,), "float32")
    acc = Buffer("acc", (4,), "float32", "local")
    tx, bx, k, j, v = Var("tx"), Var("bx"), Var("k"), Var("j"), Var("v")
    row = add(mul(bx, c(128)), tx)
    body = Allocate(acc, seq(
        For(j, c(0), c(4), "unrolled", Store(acc, j, Const(0.0, "float32")), max_extent=4),
        For(k, c(0), c(4), "serial",
            For(v, c(0), c(4), "vectorized",
                Store(acc, v, Binary("add", Load(acc, v), Load(A, add(mul(row, c(4)), v))), reduction="sum"),
                max_extent=4)),
        For(j, c(0), c(4), "unrolled",
            Store(B, row, Binary("max", Load(B, row), Load(acc, j))), max_extent=4)))
    kern = DeviceKernel("loops", [A, B], body, {tx: "threadIdx.x", bx: "blockIdx.x"}, (8, 1, 1), (128, 1, 1))
    llvm.parse_assembly(kernel_ir([kern])).verify()
    text = ptx_module([kern])
    assert ".local" not in text, text
    ptxas(text)


def test_parallel_loop_runs_serially():
    A = Buffer("A", (64,), "float32")
    i = Var("i")
    body = For(i, c(0), c(64), "parallel", Store(A, i, Const(1.0, "float32")))
    text = ptx_module([DeviceKernel("par", [A], body, {}, (1, 1, 1), (1, 1, 1))])
    assert re.search(r"st\.global", text)


def test_unoptimised_module_still_assembles(ptxas):
    text = ptx_module([reduce_kernel(), vadd_kernel()], opt=0)
    ptxas(text)


def refused(kernels, match, **kw):
    with pytest.raises(CompileError, match=match) as info:
        ptx_module(kernels, **kw)
    assert "\n" not in str(info.value)


def test_refusals():
    A = Buffer("A", (64,), "float32")
    tx = Var("tx")
    unknown = DeviceKernel("k", [A], Store(A, tx, Call("gamma", [Load(A, tx)], "float32")), {tx: "threadIdx.x"},
                           (1, 1, 1), (64, 1, 1))
    refused([unknown], r"'gamma'")
    host = DeviceKernel("k", [A], Store(A, tx, call_packed("my_hook", Load(A, tx))),
                        {tx: "threadIdx.x"}, (1, 1, 1), (64, 1, 1))
    refused([host], r"host function 'my_hook'")
    thread_loop = For(tx, c(0), c(64), "thread", Store(A, tx, Const(0.0, "float32")))
    thread_loop.thread_tag = "threadIdx.x"
    refused([DeviceKernel("k", [A], thread_loop, {}, (1, 1, 1), (1, 1, 1))], "thread loop")
    refused([vadd_kernel()], "not a CUDA architecture", arch="sm80")
    refused([vadd_kernel()], "predates sm_50", arch="sm_35")
    refused([vadd_kernel()], "does not know the architecture", arch="sm_99")
    refused([vadd_kernel(block=(2048, 1, 1))], "outside CUDA's limits")
    refused([vadd_kernel(block=(64, 32, 1))], "at most 1024")
    refused([vadd_kernel("same"), vadd_kernel("same")], "repeated: same")
    refused([vadd_kernel("not-a-name")], "not usable as a PTX entry name")
    big = Buffer("big", (16384,), "float32", "shared")
    refused([DeviceKernel("k", [A], Allocate(big, Store(big, tx, Const(0.0, "float32"))), {tx: "threadIdx.x"},
                          (1, 1, 1), (64, 1, 1))], "48 KiB")
    bad_scalar = vadd_kernel()
    bad_scalar.scalars = [Var("n", "int64")]
    refused([bad_scalar], "launch scalars are int32")


def check_script():
    from fixtures.scripts import load_script
    return load_script("gpu_cuda_check")


@pytest.mark.parametrize("name", ["vadd", "block_sum", "matmul_tiled", "math", "int_ops"])
def test_the_gpu_check_kernels_on_the_host(name):
    """scripts/gpu_cuda_check.py's kernels and numpy references agree on this CPU (so a mismatch on a GPU is the
    GPU path's), and its PTX assembles."""
    g = check_script()
    kernel = g.build_kernel(name)
    arrays = g.inputs(name)
    run_on_host(kernel, [a for _, a in arrays], g.SPECS[name]["scalars"])
    spec = g.SPECS[name]
    want = spec["ref"](*[a for (_, a), p in zip(arrays, spec["params"]) if p[3] is not None])
    assert want
    for pname, a in arrays:
        if pname in want:
            err = np.max(np.abs(a.astype(np.float64) - want[pname]) / (1 + np.abs(want[pname])))
            assert err <= (0 if a.dtype.kind == "i" else 5e-5), (pname, err)


def test_shared_memory_kernel_on_the_host():
    a = np.random.default_rng(1).standard_normal(1024).astype(np.float32)
    r = np.zeros(4, np.float32)
    run_on_host(reduce_kernel(), [a, r])
    blocks = a.reshape(4, 256)
    want = blocks.astype(np.float64).sum(1) + blocks[:, 1].astype(np.float16).astype(np.float64)
    np.testing.assert_allclose(r, want, rtol=1e-5, atol=1e-5)


def test_expressions_on_the_host():
    """The expressions kernel above against numpy: floor division and modulo by a negative and a positive
    divisor, truncating casts, NaN != x, bit operations, shifts, min/max, int64 products, bool bytes."""
    rng = np.random.default_rng(2)
    a = rng.integers(-1000, 1000, 64).astype(np.int32)
    f = rng.uniform(-5, 5, 64).astype(np.float32)
    f[:4] = [np.nan, 0.5, -0.5, 2.75]
    for d in (7, -3):
        kernel = expressions_kernel()
        o, lo, bm = np.zeros(640, np.int32), np.zeros(64, np.int64), np.zeros(64, np.bool_)
        run_on_host(kernel, [a, f, o, lo, bm], [d])
        with np.errstate(invalid="ignore"):
            trunc = np.where(np.isnan(f), 0, np.trunc(f)).astype(np.int32)
        rows = [a // d, a % d, trunc, np.where(f != 0.5, 1, 2), a & 12, a | d, a << 3, a >> 2,
                np.minimum(a, d), np.maximum(a, d)]
        got = o.reshape(64, 10)
        for k, want in enumerate(rows):
            if k == 2:   # a NaN cast to int is undefined (poison) in LLVM: not compared
                np.testing.assert_array_equal(got[1:, k], want[1:], err_msg="row 2")
                continue
            np.testing.assert_array_equal(got[:, k], want.astype(np.int32), err_msg="row %d, d=%d" % (k, d))
        np.testing.assert_array_equal(lo, a.astype(np.int64) * d)
        with np.errstate(invalid="ignore"):
            np.testing.assert_array_equal(bm, f < 1.0)
