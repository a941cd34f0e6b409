"""te.round_even (round half to even, the int8 requantization's rounding) against numpy's rint, bit for
bit: the host build (SSE4.1's roundps, llvm.roundeven) and a baseline x86-64 build without SSE4.1 (the
add-and-remove trick armv7 uses too), scalar and vectorized, with a fast-math build (whose flags must not fold the
trick away). The int8 tests run it on emulated ARM (tests/test_int8_layout.py, tests/test_int8_remote.py)."""
from __future__ import annotations

import numpy as np
import pytest

import tether
from tether import runtime, te

N = 4096


def _points() -> np.ndarray:
    rng = np.random.default_rng(9)
    ties = np.arange(-300, 300, dtype=np.float32) + np.float32(0.5)
    near = np.array([0.49999997, -0.49999997, 0.50000006, 1.4999999, 2.5000002, 8388607.5, -8388607.5, 8388608.0,
                     8388609.0, 16777215.0, 4194303.5, -4194303.5, 1e-30, -1e-30, 0.0, -0.0, 1e30, -1e30,
                     np.inf, -np.inf, np.nan], np.float32)
    pts = np.concatenate([ties, near, rng.uniform(-1e4, 1e4, 1500).astype(np.float32),
                          rng.uniform(-3, 3, 1500).astype(np.float32)])
    return np.resize(pts, N).astype(np.float32)


@pytest.mark.parametrize("target", ["host", "x86_64"])
@pytest.mark.parametrize("vector", [True, False])
@pytest.mark.parametrize("fast_math", [False, True])
def test_round_even_matches_rint(tmp_path, target, vector, fast_math):
    x = te.placeholder((N,), "float32", name="x")
    y = te.compute((N,), lambda i: te.round_even(x[i]), name="y")
    s = te.create_schedule([y.op])
    if vector:
        _, inner = s[y].split(y.op.axis[0], factor=8)
        s[y].vectorize(inner)
    lib = tether.build(s, [x, y], target=target, name="rnd", fast_math=fast_math)
    path = str(tmp_path / "rnd.so")
    lib.export_library(path)
    pts = _points()
    out = np.zeros(N, np.float32)
    runtime.load_module(path)["rnd"](pts, out)
    want = np.rint(pts)
    finite = np.isfinite(want)
    np.testing.assert_array_equal(out[finite].view(np.int32), want[finite].view(np.int32))   # -0.0 too
    np.testing.assert_array_equal(np.isnan(out), np.isnan(want))
    np.testing.assert_array_equal(out[np.isinf(want)], want[np.isinf(want)])
    if target == "host":
        assert "roundps" in lib.get_source("asm") or "rndscaleps" in lib.get_source("asm")


# ---- the same at the codegen level (codegen/mathlib's round_even as a math kernel): float64 and 16-lane vectors
# too, and which targets say they round natively
_TIES = np.concatenate([np.arange(-600, 600) * 0.5, np.random.default_rng(5).uniform(-3e4, 3e4, 600),
                        [0.0, -0.0, -0.4, 0.49999997, -0.49999997, 8388607.5, -8388607.5, 8388608.0, 8388609.0,
                         16777215.0, 1e10, -1e10, np.inf, -np.inf, np.nan]])


@pytest.mark.parametrize("preset,tname", [("host", t) for t in ("f32", "v16f32", "v4f32", "f64")]
                         + [("x86_64", t) for t in ("f32", "v4f32", "f64")])   # (no 512-bit vectors there)
def test_round_even_against_numpy(tmp_path, host_linker, preset, tname):
    from fixtures.backend import PackedCaller, math_kernel
    from llvmlite import ir

    from tether.codegen.module import ModuleBuilder
    from tether.driver import build_ir

    f32, f64 = ir.FloatType(), ir.DoubleType()
    ty = {"f32": f32, "v16f32": ir.VectorType(f32, 16), "v4f32": ir.VectorType(f32, 4), "f64": f64}[tname]
    n = 2048
    mb = ModuleBuilder(preset, "roundtest")
    impl, kf = math_kernel(mb, "round_even_k", "round_even", n, ty)
    mb.add_packed(kf, impl)
    module = build_ir(mb)
    lib = __import__("ctypes").CDLL(module.export_library(str(tmp_path / "round.so")))
    dtype = np.float64 if tname == "f64" else np.float32
    x = np.concatenate([_TIES, np.ones(n - _TIES.size)]).astype(dtype)
    out = np.full(n, -12345.0, dtype)
    assert PackedCaller(lib, "round_even_k")([x, out]) == 0
    want = np.rint(x)
    np.testing.assert_array_equal(out, want)
    keep = ~np.isnan(x)
    np.testing.assert_array_equal(np.signbit(out[keep]), np.signbit(want[keep]))
    assert module.target.native_rounding == (preset == "host")
