"""Arrays on GPUs over the RPC (docs/gpu.md "Device arrays and the RPC", docs/protocol.md "Device arrays on GPUs"):
real forked rpc-servers on loopback and in-process LocalSessions, driving pocl's OpenCL device through
tether_rpc.gpu.opencl and lavapipe's Vulkan device through tether_rpc.gpu.vulkan. Every value that comes back is
compared with the numpy array it was made from.

The JavaScript device server and the Go runtime, which run CPU modules only, must refuse GPU arrays and GPU
modules with one clear line and go on; the Java device server runs OpenCL ones and refuses the other APIs.
"""
from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest

from fixtures.rpc import ServerProcess
from tether import rpc
from tether.rpc.local import LocalSession
from tether_rpc import errors
from tether_rpc.dtypes import bfloat16_bits, numpy_dtype, storage_of

TIMEOUT = 60.0


@pytest.fixture(params=["opencl:0", "vulkan:0"])
def gpu(request):
    """Each GPU API's first device (its driver required)."""
    request.getfixturevalue("opencl_info" if request.param.startswith("opencl") else "vulkan_info")
    return request.param


@pytest.fixture(params=["remote", "local"])
def session(request, opencl_info, rpc_server):
    """A session on the forked rpc-server, then the same tests in-process (LocalSession)."""
    if request.param == "remote":
        s = rpc.connect(rpc_server.host, rpc_server.port, timeout=TIMEOUT)
    else:
        s = LocalSession()
    yield s
    s.close()


def sample(dtype: str, shape, seed: int = 0) -> np.ndarray:
    """Values of ``dtype`` that use its whole range (negative, fractional, large), in ``shape``."""
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape, dtype=np.int64))
    if dtype == "bool":
        return (rng.integers(0, 2, n) == 1).reshape(shape)
    if dtype == "bfloat16":
        return bfloat16_bits(rng.standard_normal(n) * 100).view(numpy_dtype("bfloat16")).reshape(shape)
    dt = np.dtype(dtype)
    if dt.kind == "f":
        return (rng.standard_normal(n) * 1000).astype(dt).reshape(shape)
    info = np.iinfo(dt)
    return rng.integers(info.min, info.max, n, dtype=dt, endpoint=True).reshape(shape)


def message_of(exc: BaseException) -> str:
    """The message as the device sent it (a RemoteError's str adds its type and the remote traceback)."""
    return str(exc.args[0]) if exc.args else ""


def same_bits(a: np.ndarray, b: np.ndarray) -> None:
    a, b = storage_of(np.asarray(a)), storage_of(np.asarray(b))
    assert a.shape == b.shape and a.dtype.itemsize == b.dtype.itemsize
    assert a.tobytes() == b.tobytes()


CASES = [("float32", (3, 5)), ("float16", (7,)), ("float64", (2, 3, 4)), ("int8", (129,)), ("uint8", (1, 1)),
         ("int16", (4, 4)), ("int32", ()), ("int64", (5, 0)), ("uint64", (9,)), ("bool", (2, 7)),
         ("bfloat16", (3, 3)), ("float32", (301, 257))]


@pytest.mark.parametrize("dtype,shape", CASES, ids=["%s-%s" % (d, "x".join(map(str, s)) or "scalar")
                                                    for d, s in CASES])
def test_array_round_trip_to_the_gpu_and_back(session, gpu, dtype, shape):
    x = sample(dtype, shape, seed=len(shape) + len(dtype))
    arr = session.array(x, device=gpu)
    assert (arr.device, arr.shape, arr.dtype) == (gpu, x.shape, dtype)
    back = arr.numpy()
    same_bits(back, x)
    assert back.shape == x.shape
    # from_tensor with a device (the tensor inside the CALL) lands on the GPU as well
    value = session.get_function("tether.array.from_tensor")(x, gpu)
    assert value["device"] == gpu and value["shape"] == list(x.shape)
    again = rpc.client.RemoteArray(session, value["handle"], value["shape"], value["dtype"], value["device"])
    same_bits(again.numpy(), x)
    arr.free()
    again.free()
    arr.free()  # idempotent


def test_empty_and_copies_between_devices(session, gpu):
    x = sample("float32", (6, 33), seed=3)
    gpu_a = session.empty(x.shape, "float32", device=gpu.split(":")[0])   # "opencl" is "opencl:0"
    assert gpu_a.device == gpu
    host = session.array(x)
    assert host.device == "cpu"
    host.copyto(gpu_a)                             # host -> device
    gpu_b = session.empty(x.shape, "float32", device=gpu)
    gpu_a.copyto(gpu_b)                            # device -> device (DeviceAPI.copy)
    host_back = session.empty(x.shape, "float32")
    gpu_b.copyto(host_back)                        # device -> host array in the session
    same_bits(host_back.numpy(), x)
    out = np.zeros_like(x)
    assert gpu_b.copyto(out) is out                # device -> numpy on the client
    same_bits(out, x)
    y = sample("float32", (6, 33), seed=4)
    gpu_b.copyfrom(y)
    same_bits(gpu_b.numpy(), y)
    same_bits(gpu_a.numpy(), x)                    # the copy was a copy, not an alias
    with pytest.raises(ValueError, match="shape or dtype"):
        gpu_a.copyto(session.empty((6, 32), "float32", device=gpu))
    with pytest.raises(errors.TetherError, match="shape or dtype"):   # checked by the device too
        session.get_function("tether.array.copy_to")(gpu_a.handle, session.empty((2,), "int8").handle)


def test_copies_between_opencl_and_vulkan_go_through_the_host(session, opencl_info, vulkan_info):
    x = sample("int16", (5, 7, 3), seed=5)
    on_cl = session.array(x, device="opencl:0")
    on_vk = session.empty(x.shape, "int16", device="vulkan:0")
    on_cl.copyto(on_vk)
    same_bits(on_vk.numpy(), x)
    y = sample("int16", (5, 7, 3), seed=6)
    on_vk.copyfrom(y)
    on_cl.copyfrom(on_vk)
    same_bits(on_cl.numpy(), y)


def test_bad_device_names_are_one_line_and_the_session_goes_on(session):
    for device, kind, words in (("opencl:7", "GpuUnavailable", "opencl:7: this device has no OpenCL device 7"),
                                ("metal:0", "ValueError", "metal:0: unknown GPU API 'metal'"),
                                ("gpu 0", "ValueError", "device 'gpu 0': expected API:INDEX")):
        with pytest.raises(Exception) as info:
            session.empty((4,), "float32", device=device)
        message = message_of(info.value)
        assert words in message and "\n" not in message, message
        assert getattr(info.value, "remote_type", type(info.value).__name__) == kind
    same_bits(session.array(np.arange(4, dtype="int32"), device="opencl:0").numpy(), np.arange(4, dtype="int32"))


def test_a_device_without_opencl_names_it_and_the_session_goes_on(tmp_path, opencl_info):
    env = dict(__import__("os").environ)
    env["TETHER_OPENCL_LIBRARY"] = "/nonexistent/libOpenCL.so.1"
    env.pop("TETHER_TOKEN", None)
    workdir = tmp_path / "sessions"
    workdir.mkdir()
    server = ServerProcess(["--host", "127.0.0.1", "--port", "0", "--workdir", str(workdir)],
                           tmp_path / "server.log", env=env)
    try:
        with rpc.connect(server.host, server.port, timeout=TIMEOUT) as remote:
            for _ in range(2):   # asked twice: still one line, and nothing was left half-open
                with pytest.raises(errors.RemoteError) as info:
                    remote.array(np.ones(3, "float32"), device="opencl:0")
                message = message_of(info.value)
                assert info.value.remote_type == "GpuUnavailable"
                assert isinstance(info.value, errors.ModuleLoadError)   # one error tree on both sides
                assert message.startswith("opencl:0: this device has no OpenCL") and "\n" not in message, message
                assert "/nonexistent/libOpenCL.so.1" in message
            host = remote.array(np.arange(5, dtype="int64"))
            same_bits(host.numpy(), np.arange(5, dtype="int64"))
            info = remote.device_info()
            assert [g for g in info["gpus"] if g["api"] == "opencl"] == []
            assert remote.get_function("tether.echo")(7) == 7
    finally:
        server.stop()


def test_memory_limit_counts_device_arrays(make_rpc_server, opencl_info):
    server = make_rpc_server("--session-memory", "1MB")
    with rpc.connect(server.host, server.port, timeout=TIMEOUT) as remote:
        gpu = remote.empty((150_000,), "float32", device="opencl:0")        # 600 kB of the 1 MB
        with pytest.raises(errors.OutOfMemory, match="on opencl:0"):
            remote.empty((150_000,), "float32", device="opencl:0")
        with pytest.raises(errors.OutOfMemory):
            remote.empty((150_000,), "float32")                            # host arrays share the budget
        gpu.free()
        host = remote.empty((150_000,), "float32")
        with pytest.raises(errors.OutOfMemory):
            remote.array(np.zeros(150_000, "float32"), device="opencl:0")
        host.free()
        x = sample("float32", (150_000,))
        same_bits(remote.array(x, device="opencl:0").numpy(), x)           # the budget came back in full


def _live_buffers(device) -> int:
    """The buffers the device API holds (its own bookkeeping: OpenCL's per-context table, Vulkan's)."""
    return len(device._state.buffers) if device.name == "opencl" else len(device._buffers)


def _closed(device) -> bool:
    return device._state.closed if device.name == "opencl" else device._closed


def test_free_and_session_close_release_device_memory(gpu):
    s = LocalSession()
    try:
        arrays = [s.array(sample("float32", (64, 8), seed=i), device=gpu) for i in range(3)]
        device = s._handler.device(gpu)
        assert _live_buffers(device) == 3
        arrays[0].free()
        assert _live_buffers(device) == 2
        assert s._handler.budget.memory_used == 2 * 64 * 8 * 4
        s.empty((10,), "int8", device=gpu)
        assert _live_buffers(device) == 3
    finally:
        s.close()
    assert _live_buffers(device) == 0 and _closed(device)
    # a new session opens the device again
    with LocalSession() as again:
        same_bits(again.array(np.arange(3, dtype="uint8"), device=gpu).numpy(), np.arange(3, dtype="uint8"))


def test_a_cpu_kernel_refuses_a_gpu_array_and_the_session_goes_on(rpc_server, rpc_kernels, opencl_info):
    with rpc.connect(rpc_server.host, rpc_server.port, timeout=TIMEOUT) as remote:
        remote.upload(rpc_kernels["vadd"])
        vadd = remote.load_module("vadd.so")["vadd"]
        a = remote.array(np.ones(1024, "float32"), device="opencl:0")
        b = remote.array(np.ones(1024, "float32"))
        c = remote.empty((1024,), "float32")
        with pytest.raises(errors.KernelError, match="DeviceArray"):
            vadd(a, b, c)
        vadd(b, b, c)
        same_bits(c.numpy(), np.full(1024, 2, "float32"))
        timer = vadd.time_evaluator(number=2, repeat=2)
        assert len(timer(b, b, c).samples) == 2   # timing CPU functions is unchanged


def test_device_info_lists_the_opencl_device(session, opencl_info):
    info = session.device_info()
    assert info["gpu_errors"] == []
    by_spec = {g["spec"]: g for g in info["gpus"]}
    assert by_spec["opencl:0"]["name"] == opencl_info["name"] and by_spec["opencl:0"]["api"] == "opencl"
    for spec in by_spec:   # each listed device opens by the name it is listed under
        same_bits(session.array(np.arange(3, dtype="int32"), device=spec).numpy(), np.arange(3, dtype="int32"))


# -- devices that run CPU modules only ------------------------------------------------------------------------------
GPU_MODULE = r"""
#include "tether_abi.h"
TETHER_META("{\"abi_version\": 1, \"tether_version\": \"0.1.0\", "
            "\"target\": {\"arch\": \"" TETHER_ARCH "\", \"preset\": \"test\"}, "
            "\"device\": {\"api\": \"opencl\", \"kernels\": []}, \"functions\": ["
            "{\"name\": \"nop\", \"args\": [], \"parallel\": false}]}");

TETHER_EXPORT int32_t nop(const TetherValue* args, const int32_t* codes, int32_t num_args) {
  return 0;
}
"""


@pytest.fixture(scope="module")
def gpu_module(tmp_path_factory):
    """A module whose metadata has a "device" entry, as a GPU module's has (built with gcc like the RPC kernels)."""
    from kernels import GCC_FLAGS, KERNEL_DIR

    out = tmp_path_factory.mktemp("gpu_module")
    src = out / "gpu_module.c"
    src.write_text(GPU_MODULE)
    so = out / "gpu_module.so"
    gcc = shutil.which("gcc")
    if gcc is None:
        raise RuntimeError("gcc is required to build the test module")
    proc = subprocess.run([gcc, *GCC_FLAGS, "-I", str(KERNEL_DIR), str(src), "-o", str(so),
                           "-Wl,-soname,gpu_module.so", "-Wl,--no-undefined"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    return so


def _refuses_gpu_arrays(remote) -> None:
    for call in (lambda: remote.empty((2,), "float32", device="opencl:0"),
                 lambda: remote.array(np.ones(2, "float32"), device="opencl:0"),
                 lambda: remote.get_function("tether.array.from_tensor")(np.ones(2, "float32"), "opencl:0")):
        with pytest.raises(errors.RemoteError) as info:
            call()
        assert info.value.remote_type == "GpuUnavailable"
        assert message_of(info.value) == "this device runs CPU modules only; opencl:0 is not available"
    # host memory, named or not, is what it always was
    same_bits(remote.array(np.arange(4, dtype="int32")).numpy(), np.arange(4, dtype="int32"))
    assert remote.get_function("tether.array.empty")([2], "int8", "cpu")["shape"] == [2]
    info = remote.device_info()
    assert info["gpus"] == [] and info["gpu_errors"] == []


def test_java_device_runs_opencl_arrays_and_refuses_other_apis(java_device, gpu_module, opencl_info):
    """The Java device server runs OpenCL arrays (tests/test_java_gpu.py has the modules); Vulkan and CUDA arrays
    are refused in one line, and a module whose "device" entry is malformed too."""
    with rpc.connect(java_device.host, java_device.port, timeout=TIMEOUT) as remote:
        x = sample("float32", (3, 5), seed=4)
        same_bits(remote.array(x, device="opencl:0").numpy(), x)
        for spec in ("vulkan:0", "cuda:0"):
            with pytest.raises(errors.RemoteError) as info:
                remote.empty((2,), "float32", device=spec)
            assert info.value.remote_type == "GpuUnavailable"
            assert message_of(info.value) == "this device runs CPU and OpenCL modules only; %s is not available" % spec
        info = remote.device_info()
        assert [g["spec"] for g in info["gpus"]][:1] == ["opencl:0"] and info["gpu_errors"] == []
        remote.upload(gpu_module)
        with pytest.raises(errors.ModuleLoadError) as info:
            remote.load_module("gpu_module.so")
        assert message_of(info.value) == ("gpu_module.so: metadata 'device' is not a version-1 device entry (rebuild "
                                          "the module with a matching tether)")
        assert remote.get_function("tether.echo")(3) == 3


def test_js_device_refuses_gpu_arrays(js_server):
    with rpc.connect("127.0.0.1", js_server.port, timeout=TIMEOUT) as remote:
        _refuses_gpu_arrays(remote)
        assert remote.get_function("tether.echo")(3) == 3


def test_go_runtime_refuses_gpu_modules(gpu_module, tmp_path):
    from fixtures.golang import run_go_test

    shutil.copy(gpu_module, tmp_path / "gpu_module.so")
    run_go_test(["."], tmp_path, run="^TestRefusesGPUModule$")


@pytest.mark.parametrize("server", ["java_device", "js_server"])
def test_cpu_only_servers_copy_between_host_arrays(server, request):
    dev = request.getfixturevalue(server)
    host = getattr(dev, "host", "127.0.0.1")
    with rpc.connect(host, dev.port, timeout=TIMEOUT) as remote:
        x = sample("float32", (3, 7), seed=9)
        a = remote.array(x)
        b = remote.empty(x.shape, "float32")
        a.copyto(b)
        same_bits(b.numpy(), x)
        with pytest.raises(errors.RemoteError, match="differ in shape or dtype"):
            a.session.get_function("tether.array.copy_to")(a.handle, remote.empty((3,), "int8").handle)


def test_the_dlpack_view_names_the_api_device_and_buffer(gpu):
    from tether_rpc.dlpack import DTYPE_TO_DL
    from tether_rpc.gpu import api as gpu_api
    from tether_rpc.gpu.array import from_numpy, handle_value
    from tether_rpc.gpu.session_devices import SessionDevices

    devices = SessionDevices()
    try:
        device = devices.get(gpu)
        arr = from_numpy(device, np.arange(24, dtype="float16").reshape(2, 3, 4))
        t = arr.dltensor
        expected_type = {"opencl": gpu_api.KDL_OPENCL, "vulkan": gpu_api.KDL_VULKAN}[device.name]
        assert (t.device.device_type, t.device.device_id) == (expected_type, 0)
        assert t.data == handle_value(arr.buffer.handle) and t.data
        assert [t.shape[i] for i in range(t.ndim)] == [2, 3, 4]
        assert (t.dtype.code, t.dtype.bits, t.dtype.lanes) == (*DTYPE_TO_DL["float16"], 1)
        assert arr.dltensor_address == arr.dltensor_address   # built once, kept
        arr.free()
        with pytest.raises(errors.KernelError, match="freed"):
            arr.dltensor
    finally:
        devices.close()


def test_a_gpu_array_bigger_than_the_staging_buffer_arrives_whole(rpc_server, gpu):
    from tether_rpc.session import GPU_STAGING

    x = sample("uint8", (GPU_STAGING * 2 + 12345,), seed=11)   # two full pieces and a partial one
    with rpc.connect(rpc_server.host, rpc_server.port, timeout=TIMEOUT) as remote:
        arr = remote.array(x, device=gpu)
        same_bits(arr.numpy(), x)
