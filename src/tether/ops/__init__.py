"""tether.ops: the operator library.  Every op returns te tensors; `schedule(outs, target)` gives each op its
default schedule for the target family (x86, aarch64, armv7).

    X = te.placeholder((64, 128), "float32", name="X"); W = te.placeholder((128, 32), "float32", name="W")
    Y = ops.relu(ops.matmul(X, W))
    s = ops.schedule([Y], target="rasp4b")
    lib = tether.build(s, [X, W, Y], target="rasp4b", name="mlp")
"""
from .activation import clip, gelu, hard_sigmoid, hard_swish, leaky_relu, relu, relu6, sigmoid, tanh
from .common import tag_of
from .conv import conv2d, conv2d_pixels, depthwise_conv2d
from .elementwise import (abs, add, ceil, divide, erf, exp, floor, log, maximum, minimum, multiply, negative,
                          power, rsqrt, sqrt, subtract)
from .nary import elementwise
from .linear import batch_matmul, dense, matmul
from .norm import batch_norm
from .pooling import avg_pool2d, global_avg_pool2d, global_max_pool2d, max_pool2d
from .reduction import log_softmax, max, mean, min, softmax, sum
from .schedules import family_of, schedule
from .shape import concat, expand_dims, flatten, pad, reshape, squeeze, transpose

__all__ = [
    "abs", "add", "avg_pool2d", "batch_matmul", "batch_norm", "ceil", "clip", "concat", "conv2d", "conv2d_pixels",
    "dense", "depthwise_conv2d", "divide", "elementwise", "erf", "exp", "expand_dims", "family_of", "flatten", "floor",
    "gelu", "global_avg_pool2d", "global_max_pool2d", "hard_sigmoid", "hard_swish", "leaky_relu", "log", "log_softmax",
    "matmul", "max", "max_pool2d", "maximum", "mean", "min", "minimum", "multiply", "negative", "pad", "power",
    "relu", "relu6", "reshape", "rsqrt", "schedule", "sigmoid", "softmax", "sqrt", "squeeze", "subtract", "sum",
    "tag_of", "tanh", "transpose",
]
from .reduction import arg_reduce, reduce  # noqa: E402  ONNX Reduce* kinds and ArgMax/ArgMin
__all__ += ["arg_reduce", "reduce"]
from .norm import normalize  # noqa: E402  layer/instance/group normalization
__all__ += ["normalize"]
from .resize import resize_tables  # noqa: E402  ONNX Resize/Upsample from per-axis tap tables
__all__ += ["resize_tables"]
from .indexing import gather, gather_elements, gather_nd, one_hot, trilu  # noqa: E402  index-driven ops
__all__ += ["gather", "gather_elements", "gather_nd", "one_hot", "trilu"]
from .rms_norm import rms_normalize  # noqa: E402  RMS normalization
__all__ += ["rms_normalize"]
from .rotary import rotary_embedding  # noqa: E402  rotary position embedding
__all__ += ["rotary_embedding"]
from . import qschedules  # noqa: E402,F401  the int8 conv kernels' schedules, by tag
from . import qdepthwise_nhwc  # noqa: E402,F401  the channels-last int8 depthwise kernel and its schedule
from . import qpool_nhwc  # noqa: E402,F401  channels-last int8 max pooling and its schedule
