"""Device arrays: an array's shape and dtype over one :class:`~.api.DeviceBuffer` of one GPU device API.

A :class:`DeviceArray` is the GPU twin of :class:`tether_rpc.ndarray.NDArray`: same dtypes (bfloat16 as uint16
bit patterns tagged ``bfloat16``), same C (row-major) order, but its bytes live in the device's memory and cross
to the host only through ``upload``/``download`` of its DeviceAPI. Copies between two arrays of the same DeviceAPI
object stay on the device (``DeviceAPI.copy``); any other pair (two APIs, two devices, a host array) goes through
host memory, because a buffer of one context means nothing to another.

``dltensor`` is the DLPack view a packed call takes: the device type of its API (kDLOpenCL, kDLVulkan, kDLCUDA)
and the device index, and as ``data`` the API's own handle (a cl_mem, a VkBuffer, a CUdeviceptr), which the
module's launcher hands to the driver; a CPU kernel must never dereference it.

Only the standard library, numpy and ctypes: this runs on the device.
"""
from __future__ import annotations

import ctypes
from typing import Any, Optional, Tuple, Union

import numpy as np

from ..dlpack import DLDevice, DLTensor, dtype_name, make_dltensor
from ..dtypes import name_of, numpy_dtype, storage_of
from ..errors import KernelError
from ..ndarray import NDArray, ShapeLike, nbytes_of, normalize_shape
from .api import DeviceAPI, DeviceBuffer

HostArray = Union[np.ndarray, NDArray]


#: the GPU APIs a device spec may name (each one's runtime module may be missing from a device's install)
API_TITLES = {"opencl": "OpenCL", "vulkan": "Vulkan", "cuda": "CUDA"}
#: the specs that mean host memory, as clients may write them
CPU_SPECS = frozenset(["cpu", "cpu:0"])


def canonical_spec(spec: Any) -> Optional[str]:
    """A client's device spec -> ``"API:INDEX"`` (``"opencl"`` is ``"opencl:0"``), or None for host memory
    (None, ``"cpu"``); ValueError naming the spec when it is no ``API:INDEX``."""
    if spec is None:
        return None
    if not isinstance(spec, str):
        raise ValueError("device must be a string such as 'opencl:0' or 'cpu', got %s" % type(spec).__name__)
    text = spec.strip().lower()
    if text in CPU_SPECS:
        return None
    api, sep, index = text.partition(":")
    if sep and not index.isdigit() or not api.isalnum():
        raise ValueError("device %r: expected API:INDEX such as opencl:0, vulkan:0 or cuda:0, or cpu" % spec)
    return "%s:%d" % (api, int(index or "0"))


def spec_of(device: DeviceAPI) -> str:
    """``"opencl:0"``: the API's name and the device's index, as clients name a device."""
    return "%s:%d" % (device.name, int(device.index))


class DeviceArray:
    """A C-contiguous array in one GPU device's memory (owns its buffer until :meth:`free`)."""

    __slots__ = ("device", "_shape", "_dtype", "_nbytes", "_buffer", "_dl", "__weakref__")

    def __init__(self, device: DeviceAPI, shape: ShapeLike, dtype: Any = "float32"):
        self.device = device
        self._shape = normalize_shape(shape)
        self._dtype = dtype_name(dtype)
        self._nbytes = nbytes_of(self._shape, self._dtype)
        # an empty array still holds a buffer (drivers refuse zero-byte ones), so every array has a handle
        self._buffer: Optional[DeviceBuffer] = device.alloc(max(self._nbytes, 1))
        self._dl: Optional[Tuple[DLTensor, Any]] = None

    # -- description -----------------------------------------------------------------------------------------
    @property
    def shape(self) -> Tuple[int, ...]:
        return self._shape

    @property
    def dtype(self) -> str:
        return self._dtype

    @property
    def nbytes(self) -> int:
        return self._nbytes

    @property
    def size(self) -> int:
        return int(np.prod(self._shape, dtype=np.int64))

    @property
    def ndim(self) -> int:
        return len(self._shape)

    @property
    def device_spec(self) -> str:
        return spec_of(self.device)

    @property
    def freed(self) -> bool:
        return self._buffer is None

    @property
    def buffer(self) -> DeviceBuffer:
        """The device memory (KernelError once freed)."""
        if self._buffer is None:
            raise KernelError("%r was freed" % (self,))
        return self._buffer

    def __repr__(self) -> str:
        return "DeviceArray(shape=%s, dtype=%s, device=%s%s)" % (self._shape, self._dtype, self.device_spec,
                                                                 ", freed" if self._buffer is None else "")

    # -- data movement ---------------------------------------------------------------------------------------
    def numpy(self) -> np.ndarray:
        """A fresh host copy (downloaded; bfloat16 as tagged uint16 like NDArray.numpy)."""
        out = np.empty(self._shape, numpy_dtype(self._dtype))
        self.download_into(out)
        return out

    asnumpy = numpy

    def download_into(self, out: np.ndarray) -> None:
        """Download into a C-contiguous host array of exactly this array's byte size (any view of it)."""
        if out.nbytes != self._nbytes or not out.flags.c_contiguous:
            raise KernelError("download: the host buffer holds %d bytes (contiguous: %s), %r holds %d"
                              % (out.nbytes, out.flags.c_contiguous, self, self._nbytes))
        if self._nbytes:
            self.device.download(self.buffer, out)

    def upload_from(self, src: np.ndarray) -> None:
        """Upload a C-contiguous host array of exactly this array's byte size."""
        if src.nbytes != self._nbytes or not src.flags.c_contiguous:
            raise KernelError("upload: the host buffer holds %d bytes (contiguous: %s), %r holds %d"
                              % (src.nbytes, src.flags.c_contiguous, self, self._nbytes))
        if self._nbytes:
            self.device.upload(self.buffer, src)

    def copyfrom(self, source: Any) -> "DeviceArray":
        """Copy ``source`` in: a DeviceArray, an NDArray, a numpy array or a nested list of the same shape and
        dtype."""
        if isinstance(source, DeviceArray):
            copy_array(self, source)
            return self
        if isinstance(source, NDArray):
            source = source.array
        src = _host_operand(np.asarray(source), self, "copyfrom")
        self.upload_from(src if src.flags.c_contiguous else np.ascontiguousarray(src).reshape(src.shape))
        return self

    def copyto(self, target: Any = None) -> Any:
        """Copy out into ``target`` (a DeviceArray on any device, an NDArray or a C-contiguous numpy array of the
        same shape and dtype) or into a new numpy array; returns the target."""
        if target is None:
            return self.numpy()
        if isinstance(target, DeviceArray):
            copy_array(target, self)
            return target
        view = target.array if isinstance(target, NDArray) else target
        if not isinstance(view, np.ndarray):
            raise KernelError("copyto: expected a DeviceArray, NDArray or numpy array, got %s"
                              % type(target).__name__)
        view = _host_operand(view, self, "copyto")
        if not view.flags.c_contiguous:
            raise KernelError("copyto: the numpy target must be C-contiguous")
        self.download_into(view)
        return target

    def free(self) -> None:
        """Give the device memory back now. Idempotent."""
        buf, self._buffer = self._buffer, None
        self._dl = None
        if buf is not None:
            self.device.free(buf)

    # -- ABI -------------------------------------------------------------------------------------------------
    @property
    def dltensor(self) -> DLTensor:
        """The DLPack view: device (API's DLPack type, index), data = the API's buffer handle."""
        if self._dl is None:
            tensor, keep = make_dltensor(handle_value(self.buffer.handle), self._shape, self._dtype)
            tensor.device = DLDevice(int(self.device.dlpack_type), int(self.device.index))
            self._dl = (tensor, keep)
        return self._dl[0]

    @property
    def dltensor_address(self) -> int:
        return ctypes.addressof(self.dltensor)


def handle_value(handle: Any) -> int:
    """An API handle (an int, or a ctypes pointer/integer such as c_void_p or c_uint64) as an int."""
    if isinstance(handle, int):
        return handle
    value = getattr(handle, "value", None)
    if isinstance(value, int):
        return value
    if value is None and hasattr(handle, "value"):
        return 0  # a NULL ctypes pointer
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value or 0
    except (TypeError, ctypes.ArgumentError) as exc:
        raise KernelError("cannot read a device buffer handle of type %s" % type(handle).__name__) from exc


def _host_operand(array: np.ndarray, dev: DeviceArray, what: str) -> np.ndarray:
    """``array`` as its storage view, refused unless its shape and dtype are the device array's."""
    src = storage_of(array)
    if tuple(src.shape) != dev.shape:
        raise KernelError("%s: shape %s does not match %r" % (what, tuple(src.shape), dev))
    if src.dtype != numpy_dtype(dev.dtype) or name_of(src.dtype) not in (dev.dtype, src.dtype.name):
        raise KernelError("%s: dtype %s does not match %r (convert with .astype(%r))"
                          % (what, name_of(src.dtype), dev, dev.dtype))
    return src


def copy_array(dst: Any, src: Any) -> None:
    """Copy every element of ``src`` into ``dst`` (DeviceArray or NDArray each, same shape and dtype): on the
    device when both are arrays of one DeviceAPI, else through host memory."""
    if tuple(dst.shape) != tuple(src.shape) or dst.dtype != src.dtype:
        raise KernelError("copy: %r and %r differ in shape or dtype" % (src, dst))
    if isinstance(dst, DeviceArray) and isinstance(src, DeviceArray):
        if dst is src:
            return
        if dst.device is src.device:
            if src.nbytes:
                src.device.copy(dst.buffer, src.buffer, src.nbytes)
            return
        staging = np.empty(src.shape, numpy_dtype(src.dtype))
        src.download_into(staging)
        dst.upload_from(staging)
    elif isinstance(dst, DeviceArray):
        dst.upload_from(src.array)
    elif isinstance(src, DeviceArray):
        src.download_into(dst.array)
    else:
        dst.copyfrom(src)


def empty(device: DeviceAPI, shape: ShapeLike, dtype: Any = "float32") -> DeviceArray:
    """An uninitialised array on ``device``."""
    return DeviceArray(device, shape, dtype)


def from_numpy(device: DeviceAPI, source: Any) -> DeviceArray:
    """A new array on ``device`` holding a copy of ``source`` (any layout; numpy dtype or tagged bfloat16)."""
    src = storage_of(np.asarray(source))
    out = DeviceArray(device, src.shape, src.dtype)
    try:
        out.copyfrom(src)
    except BaseException:
        out.free()
        raise
    return out


__all__ = ["API_TITLES", "CPU_SPECS", "DeviceArray", "canonical_spec", "copy_array", "empty", "from_numpy",
           "handle_value", "spec_of"]
