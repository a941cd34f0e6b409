"""The module's shared scratch arena (codegen/scratch.py): kernels of one module reuse one static buffer for
their large intermediates, a kernel that finds it taken falls back to its own, and the arena never leaves the
module (a hidden symbol, one per module even when the module is compiled in parts)."""
from __future__ import annotations

import concurrent.futures
import struct
import threading

import numpy as np
import pytest

import tether
from tether import driver, te
from tether_rpc import host_functions, module
from tether_rpc.elf import ElfFile

N_SMALL, N_BIG = 20_000, 60_000   # 80 KB and 240 KB intermediates: above the stack limit, so static scratch


def _reversed_double(name: str, n: int, host: str = ""):
    """C[i] = 2 * A[n-1-i] + A[i] through an intermediate T = 2A (static scratch); with ``host``, every element
    also goes through the host function of that name (which returns it unchanged)."""
    a = te.placeholder((n,), "float32", name="A")
    t = te.compute((n,), lambda i: a[i] * 2.0, name="T")
    if host:
        c = te.compute((n,), lambda i: te.call_packed(host, t[n - 1 - i] + a[i], i, dtype="float32"), name="C")
    else:
        c = te.compute((n,), lambda i: t[n - 1 - i] + a[i], name="C")
    return te.create_schedule(c.op), [a, c], name


def _symtab(elf: ElfFile):
    """(name, binding, visibility, size) of every symbol in .symtab (ELF64 little-endian: the host)."""
    sec = elf.section(".symtab")
    data, names = elf.section_data(sec), elf.section_data(elf.sections[sec.link])
    out = []
    for off in range(0, len(data) - 23, 24):
        name_at, info, other = struct.unpack_from("<IBB", data, off)
        size = struct.unpack_from("<Q", data, off + 16)[0]
        name = names[name_at:names.index(b"\0", name_at)].decode()
        out.append((name, info >> 4, other & 3, size))
    return out


def _expected(x: np.ndarray) -> np.ndarray:
    return 2 * x[::-1] + x


@pytest.mark.parametrize("jobs", [1, 2])
def test_kernels_share_one_hidden_arena_sized_for_the_largest(tmp_path, jobs):
    lib = driver.build([_reversed_double("small", N_SMALL), _reversed_double("big", N_BIG)], target="host",
                       name="m", jobs=jobs)
    path = lib.export_library(str(tmp_path / "m.so"))
    with ElfFile(path) as elf:
        assert not [s for s in elf.exported_symbols if "scratch" in s]
        arenas = [sym for sym in _symtab(elf) if sym[0] == "tether_scratch_arena"]
    assert len(arenas) == 1, arenas   # one arena, even from two separately compiled parts
    name, binding, visibility, size = arenas[0]
    assert binding == 0 and visibility == 2    # local, hidden: no other module can interpose it
    assert size >= N_BIG * 4                    # the largest kernel's intermediate fits
    m = module.load_module(path)
    rng = np.random.default_rng(0)
    for name, n in (("small", N_SMALL), ("big", N_BIG), ("small", N_SMALL)):
        x = rng.random(n, dtype=np.float32)
        out = np.zeros(n, np.float32)
        m[name](x, out)
        np.testing.assert_array_equal(out, _expected(x))


def test_kernels_of_one_module_run_at_once_from_several_threads(tmp_path):
    # One thread at a time holds the arena; the others run on their kernel's own scratch. Every result is exact.
    lib = driver.build([_reversed_double("small", N_SMALL), _reversed_double("big", N_BIG)], target="host",
                       name="m", jobs=1)
    m = module.load_module(lib.export_library(str(tmp_path / "m.so")))

    def work(seed):
        rng = np.random.default_rng(seed)
        wrong = []
        for k in range(30):
            name, n = (("small", N_SMALL), ("big", N_BIG))[(k + seed) % 2]
            x = rng.random(n, dtype=np.float32)
            out = np.zeros(n, np.float32)
            m[name](x, out)
            if not np.array_equal(out, _expected(x)):
                wrong.append(name)
        return wrong

    with concurrent.futures.ThreadPoolExecutor(4) as ex:
        results = [f.result(timeout=120) for f in [ex.submit(work, seed) for seed in range(4)]]
    assert results == [[], [], [], []]


def test_a_kernel_called_from_inside_another_uses_its_own_scratch(tmp_path):
    # "outer" holds the arena while it calls back into Python, which runs "inner" of the same module: inner
    # must fall back to its own scratch (a module-wide lock would spin forever here).
    lib = driver.build([_reversed_double("outer", N_SMALL, host="test.scratch_nested"),
                        _reversed_double("inner", N_BIG)], target="host", name="m", jobs=1)
    path = lib.export_library(str(tmp_path / "m.so"))
    inner_results = []
    holder = {}

    def nested(v, i):
        if i == 0:
            x = np.random.default_rng(1).random(N_BIG, dtype=np.float32)
            out = np.zeros(N_BIG, np.float32)
            holder["m"]["inner"](x, out)
            inner_results.append(np.array_equal(out, _expected(x)))
        return v

    tether.register_func("test.scratch_nested", nested)
    try:
        m = holder["m"] = module.load_module(path)
        x = np.random.default_rng(2).random(N_SMALL, dtype=np.float32)
        out = np.zeros(N_SMALL, np.float32)
        result = []
        th = threading.Thread(target=lambda: (m["outer"](x, out), result.append(True)), daemon=True)
        th.start()
        th.join(timeout=60)
        assert not th.is_alive(), "the nested kernel waited for the arena its caller holds"
        assert result == [True] and inner_results == [True]
        np.testing.assert_allclose(out, _expected(x), rtol=1e-6)
        # both locks were released: each kernel runs again (on the arena)
        for name, n in (("inner", N_BIG),):
            y = np.zeros(n, np.float32)
            xx = np.random.default_rng(3).random(n, dtype=np.float32)
            m[name](xx, y)
            np.testing.assert_array_equal(y, _expected(xx))
    finally:
        host_functions.remove_func("test.scratch_nested")


@pytest.mark.emulated
def test_the_arena_works_on_emulated_arm(emulated_target_device, tmp_path):
    """aarch64, armv7 (ARMv8 AArch32) and armv7 on a Cortex-A7: the common hidden arena links self-contained
    and both kernels give exact results on the device (qemu-user)."""
    from tether import rpc
    device = emulated_target_device
    lib = driver.build([_reversed_double("small", N_SMALL), _reversed_double("big", N_BIG)],
                       target=device.preset, name="m", jobs=2)
    path = lib.export_library(str(tmp_path / "arena.so"))
    rng = np.random.default_rng(4)
    with rpc.connect(*device.address, timeout=120.0) as remote:
        remote.upload(path)
        m = remote.load_module("arena.so")
        for name, n in (("big", N_BIG), ("small", N_SMALL), ("big", N_BIG)):
            x = rng.random(n, dtype=np.float32)
            out = remote.empty((n,), "float32")
            m[name](remote.array(x), out)
            np.testing.assert_array_equal(out.numpy(), _expected(x))
