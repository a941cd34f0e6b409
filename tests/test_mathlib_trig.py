"""mathlib's sin, cos, tan, asin, acos, atan against numpy: scalar and vector float/double, on the host (a real
.so) and float32 on ARM under qemu; wide arguments included, since sin/cos/tan reduce any finite x exactly."""
from __future__ import annotations

import numpy as np
import pytest
from fixtures.backend import math_kernel
from test_mathlib import (_EMULATED, N, TYPES, _check, _pad, _run, build_arm_harness, normal_points,
                          run_arm_harness)

from tether.driver import build_ir
from tether.codegen.module import ModuleBuilder

FUNCS = ("sin", "cos", "tan", "asin", "acos", "atan")
INF, NAN = float("inf"), float("nan")
rng = np.random.default_rng(4321)

_WIDE = np.concatenate([np.linspace(-10, 10, 400), rng.uniform(-1e4, 1e4, 200), np.geomspace(1e-30, 1e30, 300),
                        -np.geomspace(1e-30, 1e38, 200), [0.0, -0.0, INF, -INF, NAN, 3.4e38, -3.4e38, 1e-40],
                        np.pi / 2 * np.arange(-40, 41), [np.pi, 2 * np.pi, 1e22, 8.0e7, 102940.0, 1.6e6]])
_UNIT = np.concatenate([np.linspace(-1, 1, 800), np.geomspace(1e-30, 1, 200), -np.geomspace(1e-30, 1, 100),
                        [0.5, -0.5, 0.49999997, 0.50000006, 1.0, -1.0, 1.0000001, -1.0000001, 2.0, INF, NAN, 0.0,
                         -0.0, 1 - 2.0 ** -24, -1 + 2.0 ** -24]])
_ALL = np.concatenate([np.linspace(-50, 50, 500), np.geomspace(1e-30, 1e38, 300), -np.geomspace(1e-30, 1e30, 200),
                       [0.0, -0.0, INF, -INF, NAN, 2 - 3 ** 0.5, 0.2679492, 0.26794922, 1.0, -1.0]])
# name -> (numpy function, points)
CASES = {"sin": (np.sin, _WIDE), "cos": (np.cos, _WIDE), "tan": (np.tan, _WIDE), "asin": (np.arcsin, _UNIT),
         "acos": (np.arccos, _UNIT), "atan": (np.arctan, _ALL)}
DOUBLE_WIDE = np.concatenate([_WIDE, [1e300, -1e300, 1.7e308, 2.0 ** 1023 * 1.5, 1e100, 123456789.123456789,
                                      np.pi * 1e15, 5e-324]])


@pytest.fixture(scope="module")
def trig_lib(tmp_path_factory, host_linker):
    import ctypes

    mb = ModuleBuilder("host", "trigtest")
    for fname in FUNCS:
        for tname, ty in TYPES.items():
            impl, kf = math_kernel(mb, "%s_%s" % (fname, tname), fname, N, ty)
            mb.add_packed(kf, impl)
    module = build_ir(mb)
    path = module.export_library(str(tmp_path_factory.mktemp("trig") / "trig.so"))
    return ctypes.CDLL(path), module


@pytest.mark.parametrize("tname", list(TYPES))
@pytest.mark.parametrize("fname", FUNCS)
def test_trig_against_numpy(trig_lib, fname, tname):
    lib, _ = trig_lib
    double = tname.endswith("f64")
    dtype = np.float64 if double else np.float32
    ref_fn, points = CASES[fname]
    if double and fname in ("sin", "cos", "tan"):
        points = DOUBLE_WIDE
    (x,), got = _run(lib, "%s_%s" % (fname, tname), [points], dtype)
    with np.errstate(all="ignore"):
        ref = ref_fn(x.astype(np.float64)).astype(dtype)
    # float32 is computed in double and rounded once; double sin/cos/tan lose a few ulps of absolute accuracy in
    # the reduction of huge arguments (~1e-16 of a quarter turn), which shows only where the result is near 0
    rtol = 2e-15 if double else 1e-7
    atol = 1e-15 if double and fname in ("sin", "cos", "tan") else 4 * np.finfo(dtype).tiny * np.finfo(dtype).eps
    _check(got, ref, rtol, atol, "%s(%s)" % (fname, tname))
    if fname in ("sin", "tan", "asin", "atan"):    # odd functions keep the sign of zero
        zero = x == 0
        assert np.array_equal(np.signbit(got[zero]), np.signbit(x[zero])), "%s(%s): sign of zero" % (fname, tname)


def test_trig_is_inlined_and_calls_no_libm(trig_lib):
    _, module = trig_lib
    asm = module.get_source("asm")
    for libm in ("sinf", "cosf", "tanf", "asinf", "acosf", "atanf", "sin", "cos", "fmod"):
        assert not any(line.split()[-1:] == [libm] for line in asm.splitlines() if "call" in line), libm


@pytest.mark.emulated
@pytest.mark.parametrize("preset", list(_EMULATED))
def test_trig_on_emulated_arm(preset, tmp_path, host_linker):
    """float32 scalar and NEON trig on ARM under qemu-user (the harness of test_mathlib)."""
    exe, kernels, qemu = build_arm_harness(preset, tmp_path, FUNCS)
    blocks, refs = [], []
    for fname, _ in kernels:
        with np.errstate(over="ignore"):
            x = _pad(CASES[fname][1]).astype(np.float32)
        with np.errstate(all="ignore"):
            ref = CASES[fname][0](x.astype(np.float64)).astype(np.float32)
        blocks += [x.tobytes(), np.zeros(N, np.float32).tobytes()]
        refs.append((x, ref))
    got_all = run_arm_harness(qemu, exe, blocks, len(kernels))
    for (fname, name), (x, ref), got in zip(kernels, refs, got_all):
        keep = normal_points(x, ref)
        _check(got[keep], ref[keep], 1e-7, 0.0, "%s on %s" % (name, preset))
