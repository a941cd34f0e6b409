"""OpenCL C code generation (tether.codegen.opencl_c): the source's structure, and kernels built from tir nodes run
on pocl's OpenCL CPU device, compared with the same tir compiled by the CPU backend (the kernel's thread indices
become serial loops there) and, for the math calls, with numpy.

Needs pocl (apt-get install pocl-opencl-icd ocl-icd-libopencl1) and clang (the source against each OpenCL C
version): skipped without them, a failure under CI.
"""
from __future__ import annotations

import ctypes
import math
import re
import struct
import subprocess

import numpy as np
import pytest

from tether.codegen.function import emit_function
from tether.codegen.module import ModuleBuilder
from tether.codegen.opencl_c import opencl_launch_info, opencl_needs, opencl_source
from tether.errors import CompileError
from tether.tir import (Allocate, Binary, Buffer, Call, Cast, Compare, Const, For, IfThenElse, Load, Not,
                        PrimFunc, Select, Store, Var, call_packed, dot4, seq)
from tether.tir.device import Barrier, DeviceKernel

from fixtures.prereq import require_tool, unavailable

BLOCK = 64
I32, F32 = "int32", "float32"


# ---- building kernels ---------------------------------------------------------------------------------------
def elementwise(name, inputs, out_dtype, value, n):
    """``out[i] = value(*loads at i)`` for i < n (a scalar argument): grid of ceil(n / 64) groups of 64."""
    bx, tx, nvar = Var("bx"), Var("tx"), Var("n")
    i = bx * BLOCK + tx
    out = Buffer("out", (n,), out_dtype)
    body = IfThenElse(Compare("lt", i, nvar), Store(out, i, value(*[Load(b, i) for b in inputs])))
    return DeviceKernel(name, list(inputs) + [out], body, {bx: "blockIdx.x", tx: "threadIdx.x"},
                        (-(-n // BLOCK), 1, 1), (BLOCK, 1, 1), scalars=[nvar])


# ---- running on pocl ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def gpu():
    try:
        from tether_rpc.gpu.opencl import OpenCLDevice
        dev = OpenCLDevice(0)
    except Exception as exc:   # GpuUnavailable (no libOpenCL / no device), or the runtime missing
        unavailable("an OpenCL device (%s)" % exc, "apt-get install pocl-opencl-icd ocl-icd-libopencl1")
    yield dev
    dev.close()


def run_gpu(dev, kernels, name, arrays, scalars=()):
    """Build ``kernels`` as one program, launch ``name`` on copies of ``arrays`` (its params in order) and return
    the arrays as the kernel left them."""
    kernels = kernels if isinstance(kernels, list) else [kernels]
    kernel = next(k for k in kernels if k.name == name)
    program = dev.load(opencl_source(kernels).encode(), [opencl_launch_info(k) for k in kernels])
    bufs = []
    for a in arrays:
        b = dev.alloc(max(a.nbytes, 1))
        dev.upload(b, np.ascontiguousarray(a))
        bufs.append(b)
    dev.launch(program, name, bufs + [int(s) for s in scalars], kernel.grid, kernel.block)
    dev.synchronize()
    out = []
    for a, b in zip(arrays, bufs):
        r = np.empty_like(a)
        dev.download(b, r)
        dev.free(b)
        out.append(r)
    return out


class _Jit:
    """The CPU backend's code for a PrimFunc, JIT-compiled with llvmlite's MCJIT, called through ctypes."""

    def __init__(self, pf):
        import llvmlite.binding as llvm
        mb = ModuleBuilder("host", pf.name)
        impl = emit_function(mb, pf)
        mb.add_packed(pf, impl)
        self.mod = llvm.parse_assembly(mb.finish())
        tm = llvm.Target.from_default_triple().create_target_machine(opt=2)
        self.ee = llvm.create_mcjit_compiler(self.mod, tm)
        self.ee.finalize_object()
        addr = self.ee.get_function_address(pf.name + "__impl")
        self.fn = ctypes.CFUNCTYPE(ctypes.c_int32, *[ctypes.c_void_p] * len(pf.param_buffers))(addr)


def run_cpu(kernel, arrays, scalars=()):
    """The same kernel through the CPU backend: its thread indices become serial loops (blocks outside threads:
    valid for kernels without barriers), its scalars constants."""
    body = kernel.body
    for v, value in zip(kernel.scalars, scalars):   # a loop of one iteration binds the scalar to its value
        body = For(v, Const(int(value), "int32"), Const(1, "int32"), "serial", body)
    extents = {"blockIdx": kernel.grid, "threadIdx": kernel.block}
    order = sorted(kernel.thread_of.items(), key=lambda vt: (vt[1].startswith("threadIdx"), "zyx".index(vt[1][-1])))
    for v, tag in reversed(order):
        body = For(v, Const(0, "int32"), Const(extents[tag.split(".")[0]]["xyz".index(tag[-1])], "int32"), "serial",
                   body)
    jit = _Jit(PrimFunc(kernel.name + "_cpu", kernel.params, kernel.params, body))
    out = [np.ascontiguousarray(a).copy() for a in arrays]
    assert jit.fn(*[a.ctypes.data for a in out]) == 0
    return out


def same(gpu_out, cpu_out, what, rtol=0.0):
    """Equal element for element (NaN where NaN), or within ``rtol`` for floats when given."""
    g, c = np.asarray(gpu_out), np.asarray(cpu_out)
    assert g.dtype == c.dtype, what
    if g.dtype.kind == "f" and rtol:
        np.testing.assert_allclose(g.astype(np.float64), c.astype(np.float64), rtol=rtol, atol=1e-30,
                                   equal_nan=True, err_msg=what)
    elif g.dtype.kind == "f":
        np.testing.assert_array_equal(g, c, err_msg=what)
    else:
        assert (g == c).all(), "%s:\n gpu %s\n cpu %s" % (what, g, c)


# ---- the source's structure -----------------------------------------------------------------------------------
def test_signature_attribute_and_thread_indices():
    a, b = Buffer("A", (100,), F32), Buffer("B", (100,), F32)
    k = elementwise("vadd", [a, b], F32, lambda x, y: x + y, 100)
    src = opencl_source([k])
    assert ("__kernel __attribute__((reqd_work_group_size(64, 1, 1)))\nvoid vadd(__global float* restrict A, "
            "__global float* restrict B, __global float* restrict out, int n) {") in src
    assert "const int bx = (int)get_group_id(0);" in src
    assert "const int tx = (int)get_local_id(0);" in src
    assert "#pragma OPENCL FP_CONTRACT OFF" in src
    assert "cl_khr_fp16" not in src and "cl_khr_fp64" not in src
    assert opencl_needs(k) == frozenset()


def reduction_kernel(n_groups):
    """Each work-group sums its 64 elements: loads into shared memory, then a tree of halving steps with a barrier
    after each, thread 0 writes the group's sum."""
    bx, tx = Var("bx"), Var("tx")
    x, out = Buffer("x", (n_groups * BLOCK,), F32), Buffer("sums", (n_groups,), F32)
    tile = Buffer("tile", (BLOCK,), F32, "shared")
    steps = [Store(tile, tx, Load(x, bx * BLOCK + tx)), Barrier()]
    half = BLOCK // 2
    while half:
        steps.append(IfThenElse(Compare("lt", tx, Const(half, I32)),
                                Store(tile, tx, Load(tile, tx) + Load(tile, tx + half))))
        steps.append(Barrier())
        half //= 2
    steps.append(IfThenElse(Compare("eq", tx, Const(0, I32)), Store(out, bx, Load(tile, Const(0, I32)))))
    return DeviceKernel("group_sum", [x, out], Allocate(tile, seq(*steps)), {bx: "blockIdx.x", tx: "threadIdx.x"},
                        (n_groups, 1, 1), (BLOCK, 1, 1))


def test_shared_memory_is_declared_at_kernel_scope_and_barriers_are_emitted():
    src = opencl_source([reduction_kernel(4)])
    body = src[src.index("void group_sum"):]
    lines = body.splitlines()
    assert lines[1] == "  __local float tile[64];"
    assert body.count("barrier(CLK_LOCAL_MEM_FENCE);") == 1 + 6   # after the loads, after each of 6 halvings


def test_loops_private_arrays_and_pragmas():
    bx, tx, j = Var("bx"), Var("tx"), Var("j")
    out = Buffer("out", (BLOCK,), F32)
    acc = Buffer("acc", (4,), F32, "local")
    body = Allocate(acc, seq(
        For(j, Const(0, I32), Const(4, I32), "unrolled", Store(acc, j, Cast(F32, j))),
        For(j, Const(1, I32), Const(3, I32), "vectorized", Store(out, tx, Load(acc, j)))))
    src = opencl_source([DeviceKernel("loops", [out], body, {bx: "blockIdx.x", tx: "threadIdx.x"}, (1, 1, 1),
                                      (BLOCK, 1, 1))])
    assert "    float acc[4];" in src
    assert "    #pragma unroll\n    for (int j = 0; j < 4; ++j) {" in src and "acc[j] = (float)j;" in src
    assert "for (int j_1 = 1; j_1 < 1 + 3; ++j_1) {" in src    # a second loop over a Var also named j


def _literal_value(text):
    text = text.strip("()")
    if text.endswith("INFINITY"):
        return -math.inf if text.startswith("-") else math.inf
    if text == "NAN":
        return math.nan
    return float(text.rstrip("f"))


@pytest.mark.parametrize("value", [0.1, -0.0, 1.0, 3.4028234663852886e38, 1e-45, 2.0 ** -149, 1 / 3, -2.5e-38,
                                   16777217.0, math.inf, -math.inf, math.nan, 1e39])
def test_float32_constants_are_exact(value):
    out = Buffer("out", (1,), F32)
    src = opencl_source([DeviceKernel("k", [out], Store(out, Const(0, I32), Const(value, F32)), {}, (1, 1, 1),
                                      (1, 1, 1))])
    text = re.search(r"out\[0\] = (.*);", src).group(1)
    want = struct.unpack("f", struct.pack("f", value))[0] if abs(value) < 3.5e38 or not math.isfinite(value) \
        else math.copysign(math.inf, value)
    got = _literal_value(text)
    if math.isnan(want):
        assert math.isnan(got)
    else:
        assert struct.pack("f", got) == struct.pack("f", want), (value, text)


def test_integer_constants_carry_their_type():
    out = Buffer("out", (4,), "int64")
    body = seq(Store(out, Const(0, I32), Const(-(1 << 63), "int64")), Store(out, Const(1, I32), Const(5, "int64")))
    src = opencl_source([DeviceKernel("k", [out], body, {}, (1, 1, 1), (1, 1, 1))])
    assert "out[0] = -9223372036854775807L - 1L;" in src
    assert "out[1] = 5L;" in src


def test_names_are_sanitised_and_unique():
    a, b = Buffer("x.in", (8,), F32), Buffer("int", (8,), F32)
    v1, v2, v3 = Var("i"), Var("i"), Var("exp")
    body = For(v1, Const(0, I32), Const(2, I32), "serial",
               For(v2, Const(0, I32), Const(2, I32), "serial",
                   For(v3, Const(0, I32), Const(2, I32), "serial",
                       Store(b, v1 * 4 + v2 * 2 + v3, Call("exp", [Load(a, v1 + v2 + v3)], F32)))))
    src = opencl_source([DeviceKernel("names", [a, b], body, {}, (1, 1, 1), (1, 1, 1))])
    assert "void names(__global float* restrict x_in, __global float* restrict int_)" in src
    assert "for (int i = 0;" in src and "for (int i_1 = 0;" in src and "for (int exp_ = 0;" in src
    assert "int_[((i * 4) + (i_1 * 2)) + exp_] = exp(x_in[(i + i_1) + exp_]);" in src


def test_refusals_name_the_problem():
    out = Buffer("out", (1,), F32)

    def kernel(value=None, body=None, name="k", scalars=(), thread_of=None):
        body = body or Store(out, Const(0, I32), value)
        return DeviceKernel(name, [out], body, thread_of or {}, (1, 1, 1), (1, 1, 1), scalars=scalars)

    with pytest.raises(CompileError, match="no math function 'lgamma'"):
        opencl_source([kernel(Call("lgamma", [Const(1.0, F32)], F32))])
    with pytest.raises(CompileError, match="PackedCall"):
        opencl_source([kernel(call_packed("f", Const(1.0, F32)))])
    with pytest.raises(CompileError, match="kernel name 'my-kernel'"):
        opencl_source([kernel(Const(1.0, F32), name="my-kernel")])
    with pytest.raises(CompileError, match="kernel name 'fmod'"):    # would overload the builtin
        opencl_source([kernel(Const(1.0, F32), name="fmod")])
    with pytest.raises(CompileError, match="two kernels named 'k'"):
        opencl_source([kernel(Const(1.0, F32)), kernel(Const(2.0, F32))])
    with pytest.raises(CompileError, match="scalar argument 'n' .* is int64"):
        opencl_source([kernel(Const(1.0, F32), scalars=[Var("n", "int64")])])
    t = Var("t")
    with pytest.raises(CompileError, match="thread loop over 't'"):
        loop = For(t, Const(0, I32), Const(4, I32), "thread", Store(out, Const(0, I32), Const(1.0, F32)))
        loop.thread_tag = "threadIdx.x"
        opencl_source([kernel(body=loop)])
    with pytest.raises(CompileError, match="bound to 'warpIdx.x', not a thread index"):
        opencl_source([kernel(Const(1.0, F32), thread_of={Var("w"): "warpIdx.x"})])
    with pytest.raises(CompileError, match="at least one kernel"):
        opencl_source([])
    with pytest.raises(CompileError, match="variable 'q' is used outside its loop"):
        opencl_source([kernel(Cast(F32, Var("q")))])
    with pytest.raises(CompileError, match="bfloat16 is not supported"):
        opencl_source([kernel(Cast(F32, Cast("bfloat16", Const(1.0, F32))))])


def test_float64_enables_fp64_and_adds_the_need():
    a = Buffer("a", (8,), "float64")
    k = elementwise("dbl", [a], "float64", lambda x: x * Const(0.1, "float64"), 8)
    src = opencl_source([k])
    assert "#pragma OPENCL EXTENSION cl_khr_fp64 : enable" in src
    assert "0.10000000000000001" in src
    assert opencl_needs(k) == frozenset({"fp64"})
    assert k.needs == frozenset()          # the kernel itself is not changed


def test_float16_storage_needs_no_extension():
    a = Buffer("a", (8,), "float16")
    k = elementwise("half_scale", [a], "float16", lambda x: x * Const(0.1, "float16"), 8)
    src = opencl_source([k])
    assert "cl_khr_fp16" not in src and "vload_half(" in src and "vstore_half_rte(" in src
    assert opencl_needs(k) == frozenset()


# ---- on pocl, against the CPU backend ------------------------------------------------------------------------
RNG = np.random.default_rng(7)
N = 150    # not a multiple of the block: the last group's guard matters


def _ints(dtype, n=N, nonzero=False):
    info = np.iinfo(dtype)
    lo, hi = max(info.min, -1000), min(info.max, 1000)
    x = RNG.integers(lo, hi, n, endpoint=True).astype(dtype)
    x[:4] = [max(lo, -7), 7, 0, 1] if info.min < 0 else [7, 3, 0, 1]
    if nonzero:
        x[x == 0] = 3
    return x


def _floats(n=N):
    x = RNG.standard_normal(n).astype(np.float32) * 10
    x[:6] = [-0.0, 0.0, 2.5, -2.5, 1e-3, -7.0]
    return x


def compare_elementwise(gpu, name, inputs, out_dtype, value, rtol=0.0):
    bufs = [Buffer("in%d" % k, a.shape, str(a.dtype) if a.dtype != np.bool_ else "bool")
            for k, a in enumerate(inputs)]
    k = elementwise(name, bufs, out_dtype, value, len(inputs[0]))
    arrays = list(inputs) + [np.zeros(len(inputs[0]), np.dtype(out_dtype if out_dtype != "bool" else np.bool_))]
    g = run_gpu(gpu, k, name, arrays, [len(inputs[0])])
    c = run_cpu(k, arrays, [len(inputs[0])])
    same(g[-1], c[-1], name, rtol)
    return g[-1]


def test_vector_add_with_a_scalar_bound(gpu):
    a, b = _floats(), _floats()
    a_b, b_b = Buffer("A", (N,), F32), Buffer("B", (N,), F32)
    k = elementwise("vadd", [a_b, b_b], F32, lambda x, y: x + y, N)
    out = np.full(N, -1.0, np.float32)
    g = run_gpu(gpu, k, "vadd", [a, b, out], [N - 10])
    np.testing.assert_array_equal(g[2][:N - 10], a[:N - 10] + b[:N - 10])
    np.testing.assert_array_equal(g[2][N - 10:], -1.0)      # beyond the scalar bound: untouched


INT_OPS = ["add", "sub", "mul", "floordiv", "floormod", "div", "min", "max", "bitand", "bitor", "bitxor"]


@pytest.mark.parametrize("dtype", ["int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64"])
def test_integer_binary_ops_and_compares(gpu, dtype):
    a, b = _ints(dtype), _ints(dtype, nonzero=True)
    a[:6] = np.array([-7, 7, -7, 7, -1, 0] if dtype[0] == "i" else [7, 7, 0, 1, 255, 0]).astype(dtype)
    b[:6] = np.array([2, -2, -2, 2, 3, -3] if dtype[0] == "i" else [2, 3, 3, 1, 2, 9]).astype(dtype)
    for op in INT_OPS:
        got = compare_elementwise(gpu, "op_" + op, [a, b], dtype, lambda x, y: Binary(op, x, y))
        if op in ("floordiv", "floormod") and dtype in ("int32", "int64"):   # floor semantics, as numpy's
            want = (a // b) if op == "floordiv" else (a % b)
            np.testing.assert_array_equal(got, want.astype(dtype))
    for cmp in ["lt", "le", "gt", "ge", "eq", "ne"]:
        compare_elementwise(gpu, "cmp_" + cmp, [a, b], "bool", lambda x, y: Compare(cmp, x, y))
    shift = (np.abs(b.astype(np.int64)) % 7).astype(dtype)
    for op in ("shl", "shr"):
        compare_elementwise(gpu, "op_" + op, [a, shift], dtype, lambda x, y: Binary(op, x, y))
    compare_elementwise(gpu, "abs_" + dtype, [a], dtype, lambda x: Call("abs", [x], dtype))


def test_float_binary_ops_and_compares(gpu):
    a, b = _floats(), _floats()
    a[6:10] = [np.nan, 1.0, -0.0, np.inf]
    b[6:10] = [1.0, np.nan, 0.0, np.inf]
    for op in ["add", "sub", "mul", "div", "min", "max"]:
        compare_elementwise(gpu, "f_" + op, [a, b], F32, lambda x, y: Binary(op, x, y))
    for cmp in ["lt", "le", "gt", "ge", "eq", "ne"]:
        compare_elementwise(gpu, "fcmp_" + cmp, [a, b], "bool", lambda x, y: Compare(cmp, x, y))


def test_logic_select_and_bool_buffers(gpu):
    p, q = RNG.integers(0, 2, N).astype(np.bool_), RNG.integers(0, 2, N).astype(np.bool_)
    a = _floats()
    compare_elementwise(gpu, "land", [p, q], "bool", lambda x, y: Binary("and", x, y, "bool"))
    compare_elementwise(gpu, "lor", [p, q], "bool", lambda x, y: Binary("or", x, y, "bool"))
    compare_elementwise(gpu, "lnot", [p], "bool", lambda x: Not(x))
    got = compare_elementwise(gpu, "sel", [p, a], F32, lambda c, x: Select(c, x * Const(2.0, F32),
                                                                              Const(-1.0, F32)))
    np.testing.assert_array_equal(got, np.where(p, a * 2, -1.0).astype(np.float32))


# every math call of the CPU backend, on the same inputs, edge values included
_EDGES = [0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 1.5, 2.5, -2.5, 3.5, 1e-30, 20.0, -20.0, 88.0, 100.0, -100.0, 1e30,
          np.inf, -np.inf, np.nan]
MATH = {
    "exp": np.exp, "log": np.log, "sqrt": np.sqrt, "rsqrt": lambda x: 1 / np.sqrt(x), "tanh": np.tanh,
    "sigmoid": lambda x: 1 / (1 + np.exp(-x)), "erf": None, "floor": np.floor, "ceil": np.ceil, "abs": np.abs,
    "fabs": np.abs, "round_even": np.rint, "sin": np.sin, "cos": np.cos, "tan": np.tan, "asin": np.arcsin,
    "acos": np.arccos, "atan": np.arctan,
}


def _math_inputs():
    x = np.concatenate([np.array(_EDGES, np.float32), RNG.uniform(-5, 5, 100).astype(np.float32),
                        RNG.uniform(-1, 1, 30).astype(np.float32)])
    return x


@pytest.mark.parametrize("name", sorted(MATH))
def test_math_calls_match_the_cpu_and_numpy(gpu, name):
    x = _math_inputs()
    with np.errstate(all="ignore"):
        got = compare_elementwise(gpu, "m_" + name, [x], F32, lambda v: Call(name, [v], F32), rtol=1e-5)
        if name == "erf":
            want = np.array([math.erf(float(v)) if not math.isnan(v) else math.nan for v in x], np.float32)
        else:
            want = MATH[name](x.astype(np.float64)).astype(np.float32)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, equal_nan=True, err_msg=name)


def test_pow_matches_the_cpu_and_numpy(gpu):
    xs = np.array([2.0, -2.0, -8.0, 0.0, -0.0, 1.0, -1.0, 0.5, np.inf, -np.inf, np.nan, 3.0, -1.0, 2.0],
                  np.float32)
    ys = np.array([3.0, 3.0, 1 / 3, -2.0, -1.0, np.nan, np.inf, 0.0, -1.0, 3.0, 0.0, 0.5, 2.5, 10.0], np.float32)
    xs = np.concatenate([xs, RNG.uniform(0, 5, 50).astype(np.float32)])
    ys = np.concatenate([ys, RNG.uniform(-3, 3, 50).astype(np.float32)])
    with np.errstate(all="ignore"):
        got = compare_elementwise(gpu, "m_pow", [xs, ys], F32, lambda a, b: Call("pow", [a, b], F32), rtol=1e-5)
        want = np.power(xs.astype(np.float64), ys.astype(np.float64)).astype(np.float32)
    np.testing.assert_allclose(got, want, rtol=1e-5, equal_nan=True)


@pytest.mark.parametrize("dst", ["int8", "uint8", "int16", "int32", "int64", "uint32", "bool", "float16"])
def test_casts_from_float(gpu, dst):
    # in range for every destination: an out-of-range float -> int cast is undefined on both backends
    x = np.array([0.0, -0.0, 0.4, -0.6, 1.5, -1.5, 2.5, 100.9, 127.0, -128.0, 0.1, 65504.0 / 1000, 1e-8] * 3,
                 np.float32)
    if dst[0] == "u" or dst == "bool":
        x = np.abs(x)
    compare_elementwise(gpu, "cast_" + dst, [x], dst, lambda v: Cast(dst, v))


@pytest.mark.parametrize("src", ["int8", "uint8", "int16", "int32", "int64", "uint32"])
def test_casts_between_integers_and_to_float(gpu, src):
    x = _ints(src)
    for dst in ["int8", "uint8", "int16", "int32", "int64", "float32", "float16", "bool"]:
        compare_elementwise(gpu, "cast_%s_%s" % (src, dst), [x], dst, lambda v: Cast(dst, v))


def test_float16_storage_rounds_like_the_cpu(gpu):
    x = (_floats() * 123.456).astype(np.float16)
    x[:3] = [65504.0, -0.0, 6e-8]
    got = compare_elementwise(gpu, "h_mul", [x], "float16",
                              lambda v: v * Const(0.1, "float16") + Cast("float16", Cast(F32, v)))
    assert got.dtype == np.float16
    compare_elementwise(gpu, "h_exp", [x[:40] / np.float16(100)], F32,
                        lambda v: Call("exp", [Cast(F32, v)], F32), rtol=1e-5)


def test_dot4_matches_the_cpu(gpu):
    a = RNG.integers(-2**31, 2**31, N, dtype=np.int64).astype(np.int32)
    b = RNG.integers(-2**31, 2**31, N, dtype=np.int64).astype(np.int32)
    for kind in ("u8s8", "s8s8", "u8u8"):
        got = compare_elementwise(gpu, "dot4_" + kind, [a, b], I32, lambda x, y: dot4(x, y, kind))
        ua, ub = a.view(np.uint8).reshape(-1, 4), b.view(np.uint8).reshape(-1, 4)
        va = ua.astype(np.int32) if kind[0] == "u" else ua.view(np.int8).astype(np.int32)
        vb = ub.astype(np.int32) if kind[2] == "u" else ub.view(np.int8).astype(np.int32)
        np.testing.assert_array_equal(got, (va * vb).sum(axis=1))


def test_shared_memory_tile_reduction_with_barriers(gpu):
    groups = 5
    x = RNG.integers(-50, 50, groups * BLOCK).astype(np.float32)   # integers: the sum is exact in any order
    k = reduction_kernel(groups)
    _, sums = run_gpu(gpu, k, "group_sum", [x, np.zeros(groups, np.float32)])
    np.testing.assert_array_equal(sums, x.reshape(groups, BLOCK).sum(axis=1))


def test_private_arrays_loops_and_two_dimensional_blocks(gpu):
    # a 2-D grid of 2-D blocks; each thread fills a private array in an unrolled loop and sums it serially
    bx, by, tx, ty, j = Var("bx"), Var("by"), Var("tx"), Var("ty"), Var("j")
    w = 2 * 8
    out = Buffer("out", (3 * 4 * w,), I32)
    acc = Buffer("acc", (4,), I32, "local")
    s = Buffer("s", (1,), I32, "local")
    row, col = by * 4 + ty, bx * 8 + tx
    body = Allocate(acc, Allocate(s, seq(
        For(j, Const(0, I32), Const(4, I32), "unrolled", Store(acc, j, row * j - col)),
        Store(s, Const(0, I32), Const(0, I32)),
        For(j, Const(0, I32), Const(4, I32), "serial", Store(s, Const(0, I32), Load(s, Const(0, I32)) + Load(acc, j))),
        Store(out, row * w + col, Load(s, Const(0, I32))))))
    k = DeviceKernel("tiles2d", [out], body, {bx: "blockIdx.x", by: "blockIdx.y", tx: "threadIdx.x",
                                               ty: "threadIdx.y"}, (2, 3, 1), (8, 4, 1))
    arrays = [np.zeros(3 * 4 * w, np.int32)]
    g, c = run_gpu(gpu, k, "tiles2d", arrays), run_cpu(k, arrays)
    same(g[0], c[0], "tiles2d")
    r, cc = np.divmod(np.arange(3 * 4 * w), w)
    np.testing.assert_array_equal(g[0], 6 * r - 4 * cc)


def test_two_kernels_in_one_program_share_helpers(gpu):
    a = _ints("int32", nonzero=True)
    b0 = Buffer("a", (N,), I32)
    k1 = elementwise("floor_div", [b0], I32, lambda x: Binary("floordiv", x, Const(-3, I32)), N)
    k2 = elementwise("floor_mod", [b0], I32, lambda x: Binary("floormod", x, Const(-3, I32)), N)
    src = opencl_source([k1, k2])
    assert src.count("int tether_floordiv_int") == 1
    out = np.zeros(N, np.int32)
    np.testing.assert_array_equal(run_gpu(gpu, [k1, k2], "floor_div", [a, out], [N])[1], a // -3)
    np.testing.assert_array_equal(run_gpu(gpu, [k1, k2], "floor_mod", [a, out], [N])[1], a % -3)


def test_float64_runs_where_the_device_has_fp64_and_is_refused_elsewhere(gpu):
    x = RNG.standard_normal(N)
    k = elementwise("d_exp", [Buffer("x", (N,), "float64")], "float64",
                    lambda v: Call("exp", [v], "float64") * Const(0.1, "float64"), N)
    assert opencl_launch_info(k)["needs"] == ["fp64"]
    arrays = [x, np.zeros(N)]
    if "cl_khr_fp64" not in gpu.info()["extensions"]:
        from tether_rpc.gpu.api import GpuUnavailable
        with pytest.raises(GpuUnavailable, match="fp64"):
            run_gpu(gpu, k, "d_exp", arrays, [N])
        return
    got = run_gpu(gpu, k, "d_exp", arrays, [N])[1]
    same(got, run_cpu(k, arrays, [N])[1], "d_exp", rtol=1e-12)
    np.testing.assert_allclose(got, np.exp(x) * 0.1, rtol=1e-12)


@pytest.mark.parametrize("dtype", ["int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
                                   "float32", "float16"])
def test_constants_of_every_dtype(gpu, dtype):
    # the extremes of each type, added to zero: a literal of the wrong type or value shows in the sum
    if dtype.startswith("float"):
        edges = [np.finfo(dtype).max, -np.finfo(dtype).max, np.finfo(dtype).tiny, 0.1, -0.0, np.inf, -np.inf]
    else:
        edges = [np.iinfo(dtype).min, np.iinfo(dtype).max, 1, 0]
    x = np.zeros(N, dtype)
    for k, c in enumerate(edges):
        got = compare_elementwise(gpu, "const%d" % k, [x], dtype, lambda v: v + Const(c, dtype))
        np.testing.assert_array_equal(got, np.full(N, c, dtype))


def test_select_evaluates_only_the_chosen_arm(gpu):
    # an integer division by zero would trap: the guarded arm must not run where the guard is false
    a, b = _ints("int32"), _ints("int32")
    b[::3] = 0
    got = compare_elementwise(gpu, "guarded", [a, b], I32, lambda x, y: Select(
        Compare("ne", y, Const(0, I32)), Binary("floordiv", x, y), Const(-1, I32)))
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(got, np.where(b != 0, a // np.where(b != 0, b, 1), -1))


def test_float16_and_bool_in_shared_and_private_arrays(gpu):
    # each group reverses its 64 values through a float16 shared tile and a private float16 copy; a bool tile
    # carries their signs the same way
    bx, tx = Var("bx"), Var("tx")
    groups = 3
    x, y = Buffer("x", (groups * BLOCK,), "float16"), Buffer("y", (groups * BLOCK,), "float16")
    neg = Buffer("neg", (groups * BLOCK,), "bool")
    tile, signs = Buffer("tile", (BLOCK,), "float16", "shared"), Buffer("signs", (BLOCK,), "bool", "shared")
    mine = Buffer("mine", (1,), "float16", "local")
    g = bx * BLOCK + tx
    zero = Const(0, I32)
    body = Allocate(tile, Allocate(signs, Allocate(mine, seq(
        Store(tile, tx, Load(x, g) * Const(3.0, "float16")),
        Store(signs, tx, Compare("lt", Load(x, g), Const(0.0, "float16"))),
        Barrier(),
        Store(mine, zero, Load(tile, Const(BLOCK - 1, I32) - tx)),
        Store(y, g, Load(mine, zero)),
        Store(neg, g, Load(signs, Const(BLOCK - 1, I32) - tx))))))
    k = DeviceKernel("reverse_half", [x, y, neg], body, {bx: "blockIdx.x", tx: "threadIdx.x"}, (groups, 1, 1),
                     (BLOCK, 1, 1))
    src = opencl_source([k])
    assert "__local ushort tile[64];" in src and "__local uchar signs[64];" in src and "ushort mine[1];" in src
    xs = (RNG.standard_normal(groups * BLOCK) * 1000).astype(np.float16)
    _, ys, negs = run_gpu(gpu, k, "reverse_half", [xs, np.zeros_like(xs), np.zeros(groups * BLOCK, np.bool_)])
    want = (xs.astype(np.float32) * 3).astype(np.float16).reshape(groups, BLOCK)[:, ::-1].ravel()
    np.testing.assert_array_equal(ys, want)
    np.testing.assert_array_equal(negs, (xs < 0).reshape(groups, BLOCK)[:, ::-1].ravel())


@pytest.mark.parametrize("std", ["CL1.1", "CL1.2", "CL2.0"])
def test_source_compiles_as_every_opencl_c_version(tmp_path, std):
    # pocl compiles OpenCL C 1.2; phones' drivers range from 1.1 (older Mali) to 2.0 (Adreno): clang checks the
    # helpers, half storage, shared memory and barriers against each language version
    clang = require_tool("clang")
    a, h = Buffer("a", (N,), F32), Buffer("h", (N,), "float16")
    ints = Buffer("i8", (N,), "int8")
    kernels = [
        elementwise("math_all", [a], F32, lambda x: Call("sigmoid", [x], F32) + Binary("max", x, Call(
            "rsqrt", [x], F32)), N),
        elementwise("half_round", [a], "float16", lambda x: Cast("float16", x), N),
        elementwise("half_in", [h], F32, lambda x: Call("exp", [Cast(F32, x)], F32), N),
        elementwise("int_ops", [ints], "int8", lambda x: Binary("floormod", x, Const(-3, "int8")) + Call(
            "abs", [x], "int8"), N),
        reduction_kernel(2),
    ]
    path = tmp_path / "program.cl"
    path.write_text(opencl_source(kernels))
    r = subprocess.run([clang, "-x", "cl", "-cl-std=" + std, "-Xclang", "-finclude-default-header",
                        "-fsyntax-only", "-Werror", str(path)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


def test_index_math_proven_non_negative_divides_plainly(gpu):
    # (bx*64 + tx + j) // 7 cannot be negative: C's / (as the CPU's unsigned division there); tx - j can, so its
    # floormod keeps the floor helper; both agree with the CPU backend
    bx, tx, j = Var("bx"), Var("tx"), Var("j")
    out = Buffer("out", (3 * BLOCK * 4,), I32)
    g = bx * BLOCK + tx
    body = For(j, Const(0, I32), Const(4, I32), "serial", Store(out, g * 4 + j, Binary(
        "floordiv", g + j, Const(7, I32)) * 100 + Binary("floormod", tx - j * 5, Const(7, I32))))
    k = DeviceKernel("index_math", [out], body, {bx: "blockIdx.x", tx: "threadIdx.x"}, (3, 1, 1), (BLOCK, 1, 1))
    src = opencl_source([k])
    assert "(((bx * 64) + tx) + j) / 7" in src and "tether_floormod_int((tx - (j * 5)), 7)" in src
    arrays = [np.zeros(3 * BLOCK * 4, np.int32)]
    got = run_gpu(gpu, k, "index_math", arrays)[0]
    same(got, run_cpu(k, arrays)[0], "index_math")
    gg, jj = np.divmod(np.arange(3 * BLOCK * 4), 4)
    np.testing.assert_array_equal(got, (gg + jj) // 7 * 100 + (gg % BLOCK - jj * 5) % 7)
