"""Converters of the ONNX trigonometric ops: Sin, Cos, Tan, Asin, Acos, Atan (codegen/mathlib.py computes them
without libm, float32 through double)."""
from __future__ import annotations

from tether.frontend.onnx.importer import FLOATS, ConverterTable, node_output, require_dtype

CONVERTERS = ConverterTable(__name__)

_TRIG = {"Sin": "sin", "Cos": "cos", "Tan": "tan", "Asin": "asin", "Acos": "acos", "Atan": "atan"}


@CONVERTERS.register(*_TRIG)
def _trig(im, node, ins, a):
    require_dtype(im, node, ins[0], FLOATS)
    im.emit(_TRIG[node.op_type], ins[:1], {}, node.name, node_output(node))
