"""The int8 convolution on the dot-product primitive: ``qconv2d`` and its build-time weight packing.

One image, NCHW activations of 8-bit integers (uint8 or int8), int8 weights, an int32 accumulator per output
channel and pixel: ``acc[o, p] = bias[o] + sum_k X[p, k] * W[o, k]`` over k = (ky, kx, c), the window's taps
with the input channel innermost, where X reads the input and ``pad_value`` outside it (the activation's zero
point, so padding contributes nothing once the bias carries ``-zx * sum_k W[o, k]``).

Layouts (``te.dot4`` multiplies four bytes held in one int32 word):
- weights, packed once at build time (``pack_weights``): ``(ceil(O / PANEL), KH * KW * C4, PANEL)`` int32, word
  ``[o // PANEL, (ky * KW + kx) * C4 + c4, o % PANEL]`` holding the weights of input channels 4*c4 .. 4*c4+3 of
  output channel o (C4 = ceil(C / 4); missing channels and output channels are zero): the fp32 conv panels'
  layout (ops.linear.pack_panels_array) with four k steps per word;
- activations, packed per run by the kernel's first stage: ``(H + pads, W + pads, C4)`` int32, channels last,
  four channels per word, the padding filled with ``pad_value``. O(input bytes): about 1/O of the conv's work;
- the product: the implicit GEMM of ops.conv2d_pixels (its block of output pixels by one PANEL-wide vector of
  output channels, the reduction outermost inside the block; ops/qschedules.py), with ``acc + dot4(x, w)``
  as the multiply-add: one vpdpbusd / sdot per word on targets that have it (codegen/int8dot.py);
- the output ``(O, OH * OW)`` int32, the bias added in the write-back, where the graph fuses the requantize.

The widened form, for cores without a dot product (Arm NEON without sdot): the same activation words, but the
weights as 16-bit integers, ``(ceil(O / PANEL), KH * KW * C4 * 4, PANEL)`` int16 (``widen_weights``: row
``4 * k4 + t`` holds byte t of every word of row k4), and the multiply-add ``acc + int32(byte_of(x, t)) *
int32(w16)`` over t in 0..3: Arm's smlal by element, four products per instruction with both operands widened
once (the dot4 fallback widens and adds pairwise per product: about 2.1 products per instruction against 3.2).
The bytes are read as ``kind``'s activation type says (``for_target`` flips none: a flip's xor on the word kept it in
a general register, 7 instructions a word where a load and a widening are 2).

The pairs form, for pointwise convs (1x1, stride 1, unpadded) on channels-last pixels or one pixel (a dense row) on
the same cores, when every weight is within [-127, 127]: 16 input channels at a time, the activation bytes (int8,
uint8 flipped) staged as int16 pairs (``(pixels, C16 * 8)``), the weights as ``(ceil(O / 8), C16, 8, 8)`` int16
pairs (``pair_weights``: [o // 8, c16, o % 8, j] holds bytes 2j, 2j + 1 of output channel o's 16 weights of chunk
c16). The product keeps four int32 lanes per output and pixel, ``te.pair_dot`` of 16 bytes per step (smull,
smlal2, sadalp: 5.3 products per instruction against the widened form's 3.2, where 2 * 128 * 127 still fits the
int16 sums); the write-back adds the four lanes. Arm's A72 has no dot product, and this is how XNNPACK's int8
kernels for it multiply too.

``kind`` is the dot4 kind the kernel multiplies with. With ``flip`` the activation bytes are xor-ed with 0x80
(uint8 -> int8 for Arm's sdot, int8 -> uint8 for x86's vpdpbusd); the caller's bias then carries the matching
``-+128 * sum_k W[o, k]`` (``flip_correction``).
"""
from __future__ import annotations

import numpy as np

from tether import te

from . import common as c
from .conv import output_geometry

PANEL = 16
NARROW_PANEL = 8    # the widened form's panel for up to 8 output channels (widen_weights)
# the matmul form computes its pixels in multiples of this (the widest vector, AVX-512's 16 int32 lanes): a partial
# vector of pixels would run as scalar code
POINTWISE_PIXEL_MULTIPLE = 16
# ... and pads them to a multiple of this (two vectors): the schedule's register block then takes two or four pixel
# vectors, each reduction step loading about one operand per two dot products, where a pixel count of an odd
# number of vectors (14x14 = 13 vectors padded, 28x28 = 49) allowed only one (one broadcast weight per product)
POINTWISE_PIXEL_PAD = 32
QCONV_PIXELS = "qconv_pixels"   # the tag of the pixel form's product (its schedule: ops/qschedules.py)
QMATMUL = "qmatmul"     # the tag of the matmul form's product (its schedule: ops/qschedules.py)
QPAIRS = "qpairs"       # the tag of the pairs form's product (its schedule: ops/qschedules.py)
PAIR_BLOCK = 8          # the pairs form's output channels per weight block
PAIR_CHUNK = 16         # ... and input channels per step
# the matmul form's register block: this many accumulators (vectors of pixels x output channels, whose weight
# words are broadcast), the pixels at most QMATMUL_COL_VECTORS vectors wide
QMATMUL_ACCUMULATORS = 16
QMATMUL_COL_VECTORS = 4
_FLIP = -0x7F7F7F80     # 0x80808080 as an int32
_BYTE_SIGNED = {"int8": True, "uint8": False}


def default_kind(x_dtype: str) -> str:
    """The dot4 kind that reads the activation bytes as they are (no flip)."""
    return "u8s8" if x_dtype == "uint8" else "s8s8"


def flip_correction(x_dtype: str, kind: str) -> int:
    """The multiple of ``sum_k W[o, k]`` to add to the bias when the kernel runs ``kind`` on ``x_dtype`` bytes
    flipped by 0x80 (0: no flip needed)."""
    if kind[:2] == ("u8" if x_dtype == "uint8" else "s8"):
        return 0
    # uint8 a -> a - 128 (s8s8): the products lose 128 * sum(w); int8 a -> a + 128 (u8s8): they gain it
    return 128 if x_dtype == "uint8" else -128


def pack_weights(w: np.ndarray, panel: int = PANEL) -> np.ndarray:
    """numpy: int8-valued weights (O, C, KH, KW) -> the kernel's (ceil(O/panel), KH*KW*C4, panel) int32 words."""
    o, ch, kh, kw = w.shape
    if w.min(initial=0) < -128 or w.max(initial=0) > 127:
        raise ValueError("qconv2d weights must be int8 values, got the range [%d, %d]" % (w.min(), w.max()))
    c4 = -(-ch // 4)
    opad = -(-o // panel) * panel
    taps = np.zeros((opad, kh, kw, c4 * 4), np.int8)
    taps[:o, :, :, :ch] = np.transpose(w, (0, 2, 3, 1))
    words = np.ascontiguousarray(taps).view(np.int32).reshape(opad // panel, panel, kh * kw * c4)
    return np.ascontiguousarray(words.transpose(0, 2, 1))


def widen_weights(wp: np.ndarray, out_channels: int) -> np.ndarray:
    """numpy: pack_weights' (P, K4, panel) int32 words -> the widened form's (P, K4 * 4, panel) int16. Up to 8
    output channels take one 8-wide panel: a stem conv into 8 channels multiplied half a 16-wide panel of zeros."""
    p, k4, pw = wp.shape
    b = np.ascontiguousarray(wp).view(np.int8).reshape(p, k4, pw, 4)
    wide = b.transpose(0, 1, 3, 2).reshape(p, k4 * 4, pw).astype(np.int16)
    if p == 1 and out_channels <= NARROW_PANEL < pw:
        wide = wide[:, :, :NARROW_PANEL]
    return np.ascontiguousarray(wide)


def pair_weights(w: np.ndarray) -> np.ndarray:
    """numpy: int8-valued pointwise weights (O, C, 1, 1) within [-127, 127] -> the pairs form's (ceil(O/8), C16,
    8, 8) int16 (the module doc)."""
    o, ch = w.shape[:2]
    if w.shape[2:] != (1, 1) or w.min(initial=0) < -127 or w.max(initial=0) > 127:
        raise ValueError("the pairs form takes 1x1 weights within [-127, 127], got %s in [%d, %d]"
                         % (w.shape, w.min(), w.max()))
    c16 = -(-ch // PAIR_CHUNK)
    opad = -(-o // PAIR_BLOCK) * PAIR_BLOCK
    rows = np.zeros((opad, c16 * PAIR_CHUNK), np.int8)
    rows[:o, :ch] = w.reshape(o, ch)
    pairs = rows.view(np.int16).reshape(opad // PAIR_BLOCK, PAIR_BLOCK, c16, PAIR_CHUNK // 2)
    return np.ascontiguousarray(pairs.transpose(0, 2, 1, 3))


def pack_rows(w: np.ndarray) -> np.ndarray:
    """numpy: int8-valued pointwise weights (O, C, 1, 1) -> the matmul form's (O, C4) int32 words."""
    return pack_weights(w, panel=1)[:, :, 0].reshape(w.shape[0], -1)


def _weight_rows(wp: np.ndarray) -> np.ndarray:
    """Packed weights (any form) as (rows, k) int64 weights in output-channel order, k = (ky, kx, c) with the
    channels padded to a multiple of 4."""
    if wp.ndim == 4:    # pair_weights: (O8, C16, 8, 8)
        rows = np.ascontiguousarray(wp.transpose(0, 2, 1, 3)).reshape(wp.shape[0] * wp.shape[2], -1)
        return rows.view(np.int8).astype(np.int64)
    if wp.dtype == np.int16:    # widen_weights: (P, K4 * 4, panel)
        return wp.transpose(0, 2, 1).reshape(-1, wp.shape[1]).astype(np.int64)
    rows = wp if wp.ndim == 2 else np.ascontiguousarray(wp.transpose(0, 2, 1)).reshape(-1, wp.shape[1])
    return np.ascontiguousarray(rows).view(np.int8).reshape(rows.shape[0], -1).astype(np.int64)


def unpack_weights(wp: np.ndarray, out_channels: int, in_channels: int, kernel: tuple) -> np.ndarray:
    """numpy: pack_weights / pack_rows / widen_weights undone, as int32 (O, C, KH, KW)."""
    kh, kw = kernel
    rows = _weight_rows(wp)
    taps = rows.reshape(rows.shape[0], kh, kw, -1)
    return np.transpose(taps[:out_channels, :, :, :in_channels], (0, 3, 1, 2)).astype(np.int32)


def weight_sums(wp: np.ndarray, out_channels: int) -> np.ndarray:
    """numpy: sum_k W[o, k] of packed weights, as int64 (out_channels,)."""
    return _weight_rows(wp).sum(axis=1)[:out_channels]


def qconv2d(x, wp, bias, kernel: tuple, stride, padding, dilation, out_channels: int, pad_value: int,
            kind: str = "", flip: bool = False, name: str = "qconv2d", channels_last_in: bool = False,
            channels_last_out: bool = False, bias_start: bool = False):
    """x (1, C, H, W) uint8/int8, wp packed (pack_weights, or pack_rows for a pointwise conv: the matmul form),
    bias (O,) int32 (or padded to the panels: with ``bias_start`` the pixel form's sums start at it) -> (O, OH*OW)
    int32 (module doc). The matmul form takes x as (C, H*W).
    The pixel form also reads x channels last, (1, H, W, C), with ``channels_last_in`` and writes (OH*OW, O) with
    ``channels_last_out`` (graph/passes/int8_layout.py: int8 activations kept channels last between kernels)."""
    if len(c.shape_of(wp)) == 4:
        return _pairs(x, wp, bias, out_channels, flip, name, channels_last_in, channels_last_out)
    if len(c.shape_of(wp)) == 2:
        if channels_last_in or channels_last_out:
            raise ValueError("%s: the pointwise matmul form reads and writes channels first only" % name)
        return _pointwise(x, wp, bias, kind, flip, name)
    if channels_last_in:
        n, h, wd, ch = c.shape_of(x)
    else:
        n, ch, h, wd = c.shape_of(x)
    kh, kw = kernel
    c4 = -(-ch // 4)
    npanel, k4, pw = (int(d) for d in c.shape_of(wp))
    widened = str(wp.dtype) == "int16"
    if n != 1 or k4 != kh * kw * c4 * (4 if widened else 1) or not 0 < out_channels <= npanel * pw:
        raise ValueError("%s: input %s and packed weight %s do not fit a %dx%d kernel with %d output channels"
                         % (name, c.shape_of(x), c.shape_of(wp), kh, kw, out_channels))
    x_dtype = str(x.dtype)
    if x_dtype not in _BYTE_SIGNED:
        raise ValueError("%s: activations must be uint8 or int8, got %s" % (name, x_dtype))
    kind = kind or default_kind(x_dtype)
    sh, sw, dh, dw, p4, oh, ow = output_geometry(h, wd, kh, kw, stride, padding, dilation, name)
    top, left, bottom, right = p4
    pad_byte = c.const(int(pad_value) & 255, "int32")

    def word(yy, xx, q):
        y, xc = yy - top, xx - left
        inside = c.all_of([y >= 0, y < h, xc >= 0, xc < wd]) if any(p4) else None
        out = None
        for t in range(4):
            ci = q * 4 + t
            v = _byte(x, 0, c.clamp_index(ci, ch) if ch % 4 else ci, c.clamp_index(y, h) if any(p4) else y,
                      c.clamp_index(xc, wd) if any(p4) else xc)
            cond = inside if ch % 4 == 0 or t == 0 else (ci < ch if inside is None else te.all(inside, ci < ch))
            if cond is not None:
                v = te.if_then_else(cond, v, pad_byte)
            v = te.bitwise("shl", v, c.const(8 * t, "int32")) if t else v
            out = v if out is None else te.bitwise("bitor", out, v)
        return te.bitwise("bitxor", out, c.const(_FLIP, "int32")) if flip else out

    if channels_last_in:
        xq = _channels_last_words(x, p4, int(pad_value), flip, name)
    else:
        xq = c.compute((h + top + bottom, wd + left + right, c4), word, f"{name}_words", c.PAD)
    ry = te.reduce_axis((0, kh), name="ry")
    rx = te.reduce_axis((0, kw), name="rx")
    rc = te.reduce_axis((0, c4), name="rc")

    # the bytes of a word that hold channels: all four, but the first ch of one word (a stem's 3 channels: the
    # fourth byte would multiply the padding's zero weights)
    rt = te.reduce_axis((0, min(4, ch)), name="rt")

    # with bias_start, a bias of the panels' width starts the accumulators, where the write-back added it to every
    # output vector (CPU kernels: the GPU lowering takes constant reduction inits only)
    in_block = bias_start and int(c.shape_of(bias)[0]) == npanel * pw

    def f(p, o):
        y, xx = p // ow, p % ow
        k = (ry * kw + rx) * c4 + rc
        xw = xq(y * sh + ry * dh, xx * sw + rx * dw, rc) if channels_last_in \
            else xq[y * sh + ry * dh, xx * sw + rx * dw, rc]
        init = bias[o] if in_block else None
        if widened:
            return te.sum(te.byte_of(xw, rt, kind[:2] == "s8") * wp[o // pw, k * 4 + rt, o % pw].astype("int32"),
                          axis=[ry, rx, rc, rt], init=init)
        return te.sum(te.dot4(xw, wp[o // pw, k, o % pw], kind), axis=[ry, rx, rc], init=init)

    attrs = {"panel": pw, "widened": int(widened)}
    if channels_last_out:
        attrs["channels_last_out"] = 1
    conv = c.compute((oh * ow, npanel * pw), f, f"{name}_nc", QCONV_PIXELS, attrs=attrs)

    def out(p, o):
        return conv[p, o] if in_block else conv[p, o] + bias[o]

    if channels_last_out:
        return c.compute((oh * ow, out_channels), out, name, c.INJECTIVE)
    return c.compute((out_channels, oh * ow), lambda o, p: out(p, o), name, c.INJECTIVE)


def _channels_last_words(x, p4, pad_value: int, flip: bool, name: str):
    """``word(y, x, q)`` of channels-last 8-bit activations (1, H, W, C): the four bytes of channels 4q..4q+3 at
    (y, x) of the padded image, read in the product's loop (adjacent byte loads that LLVM combines into one 32-bit
    load, so nothing is repacked). Only a padded image or a channel count that is not a multiple of 4 needs a
    stage first: a byte copy of the image with the pad rows, columns and channels filled with ``pad_value``."""
    _, h, wd, ch = c.shape_of(x)
    top, left, bottom, right = p4
    c4 = -(-ch // 4)
    src = x
    if any(p4) or ch % 4:
        pad = c.const(pad_value, str(x.dtype))

        def padded(yy, xx, ci):
            # the channel clamp only where channels are missing: along the vector a clamped index is a gather
            y, xc = yy - top, xx - left
            v = x[0, c.clamp_index(y, h), c.clamp_index(xc, wd), c.clamp_index(ci, ch) if ch % 4 else ci]
            inside = [y >= 0, y < h, xc >= 0, xc < wd] + ([ci < ch] if ch % 4 else [])
            return te.if_then_else(c.all_of(inside), v, pad)

        padded_t = c.compute((h + top + bottom, wd + left + right, c4 * 4), padded, f"{name}_padded", c.PAD)

        def read(yy, xx, ci):
            return padded_t[yy, xx, ci]
    else:
        def read(yy, xx, ci):
            return src[0, yy, xx, ci]

    def word(yy, xx, q):
        out = None
        for t in range(4):
            v = _unsigned_int32(read(yy, xx, q * 4 + t))
            v = te.bitwise("shl", v, c.const(8 * t, "int32")) if t else v
            out = v if out is None else te.bitwise("bitor", out, v)
        return te.bitwise("bitxor", out, c.const(_FLIP, "int32")) if flip else out

    return word


def _byte(x, *index):
    """The activation byte at index as an int32 in 0..255."""
    return _unsigned_int32(x[index])


def _unsigned_int32(v):
    """An 8-bit value's byte as an int32 in 0..255. An int8 is reinterpreted as uint8 and zero-extended: LLVM
    combines four such byte loads shifted into a word into one 32-bit load, where sign extension and a mask left
    them four loads (MobileNetV2's int8 TFLite convs on the A72)."""
    return (v.astype("uint8") if str(v.dtype) == "int8" else v).astype("int32")


def _pointwise(x, wq, bias, kind: str, flip: bool, name: str):
    """A 1x1, stride 1, unpadded conv as the matmul (O, C4) x (C4, H*W) with the pixels as the vector axis: the
    activations pack planar (four channel rows into one row of words, vectorized) and the (O, pixels) result is
    written contiguously, so the requantize epilogue runs on whole vectors; weights (pack_rows) are broadcast."""
    ch, npix = c.shape_of(x)
    oc, c4 = (int(d) for d in c.shape_of(wq))
    if c4 != -(-ch // 4):
        raise ValueError("%s: packed pointwise weight %s does not fit %d input channels" % (name, c.shape_of(wq), ch))
    kind = kind or default_kind(str(x.dtype))

    # a pixel count that whole vectors do not cover is padded up to one they do (the padded words are never read
    # into a kept output): each register block of the product runs in full vectors, and the write-back (with the
    # fused requantize, inside the block's tile) stops at npix. The product is no separate buffer: a 576 x 224
    # int32 one written and read again cost as much as its dot products at 96 -> 576 @14x14 (72 -> 57 us)
    ppad = -(-npix // POINTWISE_PIXEL_PAD) * POINTWISE_PIXEL_PAD

    def word(q, p):
        out = None
        for t in range(4):
            ci = q * 4 + t
            # p unclamped: the padded pixels' loads sit under the if_then_else below, which the codegen evaluates
            # lazily (masked vector loads), where a clamped index would make every vector a byte gather
            v = _byte(x, c.clamp_index(ci, ch) if ch % 4 else ci, p)
            if ch % 4 and t:
                v = te.if_then_else(ci < ch, v, c.const(0, "int32"))
            v = te.bitwise("shl", v, c.const(8 * t, "int32")) if t else v
            out = v if out is None else te.bitwise("bitor", out, v)
        out = te.bitwise("bitxor", out, c.const(_FLIP, "int32")) if flip else out
        return te.if_then_else(p < npix, out, c.const(0, "int32")) if ppad > npix else out

    xq = c.compute((c4, ppad), word, f"{name}_words", c.PAD)
    r = te.reduce_axis((0, c4), name="rc")
    mm = c.compute((oc, ppad), lambda o, p: te.sum(te.dot4(xq[r, p], wq[o, r], kind), axis=r), f"{name}_mm",
                   QMATMUL)
    return c.compute((oc, npix), lambda o, p: mm[o, p] + bias[o], name, c.BROADCAST)



def _pairs(x, wp, bias, out_channels: int, flip: bool, name: str, channels_last_in: bool, channels_last_out: bool):
    """The pairs form (module doc): a pointwise conv of channels-last pixels (1, H, W, C), or of one pixel (1, C,
    1, 1), with pair_weights."""
    if channels_last_in:
        _, h, wd, ch = c.shape_of(x)
    else:
        _, ch, h, wd = c.shape_of(x)
    npix = h * wd
    nb, c16, blk, half2 = (int(d) for d in c.shape_of(wp))
    if (not channels_last_in and npix != 1) or c16 != -(-ch // PAIR_CHUNK) or blk != PAIR_BLOCK or \
            half2 != PAIR_CHUNK // 2 or not 0 < out_channels <= nb * blk:
        raise ValueError("%s: input %s and pair weights %s do not fit a pointwise conv with %d output channels"
                         % (name, c.shape_of(x), c.shape_of(wp), out_channels))

    def byte(p, ci):
        if ch % PAIR_CHUNK:
            ci = c.clamp_index(ci, ch)
        v = _unsigned_int32(x[0, p // wd, p % wd, ci] if channels_last_in else x[0, ci, 0, 0])
        return v

    def pair(p, j):
        lo, hi = byte(p, 2 * j), byte(p, 2 * j + 1)
        if ch % PAIR_CHUNK:     # channels past C: zeros (their weights are zero too)
            zero = c.const(0, "int32")
            lo = te.if_then_else(2 * j < ch, lo, zero)
            hi = te.if_then_else(2 * j + 1 < ch, hi, zero)
        v = te.bitwise("bitor", lo, te.bitwise("shl", hi, c.const(8, "int32")))
        if flip:
            v = te.bitwise("bitxor", v, c.const(0x8080, "int32"))
        return v.astype("int16")

    half = PAIR_CHUNK // 4      # int16 lanes per half chunk: the four int32 lanes of the product
    xp = c.compute((npix, c16 * 2 * half), pair, f"{name}_pairs", c.PAD)
    r = te.reduce_axis((0, c16), name="rc")

    # the product's columns are (output channel, lane): o * 4 + lane, so that the write-back (rank 2, like every
    # epilogue) can anchor it
    def f(p, q):
        o, lane = q // half, q % half
        ob, oi = o // blk, o % blk
        return te.sum(te.pair_dot(xp[p, r * 2 * half + lane], xp[p, r * 2 * half + half + lane],
                                  wp[ob, r, oi, lane], wp[ob, r, oi, half + lane]), axis=r)

    acc = c.compute((npix, nb * blk * half), f, f"{name}_nc", QPAIRS,
                    attrs={"channels_last_out": 1} if channels_last_out else None)

    def total(p, o):
        return te.quad_sum(*(acc[p, o * half + j] for j in range(half))) + bias[o]

    if channels_last_out:
        return c.compute((npix, out_channels), total, name, c.INJECTIVE)
    return c.compute((out_channels, npix), lambda o, p: total(p, o), name, c.INJECTIVE)
