"""Caffe models (.prototxt + .caffemodel) read without caffe: proto.py describes caffe.proto's messages at run
time, layers.py translates each layer to ONNX nodes, model.py ties the files together."""
from tether.frontend.caffe.model import from_caffe, op_coverage, read_model, to_onnx

__all__ = ["from_caffe", "op_coverage", "read_model", "to_onnx"]
