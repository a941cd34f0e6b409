"""Which frontend reads each model format that is not ONNX: format name (as :mod:`tether.frontend.detect`
names it) -> a reader ``(path, shape=None) -> onnx.ModelProto`` and a coverage table ``path -> rows`` for
``--check``. ``shape`` (input name -> dims, the user's ``--input-shape``) reaches the reader because some formats
hold no input shapes (Caffe2, MXNet) or sizes computed from open ones (TensorFlow).

A reader translates the whole file before it raises, so its UnsupportedOpError names every op it does not
cover (op, node, version). A coverage row is ``{"op_type", "domain" (the format), "opset" (the op's version
in the file, or ""), "covered", "nodes" (names)}``, the rows :func:`tether.frontend.onnx.op_coverage` gives.

Every other frontend translates its file into an ONNX graph in memory, so each format gets the whole ONNX
importer (its op coverage, shapes, quantized kernels, ``--check``) and the CLI, tuner and bench take any format
through one call. Readers import their frontend lazily: a user without an optional extra installed gets a
one-line error naming it, not an ImportError at startup. The table is filled explicitly below and refuses
duplicates.
"""
from __future__ import annotations

import importlib
from typing import Any, Callable, Dict

from tether.errors import InvalidInput

Reader = Callable[[str], Any]
READERS: Dict[str, Reader] = {}
COVERAGE: Dict[str, Reader] = {}


def register_reader(fmt: str, reader: Reader, coverage: Reader) -> None:
    if fmt in READERS:
        raise ValueError("a reader for model format %r is registered already" % fmt)
    READERS[fmt] = reader
    COVERAGE[fmt] = coverage


def lazy(module: str, function: str, extra: str) -> Reader:
    """A reader calling ``module.function(path)``; the module is imported on first use, and a missing optional
    dependency is reported as ``pip install 'tether[extra]'``."""
    def read(path: str, **kwargs: Any) -> Any:
        try:
            mod = importlib.import_module(module)
        except ImportError as exc:
            raise InvalidInput("%s needs the optional dependency %r: pip install 'tether[%s]'"
                               % (path, exc.name or str(exc), extra)) from None
        return getattr(mod, function)(path, **kwargs)
    read.__qualname__ = "%s.%s" % (module, function)
    return read


# format name -> (module, reader function, coverage function, extra); one line per format
for _fmt, (_mod, _read, _cover, _extra) in {
    "Darknet": ("tether.frontend.darknet", "read_model", "op_coverage", "darknet"),
    "Caffe prototxt": ("tether.frontend.caffe", "read_model", "op_coverage", "caffe"),
    "Caffe": ("tether.frontend.caffe", "read_model", "op_coverage", "caffe"),
    "Caffe2": ("tether.frontend.caffe2", "read_model", "op_coverage", "caffe2"),
    "MXNet": ("tether.frontend.mxnet", "read_model", "op_coverage", "mxnet"),
    "TFLite": ("tether.frontend.tflite", "read_onnx", "op_coverage", "tflite"),
    "CoreML": ("tether.frontend.coreml", "read_coreml", "op_coverage", "coreml"),
    "CoreML package": ("tether.frontend.coreml", "read_coreml", "op_coverage", "coreml"),
    "Keras": ("tether.frontend.keras", "read_keras", "keras_coverage", "keras"),
    "Keras HDF5": ("tether.frontend.keras", "read_keras", "keras_coverage", "keras"),
    "TensorFlow GraphDef": ("tether.frontend.tensorflow", "read_graphdef", "coverage", "tensorflow"),
    "TensorFlow SavedModel": ("tether.frontend.tensorflow", "read_saved_model", "coverage", "tensorflow"),
}.items():
    register_reader(_fmt, lazy(_mod, _read, _extra), lazy(_mod, _cover, _extra))
