"""mathlib against numpy: every function, scalar and vector float/double, compiled to a real host .so."""
from __future__ import annotations

import ctypes
import math
import re

import numpy as np
import pytest
from kernels import KERNEL_DIR
from fixtures.prereq import require_module, require_tool
from llvmlite import ir

from fixtures.backend import PackedCaller, math_kernel
from tether.driver import build_ir
from tether.codegen import mathlib
from tether.codegen.module import ModuleBuilder
from tether.errors import UnsupportedOpError

N = 2048
F32, F64 = ir.FloatType(), ir.DoubleType()
TYPES = {"f32": F32, "v4f32": ir.VectorType(F32, 4), "v8f32": ir.VectorType(F32, 8), "f64": F64,
         "v2f64": ir.VectorType(F64, 2)}
FUNCS = ("exp", "log", "tanh", "sigmoid", "erf", "pow", "sqrt", "rsqrt", "floor", "ceil", "abs")
INF, NAN = float("inf"), float("nan")
rng = np.random.default_rng(1234)


def _erf(x):
    return np.vectorize(math.erf, otypes=[np.float64])(x)


def _sigmoid(x):
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-x))


# name -> (float64 reference, test points, float32 rtol, float64 rtol)
CASES = {
    "exp": (np.exp, np.concatenate([np.linspace(-87, 88.7, 900), rng.uniform(-20, 20, 300),
                                    [0.0, -0.0, 1e-30, -1e-30, 1.0, -1.0, 88.72, 88.75, 89.0, 100.0, 1e4, INF, -INF,
                                     -87.5, -95.0, -100.0, -103.9, -104.0, -200.0, NAN, 709.0, 709.7, 710.0, -745.0,
                                     -746.0, -800.0]]), 1e-6, 1e-14),
    "log": (np.log, np.concatenate([np.geomspace(1e-37, 1e37, 600), rng.uniform(0.5, 2.0, 300),
                                    1.0 + np.arange(-50, 50) * 2.0 ** -23, [1e-40, 1e-45, 1e-310, 1e300],
                                    [0.0, -0.0, -1.0, -1e-30, INF, -INF, NAN, 1.0, 2.0, 0.5]]), 1e-6, 1e-14),
    "tanh": (np.tanh, np.concatenate([np.linspace(-20, 20, 800), np.geomspace(1e-8, 0.7, 200),
                                      -np.geomspace(1e-8, 0.7, 100), [0.6249, 0.625, 0.6251, -0.625],
                                      [0.0, -0.0, 1e-30, INF, -INF, NAN, 1e30, -1e30]]), 1e-6, 1e-14),
    "sigmoid": (_sigmoid, np.concatenate([np.linspace(-100, 100, 800), rng.normal(0, 4, 300),
                                          [0.0, -0.0, INF, -INF, NAN, 1e30, -1e30, -700.0, 700.0]]), 1e-6, 1e-14),
    "erf": (_erf, np.concatenate([np.linspace(-6.5, 6.5, 900), np.geomspace(1e-8, 1.0, 200),
                                  -np.geomspace(1e-8, 1.0, 100), [0.999, 1.0, 1.001, 3.99, 4.0, 4.01, 5.99, 6.0],
                                  [0.0, -0.0, INF, -INF, NAN, 1e30]]), 1e-6, 1e-14),
    "sqrt": (np.sqrt, np.concatenate([np.geomspace(1e-37, 1e37, 500), [0.0, -0.0, INF, -1.0, NAN]]), 1e-7, 1e-16),
    "rsqrt": (lambda x: 1.0 / np.sqrt(x), np.concatenate([np.geomspace(1e-30, 1e30, 500), [INF, 0.0]]), 1e-6,
              1e-15),
    "abs": (np.abs, np.concatenate([rng.normal(0, 100, 500), [0.0, -0.0, INF, -INF, NAN]]), 0.0, 0.0),
    "floor": (np.floor, np.concatenate([rng.uniform(-1e4, 1e4, 500), np.arange(-40, 40) * 0.25,
                                        [0.0, -0.0, 0.5, -0.5, 0.49999997, -0.49999997, 8388607.5, -8388607.5,
                                         8388608.0, 16777215.0, 1e10, -1e10, 1e300, 2.0 ** 52 - 0.5, INF, -INF,
                                         NAN]]), 0.0, 0.0),
    "ceil": (np.ceil, np.concatenate([rng.uniform(-1e4, 1e4, 500), np.arange(-40, 40) * 0.25,
                                      [0.0, -0.0, 0.5, -0.5, 0.49999997, -0.49999997, 8388607.5, -8388607.5,
                                       8388608.0, 1e10, -1e10, 2.0 ** 52 - 0.5, INF, -INF, NAN]]), 0.0, 0.0),
}


def _pow_points():
    x = np.geomspace(1e-3, 1e3, 30)
    y = np.linspace(-10, 10, 25)
    xx, yy = [a.ravel() for a in np.meshgrid(x, y)]
    neg_x = -rng.uniform(0.1, 4, 100)
    neg_y = rng.integers(-9, 10, 100).astype(np.float64)
    ex = [(0.0, 2.0), (0.0, -1.0), (-0.0, -1.0), (-0.0, -2.0), (-2.0, 3.0), (-2.0, 0.5), (3.0, 0.0), (NAN, 0.0),
          (1.0, NAN), (1.0, INF), (2.0, INF), (0.5, INF), (2.0, -INF), (INF, -1.0), (INF, 2.0), (-INF, 3.0),
          (-2.0, INF), (NAN, 2.0), (2.0, NAN), (-1.0, -INF), (10.0, 38.0), (2.0, -149.0), (7.0, 0.5)]
    return (np.concatenate([xx, neg_x, [e[0] for e in ex]]), np.concatenate([yy, neg_y, [e[1] for e in ex]]))


def _pad(a, fill=1.0):
    assert a.size <= N
    return np.concatenate([a, np.full(N - a.size, fill)])


@pytest.fixture(scope="module")
def libs(tmp_path_factory, host_linker):
    """One host module with every (function, type) kernel, and one built for the generic x86_64 preset (which
    has no SSE4.1 rounding instruction, so floor/ceil take the integer-free rounding path)."""
    out = {}
    for preset, types in (("host", TYPES), ("x86_64", {"f32": F32, "v4f32": TYPES["v4f32"], "f64": F64,
                                                        "v2f64": TYPES["v2f64"]})):
        mb = ModuleBuilder(preset, "mathtest")
        for fname in FUNCS:
            for tname, ty in types.items():
                if preset == "x86_64" and fname not in ("floor", "ceil", "pow"):
                    continue
                impl, kf = math_kernel(mb, "%s_%s" % (fname, tname), fname, N, ty)
                mb.add_packed(kf, impl)
        module = build_ir(mb)
        path = module.export_library(str(tmp_path_factory.mktemp("math") / ("math_%s.so" % preset)))
        out[preset] = (ctypes.CDLL(path), module)
    return out


def _run(lib, name, inputs, dtype):
    with np.errstate(over="ignore"):  # 1e300 and friends become inf in float32 on purpose
        args = [_pad(np.asarray(a, np.float64)).astype(dtype) for a in inputs]
    out = np.full(N, -12345.0, dtype)
    rc = PackedCaller(lib, name)(args + [out])
    assert rc == 0
    return args, out


def _check(got, ref, rtol, atol, what):
    ref = np.asarray(ref)
    nan = np.isnan(ref)
    assert np.array_equal(np.isnan(got), nan), "%s: NaN mismatch at %s" % (what, np.nonzero(np.isnan(got) != nan))
    inf = np.isinf(ref)
    assert np.array_equal(got[inf], ref[inf]), "%s: inf mismatch" % what
    fin = ~(nan | inf)
    err = np.abs(got[fin].astype(np.float64) - ref[fin])
    bad = err > rtol * np.abs(ref[fin]) + atol
    assert not bad.any(), "%s: %d bad points, e.g. x-index %s got %r want %r (max rel err %.3g)" % (
        what, bad.sum(), np.nonzero(fin)[0][bad][:3], got[fin][bad][:3], ref[fin][bad][:3],
        np.max(err / np.maximum(np.abs(ref[fin]), 1e-300)))


@pytest.mark.parametrize("tname", list(TYPES))
@pytest.mark.parametrize("fname", [f for f in FUNCS if f != "pow"])
def test_unary_against_numpy(libs, fname, tname):
    lib, _ = libs["host"]
    ref_fn, points, rtol32, rtol64 = CASES[fname]
    double = tname.endswith("f64")
    dtype = np.float64 if double else np.float32
    (x,), got = _run(lib, "%s_%s" % (fname, tname), [points], dtype)
    with np.errstate(all="ignore"):
        ref = ref_fn(x.astype(np.float64)).astype(dtype)  # correctly rounded to the tested precision
    tiny = np.finfo(dtype).tiny
    # Results in the subnormal range keep less precision: allow a few subnormal steps there.
    atol = 0.0 if fname in ("floor", "ceil", "abs") else 4 * tiny * np.finfo(dtype).eps
    _check(got, ref, rtol64 if double else rtol32, atol, "%s(%s)" % (fname, tname))
    if fname in ("floor", "ceil", "abs", "tanh", "erf"):
        keep = ~np.isnan(x)
        assert np.array_equal(np.signbit(got[keep]), np.signbit(ref[keep])), "%s(%s): sign of zero" % (fname, tname)


@pytest.mark.parametrize("tname", list(TYPES))
def test_pow_against_numpy(libs, tname):
    lib, _ = libs["host"]
    double = tname.endswith("f64")
    dtype = np.float64 if double else np.float32
    px, py = _pow_points()
    (x, y), got = _run(lib, "pow_%s" % tname, [px, py], dtype)
    with np.errstate(all="ignore"):
        ref = np.power(x.astype(np.float64), y.astype(np.float64)).astype(dtype)
    _check(got, ref, 1e-12 if double else 1e-6, 4 * np.finfo(dtype).tiny * np.finfo(dtype).eps, "pow(%s)" % tname)


@pytest.mark.parametrize("fname", ["floor", "ceil", "pow"])
@pytest.mark.parametrize("tname", ["f32", "v4f32", "f64", "v2f64"])
def test_rounding_without_sse41_matches_numpy(libs, fname, tname):
    """The generic x86_64 preset has no roundps, so floor/ceil (and pow's integer test) use the add-2**23
    rounding path that armv7 uses too."""
    lib, module = libs["x86_64"]
    assert not module.target.native_rounding
    dtype = np.float64 if tname.endswith("f64") else np.float32
    if fname == "pow":
        px, py = _pow_points()
        (x, y), got = _run(lib, "pow_%s" % tname, [px, py], dtype)
        with np.errstate(all="ignore"):
            ref = np.power(x.astype(np.float64), y.astype(np.float64)).astype(dtype)
        _check(got, ref, 1e-12 if dtype == np.float64 else 1e-6, 4 * np.finfo(dtype).tiny * np.finfo(dtype).eps,
               "pow")
        return
    ref_fn, points, _, _ = CASES[fname]
    (x,), got = _run(lib, "%s_%s" % (fname, tname), [points], dtype)
    ref = ref_fn(x)
    _check(got, ref, 0.0, 0.0, fname)
    keep = ~np.isnan(x)
    assert np.array_equal(np.signbit(got[keep]), np.signbit(ref[keep]))
    asm = module.get_source("asm")
    assert "roundps" not in asm and "roundss" not in asm and "floor" not in re.sub(r"floor_\w+", "", asm)


def test_math_is_inlined_and_calls_nothing(libs):
    """After O3 every math function is inlined into its kernel: the only calls left are the module's own
    functions (kernel -> impl -> loop body, the native pool) and LLVM intrinsics."""
    _, module = libs["host"]
    opt = module.get_source("ll-opt")
    callees = set(re.findall(r"call [^@]*@\"?([\w.$]+)\"?\(", opt))
    defined = set(re.findall(r"^define [^@]*@\"?([\w.$]+)\"?\(", opt, re.M))
    # the native pool's syscall stub is a constant in .text
    defined |= set(re.findall(r"^@\"?([\w.$]+)\"? = internal [\w ]*constant", opt, re.M))
    foreign = sorted(c for c in callees - defined if not c.startswith("llvm."))
    assert not foreign, foreign
    assert "tether.math." not in opt  # internal alwaysinline helpers are gone
    for libm in ("expf", "logf", "tanhf", "erff", "powf", "floorf"):
        assert not re.search(r"\b%s\b" % libm, module.get_source("asm"))


def test_get_caches_per_module_and_rejects_unknown_names():
    m1, m2 = ir.Module(), ir.Module()
    v4 = TYPES["v4f32"]
    a = mathlib.get(m1, "exp", v4)
    assert mathlib.get(m1, "exp", v4) is a
    assert mathlib.get(m2, "exp", v4) is not a
    assert a.linkage == "internal" and "alwaysinline" in a.attributes
    assert mathlib.get(m1, "exp", F32) is not a
    with pytest.raises(UnsupportedOpError, match="no math function 'cbrt'"):
        mathlib.get(m1, "cbrt", F32)
    with pytest.raises(UnsupportedOpError, match="float, double or vectors"):
        mathlib.get(m1, "exp", ir.IntType(32))


# ---- the same math on emulated ARM -----------------------------------------------------------------------------
_HARNESS = r"""
#include "kern.h"
#include "freestanding_io.h"
#define N %(n)d
static float x[N], y[N], out[N];
static int64_t shape[1] = {N};
typedef int32_t (*fn_t)(const TetherValue*, const int32_t*, int32_t);
static const fn_t fns[] = {%(fns)s};
static const int nargs[] = {%(nargs)s};
void _start(void) {
  int failures = 0;
  for (unsigned k = 0; k < sizeof(fns) / sizeof(fns[0]); ++k) {
    if (fill((char*)x, sizeof x) || fill((char*)y, sizeof y)) sys3(NR_EXIT, 100, 0, 0);
    DLTensor t[3] = {{x, {kDLCPU, 0}, 1, {kDLFloat, 32, 1}, shape, 0, 0},
                     {y, {kDLCPU, 0}, 1, {kDLFloat, 32, 1}, shape, 0, 0},
                     {out, {kDLCPU, 0}, 1, {kDLFloat, 32, 1}, shape, 0, 0}};
    if (nargs[k] == 2) t[1] = t[2];
    TetherValue args[3]; int32_t codes[3] = {TETHER_DLTENSOR, TETHER_DLTENSOR, TETHER_DLTENSOR};
    for (int i = 0; i < 3; ++i) args[i].v_handle = &t[i];
    if (fns[k](args, codes, nargs[k]) != 0) failures++;
    sys3(NR_WRITE, 1, (long)out, sizeof out);
  }
  sys3(NR_EXIT, failures, 0, 0);
  for (;;) {}
}
"""
_EMULATED = {"rasp4b": ("aarch64-linux-musl", [], "qemu-aarch64"),
             "rasp3b": ("arm-linux-musleabihf", ["-mcpu=cortex_a53"], "qemu-arm"),
             "armv7-a7": ("arm-linux-musleabihf", ["-mcpu=cortex_a7"], "qemu-arm")}


def build_arm_harness(preset, tmp_path, funcs):
    """The freestanding harness of ``funcs`` (f32 and v4f32 kernels each) for an emulated preset:
    (executable, [(function, kernel name)], qemu binary)."""
    import subprocess
    import sys

    zig_cc = [sys.executable, "-m", "ziglang", "cc"]
    triple, cflags, qemu = _EMULATED[preset]
    require_tool(qemu, "apt-get install qemu-user")
    require_module("ziglang")
    kernels = []
    mb = ModuleBuilder(preset, "armmath")
    for fname in funcs:
        for tname in ("f32", "v4f32"):
            name = "%s_%s" % (fname, tname)
            impl, kf = math_kernel(mb, name, fname, N, TYPES[tname])
            mb.add_packed(kf, impl)
            kernels.append((fname, name))
    module = build_ir(mb)
    module.export_object(str(tmp_path / "kern.o"))
    module.export_header(str(tmp_path / "kern.h"))
    (tmp_path / "h.c").write_text(_HARNESS % {
        "n": N, "fns": ", ".join(n for _, n in kernels),
        "nargs": ", ".join("3" if f == "pow" else "2" for f, _ in kernels)})
    exe = tmp_path / "harness"
    subprocess.run(zig_cc + ["-target", triple] + cflags + ["-nostdlib", "-ffreestanding", "-static", "-O1",
                   "-fno-stack-protector", "-I", str(tmp_path), "-I", str(KERNEL_DIR), "-o", str(exe),
                   str(tmp_path / "h.c"), str(tmp_path / "kern.o")], check=True, timeout=300, capture_output=True)
    return exe, kernels, qemu


def run_arm_harness(qemu, exe, blocks, count):
    """Stream the input ``blocks`` through the harness under qemu: (count, N) float32 results."""
    import subprocess

    proc = subprocess.run([qemu, str(exe)], input=b"".join(blocks), capture_output=True, timeout=120)
    assert proc.returncode == 0, "harness: %d kernels returned an error" % proc.returncode
    return np.frombuffer(proc.stdout, np.float32).reshape(count, N)


def normal_points(x, ref):
    """NEON on armv7 flushes subnormals to zero: compare only normal inputs and results."""
    tiny = np.finfo(np.float32).tiny
    return ~((np.abs(x) < tiny) & (x != 0)) & ~((np.abs(ref) < tiny) & (ref != 0))


@pytest.mark.emulated
@pytest.mark.parametrize("preset", list(_EMULATED))
def test_math_on_emulated_arm(preset, tmp_path, host_linker):
    """float32 scalar and NEON math on ARM under qemu-user: the kernel object is linked into a freestanding C
    harness (zig cc, no libc), which streams inputs from stdin and results to stdout.

    NEON on armv7 flushes subnormals to zero, so only normal inputs and results are compared there."""
    exe, kernels, qemu = build_arm_harness(preset, tmp_path, FUNCS)
    blocks, refs = [], []
    px, py = _pow_points()
    for fname, _ in kernels:
        with np.errstate(over="ignore"):
            if fname == "pow":
                x, y = _pad(px).astype(np.float32), _pad(py).astype(np.float32)
            else:
                x, y = _pad(CASES[fname][1]).astype(np.float32), np.zeros(N, np.float32)
        with np.errstate(all="ignore"):
            ref = (np.power(x.astype(np.float64), y.astype(np.float64)) if fname == "pow"
                   else CASES[fname][0](x.astype(np.float64))).astype(np.float32)
        blocks += [x.tobytes(), y.tobytes()]
        refs.append((x, ref))
    got_all = run_arm_harness(qemu, exe, blocks, len(kernels))
    for (fname, name), (x, ref), got in zip(kernels, refs, got_all):
        keep = normal_points(x, ref)
        rtol = {"floor": 0.0, "ceil": 0.0, "abs": 0.0, "sqrt": 1e-7}.get(fname, 1e-6)
        _check(got[keep], ref[keep], rtol, 0.0, "%s on %s" % (name, preset))


@pytest.mark.parametrize("preset", ["x86_64", "rasp4b", "armv7-a7"])
def test_every_function_links_without_libm(preset, tmp_path, host_linker):
    """No math function may become a library call on any target (the .so links with --no-undefined)."""
    from tether_rpc import elf

    mb = ModuleBuilder(preset, "nolibm")
    for fname in FUNCS + ("sin", "cos", "tan", "asin", "acos", "atan"):     # trig: tests/test_mathlib_trig.py
        for tname in ("v4f32", "f64"):
            impl, kf = math_kernel(mb, "%s_%s" % (fname, tname), fname, 16, TYPES[tname])
            mb.add_packed(kf, impl)
    path = build_ir(mb).export_library(str(tmp_path / "nolibm.so"))
    with elf.read_elf(path) as f:
        assert f.undefined_symbols == [] and f.needed == []
