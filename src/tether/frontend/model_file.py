"""The model file a user names, read as ONNX or refused in one line that says what it is.

``load_onnx_file(path)`` returns ``(ModelProto, base_dir)`` for ``from_onnx(model, base_dir=...)`` (external
tensor data stays on disk until the import reads it). Anything else raises :class:`tether.errors.InvalidInput`:
an empty file, a format tether does not read yet (named from its content by :mod:`tether.frontend.detect`), or
bytes that do not parse as an ONNX ModelProto with a graph and an opset.
"""
from __future__ import annotations

import os
from typing import Any, Tuple

from tether.errors import InvalidInput
from tether.frontend import detect


def _expected() -> str:
    return "supported formats: %s" % ", ".join(detect.supported_formats())


def load_onnx_file(path: str) -> Tuple[Any, str]:
    """The ONNX ModelProto at ``path`` (external data not loaded) and the folder its external data is relative to."""
    import onnx
    from google.protobuf.message import DecodeError

    if not os.path.isdir(path) and os.path.getsize(path) == 0:
        raise InvalidInput("%s is empty; expected an ONNX model" % path)
    fmt = detect.detect(path)
    if fmt is None and os.path.isdir(path):
        raise InvalidInput("%s is a folder, not a model file; %s" % (path, _expected()))
    if fmt is not None and not fmt.supported:
        which = "which tether does not read yet" if fmt.is_model else "not a model"
        raise InvalidInput("%s is %s, %s; %s" % (path, fmt.what, which, _expected()))
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
