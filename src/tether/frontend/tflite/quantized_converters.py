"""The TFLite converter table for ops on quantized tensors (int8/uint8/int16 with scale and zero point); an op
on quantized tensors with no entry here is reported unsupported.

Besides the quantized families' own converters, it holds, for each float op that ``quantized.QDQ_OPS`` lists, the
float converter between dequantized inputs and quantized outputs (``quantized.float_wrappers``). Keyed as the
float table (``converters``) is.
"""
from __future__ import annotations

from tether.frontend.tflite import quantized, quantized_arith, quantized_products
from tether.frontend.tflite.converters import CONVERTERS
from tether.frontend.tflite.table import ConverterTable, merge_tables

QUANTIZED_FAMILIES: tuple = (quantized, quantized_arith, quantized_products)

_QUANTIZED_OWN = merge_tables("the TFLite quantized converter families", [f.QUANTIZED for f in QUANTIZED_FAMILIES])
QUANTIZED: ConverterTable = merge_tables("the TFLite quantized converters",
                                         [_QUANTIZED_OWN, quantized.float_wrappers(CONVERTERS, _QUANTIZED_OWN)])

__all__ = ["QUANTIZED", "QUANTIZED_FAMILIES"]
