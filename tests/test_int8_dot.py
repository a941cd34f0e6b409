"""The int8 dot product ``te.dot4(a, b, kind)``: four byte products of two int32s summed into an int32.

Every kind, scalar and vectorized (lane counts that are and are not the instructions' widths, loops with tails),
elementwise, accumulated (``acc + dot4``, either order) and in a te.sum reduction, on random full-range bytes plus
the extremes (-128, 127, 0, 255 in every byte), checked against numpy's int64 arithmetic.
"""
from __future__ import annotations

import re

import numpy as np
import pytest

import tether
from fixtures.host_cpu import host_features, lacking, load_if_supported
from tether import runtime, te, tir
from tether.target import int8_dot_native

KINDS = ("u8s8", "s8s8", "u8u8")
_EXTREMES = np.array([0, -1, 0x7F7F7F7F, -0x7F7F7F80, 0x7F80FF00, 0x00FF807F, 0x01020304, -0x01020305],
                     dtype=np.int64).astype(np.int32)


def _words(rng: np.random.Generator, shape) -> np.ndarray:
    """Random int32 words (every byte value equally likely), the extreme patterns at the front."""
    w = rng.integers(-2**31, 2**31, size=shape, dtype=np.int64).astype(np.int32)
    flat = w.reshape(-1)
    k = min(flat.size, _EXTREMES.size)
    flat[:k] = _EXTREMES[:k]
    return w


def dot4_reference(a: np.ndarray, b: np.ndarray, kind: str) -> np.ndarray:
    """numpy's dot4: the bytes of each int32 (little-endian) read as ``kind`` says, products summed in int64."""
    ta = np.uint8 if kind[0] == "u" else np.int8
    tb = np.uint8 if kind[2] == "u" else np.int8
    ab = np.ascontiguousarray(a).view(ta).reshape(a.shape + (4,)).astype(np.int64)
    bb = np.ascontiguousarray(b).view(tb).reshape(b.shape + (4,)).astype(np.int64)
    return (ab * bb).sum(axis=-1)


def test_reference_reads_bytes_little_endian():
    a = np.array([0x04030201], dtype=np.int32)
    b = np.array([-1], dtype=np.int32)          # four bytes 0xFF: -1 signed, 255 unsigned
    assert dot4_reference(a, b, "u8s8")[0] == -(1 + 2 + 3 + 4)
    assert dot4_reference(a, b, "u8u8")[0] == 255 * 10
    assert dot4_reference(b, b, "s8s8")[0] == 4


def test_dot4_is_an_int32_expression_and_checks_its_arguments():
    x = te.var("x")
    e = te.dot4(x, x + 1, kind="s8s8")
    assert e.dtype == "int32" and tir.dot4_kind(e) == "s8s8" and tir.dot4 is te.dot4
    assert tir.dot4_kind(x) is None
    with pytest.raises(ValueError, match="kind"):
        te.dot4(x, x, kind="s8u8")
    with pytest.raises(TypeError, match="int32"):
        te.dot4(x.astype("int64"), x)


def test_byte_of_is_an_int32_expression_and_checks_its_arguments():
    x = te.var("x")
    e = te.byte_of(x, 2, signed=True)
    assert e.dtype == "int32" and tir.byte_of_parts(e) is True and tir.byte_of_parts(te.byte_of(x, 0, False)) is False
    assert tir.byte_of_parts(x) is None and tir.byte_of_parts(te.dot4(x, x)) is None
    with pytest.raises(ValueError, match="0, 1, 2 or 3"):
        te.byte_of(x, 4, signed=False)
    with pytest.raises(TypeError, match="int32"):
        te.byte_of(x.astype("int64"), 0, signed=False)


# ---- kernels ----------------------------------------------------------------------------------------------------
# Each case: (name, schedule args builder, inputs builder, numpy reference). ``factor`` 1 is scalar code.

def _elementwise(kind: str, n: int, factor: int, form: str):
    """C[i] = dot4(A[i], B[i]) ("plain"), D[i] + dot4 ("acc_left") or dot4 + D[i] ("acc_right")."""
    a = te.placeholder((n,), "int32", name="A")
    b = te.placeholder((n,), "int32", name="B")
    d = te.placeholder((n,), "int32", name="D")
    if form == "plain":
        c = te.compute((n,), lambda i: te.dot4(a[i], b[i], kind), name="C")
    elif form == "acc_left":
        c = te.compute((n,), lambda i: d[i] + te.dot4(a[i], b[i], kind), name="C")
    else:
        c = te.compute((n,), lambda i: te.dot4(a[i], b[i], kind) + d[i], name="C")
    s = te.create_schedule(c.op)
    if factor > 1:
        _, xi = s[c].split(c.op.axis[0], factor=factor)
        s[c].vectorize(xi)
    return s, [a, b, d, c]


def _elementwise_case(kind, n, factor, form, rng):
    s, args = _elementwise(kind, n, factor, form)
    a, b = _words(rng, (n,)), _words(rng, (n,))
    d = rng.integers(-2**24, 2**24, size=n, dtype=np.int64).astype(np.int32)
    want = dot4_reference(a, b, kind) + (0 if form == "plain" else d.astype(np.int64))
    return s, args, [a, b, d], want


def _reduction(kind: str, n: int, k: int, factor: int, parallel: bool = False):
    """C[j] = sum_r dot4(A[r], W[r, j]): the reduction's accumulator is a vector over j (one lane per output)."""
    a = te.placeholder((k,), "int32", name="A")
    w = te.placeholder((k, n), "int32", name="W")
    r = te.reduce_axis((0, k), name="r")
    c = te.compute((n,), lambda j: te.sum(te.dot4(a[r], w[r, j], kind), axis=r), name="C")
    s = te.create_schedule(c.op)
    if factor > 1:
        cl = s.cache_write(c, "local")
        jo, ji = s[c].split(c.op.axis[0], factor=factor)
        s[c].vectorize(ji)
        s[cl].compute_at(s[c], jo)
        s[cl].reorder(s[cl].op.reduce_axis[0], s[cl].op.axis[0])
        s[cl].vectorize(s[cl].op.axis[0])
        if parallel:    # the vectorized reduction inside parallel tasks (own functions in the module)
            s[c].parallel(jo)
    return s, [a, w, c]


def _reduction_case(kind, n, k, factor, rng, parallel=False):
    s, args = _reduction(kind, n, k, factor, parallel)
    a, w = _words(rng, (k,)), _words(rng, (k, n))
    want = dot4_reference(np.broadcast_to(a[:, None], (k, n)), w, kind).sum(axis=0)
    return s, args, [a, w], want


def _byte_case(signed: bool, n: int, factor: int, index, rng):
    """C[i] = byte_of(A[i], index): a constant byte, or one that varies by element (B[i] & 3)."""
    a = te.placeholder((n,), "int32", name="A")
    b = te.placeholder((n,), "int32", name="B")
    c = te.compute((n,), lambda i: te.byte_of(a[i], index if index is not None else te.bitwise("bitand", b[i], 3),
                                              signed), name="C")
    s = te.create_schedule(c.op)
    if factor > 1:
        _, xi = s[c].split(c.op.axis[0], factor=factor)
        s[c].vectorize(xi)
    av, bv = _words(rng, (n,)), rng.integers(0, 2**31, size=n, dtype=np.int64).astype(np.int32)
    t = (bv & 3) if index is None else np.full(n, index)
    want = np.ascontiguousarray(av).view(np.int8 if signed else np.uint8).reshape(n, 4)[np.arange(n), t]
    return s, [a, b, c], [av, bv], want.astype(np.int64)


def _widened_case(signed: bool, n: int, k: int, factor: int, rng):
    """C[j] = sum_{r, t} byte_of(A[r], t) * W[4r + t, j] with W int16: the widened int8 conv's product (ops/qconv.py),
    the byte index an unrolled reduction axis, the accumulator a vector over j."""
    a = te.placeholder((k,), "int32", name="A")
    w = te.placeholder((4 * k, n), "int16", name="W")
    r = te.reduce_axis((0, k), name="r")
    t = te.reduce_axis((0, 4), name="t")
    c = te.compute((n,), lambda j: te.sum(te.byte_of(a[r], t, signed) * w[4 * r + t, j].astype("int32"),
                                         axis=[r, t]), name="C")
    s = te.create_schedule(c.op)
    cl = s.cache_write(c, "local")
    jo, ji = s[c].split(c.op.axis[0], factor=factor)
    s[c].vectorize(ji)
    s[cl].compute_at(s[c], jo)
    s[cl].reorder(*s[cl].op.reduce_axis, s[cl].op.axis[0])
    s[cl].unroll(s[cl].op.reduce_axis[1])
    s[cl].vectorize(s[cl].op.axis[0])
    av = _words(rng, (k,))
    wv = rng.integers(-128, 128, size=(4 * k, n)).astype(np.int16)
    wv[0] = -128
    x = np.ascontiguousarray(av).view(np.int8 if signed else np.uint8).astype(np.int64).reshape(-1)
    return s, [a, w, c], [av, wv], x @ wv.astype(np.int64)


def pair_dot_reference(a_lo, a_hi, b_lo, b_hi) -> np.ndarray:
    """numpy: te.pair_dot on int16 arrays, the int16 sums wrapping as the primitive defines."""
    def b8(v):
        return np.ascontiguousarray(v, np.int16).view(np.int8).reshape(v.shape + (2,)).astype(np.int64)
    sums = b8(a_lo) * b8(b_lo) + b8(a_hi) * b8(b_hi)
    return (((sums + 2**15) % 2**16) - 2**15).sum(axis=-1)


def _pair_case(n: int, factor: int, rng):
    """C[i] = D[i] + pair_dot(A[i], B[i], E[i], F[i]) over every int16 (sums of two products that leave int16
    included: they wrap)."""
    ops = [te.placeholder((n,), "int16", name=x) for x in "ABEF"]
    d = te.placeholder((n,), "int32", name="D")
    c = te.compute((n,), lambda i: d[i] + te.pair_dot(*[x[i] for x in ops]), name="C")
    s = te.create_schedule(c.op)
    if factor > 1:
        _, xi = s[c].split(c.op.axis[0], factor=factor)
        s[c].vectorize(xi)
    vals = [rng.integers(-2**15, 2**15, size=n).astype(np.int16) for _ in ops]
    vals[0][:4] = vals[2][:4] = vals[1][:4] = vals[3][:4] = -0x7F80     # bytes -128 and -128: both sums wrap
    dv = rng.integers(-2**24, 2**24, size=n, dtype=np.int64).astype(np.int32)
    return s, ops + [d, c], vals + [dv], dv.astype(np.int64) + pair_dot_reference(*vals)


def _pair_reduction_case(n: int, k: int, rng):
    """C[j, l] = sum_r pair_dot(A[r, l], A[r, 4 + l], W[j, r, l], W[j, r, 4 + l]), the lanes l a vector of 4 (the
    int8 pairs form's product, ops/qconv.py), W's bytes within [-127, 127]."""
    a = te.placeholder((k, 8), "int16", name="A")
    w = te.placeholder((n, k, 8), "int16", name="W")
    r = te.reduce_axis((0, k), name="r")
    c = te.compute((n, 4), lambda j, l: te.sum(te.pair_dot(a[r, l], a[r, 4 + l], w[j, r, l], w[j, r, 4 + l]), axis=r),
                   name="C")
    s = te.create_schedule(c.op)
    cl = s.cache_write(c, "local")
    s[c].vectorize(c.op.axis[1])
    s[cl].compute_at(s[c], c.op.axis[0])
    s[cl].reorder(s[cl].op.reduce_axis[0], s[cl].op.axis[1])
    s[cl].vectorize(s[cl].op.axis[1])
    av = rng.integers(-2**15, 2**15, size=(k, 8)).astype(np.int16)
    wv = rng.integers(-127, 128, size=(n, k, 16)).astype(np.int8).view(np.int16)
    want = pair_dot_reference(av[None, :, :4], av[None, :, 4:], wv[:, :, :4], wv[:, :, 4:]).sum(axis=1)
    return s, [a, w, c], [av, wv], want


def _quad_case(n: int, factor: int, rng):
    """C[j] = quad_sum(A[4j], A[4j + 1], A[4j + 2], A[4j + 3]) + D[j]: the pairs form's write-back, whose four
    lanes per output Arm adds with addp."""
    a = te.placeholder((4 * n,), "int32", name="A")
    d = te.placeholder((n,), "int32", name="D")
    c = te.compute((n,), lambda j: te.quad_sum(*(a[4 * j + t] for t in range(4))) + d[j], name="C")
    s = te.create_schedule(c.op)
    if factor > 1:
        _, ji = s[c].split(c.op.axis[0], factor=factor)
        s[c].vectorize(ji)
    av = rng.integers(-2**28, 2**28, size=4 * n, dtype=np.int64).astype(np.int32)
    dv = rng.integers(-2**28, 2**28, size=n, dtype=np.int64).astype(np.int32)
    return s, [a, d, c], [av, dv], av.astype(np.int64).reshape(n, 4).sum(axis=1) + dv


def cases(seed: int = 0):
    """(name, schedule, args, inputs, numpy result): every kind, scalar and several lane counts, with tails."""
    rng = np.random.default_rng(seed)
    out = []
    for kind in KINDS:
        for factor in (1, 4, 5, 8, 16, 32):
            for form in ("plain", "acc_left", "acc_right"):
                s, args, inputs, want = _elementwise_case(kind, 203, factor, form, rng)
                out.append(("ew_%s_%s_v%d" % (kind, form, factor), s, args, inputs, want))
        for factor in (1, 4, 8, 16, 12):
            s, args, inputs, want = _reduction_case(kind, 48, 37, factor, rng)
            out.append(("red_%s_v%d" % (kind, factor), s, args, inputs, want))
        s, args, inputs, want = _reduction_case(kind, 64, 37, 16, rng, parallel=True)
        out.append(("red_%s_parallel" % kind, s, args, inputs, want))
    for signed in (False, True):
        sign = "s" if signed else "u"
        for factor in (1, 4, 7, 16):
            for index in (0, 3, None):
                s, args, inputs, want = _byte_case(signed, 203, factor, index, rng)
                out.append(("byte_%s_%s_v%d" % (sign, "var" if index is None else index, factor), s, args, inputs,
                            want))
        for factor in (4, 16):
            s, args, inputs, want = _widened_case(signed, 48, 37, factor, rng)
            out.append(("widened_%s_v%d" % (sign, factor), s, args, inputs, want))
    for factor in (1, 4, 5, 8, 16):
        s, args, inputs, want = _pair_case(203, factor, rng)
        out.append(("pair_v%d" % factor, s, args, inputs, want))
    s, args, inputs, want = _pair_reduction_case(12, 37, rng)
    out.append(("pair_reduction", s, args, inputs, want))
    for factor in (1, 4, 8, 6):     # 6: not a multiple of 4, and a tail (50 outputs)
        s, args, inputs, want = _quad_case(50, factor, rng)
        out.append(("quad_v%d" % factor, s, args, inputs, want))
    return out


def _check(name: str, got: np.ndarray, want: np.ndarray) -> None:
    assert want.min() >= -2**31 and want.max() < 2**31, name   # the test's data stays within int32
    bad = got.astype(np.int64) != want
    assert not bad.any(), "%s: %d of %d wrong, e.g. %s instead of %s" % (
        name, bad.sum(), bad.size, got[bad][:4], want[bad][:4])


def _build_all(target: str, tmp_path, seed: int = 0):
    """One module holding every case's kernel (one compile and link per target)."""
    built = cases(seed)
    lib = tether.build([tether.lower(s, args, name=name) for name, s, args, _, _ in built], target=target,
                       name="int8dot", jobs=1)
    path = tmp_path / ("int8dot_%s.so" % target.replace(" ", "_"))
    lib.export_library(str(path))
    return built, lib, path


def test_dot4_matches_numpy_on_host(tmp_path):
    built, _, path = _build_all("host", tmp_path)
    mod = runtime.load_module(str(path))
    for name, _, _, inputs, want in built:
        out = np.zeros(want.shape, np.int32)
        mod[name](*inputs, out)
        _check(name, out, want)


# x86 builds without VNNI: baseline SSE2 (every x86-64 runs it) and an AVX-512 CPU with VNNI switched off (run
# where this CPU has AVX-512, refused elsewhere)
NO_VNNI = ("x86_64", "x86_64-linux-gnu -mcpu=rocketlake -mattr=-avx512vnni,-avxvnni")
AVX_VNNI_ONLY = "x86_64-linux-gnu -mcpu=x86-64-v3 -mattr=+avxvnni"   # Alder Lake-like: no AVX-512


def _run_all_where_supported(built, path, label: str) -> None:
    """Every case of the module at ``path`` against numpy where this CPU runs it; its refusal where it does not."""
    mod = load_if_supported(path)
    if mod is None:
        return
    for name, _, _, inputs, want in built:
        out = np.zeros(want.shape, np.int32)
        mod[name](*inputs, out)
        _check(name + "@" + label, out, want)


@pytest.mark.parametrize("target", NO_VNNI)
def test_dot4_without_vnni_uses_pmaddwd_and_matches_numpy(target, tmp_path):
    assert int8_dot_native(target) == ()
    built, lib, path = _build_all(target, tmp_path)
    asm = lib.get_source("asm")
    assert "vpdpbusd" not in asm and re.search(r"\bv?pmaddwd\b", asm)
    assert not re.search(r"\bv?pmaddubsw\b", asm)      # saturates int16: not exact for u8 x s8 pairs
    if target == "x86_64":
        assert not lacking(path), "baseline x86-64 code must run on every x86-64 CPU"
    _run_all_where_supported(built, path, target)


def test_host_build_uses_vpdpbusd_where_the_cpu_has_vnni():
    vnni = bool({"avx512_vnni", "avx_vnni"} & host_features())
    assert int8_dot_native("host") == (("u8s8",) if vnni else ())
    for factor in (16, 8, 4, 5, 32):
        lib = tether.build(*_reduction("u8s8", 48, 37, factor), target="host", name="red", jobs=1)
        asm = lib.get_source("asm")
        assert bool(re.search(r"\bvpdpbusd\b", asm)) == vnni, factor
        assert not re.search(r"\bv?pmaddubsw\b", asm), factor
    # the kinds VNNI does not compute: pmaddwd, never a saturating pmaddubsw
    asm = tether.build(*_reduction("s8s8", 48, 37, 16), target="host", name="red", jobs=1).get_source("asm")
    assert "vpdpbusd" not in asm and re.search(r"\bv?pmaddwd\b", asm)


def test_avx_vnni_without_avx512_vnni_uses_the_vex_form(tmp_path):
    """The VEX form is the code on every host; it runs where this CPU has AVX-VNNI (Intel since Alder Lake) and is
    refused with ArchMismatch naming avx_vnni where it has not (an AMD Zen 4 has AVX-512 VNNI only)."""
    assert int8_dot_native(AVX_VNNI_ONLY) == ("u8s8",)
    built, lib, path = _build_all(AVX_VNNI_ONLY, tmp_path)
    asm = lib.get_source("asm")
    assert re.search(r"\{vex\}\s+vpdpbusd\s+%[xy]mm", asm)
    assert not re.search(r"%zmm", asm), "an AVX-512 instruction in a build for a CPU without AVX-512"
    assert "avx_vnni" in runtime.read_metadata(str(path))["requires"]["features"]
    assert ("avx_vnni" in lacking(path)) == ("avx_vnni" not in host_features())
    _run_all_where_supported(built, path, "avxvnni")


# ---- emulated ARM devices ---------------------------------------------------------------------------------------
# preset -> instructions its build must show (the rasp5 device is qemu's cortex-a76, which has the dot product)
ARM_INSTRUCTIONS = {
    "rasp5": [r"\bsdot\s+v\d+\.4s", r"\budot\s+v\d+\.4s"],
    "rasp4b": [r"\bsmull2?\s+v\d+\.8h", r"\bumull2?\s+v\d+\.8h", r"\bsaddlp\s+v\d+\.4s", r"\buaddlp\s+v\d+\.4s",
               r"\bsmlal2?\s+v\d+\.4s, v\d+\.[48]h, v\d+\.h\[3\]",    # byte_of: smlal by element
               r"\bsmlal2?\s+v\d+\.8h, v\d+\.(8|16)b", r"\bsadalp\s+v\d+\.4s, v\d+\.8h"],    # pair_dot
    "armv7-a7": [r"\bvmull\.s8\b", r"\bvmull\.u8\b", r"\bvpaddl\.s16\b", r"\bvpaddl\.u16\b"],
}


@pytest.mark.parametrize("preset", sorted(ARM_INSTRUCTIONS))
def test_arm_builds_use_the_targets_instructions(preset, tmp_path):
    _, lib, _ = _build_all(preset, tmp_path)
    asm = lib.get_source("asm")
    for pattern in ARM_INSTRUCTIONS[preset]:
        assert re.search(pattern, asm), (preset, pattern)
    if preset != "rasp5":
        assert not re.search(r"\b[su]dot\b", asm)


def test_quad_sum_adds_pairwise_on_aarch64():
    """quad_sum of four stride-4 loads in an 8-lane loop: one 32-element load and six addp, no shuffles."""
    s, args, _, _ = _quad_case(64, 8, np.random.default_rng(0))
    asm = tether.build([tether.lower(s, args, name="quad")], target="rasp4b", name="quad", jobs=1).get_source("asm")
    body = asm[asm.index("quad__impl:"):]
    body = body[:body.index(".Lfunc_end")]
    assert len(re.findall(r"\baddp\s+v\d+\.4s", body)) == 6, body
    assert not re.search(r"\b(uzp[12]|zip[12]|trn[12]|ext|ld4)\b", body), body


@pytest.mark.emulated
@pytest.mark.parametrize("preset", sorted(ARM_INSTRUCTIONS))
def test_dot4_matches_numpy_on_emulated_device(emulated_devices, preset, tmp_path):
    device = emulated_devices.for_preset(preset)
    built, _, path = _build_all(preset, tmp_path, seed=1)
    _run_on_device(device, path, built, preset)


def _run_on_device(device, path, built, label: str) -> None:
    """Every case of ``built`` (in the module at ``path``) run on an emulated device over RPC, checked."""
    from tether import rpc
    with rpc.connect(*device.address, timeout=120.0) as remote:
        remote.upload(str(path))
        mod = remote.load_module(path.name)
        for name, _, _, inputs, want in built:
            out = remote.empty(want.shape, "int32")
            mod[name](*[remote.array(x) for x in inputs], out)
            _check(name + "@" + label, out.numpy(), want)


# ---- load-time choice: android-arm64 covers phones with and without the dot product ------------------------------
_GUEST_SCRIPT = r"""
import ctypes, sys
import numpy as np
sys.path.insert(0, sys.argv[1])
from tether_rpc import module
m = module.load_module(sys.argv[2])
word = ctypes.c_uint32.in_dll(m._lib, "tether_cpu_features")
if sys.argv[3] == "force":      # take the dot-product version whatever the CPU says
    word.value = 1
print("word", word.value, flush=True)
a = np.arange(1, 38, dtype=np.int32) * 0x01010101
w = np.tile(np.arange(48, dtype=np.int32) * 0x00010203, (37, 1))
c = np.zeros(48, np.int32)
m["red_s8s8_v16"](a, w, c)
print("ran", int(c.astype(np.int64).sum()), flush=True)
"""


def test_dispatch_word_bits():
    from tether_rpc import cpu_features
    caps = {"source": "auxv", "features": ["asimd", "asimddp"]}
    assert cpu_features.dispatch_word(["asimddp"], caps) == 1
    assert cpu_features.dispatch_word(["i8mm", "asimddp"], caps) == 2
    assert cpu_features.dispatch_word(["asimddp"], {"source": None, "features": ["asimddp"]}) == 0
    assert cpu_features.dispatch_word(None, caps) == 0


def test_android_arm64_build_carries_both_versions(tmp_path):
    assert int8_dot_native("android-arm64") == ()
    _, lib, path = _build_all("android-arm64", tmp_path)
    meta = runtime.read_metadata(str(path))
    assert meta["cpu_dispatch"] == ["asimddp"] and "asimddp" not in meta["requires"]["features"]
    asm = lib.get_source("asm")
    for pattern in (r"\bsdot\s+v\d+\.4s", r"\budot\s+v\d+\.4s", r"\bsmull2?\s+v\d+\.8h", r"\bsaddlp\s"):
        assert re.search(pattern, asm), pattern
    # a build in parts (one object per job) has one word, defined by the runtime part
    parts = tether.build([tether.lower(*_reduction("s8s8", 48, 37, 16), name="a"),
                          tether.lower(*_reduction("u8u8", 48, 37, 8), name="b")],
                         target="android-arm64", name="parts", jobs=2)
    ppath = tmp_path / "parts.so"
    parts.export_library(str(ppath))
    assert runtime.read_metadata(str(ppath))["cpu_dispatch"] == ["asimddp"]


@pytest.mark.emulated
@pytest.mark.parametrize("cpu,word", [("cortex-a72", 0), ("cortex-a76", 1)])
def test_android_arm64_chooses_at_load_time_on_emulated_cpus(emulated_devices, cpu, word, tmp_path):
    """The same android-arm64 module gives numpy's results on a CPU without the dot product (cortex-a72) and
    one with it (cortex-a76), and the loader sets the word that picks the sdot/udot versions only on the latter."""
    import pathlib
    import shutil
    import uuid

    built, _, path = _build_all("android-arm64", tmp_path, seed=2)
    device = emulated_devices.device("aarch64", cpu)
    _run_on_device(device, path, built, "android-arm64/" + cpu)
    # which version ran: the word the device runtime set, read inside the guest
    userland = emulated_devices.userland("aarch64")
    guest_dir = "/tmp/int8dot_%s" % uuid.uuid4().hex
    host_dir = userland.guest_path(guest_dir)
    host_dir.mkdir(parents=True)
    try:
        root = pathlib.Path(__file__).resolve().parent.parent
        shutil.copytree(root / "rpc_server" / "tether_rpc", host_dir / "tether_rpc")
        shutil.copy(path, host_dir / "m.so")
        (host_dir / "check.py").write_text(_GUEST_SCRIPT)
        args = [guest_dir + "/check.py", guest_dir, guest_dir + "/m.so"]
        proc = userland.run_python(args + ["as-loaded"], cpu=cpu, timeout=120.0)
        assert "word %d" % word in proc.stdout and "ran" in proc.stdout, proc.stdout + proc.stderr
        if word == 0:
            # forcing the dot-product version on this CPU dies of SIGILL: the word is what keeps sdot away
            forced = userland.run_python(args + ["force"], cpu=cpu, timeout=120.0, check=False)
            assert "word 1" in forced.stdout and "ran" not in forced.stdout, forced.stdout + forced.stderr
            assert forced.returncode in (-4, 128 + 4), (forced.returncode, forced.stderr[-2000:])   # SIGILL
    finally:
        shutil.rmtree(host_dir, ignore_errors=True)
