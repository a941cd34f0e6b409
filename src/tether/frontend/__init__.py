"""Model importers: ``from_onnx(model, shape={...}) -> (graph, params)``."""
from tether.frontend.onnx import from_onnx, unsupported_ops
from tether.frontend.tflite import from_tflite

__all__ = ["from_onnx", "from_tflite", "unsupported_ops"]
