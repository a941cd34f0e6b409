"""ONNX models whose weights live outside the protobuf (``external data``: ``model.onnx`` + ``model.onnx.data``).

PyTorch's exporters write large models this way, and a model over 2 GB can only exist this way: protobuf
cannot serialize or parse a message that big. So a path is loaded with ``load_external_data=False`` (the
protobuf holds only the graph and, per initializer, a file name, an offset and a length) and each initializer
is read straight from its data file into its own numpy array: the weights are never copied into one protobuf.

A data file's ``location`` comes from the model file and is untrusted: it must name a file inside the model's
folder (no absolute path, no ``..`` that leaves it), and offset and length must lie inside that file.
"""
from __future__ import annotations

import os
from typing import Any, Optional, Tuple

import numpy as np

from tether.errors import UnsupportedOpError


def load_model(path: Any) -> Tuple[Any, str]:
    """The ModelProto at ``path`` without its external tensors' bytes, and the folder they are relative to."""
    import onnx

    path = os.fspath(path)
    if isinstance(path, bytes):
        path = path.decode()
    return onnx.load(path, load_external_data=False), os.path.dirname(os.path.abspath(path))


def has_unloaded_external_data(tensor) -> bool:
    import onnx

    return tensor.data_location == onnx.TensorProto.EXTERNAL and not tensor.HasField("raw_data")


def _external_fields(tensor) -> dict:
    fields = {e.key: e.value for e in tensor.external_data}
    if "location" not in fields:
        raise ValueError("initializer %r is stored externally but names no data file (external_data has no "
                         "'location')" % tensor.name)
    return fields


def _data_file(base_dir: str, location: str, tensor_name: str) -> str:
    if os.path.isabs(location) or location.startswith(("/", "\\")):
        raise ValueError("initializer %r: external data location %r is absolute; it must be relative to the "
                         "model's folder" % (tensor_name, location))
    base = os.path.realpath(base_dir)
    path = os.path.realpath(os.path.join(base, location))
    if os.path.commonpath([base, path]) != base:
        raise ValueError("initializer %r: external data location %r leaves the model's folder %s"
                         % (tensor_name, location, base_dir))
    if not os.path.isfile(path):
        raise FileNotFoundError("initializer %r: external data file %s does not exist (it must sit beside the "
                                "model file, as %r)" % (tensor_name, path, location))
    return path


def _numpy_dtype(tensor) -> np.dtype:
    import onnx
    from onnx import helper

    if tensor.data_type == onnx.TensorProto.BFLOAT16:
        import ml_dtypes
        return np.dtype(ml_dtypes.bfloat16)     # as onnx's numpy_helper gives bfloat16 initializers
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(tensor.data_type))
    except (KeyError, TypeError) as exc:
        raise UnsupportedOpError("initializer %r has element type %d, which tether cannot store"
                                 % (tensor.name, tensor.data_type)) from exc


def read_external(tensor, base_dir: str) -> np.ndarray:
    """The array of an initializer whose bytes live in a data file under ``base_dir``."""
    fields = _external_fields(tensor)
    path = _data_file(base_dir, fields["location"], tensor.name)
    dtype = _numpy_dtype(tensor).newbyteorder("<")
    shape = tuple(int(d) for d in tensor.dims)
    count = int(np.prod(shape, dtype=np.int64))
    nbytes = count * dtype.itemsize
    offset = int(fields.get("offset", 0))
    length = int(fields.get("length", nbytes))
    size = os.path.getsize(path)
    if offset < 0 or length != nbytes or offset + length > size:
        raise ValueError("initializer %r: external data (offset %d, length %d) does not hold its %s %s tensor "
                         "(%d bytes) within %s (%d bytes)"
                         % (tensor.name, offset, length, dtype.name, list(shape), nbytes, path, size))
    with open(path, "rb") as f:
        f.seek(offset)
        array = np.fromfile(f, dtype=dtype, count=count)
    return array.astype(dtype.newbyteorder("="), copy=False).reshape(shape)


def initializer_array(tensor, base_dir: Optional[str]) -> np.ndarray:
    """An initializer as numpy, reading external bytes from ``base_dir`` when the protobuf does not hold them."""
    from onnx import numpy_helper

    if has_unloaded_external_data(tensor):
        if base_dir is None:
            raise ValueError("initializer %r is stored in an external data file (%r) that was not loaded: pass "
                             "the model's path to from_onnx, or base_dir=<the model's folder>"
                             % (tensor.name, _external_fields(tensor)["location"]))
        return read_external(tensor, base_dir)
    return numpy_helper.to_array(tensor)
