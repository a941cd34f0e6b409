"""RESIZE_BILINEAR and RESIZE_NEAREST_NEIGHBOR, NCHW, with LiteRT's coordinate rules mapped onto ONNX Resize.

LiteRT, per output coordinate ``x`` (``scale`` = in/out, or (in-1)/(out-1) with align_corners):
- bilinear: source ``x * scale``, or ``(x + 0.5) * scale - 0.5`` with half_pixel_centers, clamped to the input:
  ONNX's ``asymmetric`` / ``align_corners`` / ``half_pixel`` modes;
- nearest: ``floor(x * scale)`` (ONNX ``asymmetric``, ``floor``); with half_pixel_centers
  ``floor((x + 0.5) * scale)``, which is ONNX ``half_pixel`` rounded halves up (``round_prefer_ceil``); with
  align_corners ``round(x * scale)``, halves away from zero: ONNX ``align_corners``, ``round_prefer_ceil``.
  All clamp to the input.
TensorFlow refuses align_corners together with half_pixel_centers, and so does this converter.
"""
from __future__ import annotations

import numpy as np

from tether.errors import UnsupportedOpError
from tether.frontend.tflite.state import NCHW
from tether.frontend.tflite.table import ConverterTable

CONVERTERS = ConverterTable("tflite resize")


def _resize(ctx, op, mode: str) -> None:
    align, half = bool(op.options.get("align_corners")), bool(op.options.get("half_pixel_centers"))
    if align and half:
        raise UnsupportedOpError("%s: align_corners and half_pixel_centers together are not defined"
                                 % ctx.where())
    x = ctx.nchw(op.inputs[0])
    # the new (height, width) on ONNX axes 2 and 3 only: the batch and channels stay whatever they are
    size = ctx.const(op.inputs[1])
    if size is not None:
        sizes = ctx.add_const(np.asarray(size, np.int64).reshape(-1), "sizes")
    else:
        sizes = ctx.emit1("Cast", [ctx.nhwc(op.inputs[1])], to=7)
    attrs = {"axes": [2, 3]}
    if mode == "linear":
        attrs["coordinate_transformation_mode"] = "align_corners" if align else "half_pixel" if half \
            else "asymmetric"
    else:
        # floor((x + 0.5) * scale) is half_pixel's source (x + 0.5) * scale - 0.5, rounded halves up
        attrs["coordinate_transformation_mode"] = "align_corners" if align else "half_pixel" if half \
            else "asymmetric"
        attrs["nearest_mode"] = "round_prefer_ceil" if align or half else "floor"
    y = ctx.emit1("Resize", [x, "", "", sizes], mode=mode, **attrs)
    ctx.set_output(op.outputs[0], y, NCHW)


CONVERTERS.add("RESIZE_BILINEAR", lambda ctx, op: _resize(ctx, op, "linear"))
CONVERTERS.add("RESIZE_NEAREST_NEIGHBOR", lambda ctx, op: _resize(ctx, op, "nearest"))
