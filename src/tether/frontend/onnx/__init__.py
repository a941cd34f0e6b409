"""ONNX -> tether graph.

``from_onnx(model, shape={...})`` fixes the input shapes, then walks the ONNX nodes once, in order, through a
dispatch table of converters (``CONVERTERS``, ONNX op type -> function). Every emitted op gets its output
type at once (the op table, ``tether.kernels``), and an op whose inputs are all constants is evaluated right away with
its numpy definition. That is what folds the shape subgraphs real exporters write
(Shape -> Gather/Slice -> Concat -> Reshape): once input shapes are fixed, ``Shape`` is a constant, and
everything downstream of it folds before a single kernel exists.

Before converting anything, the whole model is checked: one ``UnsupportedOpError`` lists every unsupported
op type with the names of its nodes.

The package: ``importer`` (the import state and the converter registry), one module per op family
(``elementwise``, ``tensor``, ``nn``, ``reduce``, ``norm``, ``resize``, ``indexing``), and ``model`` (the entry
points). A converter module registers itself on import; add a new family by adding a module and importing it
here.
"""
from tether.frontend.onnx import elementwise, indexing, nn, norm, reduce, resize, tensor  # noqa: F401  (register)
from tether.frontend.onnx import control_flow, recurrent  # noqa: F401,E402  (register: If/Loop/Scan, LSTM/GRU/RNN)
from tether.frontend.onnx import quantized, quantized_contrib  # noqa: F401  (register: int8 models, issue 12)
from tether.frontend.onnx import attention, einsum, linear_attention, rotary  # noqa: F401  (register; issue 11)
# issue 11: indexing, math, signal and data-dependent ops
from tether.frontend.onnx import along_axis, bitcast, dynamic, indexmap, lppool, sampling, signal, trig  # noqa: F401
# issue 12 (register): DynamicQuantizeLSTM, QLinearLeakyRelu/AveragePool/Where/Softmax, QuickGelu
from tether.frontend.onnx import contrib_activations, qoperator_contrib, quantized_lstm  # noqa: F401,E402
from tether.frontend.onnx.importer import CONVERTERS
from tether.frontend.onnx.model import from_onnx, op_coverage, unsupported_ops
from tether.frontend.onnx import sequence  # noqa: F401,E402  (register: sequences and optionals, issue 11)

__all__ = ["CONVERTERS", "from_onnx", "op_coverage", "unsupported_ops"]
