"""Darknet models (.cfg + .weights) read without darknet: each layer becomes ONNX nodes (cfg.py reads the text,
weights.py the binary, layers.py translates, model.py ties the files together)."""
from tether.frontend.darknet.model import from_darknet, op_coverage, read_model, to_onnx

__all__ = ["from_darknet", "op_coverage", "read_model", "to_onnx"]
