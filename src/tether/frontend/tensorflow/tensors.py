"""TensorFlow data types and TensorProto values as numpy arrays."""
from __future__ import annotations

from typing import Optional, Tuple

import numpy as np

# types.proto's DataType numbers -> numpy dtypes (string tensors are arrays of bytes objects)
DTYPES = {1: np.float32, 2: np.float64, 3: np.int32, 4: np.uint8, 5: np.int16, 6: np.int8, 7: np.object_,
          9: np.int64, 10: np.bool_, 17: np.uint16, 19: np.float16, 22: np.uint32, 23: np.uint64}
DTYPE_NAMES = {1: "float32", 2: "float64", 3: "int32", 4: "uint8", 5: "int16", 6: "int8", 7: "string",
               8: "complex64", 9: "int64", 10: "bool", 14: "bfloat16", 17: "uint16", 18: "complex128",
               19: "float16", 20: "resource", 21: "variant", 22: "uint32", 23: "uint64"}


def np_dtype(dt: int, what: str) -> np.dtype:
    if dt not in DTYPES:
        raise ValueError("%s has TensorFlow data type %s, which tether does not read"
                         % (what, DTYPE_NAMES.get(dt, "#%d" % dt)))
    return np.dtype(DTYPES[dt])


def shape_of(proto) -> Optional[Tuple[Optional[int], ...]]:
    """A TensorShapeProto as a tuple (None for an unknown dimension), or None for an unknown rank."""
    if proto.unknown_rank:
        return None
    return tuple(None if d.size < 0 else int(d.size) for d in proto.dim)


def tensor_value(proto, what: str) -> np.ndarray:
    """A TensorProto's value. TensorFlow writes either the raw little-endian bytes (tensor_content) or a repeated
    field of the type's kind, where fewer values than elements mean the last one repeats (a splat)."""
    dtype = np_dtype(proto.dtype, what)
    shape = tuple(int(d.size) for d in proto.tensor_shape.dim)
    n = int(np.prod(shape, dtype=np.int64))
    if proto.tensor_content and dtype != np.object_:
        flat = np.frombuffer(proto.tensor_content, dtype=dtype.newbyteorder("<")).astype(dtype)
        if flat.size != n:
            raise ValueError("%s: tensor_content holds %d values, its shape %s needs %d" % (what, flat.size,
                                                                                           list(shape), n))
        return flat.reshape(shape)
    if dtype == np.float16:           # half_val holds the raw 16-bit patterns, one per int32
        vals = np.asarray(proto.half_val, dtype=np.uint16).view(np.float16)
    elif dtype == np.float32:
        vals = np.asarray(proto.float_val, dtype=dtype)
    elif dtype == np.float64:
        vals = np.asarray(proto.double_val, dtype=dtype)
    elif dtype in (np.int32, np.int16, np.int8, np.uint8, np.uint16):
        vals = np.asarray(proto.int_val, dtype=np.int64).astype(dtype)
    elif dtype == np.int64:
        vals = np.asarray(proto.int64_val, dtype=dtype)
    elif dtype == np.uint32:
        vals = np.asarray(proto.uint32_val, dtype=dtype)
    elif dtype == np.uint64:
        vals = np.asarray(proto.uint64_val, dtype=dtype)
    elif dtype == np.bool_:
        vals = np.asarray(proto.bool_val, dtype=dtype)
    else:
        vals = np.empty(len(proto.string_val), dtype=object)
        vals[:] = list(proto.string_val)
    if vals.size == n:
        return vals.reshape(shape)
    if vals.size == 0:
        return np.zeros(shape, dtype=dtype) if dtype != np.object_ else np.full(shape, b"", dtype=object)
    if vals.size > n:
        raise ValueError("%s holds %d values, its shape %s needs %d" % (what, vals.size, list(shape), n))
    out = np.empty(n, dtype=dtype)
    out[:vals.size] = vals
    out[vals.size:] = vals[-1]
    return out.reshape(shape)
