"""A Keras model file as its parts: the model's serialized config, the Keras version that wrote it and its
weights, read with h5py and json only (no Keras, no TensorFlow).

Two containers hold a model: the Keras 3 ``.keras`` zip (``config.json``, ``metadata.json`` and
``model.weights.h5``) and the legacy HDF5 ``.h5`` file (the config as the root attribute ``model_config``, the
weights under ``model_weights/<layer>``). Anything truncated, corrupt or missing is an ``InvalidInput`` naming
the file and what was expected.
"""
from __future__ import annotations

import dataclasses
import io
import json
import zipfile
from typing import Any, Dict

from tether.errors import InvalidInput
from tether.frontend.keras.weights import H5Weights, WeightStore, ZipWeights


@dataclasses.dataclass
class KerasFile:
    """``config``: the model's ``{"class_name", "config"}``; ``version``: the Keras version that saved it."""

    path: str
    config: Dict[str, Any]
    version: str
    weights: WeightStore


def _h5py():
    try:
        import h5py
    except ImportError:
        raise InvalidInput("reading Keras weights needs the optional dependency 'h5py': pip install "
                           "'tether[keras]'") from None
    return h5py


def _json(path: str, what: str, text: Any) -> Dict[str, Any]:
    try:
        value = json.loads(text.decode("utf-8") if isinstance(text, bytes) else text)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidInput("%s: its %s is not valid JSON (%s); expected a Keras model's serialized config"
                           % (path, what, exc)) from None
    if not isinstance(value, dict) or "class_name" not in value or not isinstance(value.get("config"), dict):
        raise InvalidInput("%s: its %s is no Keras model config (no class_name and config); expected a model "
                           "saved by model.save()" % (path, what))
    return value


def read_zip(path: str) -> KerasFile:
    h5py = _h5py()
    try:
        with zipfile.ZipFile(path) as zf:
            names = set(zf.namelist())
            if "config.json" not in names:
                raise InvalidInput("%s is a zip without config.json; expected a Keras model (.keras)" % path)
            config = _json(path, "config.json", zf.read("config.json"))
            meta = json.loads(zf.read("metadata.json")) if "metadata.json" in names else {}
            if "model.weights.h5" not in names:
                raise InvalidInput("%s (a Keras model) has no model.weights.h5; expected the weights beside "
                                   "config.json" % path)
            data = zf.read("model.weights.h5")
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:
        if isinstance(exc, InvalidInput):
            raise
        raise InvalidInput("%s is a truncated or corrupt Keras model zip (%s); expected a .keras file saved by "
                           "model.save()" % (path, " ".join(str(exc).split()) or type(exc).__name__)) from None
    try:
        h5 = h5py.File(io.BytesIO(data), "r")
    except OSError as exc:
        raise InvalidInput("%s: its model.weights.h5 is not a readable HDF5 file (%s); expected the Keras "
                           "model's weights" % (path, " ".join(str(exc).split()))) from None
    version = str(meta.get("keras_version", "3")) if isinstance(meta, dict) else "3"
    return KerasFile(path, config, version, ZipWeights(path, h5, config))


def read_h5(path: str) -> KerasFile:
    h5py = _h5py()
    try:
        h5 = h5py.File(path, "r")
    except OSError as exc:
        raise InvalidInput("%s is a truncated or corrupt HDF5 file (%s); expected a Keras model (.h5)"
                           % (path, " ".join(str(exc).split()))) from None
    if "model_config" not in h5.attrs:
        raise InvalidInput("%s is an HDF5 file without a model_config attribute; expected a whole Keras model "
                           "saved by model.save() (a weights-only file holds no layers)" % path)
    config = _json(path, "model_config attribute", h5.attrs["model_config"])
    version = h5.attrs.get("keras_version", "2")
    version = version.decode() if isinstance(version, bytes) else str(version)
    if "model_weights" not in h5:
        raise InvalidInput("%s (a Keras HDF5 model) has no model_weights group; expected its weights" % path)
    return KerasFile(path, config, version, H5Weights(path, h5["model_weights"]))


def read(path: str) -> KerasFile:
    """The Keras model in the ``.keras`` zip or legacy ``.h5`` file at ``path`` (chosen by content)."""
    with open(path, "rb") as fh:
        head = fh.read(8)
    if head.startswith(b"PK"):
        return read_zip(path)
    if head == b"\x89HDF\r\n\x1a\n":
        return read_h5(path)
    raise InvalidInput("%s is neither a Keras zip (.keras) nor an HDF5 file (.h5); expected a Keras model" % path)
