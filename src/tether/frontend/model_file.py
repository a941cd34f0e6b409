"""The model file a user names, read as an ONNX graph or refused in one line that says what it is.

``load_model_file(path)`` returns ``(ModelProto, base_dir)`` for ``from_onnx(model, base_dir=...)`` (external
tensor data stays on disk until the import reads it). A file of another format (TFLite, TensorFlow, Keras...)
is recognised from its content by :mod:`tether.frontend.detect` and translated by its reader
(:mod:`tether.frontend.readers`). Anything else raises :class:`tether.errors.InvalidInput`: an empty file, a
format tether does not read, or bytes that do not parse as an ONNX ModelProto with a graph and an opset.
"""
from __future__ import annotations

import os
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from tether.errors import InvalidInput
from tether.frontend import detect, readers


def _expected() -> str:
    return "supported formats: %s" % ", ".join(detect.supported_formats())


def _format(path: str) -> Optional[detect.ModelFormat]:
    if not os.path.exists(path):
        raise InvalidInput("%s does not exist; expected a model file" % path)
    if not os.path.isdir(path) and os.path.getsize(path) == 0:
        raise InvalidInput("%s is empty; expected a model file" % path)
    fmt = detect.detect(path)
    if fmt is None and os.path.isdir(path):
        raise InvalidInput("%s is a folder, not a model file; %s" % (path, _expected()))
    if fmt is not None and not fmt.supported:
        which = "which tether does not read yet" if fmt.is_model else "not a model"
        raise InvalidInput("%s is %s, %s; %s" % (path, fmt.what, which, _expected()))
    return fmt


def op_coverage(path: str) -> List[Dict[str, Any]]:
    """The ops of the model at ``path`` in its own format's terms, each with whether tether covers it."""
    fmt = _format(path)
    if fmt is not None and fmt.name in readers.COVERAGE:
        return readers.COVERAGE[fmt.name](path)
    from tether.frontend.onnx import op_coverage as onnx_coverage

    return onnx_coverage(load_model_file(path)[0])


def load_model_file(path: str, shape: Optional[Mapping[str, Sequence[int]]] = None) -> Tuple[Any, str]:
    """The model at ``path`` as an ONNX ModelProto (external data not loaded), and the folder its external data
    is relative to. ``shape`` (input name -> dims) goes to a foreign format's reader, for formats whose files hold
    no input shapes; ``from_onnx(model, shape=...)`` still applies it to the ONNX graph."""
    import onnx
    from google.protobuf.message import DecodeError

    fmt = _format(path)
    if fmt is not None and fmt.name in readers.READERS:
        return readers.READERS[fmt.name](path, shape=shape), os.path.dirname(os.path.abspath(path))
    with open(path, "rb") as fh:
        data = fh.read()
    try:
        # from bytes, not onnx.load(path): that picks JSON or text parsing from the file's extension
        model = onnx.load_model_from_string(data)
    except (DecodeError, ValueError, RuntimeError) as exc:
        raise InvalidInput("%s is not a valid ONNX model: its protobuf does not parse (%s), so it is truncated or "
                           "not ONNX; %s" % (path, " ".join(str(exc).split()) or type(exc).__name__, _expected())) \
            from None
    # protobuf accepts many byte strings as a message of unknown fields: a model has a graph and an opset
    missing = [w for w, ok in (("graph", model.HasField("graph")), ("opset", bool(model.opset_import))) if not ok]
    if missing:
        raise InvalidInput("%s is not a valid ONNX model (as a ModelProto it has no %s); %s"
                           % (path, " and no ".join(missing), _expected()))
    return model, os.path.dirname(os.path.abspath(path))
