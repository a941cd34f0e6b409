"""tether dtypes as LLVM types: one table from (kind, bits) of the dtype table to llvmlite types.

A dtype the code generator can compute with is one row of ``_IR_TYPES``; its storage width and DLPack code come
from ``tether_rpc.dtypes`` (the one dtype table), so codegen and the packed ABI cannot disagree with the runtime.
"""
from __future__ import annotations

import contextlib
import contextvars
from typing import Any, Dict, Iterator, Sequence

from llvmlite import ir
from tether_rpc.dtypes import DTYPES, DType

from tether.errors import CompileError

I1, I8, I16, I32, I64 = ir.IntType(1), ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)
F16, F32, F64 = ir.HalfType(), ir.FloatType(), ir.DoubleType()
PTR = ir.PointerType()

# (kind, bits) -> the type values of that dtype have in registers. bool computes as i1 and is stored as a byte.
_IR_TYPES = {
    ("bool", 8): I1,
    ("int", 8): I8, ("int", 16): I16, ("int", 32): I32, ("int", 64): I64,
    ("uint", 8): I8, ("uint", 16): I16, ("uint", 32): I32, ("uint", 64): I64,
    ("float", 32): F32, ("float", 64): F64,
    # float16 and bfloat16 are stored as 16-bit patterns and computed with as float32 (codegen/halfconv.py)
    ("float", 16): F32, ("bfloat", 16): F32,
}
# dtypes whose memory type differs from their register type, beyond bool's byte
HALF_DTYPES = ("float16", "bfloat16")

# Whether float16 is computed as LLVM ``half`` (loaded, added, multiplied and stored as itself) rather than as
# float32: only where the target has half-precision arithmetic (aarch64 +fullfp16: fmla .8h), for which LLVM
# emits instructions rather than the library calls halfconv.py avoids. Set per function by codegen/function.py
# from the module's target, so the emitters below ask the types rather than each carrying the target.
_NATIVE_HALF: contextvars.ContextVar = contextvars.ContextVar("tether_native_half", default=False)


@contextlib.contextmanager
def half_arithmetic(on: bool) -> Iterator[None]:
    """Within: float16 values are LLVM ``half`` when ``on`` (see ``native_half``)."""
    token = _NATIVE_HALF.set(bool(on))
    try:
        yield
    finally:
        _NATIVE_HALF.reset(token)


def native_half(dtype: str = "float16") -> bool:
    """Whether ``dtype`` is computed natively as ``half`` here (float16 on a target with half arithmetic)."""
    return dtype == "float16" and _NATIVE_HALF.get()


# The dtypes a packed wrapper can check (a DLPack code and width): every dtype of the table (bfloat16 is
# kDLBfloat, 16 bits).
PACKED_DTYPES = tuple(DTYPES)


def dtype_row(dtype: str) -> DType:
    try:
        return DTYPES[dtype]
    except KeyError:
        raise CompileError(f"dtype {dtype!r} is not supported by the LLVM code generator") from None


def scalar_type(dtype: str) -> ir.Type:
    """The register type of one ``dtype`` value."""
    if native_half(dtype):
        return F16
    row = DTYPES.get(dtype)
    ty = _IR_TYPES.get((row.kind, row.bits)) if row is not None else None
    if ty is None:
        raise CompileError(f"dtype {dtype!r} is not supported by the LLVM code generator")
    return ty


def mem_type(dtype: str) -> ir.Type:
    """The in-memory type of one ``dtype`` element (bool is a byte, float16/bfloat16 a 16-bit pattern)."""
    if native_half(dtype):
        return F16
    if dtype in HALF_DTYPES:
        return I16
    return I8 if dtype == "bool" else scalar_type(dtype)


def elem_bytes(dtype: str) -> int:
    return dtype_row(dtype).itemsize


def is_unsigned(dtype: str) -> bool:
    """Integers compared, divided and widened without sign (uint*, bool)."""
    return not dtype_row(dtype).is_signed


def dtype_word(dtype: Any) -> int:
    """DLDataType {code, bits, lanes=1} as the little-endian 32-bit word the packed wrapper compares against."""
    name = str(dtype)
    if name not in PACKED_DTYPES:
        raise CompileError("dtype %r has no DLPack code; supported: %s" % (dtype, ", ".join(PACKED_DTYPES)))
    row = DTYPES[name]
    return row.dl_code | (row.bits << 8) | (1 << 16)


def is_vec(v: ir.Value) -> bool:
    return isinstance(v.type, ir.VectorType)


def like(v: ir.Value, ty: ir.Type) -> ir.Type:
    """``ty``, or a vector of ``ty`` as wide as ``v``."""
    return ir.VectorType(ty, v.type.count) if is_vec(v) else ty


# Vector constants, shared: building one wraps every lane in an ir.Constant and printing it formats every lane,
# which was a fifth of IR generation. A constant is immutable once made, so one object serves every use; the key
# is the lane's printed text, so equal keys print the same (-0.0 and 0.0, 1 and True stay apart).
_VECTOR_CONSTANTS: Dict[tuple, ir.Constant] = {}
_VECTOR_CONSTANTS_MAX = 16384


def splat_const(elem: ir.Constant, n: int) -> ir.Constant:
    """``<n x T>`` with every lane the scalar constant ``elem``."""
    k = (str(elem.type), elem.get_reference(), n)
    c = _VECTOR_CONSTANTS.get(k)
    if c is None:
        if len(_VECTOR_CONSTANTS) >= _VECTOR_CONSTANTS_MAX:
            _VECTOR_CONSTANTS.clear()
        c = _VECTOR_CONSTANTS[k] = ir.Constant(ir.VectorType(elem.type, n), elem)
    return c


def int_vector(ty: ir.IntType, values: Sequence[int]) -> ir.Constant:
    """The vector constant of integers ``values`` (shuffle masks, lane offsets)."""
    k = (str(ty), tuple(int(x) for x in values))
    c = _VECTOR_CONSTANTS.get(k)
    if c is None:
        if len(_VECTOR_CONSTANTS) >= _VECTOR_CONSTANTS_MAX:
            _VECTOR_CONSTANTS.clear()
        c = _VECTOR_CONSTANTS[k] = ir.Constant(ir.VectorType(ty, len(k[1])), list(k[1]))
    return c


def const_like(v: ir.Value, ty: ir.Type, value: Any) -> ir.Constant:
    """The constant ``value`` of type ``ty``, splatted when ``v`` is a vector."""
    if is_vec(v):
        return splat_const(ir.Constant(ty, value), v.type.count)
    return ir.Constant(ty, value)


def const_of(v: ir.Value, value: Any) -> ir.Constant:
    """The constant ``value`` of ``v``'s own type (every lane, for a vector)."""
    if is_vec(v):
        return splat_const(ir.Constant(v.type.element, value), v.type.count)
    return ir.Constant(v.type, value)
