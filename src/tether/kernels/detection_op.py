"""The detection graph ops, run as numpy on the device: ``detection_postprocess`` and ``nms_padded``.

``detection_postprocess``: SSD box decoding and non-max suppression into fixed-size outputs
(TFLite's DETECTION_POSTPROCESS). It is sequential, data-dependent work on a few thousand boxes, so it has no
kernel: the device runs it as numpy between kernels (``tether_rpc/detection_ops.py``, the function the host's
constant folding and reference interpreter call too).

Inputs: box encodings (1, N, >=4), class scores (1, N, C + offset), anchors (N, 4). Attributes: max_detections,
max_classes_per_detection, detections_per_class, use_regular_nms, nms_score_threshold, nms_iou_threshold,
num_classes, y_scale, x_scale, h_scale, w_scale. Outputs (float32, static shapes, padded with zeros): boxes
(1, M, 4), classes (1, M), scores (1, M), count (1,), with M = max_detections * max_classes_per_detection.

``nms_padded``: single-class (soft) NMS with outputs of a fixed size (TFLite's NON_MAX_SUPPRESSION_V4/V5).
Inputs: boxes (N, 4) as two diagonal corners, scores (N,), the IoU and score thresholds (scalars). Attributes:
max_output_size, soft_nms_sigma. Outputs: indices (max_output_size,) int32 and their scores, zero-padded, and the
count (a scalar int32).
"""
from __future__ import annotations

from typing import Dict

from tether.graph.ir import TensorType
from tether.kernels.registry import DeviceNumpy, OpDef, Strategy


def _infer(attrs, boxes, scores, anchors):
    m = int(attrs["max_detections"]) * int(attrs["max_classes_per_detection"])
    return [TensorType((1, m, 4), "float32"), TensorType((1, m), "float32"), TensorType((1, m), "float32"),
            TensorType((1,), "float32")]


def _nms_infer(attrs, boxes, scores, iou, score):
    m = int(attrs["max_output_size"])
    return [TensorType((m,), "int32"), TensorType((m,), "float32"), TensorType((), "int32")]


def _numpy(name: str):
    def ref(attrs, *arrays):
        from tether_rpc import detection_ops
        return getattr(detection_ops, name)(attrs, *arrays)
    return ref


DEFINITIONS: Dict[str, OpDef] = {
    "detection_postprocess": OpDef("detection_postprocess", "numpy", _infer, _numpy("detection_postprocess")),
    "nms_padded": OpDef("nms_padded", "numpy", _nms_infer, _numpy("nms_padded")),
}
CPU_STRATEGIES: Dict[str, Strategy] = {name: DeviceNumpy() for name in DEFINITIONS}
