"""The int8 depthwise convolution: ``qdepthwise2d``, exact in float32.

A depthwise tap window has few products (9 for 3x3): with 8-bit activations and int8-valued weights every
product and every partial sum is an integer far below 2**24, so float32 multiply-adds compute the int32
accumulator exactly (the caller checks the bound with the bias, as passes/quantize_float.py does), at the rate of
the fp32 kernels, where 32-bit integer multiplies (vpmulld, mul.4s) run at a fraction of it. A dot product of four
channels does not apply: each output channel reads one input channel.

Layouts: the first stage reads the 8-bit input once and writes ``x - zx`` as float32, padded (with zeros: the
zero point's value), and for stride s split into s column phases, ``[C, H + pads, s, ceil((W + pads) / s)]``,
so that the window's loads move by one element per output column at any stride (a stride-2 conv would otherwise
gather every other element). The conv itself is the DEPTHWISE_CONV2D window kernel: a block of output columns
in vector registers, the taps unrolled, one channel per parallel task, the requantize fused into its write-back;
each task writes its channel's float planes just before it reads them (ops/qschedules.py), so they stay in
cache instead of going through memory four times the input's size.
"""
from __future__ import annotations

from tether import te

from . import common as c
from .conv import output_geometry

QDEPTHWISE = "qdepthwise"      # the tag of the window stage (its schedule: ops/qschedules.py)


def window_geometry(x_shape, w_shape, stride, padding, name: str) -> tuple:
    """(C, H, W, KH, KW, stride h, stride w, 4-sided pads, OH, OW) of a depthwise conv of one image, x (1, C, H, W)
    and w (C, KH, KW) (the channels-last kernel passes its shapes in this order), checked to fit."""
    n, ch, h, wd = x_shape
    wc, kh, kw = w_shape
    if n != 1 or wc != ch:
        raise ValueError("%s: input %s and depthwise weight %s do not match" % (name, x_shape, w_shape))
    sh, sw, _, _, p4, oh, ow = output_geometry(h, wd, kh, kw, stride, padding, 1, name)
    return ch, h, wd, kh, kw, sh, sw, p4, oh, ow


def qdepthwise2d(x, w, bias, stride, padding, x_zero: int, name: str = "qdepthwise2d"):
    """x (1, C, H, W) uint8/int8, w (C, KH, KW) float32 (integer values), bias (C,) float32 ->
    (1, C, OH, OW) float32: bias[c] + sum_taps (x - x_zero) * w, exact while the sums stay below 2**24."""
    ch, h, wd, kh, kw, sh, sw, p4, oh, ow = window_geometry(c.shape_of(x), c.shape_of(w), stride, padding, name)
    top, left, bottom, right = p4
    hp = h + top + bottom
    wq = -(-(wd + left + right) // sw)
    zero = c.const(0.0, "float32")
    zx = c.const(float(x_zero), "float32")

    def plane(q, yy, ph, xx):
        y, xc = yy - top, xx * sw + ph - left
        v = x[0, q, c.clamp_index(y, h), c.clamp_index(xc, wd)].astype("float32") - zx
        return te.if_then_else(c.all_of([y >= 0, y < h, xc >= 0, xc < wd]), v, zero)

    xf = c.compute((ch, hp, sw, wq), plane, f"{name}_planes", c.PAD)
    taps_q = -(-kw // sw)
    ry = te.reduce_axis((0, kh), name="ry")
    rq = te.reduce_axis((0, taps_q), name="rq")
    rr = te.reduce_axis((0, sw), name="rr")

    def f(b, q, y, xx):
        kx = rq * sw + rr
        # taps past the kernel's width (when the stride does not divide it) read weight 0
        tap = te.if_then_else(kx < kw, w[q, ry, c.clamp_index(kx, kw)], zero)
        return te.sum(xf[q, y * sh + ry, rr, xx + rq] * tap, axis=[ry, rq, rr])

    conv = c.compute((1, ch, oh, ow), f, f"{name}_conv", QDEPTHWISE)
    return c.compute((1, ch, oh, ow), lambda b, q, y, xx: conv[b, q, y, xx] + bias[q], name, c.BROADCAST)

