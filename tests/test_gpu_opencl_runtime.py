"""The OpenCL device API (tether_rpc.gpu.opencl) on a real driver: pocl's CPU device through the ICD loader.

Kernels here are hand-written OpenCL C; results are compared with numpy. Errors come from the driver itself
(its build log, its CL error codes) except where the runtime refuses on purpose before calling it.
"""
from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from fixtures.prereq import unavailable
from tether_rpc.errors import ModuleLoadError
from tether_rpc.gpu.api import DeviceBuffer, GpuBuildError, GpuError, GpuUnavailable
from tether_rpc.gpu.opencl import NEEDS_EXTENSIONS, OpenCLDevice, error_name

ROOT = Path(__file__).resolve().parents[1]
POCL_PLATFORM = "Portable Computing Language"
INSTALL = "apt-get install pocl-opencl-icd ocl-icd-libopencl1"

VECTOR_ADD = b"""
__kernel void vadd(__global const float* a, __global const float* b, __global float* c, int n) {
    int i = get_global_id(0);
    if (i < n) c[i] = a[i] + b[i];
}
__kernel void axpy(__global float* y, __global const float* x, float alpha, int n) {
    int i = get_global_id(0);
    if (i < n) y[i] = alpha * x[i] + y[i];
}
__kernel void index2d(__global int* out, int width) {
    int x = get_global_id(0), y = get_global_id(1);
    out[y * width + x] = x + 1000 * y + 1000000 * (int)get_group_id(1) + 100000000 * (int)get_local_id(0);
}
"""

# one partial sum per work-group of 128 threads: a tree reduction in work-group memory, a barrier per level
REDUCE = b"""
__kernel void block_sum(__global const float* x, __global float* partial, int n) {
    __local float tmp[128];
    int lid = get_local_id(0);
    int i = get_global_id(0);
    tmp[lid] = i < n ? x[i] : 0.0f;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int stride = 64; stride > 0; stride >>= 1) {
        if (lid < stride) tmp[lid] += tmp[lid + stride];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (lid == 0) partial[get_group_id(0)] = tmp[0];
}
"""


def _info(name, block=(1, 1, 1), needs=(), shared_bytes=0):
    """A launch_info dict as tether.tir.device.DeviceKernel.launch_info writes it."""
    return {"name": name, "grid": [1, 1, 1], "block": list(block), "params": [], "scalars": [],
            "shared_bytes": shared_bytes, "needs": sorted(needs)}


def _pocl_index() -> int:
    for info in OpenCLDevice.available():
        if info["platform"] == POCL_PLATFORM:
            return info["index"]
    unavailable("pocl's OpenCL device (OpenCLDevice.available() lists %s)"
                % ([i["name"] for i in OpenCLDevice.available()] or "none"), INSTALL)


@pytest.fixture(scope="module")
def dev():
    device = OpenCLDevice(_pocl_index())
    yield device
    device.close()


def _run(code: str, **env_extra: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT / "rpc_server")]), **env_extra)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=env, timeout=300)


# --- info -------------------------------------------------------------------------------------------------------
def test_info_fields_are_sane(dev):
    info = dev.info()
    assert info["platform"] == POCL_PLATFORM and info["type"] == "cpu" and info["api"] == "opencl"
    assert info["name"] and info["vendor"] and info["driver"]
    assert info["version"].startswith("OpenCL ") and info["opencl_c_version"].startswith("OpenCL C ")
    assert info["compute_units"] >= 1 and info["memory_bytes"] > 0 and info["max_alloc_bytes"] > 0
    assert info["max_threads_per_block"] >= 1 and info["shared_memory_bytes"] > 0
    assert len(info["max_block"]) == 3 and all(b >= 1 for b in info["max_block"])
    assert all(isinstance(e, str) and e.startswith("cl_") for e in info["extensions"])
    assert "cl_khr_byte_addressable_store" in info["extensions"]   # pocl has it; proves the list is read
    assert info["fp16"] == ("cl_khr_fp16" in info["extensions"])
    assert info["int8_dot"] == any(e in info["extensions"] for e in NEEDS_EXTENSIONS["int8_dot"])
    assert info["il"] is None or isinstance(info["il"], str)
    assert info == OpenCLDevice.available()[info["index"]]
    json.dumps(info)   # device_info ships it over msgpack/JSON


def test_work_group_limit_is_the_drivers(dev):
    """max_threads_per_block is the limit the driver enforces: a launch one thread over it is refused by
    clEnqueueNDRangeKernel itself (the load-time check is bypassed by launching without launch_info)."""
    limit = dev.info()["max_threads_per_block"]
    program = dev.load(VECTOR_ADD)
    bufs = [dev.alloc(4 * (limit + 1)) for _ in range(3)]
    try:
        with pytest.raises(GpuError) as exc:
            dev.launch(program, "vadd", bufs + [limit + 1], (1, 1, 1), (limit + 1, 1, 1))
        assert "clEnqueueNDRangeKernel" in str(exc.value) and "CL_INVALID_WORK_GROUP_SIZE" in str(exc.value)
    finally:
        for b in bufs:
            dev.free(b)


# --- memory -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["float32", "float16", "float64", "int8", "uint8", "int32", "int64", "bool"])
@pytest.mark.parametrize("count", [0, 1, 7, 4099, (1 << 18) + 3])
def test_upload_download_round_trip(dev, dtype, count):
    rng = np.random.default_rng(count)
    host = (rng.standard_normal(count) * 100).astype(dtype)
    offset = 64
    buf = dev.alloc(host.nbytes + offset)
    try:
        assert buf.nbytes == host.nbytes + offset and isinstance(buf, DeviceBuffer)
        dev.upload(buf, host, offset=offset)
        out = np.full(count, 1, dtype)
        dev.download(buf, out, offset=offset)
        np.testing.assert_array_equal(out, host)
    finally:
        dev.free(buf)


def test_zero_byte_buffer(dev):
    buf = dev.alloc(0)   # backed by one byte: an empty tensor still passes a valid cl_mem to kernels
    assert buf.nbytes == 0
    dev.upload(buf, np.zeros(0, np.float32))
    dev.download(buf, np.zeros(0, np.float32))
    dev.copy(buf, buf, 0)
    with pytest.raises(ValueError, match="do not fit a buffer of 0 bytes"):
        dev.upload(buf, np.zeros(1, np.float32))
    dev.free(buf)
    dev.free(buf)   # a second free does nothing


def test_copy_with_offsets(dev):
    a = np.arange(1000, dtype=np.int32)
    b = np.full(1000, -1, np.int32)
    src, dst = dev.alloc(a.nbytes), dev.alloc(b.nbytes)
    try:
        dev.upload(src, a)
        dev.upload(dst, b)
        dev.copy(dst, src, 40 * 4, dst_offset=100 * 4, src_offset=7 * 4)
        dev.copy(dst, dst, 10 * 4, dst_offset=0, src_offset=500 * 4)   # within one buffer, no overlap
        b[100:140] = a[7:47]
        b[0:10] = b[500:510]
        out = np.empty_like(b)
        dev.download(dst, out)
        np.testing.assert_array_equal(out, b)
        with pytest.raises(ValueError, match="copy source: bytes"):
            dev.copy(dst, src, 8, src_offset=a.nbytes - 4)
        with pytest.raises(GpuError, match="clEnqueueCopyBuffer.*CL_MEM_COPY_OVERLAP"):
            dev.copy(dst, dst, 400, dst_offset=0, src_offset=200)
    finally:
        dev.free(src)
        dev.free(dst)


def test_alloc_over_the_drivers_limit(dev):
    limit = dev.info()["max_alloc_bytes"]
    with pytest.raises(GpuError) as exc:
        dev.alloc(limit + 1)
    assert "clCreateBuffer" in str(exc.value) and "CL_INVALID_BUFFER_SIZE" in str(exc.value)
    assert str(limit) in str(exc.value)
    with pytest.raises(ValueError, match="byte count >= 0"):
        dev.alloc(-1)


def test_a_forked_child_cannot_use_its_parents_device(dev):
    """The driver's threads do not survive fork: the child is refused at once instead of hanging."""
    buf = dev.alloc(16)
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        message = b"no error"
        try:
            dev.upload(buf, np.zeros(4, np.float32))
        except GpuError as exc:
            message = str(exc).encode()
        finally:
            os.write(write_fd, message)
            os._exit(0)
    os.close(write_fd)
    try:
        ready, _, _ = select.select([read_fd], [], [], 120)   # bounded: a child hung in the driver is killed
        message = os.read(read_fd, 4096).decode() if ready else "the child hung"
    finally:
        os.close(read_fd)
        if not ready:
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    assert message == "opencl:%d was opened by process %d; a forked child must open its own device" % (
        dev.index, os.getpid())
    dev.upload(buf, np.ones(4, np.float32))   # the parent's device is untouched by the child's exit
    out = np.zeros(4, np.float32)
    dev.download(buf, out)
    np.testing.assert_array_equal(out, 1)
    dev.free(buf)


def test_download_refuses_a_non_contiguous_array(dev):
    buf = dev.alloc(64)
    try:
        with pytest.raises(ValueError, match="C-contiguous"):
            dev.download(buf, np.zeros((4, 4), np.float32)[:, ::2])
    finally:
        dev.free(buf)


# --- kernels ----------------------------------------------------------------------------------------------------
def test_vector_add_and_float_scalar(dev):
    n, block = 1000, 64
    grid = (n + block - 1) // block
    program = dev.load(VECTOR_ADD, [_info("vadd", (block, 1, 1)), _info("axpy", (block, 1, 1))])
    assert dev.load(VECTOR_ADD, [_info("vadd", (block, 1, 1))]) is program   # built once
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    ba, bb, bc = (dev.alloc(4 * n) for _ in range(3))
    try:
        dev.upload(ba, a)
        dev.upload(bb, b)
        dev.launch(program, "vadd", [ba, bb, bc, n], (grid, 1, 1), (block, 1, 1))
        dev.launch(program, "axpy", [bc, ba, 0.5, n], (grid, 1, 1), (block, 1, 1))
        dev.synchronize()
        out = np.empty(n, np.float32)
        dev.download(bc, out)
        np.testing.assert_array_equal(out, np.float32(0.5) * a + (a + b))
    finally:
        for buf in (ba, bb, bc):
            dev.free(buf)


def test_threads_share_one_device(dev):
    """The queue and the cached kernels are shared: concurrent launches from threads each get their own result
    (the arguments of one launch are not mixed with another's)."""
    import threading

    program = dev.load(VECTOR_ADD)
    n, rounds, failures = 4096, 20, []

    def work(seed: int) -> None:
        rng = np.random.default_rng(seed)
        bufs = [dev.alloc(4 * n) for _ in range(3)]
        try:
            for _ in range(rounds):
                a, b = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
                dev.upload(bufs[0], a)
                dev.upload(bufs[1], b)
                dev.launch(program, "vadd", bufs + [n], (n // 64, 1, 1), (64, 1, 1))
                out = np.empty(n, np.float32)
                dev.download(bufs[2], out)
                if not np.array_equal(out, a + b):
                    failures.append(seed)
        except Exception as exc:   # reported below: an exception in a thread would otherwise vanish
            failures.append(repr(exc))
        finally:
            for buf in bufs:
                dev.free(buf)

    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not any(t.is_alive() for t in threads) and failures == []


def test_dropped_buffers_are_released(dev):
    import gc

    before = dev.allocated_bytes()
    bufs = [dev.alloc(1 << 16) for _ in range(50)]
    assert dev.allocated_bytes() == before + 50 * (1 << 16)
    dev.free(bufs.pop())
    assert dev.allocated_bytes() == before + 49 * (1 << 16)
    del bufs
    gc.collect()
    assert dev.allocated_bytes() == before


def test_two_dimensional_launch(dev):
    """grid and block map to OpenCL's global = grid * block and local = block per dimension."""
    grid, block = (3, 2, 1), (4, 5, 1)
    width, height = grid[0] * block[0], grid[1] * block[1]
    program = dev.load(VECTOR_ADD, [_info("index2d", block)])
    out_buf = dev.alloc(4 * width * height)
    try:
        dev.launch(program, "index2d", [out_buf, width], grid, block)
        out = np.empty((height, width), np.int32)
        dev.download(out_buf, out)
        y, x = np.mgrid[0:height, 0:width]
        np.testing.assert_array_equal(out, x + 1000 * y + 1000000 * (y // block[1]) + 100000000 * (x % block[0]))
    finally:
        dev.free(out_buf)


def test_local_memory_reduction_with_barrier(dev):
    n, block = 5000, 128
    groups = (n + block - 1) // block
    program = dev.load(REDUCE, [_info("block_sum", (block, 1, 1), shared_bytes=4 * block)])
    x = np.random.default_rng(1).standard_normal(n).astype(np.float32)
    bx, bp = dev.alloc(x.nbytes), dev.alloc(4 * groups)
    try:
        dev.upload(bx, x)
        dev.launch(program, "block_sum", [bx, bp, n], (groups, 1, 1), (block, 1, 1))
        partial = np.empty(groups, np.float32)
        dev.download(bp, partial)
        padded = np.zeros(groups * block, np.float32)
        padded[:n] = x
        expected = padded.reshape(groups, block).astype(np.float64).sum(axis=1)
        np.testing.assert_allclose(partial, expected, rtol=1e-5, atol=1e-5)
        seconds = dev.timed(program, "block_sum", [bx, bp, n], (groups, 1, 1), (block, 1, 1))
        assert isinstance(seconds, float) and seconds > 0
    finally:
        dev.free(bx)
        dev.free(bp)


def test_empty_grid_runs_nothing(dev):
    program = dev.load(VECTOR_ADD)
    bufs = [dev.alloc(0) for _ in range(3)]
    dev.launch(program, "vadd", bufs + [0], (0, 1, 1), (64, 1, 1))
    assert dev.timed(program, "vadd", bufs + [0], (0, 1, 1), (64, 1, 1)) == 0.0
    for b in bufs:
        dev.free(b)


# --- errors -----------------------------------------------------------------------------------------------------
def test_build_error_carries_the_compilers_log(dev):
    with pytest.raises(GpuBuildError) as exc:
        dev.load(b"__kernel void broken(__global float* a) { a[0] = undefined_thing_42; }", [_info("broken")])
    message = str(exc.value)
    assert isinstance(exc.value, ModuleLoadError)
    assert "CL_BUILD_PROGRAM_FAILURE" in message and "undefined_thing_42" in message and "broken" in message


def test_unknown_kernel_name(dev):
    with pytest.raises(GpuError, match="clCreateKernel\\(nope\\).*CL_INVALID_KERNEL_NAME"):
        dev.load(VECTOR_ADD, [_info("nope")])


def test_wrong_argument_count_and_types(dev):
    src = VECTOR_ADD + b"\n// a distinct program: fresh kernels, no arguments left from other tests\n"
    program = dev.load(src)
    bufs = [dev.alloc(256) for _ in range(3)]
    try:
        with pytest.raises(GpuError) as exc:   # one too many: the driver refuses index 4
            dev.launch(program, "vadd", bufs + [64, 1], (1, 1, 1), (64, 1, 1))
        assert "clSetKernelArg(vadd, 4)" in str(exc.value) and "CL_INVALID_ARG_INDEX" in str(exc.value)
        assert "takes 4 arguments, 5 given" in str(exc.value)
        with pytest.raises(GpuError) as exc:   # a float where the driver expects a pointer
            dev.launch(program, "vadd", [bufs[0], 1.5, bufs[2], 64], (1, 1, 1), (64, 1, 1))
        assert "clSetKernelArg(vadd, 1)" in str(exc.value) and "CL_INVALID_ARG_SIZE" in str(exc.value)
        dev.launch(program, "vadd", bufs + [64], (1, 1, 1), (64, 1, 1))
        with pytest.raises(GpuError) as exc:   # one too few, after a launch whose arguments the kernel keeps
            dev.launch(program, "vadd", bufs, (1, 1, 1), (64, 1, 1))
        assert "clEnqueueNDRangeKernel(vadd)" in str(exc.value) and "CL_INVALID_KERNEL_ARGS" in str(exc.value)
        with pytest.raises(ValueError, match="does not fit the kernel's int32"):
            dev.launch(program, "vadd", bufs + [1 << 31], (1, 1, 1), (64, 1, 1))
        with pytest.raises(ValueError, match="expected a DeviceBuffer, int or float, got str"):
            dev.launch(program, "vadd", bufs + ["64"], (1, 1, 1), (64, 1, 1))
        dev.synchronize()
    finally:
        for b in bufs:
            dev.free(b)


def test_limits_and_features_refused_at_load(dev):
    info = dev.info()
    limit = info["max_threads_per_block"]
    with pytest.raises(ModuleLoadError) as exc:
        dev.load(VECTOR_ADD, [_info("vadd", (limit * 2, 1, 1))])
    message = str(exc.value)
    assert "vadd" in message and str(limit * 2) in message and str(limit) in message
    assert "CL_DEVICE_MAX_WORK_GROUP_SIZE" in message and "\n" not in message
    with pytest.raises(ModuleLoadError, match="CL_DEVICE_LOCAL_MEM_SIZE"):
        dev.load(VECTOR_ADD, [_info("vadd", shared_bytes=info["shared_memory_bytes"] + 1)])
    for need, extensions in NEEDS_EXTENSIONS.items():
        has = any(e in info["extensions"] for e in extensions)
        if has:
            dev.load(VECTOR_ADD, [_info("vadd", needs=[need])])
        else:
            with pytest.raises(GpuUnavailable) as exc:
                dev.load(VECTOR_ADD, [_info("vadd", needs=[need])])
            assert need in str(exc.value) and extensions[0] in str(exc.value) and "vadd" in str(exc.value)
    with pytest.raises(GpuUnavailable, match="'tensor_cores', a feature the OpenCL runtime does not know"):
        dev.load(VECTOR_ADD, [_info("vadd", needs=["tensor_cores"])])


def test_required_work_group_size_is_checked_at_load(dev):
    src = b"""__kernel __attribute__((reqd_work_group_size(64, 2, 1)))
void fixed(__global int* out) { out[get_global_id(1) * 64 + get_global_id(0)] = (int)get_local_size(1); }"""
    program = dev.load(src, [_info("fixed", (64, 2, 1))])
    buf = dev.alloc(4 * 64 * 2)
    try:
        dev.launch(program, "fixed", [buf], (1, 1, 1), (64, 2, 1))
        out = np.zeros(128, np.int32)
        dev.download(buf, out)
        np.testing.assert_array_equal(out, 2)
    finally:
        dev.free(buf)
    with pytest.raises(ModuleLoadError, match=r"fixed: launched with block \(32, 4, 1\), but its source requires "
                                              r"\(64, 2, 1\) \(reqd_work_group_size\)"):
        dev.load(src, [_info("fixed", (32, 4, 1))])


def test_error_names():
    assert error_name(-52) == "CL_INVALID_KERNEL_ARGS" and error_name(-11) == "CL_BUILD_PROGRAM_FAILURE"
    assert error_name(-9999) == "CL error -9999"


def test_close_releases_and_is_idempotent():
    device = OpenCLDevice(_pocl_index())
    buf = device.alloc(1024)
    kept = device.alloc(16)
    device.load(REDUCE)
    device.free(buf)
    device.close()
    device.close()
    with pytest.raises(GpuError, match="closed"):
        device.alloc(8)
    with pytest.raises(GpuError, match="opencl:%d is closed" % device.index):
        device.upload(kept, np.zeros(4, np.float32))
    device.free(kept)   # after close: nothing left to release


def test_buffer_of_another_device_is_refused(dev):
    other = OpenCLDevice(_pocl_index())
    try:
        buf = other.alloc(16)
        with pytest.raises(ValueError, match="expected a DeviceBuffer of opencl"):
            dev.upload(buf, np.zeros(4, np.float32))
    finally:
        other.close()


# --- no OpenCL --------------------------------------------------------------------------------------------------
def test_missing_library_names_the_path():
    result = _run("""
        from tether_rpc.gpu.opencl import OpenCLDevice
        from tether_rpc.gpu.api import GpuUnavailable
        from tether_rpc.device_info import device_info
        print(OpenCLDevice.available(), [g for g in device_info()["gpus"] if g["api"] == "opencl"])
        try:
            OpenCLDevice(0)
        except GpuUnavailable as exc:
            print("GpuUnavailable:", exc)
    """, TETHER_OPENCL_LIBRARY="/nonexistent/libOpenCL.so")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "[] []"
    assert lines[1] == ("GpuUnavailable: this device has no OpenCL: /nonexistent/libOpenCL.so not found "
                        "(named by TETHER_OPENCL_LIBRARY)")


def test_library_candidates(monkeypatch):
    from tether_rpc.gpu.opencl import LIBRARY_ENV, library_candidates

    monkeypatch.delenv(LIBRARY_ENV, raising=False)
    paths = library_candidates()
    assert paths[:2] == ("libOpenCL.so.1", "libOpenCL.so") and "/vendor/lib64/libOpenCL.so" in paths
    assert not any("/lib/" in p for p in paths[2:])   # this 64-bit process cannot load 32-bit vendor libraries
    monkeypatch.setenv(LIBRARY_ENV, "/opt/vendor/libOpenCL.so")
    assert library_candidates() == ("/opt/vendor/libOpenCL.so",)


def test_no_driver_is_no_platform():
    """The ICD loader present, no driver registered: no platform, and a line saying where drivers are read."""
    result = _run("""
        from tether_rpc.gpu.opencl import OpenCLDevice
        from tether_rpc.gpu.api import GpuUnavailable
        print(OpenCLDevice.available())
        try:
            OpenCLDevice(0)
        except GpuUnavailable as exc:
            print("GpuUnavailable:", exc)
    """, OCL_ICD_VENDORS="/nonexistent-vendors", OCL_ICD_FILENAMES="")
    _pocl_index()
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == "[]"
    assert "lists no platform with a device" in result.stdout


# --- device_info ------------------------------------------------------------------------------------------------
def test_device_info_lists_pocl():
    _pocl_index()
    result = _run("""
        import json
        from tether_rpc.device_info import device_info
        from tether_rpc.gpu.opencl import library_loaded
        info = device_info()
        # listed in a forked child: the driver stays out of this process (the server forks its workers)
        print(json.dumps({"gpus": info["gpus"], "errors": info["gpu_errors"], "loaded": library_loaded()}))
    """)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["errors"] == [] and out["loaded"] is False
    pocl = [g for g in out["gpus"] if g["api"] == "opencl" and g["platform"] == POCL_PLATFORM]
    assert len(pocl) == 1 and pocl[0].pop("spec") == "opencl:%d" % pocl[0]["index"]
    assert pocl[0] == json.loads(json.dumps(OpenCLDevice.available()[pocl[0]["index"]]))


def test_device_info_in_a_process_using_opencl(dev):
    from tether_rpc import device_info as di

    di._gpu_listing.clear()
    gpus, errors = di.gpu_devices()
    assert errors == [] and dict(dev.info(), spec="opencl:%d" % dev.index) in gpus


@pytest.fixture(scope="module")
def broken_drivers(tmp_path_factory):
    """Two libraries with every OpenCL function this runtime calls, whose clGetPlatformIDs hangs (spins) or
    crashes: the drivers device_info must survive. Built with zig cc, no libc."""
    from fixtures.prereq import require_module
    from tether_rpc.gpu import opencl

    require_module("ziglang")
    from tether import cc

    folder = tmp_path_factory.mktemp("broken-opencl")
    stubs = "\n".join("int %s(void) { return -30; }" % name for name in opencl.FUNCTIONS
                      if name != "clGetPlatformIDs")
    source = folder / "broken_cl.c"
    source.write_text(stubs + """
int clGetPlatformIDs(unsigned n, void **platforms, unsigned *count) {
#ifdef HANG
    for (volatile unsigned long i = 0;; i++) {}
#else
    *(volatile int *)0 = 0;
#endif
    return 0;
}
""")
    out = {}
    for mode in ("HANG", "CRASH"):
        lib = folder / ("libOpenCL_%s.so" % mode.lower())
        subprocess.run([cc.find_zig(), "cc", "-shared", "-fPIC", "-nostdlib", "-D" + mode, "-o", str(lib),
                        str(source)], check=True, timeout=300, capture_output=True)
        out[mode] = str(lib)
    return out


def test_device_info_survives_a_hanging_driver(broken_drivers):
    result = _run("""
        import json
        from tether_rpc import device_info as di
        di.GPU_PROBE_TIMEOUT = 2.0
        info = di.device_info()
        print(json.dumps([info["gpus"], info["gpu_errors"], info["arch"] is not None]))
    """, TETHER_OPENCL_LIBRARY=broken_drivers["HANG"])
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == [[], ["GPU drivers did not list their devices within 2 s"], True]


def test_device_info_survives_a_crashing_driver(broken_drivers):
    result = _run("""
        import json
        from tether_rpc.device_info import device_info
        info = device_info()
        print(json.dumps([info["gpus"], info["gpu_errors"]]))
    """, TETHER_OPENCL_LIBRARY=broken_drivers["CRASH"])
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == [[], ["listing the GPU drivers' devices failed (killed by signal 11)"]]


def test_device_info_survives_a_hanging_driver_in_a_threaded_process(broken_drivers):
    """A process with threads and no driver loaded (a session worker, a client) lists from a new Python process,
    killed past the timeout: no thread of the caller stays in the driver, and a retry starts a fresh listing."""
    result = _run("""
        import json, threading
        from tether_rpc import device_info as di
        from tether_rpc.gpu import opencl
        di.GPU_PROBE_TIMEOUT = 2.0
        stop = threading.Event()
        threading.Thread(target=stop.wait, daemon=True).start()
        info = di.device_info()
        names = [t.name for t in threading.enumerate()]
        again = di.device_info()["gpu_errors"]   # the failure stands: no second probe, no second wait
        di.GPU_RETRY_AFTER = 0.0
        retried = di.device_info()["gpu_errors"]
        print(json.dumps([info["gpus"], info["gpu_errors"], names, again, retried, opencl.library_loaded()]))
    """, TETHER_OPENCL_LIBRARY=broken_drivers["HANG"])
    assert result.returncode == 0, result.stderr
    gpus, errors, threads, again, retried, loaded = json.loads(result.stdout)
    assert gpus == [] and errors == ["GPU drivers did not list their devices within 2 s"]
    assert "tether-gpu-probe" not in threads and again == errors and retried == errors and loaded is False


def test_device_info_survives_a_hanging_driver_in_a_process_that_loaded_it(broken_drivers):
    """A process that has the driver loaded already (it uses a GPU) lists in a daemon thread: the hung driver keeps
    that thread, and a retry does not start a second one beside it."""
    result = _run("""
        import json, threading
        from tether_rpc import device_info as di
        from tether_rpc.gpu import opencl
        di.GPU_PROBE_TIMEOUT = 2.0
        opencl.load_library()
        info = di.device_info()
        names = [t.name for t in threading.enumerate()]
        again = di.device_info()["gpu_errors"]
        di.GPU_RETRY_AFTER = 0.0
        retried = di.device_info()["gpu_errors"]   # retried, but not beside the probe still stuck in the driver
        probes = sum(t.name == "tether-gpu-probe" for t in threading.enumerate())
        print(json.dumps([info["gpus"], info["gpu_errors"], names, again, retried, probes]))
    """, TETHER_OPENCL_LIBRARY=broken_drivers["HANG"])
    assert result.returncode == 0, result.stderr
    gpus, errors, threads, again, retried, probes = json.loads(result.stdout)
    assert gpus == [] and errors == ["GPU drivers did not list their devices within 2 s"]
    assert "tether-gpu-probe" in threads and again == errors
    assert retried == ["GPU drivers are still listing their devices (an earlier listing hung)"] and probes == 1


def test_device_info_over_rpc_lists_pocl(rpc_server):
    from tether import rpc

    index = _pocl_index()
    with rpc.connect(rpc_server.host, rpc_server.port, timeout=120) as remote:
        info = remote.device_info()
    assert info["gpu_errors"] == []
    assert [g["name"] for g in info["gpus"] if g["api"] == "opencl" and g["index"] == index] == \
        [OpenCLDevice.available()[index]["name"]]


def test_a_threaded_process_without_a_driver_lists_gpus_in_another_process(dev):
    """device_info in a process with threads and no GPU driver loaded (a test process, a client's LocalSession)
    lists the GPUs from a new Python process: the drivers never enter the caller, whose heap a driver initialised
    beside its threads was seen to corrupt."""
    code = textwrap.dedent("""
        import json, threading
        stop = threading.Event()
        threading.Thread(target=stop.wait, args=(30,), daemon=True).start()
        from tether_rpc import device_info
        from tether_rpc.gpu import opencl, vulkan
        gpus, errors = device_info.gpu_devices()
        stop.set()
        print(json.dumps({"specs": [g["spec"] for g in gpus], "errors": errors,
                          "loaded": opencl.library_loaded() or vulkan.library_loaded()}))
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT / "rpc_server")]))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["loaded"] is False, seen
    assert "opencl:%d" % dev.index in seen["specs"] and not seen["errors"], seen
