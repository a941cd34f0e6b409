"""The part of caffe.proto a deployed net uses, built at run time as protobuf descriptors (no generated caffe_pb2,
no caffe): NetParameter, LayerParameter and the layer parameter messages tether translates, BlobProto and
BlobShape, and V1LayerParameter for nets written before 2015. Field numbers, types and defaults are caffe.proto's,
so both the binary .caffemodel and the text .prototxt parse, and fields not described here are skipped.

Each message is written below in .proto syntax, one field a line (:mod:`tether.frontend.proto_schema` reads
it); ``messages()`` returns the classes, made once.
"""
from __future__ import annotations

from typing import Any, Dict

from tether.frontend.proto_schema import build_messages

_ENUMS: Dict[str, str] = {      # "Message.Enum" (or a top-level name) -> "NAME=number ..."
    "Phase": "TRAIN=0 TEST=1",
    "FillerParameter.VarianceNorm": "FAN_IN=0 FAN_OUT=1 AVERAGE=2",
    "ParamSpec.DimCheckMode": "STRICT=0 PERMISSIVE=1",
    "EltwiseParameter.EltwiseOp": "PROD=0 SUM=1 MAX=2",
    "PoolingParameter.PoolMethod": "MAX=0 AVE=1 STOCHASTIC=2",
    "PoolingParameter.Engine": "DEFAULT=0 CAFFE=1 CUDNN=2",
    "ConvolutionParameter.Engine": "DEFAULT=0 CAFFE=1 CUDNN=2",
    "LRNParameter.NormRegion": "ACROSS_CHANNELS=0 WITHIN_CHANNEL=1",
    "LRNParameter.Engine": "DEFAULT=0 CAFFE=1 CUDNN=2",
    "ReLUParameter.Engine": "DEFAULT=0 CAFFE=1 CUDNN=2",
    "SigmoidParameter.Engine": "DEFAULT=0 CAFFE=1 CUDNN=2",
    "TanHParameter.Engine": "DEFAULT=0 CAFFE=1 CUDNN=2",
    "SoftmaxParameter.Engine": "DEFAULT=0 CAFFE=1 CUDNN=2",
    "V1LayerParameter.LayerType": (
        "NONE=0 ABSVAL=35 ACCURACY=1 ARGMAX=30 BNLL=2 CONCAT=3 CONTRASTIVE_LOSS=37 CONVOLUTION=4 DATA=5 "
        "DECONVOLUTION=39 DROPOUT=6 DUMMY_DATA=32 EUCLIDEAN_LOSS=7 ELTWISE=25 EXP=38 FLATTEN=8 HDF5_DATA=9 "
        "HDF5_OUTPUT=10 HINGE_LOSS=28 IM2COL=11 IMAGE_DATA=12 INFOGAIN_LOSS=13 INNER_PRODUCT=14 LRN=15 "
        "MEMORY_DATA=29 MULTINOMIAL_LOGISTIC_LOSS=16 MVN=34 POOLING=17 POWER=26 RELU=18 SIGMOID=19 "
        "SIGMOID_CROSS_ENTROPY_LOSS=27 SILENCE=36 SOFTMAX=20 SOFTMAX_LOSS=21 SPLIT=22 SLICE=33 TANH=23 "
        "WINDOW_DATA=24 THRESHOLD=31"),
}

_MESSAGES: Dict[str, str] = {
    "BlobShape": "repeated int64 dim = 1 [packed]",
    "BlobProto": """
        optional BlobShape shape = 7
        repeated float data = 5 [packed]
        repeated float diff = 6 [packed]
        repeated double double_data = 8 [packed]
        repeated double double_diff = 9 [packed]
        optional int64 num = 1
        optional int64 channels = 2
        optional int64 height = 3
        optional int64 width = 4""",
    "FillerParameter": """
        optional string type = 1 [default = constant]
        optional float value = 2
        optional float min = 3
        optional float max = 4 [default = 1]
        optional float mean = 5
        optional float std = 6 [default = 1]
        optional int64 sparse = 7 [default = -1]
        optional VarianceNorm variance_norm = 8""",
    "NetState": """
        optional Phase phase = 1 [default = TEST]
        optional int64 level = 2
        repeated string stage = 3""",
    "NetStateRule": """
        optional Phase phase = 1
        optional int64 min_level = 2
        optional int64 max_level = 3
        repeated string stage = 4
        repeated string not_stage = 5""",
    "ParamSpec": """
        optional string name = 1
        optional DimCheckMode share_mode = 2
        optional float lr_mult = 3 [default = 1]
        optional float decay_mult = 4 [default = 1]""",
    "NetParameter": """
        optional string name = 1
        repeated string input = 3
        repeated BlobShape input_shape = 8
        repeated int64 input_dim = 4
        optional bool force_backward = 5
        optional NetState state = 6
        optional bool debug_info = 7
        repeated LayerParameter layer = 100
        repeated V1LayerParameter layers = 2""",
    "LayerParameter": """
        optional string name = 1
        optional string type = 2
        repeated string bottom = 3
        repeated string top = 4
        optional Phase phase = 10
        repeated float loss_weight = 5
        repeated ParamSpec param = 6
        repeated BlobProto blobs = 7
        repeated bool propagate_down = 11
        repeated NetStateRule include = 8
        repeated NetStateRule exclude = 9
        optional BatchNormParameter batch_norm_param = 139
        optional BiasParameter bias_param = 141
        optional ConcatParameter concat_param = 104
        optional ConvolutionParameter convolution_param = 106
        optional CropParameter crop_param = 144
        optional DropoutParameter dropout_param = 108
        optional EltwiseParameter eltwise_param = 110
        optional ELUParameter elu_param = 140
        optional ExpParameter exp_param = 111
        optional FlattenParameter flatten_param = 135
        optional InnerProductParameter inner_product_param = 117
        optional InputParameter input_param = 143
        optional LogParameter log_param = 134
        optional LRNParameter lrn_param = 118
        optional PermuteParameter permute_param = 202
        optional PoolingParameter pooling_param = 121
        optional PowerParameter power_param = 122
        optional PReLUParameter prelu_param = 131
        optional ReLUParameter relu_param = 123
        optional ReshapeParameter reshape_param = 133
        optional ScaleParameter scale_param = 142
        optional SigmoidParameter sigmoid_param = 124
        optional SoftmaxParameter softmax_param = 125
        optional SliceParameter slice_param = 126
        optional TanHParameter tanh_param = 127
        optional ThresholdParameter threshold_param = 128
        optional TileParameter tile_param = 138""",
    "V1LayerParameter": """
        repeated string bottom = 2
        repeated string top = 3
        optional string name = 4
        repeated NetStateRule include = 32
        repeated NetStateRule exclude = 33
        optional LayerType type = 5
        repeated BlobProto blobs = 6
        repeated float blobs_lr = 7
        repeated float weight_decay = 8
        repeated float loss_weight = 35
        optional ConcatParameter concat_param = 9
        optional ConvolutionParameter convolution_param = 10
        optional DropoutParameter dropout_param = 12
        optional EltwiseParameter eltwise_param = 24
        optional ExpParameter exp_param = 41
        optional InnerProductParameter inner_product_param = 17
        optional LRNParameter lrn_param = 18
        optional PoolingParameter pooling_param = 19
        optional PowerParameter power_param = 21
        optional ReLUParameter relu_param = 30
        optional SigmoidParameter sigmoid_param = 38
        optional SoftmaxParameter softmax_param = 39
        optional SliceParameter slice_param = 31
        optional TanHParameter tanh_param = 37
        optional ThresholdParameter threshold_param = 25""",
    "BatchNormParameter": """
        optional bool use_global_stats = 1
        optional float moving_average_fraction = 2 [default = 0.999]
        optional float eps = 3 [default = 1e-5]""",
    "BiasParameter": """
        optional int64 axis = 1 [default = 1]
        optional int64 num_axes = 2 [default = 1]
        optional FillerParameter filler = 3""",
    "ConcatParameter": """
        optional int64 axis = 2 [default = 1]
        optional uint32 concat_dim = 1 [default = 1]""",
    "ConvolutionParameter": """
        optional uint32 num_output = 1
        optional bool bias_term = 2 [default = true]
        repeated uint32 pad = 3
        repeated uint32 kernel_size = 4
        repeated uint32 stride = 6
        repeated uint32 dilation = 18
        optional uint32 pad_h = 9
        optional uint32 pad_w = 10
        optional uint32 kernel_h = 11
        optional uint32 kernel_w = 12
        optional uint32 stride_h = 13
        optional uint32 stride_w = 14
        optional uint32 group = 5 [default = 1]
        optional FillerParameter weight_filler = 7
        optional FillerParameter bias_filler = 8
        optional Engine engine = 15
        optional int32 axis = 16 [default = 1]
        optional bool force_nd_im2col = 17""",
    "CropParameter": """
        optional int32 axis = 1 [default = 2]
        repeated uint32 offset = 2""",
    "DropoutParameter": """
        optional float dropout_ratio = 1 [default = 0.5]
        optional bool scale_train = 2 [default = true]""",
    "EltwiseParameter": """
        optional EltwiseOp operation = 1 [default = SUM]
        repeated float coeff = 2
        optional bool stable_prod_grad = 3 [default = true]""",
    "ELUParameter": "optional float alpha = 1 [default = 1]",
    "ExpParameter": """
        optional float base = 1 [default = -1]
        optional float scale = 2 [default = 1]
        optional float shift = 3""",
    "FlattenParameter": """
        optional int32 axis = 1 [default = 1]
        optional int32 end_axis = 2 [default = -1]""",
    "InnerProductParameter": """
        optional uint32 num_output = 1
        optional bool bias_term = 2 [default = true]
        optional FillerParameter weight_filler = 3
        optional FillerParameter bias_filler = 4
        optional int32 axis = 5 [default = 1]
        optional bool transpose = 6""",
    "InputParameter": "repeated BlobShape shape = 1",
    "LogParameter": """
        optional float base = 1 [default = -1]
        optional float scale = 2 [default = 1]
        optional float shift = 3""",
    "LRNParameter": """
        optional uint32 local_size = 1 [default = 5]
        optional float alpha = 2 [default = 1]
        optional float beta = 3 [default = 0.75]
        optional NormRegion norm_region = 4
        optional float k = 5 [default = 1]
        optional Engine engine = 6""",
    "PermuteParameter": "repeated uint32 order = 1",
    "PoolingParameter": """
        optional PoolMethod pool = 1 [default = MAX]
        repeated uint32 pad = 4
        optional uint32 pad_h = 9
        optional uint32 pad_w = 10
        repeated uint32 kernel_size = 2
        optional uint32 kernel_h = 5
        optional uint32 kernel_w = 6
        repeated uint32 stride = 3
        optional uint32 stride_h = 7
        optional uint32 stride_w = 8
        optional Engine engine = 11
        optional bool global_pooling = 12""",
    "PowerParameter": """
        optional float power = 1 [default = 1]
        optional float scale = 2 [default = 1]
        optional float shift = 3""",
    "PReLUParameter": """
        optional FillerParameter filler = 1
        optional bool channel_shared = 2""",
    "ReLUParameter": """
        optional float negative_slope = 1
        optional Engine engine = 2""",
    "ReshapeParameter": """
        optional BlobShape shape = 1
        optional int32 axis = 2
        optional int32 num_axes = 3 [default = -1]""",
    "ScaleParameter": """
        optional int32 axis = 1 [default = 1]
        optional int32 num_axes = 2 [default = 1]
        optional FillerParameter filler = 3
        optional bool bias_term = 4
        optional FillerParameter bias_filler = 5""",
    "SigmoidParameter": "optional Engine engine = 1",
    "SoftmaxParameter": """
        optional Engine engine = 1
        optional int32 axis = 2 [default = 1]""",
    "SliceParameter": """
        optional int32 axis = 3 [default = 1]
        repeated uint32 slice_point = 2
        optional uint32 slice_dim = 1 [default = 1]""",
    "TanHParameter": "optional Engine engine = 1",
    "ThresholdParameter": "optional float threshold = 1",
    "TileParameter": """
        optional int32 axis = 1 [default = 1]
        optional int32 tiles = 2""",
}

_CLASSES: Dict[str, Any] = {}


def messages() -> Dict[str, Any]:
    """The message classes by name (NetParameter, LayerParameter, BlobProto...), built on first use in a
    descriptor pool of their own (so they never clash with a generated caffe_pb2 the process may hold)."""
    if not _CLASSES:
        _CLASSES.update(build_messages("caffe", _ENUMS, _MESSAGES))
    return _CLASSES
