"""Core ML frontend: an ``.mlmodel`` (NeuralNetwork, classifier, regressor) or ``.mlpackage`` (ML Program) read
with the protobuf messages coremltools ships and translated to an ONNX graph, which :func:`from_onnx` imports.

``from_coreml(path, shape=None) -> (graph, params)``; ``to_onnx(path)`` gives the ONNX ModelProto;
``read_coreml`` and ``op_coverage`` are the reader and ``--check`` table of :mod:`tether.frontend.readers`.
"""
from __future__ import annotations

from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from tether.frontend.coreml.model import op_coverage, to_onnx


def read_coreml(path: str, shape: Optional[Mapping[str, Sequence[int]]] = None):
    """The model at ``path`` as an ONNX ModelProto (the reader of the "CoreML" and "CoreML package" formats);
    ``shape`` fixes flexible input shapes."""
    return to_onnx(path, shape=shape)


def from_coreml(model, shape: Optional[Mapping[str, Sequence[int]]] = None) -> Tuple[object, Dict[str, np.ndarray]]:
    """Import a Core ML model (``.mlmodel`` path, ``.mlpackage`` folder, or a ``Model_pb2.Model``) as
    (graph, params); ``shape`` fixes input shapes, as in :func:`tether.frontend.from_onnx`."""
    from tether.frontend.onnx import from_onnx

    return from_onnx(to_onnx(model, shape=shape), shape=shape)


__all__: List[str] = ["from_coreml", "to_onnx", "read_coreml", "op_coverage"]
