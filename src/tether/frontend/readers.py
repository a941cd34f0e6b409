"""Which frontend reads each model format that is not ONNX: format name (as :mod:`tether.frontend.detect`
names it) -> a reader ``path -> onnx.ModelProto`` and a coverage table ``path -> rows`` for ``--check``.

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
    def read(path: str) -> Any:
        try:
            mod = importlib.import_module(module)
        except ImportError as exc:
            raise InvalidInput("%s needs the optional dependency %r: pip install 'tether[%s]'"
                               % (path, exc.name or str(exc), extra)) from None
        return getattr(mod, function)(path)
    read.__qualname__ = "%s.%s" % (module, function)
    return read


# format name -> (module, reader function, coverage function, extra); one line per format
for _fmt, (_mod, _read, _cover, _extra) in {
    "TFLite": ("tether.frontend.tflite", "read_onnx", "op_coverage", "tflite"),
}.items():
    register_reader(_fmt, lazy(_mod, _read, _extra), lazy(_mod, _cover, _extra))
