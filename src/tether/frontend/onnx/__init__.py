"""ONNX -> tether graph.

``from_onnx(model, shape={...})`` fixes the input shapes, then walks the ONNX nodes once, in order, through a
dispatch table of converters (``CONVERTERS``, ONNX op type -> function). Every emitted op gets its output
type at once (the op table, ``tether.kernels``), and an op whose inputs are all constants is evaluated right away with
its numpy definition. That is what folds the shape subgraphs real exporters write
(Shape -> Gather/Slice -> Concat -> Reshape): once input shapes are fixed, ``Shape`` is a constant, and
everything downstream of it folds before a single kernel exists.

Before converting anything, the whole model is checked: one ``UnsupportedOpError`` lists every unsupported
op type with the names of its nodes.

The package: ``importer`` (the import state, the ``ConverterTable`` type and the helpers converters share), one
module per op family (``elementwise``, ``tensor``, ``nn``, ``reduce``, ``norm``, ``resize``, ``indexing``, ...),
each filling its own ``CONVERTERS`` table, ``converters`` (the one list of families, merged into the table the
import uses; an op converted twice is an error), and ``model`` (the entry points). Add a family by adding a
module and naming it in ``converters.FAMILIES``.
"""
from tether.frontend.onnx.converters import CONVERTERS
from tether.frontend.onnx.model import from_onnx, op_coverage, unsupported_ops

__all__ = ["CONVERTERS", "from_onnx", "op_coverage", "unsupported_ops"]
