"""The GPU backends table: per GPU API, the format its device code is in and the emitter that writes it.

    backend("opencl").emit(kernels, gpu)    # -> bytes: OpenCL C source (tether.codegen.opencl_c)
    backend("vulkan").emit(kernels, gpu)    # -> bytes: a SPIR-V module (tether.codegen.spirv)
    backend("cuda").emit(kernels, gpu)      # -> bytes: PTX text for gpu.arch (tether.codegen.ptx)

An emitter takes every DeviceKernel of a module (one program, one entry point per kernel, named by the kernel)
and the target's GPU half, and returns the code the device runtime's ``DeviceAPI.load`` takes. It also leaves in
each kernel's ``needs`` the optional device features the code uses (fp16, fp64, int8_dot...), which the module's
metadata records and the runtime checks at load. Where the target promises half arithmetic (``gpu.fp16``), the
OpenCL C and SPIR-V emitters compute float16 in half precision (the kernel then needs "fp16"); otherwise, and in
PTX, float16 is stored as half and computed as float32, like the CPU. The table is filled explicitly below and
refuses a second entry for an API; each backend's module is imported only when a build uses it.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Dict, Sequence

from tether.errors import CompileError
from tether.gpu_target import GpuTarget
from tether.tir.device import DeviceKernel

Emitter = Callable[[Sequence[DeviceKernel], GpuTarget], bytes]


@dataclasses.dataclass(frozen=True)
class GpuBackend:
    api: str
    code_format: str     # module metadata "device" "format": "opencl-c", "spirv", "ptx"
    emit: Emitter


_BACKENDS: Dict[str, GpuBackend] = {}


def register(api: str, code_format: str, emit: Emitter) -> None:
    """Add the backend of one GPU API; a second one for the same API is an error."""
    if api in _BACKENDS:
        raise ValueError("GPU API %r already has a backend (%s)" % (api, _BACKENDS[api].code_format))
    _BACKENDS[api] = GpuBackend(api, code_format, emit)


def backend(api: str) -> GpuBackend:
    found = _BACKENDS.get(api)
    if found is None:
        raise CompileError("no GPU backend for %r; tether compiles for %s" % (api, ", ".join(sorted(_BACKENDS))))
    return found


def apis() -> Sequence[str]:
    return tuple(_BACKENDS)


def _missing(api: str, module: str, exc: ImportError) -> CompileError:
    return CompileError("the %s backend (%s) is not part of this tether: %s" % (api, module, exc))


def _opencl_c(kernels: Sequence[DeviceKernel], gpu: GpuTarget) -> bytes:
    try:
        from tether.codegen.opencl_c import opencl_needs, opencl_source
    except ImportError as exc:
        raise _missing("opencl", "tether.codegen.opencl_c", exc) from None
    source = opencl_source(list(kernels), fp16=gpu.fp16)
    for k in kernels:
        k.needs = opencl_needs(k, fp16=gpu.fp16)
    return source.encode("utf-8")


def _spirv(kernels: Sequence[DeviceKernel], gpu: GpuTarget) -> bytes:
    try:
        from tether.codegen.spirv import spirv_module
    except ImportError as exc:
        raise _missing("vulkan", "tether.codegen.spirv", exc) from None
    return bytes(spirv_module(list(kernels), fp16=gpu.fp16))    # (records fp16/int8/... in each kernel's needs itself)


def _ptx(kernels: Sequence[DeviceKernel], gpu: GpuTarget) -> bytes:
    try:
        from tether.codegen.ptx import ptx_module
    except ImportError as exc:
        raise _missing("cuda", "tether.codegen.ptx", exc) from None
    return ptx_module(list(kernels), arch=gpu.arch).encode("utf-8")


register("opencl", "opencl-c", _opencl_c)
register("vulkan", "spirv", _spirv)
register("cuda", "ptx", _ptx)
