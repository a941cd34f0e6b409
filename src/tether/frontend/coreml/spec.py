"""Reading a Core ML model: an ``.mlmodel`` file (a ``Model`` protobuf) or an ``.mlpackage`` folder (a manifest
naming the root model spec, with the ML Program's weight files beside it).

The protobuf messages are the ones coremltools ships (``coremltools.proto``); nothing else of coremltools runs.
Its generated modules are loaded on their own, without the coremltools package, whose import pulls in
TensorFlow and the converters: seconds of start-up and a screen of log lines on every ``tether compile``.
"""
from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import json
import os
import sys
from typing import Any, Optional

from tether.errors import InvalidInput


@dataclasses.dataclass
class CoreMLSource:
    """A parsed model: ``spec`` (``Model_pb2.Model``), where it came from, and the folder ``@model_path`` names
    (the folder holding the spec, whose ``weights/`` an ML Program's blob consts read)."""

    path: str
    spec: Any
    model_dir: str


_PRIVATE = "_tether_coremltools_proto"


def proto():
    """coremltools' generated ``Model_pb2`` module: the package's own when coremltools is imported already, else
    its ``proto`` folder loaded as a package of its own (the messages register the same descriptors either way)."""
    if "coremltools.proto.Model_pb2" in sys.modules:
        return sys.modules["coremltools.proto.Model_pb2"]
    if _PRIVATE not in sys.modules:
        found = importlib.util.find_spec("coremltools")
        if found is None or not found.origin:
            raise ImportError("No module named 'coremltools'", name="coremltools")
        folder = os.path.join(os.path.dirname(found.origin), "proto")
        spec = importlib.util.spec_from_file_location(_PRIVATE, os.path.join(folder, "__init__.py"),
                                                      submodule_search_locations=[folder])
        module = importlib.util.module_from_spec(spec)
        sys.modules[_PRIVATE] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[_PRIVATE]
            raise
    return importlib.import_module(_PRIVATE + ".Model_pb2")


def _parse(path: str, data: bytes, what: str):
    from google.protobuf.message import DecodeError

    model = proto().Model()
    try:
        model.ParseFromString(data)
    except (DecodeError, ValueError, RuntimeError) as exc:
        raise InvalidInput("%s is not a valid Core ML model: its protobuf does not parse (%s); expected %s"
                           % (path, " ".join(str(exc).split()) or type(exc).__name__, what)) from None
    if model.WhichOneof("Type") is None:
        raise InvalidInput("%s is not a valid Core ML model: it holds no model (no NeuralNetwork or ML Program); "
                           "expected %s" % (path, what))
    return model


def _package_spec_path(path: str) -> str:
    manifest = os.path.join(path, "Manifest.json")
    try:
        with open(manifest, encoding="utf-8") as fh:
            info = json.load(fh)
        root = info["rootModelIdentifier"]
        entry = info["itemInfoEntries"][root]
        rel = entry["path"]
    except OSError as exc:
        raise InvalidInput("%s cannot be read (%s); expected the manifest of a Core ML package"
                           % (manifest, exc.strerror or exc)) from None
    except (ValueError, KeyError, TypeError) as exc:
        raise InvalidInput("%s is not a Core ML package manifest (%s); expected JSON naming the root model in "
                           "rootModelIdentifier and itemInfoEntries" % (manifest, type(exc).__name__)) from None
    spec_path = os.path.join(path, "Data", rel)
    if not os.path.isfile(spec_path):
        raise InvalidInput("%s names its model spec %s, which does not exist; expected the package's "
                           "Data/%s" % (path, spec_path, rel))
    return spec_path


def load(path: str, spec: Optional[Any] = None) -> CoreMLSource:
    """The model at ``path`` (an ``.mlmodel`` file or an ``.mlpackage`` folder), or ``spec`` itself (a
    ``Model_pb2.Model``, its weights relative to ``path`` when given)."""
    if spec is not None:
        return CoreMLSource(str(path or ""), spec, os.path.abspath(path) if path else os.getcwd())
    path = os.fspath(path)
    if not os.path.exists(path):
        raise InvalidInput("%s does not exist; expected a Core ML model (.mlmodel or .mlpackage)" % path)
    if os.path.isdir(path):
        spec_path = _package_spec_path(path)
        what = "a Core ML model spec inside the package"
    else:
        spec_path = path
        what = "a Core ML model (.mlmodel)"
    try:
        with open(spec_path, "rb") as fh:
            data = fh.read()
    except OSError as exc:
        raise InvalidInput("%s cannot be read (%s); expected %s" % (spec_path, exc.strerror or exc, what)) from None
    if not data:
        raise InvalidInput("%s is empty; expected %s" % (spec_path, what))
    return CoreMLSource(path, _parse(spec_path, data, what), os.path.dirname(os.path.abspath(spec_path)))
