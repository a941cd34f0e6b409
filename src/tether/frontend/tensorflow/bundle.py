"""A TensorFlow tensor bundle (a checkpoint: ``variables/variables.index`` and ``variables.data-*-of-*``).

The index is a LevelDB-format table (an SSTable): data blocks of prefix-compressed key/value entries, an index
block pointing at them, and a 48-byte footer pointing at the index. The key "" holds a BundleHeaderProto; every
other key is a tensor's checkpoint key and its value a BundleEntryProto saying which data file (shard) holds the
tensor's bytes, at which offset and how many. TensorFlow writes the index uncompressed and numeric tensors as
their raw little-endian bytes; string tensors (the checkpoint's object graph is one) are a table of varint
lengths, a checksum, then the bytes.
"""
from __future__ import annotations

import os
import struct
from typing import Dict, Iterator, Optional, Tuple

import numpy as np

from tether.errors import InvalidInput
from tether.frontend.tensorflow import protos
from tether.frontend.tensorflow.tensors import np_dtype, shape_of

_TABLE_MAGIC = 0xdb4775248b80fb57
_FOOTER = 48
_TRAILER = 5            # a block's compression type (1 byte) and crc32c (4 bytes)


class _Corrupt(Exception):
    pass


def _varint(data: bytes, pos: int) -> Tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise _Corrupt("a varint runs past its block")
        b = data[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos
        shift += 7


def _block(data: bytes, offset: int, size: int) -> bytes:
    if offset < 0 or offset + size + _TRAILER > len(data):
        raise _Corrupt("a block lies past the end of the file")
    if data[offset + size] != 0:
        raise _Corrupt("a block is compressed (type %d); TensorFlow writes bundles uncompressed"
                       % data[offset + size])
    return data[offset:offset + size]


def _entries(block: bytes) -> Iterator[Tuple[bytes, bytes]]:
    if len(block) < 4:
        raise _Corrupt("a block is shorter than its restart count")
    restarts = struct.unpack_from("<I", block, len(block) - 4)[0]
    end = len(block) - 4 - 4 * restarts
    if end < 0:
        raise _Corrupt("a block's restart array is longer than the block")
    pos, key = 0, b""
    while pos < end:
        shared, pos = _varint(block, pos)
        unshared, pos = _varint(block, pos)
        vlen, pos = _varint(block, pos)
        if shared > len(key) or pos + unshared + vlen > end:
            raise _Corrupt("an entry runs past its block")
        key = key[:shared] + block[pos:pos + unshared]
        pos += unshared
        yield key, block[pos:pos + vlen]
        pos += vlen


def read_table(data: bytes) -> Dict[bytes, bytes]:
    """Every key/value of an SSTable's bytes."""
    if len(data) < _FOOTER or struct.unpack_from("<Q", data, len(data) - 8)[0] != _TABLE_MAGIC:
        raise _Corrupt("no table footer (magic number) at its end")
    footer = data[len(data) - _FOOTER:]
    _, pos = _varint(footer, 0)          # the metaindex block: TensorFlow stores nothing there
    _, pos = _varint(footer, pos)
    index_offset, pos = _varint(footer, pos)
    index_size, pos = _varint(footer, pos)
    out: Dict[bytes, bytes] = {}
    for _, handle in _entries(_block(data, index_offset, index_size)):
        offset, p = _varint(handle, 0)
        size, _ = _varint(handle, p)
        out.update(_entries(_block(data, offset, size)))
    return out


class TensorBundle:
    """The tensors of a checkpoint, by checkpoint key; each is read from its data file when asked for."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        index = prefix + ".index"
        if not os.path.isfile(index):
            raise InvalidInput("%s is missing; expected the variables' index of the SavedModel" % index)
        with open(index, "rb") as fh:
            data = fh.read()
        try:
            table = read_table(data)
            header = protos.BundleHeaderProto.FromString(table.pop(b"", b""))
            self.entries = {k.decode("utf-8"): protos.BundleEntryProto.FromString(v) for k, v in table.items()}
        except (_Corrupt, UnicodeDecodeError, Exception) as exc:  # a protobuf DecodeError included
            raise InvalidInput("%s is not a valid tensor bundle index (%s); expected a LevelDB table of "
                               "BundleEntryProto" % (index, exc)) from None
        if header.endianness != 0:
            raise InvalidInput("%s: the bundle is big-endian; tether reads little-endian bundles" % index)
        self.num_shards = max(1, header.num_shards)
        self._shards: Dict[int, bytes] = {}

    def _shard(self, shard: int) -> bytes:
        if shard not in self._shards:
            path = "%s.data-%05d-of-%05d" % (self.prefix, shard, self.num_shards)
            if not os.path.isfile(path):
                raise InvalidInput("%s is missing; expected the variables' data shard %d of the SavedModel"
                                   % (path, shard))
            with open(path, "rb") as fh:
                self._shards[shard] = fh.read()
        return self._shards[shard]

    def _bytes(self, key: str) -> Tuple[object, bytes]:
        e = self.entries[key]
        if len(e.slices):
            raise InvalidInput("%s: tensor %r is saved in slices (a partitioned variable), which tether does "
                               "not read" % (self.prefix, key))
        data = self._shard(e.shard_id)
        if e.offset + e.size > len(data):
            raise InvalidInput("%s: tensor %r lies past the end of its data file (truncated)" % (self.prefix, key))
        return e, data[e.offset:e.offset + e.size]

    def tensor(self, key: str) -> np.ndarray:
        e, raw = self._bytes(key)
        dtype = np_dtype(e.dtype, "checkpoint tensor %r" % key)
        shape = shape_of(e.shape) or ()
        if dtype == np.object_:
            raise InvalidInput("%s: tensor %r holds strings; tether reads numeric variables" % (self.prefix, key))
        flat = np.frombuffer(raw, dtype=dtype.newbyteorder("<")).astype(dtype)
        n = int(np.prod(shape, dtype=np.int64))
        if flat.size != n:
            raise InvalidInput("%s: tensor %r has %d values, its shape %s needs %d"
                               % (self.prefix, key, flat.size, list(shape), n))
        return flat.reshape(shape)

    def string_scalar(self, key: str) -> Optional[bytes]:
        """A scalar string tensor (the checkpoint's object graph): its length varint, a crc32c, then its bytes."""
        if key not in self.entries:
            return None
        _, raw = self._bytes(key)
        length, pos = _varint(raw, 0)
        return raw[pos + 4:pos + 4 + length]
