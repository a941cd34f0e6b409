"""2-D convolution in NCHW / OIHW layout: strides, asymmetric padding, dilation, groups; depthwise."""
from __future__ import annotations

from tether import te

from . import common as c
from .linear import PANEL, pack_panels
from .shape import pad as pad_op
from .window import padded_reader


def out_extent(size: int, kernel: int, stride: int, pad_lo: int, pad_hi: int, dilation: int) -> int:
    eff = (kernel - 1) * dilation + 1
    return (size + pad_lo + pad_hi - eff) // stride + 1


def output_geometry(h, wd, kh, kw, stride, padding, dilation, name):
    """Strides, dilations, 4-sided padding and the output extent of a 2-D window, checked to be non-empty."""
    sh, sw = c.to_pair(stride, "stride")
    dh, dw = c.to_pair(dilation, "dilation")
    p4 = c.to_padding4(padding)
    oh, ow = out_extent(h, kh, sh, p4[0], p4[2], dh), out_extent(wd, kw, sw, p4[1], p4[3], dw)
    if oh <= 0 or ow <= 0:
        raise ValueError(f"{name}: kernel {kh}x{kw} does not fit input {h}x{wd} with padding {p4}")
    return sh, sw, dh, dw, p4, oh, ow


def conv2d(x, w, stride=1, padding=0, dilation=1, groups: int = 1, bias=None, name: str = "conv2d"):
    """x (N, C, H, W) * w (O, C/groups, KH, KW) [+ bias (O,)] -> (N, O, OH, OW)."""
    n, ch, h, wd = c.shape_of(x)
    oc, icg, kh, kw = c.shape_of(w)
    if ch % groups or oc % groups or icg != ch // groups:
        raise ValueError(f"{name}: input {c.shape_of(x)} and weight {c.shape_of(w)} do not fit groups={groups}")
    if groups == ch and icg == 1 and groups > 1:
        return depthwise_conv2d(x, w, stride, padding, dilation, bias, name)
    sh, sw, dh, dw, p4, oh, ow = output_geometry(h, wd, kh, kw, stride, padding, dilation, name)
    read = padded_reader(x, p4, sw, dw, kw, ow, name)
    ocg = oc // groups
    rc = te.reduce_axis((0, icg), name="rc")
    ry = te.reduce_axis((0, kh), name="ry")
    rx = te.reduce_axis((0, kw), name="rx")

    def f(b, o, y, xx):
        cin = rc if groups == 1 else (o // ocg) * icg + rc
        return te.sum(read(b, cin, y * sh + ry * dh, xx, rx) * w[o, rc, ry, rx], axis=[rc, ry, rx])

    out = c.compute((n, oc, oh, ow), f, name if bias is None else f"{name}_conv", c.CONV2D)
    return _add_bias(out, bias, name)


def conv2d_pixels(x, w, kernel: tuple, stride=1, padding=0, dilation=1, out_channels: int | None = None,
                  groups: int = 1, name: str = "conv2d_pixels", panel: int = PANEL, channels_last_out: bool = False,
                  channels_last_in: bool = False):
    """x (C, H, W) * w (O, C/groups*KH*KW) -> (O, OH*OW): one image's convolution with the output pixels flattened;
    a batch x (N, C, H, W) -> (N, O, OH*OW), its images' pixels one block axis
    (``channels_last_out``: (OH*OW, O), the NHWC image's pixels, written as the register blocks hold them).
    ``w`` may also come packed already (ops.linear.pack_panels_array: (ceil(O/P), C/groups*KH*KW, P) for a panel
    width P, 16 by default); then ``out_channels`` gives O and the packing its panel width, else ``panel`` does.
    With groups, each group's output channels must fill whole panels (O/groups a multiple of the width), so that a
    panel reads one group's input channels.

    Computed as an implicit GEMM with output channels as the vector axis: conv[p, o] = sum_k xpad[patch(p, k)] *
    panels[o // PANEL, k, o % PANEL], the weights packed into the matmul's PANEL-wide panels. A register block is a
    few output pixels times one panel of channels (the matmul micro-kernel, with the input patch element broadcast
    where matmul broadcasts A), so it fills whole vectors at any output width; the flattened pixel axis leaves
    only one partial block per image rather than one per row. Narrow rows (13..55 wide) waste most lanes of a
    row-vectorized direct convolution, and an explicit im2col column buffer costs a pass over memory and an
    index decode per element.

    ``channels_last_in``: x is the NHWC image (H, W, C) and the weights' reduction runs (KH, KW, C) (packed from
    (O, KH, KW, C)): each pixel's patch is then KH runs of KW*C contiguous elements, read in order by the
    reduction, where the NCHW one steps to another input row (a page or more away) at every channel. With a long
    reduction (wav2vec2's 512 -> 512 1-D convs: 1536 steps) the NCHW patches of a 12-pixel block touched two
    lines of each of 512 rows, more than L1 holds, and ran at 60 GFLOP/s where a matmul does 100."""
    batch = 1
    if channels_last_in:
        h, wd, ch = c.shape_of(x)
    elif len(c.shape_of(x)) == 4:
        batch, ch, h, wd = c.shape_of(x)
    else:
        ch, h, wd = c.shape_of(x)
    prepacked = len(c.shape_of(w)) == 3
    kk = c.shape_of(w)[1]
    oc = out_channels if prepacked else c.shape_of(w)[0]
    if prepacked and (oc is None or not 0 < oc <= c.shape_of(w)[0] * c.shape_of(w)[2]):
        raise ValueError(f"{name}: packed weight {c.shape_of(w)} needs out_channels within its panels, got {oc}")
    kh, kw = kernel
    if ch % groups or kk != ch // groups * kh * kw:
        raise ValueError(f"{name}: weight {c.shape_of(w)} does not fit {ch} channels in {groups} group(s) of a "
                         f"{kh}x{kw} kernel")
    sh, sw, dh, dw, p4, oh, ow = output_geometry(h, wd, kh, kw, stride, padding, dilation, name)
    top, left, bottom, right = p4
    batched = not channels_last_in and len(c.shape_of(x)) == 4
    if channels_last_in:
        before, after = (top, left, 0), (bottom, right, 0)
    else:
        lead = (0,) * (len(c.shape_of(x)) - 2)      # the batch and channel axes take no padding
        before, after = lead + (top, left), lead + (bottom, right)
    xp = pad_op(x, before, after, name=f"{name}_pad") if any(p4) else x
    panels = w if prepacked else pack_panels(w, 0, f"{name}_panels", width=panel)
    pw = int(panels.shape[2])
    icg = ch // groups
    if groups > 1 and (oc % groups or (oc // groups) % pw):
        raise ValueError(f"{name}: {oc} output channels in {groups} groups do not fill whole {pw}-wide panels")
    rc = te.reduce_axis((0, icg), name="rc")
    ry = te.reduce_axis((0, kh), name="ry")
    rx = te.reduce_axis((0, kw), name="rx")

    pixels = oh * ow
    if batched and channels_last_out:
        raise ValueError(f"{name}: channels_last_out takes one image, got a batch of {batch}")

    def body(p, o, b):
        y, xx = p // ow, p % ow
        # a panel lies in one group: its input channels follow from the panel index, the same for all lanes
        cin = rc if groups == 1 else (o // pw) // (oc // groups // pw) * icg + rc
        if channels_last_in:
            k = (ry * kw + rx) * icg + rc
            return te.sum(xp[y * sh + ry * dh, xx * sw + rx * dw, cin] * panels[o // pw, k, o % pw],
                          axis=[ry, rx, rc])
        k = (rc * kh + ry) * kw + rx
        image = (b,) if batched else ()
        return te.sum(xp[image + (cin, y * sh + ry * dh, xx * sw + rx * dw)] * panels[o // pw, k, o % pw],
                      axis=[rc, ry, rx])

    # over whole panels: the padding channels are zero weights, and a partial panel would otherwise run its
    # vector of channels as a scalar remainder loop
    # "panel": the width the schedule blocks channels by; "group_channels": the widths a packing may choose divide it
    attrs = {"panel": pw, "group_channels": oc // groups if groups > 1 else 0}
    if channels_last_out:
        attrs["channels_last_out"] = 1
    width = int(panels.shape[0]) * pw
    if batched:     # a batch: (N, pixels, channels) blocks, the schedule's loops over each image's pixels
        conv = c.compute((batch, pixels, width), lambda b, p, o: body(p, o, b), f"{name}_nc", c.CONV2D_PIXELS,
                         attrs=attrs)
        return c.compute((batch, oc, pixels), lambda b, o, p: conv[b, p, o], name, c.INJECTIVE)
    conv = c.compute((pixels, width), lambda p, o: body(p, o, None), f"{name}_nc", c.CONV2D_PIXELS, attrs=attrs)
    if channels_last_out:
        return c.compute((pixels, oc), lambda p, o: conv[p, o], name, c.INJECTIVE)
    return c.compute((oc, pixels), lambda o, p: conv[p, o], name, c.INJECTIVE)


def depthwise_conv2d(x, w, stride=1, padding=0, dilation=1, bias=None, name: str = "depthwise_conv2d"):
    """x (N, C, H, W) * w (C*M, 1, KH, KW) -> (N, C*M, OH, OW): each input channel gets M filters."""
    n, ch, h, wd = c.shape_of(x)
    oc, one, kh, kw = c.shape_of(w)
    if one != 1 or oc % ch:
        raise ValueError(f"{name}: depthwise weight must be (C*M, 1, KH, KW) for {ch} channels, got {c.shape_of(w)}")
    mult = oc // ch
    sh, sw, dh, dw, p4, oh, ow = output_geometry(h, wd, kh, kw, stride, padding, dilation, name)
    owp = window_columns(ow)
    if owp != ow:       # the extra output columns read zeros past the right padding
        p4 = (p4[0], p4[1], p4[2], p4[3] + (owp - ow) * sw)
    read = padded_reader(x, p4, sw, dw, kw, owp, name)
    ry = te.reduce_axis((0, kh), name="ry")
    rx = te.reduce_axis((0, kw), name="rx")

    def f(b, o, y, xx):
        cin = o if mult == 1 else o // mult
        return te.sum(read(b, cin, y * sh + ry * dh, xx, rx) * w[o, 0, ry, rx], axis=[ry, rx])

    plain = name if bias is None else f"{name}_conv"
    out = c.compute((n, oc, oh, owp), f, plain if owp == ow else f"{plain}_wide", c.DEPTHWISE_CONV2D)
    if owp != ow:
        full = out
        out = c.compute((n, oc, oh, ow), lambda b, o, y, xx: full[b, o, y, xx], plain, c.INJECTIVE)
    return _add_bias(out, bias, name)


# ---------------------------------------------------------------- depthwise output width in whole vectors
# The window schedule vectorizes a row of output columns in blocks that divide the row; a width with no divisor
# near a vector (38, 76, 19: a detector's 608-wide input over strides 16, 8, 32) left a scalar tail block that ran
# each of the window's taps as its own scalar loop (5x5 256 @50x38: 17 GFLOP/s against 47 at 48 wide). Such a
# width is computed rounded up to whole 16-column blocks (vectors on AVX-512, two or four on AVX2 / NEON), the
# extra columns reading padding, and copied out with any epilogue fused into the copy.
WINDOW_COLUMN_BLOCK = 16


def window_columns(ow: int) -> int:
    """The width a depthwise conv computes for ``ow`` output columns: ``ow`` itself when it is one block or less
    or a block near a vector (8..16 columns) divides it, else ``ow`` rounded up to whole WINDOW_COLUMN_BLOCKs."""
    blk = WINDOW_COLUMN_BLOCK
    if ow <= blk or any(ow % d == 0 for d in range(blk // 2, blk + 1)):
        return ow
    return -(-ow // blk) * blk


def _add_bias(out, bias, name: str):
    if bias is None:
        return out
    if c.shape_of(bias) != (c.shape_of(out)[1],):
        raise ValueError(f"{name}: bias must have shape ({c.shape_of(out)[1]},), got {c.shape_of(bias)}")
    return c.compute(out.shape, lambda b, o, y, xx: out[b, o, y, xx] + bias[o], name, c.BROADCAST)
