"""The one dtype table of tether: every element type a tensor, a kernel or a params file may have.

Host and device both read it (the host compiler imports it from here, the device package never imports the host),
so codegen, DLPack, the wire protocol, the params format and tensor expressions cannot disagree about which types
exist or how they are laid out.

Each row is a :class:`DType`: its tether name, its kind (``int``/``uint``/``float``/``bfloat``/``bool``), its
storage width, its DLPack type code, and the numpy dtype that stores it. ``bfloat16`` has no numpy dtype, so its
elements are stored as ``uint16`` bit patterns (the same convention onnx and onnxruntime use on the host side).

``rank`` orders the types for mixed arithmetic in tensor expressions (the higher rank wins). Every type may travel
in a frame, be held by a device array and be stored in a params file.

bfloat16 arrays in numpy (``tagged`` below): the device side holds them as ``uint16`` bit patterns whose numpy
dtype carries the tag ``{"tether_dtype": "bfloat16"}`` in its metadata (numpy keeps dtype metadata through views,
copies, reshapes and slices), so a device array's contents, a graph entry or a decoded tensor still say what they
are. On the host, ``ml_dtypes.bfloat16`` arrays (what onnx's numpy_helper gives) are accepted wherever a bfloat16
array is, and decoded tensors come back as ``ml_dtypes.bfloat16`` when this process has loaded ml_dtypes (the
device never does: it has no ml_dtypes).
"""
from __future__ import annotations

from typing import Any, Dict, NamedTuple, Tuple

# DLPack's type codes (dlpack.h: kDLInt, kDLUInt, kDLFloat, kDLBfloat, kDLBool).
DL_INT, DL_UINT, DL_FLOAT, DL_BFLOAT, DL_BOOL = 0, 1, 2, 4, 6


class DType(NamedTuple):
    name: str
    kind: str           # "int", "uint", "float", "bfloat" or "bool"
    bits: int           # storage width in bits (bool is stored as one byte)
    dl_code: int        # DLPack type code
    storage: str        # the numpy dtype name that holds the elements
    rank: int           # promotion order for mixed arithmetic: higher wins

    @property
    def itemsize(self) -> int:
        return self.bits // 8

    @property
    def is_float(self) -> bool:
        return self.kind in ("float", "bfloat")

    @property
    def is_int(self) -> bool:
        return self.kind in ("int", "uint")

    @property
    def is_signed(self) -> bool:
        return self.kind in ("int", "float", "bfloat")


_ROWS = (
    DType("bool", "bool", 8, DL_BOOL, "bool", 0),
    DType("int8", "int", 8, DL_INT, "int8", 1),
    DType("uint8", "uint", 8, DL_UINT, "uint8", 2),
    DType("int16", "int", 16, DL_INT, "int16", 3),
    DType("uint16", "uint", 16, DL_UINT, "uint16", 4),
    DType("int32", "int", 32, DL_INT, "int32", 5),
    DType("uint32", "uint", 32, DL_UINT, "uint32", 6),
    DType("int64", "int", 64, DL_INT, "int64", 7),
    DType("uint64", "uint", 64, DL_UINT, "uint64", 8),
    DType("float16", "float", 16, DL_FLOAT, "float16", 9),
    DType("bfloat16", "bfloat", 16, DL_BFLOAT, "uint16", 10),
    DType("float32", "float", 32, DL_FLOAT, "float32", 11),
    DType("float64", "float", 64, DL_FLOAT, "float64", 12),
)

DTYPES: Dict[str, DType] = {row.name: row for row in _ROWS}
BY_DLPACK: Dict[Tuple[int, int], DType] = {(row.dl_code, row.bits): row for row in _ROWS}

# Which dtypes each consumer accepts (each a subset of DTYPES; today all three are every type):
# - a tensor in a frame (bfloat16 as its uint16 bit patterns, named "bfloat16": docs/protocol.md);
WIRE_DTYPES = frozenset(DTYPES)
# - a device array (and so a kernel argument passed from Python);
ARRAY_DTYPES = frozenset(WIRE_DTYPES)
# - a params file, bfloat16 as its uint16 bit pattern (docs/params.md).
PARAMS_DTYPES = frozenset(DTYPES)

TAG = "tether_dtype"   # the numpy dtype metadata key that names a type numpy lacks (bfloat16)


def lookup(dtype: Any) -> DType:
    """The row for a tether dtype name or anything numpy accepts as a dtype; TypeError names the known ones."""
    name = dtype if isinstance(dtype, str) else getattr(dtype, "name", None) or str(dtype)
    tag = (getattr(dtype, "metadata", None) or {}).get(TAG) if not isinstance(dtype, str) else None
    row = DTYPES.get(tag or name)
    if row is None:
        try:
            import numpy as np
            row = DTYPES.get(np.dtype(dtype).name)
        except TypeError:
            row = None
    if row is None:
        raise TypeError("unsupported dtype %r; tether supports %s" % (dtype, ", ".join(DTYPES)))
    return row


# ---------------------------------------------------------------- numpy arrays of types numpy lacks (bfloat16)
def numpy_dtype(dtype: Any) -> Any:
    """The numpy dtype that holds ``dtype``'s elements: numpy's own, or the tagged storage (bfloat16 -> uint16
    with metadata ``{TAG: "bfloat16"}``)."""
    import numpy as np
    row = lookup(dtype)
    if row.storage == row.name:
        return np.dtype(row.name)
    return np.dtype(row.storage, metadata={TAG: row.name})


def name_of(dtype: Any) -> str:
    """The tether name of a numpy dtype (or dtype-like), reading the bfloat16 tag and ml_dtypes' bfloat16; numpy's
    own name for the rest (which may be no tether dtype: callers check)."""
    import numpy as np
    if isinstance(dtype, str) and dtype in DTYPES:
        return dtype
    dt = np.dtype(dtype)
    tag = (dt.metadata or {}).get(TAG)
    return tag if tag in DTYPES else dt.name


def storage_of(array: Any) -> Any:
    """``array`` (a numpy array of any tether dtype) as a view of its storage dtype, tag kept: an ml_dtypes
    bfloat16 array becomes its tagged uint16 bit patterns; every other array is returned as it is."""
    name = name_of(array.dtype)
    row = DTYPES.get(name)
    if row is None or row.storage == row.name or (array.dtype.metadata or {}).get(TAG) == name:
        return array
    return array.view(numpy_dtype(name))


def host_bfloat16() -> Any:
    """ml_dtypes' numpy bfloat16 if this process has loaded ml_dtypes (the host), else None (the device)."""
    import sys
    mod = sys.modules.get("ml_dtypes")
    return getattr(mod, "bfloat16", None) if mod is not None else None


def for_host(array: Any) -> Any:
    """A tagged bfloat16 array as ``ml_dtypes.bfloat16`` when this process has ml_dtypes, else unchanged."""
    bf16 = host_bfloat16()
    if bf16 is None or (array.dtype.metadata or {}).get(TAG) != "bfloat16":
        return array
    return array.view(bf16)


def bfloat16_bits(values: Any) -> Any:
    """float values -> bfloat16 bit patterns (uint16), rounded to nearest even as onnxruntime and the kernels
    round float32 (float64 is first rounded to float32); NaN stays a quiet NaN."""
    import numpy as np
    f = np.ascontiguousarray(values, dtype=np.float32)
    u = f.view(np.uint32).astype(np.uint64)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(f)
    if nan.any():
        rounded[nan] = ((u[nan] >> 16) | 0x40).astype(np.uint16)
    return rounded.view(numpy_dtype("bfloat16"))


def bfloat16_to_float32(bits: Any) -> Any:
    """bfloat16 bit patterns (uint16, tagged or not) -> float32 (exact)."""
    import numpy as np
    u = np.ascontiguousarray(bits).view(np.uint16)
    return (u.astype(np.uint32) << 16).view(np.float32)
