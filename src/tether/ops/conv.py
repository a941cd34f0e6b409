"""2-D convolution in NCHW / OIHW layout: strides, asymmetric padding, dilation, groups; depthwise."""
from __future__ import annotations

from tether import te

from . import common as c
from .shape import pad as pad_op


def out_extent(size: int, kernel: int, stride: int, pad_lo: int, pad_hi: int, dilation: int) -> int:
    eff = (kernel - 1) * dilation + 1
    return (size + pad_lo + pad_hi - eff) // stride + 1


def _padded(x, padding4: tuple, name: str):
    top, left, bottom, right = padding4
    if not any(padding4):
        return x
    return pad_op(x, (0, 0, top, left), (0, 0, bottom, right), 0.0, name=f"{name}_pad")


# Column block of the aligned padding stage: its interior starts at a multiple of this, so every vector of that
# many columns is wholly interior or wholly padding (when the width is a multiple of it).
PAD_BLOCK = 8


def _aligned_padded(x, p4: tuple, cols_needed: int, name: str):
    """(P, shift): x zero-padded into P[n, c, top + h + bottom, width] with the interior starting at column
    `margin` (a multiple of PAD_BLOCK >= left), so padded column q of the usual layout is P column q + shift.

    Why: te.if_then_else evaluates both branches, so the load under a padding select needs an in-bounds index.
    Clamping the column per lane turns the load into a gather; here the clamp is of the column *block*, which
    is the same for all lanes of a vector, so loads stay contiguous vectors."""
    n, ch, h, w = c.shape_of(x)
    top, left, bottom, _ = p4
    blk = PAD_BLOCK
    margin = -(-left // blk) * blk if left else 0
    shift = margin - left
    width = -(-(cols_needed + shift) // blk) * blk
    zero = c.const(0.0, x.dtype)
    rows = h + top + bottom

    def f(b, cc, i, j):
        col = c.clamp_index(j // blk - margin // blk, w // blk) * blk + j % blk
        conds = [j >= margin, j < margin + w] + ([i >= top, i < top + h] if (top or bottom) else [])
        row = c.clamp_index(i - top, h) if (top or bottom) else i
        return te.if_then_else(c.all_of(conds), x[b, cc, row, col], zero)

    pad = c.compute((n, ch, rows, width), f, f"{name}_pad", c.PAD, attrs={"vector_block": blk})
    return pad, shift


def _input_reader(x, p4: tuple, sw: int, dw: int, kw: int, ow: int, name: str):
    """(b, c, row, xx, rx) -> the padded input at row `row`, column xx*sw + rx*dw.

    With a column stride the padded input is stored split into its `sw` column phases,
    P[b, c, row, phase, j] = padded[b, c, row, j*sw + phase], so the kernel's loads along output columns are
    contiguous (a strided vector load would be a gather); the split costs one pass over the input."""
    if sw == 1:
        w = c.shape_of(x)[3]
        if w % PAD_BLOCK == 0 and (p4[1] or p4[3]):
            xp, shift = _aligned_padded(x, p4, ow + (kw - 1) * dw, name)
            return lambda b, ch, row, xx, rx: xp[b, ch, row, xx + rx * dw + shift]
        xp = _padded(x, p4, name)
        return lambda b, ch, row, xx, rx: xp[b, ch, row, xx + rx * dw]
    n, ch, h, w = c.shape_of(x)
    top, left, bottom, _ = p4
    cols = ow + ((kw - 1) * dw) // sw
    zero = c.const(0.0, x.dtype)

    def f(b, cc, i, ph, j):
        row, col = i - top, j * sw + ph - left
        conds = [col >= 0, col < w] + ([row >= 0, row < h] if (top or bottom) else [])
        src = x[b, cc, c.clamp_index(row, h) if (top or bottom) else row, c.clamp_index(col, w)]
        return te.if_then_else(c.all_of(conds), src, zero)

    phases = c.compute((n, ch, h + top + bottom, sw, cols), f, f"{name}_phases", c.PAD)
    return lambda b, cc, row, xx, rx: phases[b, cc, row, (rx * dw) % sw, xx + (rx * dw) // sw]


def conv2d(x, w, stride=1, padding=0, dilation=1, groups: int = 1, bias=None, name: str = "conv2d"):
    """x (N, C, H, W) * w (O, C/groups, KH, KW) [+ bias (O,)] -> (N, O, OH, OW)."""
    n, ch, h, wd = c.shape_of(x)
    oc, icg, kh, kw = c.shape_of(w)
    if ch % groups or oc % groups or icg != ch // groups:
        raise ValueError(f"{name}: input {c.shape_of(x)} and weight {c.shape_of(w)} do not fit groups={groups}")
    if groups == ch and icg == 1 and groups > 1:
        return depthwise_conv2d(x, w, stride, padding, dilation, bias, name)
    sh, sw = c.to_pair(stride, "stride")
    dh, dw = c.to_pair(dilation, "dilation")
    p4 = c.to_padding4(padding)
    oh, ow = out_extent(h, kh, sh, p4[0], p4[2], dh), out_extent(wd, kw, sw, p4[1], p4[3], dw)
    if oh <= 0 or ow <= 0:
        raise ValueError(f"{name}: kernel {kh}x{kw} does not fit input {h}x{wd} with padding {p4}")
    read = _input_reader(x, p4, sw, dw, kw, ow, name)
    ocg = oc // groups
    rc = te.reduce_axis((0, icg), name="rc")
    ry = te.reduce_axis((0, kh), name="ry")
    rx = te.reduce_axis((0, kw), name="rx")

    def f(b, o, y, xx):
        cin = rc if groups == 1 else (o // ocg) * icg + rc
        return te.sum(read(b, cin, y * sh + ry * dh, xx, rx) * w[o, rc, ry, rx], axis=[rc, ry, rx])

    out = c.compute((n, oc, oh, ow), f, name if bias is None else f"{name}_conv", c.CONV2D)
    return _add_bias(out, bias, name)


def depthwise_conv2d(x, w, stride=1, padding=0, dilation=1, bias=None, name: str = "depthwise_conv2d"):
    """x (N, C, H, W) * w (C*M, 1, KH, KW) -> (N, C*M, OH, OW): each input channel gets M filters."""
    n, ch, h, wd = c.shape_of(x)
    oc, one, kh, kw = c.shape_of(w)
    if one != 1 or oc % ch:
        raise ValueError(f"{name}: depthwise weight must be (C*M, 1, KH, KW) for {ch} channels, got {c.shape_of(w)}")
    mult = oc // ch
    sh, sw = c.to_pair(stride, "stride")
    dh, dw = c.to_pair(dilation, "dilation")
    p4 = c.to_padding4(padding)
    oh, ow = out_extent(h, kh, sh, p4[0], p4[2], dh), out_extent(wd, kw, sw, p4[1], p4[3], dw)
    if oh <= 0 or ow <= 0:
        raise ValueError(f"{name}: kernel {kh}x{kw} does not fit input {h}x{wd} with padding {p4}")
    read = _input_reader(x, p4, sw, dw, kw, ow, name)
    ry = te.reduce_axis((0, kh), name="ry")
    rx = te.reduce_axis((0, kw), name="rx")

    def f(b, o, y, xx):
        cin = o if mult == 1 else o // mult
        return te.sum(read(b, cin, y * sh + ry * dh, xx, rx) * w[o, 0, ry, rx], axis=[ry, rx])

    out = c.compute((n, oc, oh, ow), f, name if bias is None else f"{name}_conv", c.DEPTHWISE_CONV2D)
    return _add_bias(out, bias, name)


def _add_bias(out, bias, name: str):
    if bias is None:
        return out
    if c.shape_of(bias) != (c.shape_of(out)[1],):
        raise ValueError(f"{name}: bias must have shape ({c.shape_of(out)[1]},), got {c.shape_of(bias)}")
    return c.compute(out.shape, lambda b, o, y, xx: out[b, o, y, xx] + bias[o], name, c.BROADCAST)
