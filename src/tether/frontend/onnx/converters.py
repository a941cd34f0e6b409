"""The converter table: every converter family's table (each module's ``CONVERTERS``), merged in the order below.

This is the one place that lists the families: a new one is a module with its own ``ConverterTable``, added to
``FAMILIES``. The merge refuses an op two families convert (``merge_tables``), so the order decides nothing but
where an error would be reported: an op has exactly one converter. Ops whose values may be sequences or optionals
are no exception: ``Identity`` (elementwise.py) passes them through itself, ``If``/``Loop`` (control_flow.py) by
name, and the sequence ops are sequence.py's (``importer.SEQUENCE_OPS``).
"""
from __future__ import annotations

from tether.frontend.onnx import (
                                  along_axis,
                                  attention,
                                  bitcast,
                                  contrib_activations,
                                  control_flow,
                                  detection,
                                  dynamic,
                                  einsum,
                                  elementwise,
                                  indexing,
                                  indexmap,
                                  linear_attention,
                                  lppool,
                                  nn,
                                  norm,
                                  qoperator_contrib,
                                  quantized,
                                  quantized_contrib,
                                  quantized_lstm,
                                  recurrent,
                                  reduce,
                                  resize,
                                  rotary,
                                  sampling,
                                  sequence,
                                  signal,
                                  tensor,
                                  trig,
)
from tether.frontend.onnx.importer import ConverterTable, merge_tables

FAMILIES = (
    elementwise, tensor, nn, reduce, norm, resize, indexing,     # the CNN/MLP core
    control_flow, recurrent,                                      # If/Loop/Scan, LSTM/GRU/RNN
    quantized, quantized_contrib, qoperator_contrib, quantized_lstm, contrib_activations,    # int8 models
    attention, einsum, linear_attention, rotary,                  # transformers
    along_axis, bitcast, dynamic, indexmap, lppool, sampling, signal, trig,    # indexing, math, signal, run-time shapes
    sequence,                                                     # sequences and optionals
    detection,                                                    # tether's own domain: SSD post-processing
)

CONVERTERS: ConverterTable = merge_tables("the ONNX converter families", [f.CONVERTERS for f in FAMILIES])

__all__ = ["CONVERTERS", "FAMILIES"]
