"""Device arrays: 64-byte aligned numpy buffers with a cached DLTensor.

An :class:`NDArray` owns its memory (kernels get a stable pointer for the array's lifetime), exposes it as a
writable flat byte ``memoryview`` (``.view``) so the RPC layer can ``recv_into`` straight into it, and builds
its DLTensor once, so passing it to a kernel costs nothing per call.

A bfloat16 array (numpy has no bfloat16) holds uint16 bit patterns; its numpy views carry the dtype tag of
``tether_rpc.dtypes`` (``numpy_dtype("bfloat16")``), and ``copyfrom`` takes tagged, plain uint16 or ml_dtypes
bfloat16 arrays, all as bit patterns.
"""
from __future__ import annotations

import ctypes
from typing import Iterable, Optional, Tuple, Union

import numpy as np

from .dlpack import DLTensor, dtype_name, make_dltensor
from .dtypes import name_of, numpy_dtype, storage_of
from .errors import KernelError, OutOfMemory

ALIGNMENT = 64  # a cache line; also what vector loads/stores and NEON prefer

ShapeLike = Union[int, Iterable[int]]


def _normalize_shape(shape: ShapeLike) -> Tuple[int, ...]:
    if isinstance(shape, (int, np.integer)):
        shape = (shape,)
    try:
        out = tuple(int(d) for d in shape)
    except (TypeError, ValueError) as exc:
        raise KernelError("shape must be a sequence of non-negative ints, got %r" % (shape,)) from exc
    if any(d < 0 for d in out):
        raise KernelError("shape must be a sequence of non-negative ints, got %r" % (out,))
    return out


#: shape -> tuple of non-negative ints, or KernelError (device arrays of tether_rpc.gpu.array check alike)
normalize_shape = _normalize_shape


def _aligned_buffer(nbytes: int) -> np.ndarray:
    """A uint8 array of ``nbytes`` whose first byte is ALIGNMENT-aligned (over-allocate, then slice)."""
    raw = np.empty(nbytes + ALIGNMENT, dtype=np.uint8)
    addr = raw.ctypes.data
    start = (-addr) % ALIGNMENT
    return raw[start:start + nbytes]


class NDArray:
    """A C-contiguous, 64-byte aligned array on the device (host memory of this process)."""

    __slots__ = ("_arr", "_bytes", "_dltensor", "_keep", "_name", "__weakref__")

    def __init__(self, shape: ShapeLike, dtype="float32"):
        shape_t = _normalize_shape(shape)
        name = dtype_name(dtype)
        itemsize = numpy_dtype(name).itemsize
        count = 1
        for d in shape_t:
            count *= d
        try:
            self._bytes = _aligned_buffer(count * itemsize)
        except MemoryError as exc:
            raise OutOfMemory("the device cannot allocate a %s array of shape %s (%.1f MB)"
                              % (name, shape_t, count * itemsize / 1e6)) from exc
        self._name = name
        self._arr = self._bytes.view(numpy_dtype(name)).reshape(shape_t)
        self._dltensor, self._keep = make_dltensor(self._bytes.ctypes.data, shape_t, name)

    # -- description -----------------------------------------------------------------------------------------
    @property
    def shape(self) -> Tuple[int, ...]:
        return self._arr.shape

    @property
    def dtype(self) -> str:
        return self._name

    @property
    def ndim(self) -> int:
        return self._arr.ndim

    @property
    def size(self) -> int:
        return self._arr.size

    @property
    def nbytes(self) -> int:
        return self._bytes.size

    @property
    def data_ptr(self) -> int:
        return self._bytes.ctypes.data

    def __repr__(self) -> str:
        return "NDArray(shape=%s, dtype=%s)" % (self.shape, self.dtype)

    # -- data movement ---------------------------------------------------------------------------------------
    def numpy(self) -> np.ndarray:
        """A copy of the contents as a fresh numpy array (safe to keep after the NDArray is freed)."""
        return self._arr.copy()

    asnumpy = numpy

    def copyfrom(self, source) -> "NDArray":
        """Copy ``source`` (numpy array, NDArray or nested list) in; its shape and dtype must match exactly."""
        if isinstance(source, NDArray):
            source = source._arr
        src = storage_of(np.asarray(source))
        if src.shape != self.shape:
            raise KernelError("copyfrom: shape %s does not match the array's shape %s"
                              % (tuple(src.shape), self.shape))
        if src.dtype != self._arr.dtype or name_of(src.dtype) not in (self._name, self._arr.dtype.name):
            raise KernelError("copyfrom: dtype %s does not match the array's dtype %s (convert with .astype(%r))"
                              % (name_of(src.dtype), self.dtype, self.dtype))
        np.copyto(self._arr, src)
        return self

    def copyto(self, target: Optional[np.ndarray] = None) -> np.ndarray:
        """Copy out into ``target`` (same shape and dtype) or into a new array."""
        if target is None:
            return self.numpy()
        view = storage_of(target)
        if view.shape != self.shape or view.dtype != self._arr.dtype:
            raise KernelError("copyto: target is %s %s, the array is %s %s"
                              % (name_of(target.dtype), tuple(target.shape), self.dtype, self.shape))
        np.copyto(view, self._arr)
        return target

    @property
    def view(self) -> memoryview:
        """The raw bytes as a writable flat memoryview (for ``socket.recv_into`` / ``sendall``)."""
        return memoryview(self._bytes)

    @property
    def array(self) -> np.ndarray:
        """A zero-copy numpy view (shares memory with the device array; do not keep it past the array)."""
        return self._arr

    # -- ABI -------------------------------------------------------------------------------------------------
    @property
    def dltensor(self) -> DLTensor:
        return self._dltensor

    @property
    def dltensor_address(self) -> int:
        return ctypes.addressof(self._dltensor)


def nbytes_of(shape: ShapeLike, dtype="float32") -> int:
    """The bytes an array of ``shape`` and ``dtype`` holds (checked like NDArray's, nothing allocated)."""
    count = numpy_dtype(dtype_name(dtype)).itemsize
    for d in _normalize_shape(shape):
        count *= d
    return count


def empty(shape: ShapeLike, dtype="float32") -> NDArray:
    """An uninitialised device array."""
    return NDArray(shape, dtype)


def from_numpy(arr) -> NDArray:
    """A fresh device array holding a copy of ``arr`` (any layout; the copy is C-contiguous and aligned)."""
    src = storage_of(np.asarray(arr))
    out = NDArray(src.shape, src.dtype)
    np.copyto(out._arr, src)
    return out
