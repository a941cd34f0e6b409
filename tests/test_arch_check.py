"""A module built for a CPU the device lacks is refused at load (ArchMismatch naming what is missing and the
preset to use), not killed by SIGILL mid-call; modules built for the device's own CPU still load everywhere.

Host tests build real modules with tether.build and load them with the device runtime; the emulated tests run
the real device server under qemu-user (tests/fixtures/emulated.py) with the CPU a board has.
"""
from __future__ import annotations

import numpy as np
import pytest

from fixtures.arch_modules import QEMU_AUXV, absent_x86_feature, module_with_requires
from tether.errors import ArchMismatch
from tether.target import Target
from tether_rpc import cpu_features, device_info
from tether_rpc.module import load_module

SESSION_TIMEOUT = 120.0

AUXV = QEMU_AUXV
# An x86 host's /proc/cpuinfo as qemu-user shows it to an ARM guest: it must not count as the guest's features.
HOST_CPUINFO_UNDER_QEMU = {"features": ["avx2", "fma", "sse2"], "features_key": "flags", "cores": []}


def _doubler(target: str, path):
    import tether
    from tether import te
    A = te.placeholder((64,), "float32", name="A")
    C = te.compute((64,), lambda i: A[i] * 2.0 + 1.0, name="C")
    s = te.create_schedule(C.op)
    lib = tether.build(s, [A, C], target=target, name="dbl")
    lib.export_library(str(path))
    return path


@pytest.mark.parametrize("cpu,preset,runs", [
    ("cortex-a7", "armv7-a7", True), ("cortex-a7", "rasp3b", False),
    ("max-arm", "rasp3b", True), ("max-arm", "armv7-a7", True),
    ("cortex-a72", "rasp4b", True), ("cortex-a72", "rasp5", False), ("cortex-a72", "android-arm64", True),
    ("cortex-a76", "rasp5", True), ("cortex-a76", "rasp4b", True),
])
def test_presets_against_emulated_cpus(cpu, preset, runs):
    """Each preset's requirements against the capabilities qemu's CPUs report (the same pairs the emulated
    tests below run for real)."""
    arch, auxv = AUXV[cpu]
    caps = cpu_features.capabilities(arch, HOST_CPUINFO_UNDER_QEMU, auxv=auxv)
    assert caps["source"] == "auxv" and "avx2" not in caps["features"]
    lacking = cpu_features.missing(Target(preset).requirements(), caps)
    assert (lacking == []) == runs, lacking
    if cpu == "cortex-a7" and not runs:
        assert any("ARMv8" in m for m in lacking), lacking
    if cpu == "cortex-a72" and not runs:
        assert {"atomics", "asimddp"} <= set(lacking), lacking
    suggested = cpu_features.suggest_preset(arch, caps)
    assert cpu_features.missing(Target(suggested).requirements(), caps) == []


def test_unknown_capabilities_refuse_nothing():
    caps = cpu_features.capabilities("armv7", HOST_CPUINFO_UNDER_QEMU, auxv={})
    assert caps["source"] is None
    assert cpu_features.missing(Target("rasp3b").requirements(), caps) == []


def test_host_modules_load_and_run(tmp_path):
    """`host` (every feature LLVM detects here, AVX2/FMA/AVX-512 if present) and generic x86_64 both load."""
    caps = device_info.cpu_capabilities()
    for target in ("host", "x86_64"):
        path = _doubler(target, tmp_path / ("dbl_%s.so" % target))
        m = load_module(str(path))
        needs = m.metadata["requires"]
        assert set(needs["features"]) <= set(caps["features"])
        x = np.random.default_rng(0).standard_normal(64).astype("float32")
        out = np.empty_like(x)
        m["dbl"](x, out)
        np.testing.assert_allclose(out, x * 2 + 1, rtol=1e-6)
    if "avx2" in caps["features"] and "fma" in caps["features"]:
        assert {"avx2", "fma"} <= set(Target("host").requirements()["features"])


def _module_with_requires(tmp_path, requires):
    """A real x86_64 module whose metadata claims ``requires`` (None: an old module without the field)."""
    return module_with_requires(tmp_path, requires)


def test_missing_x86_feature_is_named(tmp_path):
    caps = device_info.cpu_capabilities()
    absent = absent_x86_feature(caps["features"])
    path = _module_with_requires(tmp_path, {"isa": "x86_64", "features": ["sse2", absent]})
    with pytest.raises(ArchMismatch) as info:
        load_module(str(path))
    msg = str(info.value)
    assert absent in msg and "sse2" not in msg.split("needs", 1)[1].split("which")[0], msg
    assert "target='host'" in msg, msg
    # a module without the field (built before it existed) loads as before
    load_module(str(_module_with_requires(tmp_path, None)))["nop"]()


# ---------------------------------------------------------------------------------------------------------------
# on emulated devices, through the real device server

@pytest.mark.emulated
def test_rasp3b_module_is_refused_on_cortex_a7(emulated_cortex_a7, tmp_path):
    """The Pi 3 build (ARMv8 AArch32) on a Cortex-A7: ArchMismatch naming ARMv8 and armv7-a7, the session goes
    on, and the armv7-a7 build of the same kernel runs and is right."""
    from tether import rpc
    device = emulated_cortex_a7
    wrong = _doubler("rasp3b", tmp_path / "dbl_rasp3b.so")
    right = _doubler("armv7-a7", tmp_path / "dbl_armv7a7.so")
    pid = device.pid
    x = np.random.default_rng(1).standard_normal(64).astype("float32")
    with rpc.connect(*device.address, timeout=SESSION_TIMEOUT) as remote:
        remote.upload(str(wrong))
        with pytest.raises(ArchMismatch) as info:
            remote.load_module(wrong.name)
        remote.upload(str(right))
        f = remote.load_module(right.name)["dbl"]
        out = remote.empty((64,), "float32")
        f(remote.array(x), out)
        np.testing.assert_allclose(out.numpy(), x * 2 + 1, rtol=1e-6)
        caps = remote.device_info()["cpu_capabilities"]
    msg = str(info.value)
    assert "ARMv8" in msg and "armv7-a7" in msg and "rasp3b" in msg, msg
    assert caps["isa"] == "armv7" and {"neon", "vfpv4", "idiva"} <= set(caps["features"]), caps
    assert device.alive() and device.pid == pid


@pytest.mark.emulated
@pytest.mark.parametrize("preset,other", [("rasp4b", "rasp5"), ("rasp3b", None)])
def test_right_modules_load_on_emulated_boards(emulated_devices, tmp_path, preset, other):
    """Each board's own preset loads and runs; on the Cortex-A72 a rasp5 (ARMv8.2) build is refused, naming the
    LSE atomics and dot product it lacks."""
    from tether import rpc
    device = emulated_devices.for_preset(preset)
    own = _doubler(preset, tmp_path / ("dbl_%s.so" % preset))
    x = np.random.default_rng(2).standard_normal(64).astype("float32")
    with rpc.connect(*device.address, timeout=SESSION_TIMEOUT) as remote:
        remote.upload(str(own))
        out = remote.empty((64,), "float32")
        remote.load_module(own.name)["dbl"](remote.array(x), out)
        np.testing.assert_allclose(out.numpy(), x * 2 + 1, rtol=1e-6)
        if other:
            path = _doubler(other, tmp_path / ("dbl_%s.so" % other))
            remote.upload(str(path))
            with pytest.raises(ArchMismatch, match="atomics.*asimddp|asimddp.*atomics") as info:
                remote.load_module(path.name)
            assert "rasp4b" in str(info.value)
