"""RFFT2D and the ops that read its complex output (COMPLEX_ABS, REAL, IMAG).

tether's graphs hold no complex values, so an RFFT2D is converted only where every reader of its output is one
of those three ops (and the output is not a graph output): the spectrum is then held as its real and imaginary
parts stacked on the row axis, ``(..., 2 * fft_h, fft_w / 2 + 1)``, and each reader takes its half or both.

The transform is two real DFTs as MatMuls with constant cos/sin matrices, one along the rows (real in, the
``fft_w / 2 + 1`` non-negative frequencies out) and one along the columns (complex, ``fft_h`` frequencies).
LiteRT crops the input to ``fft_length`` or pads it with zeros; both are folded into the matrices (rows of zeros
for cropped positions, none for padded ones). LiteRT's kernel takes power-of-two lengths only, and so does tether.
"""
from __future__ import annotations

from typing import Tuple

import numpy as np

from tether.errors import UnsupportedOpError
from tether.frontend.tflite.table import ConverterTable

CONVERTERS = ConverterTable("tflite spectral")

READERS = ("COMPLEX_ABS", "REAL", "IMAG")


def _dft(length: int, size: int, freqs: int) -> Tuple[np.ndarray, np.ndarray]:
    """cos and sin of ``2 pi n k / length`` as (size, freqs) for inputs n < size; zero where n >= length."""
    n = np.arange(size)[:, None]
    k = np.arange(freqs)[None, :]
    angle = 2 * np.pi * ((n * k) % length) / length
    keep = (n < length).astype(np.float64)
    return np.cos(angle) * keep, np.sin(angle) * keep


def _refuse_readers(ctx, op) -> None:
    out = op.outputs[0]
    if out in ctx.subgraph.outputs:
        raise UnsupportedOpError("%s: its complex output is a graph output (tether holds no complex values; "
                                 "expected it read by %s only)" % (ctx.where(), ", ".join(READERS)))
    for other in ctx.subgraph.operators:
        if out in other.inputs and other.op not in READERS:
            raise UnsupportedOpError("%s: its complex output is read by %s (node %d); expected %s only"
                                     % (ctx.where(), other.op, other.index, ", ".join(READERS)))


@CONVERTERS.register("RFFT2D")
def _rfft2d(ctx, op) -> None:
    x = op.inputs[0]
    if ctx.tensor(x).dtype != "float32":
        raise UnsupportedOpError("%s: a %s input (expected float32)" % (ctx.where(), ctx.tensor(x).dtype))
    fft_h, fft_w = ctx.int_list(op.inputs[1], "fft_length")
    if any(v <= 0 or v & (v - 1) for v in (fft_h, fft_w)):
        raise UnsupportedOpError("%s: fft_length %s (LiteRT's kernel takes powers of two)"
                                 % (ctx.where(), [fft_h, fft_w]))
    _refuse_readers(ctx, op)
    h, w = ctx.shape(x)[-2:]
    freqs = fft_w // 2 + 1
    cos_w, sin_w = _dft(fft_w, w, freqs)                      # (w, freqs)
    cos_h, sin_h = _dft(fft_h, h, fft_h)                      # (h, fft_h)
    value = ctx.nhwc(x)
    rows_re = ctx.emit1("MatMul", [value, ctx.add_const(cos_w.astype(np.float32), "dft_cos")])
    rows_im = ctx.emit1("MatMul", [value, ctx.add_const((-sin_w).astype(np.float32), "dft_sin")])
    rows = ctx.emit1("Concat", [rows_re, rows_im], axis=-2)  # (..., 2h, freqs): real rows, then imaginary
    # (c - i s)(a + i b) = (c a + s b) + i (c b - s a), c and s the column DFT's cos and sin
    cols = np.block([[cos_h.T, sin_h.T], [-sin_h.T, cos_h.T]]).astype(np.float32)     # (2 fft_h, 2h)
    ctx.set_output(op.outputs[0], ctx.emit1("MatMul", [ctx.add_const(cols, "dft_cols"), rows]))


def _parts(ctx, op) -> Tuple[str, str]:
    """The real and imaginary parts of the op's complex input, which must be an RFFT2D's output."""
    src = op.inputs[0]
    producer = next((o for o in ctx.subgraph.operators if src in o.outputs), None)
    if producer is None or producer.op != "RFFT2D":
        raise UnsupportedOpError("%s: a complex input from %s (tether holds complex values only between RFFT2D "
                                 "and its readers)" % (ctx.where(), producer.op if producer else "outside the graph"))
    rows = ctx.shape(src)[-2]
    held = ctx.nhwc(src)
    axes = ctx.add_const(np.array([-2], np.int64), "axes")

    def half(start: int) -> str:
        return ctx.emit1("Slice", [held, ctx.add_const(np.array([start], np.int64), "starts"),
                                   ctx.add_const(np.array([start + rows], np.int64), "ends"), axes])

    return half(0), half(rows)


@CONVERTERS.register("REAL", "IMAG")
def _real_imag(ctx, op) -> None:
    re, im = _parts(ctx, op)
    ctx.set_output(op.outputs[0], re if op.op == "REAL" else im)


@CONVERTERS.register("COMPLEX_ABS")
def _complex_abs(ctx, op) -> None:
    re, im = _parts(ctx, op)
    squares = ctx.emit1("Add", [ctx.emit1("Mul", [re, re]), ctx.emit1("Mul", [im, im])])
    ctx.set_output(op.outputs[0], ctx.emit1("Sqrt", [squares]))
