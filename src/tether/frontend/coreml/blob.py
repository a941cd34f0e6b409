"""The weight file of an ML Program package (``weights/weight.bin``, MIL blob storage version 2).

The file is a 64-byte header (blob count, version) followed by blobs, each a 64-byte metadata record (sentinel
0xDEADBEEF, data type, size in bytes, offset of the data in the file, unused bits of a sub-byte span) that a
const's ``blobFileValue.offset`` points at. Values are little-endian; sub-byte types are packed from the low bits
of each byte up.
"""
from __future__ import annotations

import struct
from typing import Dict, Sequence

import numpy as np

from tether.errors import InvalidInput

SENTINEL = 0xDEADBEEF
_HEADER = struct.Struct("<II")
_METADATA = struct.Struct("<IIQQQ")

# BlobDataType -> (numpy dtype of the unpacked values, bits per value)
BLOB_TYPES: Dict[int, tuple] = {
    1: (np.float16, 16), 2: (np.float32, 32), 3: (np.uint8, 8), 4: (np.int8, 8), 5: ("bfloat16", 16),
    6: (np.int16, 16), 7: (np.uint16, 16), 8: (np.int8, 4), 9: (np.uint8, 1), 10: (np.uint8, 2),
    11: (np.uint8, 4), 12: (np.uint8, 3), 13: (np.uint8, 6), 14: (np.int32, 32), 15: (np.uint32, 32),
}


class BlobFile:
    """One weight file, read once; :meth:`read` returns the array a const's blob offset names."""

    def __init__(self, path: str):
        self.path = path
        try:
            with open(path, "rb") as fh:
                self.data = fh.read()
        except OSError as exc:
            raise InvalidInput("%s cannot be read (%s); expected the weight file of a Core ML package"
                               % (path, exc.strerror or exc)) from None
        if len(self.data) < 64:
            raise InvalidInput("%s is truncated (%d bytes); expected a Core ML weight file with a 64-byte header"
                               % (path, len(self.data)))
        _, self.version = _HEADER.unpack_from(self.data, 0)
        if self.version != 2:
            raise InvalidInput("%s has weight storage version %d; expected version 2" % (path, self.version))

    def read(self, offset: int, shape: Sequence[int]) -> np.ndarray:
        if offset + _METADATA.size > len(self.data):
            raise InvalidInput("%s: a weight at offset %d lies beyond the end of the file (%d bytes); the file is "
                               "truncated or belongs to another model" % (self.path, offset, len(self.data)))
        sentinel, dtype, size, data_offset, pad_bits = _METADATA.unpack_from(self.data, offset)
        if sentinel != SENTINEL or dtype not in BLOB_TYPES:
            raise InvalidInput("%s: no weight metadata at offset %d (sentinel %#x, type %d); the file is corrupt or "
                               "belongs to another model" % (self.path, offset, sentinel, dtype))
        if data_offset + size > len(self.data):
            raise InvalidInput("%s: the weight at offset %d needs bytes %d..%d, past the end of the file (%d bytes)"
                               % (self.path, offset, data_offset, data_offset + size, len(self.data)))
        raw = self.data[data_offset:data_offset + size]
        np_type, bits = BLOB_TYPES[dtype]
        count = int(np.prod(shape)) if len(shape) else 1
        if np_type == "bfloat16":
            values = (np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
        elif bits >= 8:
            values = np.frombuffer(raw, dtype=np.dtype(np_type).newbyteorder("<"))
        else:
            bitstream = np.unpackbits(np.frombuffer(raw, dtype=np.uint8), bitorder="little")
            bitstream = bitstream[:len(bitstream) - pad_bits] if pad_bits else bitstream
            groups = bitstream[:(len(bitstream) // bits) * bits].reshape(-1, bits).astype(np.int32)
            values = (groups << np.arange(bits, dtype=np.int32)).sum(axis=1)
            if np_type is np.int8:      # two's complement of the sub-byte width
                values = np.where(values >= 1 << (bits - 1), values - (1 << bits), values)
            values = values.astype(np_type)
        if values.size < count:
            raise InvalidInput("%s: the weight at offset %d holds %d values; the model expects %d for shape %s"
                               % (self.path, offset, values.size, count, list(shape)))
        return values[:count].reshape(tuple(shape)).copy()
