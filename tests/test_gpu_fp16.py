"""Half precision on GPUs: float16 computed in half where the target promises fp16 (``-fp16=1``).

The same te kernels (an elementwise chain, one with a math call, a row sum accumulating in float16 and one
accumulating in float32, a matmul with float16 inputs and float32 accumulation, a pure float16 matmul) are built
for ``vulkan -fp16=1`` and run on lavapipe (shaderFloat16), compared with numpy computing in float16 (each
np.float16 operation rounds to half, as half arithmetic does), and their error against float32 is reported; built
for ``opencl -fp16=1`` they are refused at load on pocl (no cl_khr_fp16), and built for ``opencl`` they run on
pocl computing in float32 (float16 only stored), compared with numpy doing the same.
"""
from __future__ import annotations

import subprocess

import numpy as np
import pytest
from fixtures.prereq import require_tool, unavailable

import tether
from tether import te
from tether_rpc.gpu.api import GpuUnavailable
from tether_rpc.module import load_module, read_metadata

N = 1024                 # elementwise length
ROWS, COLS = 64, 512     # row sums
M = K = 64               # matmuls: M x K @ K x M, tiles of 8
KK = 256                 # the matmuls' reduction length


# ---- kernels --------------------------------------------------------------------------------------------------
def _threads(s, t, block):
    bx, tx = s[t].split(t.op.axis[0], factor=block)
    s[t].bind(bx, te.thread_axis("blockIdx.x"))
    s[t].bind(tx, te.thread_axis("threadIdx.x"))


def chain():
    """C = (A * B + A) * B - 0.75: four float16 operations, each rounded to half in half arithmetic."""
    a = te.placeholder((N,), "float16", name="A")
    b = te.placeholder((N,), "float16", name="B")
    c = te.compute((N,), lambda i: (a[i] * b[i] + a[i]) * b[i] - 0.75, name="C")
    s = te.create_schedule(c.op)
    _threads(s, c, 64)
    return s, [a, b, c]


def expmix():
    """C = exp(A) * B + A: a math call on float16 (computed in float32, rounded to half once) in a chain."""
    a = te.placeholder((N,), "float16", name="A")
    b = te.placeholder((N,), "float16", name="B")
    c = te.compute((N,), lambda i: te.exp(a[i]) * b[i] + a[i], name="C")
    s = te.create_schedule(c.op)
    _threads(s, c, 64)
    return s, [a, b, c]


def ops():
    """C = A > B ? max(A, B) * sigmoid(A) : min(A, B) + float16(int(A * 4)): compares, min/max, a select, a
    math call and casts between float16 and int32, all on half values."""
    a = te.placeholder((N,), "float16", name="A")
    b = te.placeholder((N,), "float16", name="B")
    c = te.compute((N,), lambda i: te.if_then_else(
        a[i] > b[i], te.max(a[i], b[i]) * te.sigmoid(a[i]),
        te.min(a[i], b[i]) + (a[i] * 4.0).astype("int32").astype("float16")), name="C")
    s = te.create_schedule(c.op)
    _threads(s, c, 64)
    return s, [a, b, c]


def rowsum(acc: str):
    """S[i] = sum_k A[i, k] over float16 A, accumulated in ``acc`` (float32: through a cast), one thread a row."""
    a = te.placeholder((ROWS, COLS), "float16", name="A")
    r = te.reduce_axis(COLS, "k")
    if acc == "float16":
        out = te.compute((ROWS,), lambda i: te.sum(a[i, r], axis=r), name="S")
    else:
        out = te.compute((ROWS,), lambda i: te.sum(a[i, r].astype(acc), axis=r), name="S")
    s = te.create_schedule(out.op)
    _threads(s, out, 32)
    return s, [a, out]


def matmul(acc: str, tile: int = 8):
    """C = A @ B over float16 A and B, accumulated in ``acc``; tiles of A and B in shared memory (float16
    work-group arrays), fetched by all threads between barriers, as tests/fixtures/gpu_kernels.matmul_gpu."""
    a = te.placeholder((M, KK), "float16", name="A")
    b = te.placeholder((KK, M), "float16", name="B")
    r = te.reduce_axis(KK, "k")
    if acc == "float16":
        c = te.compute((M, M), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), name="C")
    else:
        c = te.compute((M, M), lambda i, j: te.sum(a[i, r].astype(acc) * b[r, j].astype(acc), axis=r), name="C")
    s = te.create_schedule(c.op)
    aa = s.cache_read(a, "shared", [c])
    bb = s.cache_read(b, "shared", [c])
    tx, ty = te.thread_axis("threadIdx.x"), te.thread_axis("threadIdx.y")
    i, j = s[c].op.axis
    bi, ti = s[c].split(i, factor=tile)
    bj, tj = s[c].split(j, factor=tile)
    s[c].bind(bi, te.thread_axis("blockIdx.y"))
    s[c].bind(bj, te.thread_axis("blockIdx.x"))
    s[c].bind(ti, ty)
    s[c].bind(tj, tx)
    ko, ki = s[c].split(s[c].op.reduce_axis[0], factor=tile)
    s[c].reorder(bi, bj, ti, tj, ko, ki)
    for cache in (aa, bb):
        s[cache].compute_at(s[c], ko)
        fused = s[cache].fuse(*s[cache].op.axis)
        rest, x = s[cache].split(fused, factor=tile)
        s[cache].bind(x, tx)
        s[cache].bind(rest, ty)
    return s, [a, b, c]


KERNELS = {"chain": chain, "expmix": expmix, "ops": ops, "sum16": lambda: rowsum("float16"),
           "sum32": lambda: rowsum("float32"), "mm_mixed": lambda: matmul("float32"),
           "mm16": lambda: matmul("float16")}


def _inputs(name: str):
    rng = np.random.default_rng(sorted(KERNELS).index(name))
    if name in ("chain", "expmix", "ops"):
        return [rng.uniform(-3, 3, N).astype(np.float16), rng.uniform(-3, 3, N).astype(np.float16)]
    if name.startswith("sum"):
        return [rng.uniform(0, 1, (ROWS, COLS)).astype(np.float16)]
    return [rng.uniform(-1, 1, (M, KK)).astype(np.float16), rng.uniform(-1, 1, (KK, M)).astype(np.float16)]


# ---- references (numpy) ---------------------------------------------------------------------------------------
def _f16_reference(name: str, ins):
    """What half arithmetic gives: every np.float16 operation rounds to half; reductions in the kernel's order
    (k ascending, one thread each), starting from 0."""
    h = np.float16
    if name == "chain":
        a, b = ins
        return (a * b + a) * b - h(0.75)
    if name == "expmix":
        a, b = ins
        return np.exp(a) * b + a          # (numpy's float16 exp: float32 exp rounded to half)
    if name == "ops":
        a, b = ins
        sig = _sigmoid32(a.astype(np.float32)).astype(np.float16)     # math: float32, rounded once
        return np.where(a > b, np.maximum(a, b) * sig,
                        np.minimum(a, b) + (a * h(4)).astype(np.int32).astype(np.float16))
    if name == "sum16":
        acc = np.zeros(ROWS, np.float16)
        for k in range(COLS):
            acc = acc + ins[0][:, k]
        return acc
    if name == "sum32":
        return _sequential_sum32(ins[0])
    a, b = ins
    if name == "mm_mixed":
        return _sequential_mm32(a, b)
    acc = np.zeros((M, M), np.float16)
    for k in range(KK):
        acc = acc + a[:, k, None] * b[None, k, :]
    return acc


def _f32_compute_reference(name: str, ins):
    """What float16 storage with float32 arithmetic gives (the CPU's and a target without fp16): expressions in
    float32, rounded to half where stored (a float16 accumulator is stored, so rounded, at every step)."""
    f = [x.astype(np.float32) for x in ins]
    if name == "chain":
        a, b = f
        return ((a * b + a) * b - np.float32(0.75)).astype(np.float16)
    if name == "expmix":
        a, b = f
        return (np.exp(a) * b + a).astype(np.float16)
    if name == "ops":
        a, b = f
        return np.where(a > b, np.maximum(a, b) * _sigmoid32(a),
                        np.minimum(a, b) + (a * np.float32(4)).astype(np.int32)).astype(np.float16)
    if name == "sum16":
        acc = np.zeros(ROWS, np.float16)
        for k in range(COLS):
            acc = (acc.astype(np.float32) + f[0][:, k]).astype(np.float16)
        return acc
    if name == "sum32":
        return _sequential_sum32(ins[0])
    a, b = f
    if name == "mm_mixed":
        return _sequential_mm32(ins[0], ins[1])
    acc = np.zeros((M, M), np.float16)
    for k in range(KK):
        acc = (acc.astype(np.float32) + a[:, k, None] * b[None, k, :]).astype(np.float16)
    return acc


def _sigmoid32(x):
    return (np.float32(1) / (np.float32(1) + np.exp(-x))).astype(np.float32)


def _sequential_sum32(a):
    acc = np.zeros(ROWS, np.float32)
    for k in range(COLS):
        acc = acc + a[:, k].astype(np.float32)
    return acc


def _sequential_mm32(a, b):
    acc = np.zeros((M, M), np.float32)
    a, b = a.astype(np.float32), b.astype(np.float32)
    for k in range(KK):
        acc = acc + a[:, k, None] * b[None, k, :]      # (products of halves are exact in float32)
    return acc


def _exact(name: str, ins):
    """The float64 result of the float16 inputs: what the kernel's error is measured against."""
    f = [x.astype(np.float64) for x in ins]
    if name == "chain":
        return (f[0] * f[1] + f[0]) * f[1] - 0.75
    if name == "expmix":
        return np.exp(f[0]) * f[1] + f[0]
    if name == "ops":
        a, b = f
        return np.where(a > b, np.maximum(a, b) / (1 + np.exp(-a)), np.minimum(a, b) + np.trunc(a * 4))
    if name.startswith("sum"):
        return f[0].sum(axis=1)
    return f[0] @ f[1]


def _ulps(x, y):
    """Distance in float16 units in the last place (bit patterns mapped to a monotonic integer line)."""
    def line(v):
        i = np.asarray(v, np.float16).view(np.int16).astype(np.int64)
        return np.where(i < 0, -32768 - i, i)
    return np.abs(line(x) - line(y))


# ---- building and running -------------------------------------------------------------------------------------
def _require(api: str, package: str) -> None:
    from tether_rpc.gpu.module import available_apis

    found = available_apis()[api]
    if isinstance(found, str):
        unavailable("a %s device (%s)" % (api, found), "apt-get install " + package)


def _build(name: str, target: str, folder):
    lib = tether.build(*KERNELS[name](), target=target, name=name)
    return lib, lib.export_library(str(folder / ("%s.so" % name)))


def _run(path: str, name: str, ins):
    s, args = KERNELS[name]()
    out = np.zeros(tuple(int(d) for d in args[-1].shape), args[-1].dtype)
    m = load_module(path)
    try:
        m[name](*ins, out)
    finally:
        m.close()
    return out


@pytest.fixture(scope="module")
def lavapipe_results(tmp_path_factory):
    _require("vulkan", "mesa-vulkan-drivers libvulkan1")
    from tether_rpc.gpu.module import available_apis
    if not any(d.get("fp16") for d in available_apis()["vulkan"]):
        unavailable("a Vulkan device with shaderFloat16", "apt-get install mesa-vulkan-drivers (lavapipe has it)")
    folder = tmp_path_factory.mktemp("vulkan_fp16")
    out = {}
    for name in KERNELS:
        lib, path = _build(name, "vulkan -fp16=1", folder)
        ins = _inputs(name)
        out[name] = (lib, path, ins, _run(path, name, ins))
    return out


def _report(name, got, ins):
    exact = _exact(name, ins)
    scale = np.abs(exact).max()
    err = np.abs(got.astype(np.float64) - exact).max() / scale
    print("%-8s %s: max error against float64, relative to max |result|: %.2e" % (name, got.dtype, err))
    return err


# ---- vulkan -fp16=1 on lavapipe -------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["chain", "sum16", "mm16"])
def test_half_arithmetic_matches_numpy_float16(lavapipe_results, name):
    """Each operation rounded to half, in the kernel's order: numpy's float16 gives the same bits. (Sums and
    products of two halves are computed exactly in float32 and rounded once, so a correctly rounded half
    operation has one answer; the kernels' reductions run k in order, as the reference does.) For the chain
    and the float16 matmul that is not what float32 arithmetic rounded at the stores gives: the test tells the
    two apart. (A float16 sum stores, so rounds, its accumulator at every step either way.)"""
    lib, path, ins, got = lavapipe_results[name]
    assert read_metadata(path)["device"]["needs"] == ["fp16"]
    want = _f16_reference(name, ins)
    assert _ulps(got, want).max() == 0, (name, int(_ulps(got, want).max()))
    if name != "sum16":
        assert (_ulps(_f32_compute_reference(name, ins), want) > 0).sum() > 10      # the references differ
    _report(name, got, ins)


@pytest.mark.parametrize("name", ["expmix", "ops"])
def test_half_math_calls_within_one_ulp(lavapipe_results, name):
    """exp and sigmoid on float16 are computed in float32 and rounded once; lavapipe's float32 exp (3.5e-6
    relative, docs/gpu.md) and the sigmoid formula may land on the other side of a rounding boundary of half
    (2^-11 relative apart) from numpy's: at most 1 ulp off, rarely. The rest (compares, min/max, select, casts
    to and from int32, products) is exact."""
    lib, path, ins, got = lavapipe_results[name]
    ulps = _ulps(got, _f16_reference(name, ins))
    assert ulps.max() <= 1 and (ulps > 0).mean() < 0.02, (int(ulps.max()), float((ulps > 0).mean()))
    _report(name, got, ins)


def test_float32_accumulation_beats_float16(lavapipe_results):
    """A float16 row sum accumulates half's rounding (its ulp is 0.25 near 256); accumulating in float32 through a
    cast keeps float32's (about 1e-7), and the mixed-precision matmul (float16 inputs, exact float32 products,
    float32 sums) is 100 times closer to the exact result than the float16 one."""
    _, _, ins16, got16 = lavapipe_results["sum16"]
    _, path32, ins32, got32 = lavapipe_results["sum32"]
    assert got32.dtype == np.float32 and "fp16" in read_metadata(path32)["device"]["needs"]
    np.testing.assert_array_equal(got32, _sequential_sum32(ins32[0]))
    err16, err32 = _report("sum16", got16, ins16), _report("sum32", got32, ins32)
    assert err32 < 1e-6 < err16
    _, _, ins, mixed = lavapipe_results["mm_mixed"]
    _, _, ins16, pure = lavapipe_results["mm16"]
    # float32 accumulation of exact products: within k * 2^-24 * sum |a||b| of the exact result (a fused
    # multiply-add, which Vulkan allows, only makes it closer)
    bound = KK * 2.0 ** -24 * (np.abs(ins[0].astype(np.float64)) @ np.abs(ins[1].astype(np.float64)))
    assert (np.abs(mixed - _exact("mm_mixed", ins)) <= bound).all()
    assert _report("mm_mixed", mixed, ins) * 100 < _report("mm16", pure, ins16)


def test_float16_capability_only_where_used(tmp_path):
    """The SPIR-V of a float32 kernel built for vulkan -fp16=1 declares no Float16 and needs nothing; the float16
    one declares Float16 and computes with half-typed instructions."""
    dis = require_tool("spirv-dis", "apt-get install spirv-tools")
    val = require_tool("spirv-val", "apt-get install spirv-tools")

    def disassemble(lib, name):
        code = tmp_path / ("%s.spv" % name)
        code.write_bytes(lib.device_code)
        subprocess.run([val, "--target-env", "vulkan1.1", str(code)], check=True, timeout=120)
        return subprocess.run([dis, str(code)], check=True, capture_output=True, text=True, timeout=120).stdout

    a = te.placeholder((N,), "float32", name="A")
    c = te.compute((N,), lambda i: a[i] * a[i] + 1.0, name="C")
    s = te.create_schedule(c.op)
    _threads(s, c, 64)
    f32 = tether.build(s, [a, c], target="vulkan -fp16=1", name="sq")
    text = disassemble(f32, "sq")
    assert "Float16" not in text and "OpTypeFloat 16" not in text and f32.device["needs"] == []
    half = tether.build(*chain(), target="vulkan -fp16=1", name="chain")
    text = disassemble(half, "chain")
    assert "OpCapability Float16" in text
    assert "OpFMul %half" in text and "OpFAdd %half" in text and "OpFSub %half" in text
    assert "OpTypeFloat 32" not in text            # nothing widened: the chain is all half


@pytest.mark.parametrize("std", ["CL1.1", "CL1.2", "CL2.0"])
def test_opencl_half_source_compiles_as_every_opencl_c_version(tmp_path, std):
    """pocl cannot run the half code: clang checks it (half buffers, __local half tiles, half constants, casts,
    math through float) against each OpenCL C version a phone's driver may take, cl_khr_fp16 enabled by the
    program's pragma (without it clang refuses every half load)."""
    from tether.codegen.opencl_c import opencl_source
    from tether.gpu_build import split_functions
    from tether.target import Target

    clang = require_tool("clang")
    kernels = [k for name, make in KERNELS.items()
               for k in split_functions([tether.lower(*make(), name=name)], Target("opencl -fp16=1"))[0].kernels]
    path = tmp_path / "half.cl"
    path.write_text(opencl_source(kernels, fp16=True))
    r = subprocess.run([clang, "-x", "cl", "-cl-std=" + std, "-Xclang", "-finclude-default-header",
                        "-fsyntax-only", "-Werror", str(path)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


# ---- OpenCL on pocl ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def pocl(tmp_path_factory):
    _require("opencl", "pocl-opencl-icd ocl-icd-libopencl1")
    from tether_rpc.gpu.module import available_apis
    if any(d.get("fp16") for d in available_apis()["opencl"]):
        pytest.skip("this machine's OpenCL device has cl_khr_fp16 (pocl here has not)")
    return tmp_path_factory.mktemp("opencl_fp16")


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_opencl_fp16_refused_at_load_on_pocl(pocl, name):
    lib, path = _build(name, "opencl -fp16=1", pocl)
    assert "#pragma OPENCL EXTENSION cl_khr_fp16 : enable" in lib.get_source("device")
    assert "fp16" in read_metadata(path)["device"]["needs"]
    with pytest.raises(GpuUnavailable) as info:
        load_module(path)
    line = str(info.value)
    assert "\n" not in line and "%s.so" % name in line and "fp16" in line, line


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_opencl_without_fp16_computes_in_float32_on_pocl(pocl, name):
    """Without -fp16, float16 is stored as half and computed as float (no cl_khr_fp16 needed): the float32
    reference rounded where stored. Exact, but for exp (pocl's float32 exp rounds correctly but for a few cases:
    at most 1 ulp of half after rounding)."""
    lib, path = _build(name, "opencl", pocl)
    assert "cl_khr_fp16" not in lib.get_source("device") and read_metadata(path)["device"]["needs"] == []
    ins = _inputs(name)
    got = _run(path, name, ins)
    want = _f32_compute_reference(name, ins)
    if name == "mm_mixed":
        np.testing.assert_array_equal(got, want)
    else:
        assert _ulps(got, want).max() <= (1 if name in ("expmix", "ops") else 0), name
    _report(name, got, ins)
