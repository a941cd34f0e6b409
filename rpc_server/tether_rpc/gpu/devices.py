"""The GPU APIs this device runtime knows, by name, and opening one of their devices by ``API:INDEX``."""
from __future__ import annotations

from typing import Dict

from .api import DeviceAPI


def open_device(spec: str) -> DeviceAPI:
    """``"opencl:0"``, ``"vulkan:1"``, ``"cuda:0"`` -> that device; GpuUnavailable naming what is missing."""
    api, _, index = spec.partition(":")
    if not (index or "0").isdigit():
        raise ValueError("%s: expected API:INDEX, e.g. opencl:0" % spec)
    cls = _api_classes().get(api)
    if cls is None:
        raise ValueError("%s: unknown GPU API %r; expected one of %s" % (spec, api, ", ".join(sorted(_api_classes()))))
    return cls(int(index or "0"))


def _api_classes() -> Dict[str, type]:
    # imported on use: each module loads its driver library only when asked
    out: Dict[str, type] = {}
    try:
        from .opencl import OpenCLDevice
        out["opencl"] = OpenCLDevice
    except ImportError:
        pass
    try:
        from .vulkan import VulkanDevice
        out["vulkan"] = VulkanDevice
    except ImportError:
        pass
    try:
        from .cuda import CudaDevice
        out["cuda"] = CudaDevice
    except ImportError:
        pass
    return out
