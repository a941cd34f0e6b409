"""MXNet's .params file (what ``save_checkpoint`` and ``export`` write): the NDArray-list format of
``NDArray::Save``: uint64 magic 0x112, uint64 reserved, a uint64-counted list of arrays, a uint64-counted list of
names ("arg:conv0_weight", "aux:bn0_moving_mean"). Each array: uint32 magic (V2 0xF993fac9, V3 0xF993faca with
a storage type after it; V1 0xF993fac8; older files start with the dimension count), its shape (int32 count then
int64 dims; uint32 dims before V1), its context (two int32), its int32 type flag, then the raw data.
"""
from __future__ import annotations

import struct
from typing import Dict, List, Tuple

import numpy as np

from tether.errors import InvalidInput

LIST_MAGIC = 0x112
V1, V2, V3 = 0xF993FAC8, 0xF993FAC9, 0xF993FACA
DTYPES = {0: np.float32, 1: np.float64, 2: np.float16, 3: np.uint8, 4: np.int32, 5: np.int8, 6: np.int64}


class _Reader:
    def __init__(self, data: bytes, path: str) -> None:
        self.data, self.pos, self.path = data, 0, path

    def take(self, fmt: str):
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.data):
            raise InvalidInput("%s ends at byte %d inside an MXNet NDArray list: the file is truncated"
                               % (self.path, len(self.data)))
        values = struct.unpack_from("<" + fmt, self.data, self.pos)
        self.pos += size
        return values if len(values) > 1 else values[0]

    def raw(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise InvalidInput("%s ends at byte %d inside an MXNet NDArray list: the file is truncated"
                               % (self.path, len(self.data)))
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out


def _array(r: _Reader) -> np.ndarray:
    magic = r.take("I")
    if magic in (V2, V3):
        stype = r.take("i")
        if stype != 0:
            raise InvalidInput("%s holds a sparse NDArray (storage type %d), expected dense weights" % (r.path, stype))
    if magic in (V1, V2, V3):
        ndim = r.take("i")
        shape = tuple(r.take("%dq" % ndim)) if ndim > 1 else ((r.take("q"),) if ndim == 1 else ())
    else:                                 # before V1: the magic is the dimension count, dims are uint32
        ndim = magic
        shape = tuple(r.take("%dI" % ndim)) if ndim > 1 else ((r.take("I"),) if ndim == 1 else ())
    if ndim <= 0:                         # an empty (none) array: no context, type or data follow
        return np.zeros((0,), np.float32)
    r.take("ii")                          # the context it was saved from
    flag = r.take("i")
    if flag not in DTYPES:
        raise InvalidInput("%s holds an NDArray of type flag %d, which tether does not read" % (r.path, flag))
    dtype = np.dtype(DTYPES[flag])
    count = int(np.prod(shape))
    return np.frombuffer(r.raw(count * dtype.itemsize), dtype).reshape(shape).copy()


def is_params(head: bytes) -> bool:
    return len(head) >= 16 and struct.unpack_from("<QQ", head) == (LIST_MAGIC, 0)


def read_params(path: str) -> Dict[str, np.ndarray]:
    """name -> array, the "arg:"/"aux:" prefixes removed."""
    with open(path, "rb") as fh:
        r = _Reader(fh.read(), path)
    if not is_params(r.data[:16]):
        raise InvalidInput("%s is not an MXNet .params file: expected the NDArray-list magic 0x112 first" % path)
    r.pos = 16
    arrays: List[np.ndarray] = [_array(r) for _ in range(r.take("Q"))]
    names: List[str] = []
    for _ in range(r.take("Q")):
        names.append(r.raw(r.take("Q")).decode("utf-8", errors="replace"))
    if len(names) != len(arrays):
        raise InvalidInput("%s has %d arrays and %d names, expected one name per array" % (path, len(arrays),
                                                                                         len(names)))
    return {n.split(":", 1)[1] if n[:4] in ("arg:", "aux:") else n: a for n, a in zip(names, arrays)}


def write_params(path: str, arrays: Dict[str, Tuple[str, np.ndarray]]) -> None:
    """The inverse, for tests and tools: ``{name: ("arg" | "aux", array)}`` in the V2 format."""
    flags = {np.dtype(v): k for k, v in DTYPES.items()}
    out = [struct.pack("<QQQ", LIST_MAGIC, 0, len(arrays))]
    for _, arr in arrays.values():
        arr = np.ascontiguousarray(arr)
        out.append(struct.pack("<Iii", V2, 0, arr.ndim) + struct.pack("<%dq" % arr.ndim, *arr.shape))
        out.append(struct.pack("<iii", 1, 0, flags[arr.dtype]) + arr.tobytes())
    out.append(struct.pack("<Q", len(arrays)))
    for name, (kind, _) in arrays.items():
        key = ("%s:%s" % (kind, name)).encode()
        out.append(struct.pack("<Q", len(key)) + key)
    with open(path, "wb") as fh:
        fh.write(b"".join(out))
