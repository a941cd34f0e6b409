"""Caffe2 models (predict_net.pb + init_net.pb) read without caffe2: proto.py describes caffe2.proto's messages
at run time, ops.py translates each operator to ONNX nodes, model.py ties the two nets together."""
from tether.frontend.caffe2.model import from_caffe2, op_coverage, read_model, to_onnx

__all__ = ["from_caffe2", "op_coverage", "read_model", "to_onnx"]
