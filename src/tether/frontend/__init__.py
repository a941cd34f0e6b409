"""Model importers: ``from_onnx(model, shape={...}) -> (graph, params)``, and one ``from_*`` per other format,
each translating its file into an ONNX graph first (docs/frontends.md). Optional dependencies are imported on
first use."""
from tether.frontend.caffe import from_caffe
from tether.frontend.caffe2 import from_caffe2
from tether.frontend.coreml import from_coreml
from tether.frontend.darknet import from_darknet
from tether.frontend.keras import from_keras
from tether.frontend.mxnet import from_mxnet
from tether.frontend.onnx import from_onnx, unsupported_ops
from tether.frontend.tensorflow import from_tensorflow
from tether.frontend.tflite import from_tflite

__all__ = ["from_caffe", "from_caffe2", "from_coreml", "from_darknet", "from_keras", "from_mxnet", "from_onnx",
           "from_tensorflow", "from_tflite", "unsupported_ops"]
