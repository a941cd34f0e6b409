"""Loading and calling real gcc-built ABI modules; refusing wrong ones before dlopen; time_evaluator;
device_info."""
from __future__ import annotations

import json
import struct
import time

import numpy as np
import pytest

from kernels import build_kernel, build_kernel_for
from tether import runtime
from tether_rpc import device_info as dinfo
from tether_rpc import elf, module, ndarray, timing
from tether_rpc.errors import ArchMismatch, KernelError, ModuleLoadError

N = 1024


@pytest.fixture(scope="module")
def kdir(tmp_path_factory):
    d = tmp_path_factory.mktemp("kernels")
    for name in ("vadd", "nometa"):
        build_kernel(name, d)
    build_kernel("needs_extern", d, link_flags=())
    return d


@pytest.fixture(scope="module")
def vadd_mod(kdir):
    return module.load_module(str(kdir / "vadd.so"))


def _inputs(seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal(N).astype("float32"), rng.standard_normal(N).astype("float32")


# -- arrays ---------------------------------------------------------------------------------------------------
def test_ndarray_basics():
    a = ndarray.empty((3, 5), "float64")
    assert a.shape == (3, 5) and a.dtype == "float64" and a.nbytes == 120 and a.data_ptr % 64 == 0
    src = np.arange(15, dtype="float64").reshape(3, 5)
    a.copyfrom(src)
    out = a.numpy()
    np.testing.assert_array_equal(out, src)
    out[0, 0] = 99  # numpy() is a copy
    assert a.numpy()[0, 0] == 0
    t = a.dltensor
    assert t.ndim == 2 and [t.shape[0], t.shape[1]] == [3, 5] and (t.dtype.code, t.dtype.bits) == (2, 64)
    assert t.data == a.data_ptr and not t.strides


def test_ndarray_view_is_writable_flat_bytes():
    a = ndarray.empty((4,), "int32")
    v = a.view
    assert v.nbytes == 16 and not v.readonly and v.format == "B"
    v[:] = np.array([1, 2, 3, 4], dtype="int32").tobytes()
    np.testing.assert_array_equal(a.numpy(), [1, 2, 3, 4])


def test_ndarray_from_numpy_copies_any_layout_and_all_dtypes():
    for dt in ("float32", "float64", "float16", "int8", "int16", "int32", "int64", "uint8", "bool"):
        src = (np.arange(24).reshape(4, 6) % 3).astype(dt).T  # non-contiguous source
        a = ndarray.from_numpy(src)
        assert a.dtype == dt and a.shape == (6, 4) and a.data_ptr % 64 == 0
        np.testing.assert_array_equal(a.numpy(), src)


def test_ndarray_copyfrom_checks_shape_and_dtype():
    a = ndarray.empty((4,), "float32")
    with pytest.raises(KernelError, match=r"shape \(5,\) does not match.*\(4,\)"):
        a.copyfrom(np.zeros(5, "float32"))
    with pytest.raises(KernelError, match="dtype float64 does not match.*float32"):
        a.copyfrom(np.zeros(4, "float64"))
    with pytest.raises(KernelError, match="complex128 is not supported"):
        ndarray.empty((2,), "complex128")


def test_impossible_allocation_names_the_array():
    with pytest.raises(MemoryError, match=r"cannot allocate a float64 array of shape \(1099511627776,\)"):
        ndarray.empty((1 << 40,), "float64")
    with pytest.raises(KernelError, match="non-negative"):
        ndarray.empty((-1, 3), "float32")


def test_zero_size_and_scalar_arrays():
    z = ndarray.empty((0, 3), "float32")
    assert z.nbytes == 0 and z.numpy().shape == (0, 3)
    s = ndarray.from_numpy(np.float32(2.5))
    assert s.shape == () and s.numpy() == np.float32(2.5)


# -- calling --------------------------------------------------------------------------------------------------
def test_vadd_with_numpy_arrays_is_zero_copy(vadd_mod):
    a, b = _inputs()
    c = np.zeros(N, "float32")
    vadd_mod["vadd"](a, b, c)  # the result lands in the caller's array
    np.testing.assert_array_equal(c, a + b)
    # The kernel works in the caller's memory: with C one element ahead of A in the same buffer, each result feeds
    # the next addition (a running sum). A call that copied its arguments in and out would give buf[:N] + steps.
    buf = np.zeros(N + 1, "float32")
    steps = np.random.default_rng(5).integers(-8, 9, N).astype("float32")  # small integers: exact in float32
    vadd_mod["vadd"](buf[:N], steps, buf[1:])
    np.testing.assert_array_equal(buf[1:], np.cumsum(steps))


def test_vadd_with_ndarrays(vadd_mod):
    a, b = _inputs(1)
    A, B, C = ndarray.from_numpy(a), ndarray.from_numpy(b), ndarray.empty((N,), "float32")
    vadd_mod["vadd"](A, B, C)
    np.testing.assert_array_equal(C.numpy(), a + b)
    # mixed NDArray / numpy and the host re-export
    c2 = np.empty(N, "float32")
    runtime.load_module(vadd_mod.path)["vadd"](A, b, c2)
    np.testing.assert_array_equal(c2, a + b)


def test_bound_call_reuses_converted_args(vadd_mod):
    a, b = _inputs(2)
    c = np.zeros(N, "float32")
    call = vadd_mod["vadd"].bind(a, b, c)
    call()
    np.testing.assert_array_equal(c, a + b)
    a += 1  # same buffers: the bound call sees new contents
    call()
    np.testing.assert_array_equal(c, a + b)


def test_scalar_string_and_bytes_arguments(vadd_mod):
    out = np.zeros(4, "int64")
    vadd_mod["probe"](out, -(1 << 40), 2.25, "héllo", b"\x01\x02\x00\xff")
    expected_bytes = (1 + 2 + 0 + 255) * 1000 + 4
    np.testing.assert_array_equal(out, [-(1 << 40), 2250, len("héllo".encode()), expected_bytes])
    vadd_mod["probe"](out, np.int32(7), np.float32(0.5), "", bytearray())
    np.testing.assert_array_equal(out, [7, 500, 0, 0])


@pytest.mark.parametrize("args, pattern", [
    (lambda a, b, c: (a, b), r"vadd: expected 3 arguments \(A, B, C\), got 2"),
    (lambda a, b, c: (a, b[:1000], c), r"vadd: argument 1 'B' has shape \(1000,\), expected \(1024,\)"),
    (lambda a, b, c: (a, b, c.astype("float64")), r"vadd: argument 2 'C' has dtype float64, expected float32"),
    (lambda a, b, c: (a.reshape(32, 32), b, c),
     r"vadd: argument 0 'A' has 2 dimensions \(shape \(32, 32\)\), expected 1 \(shape \(1024,\)\)"),
    (lambda a, b, c: (a, 3, c), r"vadd: argument 1 'B' must be an array, got int"),
    (lambda a, b, c: (a, b, c[:512]), r"argument 2 'C' has shape \(512,\), expected \(1024,\) \(dimension 0"),
    (lambda a, b, c: (a, np.zeros((2, N), "float32")[:, 0], c), r"argument 1 'B' is not C-contiguous"),
    (lambda a, b, c: (a, b, np.zeros(N, "complex64")), r"argument 2 'C' is a complex64 array"),
    (lambda a, b, c: (a, b, object()), r"argument 2 'C' has unsupported type object"),
])
def test_bad_arguments_give_readable_kernel_errors(vadd_mod, args, pattern):
    a, b = _inputs()
    c = np.zeros(N, "float32")
    with pytest.raises(KernelError, match=pattern):
        vadd_mod["vadd"](*args(a, b, c))
    np.testing.assert_array_equal(c, 0)  # refused before any work


def test_decode_of_remaining_codes(vadd_mod):
    f = vadd_mod["vadd"]
    a = np.zeros(N, "float32")
    assert "argument 1 'B' is not a compact row-major array (dimension 0)" in str(
        f.decode_error(6 << 24 | 1 << 8, (a, a, a)))
    assert "argument 2 'C' has a NULL data pointer" in str(f.decode_error(7 << 24 | 2 << 8, (a, a, a)))
    assert "a parallel task failed with code 42" in str(f.decode_error(8 << 24 | 42))
    assert "return code" in str(f.decode_error(0x7F000001))


def test_unknown_function_lists_available(vadd_mod):
    with pytest.raises(KeyError, match="vadd.so has no function 'vmul'; it has: vadd, probe"):
        vadd_mod["vmul"]
    assert vadd_mod.function_names == ["vadd", "probe"]
    assert vadd_mod.metadata["abi_version"] == 1 and vadd_mod.metadata["target"]["arch"] == elf.host_arch()


# -- refusing modules before dlopen ----------------------------------------------------------------------------
def _patched_copy(src, dst, offset, fmt, value):
    data = bytearray(src.read_bytes())
    struct.pack_into(fmt, data, offset, value)
    dst.write_bytes(bytes(data))
    return dst


def _loaded_paths():
    with open("/proc/self/maps") as fh:
        return fh.read()


def test_wrong_arch_refused_before_dlopen(kdir, tmp_path):
    foreign = "aarch64" if elf.host_arch() != "aarch64" else "x86_64"
    bad = _patched_copy(kdir / "vadd.so", tmp_path / "vadd_foreign.so", 18, "<H", elf.ARCH_MACHINE[foreign])
    with pytest.raises(ArchMismatch) as info:
        module.load_module(str(bad))
    assert str(info.value).startswith("vadd_foreign.so was built for %s but this device is %s"
                                      % (foreign, elf.host_arch()))
    assert str(bad) not in _loaded_paths()  # never mapped: no foreign code ran


def test_unknown_machine_and_non_shared_object_refused(kdir, tmp_path):
    mips = _patched_copy(kdir / "vadd.so", tmp_path / "mips.so", 18, "<H", 8)
    with pytest.raises(ArchMismatch, match="built for mips"):
        module.load_module(str(mips))
    exe = _patched_copy(kdir / "vadd.so", tmp_path / "exec.so", 16, "<H", 2)  # ET_EXEC
    with pytest.raises(ModuleLoadError, match="not a shared library"):
        module.load_module(str(exe))


def test_module_without_metadata_refused(kdir):
    with pytest.raises(ModuleLoadError, match=r"nometa.so has no .tether_meta section: it is not a tether module"):
        module.load_module(str(kdir / "nometa.so"))


def test_bad_metadata_refused(kdir, tmp_path):
    src = kdir / "vadd.so"
    data = src.read_bytes()
    start = data.index(b'{"abi_version": 1')
    cases = [(b'{"abi_version": 1', b'{"abi_version": 9', "ABI version 9 but this runtime speaks version 1"),
             (b'{"abi_version": 1', b'["abi_version": 1', "not valid JSON"),
             (b'"arch": "' + elf.host_arch().encode(), b'"arch": "' + b"x" * len(elf.host_arch()),
              "metadata says arch"),
             (b'{"name": "probe"', b'{"name": "probX"', "metadata lists probX but the library does not export it")]
    for i, (old, new, pattern) in enumerate(cases):
        pos = data.index(old, start)
        bad = tmp_path / ("meta%d.so" % i)
        bad.write_bytes(data[:pos] + new + data[pos + len(old):])
        with pytest.raises(ModuleLoadError, match=pattern):
            module.load_module(str(bad))


def test_garbage_and_missing_files_refused(tmp_path):
    junk = tmp_path / "junk.so"
    junk.write_bytes(b"\x7fELF" + b"\xff" * 10)
    with pytest.raises(ModuleLoadError, match="junk.so"):
        module.load_module(str(junk))
    with pytest.raises(ModuleLoadError, match="cannot open"):
        module.load_module(str(tmp_path / "absent.so"))


def test_big_endian_header_refused(tmp_path):
    # A hand-made big-endian aarch64 shared object header (no sections): refused as a mismatch, naming why.
    ident = b"\x7fELF" + bytes([2, 2, 1, 0]) + bytes(8)
    header = ident + struct.pack(">HHIQQQIHHHHHH", 3, 183, 1, 0, 0, 0, 0, 64, 0, 0, 64, 0, 0)
    path = tmp_path / "be.so"
    path.write_bytes(header)
    with elf.ElfFile(path) as e:
        assert (e.endian, e.bits, e.arch, e.sections) == ("big", 64, "aarch64", [])
    with pytest.raises(ArchMismatch, match=r"be.so was built for aarch64 \(big-endian\) but this device is"):
        module.load_module(str(path))


def test_dlopen_failure_explains_missing_symbols(kdir):
    with pytest.raises(ModuleLoadError, match="dlopen failed for needs_extern.so.*tether_no_such_symbol.*"
                                              "self-contained"):
        module.load_module(str(kdir / "needs_extern.so"))


# -- timing ---------------------------------------------------------------------------------------------------
def test_time_evaluator_samples_and_streaming(vadd_mod):
    a, b = _inputs()
    c = np.zeros(N, "float32")
    seen = []
    res = timing.time_evaluator(vadd_mod["vadd"], (a, b, c), number=5, repeat=4,
                                on_sample=lambda i, s, n: seen.append((i, s, n)))
    assert res["number"] == 5 and len(res["samples"]) == 4
    assert [i for i, _, _ in seen] == [0, 1, 2, 3]
    assert [s for _, s, _ in seen] == res["samples"] and all(n == 5 for _, _, n in seen)
    assert all(0 < s for s in res["samples"])
    np.testing.assert_array_equal(c, a + b)  # it really ran the kernel on these arrays


def test_time_evaluator_grows_number_to_min_repeat_ms():
    calls = []

    def slow():  # ~0.2 ms per call
        calls.append(1)
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 2e-4:
            pass

    res = timing.time_evaluator(slow, number=1, repeat=2, min_repeat_ms=20, warmup=0)
    # grown from 1 (to about 100 on an idle machine; fewer where a loaded one stretches the calls) until a sample
    # lasts the minimum; a sample is the time of one call, which is never less than the spin
    assert res["number"] > 1 and len(calls) >= 2 * res["number"]
    assert all(s * res["number"] >= 0.018 for s in res["samples"])
    assert all(1.9e-4 <= s for s in res["samples"])


def test_time_evaluator_warmup_and_cooldown():
    calls = []
    t0 = time.perf_counter()
    res = timing.time_evaluator(lambda: calls.append(1), number=3, repeat=3, warmup=2, cooldown_ms=30)
    assert len(calls) == 2 + 3 * 3
    assert time.perf_counter() - t0 >= 0.06  # two cooldowns between three samples
    assert set(res) == {"samples", "number", "clock"} and res["number"] == 3 and len(res["samples"]) == 3
    assert res["clock"] == "host"
    with pytest.raises(ValueError):
        timing.time_evaluator(lambda: None, number=0)


# -- device info ----------------------------------------------------------------------------------------------
def test_device_info_keys_and_arch():
    info = dinfo.device_info()
    for key in ("arch", "machine", "cpu_model", "cpu_cores", "cpu_features", "num_cores", "memory_bytes", "os",
                "python", "numpy", "msgpack", "governor", "temperature_c", "suggested_target", "parallel_threads"):
        assert key in info, key
    assert info["arch"] == elf.host_arch()
    assert info["numpy"] == np.__version__
    assert info["num_cores"] >= 1 and info["memory_bytes"] > 1 << 20
    assert set(info["os"]) >= {"system", "release", "name", "android"}
    json.dumps(info)  # plain data, ready for msgpack/JSON


def test_device_info_survives_odd_files(monkeypatch):
    junk = {"/proc/cpuinfo": "\0\0\xff garbage\nCPU part : 0xd08\nCPU implementer : nope\n",
            "/proc/meminfo": "MemTotal: -- kB\n", "/etc/os-release": "=\n==\nNAME\n"}
    monkeypatch.setattr(dinfo, "_read", lambda path, limit=1 << 20: junk.get(path, "not a number\n"))
    info = dinfo.device_info()
    assert info["arch"] == elf.host_arch()
    assert info["memory_bytes"] is None and info["governor"] == "not a number" and info["temperature_c"] is None
    assert info["cpu_max_khz"] is None and isinstance(info["cpu_cores"], list)
    monkeypatch.setattr(dinfo, "_read", lambda path, limit=1 << 20: None)  # nothing readable at all
    info = dinfo.device_info()
    assert info["cpu_model"] is None and info["cpu_cores"] == [] and info["memory_bytes"] is None
    assert info["suggested_target"] == dinfo.suggest_target(elf.host_arch(), [], info["os"]["android"])


def test_cpuinfo_parsing_and_presets():
    pi4 = "processor\t: 0\nBogoMIPS\t: 108.00\nFeatures\t: fp asimd evtstrm crc32 cpuid\nCPU implementer\t: 0x41\n" \
          "CPU architecture: 8\nCPU variant\t: 0x0\nCPU part\t: 0xd08\nCPU revision\t: 3\n\nHardware\t: BCM2835\n"
    cpu = dinfo.parse_cpuinfo(pi4)
    assert cpu["cores"] == ["cortex-a72"] and "asimd" in cpu["features"] and cpu["model"] == "BCM2835"
    assert dinfo.suggest_target("aarch64", cpu["cores"], android=False) == "rasp4b"
    assert dinfo.suggest_target("aarch64", ["cortex-a76"], False) == "rasp5"
    assert dinfo.suggest_target("aarch64", ["cortex-a57"], False) == "jetson-nano"
    assert dinfo.suggest_target("aarch64", ["cortex-a76"], True) == "android-arm64"
    assert dinfo.suggest_target("armv7", ["cortex-a53"], False) == "rasp3b"
    assert dinfo.suggest_target("armv7", ["cortex-a7"], False) == "armv7-a7"
    assert dinfo.suggest_target("x86_64", [], False) == "x86_64"
    assert dinfo.suggest_target("aarch64", [], False) == "aarch64"
    # odd contents never raise
    for junk in (None, "", ":::\n\0\0", "CPU part : banana\nCPU implementer : 0xzz\n", "Features\n:"):
        assert isinstance(dinfo.parse_cpuinfo(junk)["cores"], list)
    assert dinfo.parse_meminfo("MemTotal: lots kB\nMemAvailable:\n") == {"total": None, "available": None}
    assert dinfo.parse_meminfo("MemTotal:       1024 kB\n")["total"] == 1 << 20


def test_reloading_a_replaced_file_runs_the_new_code(tmp_path):
    # Same path, new contents (a rebuilt kernel uploaded under the same name): dlopen alone would hand back the
    # library it mapped first; load_module must run the file it just vetted.
    d1, d2 = tmp_path / "v1", tmp_path / "v2"
    d1.mkdir()
    d2.mkdir()
    first = build_kernel("vadd", d1)
    second = build_kernel("vadd", d2, defines=["N=512"])
    target = tmp_path / "vadd.so"
    target.write_bytes(first.read_bytes())
    m1 = module.load_module(str(target))
    target.unlink()  # the usual "write new file, rename over" upload leaves the old inode mapped
    target.write_bytes(second.read_bytes())
    m2 = module.load_module(str(target))
    a, b = np.arange(512, dtype="float32"), np.ones(512, "float32")
    c = np.zeros(512, "float32")
    m2["vadd"](a, b, c)
    np.testing.assert_array_equal(c, a + b)
    with pytest.raises(KernelError, match=r"has shape \(512,\), expected \(1024,\)"):
        m1["vadd"](a, b, c)  # the first module keeps its own code
    assert not [p for p in tmp_path.iterdir() if ".tether-" in p.name]  # aliases are cleaned up
    # loading the unchanged file again reuses the mapping
    m3 = module.load_module(str(target))
    assert m3._lib._handle == m2._lib._handle


def test_read_only_numpy_inputs_are_accepted(vadd_mod):
    a, b = _inputs(3)
    ra = np.frombuffer(a.tobytes(), dtype="float32")  # read-only buffer, as decoded from the wire
    assert not ra.flags.writeable
    c = np.zeros(N, "float32")
    vadd_mod["vadd"](ra, b, c)
    np.testing.assert_array_equal(c, a + b)


def test_arm_float_abi_mismatch_refused(tmp_path, monkeypatch):
    # A real armv7 module (zig cc, hard-float) checked as if this were an armv7 device whose Python is soft-float:
    # glibc would refuse it with a cryptic message, load_module says what is wrong before dlopen.
    hard = build_kernel_for("vadd", "armv7", tmp_path)
    with elf.ElfFile(hard) as e:
        assert e.arch == "armv7" and e.bits == 32 and e.arm_float_abi == "hard"
        assert e.arm_attributes().get(elf.TAG_ABI_VFP_ARGS) == 1
        flags_offset = 0x24  # e_flags in a 32-bit ELF header
        assert struct.unpack_from("<I", hard.read_bytes(), flags_offset)[0] == e.flags
    soft = tmp_path / "vadd_soft.so"
    data = bytearray(hard.read_bytes())
    struct.pack_into("<I", data, flags_offset, (e.flags & ~elf.EF_ARM_ABI_FLOAT_HARD) | elf.EF_ARM_ABI_FLOAT_SOFT)
    soft.write_bytes(bytes(data))
    with elf.ElfFile(soft) as e:
        assert e.arm_float_abi == "soft"
    monkeypatch.setattr(module, "host_arch", lambda: "armv7")
    monkeypatch.setattr(module, "_host_float_abi", lambda: "hard")
    with pytest.raises(ArchMismatch, match="vadd_soft.so uses the soft-float ARM ABI but this device's Python is "
                                           "hard-float"):
        module.load_module(str(soft))
    assert module.inspect_module(str(hard))["target"]["arch"] == "armv7"  # the matching one passes the checks
    monkeypatch.undo()
    # host tools can read any module's metadata without loading it
    meta = runtime.read_metadata(str(hard))
    assert meta["target"]["arch"] == "armv7" and [f["name"] for f in meta["functions"]] == ["vadd", "probe"]
