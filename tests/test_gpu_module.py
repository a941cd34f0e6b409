"""GPU targets and GPU modules end to end: target strings and presets, `tether targets`, tether.build for a GPU
target (the host's library carrying the device code and its launch metadata), and loading and running such a
module through load_module on the drivers of this machine (pocl for OpenCL, lavapipe for Vulkan) against numpy.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner
from fixtures.prereq import unavailable
from fixtures.gpu_kernels import matmul_gpu, vadd_gpu

import tether
from tether.errors import CompileError
from tether.gpu_target import GPU_PRESET_NAMES, GpuTarget
from tether.kernels.registry import TARGET_KINDS, target_kind
from tether.target import PRESET_NAMES, Target, UnknownTargetError
from tether_rpc.elf import ElfFile
from tether_rpc.errors import ModuleLoadError
from tether_rpc.gpu.api import GpuUnavailable
from tether_rpc.module import load_module, read_metadata

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(ROOT, "src"), os.path.join(ROOT, "rpc_server")]))


# ---- targets --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("spec, api, device, arch", [
    ("opencl", "opencl", "generic", ""), ("opencl -device=mali", "opencl", "mali", ""),
    ("opencl -device=adreno", "opencl", "adreno", ""), ("opencl -device=intel", "opencl", "intel", ""),
    ("vulkan", "vulkan", "generic", ""), ("cuda -arch=sm_80", "cuda", "generic", "sm_80"),
    ("cuda -arch=sm_53", "cuda", "generic", "sm_53")])
def test_gpu_targets_parse_print_round_trip(spec, api, device, arch):
    t = Target(spec)
    assert (t.gpu.api, t.gpu.device, t.gpu.arch) == (api, device, arch)
    assert str(t) == spec                       # the default host ("host") is not spelled out
    assert Target(str(t)) == t and t.is_gpu and target_kind(t) == api and target_kind(spec) == api
    assert t.host == Target("host") and not t.host.is_gpu
    assert t.gpu.code_format == {"opencl": "opencl-c", "vulkan": "spirv", "cuda": "ptx"}[api]


def test_host_target_keyword_and_option():
    t = Target("opencl", host="rasp4b")
    assert t == Target("opencl -host=rasp4b") and str(t) == "opencl -host=rasp4b"
    assert (t.triple, t.cpu, t.arch, t.host) == ("aarch64-unknown-linux-gnu", "cortex-a72", "aarch64", Target("rasp4b"))
    spelled = Target("opencl -device=mali -host='aarch64-linux-gnu -mcpu=cortex-a55 -mattr=+neon'")
    assert spelled.host == Target("aarch64-linux-gnu -mcpu=cortex-a55 -mattr=+neon")
    assert Target(str(spelled)) == spelled
    assert Target(Target("vulkan"), host="rasp5").host == Target("rasp5")


def test_cpu_targets_unchanged():
    for name in PRESET_NAMES:
        t = Target(name)
        assert t.gpu is None and not t.is_gpu and t.host is t and target_kind(t) == "cpu" and target_kind(name) == "cpu"
    assert TARGET_KINDS == ("cpu", "opencl", "vulkan", "cuda")


def test_presets_with_their_host():
    want = {"rasp5-vulkan": ("vulkan", "videocore7", "", Target("rasp5")),
            "android-arm64-opencl": ("opencl", "mobile", "", Target("android-arm64")),
            "jetson-orin-cuda": ("cuda", "generic", "sm_87",
                                 Target("aarch64-linux-gnu -mcpu=cortex-a78ae -mattr=+neon")),
            "jetson-nano-cuda": ("cuda", "generic", "sm_53", Target("jetson-nano"))}
    assert set(GPU_PRESET_NAMES) == set(want)
    for name, (api, device, arch, host) in want.items():
        t = Target(name)
        assert (t.gpu.api, t.gpu.device, t.gpu.arch, t.host) == (api, device, arch, host)
        assert str(t) == name and Target(str(t)) == t
    pi5 = Target("rasp5-vulkan").gpu
    assert (pi5.version, pi5.max_threads_per_block, pi5.max_shared_bytes, pi5.subgroup_size, pi5.fp16) == (
        "1.2", 256, 16384, 16, False)
    assert Target("jetson-nano-cuda").gpu.fp16 and not Target("cuda -arch=sm_52").gpu.fp16
    moved = Target("rasp5-vulkan", host="x86_64")
    assert str(moved) == "rasp5-vulkan -host=x86_64" and Target(str(moved)) == moved


def test_limits_per_device_and_overrides():
    limits = {d: Target("opencl -device=" + d).gpu for d in ("mali", "adreno", "intel")}
    assert limits["mali"].max_threads_per_block == 256 and limits["adreno"].max_threads_per_block == 1024
    assert Target("vulkan").gpu.max_threads_per_block == 128 and Target("cuda").gpu.arch == "sm_50"
    t = Target("opencl -device=mali -max_threads_per_block=384 -fp16=0")
    assert (t.gpu.max_threads_per_block, t.gpu.fp16) == (384, False) and Target(str(t)) == t
    assert isinstance(t.gpu, GpuTarget) and t.gpu.limits()["max_shared_bytes"] == 32768


@pytest.mark.parametrize("spec, words", [
    ("opencl -device=foo", ["unknown opencl device 'foo'", "mali"]),
    ("vulkan -device=mali", ["unknown vulkan device 'mali'", "videocore7"]),
    ("cuda -arch=sm_35", ["bad -arch=sm_35", "sm_XX"]), ("cuda -arch=80", ["bad -arch=80"]),
    ("opencl -arch=sm_80", ["-arch is for cuda"]), ("opencl -bogus=1", ["unknown option '-bogus=1'"]),
    ("opencl -max_threads_per_block=0", ["positive integer"]), ("cuda -arch=sm_52 -fp16=1", ["sm_52"]),
    ("opencl -host=vulkan", ["must be a CPU target"]), ("opencl -host=wasm32", ["wasm32"]),
    ("metal", ["unknown target preset 'metal'", "opencl"])])
def test_bad_gpu_targets_refused_in_one_line(spec, words):
    with pytest.raises(UnknownTargetError) as info:
        Target(spec)
    message = str(info.value)
    assert "\n" not in message and all(w in message for w in words), message


def test_host_keyword_is_for_gpu_targets():
    with pytest.raises(UnknownTargetError, match="host=.* is for GPU targets"):
        Target("rasp4b", host="x86_64")


def test_targets_command_lists_gpu_targets_presets_and_apis():
    from tether.cli.main import cli

    result = CliRunner().invoke(cli, ["targets", "--gpu", "--plain"])
    assert result.exit_code == 0, result.output
    rows = [line.split("\t") for line in result.output.strip().splitlines()]
    presets = {r[1]: r[2] for r in rows if r[0] == "gpu-preset"}
    assert presets == {"rasp5-vulkan": "rasp5", "android-arm64-opencl": "android-arm64",
                       "jetson-orin-cuda": "aarch64-unknown-linux-gnu -mcpu=cortex-a78ae -mattr=+neon",
                       "jetson-nano-cuda": "jetson-nano"}
    assert {"opencl -device=mali", "opencl -device=adreno", "vulkan", "cuda -arch=sm_XX"} <= {
        r[1] for r in rows if r[0] == "gpu"}
    apis = {r[1]: r[2] for r in rows if r[0] == "gpu-api"}
    assert set(apis) == {"opencl", "vulkan", "cuda"}
    assert all(have.startswith("none (") or have.startswith("0: ") for have in apis.values()), apis
    full = CliRunner().invoke(cli, ["targets"])
    assert full.exit_code == 0 and "rasp5-vulkan" in full.output and "GPU APIs on this machine" in full.output


# ---- building -------------------------------------------------------------------------------------------------
def _vadd(n=1000, block=64):
    return vadd_gpu(n, block)


def _matmul(n=64, tile=8):
    """A tiled matmul: tile x tile threads per work-group, each k-step's tiles of A and B fetched cooperatively
    into shared memory between barriers."""
    return matmul_gpu(n, n, n, tile=tile, ktile=tile)


def _export(lib, tmp_path, name):
    return lib.export_library(str(tmp_path / ("%s.so" % name)))


def test_opencl_module_layout(tmp_path):
    s, args = _vadd()
    lib = tether.build(s, args, target="opencl -host=rasp4b", name="vadd")
    path = _export(lib, tmp_path, "vadd")
    meta = read_metadata(path)
    assert meta["functions"] == [] and meta["target"]["preset"] == "rasp4b" and meta["target"]["arch"] == "aarch64"
    dev = meta["device"]
    assert (dev["api"], dev["format"], dev["target"]) == ("opencl", "opencl-c", "opencl -host=rasp4b")
    assert dev["gpu"]["max_threads_per_block"] == 256
    [kernel] = dev["kernels"]
    assert (kernel["grid"], kernel["block"]) == ([16, 1, 1], [64, 1, 1])
    [fn] = dev["functions"]
    assert [a["name"] for a in fn["args"]] == ["A", "B", "C"] and fn["outputs"] == [2]
    assert fn["launches"] == [{"kernel": kernel["name"], "args": [0, 1, 2]}] and fn["temporaries"] == []
    with ElfFile(path) as elf:
        code = elf.section_data(".tether_device")[:dev["code_bytes"]]
        assert "__tether_device_code" in elf.exported_symbols and elf.machine_name == "aarch64"
    assert hashlib.sha256(code).hexdigest() == dev["code_sha256"] and code == lib.device_code
    assert b"__kernel" in code and kernel["name"].encode() in code
    assert lib.function_names == ["vadd"] and json.loads(lib.get_source("meta"))["device"] == dev


def test_work_group_over_the_target_limit_refused_at_build():
    s, args = _vadd(n=1024, block=512)
    with pytest.raises(Exception) as info:
        tether.build(s, args, target="opencl -device=mali", name="big")
    assert "512" in str(info.value) and "256" in str(info.value), str(info.value)
    tether.build(*_vadd(n=1024, block=512), target="opencl -device=adreno", name="big")   # adreno: 1024


def test_cuda_module_builds_without_a_gpu(tmp_path):
    s, args = _matmul()
    lib = tether.build(s, args, target="cuda -arch=sm_80", name="mm")
    meta = read_metadata(_export(lib, tmp_path, "mm"))
    dev = meta["device"]
    assert (dev["api"], dev["format"], dev["gpu"]["arch"]) == ("cuda", "ptx", "sm_80")
    ptx = lib.device_code.decode()
    assert ".target sm_80" in ptx and ".entry " + dev["kernels"][0]["name"] in ptx and ".shared" in ptx
    assert dev["kernels"][0]["shared_bytes"] == 2 * 8 * 8 * 4 and dev["kernels"][0]["block"] == [8, 8, 1]
    from tether_rpc.gpu.module import available_apis

    if isinstance(available_apis()["cuda"], str):    # no NVIDIA driver here: refused in one line naming CUDA
        with pytest.raises(GpuUnavailable) as info:
            load_module(str(tmp_path / "mm.so"))
        assert str(info.value).startswith("mm.so runs on CUDA; ") and "\n" not in str(info.value)


# ---- running ----------------------------------------------------------------------------------------------------
def _require(api: str, package: str) -> None:
    from tether_rpc.gpu.module import available_apis

    found = available_apis()[api]
    if isinstance(found, str):
        unavailable("a %s device (%s)" % (api, found), "apt-get install " + package)


@pytest.fixture(scope="module")
def opencl_modules(tmp_path_factory):
    _require("opencl", "pocl-opencl-icd ocl-icd-libopencl1")
    folder = tmp_path_factory.mktemp("opencl")
    return {name: _export(tether.build(*make(), target="opencl", name=name), folder, name)
            for name, make in (("vadd", _vadd), ("mm", _matmul))}


def test_opencl_vector_add_on_pocl(opencl_modules):
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal(1000, dtype=np.float32), rng.standard_normal(1000, dtype=np.float32)
    c = np.zeros(1000, np.float32)
    m = load_module(opencl_modules["vadd"])
    try:
        assert m.function_names == ["vadd"] and m.gpu is not None and m.gpu.device.name == "opencl"
        m["vadd"](a, b, c)
        np.testing.assert_array_equal(c, a + b)     # (one IEEE add per element: exact)
        before = a.copy()
        m["vadd"](a, b, c)
        np.testing.assert_array_equal(a, before)   # an input is not written back
        with pytest.raises(Exception, match="argument 2 .C. must be a C-contiguous float32 array of shape"):
            m["vadd"](a, b, np.zeros(999, np.float32))
        with pytest.raises(Exception, match="takes 3 arguments"):
            m["vadd"](a, b)
    finally:
        m.close()


def test_opencl_tiled_matmul_on_pocl(opencl_modules):
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((64, 64), dtype=np.float32), rng.standard_normal((64, 64), dtype=np.float32)
    c = np.full((64, 64), np.nan, np.float32)
    m = load_module(opencl_modules["mm"])
    try:
        m["mm"](a, b, c)
        np.testing.assert_allclose(c, a.astype(np.float64) @ b.astype(np.float64), rtol=1e-4, atol=1e-4)
    finally:
        m.close()


def test_opencl_module_takes_device_buffers(opencl_modules):
    """Arrays already on the device (anything with a DeviceBuffer .buffer, .shape, .dtype) are passed as they
    are: nothing is copied but what the test uploads and downloads itself."""
    m = load_module(opencl_modules["vadd"])
    try:
        dev = m.gpu.device
        host = [np.arange(1000, dtype=np.float32), np.full(1000, 0.5, np.float32), np.zeros(1000, np.float32)]

        class Arr:   # the shape of tether_rpc.gpu.array.DeviceArray
            def __init__(self, x):
                self.shape, self.dtype, self.buffer = x.shape, x.dtype.name, dev.alloc(x.nbytes)
                dev.upload(self.buffer, x)

        arrays = [Arr(x) for x in host]
        m["vadd"](*arrays)
        out = np.empty(1000, np.float32)
        dev.download(arrays[2].buffer, out)
        np.testing.assert_array_equal(out, host[0] + host[1])
        for x in arrays:
            dev.free(x.buffer)
    finally:
        m.close()


def test_module_without_opencl_refused_in_one_line(opencl_modules):
    code = ("import sys; from tether_rpc.module import load_module\n"
            "try:\n    load_module(sys.argv[1])\n"
            "except Exception as e:\n    print(type(e).__name__ + ': ' + str(e)); sys.exit(3)\n")
    env = dict(ENV, TETHER_OPENCL_LIBRARY="/nonexistent/libOpenCL.so.1")
    out = subprocess.run([sys.executable, "-c", code, opencl_modules["vadd"]], capture_output=True, text=True,
                         env=env, timeout=120)
    assert out.returncode == 3, out.stdout + out.stderr
    line = out.stdout.strip()
    assert "\n" not in line and line.startswith("GpuUnavailable: vadd.so runs on OpenCL;"), line
    assert "/nonexistent/libOpenCL.so.1" in line, line


def test_module_needing_fp16_refused_on_a_device_without_it(tmp_path, opencl_modules):
    """pocl's CPU device has no cl_khr_fp16: a module whose kernel needs it is refused at load, naming both."""
    from tether_rpc.gpu.module import available_apis

    if any("cl_khr_fp16" in d.get("extensions", ()) for d in available_apis()["opencl"]):
        pytest.skip("this machine's OpenCL device has fp16")
    from tether.gpu_build import build_programs, split_functions

    tgt = Target("opencl -fp16=1")
    [program] = split_functions([tether.lower(*_vadd(), name="half")], tgt)
    program.kernels[0].needs = frozenset({"fp16"})       # as a backend records it for half arithmetic
    path = _export(build_programs([program], tgt, "half"), tmp_path, "half")
    assert read_metadata(path)["device"]["needs"] == ["fp16"]
    with pytest.raises(GpuUnavailable) as info:
        load_module(path)
    assert "half.so" in str(info.value) and "fp16" in str(info.value) and "\n" not in str(info.value)
    [program] = split_functions([tether.lower(*_vadd(), name="half")], Target("opencl"))
    program.kernels[0].needs = frozenset({"fp16"})
    with pytest.raises(CompileError, match="does not promise"):     # a target without fp16 refuses it at build
        build_programs([program], Target("opencl"), "half")


def test_corrupt_device_code_refused(tmp_path, opencl_modules):
    data = bytearray(open(opencl_modules["vadd"], "rb").read())
    with ElfFile(opencl_modules["vadd"]) as elf:
        sec = elf.section(".tether_device")
    data[sec.offset + 10] ^= 0xFF
    bad = tmp_path / "bad.so"
    bad.write_bytes(bytes(data))
    with pytest.raises(ModuleLoadError, match="bad.so: the device code .* does not match"):
        load_module(str(bad))


def test_vulkan_vector_add_and_tiled_matmul_on_lavapipe(tmp_path):
    _require("vulkan", "mesa-vulkan-drivers libvulkan1")
    rng = np.random.default_rng(2)
    vadd = _export(tether.build(*_vadd(n=1000, block=64), target="vulkan", name="vadd"), tmp_path, "vadd")
    mm = _export(tether.build(*_matmul(), target="vulkan", name="mm"), tmp_path, "mm")
    assert read_metadata(mm)["device"]["format"] == "spirv"
    a, b = rng.standard_normal(1000, dtype=np.float32), rng.standard_normal(1000, dtype=np.float32)
    x, y = rng.standard_normal((64, 64), dtype=np.float32), rng.standard_normal((64, 64), dtype=np.float32)
    m, n = load_module(vadd), load_module(mm)
    try:
        assert m.gpu.device.name == "vulkan"
        c = np.zeros(1000, np.float32)
        m["vadd"](a, b, c)
        np.testing.assert_array_equal(c, a + b)
        z = np.full((64, 64), np.nan, np.float32)
        n["mm"](x, y, z)
        np.testing.assert_allclose(z, x.astype(np.float64) @ y.astype(np.float64), rtol=1e-4, atol=1e-4)
    finally:
        m.close()
        n.close()


def test_opencl_module_over_a_session_with_device_arrays(opencl_modules):
    """Through a session (in-process, the same code as the rpc-server's): the module runs on the session's
    opencl:0, the device its arrays live on; host arrays are uploaded and downloaded."""
    from tether.rpc.local import LocalSession

    a, b = np.arange(1000, dtype=np.float32), np.full(1000, 2.0, np.float32)
    with LocalSession() as s:
        s.upload(opencl_modules["vadd"])
        vadd = s.load_module("vadd.so")["vadd"]
        da, db = s.array(a, device="opencl:0"), s.array(b, device="opencl:0")
        dc = s.empty((1000,), "float32", device="opencl:0")
        vadd(da, db, dc)
        np.testing.assert_array_equal(dc.numpy(), a + b)
        hc = s.empty((1000,), "float32")
        vadd(s.array(a), s.array(b), hc)
        np.testing.assert_array_equal(hc.numpy(), a + b)
