"""ctypes mirrors of the packed-function ABI structures (docs/abi.md) and the dtype <-> DLDataType table.

DLTensors are built from ``ndarray.ctypes`` / buffer addresses, never through numpy's ``__dlpack__``, so this
works on numpy 1.19 as well as 2.x.
"""
from __future__ import annotations

import ctypes
from typing import Dict, Sequence, Tuple

from .dtypes import ARRAY_DTYPES, DTYPES, name_of
from .errors import KernelError

# TetherValue type codes.
TETHER_INT64 = 0
TETHER_FLOAT64 = 1
TETHER_HANDLE = 2
TETHER_DLTENSOR = 3
TETHER_STR = 4
TETHER_BYTES = 5
TETHER_NULL = 6

TYPE_CODE_NAMES: Dict[int, str] = {TETHER_INT64: "int", TETHER_FLOAT64: "float", TETHER_HANDLE: "handle",
                                   TETHER_DLTENSOR: "array", TETHER_STR: "str", TETHER_BYTES: "bytes",
                                   TETHER_NULL: "None"}

KDL_CPU = 1


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p),
                ("device", DLDevice),
                ("ndim", ctypes.c_int32),
                ("dtype", DLDataType),
                ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


class TetherBytes(ctypes.Structure):
    """What a TETHER_BYTES handle points to (length-prefixed, so it may contain NULs)."""
    _fields_ = [("data", ctypes.c_void_p), ("size", ctypes.c_uint64)]


class TetherValue(ctypes.Union):
    _fields_ = [("v_int64", ctypes.c_int64), ("v_float64", ctypes.c_double), ("v_handle", ctypes.c_void_p),
                ("v_str", ctypes.c_void_p)]  # a char*: kept as void* so ctypes never copies or converts it


# numpy dtype name -> (DLPack type code, bits), for the dtypes a device array may hold (tether_rpc.dtypes)
DTYPE_TO_DL: Dict[str, Tuple[int, int]] = {row.name: (row.dl_code, row.bits) for row in DTYPES.values()
                                           if row.name in ARRAY_DTYPES}
SUPPORTED_DTYPES = tuple(DTYPE_TO_DL)


def dtype_name(dtype) -> str:
    """Canonical name (``"float32"``) of a tether dtype name, or of anything numpy accepts as a dtype (a tagged
    uint16 and ml_dtypes' bfloat16 are ``"bfloat16"``); KernelError if tether lacks it."""
    try:
        name = name_of(dtype)
    except TypeError as exc:
        raise KernelError("unknown dtype %r; supported: %s" % (dtype, ", ".join(SUPPORTED_DTYPES))) from exc
    if name not in DTYPE_TO_DL:
        raise KernelError("dtype %s is not supported by tether kernels; supported: %s"
                          % (name, ", ".join(SUPPORTED_DTYPES)))
    return name


def make_dltensor(data_ptr: int, shape: Sequence[int], dtype: str) -> Tuple[DLTensor, object]:
    """A compact row-major CPU DLTensor over ``data_ptr``. Returns ``(tensor, shape_array)``: the caller must
    keep ``shape_array`` alive as long as the tensor is used (the tensor points into it)."""
    ndim = len(shape)
    shape_arr = (ctypes.c_int64 * ndim)(*shape)
    code, bits = DTYPE_TO_DL[dtype]
    t = DLTensor()
    t.data = data_ptr or None
    t.device = DLDevice(KDL_CPU, 0)
    t.ndim = ndim
    t.dtype = DLDataType(code, bits, 1)
    t.shape = ctypes.cast(shape_arr, ctypes.POINTER(ctypes.c_int64))
    t.strides = None
    t.byte_offset = 0
    return t, shape_arr
