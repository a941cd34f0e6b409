"""Model importers: ``from_onnx(model, shape={...}) -> (graph, params)``."""
from tether.frontend.onnx import from_onnx, unsupported_ops
from tether.frontend.tensorflow import from_tensorflow

__all__ = ["from_onnx", "unsupported_ops", "from_tensorflow"]
