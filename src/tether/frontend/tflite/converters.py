"""The TFLite converter tables: every family's ``CONVERTERS``, merged here (an op in two families raises).

``CONVERTERS`` converts ops on float tensors. ``QUANTIZED`` converts ops whose tensors carry integer
quantization (int8/uint8/int16 with scale and zero point); an op on quantized tensors with no entry there is
reported unsupported; besides the quantized families' own converters it holds, for each float op that
``quantized.QDQ_OPS`` lists, the float converter between dequantized inputs and quantized outputs
(``quantized.float_wrappers``). Both are keyed by the builtin op's name ("CONV_2D"), a custom op by its custom
code ("TFLite_Detection_PostProcess"). Add a family by writing a module with its own table and naming it below.
"""
from __future__ import annotations

from tether.frontend.tflite import (accumulate, argmax, control_flow, conv3d, detection, elementwise, indexing, matmul,
                                   nn, pointwise, quantized, quantized_arith, quantized_products, recurrent, reduce,
                                   resize, segments, spatial, tensor, weights)
from tether.frontend.tflite.table import ConverterTable, merge_tables

FAMILIES = (nn, elementwise, tensor, reduce, resize, weights,
            pointwise, indexing, argmax, accumulate, spatial, matmul, conv3d, detection, recurrent, segments,
            control_flow)
QUANTIZED_FAMILIES: tuple = (quantized, quantized_arith, quantized_products)

CONVERTERS: ConverterTable = merge_tables("the TFLite converter families", [f.CONVERTERS for f in FAMILIES])
_QUANTIZED_OWN = merge_tables("the TFLite quantized converter families", [f.QUANTIZED for f in QUANTIZED_FAMILIES])
QUANTIZED: ConverterTable = merge_tables("the TFLite quantized converters",
                                         [_QUANTIZED_OWN, quantized.float_wrappers(CONVERTERS, _QUANTIZED_OWN)])

__all__ = ["CONVERTERS", "FAMILIES", "QUANTIZED", "QUANTIZED_FAMILIES"]
