"""GPU modules in the device runtime: vetting one, loading its device code, and calling its functions.

A module built for a GPU target (docs/gpu.md "GPU modules") is the host CPU's shared library whose metadata has a
``"device"`` entry: the API, the code's format, length and sha256, each kernel's launch_info and, per function,
its arguments, temporaries and launch sequence. The code itself is the section ``.tether_device`` of the file,
read here without running anything of the module.

- :func:`check_device` refuses, in one line naming the module, a module whose API this device lacks
  (GpuUnavailable: "vadd.so runs on OpenCL; this device has no OpenCL: libOpenCL.so.1 not found ...");
- :func:`load_device_code` opens the device (``"opencl:0"`` unless told otherwise), checks the code against the
  metadata and loads it (``DeviceAPI.load``, which refuses a missing feature such as fp16 or a work-group over
  the device's limit);
- :class:`GpuFunction` runs one function: device arrays (anything with a ``.buffer`` DeviceBuffer of the same
  device, ``.shape`` and ``.dtype``) are passed as they are; numpy arrays are uploaded, launched on and the
  outputs downloaded back into them (convenient, but every call copies: keep data on the device for speed).
  Temporaries are allocated once per function, at its first call.

Only the standard library and numpy: this runs on the device.
"""
from __future__ import annotations

import hashlib
import os
import threading
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from ..dtypes import numpy_dtype
from ..elf import ElfFile
from ..errors import KernelError, ModuleLoadError
from .api import DeviceAPI, DeviceBuffer, GpuUnavailable
from .devices import open_device

DEVICE_SECTION = ".tether_device"
DEVICE_META_VERSION = 1
API_TITLES = {"opencl": "OpenCL", "vulkan": "Vulkan", "cuda": "CUDA"}
# the code format each API's DeviceAPI.load takes
API_FORMATS = {"opencl": "opencl-c", "vulkan": "spirv", "cuda": "ptx"}

# devices opened by spec for modules, shared by every module of the process: (pid, spec) -> device
_devices: Dict[Tuple[int, str], DeviceAPI] = {}
_devices_lock = threading.Lock()


def _api_class(api: str) -> Optional[type]:
    from . import devices

    return devices._api_classes().get(api)


def available_apis() -> Dict[str, Union[List[Dict[str, Any]], str]]:
    """Per GPU API: the info() of each of its devices here, or a string saying why there is none."""
    out: Dict[str, Union[List[Dict[str, Any]], str]] = {}
    for api in API_TITLES:
        out[api] = _devices_of(api)
    return out


def _devices_of(api: str) -> Union[List[Dict[str, Any]], str]:
    cls = _api_class(api)
    if cls is None:
        return "this tether_rpc has no %s runtime" % API_TITLES.get(api, api)
    found = cls.available()
    if found:
        return found
    try:   # opening device 0 says why there is none (the library missing, no platform...)
        cls(0).close()
    except GpuUnavailable as exc:
        return str(exc)
    except Exception as exc:   # (a driver's own failure)
        return "%s: %s" % (type(exc).__name__, exc)
    return "no device listed"


def device_entry(meta: Dict[str, Any], label: str) -> Optional[Dict[str, Any]]:
    """The metadata's "device" entry, checked for shape; None for a CPU module."""
    dev = meta.get("device")
    if dev is None:
        return None
    if not isinstance(dev, dict) or dev.get("version") != DEVICE_META_VERSION:
        raise ModuleLoadError("%s: metadata 'device' is not a version-%d device entry (rebuild the module with a "
                              "matching tether)" % (label, DEVICE_META_VERSION))
    api = dev.get("api")
    if api not in API_TITLES or API_FORMATS[api] != dev.get("format"):
        raise ModuleLoadError("%s: metadata 'device' names API %r with code format %r; expected one of %s" % (
            label, api, dev.get("format"), ", ".join("%s (%s)" % kv for kv in API_FORMATS.items())))
    names = {k.get("name") for k in dev.get("kernels") or [] if isinstance(k, dict)}
    funcs = dev.get("functions")
    if not isinstance(funcs, list) or not all(isinstance(f, dict) and isinstance(f.get("name"), str) for f in funcs):
        raise ModuleLoadError("%s: metadata 'device' 'functions' must be a list of objects with a 'name'" % label)
    for f in funcs:
        n_bufs = len(f.get("args") or []) + len(f.get("temporaries") or [])
        for launch in f.get("launches") or []:
            if launch.get("kernel") not in names or not all(
                    isinstance(i, int) and 0 <= i < n_bufs for i in launch.get("args") or []):
                raise ModuleLoadError("%s: function %s launches %r with arguments %r, which its metadata does not "
                                      "define (corrupt module)" % (label, f["name"], launch.get("kernel"),
                                                                   launch.get("args")))
    return dev


def check_device(meta: Dict[str, Any], label: str) -> None:
    """Refuse a GPU module on a device without its API (GpuUnavailable, one line naming module and API)."""
    dev = device_entry(meta, label)
    if dev is None:
        return
    found = _devices_of(dev["api"])
    if isinstance(found, str):
        raise GpuUnavailable("%s runs on %s; %s" % (label, API_TITLES[dev["api"]], found))


def read_device_code(elf: ElfFile, dev: Dict[str, Any], label: str) -> bytes:
    """The device code from section .tether_device, checked against the metadata's length and sha256."""
    sec = elf.section(DEVICE_SECTION)
    if sec is None:
        raise ModuleLoadError("%s: metadata has a 'device' entry but the file has no %s section (corrupt module)"
                              % (label, DEVICE_SECTION))
    code = elf.section_data(sec)[:int(dev.get("code_bytes") or 0)]
    if len(code) != dev.get("code_bytes") or hashlib.sha256(code).hexdigest() != dev.get("code_sha256"):
        raise ModuleLoadError("%s: the device code in %s does not match the metadata's length and sha256 (corrupt "
                              "module)" % (label, DEVICE_SECTION))
    return code


def _device_for(api: str, device: Any, label: str) -> Tuple[DeviceAPI, bool]:
    """(the device to run on, whether it is shared by the process): ``device`` is a DeviceAPI, an "api:index"
    spec, an index, None (device 0), or a callable taking the API's name and returning a DeviceAPI (a session's
    own devices, so the module and the session's device arrays share one context)."""
    if callable(device) and not isinstance(device, DeviceAPI):
        try:
            device = device(api)
        except GpuUnavailable as exc:
            raise GpuUnavailable("%s runs on %s; %s" % (label, API_TITLES[api], exc)) from None
    if isinstance(device, DeviceAPI):
        if device.name != api:
            raise ModuleLoadError("%s runs on %s, not on %s device %s" % (label, API_TITLES[api],
                                                                         device.name, device.index))
        return device, False
    if device is None or isinstance(device, int):
        spec = "%s:%d" % (api, device or 0)
    else:
        spec = str(device)
        if spec.partition(":")[0] != api:
            raise ModuleLoadError("%s runs on %s; cannot load it on device %r" % (label, API_TITLES[api], spec))
    key = (os.getpid(), spec)   # (a forked child opens its own: a driver's threads do not survive fork)
    with _devices_lock:
        dev = _devices.get(key)
        if dev is None:
            try:
                dev = open_device(spec)
            except GpuUnavailable as exc:
                raise GpuUnavailable("%s runs on %s; %s" % (label, API_TITLES[api], exc)) from None
            _devices[key] = dev
    return dev, True


class GpuProgram:
    """A GPU module's code loaded on one device, and its functions."""

    def __init__(self, label: str, dev_meta: Dict[str, Any], device: DeviceAPI, program: Any):
        self.label = label
        self.meta = dev_meta
        self.device = device
        self.program = program
        self.kernels = {k["name"]: k for k in dev_meta["kernels"]}
        self.functions = {f["name"]: f for f in dev_meta["functions"]}
        self._calls: Dict[str, GpuFunction] = {}

    def function(self, module: Any, name: str) -> "GpuFunction":
        f = self._calls.get(name)
        if f is None:
            f = self._calls[name] = GpuFunction(module, self, name, self.functions[name])
        return f

    def release(self) -> None:
        """Free every buffer the functions allocated (the device stays open: it may be shared)."""
        for f in self._calls.values():
            f.release()
        self._calls = {}


def load_device_code(elf: ElfFile, meta: Dict[str, Any], label: str, device: Any = None) -> GpuProgram:
    """Open the module's device and load its code there; GpuUnavailable / GpuBuildError / ModuleLoadError in
    one line naming the module (the API missing, a feature such as fp16 missing, a work-group too large)."""
    dev_meta = device_entry(meta, label)
    assert dev_meta is not None
    code = read_device_code(elf, dev_meta, label)
    dev, _ = _device_for(dev_meta["api"], device, label)
    try:
        program = dev.load(code, dev_meta["kernels"])
    except ModuleLoadError as exc:   # (GpuUnavailable, GpuBuildError: the device's own words, with the module's)
        raise type(exc)("%s: %s" % (label, exc)) from None
    return GpuProgram(label, dev_meta, dev, program)


def _describe(value: Any) -> str:
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return "%s array of shape %s" % (getattr(value.dtype, "name", value.dtype), tuple(value.shape))
    return type(value).__name__


class GpuFunction:
    """One function of a GPU module: ``f(*arrays)`` launches its kernels in order and waits for them."""

    def __init__(self, module: Any, program: GpuProgram, name: str, info: Dict[str, Any]):
        self.module = module
        self.program = program
        self.name = name
        self.info = info
        self.arg_info: List[Dict[str, Any]] = list(info.get("args") or [])
        self.device = program.device
        self._temporaries: Optional[List[DeviceBuffer]] = None
        self._staging: Dict[int, DeviceBuffer] = {}    # argument index -> the buffer a numpy argument goes through
        self._lock = threading.Lock()
        # the arguments some kernel writes: downloaded back into numpy arguments after a call
        outputs = info.get("outputs")
        self._outputs = set(outputs) if isinstance(outputs, list) else set(range(len(self.arg_info)))

    def __repr__(self) -> str:
        return "GpuFunction(%s(%s) on %s:%d)" % (self.name, ", ".join(a["name"] for a in self.arg_info),
                                                 self.device.name, self.device.index)

    def _buffer_of(self, i: int, a: Any, host: List[Tuple[int, np.ndarray]]) -> DeviceBuffer:
        spec = self.arg_info[i]
        shape, dtype = tuple(spec["shape"]), spec["dtype"]
        want = "%s array of shape %s" % (dtype, shape)
        buf = getattr(a, "buffer", None)
        if isinstance(buf, DeviceBuffer):
            if buf.api is not self.device:
                raise KernelError("%s: argument %d (%s) is on another device than the module's %s:%d"
                                  % (self.name, i, spec["name"], self.device.name, self.device.index))
            if tuple(a.shape) != shape or str(a.dtype) != dtype:
                raise KernelError("%s: argument %d (%s) must be a %s, got a %s" % (
                    self.name, i, spec["name"], want, _describe(a)))
            return buf
        host_view = getattr(a, "array", None)     # (a tether_rpc.ndarray.NDArray: its zero-copy numpy view)
        if isinstance(host_view, np.ndarray) and not isinstance(a, np.ndarray):
            a = host_view
        if isinstance(a, np.ndarray):
            if tuple(a.shape) != shape or a.dtype != numpy_dtype(dtype) or not a.flags.c_contiguous:
                raise KernelError("%s: argument %d (%s) must be a C-contiguous %s, got a %s" % (
                    self.name, i, spec["name"], want, _describe(a)))
            staged = self._staging.get(i)
            if staged is None:
                staged = self._staging[i] = self.device.alloc(max(a.nbytes, 1))
            self.device.upload(staged, a)
            host.append((i, a))
            return staged
        raise KernelError("%s: argument %d (%s) must be a device array or a numpy %s, got %s" % (
            self.name, i, spec["name"], want, _describe(a)))

    def _temps(self) -> List[DeviceBuffer]:
        if self._temporaries is None:
            self._temporaries = [self.device.alloc(max(int(t["size"]) * numpy_dtype(t["dtype"]).itemsize, 1))
                                 for t in self.info.get("temporaries") or []]
        return self._temporaries

    def _prepare(self, args: Sequence[Any]) -> Tuple[List[DeviceBuffer], List[Tuple[int, np.ndarray]]]:
        if len(args) != len(self.arg_info):
            raise KernelError("%s takes %d arguments (%s), got %d" % (
                self.name, len(self.arg_info), ", ".join(a["name"] for a in self.arg_info), len(args)))
        if self.program.program is None:
            raise ModuleLoadError("%s: module %s was closed" % (self.name, self.program.label))
        host: List[Tuple[int, np.ndarray]] = []
        buffers = [self._buffer_of(i, a, host) for i, a in enumerate(args)] + self._temps()
        return buffers, host

    def _launches(self, buffers: List[DeviceBuffer]) -> List[Tuple[str, List[DeviceBuffer], Tuple[int, ...],
                                                                    Tuple[int, ...]]]:
        kernels = self.program.kernels
        out = []
        for launch in self.info["launches"]:
            k = kernels[launch["kernel"]]
            out.append((k["name"], [buffers[j] for j in launch["args"]], tuple(k["grid"]), tuple(k["block"])))
        return out

    def _download(self, buffers: List[DeviceBuffer], host: List[Tuple[int, np.ndarray]]) -> None:
        for i, a in host:
            if i in self._outputs:
                self.device.download(buffers[i], a)

    def __call__(self, *args: Any) -> None:
        with self._lock:
            buffers, host = self._prepare(args)
            for name, bufs, grid, block in self._launches(buffers):
                self.device.launch(self.program.program, name, bufs, grid, block)
            self.device.synchronize()
            self._download(buffers, host)

    def timed(self, *args: Any) -> float:
        """One call, timed on the device's clock: the sum of its launches' execution times (``DeviceAPI.timed``:
        OpenCL profiling events, Vulkan timestamps, CUDA events). Uploads and downloads of numpy arguments happen
        outside the timed spans; so do the gaps between launches (each launch is timed alone, after the queue
        drained), which the host's clock would add and a device's event timeline does not show."""
        with self._lock:
            buffers, host = self._prepare(args)
            total = 0.0
            for name, bufs, grid, block in self._launches(buffers):
                total += float(self.device.timed(self.program.program, name, bufs, grid, block))
            self._download(buffers, host)
        return total

    def bind(self, *args: Any) -> Callable[[], None]:
        """A call of this function on these arguments, for timing loops."""
        return lambda: self(*args)

    def bind_timed(self, *args: Any) -> Callable[[], float]:
        """A call of this function on these arguments returning its device-clock seconds (see ``timed``): what
        ``time_evaluator`` and ``tether.bench.run`` measure a GPU function with."""
        return lambda: self.timed(*args)

    def release(self) -> None:
        with self._lock:
            for buf in list(self._staging.values()) + list(self._temporaries or []):
                try:
                    self.device.free(buf)
                except Exception:   # (a device closed under us: its buffers went with it)
                    pass
            self._staging, self._temporaries = {}, None


__all__ = ["available_apis", "check_device", "device_entry", "read_device_code", "load_device_code",
           "GpuProgram", "GpuFunction", "DEVICE_SECTION"]
