"""Model importers: ``from_onnx(model, shape={...}) -> (graph, params)``."""
from tether.frontend.caffe import from_caffe
from tether.frontend.caffe2 import from_caffe2
from tether.frontend.darknet import from_darknet
from tether.frontend.mxnet import from_mxnet
from tether.frontend.onnx import from_onnx, unsupported_ops
from tether.frontend.tflite import from_tflite

__all__ = ["from_caffe", "from_caffe2", "from_darknet", "from_mxnet", "from_onnx", "from_tflite",
           "unsupported_ops"]
