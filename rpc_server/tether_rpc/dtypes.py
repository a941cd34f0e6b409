"""The one dtype table of tether: every element type a tensor, a kernel or a params file may have.

Host and device both read it (the host compiler imports it from here, the device package never imports the host),
so codegen, DLPack, the wire protocol, the params format and tensor expressions cannot disagree about which types
exist or how they are laid out.

Each row is a :class:`DType`: its tether name, its kind (``int``/``uint``/``float``/``bfloat``/``bool``), its
storage width, its DLPack type code, and the numpy dtype that stores it. ``bfloat16`` has no numpy dtype, so its
elements are stored as ``uint16`` bit patterns (the same convention onnx and onnxruntime use on the host side).

``rank`` orders the types for mixed arithmetic in tensor expressions (the higher rank wins); ``wire`` says whether
a tensor of this type may travel in a frame (every type numpy stores natively may, and so may device arrays hold
it, see ``ARRAY_DTYPES``).
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

# Which dtypes each consumer accepts. They differ on purpose, and each set is a subset of DTYPES:
# - a tensor in a frame may hold any type numpy stores natively (bfloat16 has no numpy dtype to decode into);
WIRE_DTYPES = frozenset(name for name, row in DTYPES.items() if row.kind != "bfloat")
# - a device array (and so a kernel argument passed from Python) may hold any of them (docs/protocol.md);
ARRAY_DTYPES = frozenset(WIRE_DTYPES)
# - a params file stores every type, bfloat16 as its uint16 bit pattern (docs/params.md).
PARAMS_DTYPES = frozenset(DTYPES)


def lookup(dtype: Any) -> DType:
    """The row for a tether dtype name or anything numpy accepts as a dtype; TypeError names the known ones."""
    name = dtype if isinstance(dtype, str) else getattr(dtype, "name", None) or str(dtype)
    row = DTYPES.get(name)
    if row is None:
        try:
            import numpy as np
            row = DTYPES.get(np.dtype(dtype).name)
        except TypeError:
            row = None
    if row is None:
        raise TypeError("unsupported dtype %r; tether supports %s" % (dtype, ", ".join(DTYPES)))
    return row


def storage_dtype(dtype: Any) -> Any:
    """The numpy dtype whose elements hold ``dtype`` (``bfloat16`` -> ``uint16``)."""
    import numpy as np
    return np.dtype(lookup(dtype).storage)
