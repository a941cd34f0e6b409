"""Model importers: ``from_onnx(model, shape={...}) -> (graph, params)``."""
from tether.frontend.coreml import from_coreml  # coremltools (optional extra) is imported on first use
from tether.frontend.onnx import from_onnx, unsupported_ops


__all__ = ["from_onnx", "unsupported_ops", "from_coreml"]
