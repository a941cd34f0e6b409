"""The Java device server in an aarch64 JVM under qemu-user: the same classes run_device.sh runs on the desktop,
in the emulated Debian arm64 userland (tether.emulate, with the "java" extra: openjdk-17-jre-headless) with the
aarch64 JNI bridge. Kernels compiled by tether for android-arm64 and rasp4b (a parallel, vectorized schedule:
the module's native pool runs on threads the bridge starts) run through it and are compared with numpy. The
session workers are aarch64 JVMs too (the server starts them through the host's qemu), so a segfaulting aarch64
kernel ends only its session here as well.

Uses the emulated fixtures: a skip with the reason on a machine without qemu-user/mmdebstrap/root, a failure
under CI.
"""
from __future__ import annotations

import numpy as np
import pytest

import tether
from fixtures.emulated import unavailable
from fixtures.java_device import RUN_DEVICE, require_java_device_tools
from fixtures.te_kernels import matmul, vadd_schedule
from tether import rpc, te


def start_aarch64_java_device(emulated_devices, java_device_build, tmp, *flags):
    """run_device.sh in the emulated aarch64 userland (with its JRE extra) on a free loopback port."""
    import os

    from fixtures.rpc import ServerProcess
    from tether import emulate

    require_java_device_tools()
    userland = emulated_devices.userland("aarch64")
    try:
        userland = emulate.ensure_extra(userland, "java")
    except emulate.EmulatorUnavailable as exc:
        unavailable(str(exc))
    workdir = tmp / "sessions"
    workdir.mkdir()
    env = dict(os.environ, TETHER_DEVICE_BUILD=str(java_device_build))
    env.pop("TETHER_TOKEN", None)
    return ServerProcess(["--userland", str(userland.path), "--host", "127.0.0.1", "--port", "0",
                          "--workdir", str(workdir), *flags], tmp / "server.log", env=env, start_timeout=180.0,
                         command=[str(RUN_DEVICE)])


@pytest.fixture(scope="module")
def java_aarch64_device(emulated_devices, java_device_build, tmp_path_factory):
    server = start_aarch64_java_device(emulated_devices, java_device_build, tmp_path_factory.mktemp("jdev-qemu"))
    yield server
    server.stop()


def _vadd(preset, tmp_path):
    s, args = vadd_schedule(4096, factor=8, parallel=True)
    name = "vadd_" + preset.replace("-", "_")
    path = tmp_path / (name + ".so")
    tether.build(s, args, target=preset, name=name).export_library(str(path))
    return name, path


def _matmul(preset, tmp_path):
    a, b, c = matmul(32, 24, 16)
    s = te.create_schedule(c.op)
    s[c].parallel(c.op.axis[0])
    name = "mm_" + preset.replace("-", "_")
    path = tmp_path / (name + ".so")
    tether.build(s, [a, b, c], target=preset, name=name).export_library(str(path))
    return name, path


@pytest.mark.parametrize("preset", ["android-arm64", "rasp4b"])
def test_kernels_for_arm_boards_run_in_the_aarch64_jvm(java_aarch64_device, preset, tmp_path):
    rng = np.random.default_rng(3)
    with rpc.connect(java_aarch64_device.host, java_aarch64_device.port, timeout=120) as remote:
        info = remote.get_function("tether.device_info")()
        assert info["arch"] == "aarch64" and info["java"] and info["cpu_capabilities"]["source"] == "auxv"
        assert "asimd" in info["cpu_capabilities"]["features"]
        name, path = _vadd(preset, tmp_path)
        remote.upload(path)
        mod = remote.load_module(path.name)
        assert mod.metadata["target"]["arch"] == "aarch64"
        f = mod[name]
        a, b = rng.standard_normal(4096).astype("float32"), rng.standard_normal(4096).astype("float32")
        c = np.zeros(4096, "float32")
        f(a, b, c)
        np.testing.assert_array_equal(c, a + b)
        A, B, C = remote.array(a), remote.array(b), remote.empty((4096,), "float32")
        res = f.time_evaluator(number=5, repeat=2)(A, B, C)
        assert len(res.samples) == 2 and all(s > 0 for s in res.samples)
        np.testing.assert_array_equal(C.numpy(), a + b)
        name, path = _matmul(preset, tmp_path)
        remote.upload(path)
        mm = remote.load_module(path.name)[name]
        x, y = rng.standard_normal((32, 16)).astype("float32"), rng.standard_normal((16, 24)).astype("float32")
        z = np.zeros((32, 24), "float32")
        mm(x, y, z)
        np.testing.assert_allclose(z, x @ y, rtol=1e-5, atol=1e-5)
        remote.upload(_vadd("host", tmp_path)[1])   # an x86_64 module is refused before dlopen
        with pytest.raises(tether.errors.TetherError, match="x86_64"):
            remote.load_module("vadd_host.so")


def aarch64_misc_kernels(tmp_path):
    """misc.so (crash/spin/nop, tests/fixtures/rpc.py) for aarch64, built with zig cc."""
    import subprocess
    import sys

    from fixtures.rpc import EXTRA_KERNELS
    from kernels import KERNEL_DIR, ZIG_FLAGS, ZIG_TARGETS

    src = tmp_path / "misc.c"
    src.write_text(EXTRA_KERNELS)
    misc = tmp_path / "misc.so"
    subprocess.run([sys.executable, "-m", "ziglang", "cc", *ZIG_TARGETS["aarch64"], *ZIG_FLAGS, "-I", str(KERNEL_DIR),
                    str(src), "-o", str(misc), "-Wl,--no-undefined"], check=True, timeout=180)
    return misc


def test_a_segfaulting_kernel_ends_only_its_session_under_qemu(java_aarch64_device, tmp_path):
    from tether import errors

    misc = aarch64_misc_kernels(tmp_path)
    with rpc.connect(java_aarch64_device.host, java_aarch64_device.port, timeout=120) as remote:
        remote.upload(misc)
        crash = remote.load_module("misc.so")["crash"]
        with pytest.raises(errors.SessionCrashed, match="SIGSEGV"):
            crash()
    assert java_aarch64_device.alive
    with rpc.connect(java_aarch64_device.host, java_aarch64_device.port, timeout=120) as remote:
        assert remote.get_function("tether.echo")("next") == "next"
        assert remote.listdir() == []
