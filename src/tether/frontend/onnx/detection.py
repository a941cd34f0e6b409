"""Converters of the ops in tether's own ONNX domain ("tether") that other frontends emit for what standard ONNX
cannot say well, non-max suppression into outputs of a fixed size, which ONNX's NonMaxSuppression (a list of
data-dependent length) cannot give:
- ``tether.DetectionPostProcess``: an SSD detector's box decoding and multi-class NMS (TFLite's
  DETECTION_POSTPROCESS);
- ``tether.NonMaxSuppressionPadded``: single-class (soft) NMS, indices and scores zero-padded to
  ``max_output_size``, and their count (TFLite's NON_MAX_SUPPRESSION_V4/V5, TensorFlow's NonMaxSuppressionV5).
Both run as numpy on the device (``kernels/detection_op.py``)."""
from __future__ import annotations

from tether.errors import UnsupportedOpError
from tether.frontend.onnx.importer import FLOATS, ConverterTable

CONVERTERS = ConverterTable(__name__)

#: attribute -> default (None: required), as LiteRT reads the op's options
DETECTION_ATTRS = {"max_detections": None, "max_classes_per_detection": None, "detections_per_class": 100,
                   "use_regular_nms": 0, "nms_score_threshold": None, "nms_iou_threshold": None,
                   "num_classes": None, "y_scale": None, "x_scale": None, "h_scale": None, "w_scale": None}


@CONVERTERS.register("tether.DetectionPostProcess")
def _detection_postprocess(im, node, ins, a):
    missing = [k for k, v in DETECTION_ATTRS.items() if v is None and k not in a]
    if missing:
        raise UnsupportedOpError("node %s: DetectionPostProcess lacks attribute(s) %s"
                                 % (node.name, ", ".join(missing)))
    attrs = {k: a.get(k, v) for k, v in DETECTION_ATTRS.items()}
    for k in ("max_detections", "max_classes_per_detection", "detections_per_class", "use_regular_nms",
              "num_classes"):
        attrs[k] = int(attrs[k])
    for k in ("nms_score_threshold", "nms_iou_threshold", "y_scale", "x_scale", "h_scale", "w_scale"):
        attrs[k] = float(attrs[k])
    if len(ins) != 3 or not all(ins):
        raise UnsupportedOpError("node %s: DetectionPostProcess takes 3 inputs (box encodings, class scores, "
                                 "anchors), not %d" % (node.name, len(ins)))
    for v in ins:
        if str(im.type(v).dtype) not in FLOATS + ("float16",):
            raise UnsupportedOpError("node %s: DetectionPostProcess on %s input %r (float inputs; dequantize "
                                     "first)" % (node.name, im.type(v).dtype, v))
    b, s, an = (im.type(v).shape for v in ins)
    n, c = attrs["num_classes"], s[2] if len(s) == 3 else -1
    if (len(b) != 3 or b[0] != 1 or b[2] < 4 or len(s) != 3 or s[:2] != b[:2] or len(an) != 2
            or an[0] != b[1] or an[1] != 4 or not n <= c <= n + 1):
        raise UnsupportedOpError("node %s: DetectionPostProcess box encodings %s, class scores %s, anchors %s for "
                                 "%d classes (expected (1, N, >=4), (1, N, classes [+ 1 background]), (N, 4))"
                                 % (node.name, b, s, an, n))
    if attrs["max_detections"] < 0 or attrs["max_classes_per_detection"] <= 0 or attrs["detections_per_class"] <= 0:
        raise UnsupportedOpError("node %s: DetectionPostProcess max_detections=%d, max_classes_per_detection=%d, "
                                 "detections_per_class=%d" % (node.name, attrs["max_detections"],
                                                              attrs["max_classes_per_detection"],
                                                              attrs["detections_per_class"]))
    if not 0.0 < attrs["nms_iou_threshold"] <= 1.0:
        raise UnsupportedOpError("node %s: DetectionPostProcess nms_iou_threshold=%g (in (0, 1])"
                                 % (node.name, attrs["nms_iou_threshold"]))
    ins = [v if str(im.type(v).dtype) == "float32" else im.emit("cast", [v], {"to": "float32"}) for v in ins]
    outs = [node.output[k] if k < len(node.output) and node.output[k] else im.fresh(node.name + "_unused")
            for k in range(4)]
    im.emit("detection_postprocess", ins, attrs, node.name, outs)


@CONVERTERS.register("tether.NonMaxSuppressionPadded")
def _nms_padded(im, node, ins, a):
    """Inputs: boxes (N, 4), scores (N,), iou_threshold, score_threshold (scalars); attributes max_output_size,
    soft_nms_sigma (0: hard NMS). Outputs: indices (int32), scores, count (int32 scalar)."""
    if "max_output_size" not in a or len(ins) != 4 or not all(ins):
        raise UnsupportedOpError("node %s: NonMaxSuppressionPadded takes boxes, scores, iou_threshold and "
                                 "score_threshold, and a max_output_size attribute" % node.name)
    b, sc = im.type(ins[0]).shape, im.type(ins[1]).shape
    if len(b) != 2 or b[1] != 4 or tuple(sc) != (b[0],):
        raise UnsupportedOpError("node %s: NonMaxSuppressionPadded boxes %s and scores %s (expected (N, 4) and "
                                 "(N,))" % (node.name, b, sc))
    for v in ins:
        if str(im.type(v).dtype) not in FLOATS + ("float16",):
            raise UnsupportedOpError("node %s: NonMaxSuppressionPadded on %s input %r (float inputs)"
                                     % (node.name, im.type(v).dtype, v))
    attrs = {"max_output_size": max(int(a["max_output_size"]), 0),
             "soft_nms_sigma": float(a.get("soft_nms_sigma", 0.0))}
    ins = [v if str(im.type(v).dtype) == "float32" else im.emit("cast", [v], {"to": "float32"}) for v in ins]
    outs = [node.output[k] if k < len(node.output) and node.output[k] else im.fresh(node.name + "_unused")
            for k in range(3)]
    im.emit("nms_padded", ins, attrs, node.name, outs)
