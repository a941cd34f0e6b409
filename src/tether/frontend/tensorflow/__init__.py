"""The TensorFlow frontend: a frozen GraphDef (.pb) or a SavedModel folder, read without TensorFlow, as an ONNX
ModelProto that :func:`tether.frontend.from_onnx` imports.

    to_onnx(path_or_bytes, shape=None, outputs=None) -> onnx.ModelProto
    from_tensorflow(path_or_bytes, shape=None, outputs=None) -> (graph, params)

Modules: ``protos`` (TensorFlow's messages, described at run time), ``tensors`` (TensorProto values),
``bundle`` (the checkpoint of a SavedModel), ``graph`` (function inlining, pruning, order), ``loader`` (files
to a flat graph), ``translate`` (values and layouts), ``ops_*`` (the op converters, tabled in ``ops``),
``loops`` (While and If run through their functions, TensorLists), ``model`` (the ONNX model and the coverage
table).
"""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from tether.frontend.tensorflow import loader, model


def to_onnx(source: Any, shape: Optional[Mapping[str, Sequence[int]]] = None,
            outputs: Optional[Sequence[str]] = None) -> Any:
    """A GraphDef (file or bytes) or SavedModel folder as an ONNX ModelProto. ``shape`` fixes input shapes by
    input name; ``outputs`` names the tensors to compute ("node" or "node:k"; default: the serving signature's
    outputs, or the GraphDef's nodes nothing reads)."""
    return model.translate(loader.load(source, outputs), shape)


def from_tensorflow(source: Any, shape: Optional[Mapping[str, Sequence[int]]] = None,
                    outputs: Optional[Sequence[str]] = None) -> Tuple[Any, Dict[str, Any]]:
    from tether.frontend.onnx import from_onnx

    return from_onnx(to_onnx(source, shape=shape, outputs=outputs), shape=None)


def read_graphdef(path: str, shape: Optional[Mapping[str, Sequence[int]]] = None) -> Any:
    return to_onnx(path, shape=shape)


def read_saved_model(path: str, shape: Optional[Mapping[str, Sequence[int]]] = None) -> Any:
    return to_onnx(path, shape=shape)


def coverage(path: str) -> List[Dict[str, Any]]:
    return model.coverage(loader.load(path))
