"""OpenCL modules on the emulated aarch64 device, over the RPC through a real tracker.

The device is the device server (the `tether bundle` zipapp) under qemu-aarch64 in the "opencl" userland (Debian
bookworm's python3 + numpy + msgpack + pocl + the ICD loader, tether.emulate.PACKAGE_SETS), registered with an
rpc-tracker on loopback under a key. The client requests it by key, uploads modules built for `opencl -host=rasp4b`
and runs them on device arrays of the emulated device's pocl (`opencl:0`): a vector add and a tiled matmul with
shared memory, compared with numpy. The default userland (no pocl) refuses the same module in one line naming
OpenCL. Emulated timings are no performance figures: none is asserted.
"""
from __future__ import annotations

import json
import os
import pathlib

import numpy as np
import pytest
from fixtures.emulated import GPU_SESSION_TIMEOUT as SESSION_TIMEOUT
from fixtures.emulated import POCL_KEY
from fixtures.emulated import register_emulated as _register
from fixtures.gpu_kernels import matmul_gpu, vadd_gpu

import tether
from tether import emulate, errors

pytestmark = [pytest.mark.emulated]

CPU_KEY = "rasp4b-cpu"


def _vadd(n=1000, block=64):
    return vadd_gpu(n, block)


def _matmul(n=64, tile=8):
    """A tiled matmul: tile x tile threads per work-group, each k-step's tiles of A and B fetched cooperatively
    into shared memory between barriers."""
    return matmul_gpu(n, n, n, tile=tile, ktile=tile)


@pytest.fixture(scope="module")
def tracker(emulated_tracker):
    return emulated_tracker


def _request(client, key):
    return client.request(key, wait_timeout=SESSION_TIMEOUT, timeout=SESSION_TIMEOUT)


@pytest.fixture(scope="module")
def gpu_modules(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gpu-modules")
    paths = {}
    for name, make in (("vadd", _vadd), ("mm", _matmul)):
        lib = tether.build(*make(), target="opencl -host=rasp4b", name=name)
        paths[name] = lib.export_library(str(folder / ("%s.so" % name)))
    return paths


def _cache_files(folder: pathlib.Path) -> dict:
    """pocl's cache: each file and when it was written (but ``last_accessed``, which pocl touches on every hit)."""
    return {str(p.relative_to(folder)): p.stat().st_mtime_ns for p in folder.rglob("*")
            if p.is_file() and p.name != "last_accessed"}


def test_the_opencl_runtime_lists_pocl_in_the_guest(opencl_userland, emulated_bundle, tmp_path):
    """The `clinfo -l` of the guest: tether_rpc's OpenCL runtime, run by the guest python under qemu."""
    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); from tether_rpc.gpu.opencl import OpenCLDevice; "
            "print(json.dumps(OpenCLDevice.available()))")
    env = emulate.opencl_env(opencl_userland, tmp_path / "opencl", pocl_cache=tmp_path / "pocl-cache")
    proc = opencl_userland.run_python(["-c", code, str(emulated_bundle)], env=env, timeout=SESSION_TIMEOUT)
    [device] = json.loads(proc.stdout.strip().splitlines()[-1])
    assert device["api"] == "opencl" and device["type"] == "cpu", device
    assert device["platform"] == "Portable Computing Language", device
    assert "aarch64" in device["version"], device         # pocl's host string: it compiles for the guest's arch
    assert opencl_userland.stamp["package_set"] == "opencl"
    assert {"pocl-opencl-icd", "ocl-icd-libopencl1"} <= set(opencl_userland.stamp["packages"])
    assert opencl_userland.stamp["opencl_devices"], opencl_userland.stamp


def test_opencl_modules_run_on_the_emulated_device_through_the_tracker(pocl_device, tracker, gpu_modules):
    rng = np.random.default_rng(7)
    a, b = rng.standard_normal(1000, dtype=np.float32), rng.standard_normal(1000, dtype=np.float32)
    x, y = rng.standard_normal((64, 64), dtype=np.float32), rng.standard_normal((64, 64), dtype=np.float32)
    expected_mm = x.astype(np.float64) @ y.astype(np.float64)
    cache = pocl_device.pocl_cache

    def run_both(remote):
        for path in gpu_modules.values():
            remote.upload(path)
        vadd = remote.load_module("vadd.so")["vadd"]
        da, db = remote.array(a, device="opencl:0"), remote.array(b, device="opencl:0")
        dc = remote.empty((1000,), "float32", device="opencl:0")
        vadd(da, db, dc)
        np.testing.assert_array_equal(dc.numpy(), a + b)      # one IEEE add per element: exact
        mm = remote.load_module("mm.so")["mm"]
        dz = remote.empty((64, 64), "float32", device="opencl:0")
        mm(remote.array(x, device="opencl:0"), remote.array(y, device="opencl:0"), dz)
        np.testing.assert_allclose(dz.numpy(), expected_mm, rtol=1e-4, atol=1e-4)

    with tracker.client() as client, _request(client, POCL_KEY) as remote:
        info = remote.device_info()
        assert info["arch"] == "aarch64", info
        gpus = [g for g in info["gpus"] if g["api"] == "opencl"]
        assert gpus and gpus[0]["spec"] == "opencl:0" and gpus[0]["type"] == "cpu", info["gpus"]
        assert gpus[0]["platform"] == "Portable Computing Language" and info["gpu_errors"] == [], info
        run_both(remote)
    compiled = _cache_files(cache)
    assert any(name.endswith(".so") for name in compiled), compiled    # pocl's kernels, in the device's cache

    # A second session (a fresh worker process, a fresh pocl) finds both programs in the cache: nothing is
    # compiled or written again.
    with tracker.client() as client, _request(client, POCL_KEY) as remote:
        run_both(remote)
    assert _cache_files(cache) == compiled
    assert pocl_device.alive(), pocl_device.output


def test_the_default_userland_refuses_opencl_modules_in_one_line(emulated_devices, tracker, gpu_modules):
    """The CPU-only device (the default userland: no pocl, no ICD loader) refuses the module at load."""
    userland = emulated_devices.userland("aarch64")
    libdir = userland.rootfs / "usr" / "lib" / userland.spec.multiarch
    assert not list(libdir.glob("libpocl.so*")) and not list(libdir.glob("libOpenCL.so*")), \
        "the default userland must stay CPU-only"
    device = _register(userland, tracker, CPU_KEY, emulated_devices.bundle_path)
    try:
        with tracker.client() as client, _request(client, CPU_KEY) as remote:
            assert remote.device_info()["gpus"] == []
            remote.upload(gpu_modules["vadd"])
            with pytest.raises(errors.RemoteError) as info:
                remote.load_module("vadd.so")
            message = str(info.value.args[0]) if info.value.args else ""
            assert info.value.remote_type == "GpuUnavailable", message
            assert message.startswith("vadd.so runs on OpenCL; this device has no OpenCL") and "\n" not in message
            assert "libOpenCL.so.1 not found" in message, message
            assert remote.get_function("tether.echo")(5) == 5        # the session goes on
        assert device.alive(), device.output
    finally:
        device.close()


def test_userland_cache_key_includes_the_package_set(tmp_path):
    spec = emulate.arch_spec("aarch64")
    assert emulate._userland_dir(spec, tmp_path, "base") == tmp_path / "aarch64"
    assert emulate._userland_dir(spec, tmp_path, "opencl") == tmp_path / "aarch64-opencl"
    folder = tmp_path / "aarch64-opencl"
    (folder / "rootfs" / "usr" / "bin").mkdir(parents=True)
    (folder / "rootfs" / "usr" / "bin" / "python3").write_text("")
    stamp = {"recipe": emulate.RECIPE_VERSION, "packages": list(emulate.PACKAGE_SETS["base"])}
    (folder / emulate.STAMP_NAME).write_text(json.dumps(stamp))
    assert emulate.cached_userland("aarch64", cache=tmp_path, packages="opencl") is None   # another set's stamp
    stamp["packages"] = list(emulate.PACKAGE_SETS["opencl"])
    (folder / emulate.STAMP_NAME).write_text(json.dumps(stamp))
    found = emulate.cached_userland("aarch64", cache=tmp_path, packages="opencl")
    assert found is not None and found.package_set == "opencl"
    with pytest.raises(emulate.EmulationError, match="unknown userland package set 'cuda'"):
        emulate.cached_userland("aarch64", cache=tmp_path, packages="cuda")
    assert os.environ.get(emulate.POCL_CACHE_ENV) or emulate.pocl_cache_dir(found).parts[-2:] == ("pocl", "aarch64")
