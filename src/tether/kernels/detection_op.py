"""The ``detection_postprocess`` graph op: SSD box decoding and non-max suppression into fixed-size outputs
(TFLite's DETECTION_POSTPROCESS). It is sequential, data-dependent work on a few thousand boxes, so it has no
kernel: the device runs it as numpy between kernels (``tether_rpc/detection_ops.py``, the function the host's
constant folding and reference interpreter call too).

Inputs: box encodings (1, N, >=4), class scores (1, N, C + offset), anchors (N, 4). Attributes: max_detections,
max_classes_per_detection, detections_per_class, use_regular_nms, nms_score_threshold, nms_iou_threshold,
num_classes, y_scale, x_scale, h_scale, w_scale. Outputs (float32, static shapes, padded with zeros): boxes
(1, M, 4), classes (1, M), scores (1, M), count (1,), with M = max_detections * max_classes_per_detection.
"""
from __future__ import annotations

from typing import Dict

from tether.graph.ir import TensorType
from tether.kernels.registry import DeviceNumpy, OpDef, Strategy


def _infer(attrs, boxes, scores, anchors):
    m = int(attrs["max_detections"]) * int(attrs["max_classes_per_detection"])
    return [TensorType((1, m, 4), "float32"), TensorType((1, m), "float32"), TensorType((1, m), "float32"),
            TensorType((1,), "float32")]


def _ref(attrs, *arrays):
    from tether_rpc.detection_ops import detection_postprocess
    return detection_postprocess(attrs, *arrays)


DEFINITIONS: Dict[str, OpDef] = {"detection_postprocess": OpDef("detection_postprocess", "numpy", _infer, _ref)}
CPU_STRATEGIES: Dict[str, Strategy] = {"detection_postprocess": DeviceNumpy()}
