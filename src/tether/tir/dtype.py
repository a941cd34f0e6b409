"""The element types a scalar expression may have: the subset of the one dtype table (tether_rpc.dtypes) that
tensor expressions accept and the LLVM code generator implements.

Mixed arithmetic promotes to the operand with the higher ``rank`` of that table.
"""
from __future__ import annotations

from tether_rpc.dtypes import DTYPES as _TABLE

# What te/tir accept: every row of the table. float16 and bfloat16 are computed with as float32 and rounded on
# store (codegen/halfconv.py); unsigned integers divide, compare, shift and widen without sign.
DTYPES = ("bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64", "float16", "bfloat16",
          "float32", "float64")

_ROWS = {name: _TABLE[name] for name in DTYPES}
_FLOAT = frozenset(name for name, row in _TABLE.items() if row.is_float)
_INT = frozenset(name for name, row in _TABLE.items() if row.is_int)
_UNSIGNED = frozenset(name for name, row in _TABLE.items() if row.kind == "uint")


def check_dtype(dtype: str) -> str:
    """``dtype`` as a string when expressions support it; TypeError naming the supported ones otherwise."""
    dtype = str(dtype)
    if dtype not in _ROWS:
        raise TypeError(f"unsupported dtype {dtype!r}; tether supports {', '.join(DTYPES)}")
    return dtype


def is_float(dtype: str) -> bool:
    return dtype in _FLOAT


def is_int(dtype: str) -> bool:
    return dtype in _INT


def is_unsigned(dtype: str) -> bool:
    return dtype in _UNSIGNED


def is_bool(dtype: str) -> bool:
    return dtype == "bool"


def bits(dtype: str) -> int:
    """Storage width in bits (bool is one byte)."""
    return _TABLE[dtype].bits


def rank(dtype: str) -> int:
    """Promotion order: in mixed arithmetic the operand of higher rank decides the result type."""
    return _TABLE[dtype].rank
