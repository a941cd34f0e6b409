"""MXNet models (prefix-symbol.json + prefix-NNNN.params) read without mxnet: params.py reads the NDArray-list
binary, ops.py translates each symbol op to ONNX nodes, model.py ties the two files together."""
from tether.frontend.mxnet.model import from_mxnet, op_coverage, read_model, to_onnx

__all__ = ["from_mxnet", "op_coverage", "read_model", "to_onnx"]
