"""The OpenCL device API: :class:`OpenCLDevice`, a :class:`~.api.DeviceAPI` on the system's OpenCL ICD loader
(``libOpenCL.so.1``) through ctypes, so phones' Mali and Adreno GPUs, desktop GPUs and pocl's CPU device all run
the same OpenCL C kernels (docs/gpu.md, "The OpenCL runtime").

One device = one context + one in-order command queue with profiling enabled. Kernels are OpenCL C source,
built with ``-cl-std=CL1.2`` (the language every OpenCL >= 1.2 device compiles, Mali and Adreno included; never
fast-math, so results follow IEEE like the CPU backend), cached per device by the sha256 of source and options.

``clFinish`` and blocking reads cannot time out in OpenCL: a hung kernel is bounded by the device server's
watchdog (``tether_rpc.watchdog``), which ends the session worker when its client gives up on the call.

Only the standard library, numpy and ctypes: this runs on the device.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import struct
import sys
import threading
import weakref
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..errors import ModuleLoadError
from .api import KDL_OPENCL, DeviceAPI, DeviceBuffer, GpuBuildError, GpuError, GpuUnavailable, KernelArg

#: environment variable naming the OpenCL library to load instead of the usual places
LIBRARY_ENV = "TETHER_OPENCL_LIBRARY"

#: where the OpenCL ICD loader (or a vendor's library) usually is, tried in order: the loader's soname on
#: Linux, then Android's vendor libraries (Adreno ships libOpenCL.so in /vendor; Mali's OpenCL lives in
#: libGLES_mali.so on some phones), then macOS's framework
LIBRARY_CANDIDATES: Tuple[str, ...] = (
    "libOpenCL.so.1", "libOpenCL.so",
    "/system/vendor/lib64/libOpenCL.so", "/vendor/lib64/libOpenCL.so", "/system/lib64/libOpenCL.so",
    "/system/vendor/lib64/egl/libGLES_mali.so", "/vendor/lib64/egl/libGLES_mali.so",
    "/system/vendor/lib/libOpenCL.so", "/vendor/lib/libOpenCL.so", "/system/lib/libOpenCL.so",
    "/vendor/lib/egl/libGLES_mali.so",
    "/System/Library/Frameworks/OpenCL.framework/OpenCL",
)

#: the OpenCL C dialect kernels are built as; a device whose OpenCL C is older (1.1) builds without -cl-std
BUILD_OPTIONS = "-cl-std=CL1.2"
#: characters of a driver's build log kept in a GpuBuildError
MAX_BUILD_LOG = 16000

# --- constants of cl.h ----------------------------------------------------------------------------------------
CL_SUCCESS = 0
CL_DEVICE_NOT_FOUND = -1
CL_DEVICE_TYPE_CPU = 1 << 1
CL_DEVICE_TYPE_GPU = 1 << 2
CL_DEVICE_TYPE_ACCELERATOR = 1 << 3
CL_DEVICE_TYPE_CUSTOM = 1 << 4
CL_PLATFORM_VERSION = 0x0901
CL_PLATFORM_NAME = 0x0902
CL_PLATFORM_VENDOR = 0x0903
CL_DEVICE_TYPE = 0x1000
CL_DEVICE_MAX_COMPUTE_UNITS = 0x1002
CL_DEVICE_MAX_WORK_GROUP_SIZE = 0x1004
CL_DEVICE_MAX_WORK_ITEM_SIZES = 0x1005
CL_DEVICE_MAX_WORK_ITEM_DIMENSIONS = 0x1003
CL_DEVICE_MAX_CLOCK_FREQUENCY = 0x100C
CL_DEVICE_MAX_MEM_ALLOC_SIZE = 0x1010
CL_DEVICE_GLOBAL_MEM_SIZE = 0x101F
CL_DEVICE_LOCAL_MEM_SIZE = 0x1023
CL_DEVICE_PROFILING_TIMER_RESOLUTION = 0x1025
CL_DEVICE_NAME = 0x102B
CL_DEVICE_VENDOR = 0x102C
CL_DRIVER_VERSION = 0x102D
CL_DEVICE_VERSION = 0x102F
CL_DEVICE_EXTENSIONS = 0x1030
CL_DEVICE_OPENCL_C_VERSION = 0x103D
CL_DEVICE_IL_VERSION = 0x105B
CL_QUEUE_PROFILING_ENABLE = 1 << 1
CL_MEM_READ_WRITE = 1 << 0
CL_PROGRAM_BUILD_LOG = 0x1183
CL_KERNEL_NUM_ARGS = 0x1191
CL_KERNEL_WORK_GROUP_SIZE = 0x11B0
CL_KERNEL_COMPILE_WORK_GROUP_SIZE = 0x11B1
CL_KERNEL_LOCAL_MEM_SIZE = 0x11B2
CL_EVENT_COMMAND_EXECUTION_STATUS = 0x11D3
CL_PROFILING_COMMAND_START = 0x1282
CL_PROFILING_COMMAND_END = 0x1283

#: cl.h's error codes by value, so every failure names the error and not a bare number
CL_ERRORS: Dict[int, str] = {
    0: "CL_SUCCESS", -1: "CL_DEVICE_NOT_FOUND", -2: "CL_DEVICE_NOT_AVAILABLE", -3: "CL_COMPILER_NOT_AVAILABLE",
    -4: "CL_MEM_OBJECT_ALLOCATION_FAILURE", -5: "CL_OUT_OF_RESOURCES", -6: "CL_OUT_OF_HOST_MEMORY",
    -7: "CL_PROFILING_INFO_NOT_AVAILABLE", -8: "CL_MEM_COPY_OVERLAP", -9: "CL_IMAGE_FORMAT_MISMATCH",
    -10: "CL_IMAGE_FORMAT_NOT_SUPPORTED", -11: "CL_BUILD_PROGRAM_FAILURE", -12: "CL_MAP_FAILURE",
    -13: "CL_MISALIGNED_SUB_BUFFER_OFFSET", -14: "CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST",
    -15: "CL_COMPILE_PROGRAM_FAILURE", -16: "CL_LINKER_NOT_AVAILABLE", -17: "CL_LINK_PROGRAM_FAILURE",
    -18: "CL_DEVICE_PARTITION_FAILED", -19: "CL_KERNEL_ARG_INFO_NOT_AVAILABLE",
    -30: "CL_INVALID_VALUE", -31: "CL_INVALID_DEVICE_TYPE", -32: "CL_INVALID_PLATFORM", -33: "CL_INVALID_DEVICE",
    -34: "CL_INVALID_CONTEXT", -35: "CL_INVALID_QUEUE_PROPERTIES", -36: "CL_INVALID_COMMAND_QUEUE",
    -37: "CL_INVALID_HOST_PTR", -38: "CL_INVALID_MEM_OBJECT", -39: "CL_INVALID_IMAGE_FORMAT_DESCRIPTOR",
    -40: "CL_INVALID_IMAGE_SIZE", -41: "CL_INVALID_SAMPLER", -42: "CL_INVALID_BINARY",
    -43: "CL_INVALID_BUILD_OPTIONS", -44: "CL_INVALID_PROGRAM", -45: "CL_INVALID_PROGRAM_EXECUTABLE",
    -46: "CL_INVALID_KERNEL_NAME", -47: "CL_INVALID_KERNEL_DEFINITION", -48: "CL_INVALID_KERNEL",
    -49: "CL_INVALID_ARG_INDEX", -50: "CL_INVALID_ARG_VALUE", -51: "CL_INVALID_ARG_SIZE",
    -52: "CL_INVALID_KERNEL_ARGS", -53: "CL_INVALID_WORK_DIMENSION", -54: "CL_INVALID_WORK_GROUP_SIZE",
    -55: "CL_INVALID_WORK_ITEM_SIZE", -56: "CL_INVALID_GLOBAL_OFFSET", -57: "CL_INVALID_EVENT_WAIT_LIST",
    -58: "CL_INVALID_EVENT", -59: "CL_INVALID_OPERATION", -60: "CL_INVALID_GL_OBJECT",
    -61: "CL_INVALID_BUFFER_SIZE", -62: "CL_INVALID_MIP_LEVEL", -63: "CL_INVALID_GLOBAL_WORK_SIZE",
    -64: "CL_INVALID_PROPERTY", -65: "CL_INVALID_IMAGE_DESCRIPTOR", -66: "CL_INVALID_COMPILER_OPTIONS",
    -67: "CL_INVALID_LINKER_OPTIONS", -68: "CL_INVALID_DEVICE_PARTITION_COUNT", -69: "CL_INVALID_PIPE_SIZE",
    -70: "CL_INVALID_DEVICE_QUEUE", -71: "CL_INVALID_SPEC_ID", -72: "CL_MAX_SIZE_RESTRICTION_EXCEEDED",
    -1001: "CL_PLATFORM_NOT_FOUND_KHR",
}

#: a kernel's ``needs`` (tether.tir.device) -> the device extensions that provide it (any one suffices)
NEEDS_EXTENSIONS: Dict[str, Tuple[str, ...]] = {
    "fp16": ("cl_khr_fp16",),
    "fp64": ("cl_khr_fp64",),
    "int8_dot": ("cl_khr_integer_dot_product", "cl_arm_integer_dot_product_int8"),
    "subgroups": ("cl_khr_subgroups",),
}

_h = ctypes.c_void_p           # every cl_* handle
_size = ctypes.c_size_t
_int = ctypes.c_int32
_uint = ctypes.c_uint32
_ulong = ctypes.c_uint64
_p = ctypes.c_void_p

# name -> (restype, argtypes): only what this module calls, so a library lacking an unused entry still loads
_SIGNATURES: Dict[str, Tuple[Any, List[Any]]] = {
    "clGetPlatformIDs": (_int, [_uint, ctypes.POINTER(_h), ctypes.POINTER(_uint)]),
    "clGetPlatformInfo": (_int, [_h, _uint, _size, _p, ctypes.POINTER(_size)]),
    "clGetDeviceIDs": (_int, [_h, _ulong, _uint, ctypes.POINTER(_h), ctypes.POINTER(_uint)]),
    "clGetDeviceInfo": (_int, [_h, _uint, _size, _p, ctypes.POINTER(_size)]),
    "clCreateContext": (_h, [_p, _uint, ctypes.POINTER(_h), _p, _p, ctypes.POINTER(_int)]),
    "clReleaseContext": (_int, [_h]),
    "clCreateCommandQueue": (_h, [_h, _h, _ulong, ctypes.POINTER(_int)]),
    "clReleaseCommandQueue": (_int, [_h]),
    "clCreateBuffer": (_h, [_h, _ulong, _size, _p, ctypes.POINTER(_int)]),
    "clReleaseMemObject": (_int, [_h]),
    "clEnqueueWriteBuffer": (_int, [_h, _h, _uint, _size, _size, _p, _uint, _p, _p]),
    "clEnqueueReadBuffer": (_int, [_h, _h, _uint, _size, _size, _p, _uint, _p, _p]),
    "clEnqueueCopyBuffer": (_int, [_h, _h, _h, _size, _size, _size, _uint, _p, _p]),
    "clCreateProgramWithSource": (_h, [_h, _uint, ctypes.POINTER(ctypes.c_char_p), ctypes.POINTER(_size),
                                       ctypes.POINTER(_int)]),
    "clBuildProgram": (_int, [_h, _uint, ctypes.POINTER(_h), ctypes.c_char_p, _p, _p]),
    "clGetProgramBuildInfo": (_int, [_h, _h, _uint, _size, _p, ctypes.POINTER(_size)]),
    "clReleaseProgram": (_int, [_h]),
    "clCreateKernel": (_h, [_h, ctypes.c_char_p, ctypes.POINTER(_int)]),
    "clGetKernelInfo": (_int, [_h, _uint, _size, _p, ctypes.POINTER(_size)]),
    "clGetKernelWorkGroupInfo": (_int, [_h, _h, _uint, _size, _p, ctypes.POINTER(_size)]),
    "clSetKernelArg": (_int, [_h, _uint, _size, _p]),
    "clReleaseKernel": (_int, [_h]),
    "clEnqueueNDRangeKernel": (_int, [_h, _h, _uint, ctypes.POINTER(_size), ctypes.POINTER(_size),
                                      ctypes.POINTER(_size), _uint, _p, ctypes.POINTER(_h)]),
    "clFinish": (_int, [_h]),
    "clWaitForEvents": (_int, [_uint, ctypes.POINTER(_h)]),
    "clGetEventInfo": (_int, [_h, _uint, _size, _p, ctypes.POINTER(_size)]),
    "clGetEventProfilingInfo": (_int, [_h, _uint, _size, _p, ctypes.POINTER(_size)]),
    "clReleaseEvent": (_int, [_h]),
}


#: the OpenCL entry points this runtime calls (a library lacking one is refused at load)
FUNCTIONS: Tuple[str, ...] = tuple(_SIGNATURES)


def error_name(code: int) -> str:
    """``-52`` -> ``"CL_INVALID_KERNEL_ARGS"``; an unknown code is named by its number."""
    return CL_ERRORS.get(int(code), "CL error %d" % int(code))


def _check(code: int, call: str, what: str = "") -> None:
    if code != CL_SUCCESS:
        raise GpuError("%s%s failed: %s (%d)" % (call, "(%s)" % what if what else "", error_name(code), code))


# --- the library ------------------------------------------------------------------------------------------------
class _Library:
    """The loaded OpenCL library: its path and the functions of _SIGNATURES with their types."""

    def __init__(self, cdll: ctypes.CDLL, path: str):
        self.path = path
        missing = []
        for name, (restype, argtypes) in _SIGNATURES.items():
            try:
                fn = getattr(cdll, name)
            except AttributeError:
                missing.append(name)
                continue
            fn.restype, fn.argtypes = restype, argtypes
            setattr(self, name, fn)
        if missing:
            raise GpuUnavailable("this device has no usable OpenCL: %s lacks %s%s" % (
                path, ", ".join(missing[:3]), " and %d more OpenCL functions" % (len(missing) - 3)
                if len(missing) > 3 else ""))
        self._cdll = cdll   # keeps the library loaded while any device uses it


_library_lock = threading.Lock()
_libraries: Dict[Tuple[str, ...], _Library] = {}


def library_candidates() -> Tuple[str, ...]:
    """The paths tried, in order: $TETHER_OPENCL_LIBRARY alone when set, else those of :data:`LIBRARY_CANDIDATES`
    that fit this process (lib64 folders for a 64-bit one, lib for a 32-bit one, the framework on macOS)."""
    env = os.environ.get(LIBRARY_ENV)
    if env:
        return (env,)
    bits64 = ctypes.sizeof(ctypes.c_void_p) == 8
    out = []
    for path in LIBRARY_CANDIDATES:
        if path.startswith("/System/") and sys.platform != "darwin":
            continue
        android_lib64 = "/lib64/" in path
        android_lib32 = path.startswith(("/system/", "/vendor/")) and "/lib/" in path
        if (android_lib64 and not bits64) or (android_lib32 and bits64):
            continue
        out.append(path)
    return tuple(out)


def library_loaded() -> bool:
    """Whether this process has loaded an OpenCL library (and so may hold driver state and threads)."""
    return bool(_libraries)


def load_library() -> _Library:
    """The OpenCL library of this machine (loaded once per candidate list); GpuUnavailable naming every path
    tried when none loads."""
    candidates = library_candidates()
    with _library_lock:
        lib = _libraries.get(candidates)
        if lib is not None:
            return lib
        failures = []
        for path in candidates:
            try:
                cdll = ctypes.CDLL(path)
            except OSError as exc:
                reason = str(exc)
                missing = "No such file" in reason or "cannot open shared object" in reason or "not found" in reason
                failures.append("%s %s" % (path, "not found" if missing else "could not be loaded (%s)" % reason))
                continue
            lib = _Library(cdll, path)
            _libraries[candidates] = lib
            return lib
        if os.environ.get(LIBRARY_ENV):
            raise GpuUnavailable("this device has no OpenCL: %s (named by %s)" % (failures[0], LIBRARY_ENV))
        raise GpuUnavailable("this device has no OpenCL: %s (also tried %s; set %s to the library's path)" % (
            failures[0], ", ".join(candidates[1:]), LIBRARY_ENV))


# --- info queries ---------------------------------------------------------------------------------------------
def _info_bytes(lib: _Library, fn_name: str, handle: int, param: int, *extra: Any) -> bytes:
    fn = getattr(lib, fn_name)
    size = _size(0)
    _check(fn(handle, *extra, param, 0, None, ctypes.byref(size)), fn_name, hex(param))
    if size.value == 0:
        return b""
    buf = ctypes.create_string_buffer(size.value)
    _check(fn(handle, *extra, param, size.value, buf, None), fn_name, hex(param))
    return buf.raw[:size.value]


def _info_str(lib: _Library, fn_name: str, handle: int, param: int) -> str:
    return _info_bytes(lib, fn_name, handle, param).split(b"\0", 1)[0].decode("utf-8", "replace").strip()


def _info_uint(lib: _Library, fn_name: str, handle: int, param: int, fmt: str) -> int:
    raw = _info_bytes(lib, fn_name, handle, param)
    return struct.unpack("=" + fmt, raw[:struct.calcsize(fmt)])[0]


_SIZE_FMT = "Q" if ctypes.sizeof(ctypes.c_size_t) == 8 else "I"


def _enumerate_devices(lib: _Library) -> List[Tuple[int, int]]:
    """(platform, device) handles in tether's device order: every platform's GPUs and accelerators first, then
    every platform's CPU devices (pocl's device is one), so ``opencl:0`` is the real GPU where there is one."""
    count = _uint(0)
    code = lib.clGetPlatformIDs(0, None, ctypes.byref(count))
    if code == -1001 or count.value == 0:   # CL_PLATFORM_NOT_FOUND_KHR: the loader found no driver (ICD)
        return []
    _check(code, "clGetPlatformIDs")
    platforms = (_h * count.value)()
    _check(lib.clGetPlatformIDs(count.value, platforms, None), "clGetPlatformIDs")
    out: List[Tuple[int, int]] = []
    for kinds in (CL_DEVICE_TYPE_GPU | CL_DEVICE_TYPE_ACCELERATOR, CL_DEVICE_TYPE_CPU):
        for platform in platforms:
            n = _uint(0)
            code = lib.clGetDeviceIDs(platform, kinds, 0, None, ctypes.byref(n))
            if code == CL_DEVICE_NOT_FOUND or n.value == 0:
                continue
            _check(code, "clGetDeviceIDs")
            devices = (_h * n.value)()
            _check(lib.clGetDeviceIDs(platform, kinds, n.value, devices, None), "clGetDeviceIDs")
            out.extend((platform, d) for d in devices)
    return out


def _device_type_name(bits: int) -> str:
    for bit, name in ((CL_DEVICE_TYPE_GPU, "gpu"), (CL_DEVICE_TYPE_ACCELERATOR, "accelerator"),
                      (CL_DEVICE_TYPE_CPU, "cpu"), (CL_DEVICE_TYPE_CUSTOM, "custom")):
        if bits & bit:
            return name
    return "other"


def _parse_version(text: str) -> Tuple[int, int]:
    """``"OpenCL C 1.2 pocl"`` / ``"OpenCL 3.0 CUDA"`` -> (1, 2) / (3, 0); (0, 0) when there is none."""
    for word in text.split():
        major, dot, minor = word.partition(".")
        if dot and major.isdigit() and minor[:1].isdigit():
            return int(major), int("".join(c for c in minor if c.isdigit()) or 0)
    return (0, 0)


def _device_info(lib: _Library, platform: int, device: int, index: int) -> Dict[str, Any]:
    def dev(param: int) -> str:
        return _info_str(lib, "clGetDeviceInfo", device, param)

    extensions = sorted(set(dev(CL_DEVICE_EXTENSIONS).split()))
    dims = _info_uint(lib, "clGetDeviceInfo", device, CL_DEVICE_MAX_WORK_ITEM_DIMENSIONS, "I")
    sizes_raw = _info_bytes(lib, "clGetDeviceInfo", device, CL_DEVICE_MAX_WORK_ITEM_SIZES)
    sizes = list(struct.unpack("=%d%s" % (dims, _SIZE_FMT), sizes_raw[:dims * ctypes.sizeof(ctypes.c_size_t)]))
    try:
        il = dev(CL_DEVICE_IL_VERSION) or None   # OpenCL >= 2.1 only; older devices refuse the query
    except GpuError:
        il = None
    kind = _info_uint(lib, "clGetDeviceInfo", device, CL_DEVICE_TYPE, "Q")
    return {
        "api": "opencl",
        "index": index,
        "name": dev(CL_DEVICE_NAME),
        "vendor": dev(CL_DEVICE_VENDOR),
        "driver": dev(CL_DRIVER_VERSION),
        "version": dev(CL_DEVICE_VERSION),
        "opencl_c_version": dev(CL_DEVICE_OPENCL_C_VERSION),
        "platform": _info_str(lib, "clGetPlatformInfo", platform, CL_PLATFORM_NAME),
        "platform_vendor": _info_str(lib, "clGetPlatformInfo", platform, CL_PLATFORM_VENDOR),
        "platform_version": _info_str(lib, "clGetPlatformInfo", platform, CL_PLATFORM_VERSION),
        "type": _device_type_name(kind),
        "compute_units": _info_uint(lib, "clGetDeviceInfo", device, CL_DEVICE_MAX_COMPUTE_UNITS, "I"),
        "clock_mhz": _info_uint(lib, "clGetDeviceInfo", device, CL_DEVICE_MAX_CLOCK_FREQUENCY, "I"),
        "memory_bytes": _info_uint(lib, "clGetDeviceInfo", device, CL_DEVICE_GLOBAL_MEM_SIZE, "Q"),
        "max_alloc_bytes": _info_uint(lib, "clGetDeviceInfo", device, CL_DEVICE_MAX_MEM_ALLOC_SIZE, "Q"),
        "max_threads_per_block": _info_uint(lib, "clGetDeviceInfo", device, CL_DEVICE_MAX_WORK_GROUP_SIZE,
                                            _SIZE_FMT),
        "max_block": (sizes + [1, 1, 1])[:3],
        "shared_memory_bytes": _info_uint(lib, "clGetDeviceInfo", device, CL_DEVICE_LOCAL_MEM_SIZE, "Q"),
        "timer_resolution_ns": _info_uint(lib, "clGetDeviceInfo", device, CL_DEVICE_PROFILING_TIMER_RESOLUTION,
                                          _SIZE_FMT),
        "extensions": extensions,
        "fp16": "cl_khr_fp16" in extensions,
        "fp64": "cl_khr_fp64" in extensions,
        "int8_dot": any(e in extensions for e in NEEDS_EXTENSIONS["int8_dot"]),
        "il": il,
    }


# --- programs and the device ------------------------------------------------------------------------------------
class OpenCLProgram:
    """A built program of one :class:`OpenCLDevice`: its cl_program, its kernels (cl_kernel by name, created
    once) and the ``launch_info`` dicts it was loaded with."""

    def __init__(self, device: "OpenCLDevice", handle: int, key: str, infos: Dict[str, Dict[str, Any]]):
        self.device_ref = weakref.ref(device)
        self.handle = handle
        self.key = key
        self.infos = infos
        self.kernels: Dict[str, int] = {}
        self.num_args: Dict[str, int] = {}
        self.max_threads: Dict[str, int] = {}   # CL_KERNEL_WORK_GROUP_SIZE
        self.required_block: Dict[str, Tuple[int, ...]] = {}   # CL_KERNEL_COMPILE_WORK_GROUP_SIZE, when set

    def __repr__(self) -> str:
        return "<OpenCLProgram %s kernels=%s>" % (self.key[:12], sorted(self.infos) or sorted(self.kernels))


class _State:
    """Everything a device must release, apart from the device object, so that a weakref.finalize can release
    it when the device is dropped without close()."""

    def __init__(self, lib: _Library):
        self.lib = lib
        self.pid = os.getpid()
        self.lock = threading.RLock()
        self.context: Optional[int] = None
        self.queue: Optional[int] = None
        self.buffers: Dict[int, int] = {}              # cl_mem -> bytes
        self.programs: Dict[str, OpenCLProgram] = {}   # sha256 -> program
        self.closed = False

    def release_mem(self, handle: int) -> None:
        if os.getpid() != self.pid:   # a forked child's copy: the driver state is the parent's
            return
        with self.lock:
            if self.buffers.pop(handle, None) is not None:
                self.lib.clReleaseMemObject(handle)

    def release(self) -> None:
        if os.getpid() != self.pid:
            self.closed = True
            return
        with self.lock:
            if self.closed:
                return
            self.closed = True
            lib = self.lib
            for handle in list(self.buffers):
                lib.clReleaseMemObject(handle)
            self.buffers.clear()
            for program in self.programs.values():
                for kernel in program.kernels.values():
                    lib.clReleaseKernel(kernel)
                program.kernels.clear()
                lib.clReleaseProgram(program.handle)
            self.programs.clear()
            # releasing the queue flushes it; commands still running keep their buffers alive until they end
            if self.queue:
                lib.clReleaseCommandQueue(self.queue)
            if self.context:
                lib.clReleaseContext(self.context)
            self.queue = self.context = None


class OpenCLDevice(DeviceAPI):
    """Device ``index`` of :meth:`available` (GPUs and accelerators of every platform, then CPU devices)."""

    name = "opencl"
    dlpack_type = KDL_OPENCL

    @classmethod
    def available(cls) -> List[Dict[str, Any]]:
        """``info()`` of every OpenCL device here, in index order; [] without a library or a driver."""
        try:
            return cls.list_devices()
        except GpuError:
            return []

    @classmethod
    def list_devices(cls) -> List[Dict[str, Any]]:
        """Like :meth:`available`, but a driver that fails while listing raises GpuError (naming the call)
        instead of looking like a machine without OpenCL."""
        try:
            lib = load_library()
        except GpuUnavailable:
            return []
        return [_device_info(lib, pl, dev, i) for i, (pl, dev) in enumerate(_enumerate_devices(lib))]

    def __init__(self, index: int = 0) -> None:
        super().__init__(index)
        lib = load_library()
        devices = _enumerate_devices(lib)
        if not devices:
            raise GpuUnavailable("this device has no OpenCL: %s lists no platform with a device (is an OpenCL "
                                 "driver installed? the ICD loader reads /etc/OpenCL/vendors)" % lib.path)
        if not 0 <= index < len(devices):
            raise GpuUnavailable("this device has no OpenCL device %d: %s lists %d (opencl:0..opencl:%d)" % (
                index, lib.path, len(devices), len(devices) - 1))
        self._platform, self._device = devices[index]
        self._lib = lib
        self._info = _device_info(lib, self._platform, self._device, index)
        self._state = state = _State(lib)
        self._finalizer = weakref.finalize(self, state.release)
        err = _int(0)
        device_arr = (_h * 1)(self._device)
        state.context = lib.clCreateContext(None, 1, device_arr, None, None, ctypes.byref(err))
        _check(err.value, "clCreateContext", self._info["name"])
        state.queue = lib.clCreateCommandQueue(state.context, self._device, CL_QUEUE_PROFILING_ENABLE,
                                               ctypes.byref(err))
        _check(err.value, "clCreateCommandQueue", self._info["name"])
        c_version = _parse_version(self._info["opencl_c_version"])
        self.build_options = BUILD_OPTIONS if c_version >= (1, 2) else ""

    def __repr__(self) -> str:
        return "<OpenCLDevice opencl:%d %s%s>" % (self.index, self._info["name"],
                                                  " closed" if self._state.closed else "")

    def info(self) -> Dict[str, Any]:
        return dict(self._info)

    def _live(self) -> _State:
        if self._state.closed:
            raise GpuError("opencl:%d is closed" % self.index)
        if os.getpid() != self._state.pid:
            # OpenCL drivers keep threads and locks a forked child does not have: every call could hang
            raise GpuError("opencl:%d was opened by process %d; a forked child must open its own device"
                           % (self.index, self._state.pid))
        return self._state

    def _own(self, buf: DeviceBuffer, what: str) -> int:
        if not isinstance(buf, DeviceBuffer) or buf.api is not self:
            raise ValueError("%s: expected a DeviceBuffer of opencl:%d, got %r" % (what, self.index, buf))
        if buf.handle is None or buf.handle not in self._state.buffers:
            raise GpuError("%s: the buffer was freed" % what)
        return buf.handle

    # memory -------------------------------------------------------------------------------------------------
    def alloc(self, nbytes: int) -> DeviceBuffer:
        """``nbytes`` of device memory (READ_WRITE). A 0-byte buffer is backed by 1 byte, because OpenCL has no
        empty buffer and an empty tensor still needs a valid cl_mem to pass to a kernel."""
        nbytes = int(nbytes)
        if nbytes < 0:
            raise ValueError("alloc: expected a byte count >= 0, got %d" % nbytes)
        state = self._live()
        err = _int(0)
        with state.lock:
            handle = self._lib.clCreateBuffer(state.context, CL_MEM_READ_WRITE, max(nbytes, 1), None,
                                              ctypes.byref(err))
            if err.value == -61 and nbytes > self._info["max_alloc_bytes"]:   # CL_INVALID_BUFFER_SIZE
                raise GpuError("clCreateBuffer(%d bytes) failed: CL_INVALID_BUFFER_SIZE (-61): %s allows at most "
                               "%d bytes per buffer (CL_DEVICE_MAX_MEM_ALLOC_SIZE)" % (
                                   nbytes, self._info["name"], self._info["max_alloc_bytes"]))
            _check(err.value, "clCreateBuffer", "%d bytes" % nbytes)
            state.buffers[handle] = nbytes
        buf = DeviceBuffer(self, handle, nbytes)
        # a buffer dropped without free() is released then; free() and close() make this a no-op
        buf.extra = weakref.finalize(buf, state.release_mem, handle)
        return buf

    def allocated_bytes(self) -> int:
        """Bytes of the buffers of this device not yet freed (0-byte buffers count 0)."""
        return sum(self._state.buffers.values())

    def free(self, buf: DeviceBuffer) -> None:
        """Release ``buf`` (a second free, or a free after close, does nothing)."""
        if not isinstance(buf, DeviceBuffer) or buf.api is not self:
            raise ValueError("free: expected a DeviceBuffer of opencl:%d, got %r" % (self.index, buf))
        if buf.handle is not None:
            self._state.release_mem(buf.handle)
            if isinstance(buf.extra, weakref.finalize):
                buf.extra.detach()
            buf.handle = None

    @staticmethod
    def _range(what: str, buf: DeviceBuffer, offset: int, nbytes: int) -> None:
        if offset < 0 or offset + nbytes > buf.nbytes:
            raise ValueError("%s: bytes [%d, %d) do not fit a buffer of %d bytes" % (
                what, offset, offset + nbytes, buf.nbytes))

    def upload(self, buf: DeviceBuffer, array: np.ndarray, offset: int = 0) -> None:
        state = self._live()
        handle = self._own(buf, "upload")
        host = np.ascontiguousarray(array)
        offset = int(offset)
        self._range("upload", buf, offset, host.nbytes)
        if host.nbytes == 0:
            return
        with state.lock:
            _check(self._lib.clEnqueueWriteBuffer(state.queue, handle, 1, offset, host.nbytes,
                                                  host.ctypes.data, 0, None, None),
                   "clEnqueueWriteBuffer", "%d bytes at %d" % (host.nbytes, offset))

    def download(self, buf: DeviceBuffer, out: np.ndarray, offset: int = 0) -> None:
        state = self._live()
        handle = self._own(buf, "download")
        if not isinstance(out, np.ndarray) or not out.flags.c_contiguous or not out.flags.writeable:
            raise ValueError("download: expected a writeable C-contiguous numpy array, got %s" % (
                type(out).__name__ if not isinstance(out, np.ndarray) else "a non-contiguous or read-only one"))
        offset = int(offset)
        self._range("download", buf, offset, out.nbytes)
        if out.nbytes == 0:
            return
        with state.lock:
            _check(self._lib.clEnqueueReadBuffer(state.queue, handle, 1, offset, out.nbytes,
                                                 out.ctypes.data, 0, None, None),
                   "clEnqueueReadBuffer", "%d bytes at %d" % (out.nbytes, offset))

    def copy(self, dst: DeviceBuffer, src: DeviceBuffer, nbytes: int, dst_offset: int = 0,
             src_offset: int = 0) -> None:
        state = self._live()
        dst_handle, src_handle = self._own(dst, "copy destination"), self._own(src, "copy source")
        nbytes, dst_offset, src_offset = int(nbytes), int(dst_offset), int(src_offset)
        if nbytes < 0:
            raise ValueError("copy: expected a byte count >= 0, got %d" % nbytes)
        self._range("copy source", src, src_offset, nbytes)
        self._range("copy destination", dst, dst_offset, nbytes)
        if nbytes == 0:
            return
        with state.lock:
            _check(self._lib.clEnqueueCopyBuffer(state.queue, src_handle, dst_handle, src_offset, dst_offset,
                                                 nbytes, 0, None, None),
                   "clEnqueueCopyBuffer", "%d bytes" % nbytes)

    # code ---------------------------------------------------------------------------------------------------
    def _check_kernel_info(self, info: Dict[str, Any]) -> None:
        """Refuse a kernel this device cannot run: a missing feature (GpuUnavailable) or a work-group or
        work-group memory over the device's limits (ModuleLoadError), in one line naming both sides."""
        name = info.get("name", "?")
        dev = self._info
        for need in info.get("needs") or ():
            exts = NEEDS_EXTENSIONS.get(need)
            if exts is None:
                raise GpuUnavailable("kernel %s needs %r, a feature the OpenCL runtime does not know (known: %s)" % (
                    name, need, ", ".join(sorted(NEEDS_EXTENSIONS))))
            if not any(e in dev["extensions"] for e in exts):
                raise GpuUnavailable("kernel %s needs %s, which %s (opencl:%d) lacks (no %s)" % (
                    name, need, dev["name"], self.index, " or ".join(exts)))
        block = [int(b) for b in (list(info.get("block") or [1, 1, 1]) + [1, 1, 1])[:3]]
        threads = block[0] * block[1] * block[2]
        if threads > dev["max_threads_per_block"]:
            raise ModuleLoadError("kernel %s: a work-group of %d threads %s exceeds %s's limit of %d "
                                  "(CL_DEVICE_MAX_WORK_GROUP_SIZE)" % (name, threads, tuple(block), dev["name"],
                                                                       dev["max_threads_per_block"]))
        for axis, (b, limit) in enumerate(zip(block, dev["max_block"])):
            if b > limit:
                raise ModuleLoadError("kernel %s: block %s is %d threads along %s, over %s's limit of %d "
                                      "(CL_DEVICE_MAX_WORK_ITEM_SIZES)" % (name, tuple(block), b, "xyz"[axis],
                                                                           dev["name"], limit))
        shared = int(info.get("shared_bytes") or 0)
        if shared > dev["shared_memory_bytes"]:
            raise ModuleLoadError("kernel %s: %d bytes of work-group memory exceed %s's %d "
                                  "(CL_DEVICE_LOCAL_MEM_SIZE)" % (name, shared, dev["name"],
                                                                  dev["shared_memory_bytes"]))

    def load(self, code: bytes, kernels: Sequence[Dict[str, Any]] = ()) -> OpenCLProgram:
        """Build OpenCL C ``code`` (cached by sha256 of code and build options) after checking every kernel's
        ``launch_info`` against this device; GpuBuildError carries the compiler's log."""
        if isinstance(code, str):
            code = code.encode("utf-8")
        if not isinstance(code, (bytes, bytearray)):
            raise ValueError("load: expected OpenCL C source as bytes, got %s" % type(code).__name__)
        infos: Dict[str, Dict[str, Any]] = {}
        for info in kernels:
            if not isinstance(info, dict) or not isinstance(info.get("name"), str):
                raise ValueError("load: expected launch_info dicts with a 'name', got %r" % (info,))
            self._check_kernel_info(info)
            infos[info["name"]] = info
        state = self._live()
        key = hashlib.sha256(bytes(code) + b"\0" + self.build_options.encode()).hexdigest()
        with state.lock:
            program = state.programs.get(key)
            if program is None:
                program = self._build(bytes(code), key, sorted(infos))
                state.programs[key] = program
            for name, info in infos.items():
                self._kernel(program, name)
                self._check_kernel_limit(program, name, info)
            program.infos.update(infos)   # only launch_info that passed every check
        return program

    def _build(self, code: bytes, key: str, names: List[str]) -> OpenCLProgram:
        lib, state = self._lib, self._state
        err = _int(0)
        strings = (ctypes.c_char_p * 1)(code)
        lengths = (_size * 1)(len(code))
        handle = lib.clCreateProgramWithSource(state.context, 1, strings, lengths, ctypes.byref(err))
        _check(err.value, "clCreateProgramWithSource")
        device_arr = (_h * 1)(self._device)
        code_ = lib.clBuildProgram(handle, 1, device_arr, self.build_options.encode(), None, None)
        if code_ != CL_SUCCESS:
            try:
                log = _info_bytes(lib, "clGetProgramBuildInfo", handle, CL_PROGRAM_BUILD_LOG, self._device)
                log_text = log.split(b"\0", 1)[0].decode("utf-8", "replace").strip()
            except GpuError as exc:
                log_text = "(no build log: %s)" % exc
            if len(log_text) > MAX_BUILD_LOG:   # the first errors are what matters; a log can run to megabytes
                log_text = log_text[:MAX_BUILD_LOG] + "\n... (%d more characters of build log)" % (
                    len(log_text) - MAX_BUILD_LOG)
            lib.clReleaseProgram(handle)
            raise GpuBuildError("OpenCL build of %s for %s failed: %s\n%s" % (
                ", ".join(names) or "a program", self._info["name"], error_name(code_), log_text))
        return OpenCLProgram(self, handle, key, {})

    def _kernel(self, program: OpenCLProgram, name: str) -> int:
        """The cl_kernel ``name`` of ``program`` (created once), after checking the limits the driver sets for
        this very kernel (its work-group size can be below the device's, e.g. when it uses many registers)."""
        kernel = program.kernels.get(name)
        if kernel is not None:
            return kernel
        lib = self._lib
        err = _int(0)
        kernel = lib.clCreateKernel(program.handle, name.encode("utf-8"), ctypes.byref(err))
        _check(err.value, "clCreateKernel", name)
        try:
            program.num_args[name] = _info_uint(lib, "clGetKernelInfo", kernel, CL_KERNEL_NUM_ARGS, "I")
            wg = _size(0)
            _check(lib.clGetKernelWorkGroupInfo(kernel, self._device, CL_KERNEL_WORK_GROUP_SIZE,
                                                ctypes.sizeof(wg), ctypes.byref(wg), None),
                   "clGetKernelWorkGroupInfo", name)
            program.max_threads[name] = wg.value
            required = (_size * 3)()
            _check(lib.clGetKernelWorkGroupInfo(kernel, self._device, CL_KERNEL_COMPILE_WORK_GROUP_SIZE,
                                                ctypes.sizeof(required), required, None),
                   "clGetKernelWorkGroupInfo", name)
            if any(required):   # __attribute__((reqd_work_group_size(x, y, z))) in the source
                program.required_block[name] = tuple(int(r) for r in required)
        except BaseException:
            lib.clReleaseKernel(kernel)
            raise
        program.kernels[name] = kernel
        return kernel

    def _check_kernel_limit(self, program: OpenCLProgram, name: str, info: Dict[str, Any]) -> None:
        block = [int(b) for b in (list(info.get("block") or [1, 1, 1]) + [1, 1, 1])[:3]]
        threads = block[0] * block[1] * block[2]
        required = program.required_block.get(name)
        if required is not None and tuple(block) != required:
            raise ModuleLoadError("kernel %s: launched with block %s, but its source requires %s "
                                  "(reqd_work_group_size)" % (name, tuple(block), required))
        if threads > program.max_threads[name]:
            raise ModuleLoadError("kernel %s: a work-group of %d threads %s exceeds the %d this kernel allows on "
                                  "%s (CL_KERNEL_WORK_GROUP_SIZE)" % (name, threads, tuple(block),
                                                                      program.max_threads[name], self._info["name"]))

    # launches -----------------------------------------------------------------------------------------------
    def _set_args(self, kernel: int, name: str, nargs: int, args: Sequence[KernelArg]) -> None:
        lib = self._lib
        if len(args) < nargs:
            # A cached cl_kernel keeps the previous launch's arguments, so the driver would not notice missing
            # ones: refuse here with the error OpenCL defines for arguments left unset.
            raise GpuError("clEnqueueNDRangeKernel(%s) refused: CL_INVALID_KERNEL_ARGS (the kernel takes %d "
                           "arguments, %d given)" % (name, nargs, len(args)))
        for i, arg in enumerate(args):
            if isinstance(arg, DeviceBuffer):
                mem = _h(self._own(arg, "argument %d of %s" % (i, name)))
                code = lib.clSetKernelArg(kernel, i, ctypes.sizeof(mem), ctypes.byref(mem))
            elif isinstance(arg, (bool, int, np.integer)):
                value = int(arg)
                if not -(1 << 31) <= value < (1 << 31):
                    raise ValueError("argument %d of %s: %d does not fit the kernel's int32" % (i, name, value))
                scalar = _int(value)
                code = lib.clSetKernelArg(kernel, i, ctypes.sizeof(scalar), ctypes.byref(scalar))
            elif isinstance(arg, (float, np.floating)):
                fscalar = ctypes.c_float(float(arg))
                code = lib.clSetKernelArg(kernel, i, ctypes.sizeof(fscalar), ctypes.byref(fscalar))
            else:
                raise ValueError("argument %d of %s: expected a DeviceBuffer, int or float, got %s" % (
                    i, name, type(arg).__name__))
            if code != CL_SUCCESS:
                hint = " (the kernel takes %d arguments, %d given)" % (nargs, len(args)) if i >= nargs else ""
                raise GpuError("clSetKernelArg(%s, %d) failed: %s (%d)%s" % (name, i, error_name(code), code, hint))

    @staticmethod
    def _dims(what: str, value: Sequence[int]) -> List[int]:
        dims = [int(v) for v in value]
        if not 1 <= len(dims) <= 3 or any(d < 0 for d in dims):
            raise ValueError("%s: expected 1 to 3 sizes >= 0, got %r" % (what, tuple(value)))
        return (dims + [1, 1, 1])[:3]

    def _enqueue(self, program: OpenCLProgram, kernel_name: str, args: Sequence[KernelArg],
                 grid: Sequence[int], block: Sequence[int], event: Optional[Any]) -> bool:
        """Set the arguments and enqueue one launch; False (nothing enqueued) when the grid is empty."""
        if not isinstance(program, OpenCLProgram) or program.device_ref() is not self:
            raise ValueError("launch: expected a program loaded on opencl:%d, got %r" % (self.index, program))
        g, b = self._dims("grid", grid), self._dims("block", block)
        if 0 in b:
            raise ValueError("launch of %s: block %r has an empty dimension" % (kernel_name, tuple(block)))
        state = self._live()
        with state.lock:
            kernel = self._kernel(program, kernel_name)
            self._set_args(kernel, kernel_name, program.num_args[kernel_name], args)
            if 0 in g:   # an empty tensor's launch: nothing to run (OpenCL 1.2 refuses a 0 global size)
                return False
            # trailing dimensions of 1 are left out: get_global_id(d) is 0 and get_num_groups(d) 1 beyond work_dim
            work_dim = 3 if g[2] * b[2] > 1 else 2 if g[1] * b[1] > 1 else 1
            global_size = (_size * 3)(*(g[d] * b[d] for d in range(3)))
            local_size = (_size * 3)(*b)
            code = self._lib.clEnqueueNDRangeKernel(state.queue, kernel, work_dim, None, global_size, local_size,
                                                    0, None, event)
            if code != CL_SUCCESS:
                raise GpuError("clEnqueueNDRangeKernel(%s, grid=%s, block=%s) failed: %s (%d)" % (
                    kernel_name, tuple(g), tuple(b), error_name(code), code))
        return True

    def launch(self, program: OpenCLProgram, kernel: str, args: Sequence[KernelArg], grid: Tuple[int, int, int],
               block: Tuple[int, int, int]) -> None:
        self._enqueue(program, kernel, args, grid, block, None)

    def synchronize(self) -> None:
        """Wait for every enqueued command (clFinish: unbounded by design in OpenCL; the server's watchdog
        bounds a hung kernel)."""
        state = self._live()
        _check(self._lib.clFinish(state.queue), "clFinish")

    def timed(self, program: OpenCLProgram, kernel: str, args: Sequence[KernelArg], grid: Tuple[int, int, int],
              block: Tuple[int, int, int]) -> float:
        """Seconds one launch took on the device (CL_PROFILING_COMMAND_START to END); 0.0 for an empty grid."""
        lib = self._lib
        event = _h()
        if not self._enqueue(program, kernel, args, grid, block, ctypes.byref(event)):
            return 0.0
        try:
            _check(lib.clWaitForEvents(1, ctypes.byref(event)), "clWaitForEvents", kernel)
            status = _int(0)
            _check(lib.clGetEventInfo(event, CL_EVENT_COMMAND_EXECUTION_STATUS, ctypes.sizeof(status),
                                      ctypes.byref(status), None), "clGetEventInfo", kernel)
            if status.value < 0:
                raise GpuError("launch of %s failed on the device: %s (%d)" % (kernel, error_name(status.value),
                                                                               status.value))
            start, end = _ulong(0), _ulong(0)
            for param, out in ((CL_PROFILING_COMMAND_START, start), (CL_PROFILING_COMMAND_END, end)):
                _check(lib.clGetEventProfilingInfo(event, param, ctypes.sizeof(out), ctypes.byref(out), None),
                       "clGetEventProfilingInfo", kernel)
        finally:
            lib.clReleaseEvent(event)
        return max(end.value - start.value, 0) * 1e-9

    def close(self) -> None:
        """Release every buffer, program, the queue and the context (a second close does nothing)."""
        self._finalizer()


__all__ = ["OpenCLDevice", "OpenCLProgram", "CL_ERRORS", "error_name", "load_library", "library_candidates",
           "library_loaded", "FUNCTIONS", "LIBRARY_ENV", "LIBRARY_CANDIDATES", "BUILD_OPTIONS", "NEEDS_EXTENSIONS"]
