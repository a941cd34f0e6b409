"""OpenCL in the Java device server (android_app/device through its JNI bridge, docs/android.md "OpenCL in the
app"): a real JVM with the host (x86_64) build of the bridge, which dlopens pocl's OpenCL at run time, driven by
tether's Python client on loopback. Device info is compared with tether_rpc's own OpenCL runtime, every array and
every kernel result with numpy.
"""
from __future__ import annotations

import numpy as np
import pytest
from fixtures.gpu_kernels import vadd_gpu

import tether
from tether import rpc, te
from tether_rpc import errors
from tether_rpc.dtypes import numpy_dtype

TIMEOUT = 120.0


def message_of(exc: BaseException) -> str:
    """The message as the device sent it (a RemoteError's str adds its type and the remote traceback)."""
    return str(exc.args[0]) if exc.args else ""


def _reverse_twice(n=1000):
    """Two kernels and a temporary between them: T = 2 * A, then C[i] = T[n - 1 - i] + 1."""
    A = te.placeholder((n,), name="A")
    T = te.compute((n,), lambda i: A[i] * 2.0, name="T")
    C = te.compute((n,), lambda i: T[n - 1 - i] + 1.0, name="C")
    s = te.create_schedule(C.op)
    for X in (T, C):
        bx, tx = s[X].split(X.op.axis[0], factor=50)
        s[X].bind(bx, te.thread_axis("blockIdx.x"))
        s[X].bind(tx, te.thread_axis("threadIdx.x"))
    return s, [A, C]


@pytest.fixture(scope="module")
def modules(tmp_path_factory):
    """GPU modules built by tether for this machine's CPU as host: name -> path."""
    out = tmp_path_factory.mktemp("java_gpu_modules")
    specs = {"vadd": (vadd_gpu(1000), "opencl"), "rev": (_reverse_twice(), "opencl"),
             "vadd_vk": (vadd_gpu(1000), "vulkan"),
             "vadd_big": (vadd_gpu(16384, block=8192), "opencl -max_threads_per_block=8192")}
    A = te.placeholder((1000,), name="A")
    B = te.placeholder((1000,), name="B")
    C = te.compute((1000,), lambda i: A[i] + B[i], name="C")
    specs["cadd"] = ((te.create_schedule(C.op), [A, B, C]), "host")   # a CPU module
    paths = {}
    for name, ((s, args), target) in specs.items():
        lib = tether.build(s, args, target=target, name=name)
        paths[name] = lib.export_library(str(out / (name + ".so")))
    return paths


def connect(server):
    return rpc.connect(server.host, server.port, timeout=TIMEOUT)


def test_device_info_lists_the_opencl_device_as_the_python_runtime_does(java_device, opencl_info):
    with connect(java_device) as remote:
        info = remote.device_info()
    assert info["gpu_errors"] == []
    assert [g["spec"] for g in info["gpus"]][:1] == ["opencl:0"]
    listed = dict(info["gpus"][0])
    assert listed.pop("spec") == "opencl:0"
    assert listed == opencl_info   # every key and value of tether_rpc.gpu.opencl's info()


@pytest.mark.parametrize("dtype", ["bool", "int8", "uint8", "int16", "int32", "int64", "float16", "float32",
                                   "float64", "bfloat16"])
def test_arrays_round_trip_to_opencl(java_device, opencl_info, dtype):
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((5, 7)) * 100).astype(np.float32).view(np.uint32).astype(np.uint64)
    x = np.frombuffer(x.astype(np.uint8).tobytes() * 8, numpy_dtype(dtype))[:35].reshape(5, 7)
    with connect(java_device) as remote:
        a = remote.array(x, device="opencl:0")
        assert a.device == "opencl:0"
        assert a.numpy().tobytes() == x.tobytes()
        b = remote.empty(x.shape, dtype, device="opencl")   # "opencl" is opencl:0
        a.copyto(b)                                        # on the device
        h = remote.empty(x.shape, dtype)
        b.copyto(h)                                        # device -> host
        assert h.numpy().tobytes() == x.tobytes()
        c = remote.empty(x.shape, dtype, device="opencl:0")
        h.copyto(c)                                        # host -> device
        assert c.numpy().tobytes() == x.tobytes()
        from_tensor = remote.get_function("tether.array.from_tensor")(x, "opencl:0")
        assert from_tensor["device"] == "opencl:0" and from_tensor["shape"] == [5, 7]


def test_big_and_empty_arrays_and_memory_accounting(make_java_device, opencl_info):
    server = make_java_device("--session-memory", str(40 << 20))
    big = np.arange((16 << 20) + 12345, dtype=np.uint8)   # more than one 16 MiB staging piece
    with connect(server) as remote:
        a = remote.array(big, device="opencl:0")
        assert a.numpy().tobytes() == big.tobytes()
        empty = remote.empty((0, 3), "float32", device="opencl:0")
        assert empty.numpy().shape == (0, 3)
        with pytest.raises(errors.RemoteError) as info:   # GPU arrays count against the session's memory
            remote.empty((30 << 20,), "uint8", device="opencl:0")
        assert info.value.remote_type == "OutOfMemory"
        a.free()                                          # given back at once
        b = remote.empty((30 << 20,), "uint8", device="opencl:0")
        assert b.device == "opencl:0"
        with pytest.raises(errors.RemoteError) as info:
            remote.empty((2,), "float32", device="opencl:5")
        assert info.value.remote_type == "GpuUnavailable"
        assert message_of(info.value).startswith("opencl:5: this device has no OpenCL device 5: ")
        assert remote.get_function("tether.echo")(3) == 3


def test_an_opencl_module_runs_on_device_arrays(java_device, opencl_info, modules):
    a = np.arange(1000, dtype=np.float32) * 0.5
    b = np.linspace(-3, 3, 1000).astype(np.float32)
    with connect(java_device) as remote:
        remote.upload(modules["vadd"])
        remote.upload(modules["rev"])
        vadd = remote.load_module("vadd.so")["vadd"]
        da, db = remote.array(a, device="opencl:0"), remote.array(b, device="opencl:0")
        dc = remote.empty((1000,), "float32", device="opencl:0")
        vadd(da, db, dc)
        np.testing.assert_array_equal(dc.numpy(), a + b)
        for _ in range(3):    # repeated calls reuse the program and kernel objects
            vadd(dc, db, dc)
        want = a + b
        for _ in range(3):
            want = want + b   # float32 additions in the kernel's order
        np.testing.assert_array_equal(dc.numpy(), want)
        # host arrays go through staging buffers: inputs uploaded, the output downloaded
        hc = remote.empty((1000,), "float32")
        vadd(remote.array(a), remote.array(b), hc)
        np.testing.assert_array_equal(hc.numpy(), a + b)
        # two kernels and a temporary
        rev = remote.load_module("rev.so")["rev"]
        out = remote.empty((1000,), "float32", device="opencl:0")
        rev(da, out)
        np.testing.assert_array_equal(out.numpy(), (a * 2.0)[::-1] + 1.0)
        # timing on the device's clock
        result = vadd.time_evaluator(number=2, repeat=2)(da, db, dc)
        assert len(result.samples) == 2 and all(s > 0 for s in result.samples)
        # a wrong argument is one line, and the session goes on
        with pytest.raises(errors.RemoteError) as info:
            vadd(da, db, remote.empty((999,), "float32", device="opencl:0"))
        assert info.value.remote_type == "KernelError"
        assert message_of(info.value) == ("vadd: argument 2 (C) must be a float32 array of shape (1000,), got a "
                                          "float32 array of shape (999,)")
        np.testing.assert_array_equal(remote.array(a, device="opencl:0").numpy(), a)


def test_sessions_in_the_server_process_open_and_close_the_device(make_java_device, opencl_info, modules):
    """Android's way (--isolation thread): each session opens opencl:0 in the server's own process and closes it at
    its end; the library stays loaded for the next session. A CPU function refuses a GPU array in one line."""
    server = make_java_device("--isolation", "thread")
    a = np.arange(1000, dtype=np.float32)
    for k in range(2):
        with connect(server) as remote:
            remote.upload(modules["vadd"])
            remote.upload(modules["cadd"])
            vadd = remote.load_module("vadd.so")["vadd"]
            da = remote.array(a + k, device="opencl:0")
            dc = remote.empty((1000,), "float32", device="opencl:0")
            vadd(da, da, dc)
            np.testing.assert_array_equal(dc.numpy(), (a + k) + (a + k))
            cadd = remote.load_module("cadd.so")["cadd"]
            with pytest.raises(errors.RemoteError) as info:
                cadd(da, da, dc)
            assert info.value.remote_type == "KernelError"
            assert message_of(info.value) == ("cadd: argument 0 'A' is an array on opencl:0; this CPU function takes "
                                              "host arrays (copy it to one)")
            hc = remote.empty((1000,), "float32")
            cadd(remote.array(a), remote.array(a), hc)
            np.testing.assert_array_equal(hc.numpy(), a + a)


def _needing(path, need: str, out):
    """A copy of module ``path`` whose kernel's launch_info says it needs ``need``: a module built for a device
    with a feature pocl lacks (tether's OpenCL C itself asks pocl for nothing it lacks). The metadata is edited in
    place at the same length; the device code and its sha256 are untouched."""
    raw = open(path, "rb").read()
    old = b'"scalars":[],"shared_bytes":0,"needs":[]'
    new = b'"shared_bytes":0,"needs":["%s"]' % need.encode()   # (no scalars: an empty list, left out)
    new = new + b" " * (len(old) - len(new))
    assert raw.count(old) == 1 and len(new) == len(old)
    out.write_bytes(raw.replace(old, new))
    return out


def test_missing_feature_and_oversized_block_are_refused_at_load(java_device, opencl_info, modules, tmp_path):
    with connect(java_device) as remote:
        assert not opencl_info["fp16"], "pocl was expected to lack cl_khr_fp16"
        remote.upload(_needing(modules["vadd"], "fp16", tmp_path / "vadd_fp16.so"))
        with pytest.raises(errors.RemoteError) as info:
            remote.load_module("vadd_fp16.so")
        assert info.value.remote_type == "GpuUnavailable"
        assert message_of(info.value) == ("vadd_fp16.so: kernel vadd_kernel0 needs fp16, which %s (opencl:0) lacks "
                                          "(no cl_khr_fp16)" % opencl_info["name"])
        remote.upload(modules["vadd_big"])
        assert opencl_info["max_threads_per_block"] < 8192
        with pytest.raises(errors.ModuleLoadError) as info:
            remote.load_module("vadd_big.so")
        assert message_of(info.value) == (
            "vadd_big.so: kernel vadd_big_kernel0: a work-group of 8192 threads (8192, 1, 1) exceeds %s's limit "
            "of %d (CL_DEVICE_MAX_WORK_GROUP_SIZE)" % (opencl_info["name"], opencl_info["max_threads_per_block"]))
        assert remote.get_function("tether.echo")(3) == 3


def _miswritten(path, out, update_sha=True):
    """A copy of module ``path`` whose OpenCL C calls a function that does not exist, its sha256 in the metadata
    updated to match (the same length: a module a broken code generator would have written)."""
    import hashlib

    from tether_rpc.elf import ElfFile
    from tether_rpc.module import read_metadata

    raw = open(path, "rb").read()
    dev = read_metadata(path)["device"]
    with ElfFile(path) as elf:
        code_start = elf.section(".tether_device").offset
    code = raw[code_start:code_start + dev["code_bytes"]]
    assert hashlib.sha256(code).hexdigest() == dev["code_sha256"] and b"get_group_id" in code
    code = code.replace(b"get_group_id", b"get_groop_id")
    raw = raw[:code_start] + code + raw[code_start + len(code):]
    if update_sha:
        raw = raw.replace(dev["code_sha256"].encode(), hashlib.sha256(code).hexdigest().encode())
    out.write_bytes(raw)
    return out


def test_a_build_failure_carries_the_driver_log(java_device, opencl_info, modules, tmp_path):
    with connect(java_device) as remote:
        remote.upload(_miswritten(modules["vadd"], tmp_path / "broken.so"))
        with pytest.raises(errors.RemoteError) as info:
            remote.load_module("broken.so")
        assert info.value.remote_type == "GpuBuildError"
        first, _, log = message_of(info.value).partition("\n")
        assert first == "broken.so: OpenCL build of vadd_kernel0 for %s failed: CL_BUILD_PROGRAM_FAILURE" % (
            opencl_info["name"])
        assert "get_groop_id" in log   # the driver's own words
        # the same code with the metadata's sha256 left as it was: a corrupt module, refused before building
        remote.upload(_miswritten(modules["vadd"], tmp_path / "corrupt.so", update_sha=False))
        with pytest.raises(errors.ModuleLoadError) as info:
            remote.load_module("corrupt.so")
        assert message_of(info.value) == ("corrupt.so: the device code in .tether_device does not match the "
                                          "metadata's length and sha256 (corrupt module)")
        assert remote.get_function("tether.echo")(3) == 3


def test_without_an_opencl_library_the_module_is_refused_in_one_line(make_java_device, modules):
    server = make_java_device(env_extra={"TETHER_OPENCL_LIBRARY": "/nonexistent/libOpenCL.so"})
    why = "this device has no OpenCL: /nonexistent/libOpenCL.so not found (named by TETHER_OPENCL_LIBRARY)"
    with connect(server) as remote:
        remote.upload(modules["vadd"])
        with pytest.raises(errors.RemoteError) as info:
            remote.load_module("vadd.so")
        assert info.value.remote_type == "GpuUnavailable"
        assert message_of(info.value) == "vadd.so runs on OpenCL; " + why
        with pytest.raises(errors.RemoteError) as info:
            remote.empty((2,), "float32", device="opencl:0")
        assert message_of(info.value) == "opencl:0: " + why
        info = remote.device_info()
        assert info["gpus"] == [] and info["gpu_errors"] == []
        # the session goes on: host arrays and the echo
        np.testing.assert_array_equal(remote.array(np.arange(3, dtype="int32")).numpy(), np.arange(3))
        assert remote.get_function("tether.echo")(3) == 3


def test_vulkan_stays_refused_in_one_line(java_device, modules):
    with connect(java_device) as remote:
        remote.upload(modules["vadd_vk"])
        with pytest.raises(errors.ModuleLoadError) as info:
            remote.load_module("vadd_vk.so")
        assert message_of(info.value) == ("this device runs CPU and OpenCL modules only; vadd_vk.so needs vulkan, "
                                          "which is not available")
        with pytest.raises(errors.RemoteError) as info:
            remote.empty((2,), "float32", device="vulkan:0")
        assert info.value.remote_type == "GpuUnavailable"
        assert message_of(info.value) == "this device runs CPU and OpenCL modules only; vulkan:0 is not available"
        assert remote.get_function("tether.echo")(3) == 3
