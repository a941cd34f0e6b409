"""The params file (``deploy.params``): named tensors in a small documented binary format (docs/params.md).

Not pickle and not npz: a device must be able to read it without running anything the file says, and
another language must be able to read it from the description alone::

    file    = magic:8 bytes "TTHRPRM\\0"  version:u32  count:u32  record * count
    record  = name_len:u16  name:utf-8  dtype_len:u8  dtype:ascii (tether name, e.g. "float32")
              ndim:u8  shape:ndim x i64  nbytes:u64  zero padding to the next multiple of 64 from the
              start of the file  data:nbytes (little-endian, C order)

All integers are little-endian. Data is 64-byte aligned in the file, so a reader that loads the whole file
into a 64-byte-aligned buffer gets every tensor as a zero-copy, aligned view.
"""
from __future__ import annotations

import struct
import sys
from typing import Dict, Mapping, Union

import numpy as np

from .dtypes import PARAMS_DTYPES, name_of, numpy_dtype, storage_of

MAGIC = b"TTHRPRM\x00"
VERSION = 1
ALIGN = 64
# Refuse absurd headers before allocating anything for them.
MAX_NDIM = 32
MAX_NAME = 4096
#: Every dtype of the table (tether_rpc.dtypes.PARAMS_DTYPES), named by its tether name; bfloat16 is stored as
#: its uint16 bit patterns and read back as tagged uint16 (tether_rpc.dtypes).
DTYPES = tuple(sorted(PARAMS_DTYPES))

_HEAD = struct.Struct("<8sII")


class ParamsFormatError(ValueError):
    """The bytes are not a valid params file; the message says where and why."""


def _pad(offset: int) -> int:
    return (-offset) % ALIGN


def save_params(params: Mapping[str, np.ndarray]) -> bytes:
    """Serialize ``name -> array`` (any order; names are kept) into params-file bytes."""
    out = bytearray(_HEAD.pack(MAGIC, VERSION, len(params)))
    for name, value in params.items():
        arr = np.asarray(value, order="C")
        dtype = name_of(arr.dtype)
        arr = storage_of(arr)
        if dtype not in DTYPES:
            raise ValueError("param %r has dtype %s, which the params format does not carry (%s)"
                             % (name, dtype, ", ".join(DTYPES)))
        if arr.dtype.byteorder == ">":
            arr = arr.astype(arr.dtype.newbyteorder("<"))
        raw_name = name.encode("utf-8")
        if len(raw_name) > MAX_NAME or arr.ndim > MAX_NDIM:
            raise ValueError("param %r: name longer than %d bytes or rank above %d" % (name, MAX_NAME, MAX_NDIM))
        out += struct.pack("<H", len(raw_name)) + raw_name
        out += struct.pack("<B", len(dtype)) + dtype.encode("ascii")
        out += struct.pack("<B", arr.ndim) + struct.pack("<%dq" % arr.ndim, *arr.shape)
        out += struct.pack("<Q", arr.nbytes)
        out += b"\x00" * _pad(len(out))
        out += arr.tobytes()
    return bytes(out)


def _aligned(nbytes: int) -> np.ndarray:
    raw = np.empty(nbytes + ALIGN, dtype=np.uint8)
    start = (-raw.ctypes.data) % ALIGN
    return raw[start:start + nbytes]


def load_params(source: Union[bytes, bytearray, memoryview, str]) -> Dict[str, np.ndarray]:
    """Parse params-file bytes (or a path) into ``name -> array`` (views of one aligned buffer)."""
    if isinstance(source, str):
        with open(source, "rb") as fh:
            size = fh.seek(0, 2)
            fh.seek(0)
            buf = _aligned(size)
            view = memoryview(buf)
            got = 0
            while got < size:
                n = fh.readinto(view[got:])
                if not n:
                    raise ParamsFormatError("%s: file shrank while reading (%d of %d bytes)" % (source, got, size))
                got += n
    else:
        data = bytes(source)
        buf = _aligned(len(data))
        buf[:] = np.frombuffer(data, dtype=np.uint8)
    return _parse(buf)


def _parse(buf: np.ndarray) -> Dict[str, np.ndarray]:
    raw = memoryview(buf)
    size = len(buf)
    if size < _HEAD.size:
        raise ParamsFormatError("params file too short (%d bytes) for its header" % size)
    magic, version, count = _HEAD.unpack_from(raw, 0)
    if magic != MAGIC:
        raise ParamsFormatError("not a tether params file (magic %r)" % bytes(magic))
    if version != VERSION:
        raise ParamsFormatError("params format version %d; this runtime reads version %d" % (version, VERSION))
    off = _HEAD.size
    out: Dict[str, np.ndarray] = {}

    def take(fmt: str):
        nonlocal off
        st = struct.Struct(fmt)
        if off + st.size > size:
            raise ParamsFormatError("params file truncated at byte %d (record %d of %d)" % (off, len(out), count))
        vals = st.unpack_from(raw, off)
        off += st.size
        return vals

    def take_bytes(n: int) -> bytes:
        nonlocal off
        if off + n > size:
            raise ParamsFormatError("params file truncated at byte %d (record %d of %d)" % (off, len(out), count))
        b = bytes(raw[off:off + n])
        off += n
        return b

    def text(n: int, encoding: str, what: str) -> str:
        raw_text = take_bytes(n)
        try:
            return raw_text.decode(encoding)
        except UnicodeDecodeError as exc:
            raise ParamsFormatError("params file: record %d's %s is not %s: %r" % (len(out), what, encoding,
                                                                                   raw_text[:40])) from exc

    for _ in range(count):
        (name_len,) = take("<H")
        name = text(name_len, "utf-8", "name")
        (dlen,) = take("<B")
        dtype = text(dlen, "ascii", "dtype")
        if dtype not in DTYPES:
            raise ParamsFormatError("param %r has unknown dtype %r" % (name, dtype))
        (ndim,) = take("<B")
        if ndim > MAX_NDIM:
            raise ParamsFormatError("param %r has rank %d (limit %d)" % (name, ndim, MAX_NDIM))
        shape = take("<%dq" % ndim) if ndim else ()
        if any(d < 0 for d in shape):
            raise ParamsFormatError("param %r has a negative extent in %s" % (name, shape))
        (nbytes,) = take("<Q")
        dt = numpy_dtype(dtype)
        if sys.byteorder != "little":   # (a little-endian dtype as it is: a bfloat16 tag stays)
            dt = dt.newbyteorder("<")
        expect = dt.itemsize
        for d in shape:  # exact (np.prod would wrap around at 2**63 and let a forged size through)
            expect *= d
        if nbytes != expect:
            raise ParamsFormatError("param %r: %d data bytes for %s %s (expected %d)"
                                    % (name, nbytes, dtype, tuple(shape), expect))
        off += _pad(off)
        if off + nbytes > size:
            raise ParamsFormatError("param %r: data runs past the end of the file" % name)
        try:
            arr = buf[off:off + nbytes].view(dt).reshape(shape)
        except ValueError as exc:  # a zero extent beside absurd ones: 0 bytes, but no array numpy can shape
            raise ParamsFormatError("param %r: numpy cannot hold the shape %s: %s" % (name, tuple(shape), exc)) \
                from exc
        out[name] = arr if dt.isnative else arr.astype(dt.newbyteorder("="))
        off += nbytes
    return out
