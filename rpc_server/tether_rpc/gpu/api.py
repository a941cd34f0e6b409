"""The interface every GPU device API implements (OpenCL, Vulkan, CUDA), so that modules, device arrays, the
graph executor and the RPC server use any of them the same way.

Kernels are launched with the argument order of ``tether.tir.device`` (docs/gpu.md): the buffers first, then
int32 scalars. Device memory is a :class:`DeviceBuffer`; numpy arrays cross only through ``upload`` and
``download``. Times come from the device's own clock (OpenCL profiling events, Vulkan timestamp queries, CUDA
events), never from the host's.

Only the standard library, numpy and ctypes: this runs on the device.
"""
from __future__ import annotations

from typing import Any, Dict, List, Sequence, Tuple, Union

import numpy as np

from ..errors import GpuBuildError, GpuError, GpuUnavailable

# DLPack device types (dlpack.h)
KDL_CUDA = 2
KDL_OPENCL = 4
KDL_VULKAN = 7


class DeviceBuffer:
    """``nbytes`` of device memory of one DeviceAPI; ``handle`` is the API's own (cl_mem, VkBuffer, CUdeviceptr)."""

    __slots__ = ("api", "handle", "nbytes", "extra", "__weakref__")

    def __init__(self, api: "DeviceAPI", handle: Any, nbytes: int, extra: Any = None):
        self.api, self.handle, self.nbytes, self.extra = api, handle, int(nbytes), extra


KernelArg = Union[DeviceBuffer, int, float]


class DeviceAPI:
    """One GPU of one API. Subclasses set ``name`` ("opencl", "vulkan", "cuda") and ``dlpack_type``."""

    name = "?"
    dlpack_type = 0

    @classmethod
    def available(cls) -> List[Dict[str, Any]]:
        """``info()`` of every device of this API on this machine; [] when the driver library is missing."""
        raise NotImplementedError

    def __init__(self, index: int = 0) -> None:
        self.index = index

    def info(self) -> Dict[str, Any]:
        """name, vendor, driver (version), compute_units, memory_bytes, max_threads_per_block,
        max_block (x, y, z), shared_memory_bytes, extensions (list), fp16 (bool), int8_dot (bool)."""
        raise NotImplementedError

    # memory ---------------------------------------------------------------------------------------------
    def alloc(self, nbytes: int) -> DeviceBuffer:
        raise NotImplementedError

    def free(self, buf: DeviceBuffer) -> None:
        raise NotImplementedError

    def upload(self, buf: DeviceBuffer, array: np.ndarray, offset: int = 0) -> None:
        """Copy a C-contiguous host array into ``buf`` at byte ``offset`` (returns when the copy is done)."""
        raise NotImplementedError

    def download(self, buf: DeviceBuffer, out: np.ndarray, offset: int = 0) -> None:
        """Copy ``out.nbytes`` from ``buf`` at byte ``offset`` into the C-contiguous host array ``out``."""
        raise NotImplementedError

    def copy(self, dst: DeviceBuffer, src: DeviceBuffer, nbytes: int, dst_offset: int = 0,
             src_offset: int = 0) -> None:
        raise NotImplementedError

    # code -----------------------------------------------------------------------------------------------
    def load(self, code: bytes, kernels: Sequence[Dict[str, Any]]) -> Any:
        """Build ``code`` (OpenCL C source, SPIR-V words, PTX text) once per distinct code (cached by hash) and
        return a program whose kernels (their ``launch_info`` from tether.tir.device) can be launched; raises
        GpuBuildError with the driver's log."""
        raise NotImplementedError

    def launch(self, program: Any, kernel: str, args: Sequence[KernelArg], grid: Tuple[int, int, int],
               block: Tuple[int, int, int]) -> None:
        """Enqueue one launch (asynchronous; ``synchronize`` waits)."""
        raise NotImplementedError

    def synchronize(self) -> None:
        raise NotImplementedError

    def timed(self, program: Any, kernel: str, args: Sequence[KernelArg], grid: Tuple[int, int, int],
              block: Tuple[int, int, int]) -> float:
        """Seconds one launch took on the device's clock."""
        raise NotImplementedError

    def close(self) -> None:
        """Release every buffer, program and the context; the object is unusable afterwards."""
        raise NotImplementedError


__all__ = ["DeviceAPI", "DeviceBuffer", "GpuError", "GpuUnavailable", "GpuBuildError", "KernelArg",
           "KDL_CUDA", "KDL_OPENCL", "KDL_VULKAN"]
