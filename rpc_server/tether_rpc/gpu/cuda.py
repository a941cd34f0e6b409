"""CUDA through the driver API (``libcuda.so.1``, what the NVIDIA driver installs) with ctypes: no CUDA toolkit,
no runtime library. Kernels arrive as PTX text (tether.codegen.ptx), which the driver JIT-compiles for its GPU.

Not yet run on an NVIDIA GPU: written against the driver API's documented signatures and tested only for the
missing-driver path (tests/test_gpu_cuda.py); ``scripts/gpu_cuda_check.py`` is the check to run on a machine with
one (docs/gpu.md "CUDA (PTX)").

Each call makes the device's primary context current on the calling thread first (the RPC server may call from
several threads; the primary context is the one the CUDA runtime and other libraries share). Launches go to the
default stream; copies to and from the host return when the host memory may be reused.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .api import KDL_CUDA, DeviceAPI, DeviceBuffer, GpuBuildError, GpuError, GpuUnavailable, KernelArg

LIBRARY_ENV = "TETHER_CUDA_LIBRARY"
DEFAULT_LIBRARY = "libcuda.so.1"

# CUdevice_attribute (cuda.h)
_ATTR = {"max_threads_per_block": 1, "max_block_x": 2, "max_block_y": 3, "max_block_z": 4, "max_grid_x": 5,
         "max_grid_y": 6, "max_grid_z": 7, "shared_memory_bytes": 8, "warp_size": 10,
         "compute_units": 16, "cc_major": 75, "cc_minor": 76}
# CUjit_option (cuda.h)
_JIT_INFO_LOG_BUFFER, _JIT_INFO_LOG_BUFFER_SIZE_BYTES = 3, 4
_JIT_ERROR_LOG_BUFFER, _JIT_ERROR_LOG_BUFFER_SIZE_BYTES = 5, 6
_JIT_LOG_VERBOSE = 12
_LOG_BYTES = 64 * 1024

_c = ctypes
_P = _c.POINTER
# name -> (argument types); every driver function returns CUresult (an int, 0 = CUDA_SUCCESS)
_SIGNATURES: Dict[str, Tuple[Any, ...]] = {
    "cuInit": (_c.c_uint,),
    "cuDriverGetVersion": (_P(_c.c_int),),
    "cuDeviceGetCount": (_P(_c.c_int),),
    "cuDeviceGet": (_P(_c.c_int), _c.c_int),
    "cuDeviceGetName": (_c.c_char_p, _c.c_int, _c.c_int),
    "cuDeviceGetAttribute": (_P(_c.c_int), _c.c_int, _c.c_int),
    "cuDeviceTotalMem_v2": (_P(_c.c_size_t), _c.c_int),
    "cuDevicePrimaryCtxRetain": (_P(_c.c_void_p), _c.c_int),
    "cuDevicePrimaryCtxRelease_v2": (_c.c_int,),
    "cuCtxSetCurrent": (_c.c_void_p,),
    "cuCtxSynchronize": (),
    "cuMemAlloc_v2": (_P(_c.c_uint64), _c.c_size_t),
    "cuMemFree_v2": (_c.c_uint64,),
    "cuMemcpyHtoD_v2": (_c.c_uint64, _c.c_void_p, _c.c_size_t),
    "cuMemcpyDtoH_v2": (_c.c_void_p, _c.c_uint64, _c.c_size_t),
    "cuMemcpyDtoD_v2": (_c.c_uint64, _c.c_uint64, _c.c_size_t),
    "cuModuleLoadDataEx": (_P(_c.c_void_p), _c.c_void_p, _c.c_uint, _P(_c.c_int), _P(_c.c_void_p)),
    "cuModuleUnload": (_c.c_void_p,),
    "cuModuleGetFunction": (_P(_c.c_void_p), _c.c_void_p, _c.c_char_p),
    "cuLaunchKernel": (_c.c_void_p, _c.c_uint, _c.c_uint, _c.c_uint, _c.c_uint, _c.c_uint, _c.c_uint, _c.c_uint,
                       _c.c_void_p, _P(_c.c_void_p), _P(_c.c_void_p)),
    "cuEventCreate": (_P(_c.c_void_p), _c.c_uint),
    "cuEventRecord": (_c.c_void_p, _c.c_void_p),
    "cuEventSynchronize": (_c.c_void_p,),
    "cuEventElapsedTime": (_P(_c.c_float), _c.c_void_p, _c.c_void_p),
    "cuEventDestroy_v2": (_c.c_void_p,),
    "cuGetErrorName": (_c.c_int, _P(_c.c_char_p)),
}

_DRIVER: Optional[ctypes.CDLL] = None


def driver() -> ctypes.CDLL:
    """libcuda, loaded and initialised once (``TETHER_CUDA_LIBRARY`` names another file); GpuUnavailable when
    it is missing or finds no GPU."""
    global _DRIVER
    if _DRIVER is not None:
        return _DRIVER
    path = os.environ.get(LIBRARY_ENV) or DEFAULT_LIBRARY
    try:
        lib = ctypes.CDLL(path)
    except OSError:
        where = " (%s)" % LIBRARY_ENV if os.environ.get(LIBRARY_ENV) else ""
        raise GpuUnavailable("this device has no CUDA: %s not found%s" % (path, where)) from None
    for name, argtypes in _SIGNATURES.items():
        try:
            fn = getattr(lib, name)
        except AttributeError:
            raise GpuUnavailable("this device has no usable CUDA: %s lacks %s (driver older than CUDA 11?)"
                                 % (path, name)) from None
        fn.argtypes = list(argtypes)
        fn.restype = ctypes.c_int
    rc = lib.cuInit(0)
    if rc != 0:
        raise GpuUnavailable("this device has no CUDA: cuInit failed with %s" % _error_name(lib, rc))
    _DRIVER = lib
    return lib


def _error_name(lib: ctypes.CDLL, rc: int) -> str:
    name = ctypes.c_char_p()
    if lib.cuGetErrorName(rc, ctypes.byref(name)) == 0 and name.value:
        return "%s (%d)" % (name.value.decode("ascii", "replace"), rc)
    return "CUresult %d" % rc


def _check(lib: ctypes.CDLL, rc: int, call: str) -> None:
    if rc != 0:
        raise GpuError("cuda: %s failed: %s" % (call, _error_name(lib, rc)))


def _attr(lib: ctypes.CDLL, dev: int, name: str) -> int:
    v = ctypes.c_int()
    _check(lib, lib.cuDeviceGetAttribute(ctypes.byref(v), _ATTR[name], dev), "cuDeviceGetAttribute(%s)" % name)
    return v.value


def _device_info(lib: ctypes.CDLL, index: int) -> Dict[str, Any]:
    dev = ctypes.c_int()
    _check(lib, lib.cuDeviceGet(ctypes.byref(dev), index), "cuDeviceGet")
    d = dev.value
    name = ctypes.create_string_buffer(256)
    _check(lib, lib.cuDeviceGetName(name, 256, d), "cuDeviceGetName")
    mem = ctypes.c_size_t()
    _check(lib, lib.cuDeviceTotalMem_v2(ctypes.byref(mem), d), "cuDeviceTotalMem_v2")
    version = ctypes.c_int()
    _check(lib, lib.cuDriverGetVersion(ctypes.byref(version)), "cuDriverGetVersion")
    cc = (_attr(lib, d, "cc_major"), _attr(lib, d, "cc_minor"))
    return {"api": "cuda", "index": index, "name": name.value.decode("utf-8", "replace"), "vendor": "NVIDIA",
            "driver": "CUDA %d.%d" % (version.value // 1000, version.value % 1000 // 10),
            "compute_units": _attr(lib, d, "compute_units"), "memory_bytes": mem.value,
            "max_threads_per_block": _attr(lib, d, "max_threads_per_block"),
            "max_block": [_attr(lib, d, "max_block_" + a) for a in "xyz"],
            "max_grid": [_attr(lib, d, "max_grid_" + a) for a in "xyz"],
            "shared_memory_bytes": _attr(lib, d, "shared_memory_bytes"), "warp_size": _attr(lib, d, "warp_size"),
            "compute_capability": "%d.%d" % cc, "arch": "sm_%d%d" % cc, "extensions": [],
            # half arithmetic from sm_53, the 4-way int8 dot product (dp4a) from sm_61
            "fp16": cc >= (5, 3), "int8_dot": cc >= (6, 1)}


class _Program:
    """One loaded CUmodule and its kernels by name."""

    def __init__(self, module: int, functions: Dict[str, int]):
        self.module, self.functions = module, functions
        self.blocks: Dict[str, Tuple[int, ...]] = {}   # kernel -> the block its .reqntid requires


class CudaDevice(DeviceAPI):
    """One NVIDIA GPU through the CUDA driver API; buffers are CUdeviceptr values, programs loaded PTX."""

    name = "cuda"
    dlpack_type = KDL_CUDA

    @classmethod
    def available(cls) -> List[Dict[str, Any]]:
        try:
            lib = driver()
        except GpuUnavailable:
            return []
        count = ctypes.c_int()
        _check(lib, lib.cuDeviceGetCount(ctypes.byref(count)), "cuDeviceGetCount")
        return [_device_info(lib, i) for i in range(count.value)]

    def __init__(self, index: int = 0) -> None:
        super().__init__(index)
        self._lib = lib = driver()
        count = ctypes.c_int()
        _check(lib, lib.cuDeviceGetCount(ctypes.byref(count)), "cuDeviceGetCount")
        if not 0 <= index < count.value:
            raise GpuUnavailable("this device has no CUDA GPU %d: the driver lists %d" % (index, count.value))
        dev = ctypes.c_int()
        _check(lib, lib.cuDeviceGet(ctypes.byref(dev), index), "cuDeviceGet")
        self._dev = dev.value
        ctx = ctypes.c_void_p()
        _check(lib, lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), self._dev), "cuDevicePrimaryCtxRetain")
        self._ctx: Optional[int] = ctx.value
        self._buffers: Dict[int, DeviceBuffer] = {}
        self._programs: Dict[str, _Program] = {}
        self._info: Optional[Dict[str, Any]] = None

    # ---- helpers ------------------------------------------------------------------------------------------
    def _call(self, name: str, *args: Any) -> None:
        if self._ctx is None:
            raise GpuError("cuda: device %d is closed" % self.index)
        lib = self._lib
        _check(lib, lib.cuCtxSetCurrent(self._ctx), "cuCtxSetCurrent")
        _check(lib, getattr(lib, name)(*args), name)

    def _mine(self, buf: DeviceBuffer) -> DeviceBuffer:
        if not isinstance(buf, DeviceBuffer) or buf.api is not self:
            raise ValueError("cuda: %r is not a buffer of this CUDA device" % (buf,))
        return buf

    @staticmethod
    def _host(array: np.ndarray, what: str) -> np.ndarray:
        if not isinstance(array, np.ndarray) or not array.flags["C_CONTIGUOUS"]:
            raise ValueError("cuda: %s needs a C-contiguous numpy array" % what)
        return array

    @staticmethod
    def _span(buf: DeviceBuffer, offset: int, nbytes: int, what: str) -> None:
        if offset < 0 or offset + nbytes > buf.nbytes:
            raise ValueError("cuda: %s of %d bytes at offset %d does not fit the %d-byte buffer"
                             % (what, nbytes, offset, buf.nbytes))

    # ---- DeviceAPI --------------------------------------------------------------------------------------
    def info(self) -> Dict[str, Any]:
        if self._info is None:
            self._info = _device_info(self._lib, self.index)
        return dict(self._info)

    def alloc(self, nbytes: int) -> DeviceBuffer:
        nbytes = int(nbytes)
        if nbytes < 0:
            raise ValueError("cuda: cannot allocate %d bytes" % nbytes)
        ptr = ctypes.c_uint64(0)
        if nbytes:   # cuMemAlloc refuses 0 bytes; an empty buffer has no memory
            self._call("cuMemAlloc_v2", ctypes.byref(ptr), nbytes)
        buf = DeviceBuffer(self, ptr.value, nbytes)
        if ptr.value:
            self._buffers[ptr.value] = buf
        return buf

    def free(self, buf: DeviceBuffer) -> None:
        self._mine(buf)
        if buf.handle and self._buffers.pop(buf.handle, None) is not None:
            self._call("cuMemFree_v2", buf.handle)
        buf.handle = 0

    def upload(self, buf: DeviceBuffer, array: np.ndarray, offset: int = 0) -> None:
        self._mine(buf)
        array = self._host(array, "upload")
        self._span(buf, offset, array.nbytes, "upload")
        if array.nbytes:
            self._call("cuMemcpyHtoD_v2", buf.handle + offset, array.ctypes.data, array.nbytes)

    def download(self, buf: DeviceBuffer, out: np.ndarray, offset: int = 0) -> None:
        self._mine(buf)
        out = self._host(out, "download")
        if not out.flags["WRITEABLE"]:
            raise ValueError("cuda: download needs a writable array")
        self._span(buf, offset, out.nbytes, "download")
        if out.nbytes:
            self._call("cuMemcpyDtoH_v2", out.ctypes.data, buf.handle + offset, out.nbytes)

    def copy(self, dst: DeviceBuffer, src: DeviceBuffer, nbytes: int, dst_offset: int = 0,
             src_offset: int = 0) -> None:
        self._mine(dst)
        self._mine(src)
        self._span(dst, dst_offset, nbytes, "copy")
        self._span(src, src_offset, nbytes, "copy")
        if nbytes:
            self._call("cuMemcpyDtoD_v2", dst.handle + dst_offset, src.handle + src_offset, nbytes)

    def load(self, code: bytes, kernels: Sequence[Dict[str, Any]]) -> Any:
        data = code.encode("utf-8") if isinstance(code, str) else bytes(code)
        key = hashlib.sha256(data).hexdigest()
        program = self._programs.get(key)
        if program is None:
            program = self._programs[key] = _Program(self._load_module(data), {})
        for k in kernels:
            name = str(k["name"])
            if name not in program.functions:
                fn = ctypes.c_void_p()
                try:
                    self._call("cuModuleGetFunction", ctypes.byref(fn), program.module, name.encode("utf-8"))
                except GpuError as exc:
                    raise GpuBuildError("cuda: the PTX has no kernel %r (%s)" % (name, exc)) from None
                program.functions[name] = fn.value
            if k.get("block"):
                program.blocks[name] = tuple(int(b) for b in k["block"])
        return program

    def _load_module(self, ptx: bytes) -> int:
        info_log = ctypes.create_string_buffer(_LOG_BYTES)
        error_log = ctypes.create_string_buffer(_LOG_BYTES)
        options = (ctypes.c_int * 5)(_JIT_INFO_LOG_BUFFER, _JIT_INFO_LOG_BUFFER_SIZE_BYTES, _JIT_ERROR_LOG_BUFFER,
                                     _JIT_ERROR_LOG_BUFFER_SIZE_BYTES, _JIT_LOG_VERBOSE)
        # each value sits in a void* slot: buffers as pointers, sizes and flags as the integer itself
        values = (ctypes.c_void_p * 5)(ctypes.cast(info_log, ctypes.c_void_p), _LOG_BYTES,
                                       ctypes.cast(error_log, ctypes.c_void_p), _LOG_BYTES, 1)
        image = ctypes.create_string_buffer(ptx + b"\0")   # PTX is passed as a NUL-terminated string
        module = ctypes.c_void_p()
        if self._ctx is None:
            raise GpuError("cuda: device %d is closed" % self.index)
        lib = self._lib
        _check(lib, lib.cuCtxSetCurrent(self._ctx), "cuCtxSetCurrent")
        rc = lib.cuModuleLoadDataEx(ctypes.byref(module), ctypes.cast(image, ctypes.c_void_p), 5, options, values)
        if rc != 0:
            log = error_log.value.decode("utf-8", "replace").strip() or info_log.value.decode("utf-8", "replace")
            raise GpuBuildError("cuda: the driver refused the PTX: %s: %s" % (_error_name(lib, rc), log.strip()))
        return module.value

    def launch(self, program: Any, kernel: str, args: Sequence[KernelArg], grid: Tuple[int, int, int],
               block: Tuple[int, int, int]) -> None:
        fn = self._function(program, kernel)
        if len(tuple(grid)) != 3 or len(tuple(block)) != 3:
            raise ValueError("cuda: grid and block are (x, y, z), got %r and %r" % (grid, block))
        want = program.blocks.get(kernel)
        if want is not None and tuple(int(b) for b in block) != want:
            raise ValueError("cuda: kernel %r was built for blocks of %s threads (.reqntid), not %s"
                             % (kernel, want, tuple(block)))
        values = [self._arg(a) for a in args]
        # kernelParams: one pointer per argument, to its value; the driver copies the values at the launch
        params = (ctypes.c_void_p * max(len(values), 1))(*[ctypes.addressof(v) for v in values])
        g, b = [int(x) for x in grid], [int(x) for x in block]
        self._call("cuLaunchKernel", fn, g[0], g[1], g[2], b[0], b[1], b[2], 0, None, params, None)

    def _function(self, program: Any, kernel: str) -> int:
        if not isinstance(program, _Program) or kernel not in program.functions:
            raise ValueError("cuda: kernel %r was not loaded by this device's load()" % (kernel,))
        return program.functions[kernel]

    def _arg(self, a: KernelArg) -> Any:
        # the launch order of tether.tir.device: buffers (64-bit device pointers), then int32 scalars
        if isinstance(a, DeviceBuffer):
            return ctypes.c_uint64(self._mine(a).handle)
        if isinstance(a, (bool, np.bool_)):
            raise ValueError("cuda: a kernel argument is a buffer, an int or a float, not a bool")
        if isinstance(a, (int, np.integer)):
            return ctypes.c_int32(int(a))
        if isinstance(a, (float, np.floating)):
            return ctypes.c_float(float(a))
        raise ValueError("cuda: cannot pass %r as a kernel argument; expected a DeviceBuffer, int or float"
                         % (type(a).__name__,))

    def synchronize(self) -> None:
        self._call("cuCtxSynchronize")

    def timed(self, program: Any, kernel: str, args: Sequence[KernelArg], grid: Tuple[int, int, int],
              block: Tuple[int, int, int]) -> float:
        start, stop = ctypes.c_void_p(), ctypes.c_void_p()
        self._call("cuEventCreate", ctypes.byref(start), 0)
        try:
            self._call("cuEventCreate", ctypes.byref(stop), 0)
            try:
                self._call("cuEventRecord", start, None)
                self.launch(program, kernel, args, grid, block)
                self._call("cuEventRecord", stop, None)
                self._call("cuEventSynchronize", stop)
                ms = ctypes.c_float()
                self._call("cuEventElapsedTime", ctypes.byref(ms), start, stop)
                return ms.value / 1000.0
            finally:
                self._call("cuEventDestroy_v2", stop)
        finally:
            self._call("cuEventDestroy_v2", start)

    def close(self) -> None:
        if self._ctx is None:
            return
        lib = self._lib
        try:
            _check(lib, lib.cuCtxSetCurrent(self._ctx), "cuCtxSetCurrent")
            lib.cuCtxSynchronize()
            for handle, buf in list(self._buffers.items()):
                lib.cuMemFree_v2(handle)
                buf.handle = 0
            for program in self._programs.values():
                lib.cuModuleUnload(program.module)
        finally:
            self._buffers.clear()
            self._programs.clear()
            self._ctx = None
            lib.cuDevicePrimaryCtxRelease_v2(self._dev)

    def __repr__(self) -> str:
        return "CudaDevice(%d%s)" % (self.index, "" if self._ctx is not None else ", closed")


__all__ = ["CudaDevice", "driver", "LIBRARY_ENV", "DEFAULT_LIBRARY"]
