"""The TFLite converter table for ops on float tensors: every family's ``CONVERTERS``, merged here (an op in two
families raises). Keyed by the builtin op's name ("CONV_2D"), a custom op by its custom code
("TFLite_Detection_PostProcess", MediaPipe's "Convolution2DTransposeBias"). Add a family by writing a module with
its own table and naming it below; the ops on quantized tensors have their own table (``quantized_converters``).
"""
from __future__ import annotations

from tether.frontend.tflite import (accumulate, argmax, control_flow, conv3d, detection, elementwise, indexing, matmul,
                                   mediapipe, mediapipe_transforms, nn, pointwise, recurrent, reduce, resize, segments,
                                   spatial, spectral, tensor, variables, weights)
from tether.frontend.tflite.table import ConverterTable, merge_tables

FAMILIES = (nn, elementwise, tensor, reduce, resize, weights,
            pointwise, indexing, argmax, accumulate, spatial, matmul, conv3d, detection, recurrent, segments,
            control_flow, mediapipe, mediapipe_transforms, spectral, variables)

CONVERTERS: ConverterTable = merge_tables("the TFLite converter families", [f.CONVERTERS for f in FAMILIES])

__all__ = ["CONVERTERS", "FAMILIES"]
