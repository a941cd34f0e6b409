"""The columns of a register block as vectors, by a network of two-input shuffles.

conv2d_pixels accumulates a (pixels x channels) block in a local buffer, row by row (one vector of channels per
pixel), and writes it to NCHW rows: for each channel, a vector along the pixels, which is a column of the block.
Read lane by lane (a load and an insertelement per element, 384 of each for a 12 x 32 block), LLVM spent a third of
such a kernel's compile time turning the chains back into shuffles (instruction selection and the SLP vectorizer).
Here the block's rows are loaded as they were stored and transposed by log2(rows) stages of shuffles.

The network: element (row r, column c) starts in vector r at lane c. With ``R = 2**k`` rows (missing rows are
undefined) and ``C = 2**s`` columns (k <= s), stage i exchanges bit i of the vector number with bit s - k + i of the
lane number, pairing the vectors that differ in bit i (two shuffles per pair). Afterwards vector
``c >> (s - k)`` holds column ``c`` at lanes ``(c & (2**(s - k) - 1)) + (r << (s - k))``; one more shuffle per column
picks its lanes out in row order.
"""
from __future__ import annotations

from typing import List

from llvmlite import ir

I32 = ir.IntType(32)


def usable(rows: int, cols: int) -> bool:
    """Whether ``cols`` columns (the stored row width) and ``rows`` rows can go through the network."""
    k = max(rows - 1, 0).bit_length()
    return rows >= 2 and cols >= 2 and cols & (cols - 1) == 0 and (1 << k) <= cols


def columns(b: ir.IRBuilder, row_vectors: List[ir.Value], cols: int) -> List[ir.Value]:
    """The ``cols`` columns of the block whose rows are ``row_vectors`` (each ``<cols x T>``), each as a vector
    of ``len(row_vectors)`` lanes, in row order (``usable(len(row_vectors), cols)`` must hold)."""
    rows = len(row_vectors)
    k = max(rows - 1, 0).bit_length()
    s = cols.bit_length() - 1
    vty = row_vectors[0].type
    undef = ir.Constant(vty, ir.Undefined)
    vs = list(row_vectors) + [undef] * ((1 << k) - rows)
    for i in range(k):
        j = s - k + i
        bit_v, bit_l = 1 << i, 1 << j
        lo_mask = [lane if not lane & bit_l else cols + (lane ^ bit_l) for lane in range(cols)]
        hi_mask = [lane | bit_l if not lane & bit_l else cols + lane for lane in range(cols)]
        out = list(vs)
        for v in range(1 << k):
            if v & bit_v:
                continue
            a, c = vs[v], vs[v | bit_v]
            out[v] = b.shuffle_vector(a, c, ir.Constant(ir.VectorType(I32, cols), lo_mask))
            out[v | bit_v] = b.shuffle_vector(a, c, ir.Constant(ir.VectorType(I32, cols), hi_mask))
        vs = out
    low = s - k
    picks = []
    for c in range(cols):
        lanes = [(c & ((1 << low) - 1)) + (r << low) for r in range(rows)]
        picks.append(b.shuffle_vector(vs[c >> low], undef, ir.Constant(ir.VectorType(I32, rows), lanes)))
    return picks
