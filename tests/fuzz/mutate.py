"""A small seeded byte mutator for the Java decoder's batches (atheris guides the Python targets; the JVM gets
its inputs from here, in one run). Mutations aim at what a frame decoder trusts: length fields, msgpack type
bytes and container sizes, plus the usual flips, inserts, deletes and splices."""
from __future__ import annotations

import random
import struct
from typing import List, Sequence

# msgpack type bytes worth planting: containers and strings with 16/32-bit sizes, bins, exts, the unused c1
TYPE_BYTES = bytes((0x90, 0x9f, 0x80, 0x8f, 0xdc, 0xdd, 0xde, 0xdf, 0xd9, 0xda, 0xdb, 0xc4, 0xc5, 0xc6, 0xc7, 0xc8,
                    0xc9, 0xd4, 0xd5, 0xd6, 0xd7, 0xd8, 0xc1, 0xca, 0xcb, 0xcf, 0xd3))
SIZES = (0, 1, 0x7f, 0x80, 0xff, 0x100, 0xffff, 0x10000, 0x7fffffff, 0x80000000, 0xffffffff)


def mutate(data: bytes, rng: random.Random, seeds: Sequence[bytes]) -> bytes:
    b = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(7)
        pos = rng.randrange(len(b) + 1)
        if op == 0 and b:
            b[min(pos, len(b) - 1)] ^= 1 << rng.randrange(8)
        elif op == 1:
            b[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        elif op == 2 and b:
            del b[pos:pos + rng.randint(1, 16)]
        elif op == 3 and b:
            b[min(pos, len(b) - 1)] = rng.choice(TYPE_BYTES)
        elif op == 4 and len(b) >= pos + 4:
            b[pos:pos + 4] = struct.pack(">I", rng.choice(SIZES))
        elif op == 5 and len(b) >= 4:  # the frame header: close to the real length, or absurd
            body = len(b) - 4
            b[0:4] = struct.pack(">I", rng.choice((body, body - 1, body + 1, 0, 0xffffffff, 16 << 20)) & 0xffffffff)
        elif op == 6:
            other = rng.choice(seeds)
            cut = rng.randrange(len(other) + 1)
            b[pos:] = other[cut:]
    return bytes(b)


def batch(seeds: Sequence[bytes], count: int, seed: int = 0) -> List[bytes]:
    """The seeds themselves, then ``count`` mutants (deterministic for a given ``seed``)."""
    rng = random.Random(seed)
    out = list(seeds)
    for _ in range(count):
        out.append(mutate(rng.choice(seeds), rng, seeds))
    return out


def write_batch(inputs: Sequence[bytes], path) -> None:
    with open(path, "wb") as fh:
        for data in inputs:
            fh.write(struct.pack(">I", len(data)) + data)
