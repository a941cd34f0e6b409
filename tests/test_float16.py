"""float16 kernels: float16 is a storage type, loaded as float32, computed with in float32 and rounded
to nearest even on store, with conversions written out in integer IR (codegen/halfconv.py), so a module needs
no __extendhfsf2/__truncsfhf2/__gnu_h2f_ieee helper from a libc it does not link (the linker refuses undefined
symbols). Checked bit for bit against numpy: every float16 bit pattern widened, float32 values of every
magnitude (subnormal, overflowing, NaN) narrowed, float64 values a hair off a float16 tie narrowed without double
rounding, scalar and vectorized, on the host and on emulated aarch64
(rasp4b) and armv7 (armv7-a7, whose NEON flushes float denormals: the conversions must not depend on them)."""
import numpy as np
import pytest

import tether
from tether import runtime, te

N = 1 << 16


def _all_halves() -> np.ndarray:
    return np.arange(N, dtype=np.uint32).astype(np.uint16).view(np.float16)


def _floats() -> np.ndarray:
    """float32 values around every float16 range: random magnitudes 1e-9..1e6, every float16 value and its
    neighbours halfway (ties), and random bit patterns (NaNs, infinities, float32 subnormals)."""
    rng = np.random.default_rng(0)
    halves = _all_halves().astype(np.float32)
    finite = halves[np.isfinite(halves)]
    ties = (finite[:-1] + np.diff(finite) / 2).astype(np.float32)   # exact halfway points round to even
    parts = [(rng.standard_normal(N // 4) * 10.0 ** rng.integers(-9, 6, N // 4)).astype(np.float32),
             halves, ties[np.isfinite(ties)][::3],
             rng.integers(0, 2 ** 32, N // 4, dtype=np.uint64).astype(np.uint32).view(np.float32),
             np.array([65504, 65519.99, 65520, -65520, 2.0 ** -24, 2.0 ** -25, 2.0 ** -25 * 1.0001, 3 * 2.0 ** -26,
                       np.inf, -np.inf, np.nan, 0.0, -0.0, 1e-45], np.float32)]
    x = np.concatenate(parts).astype(np.float32)
    return x[: (len(x) // 16) * 16]


def _near_ties(half=np.float16) -> np.ndarray:
    """float64 values a hair off the midpoint of two neighbouring float16 (or bfloat16) values: rounding them to
    float32 first would land on the tie and round to even, the wrong way half the time."""
    with np.errstate(invalid="ignore"):    # the NaN patterns
        h = _all_halves().view(np.uint16).view(half).astype(np.float64)
    h = np.unique(h)
    h = h[np.isfinite(h) & (h > 0)]
    mid = (h[:-1] + h[1:]) / 2
    eps = np.abs(mid) * 2.0 ** -40
    x = np.concatenate([mid + eps, mid - eps, -(mid + eps)])
    return x[: (len(x) // 16) * 16]


def _cast_kernel(src: str, dst: str, n: int, vectorize: bool):
    a = te.placeholder((n,), name="A", dtype=src)
    b = te.compute((n,), lambda i: a[i].astype(dst), name="B")
    s = te.create_schedule(b.op)
    if vectorize:
        _, xi = s[b].split(b.op.axis[0], factor=8)
        s[b].vectorize(xi)
    return s, [a, b]


def _bf16_nearest(x: np.ndarray) -> np.ndarray:
    """float64 -> the nearest bfloat16 (ties to even), as float32. Not ml_dtypes: it goes through float32 and so
    rounds twice. Of the two bfloat16 neighbours of x, the nearer one wins (the float64 distances are exact:
    Sterbenz)."""
    import ml_dtypes

    ax = np.abs(x)
    with np.errstate(over="ignore", invalid="ignore"):
        lo_bits = (ax.astype(np.float32).view(np.uint32) >> 16).astype(np.int64)
    lo = (lo_bits << 16).astype(np.uint32).view(np.float32).astype(np.float64)
    lo_bits = np.where(lo > ax, lo_bits - 1, lo_bits)      # float32 rounding may have crossed a bfloat16 value
    lo = (lo_bits << 16).astype(np.uint32).view(np.float32).astype(np.float64)
    hi = ((lo_bits + 1) << 16).astype(np.uint32).view(np.float32).astype(np.float64)
    d_lo, d_hi = ax - lo, hi - ax
    up = (d_hi < d_lo) | ((d_hi == d_lo) & (lo_bits % 2 == 1))
    bits = np.where(up, lo_bits + 1, lo_bits)
    out = np.copysign((bits << 16).astype(np.uint32).view(np.float32), x).astype(np.float32)
    special = ~np.isfinite(x) | (ax >= 3.3961775292304797e38)     # NaN, infinities, overflow: the direct cast
    with np.errstate(over="ignore", invalid="ignore"):
        out[special] = x[special].astype(ml_dtypes.bfloat16).astype(np.float32)
    return out


def _via_kernel(src: str, half: str, n: int):
    """B = float32(half(A)): the rounding to a half type that a cast in registers does."""
    a = te.placeholder((n,), name="A", dtype=src)
    b = te.compute((n,), lambda i: a[i].astype(half).astype("float32"), name="B")
    s = te.create_schedule(b.op)
    _, xi = s[b].split(b.op.axis[0], factor=8)
    s[b].vectorize(xi)
    return s, [a, b]


def _arith_kernel(n: int):
    """C = A * B + A (float16 in and out, float32 inside), and R = sum(A * B) accumulated in float32."""
    a = te.placeholder((n // 16, 16), name="A", dtype="float16")
    b = te.placeholder((n // 16, 16), name="B", dtype="float16")
    c = te.compute(a.shape, lambda i, j: a[i, j] * b[i, j] + a[i, j], name="C")
    k = te.reduce_axis((0, 16), name="k")
    r = te.compute((n // 16,), lambda i: te.sum(a[i, k].astype("float32") * b[i, k].astype("float32"), axis=k),
                   name="R")
    s = te.create_schedule([c.op, r.op])
    s[c].vectorize(c.op.axis[1])
    return s, [a, b, c, r]


def _same_bits(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    uint = {2: np.uint16, 4: np.uint32}[want.dtype.itemsize]
    return (got.view(uint) == want.view(uint)) | (np.isnan(got) & np.isnan(want))


def _cases():
    """(name, schedule builder, inputs, expected outputs) for every check."""
    halves, floats = _all_halves(), _floats()
    rng = np.random.default_rng(1)
    x = (rng.standard_normal(4096) * 4).astype(np.float16)
    y = (rng.standard_normal(4096) * 4).astype(np.float16)
    xf, yf = x.astype(np.float32), y.astype(np.float32)
    cases = []
    for vec in (False, True):
        tag = "vec" if vec else "scalar"
        cases.append(("h2f_" + tag, _cast_kernel("float16", "float32", N, vec), [halves],
                      [halves.astype(np.float32)]))
        with np.errstate(over="ignore", invalid="ignore"):
            cases.append(("f2h_" + tag, _cast_kernel("float32", "float16", len(floats), vec), [floats],
                          [floats.astype(np.float16)]))
            doubles = np.concatenate([floats.astype(np.float64), _near_ties()])
            cases.append(("f64_to_h_" + tag, _cast_kernel("float64", "float16", len(doubles), vec), [doubles],
                          [doubles.astype(np.float16)]))
    # bfloat16 inside a kernel (bfloat16 arguments themselves: tests/test_bfloat16.py): float32 and float64 rounded
    # to bfloat16 and read back, against ml_dtypes' bfloat16 (round to nearest even)
    import ml_dtypes
    with np.errstate(invalid="ignore"):
        bf_doubles = np.concatenate([floats.astype(np.float64), _near_ties(ml_dtypes.bfloat16)])
    with np.errstate(over="ignore", invalid="ignore"):
        cases.append(("float32_via_bf16", _via_kernel("float32", "bfloat16", len(floats)), [floats],
                      [floats.astype(ml_dtypes.bfloat16).astype(np.float32)]))
        cases.append(("float64_via_bf16", _via_kernel("float64", "bfloat16", len(bf_doubles)), [bf_doubles],
                      [_bf16_nearest(bf_doubles)]))
    ints = np.arange(-70000, 70000, 7, dtype=np.int32)[: 20000]
    with np.errstate(over="ignore"):
        cases.append(("i32_to_h", _cast_kernel("int32", "float16", len(ints), True), [ints],
                      [ints.astype(np.float16)]))
    cases.append(("h_to_i32", _cast_kernel("float16", "int32", 4096, True), [x], [x.astype(np.int32)]))
    cases.append(("arith", _arith_kernel(4096), [x.reshape(-1, 16), y.reshape(-1, 16)],
                  [(xf * yf + xf).astype(np.float16).reshape(-1, 16),
                   (xf * yf).reshape(-1, 16).sum(axis=1, dtype=np.float32)]))
    return cases


def _check(name, outs, want):
    for got, ref in zip(outs, want):
        assert got.dtype == ref.dtype and got.shape == ref.shape
        if name.startswith("arith") and ref.dtype == np.float32:   # float32 sums: order and FMA may differ
            np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5, err_msg=name)
            continue
        bad = ~_same_bits(got, ref)
        assert not bad.any(), "%s: %d mismatches, e.g. %s (numpy %s)" % (name, bad.sum(), got[bad][:4], ref[bad][:4])


def _build(name, sched, target, tmp_path):
    s, args = sched
    lib = tether.build(s, args, target=target, name=name)
    path = tmp_path / ("%s_%s.so" % (name, target))
    lib.export_library(str(path))   # links with no undefined symbol, or raises
    return lib, path


def test_float16_kernels_match_numpy_on_host(tmp_path):
    for name, sched, inputs, want in _cases():
        lib, path = _build(name, sched, "host", tmp_path)
        assert "half" not in lib.get_source("ll")   # no LLVM half type: nothing that may become a libcall
        outs = [np.zeros(r.shape, r.dtype) for r in want]
        runtime.load_module(str(path))[name](*inputs, *outs)
        _check(name, outs, want)


@pytest.mark.emulated
# rasp5-fp16: float16 computed as LLVM half (fcvt, fmla .8h) must round as the integer conversions do
@pytest.mark.parametrize("preset", ["rasp4b", "armv7-a7", "rasp5-fp16"])
def test_float16_kernels_match_numpy_on_emulated_device(emulated_devices, preset, tmp_path):
    from tether import rpc
    device = emulated_devices.for_preset(preset)
    with rpc.connect(*device.address, timeout=120.0) as remote:
        for name, sched, inputs, want in _cases():
            _, path = _build(name, sched, preset, tmp_path)
            remote.upload(str(path))
            f = remote.load_module(path.name)[name]
            outs = [remote.empty(r.shape, str(r.dtype)) for r in want]
            f(*[remote.array(a) for a in inputs], *outs)
            _check(name + "@" + preset, [o.numpy() for o in outs], want)
