"""Model importers: ``from_onnx(model, shape={...}) -> (graph, params)``."""
from tether.frontend.keras import from_keras
from tether.frontend.onnx import from_onnx, unsupported_ops

__all__ = ["from_keras", "from_onnx", "unsupported_ops"]
