"""Keras models (the Keras 3 ``.keras`` zip and the legacy HDF5 ``.h5``), read without Keras or TensorFlow and
translated layer by layer into an ONNX graph, which ``from_onnx`` imports.

``archive`` reads the file (config, version, weights), ``weights`` finds each layer's variables, ``builder``
holds the ONNX graph and each value's layout (channels-first inside, Keras order at the edges), ``model``
walks the config, and one module per layer family converts layers: ``core``, ``conv``, ``norm``,
``recurrent``, ``attention``, ``wrappers``, ``operations`` (keras.ops calls saved in a functional model), with
the activation functions in ``activations``. Each family fills its own ``LayerTable``; ``model`` merges them
and refuses a class converted twice.
"""
from __future__ import annotations

import os
import tempfile
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

# the translation needs onnx (and h5py for the weights): imported on first use, so importing tether.frontend
# needs neither


def read_keras(path: str, shape: Optional[Mapping[str, Sequence[int]]] = None):
    """The Keras model file at ``path`` as an ONNX ModelProto (readers.py's reader)."""
    from tether.frontend.keras import archive, model

    return model.to_onnx(archive.read(path))


def keras_coverage(path: str) -> List[Dict[str, Any]]:
    """The layer classes of the Keras model at ``path``, each with whether tether converts it."""
    from tether.frontend.keras import archive, model

    return model.coverage(archive.read(path))


def from_keras(model_or_path: Any, shape: Optional[Mapping[str, Sequence[int]]] = None) -> Tuple[Any, Dict]:
    """Import a Keras model file (``.keras`` or ``.h5``), or an in-memory Keras model (saved to a temporary
    ``.keras`` file by its own ``save``), as (graph, params); ``shape`` fixes input shapes by input layer name
    (an unknown batch size is 1 otherwise)."""
    from tether.frontend.onnx import from_onnx

    if not isinstance(model_or_path, (str, bytes, os.PathLike)) and hasattr(model_or_path, "save"):
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "model.keras")
            model_or_path.save(path)
            return from_onnx(read_keras(path), shape=shape)
    return from_onnx(read_keras(os.fsdecode(model_or_path)), shape=shape)


__all__ = ["from_keras", "keras_coverage", "read_keras"]
