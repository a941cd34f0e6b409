"""Padded views of an NCHW input for windowed ops (convolution, pooling), laid out so the kernels' vector loads
along output columns are contiguous:
- stride 1, width a multiple of a PAD_BLOCKS entry: an aligned padding stage (interior starts at a block boundary);
- stride 1 otherwise: a plain padding stage;
- column stride s > 1: the padded input split into its s column phases.
"""
from __future__ import annotations

from tether import te

from . import common as c
from .shape import pad as pad_op


def _padded(x, padding4: tuple, name: str, fill: float):
    top, left, bottom, right = padding4
    if not any(padding4):
        return x
    return pad_op(x, (0, 0, top, left), (0, 0, bottom, right), fill, name=f"{name}_pad")


# Column blocks of the aligned padding stage (the first that divides the width): its interior starts at a
# multiple of the block, so every vector of that many columns is wholly interior or wholly padding.
PAD_BLOCKS = (8, 4)


def _aligned_padded(x, p4: tuple, cols_needed: int, name: str, fill: float, blk: int):
    """(P, shift): x padded with `fill` into P[n, c, top + h + bottom, width] with the interior starting at column
    `margin` (a multiple of the block `blk` >= left), so padded column q of the usual layout is P column q + shift.

    Why: te.if_then_else evaluates both branches, so the load under a padding select needs an in-bounds index.
    Clamping the column per lane turns the load into a gather; here the clamp is of the column *block*, which
    is the same for all lanes of a vector, so loads stay contiguous vectors."""
    n, ch, h, w = c.shape_of(x)
    top, left, bottom, _ = p4
    margin = -(-left // blk) * blk if left else 0
    shift = margin - left
    width = -(-(cols_needed + shift) // blk) * blk
    fill_c = c.const(fill, x.dtype)
    rows = h + top + bottom

    def f(b, cc, i, j):
        col = c.clamp_index(j // blk - margin // blk, w // blk) * blk + j % blk
        conds = [j >= margin, j < margin + w] + ([i >= top, i < top + h] if (top or bottom) else [])
        row = c.clamp_index(i - top, h) if (top or bottom) else i
        return te.if_then_else(c.all_of(conds), x[b, cc, row, col], fill_c)

    pad = c.compute((n, ch, rows, width), f, f"{name}_pad", c.PAD, attrs={"vector_block": blk})
    return pad, shift


def padded_reader(x, p4: tuple, sw: int, dw: int, kw: int, ow: int, name: str, fill: float = 0.0):
    """(b, c, row, xx, rx) -> the input padded by p4 (top, left, bottom, right) with `fill`, at row `row` and
    column xx*sw + rx*dw.  Columns past the right padding read as `fill` too (pooling's ceil_mode needs some).

    With a column stride the padded input is stored split into its `sw` column phases,
    P[b, c, row, phase, j] = padded[b, c, row, j*sw + phase], so the kernel's loads along output columns are
    contiguous (a strided vector load would be a gather); the split costs one pass over the input."""
    if sw == 1:
        w = c.shape_of(x)[3]
        blk = next((b for b in PAD_BLOCKS if w % b == 0), None)
        if blk is not None and (p4[1] or p4[3]):
            xp, shift = _aligned_padded(x, p4, ow + (kw - 1) * dw, name, fill, blk)
            return lambda b, ch, row, xx, rx: xp[b, ch, row, xx + rx * dw + shift]
        xp = _padded(x, p4, name, fill)
        return lambda b, ch, row, xx, rx: xp[b, ch, row, xx + rx * dw]
    n, ch, h, w = c.shape_of(x)
    top, left, bottom, _ = p4
    cols = ow + ((kw - 1) * dw) // sw
    fill_c = c.const(fill, x.dtype)

    def f(b, cc, i, ph, j):
        row, col = i - top, j * sw + ph - left
        conds = [col >= 0, col < w] + ([row >= 0, row < h] if (top or bottom) else [])
        src = x[b, cc, c.clamp_index(row, h) if (top or bottom) else row, c.clamp_index(col, w)]
        return te.if_then_else(c.all_of(conds), src, fill_c)

    # "column_phases": the schedule may make it per channel (ops/schedules.py _channel_pads)
    phases = c.compute((n, ch, h + top + bottom, sw, cols), f, f"{name}_phases", c.PAD, attrs={"column_phases": sw})
    return lambda b, cc, row, xx, rx: phases[b, cc, row, (rx * dw) % sw, xx + (rx * dw) // sw]
