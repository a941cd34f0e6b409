"""Non-max suppression: NON_MAX_SUPPRESSION_V4/V5 and the SSD post-processing custom op
(``TFLite_Detection_PostProcess``). Their outputs have a fixed size, padded with zeros, which ONNX's
NonMaxSuppression (a list as long as what it keeps) cannot give, so both become ops of tether's own ONNX domain
(``tether.NonMaxSuppressionPadded``, ``tether.DetectionPostProcess``: frontend/onnx/detection.py), run as numpy on
the device. The post-processing op's parameters are the flexbuffer map in the operator's custom options.
"""
from __future__ import annotations

from typing import Any, Dict

from tether.errors import InvalidInput, UnsupportedOpError
from tether.frontend.tflite.table import ConverterTable

CONVERTERS = ConverterTable("tflite detection")

DETECTION_POSTPROCESS = "TFLite_Detection_PostProcess"
# flexbuffer key -> (kind, default; None: required), as LiteRT reads them
_POSTPROCESS_OPTIONS = {"max_detections": (int, None), "max_classes_per_detection": (int, None),
                        "detections_per_class": (int, 100), "use_regular_nms": (bool, False),
                        "nms_score_threshold": (float, None), "nms_iou_threshold": (float, None),
                        "num_classes": (int, None), "y_scale": (float, None), "x_scale": (float, None),
                        "h_scale": (float, None), "w_scale": (float, None)}


def _scalar(ctx, index: int, what: str) -> float:
    values = ctx.const(index)
    if values is None or values.size != 1:
        raise UnsupportedOpError("%s: its %s (tensor %d) must be a constant scalar" % (ctx.where(), what, index))
    return float(values.reshape(-1)[0])


@CONVERTERS.register("NON_MAX_SUPPRESSION_V4", "NON_MAX_SUPPRESSION_V5")
def _nms(ctx, op) -> None:
    boxes, scores, max_size, iou, score = op.inputs[:5]
    sigma = _scalar(ctx, op.inputs[5], "soft_nms_sigma") if op.op == "NON_MAX_SUPPRESSION_V5" else 0.0
    limit = int(_scalar(ctx, max_size, "max_output_size"))
    indices, kept_scores, count = ctx.emit(
        "NonMaxSuppressionPadded", [ctx.nhwc(boxes), ctx.nhwc(scores), ctx.nhwc(iou), ctx.nhwc(score)],
        outputs=3, domain="tether", max_output_size=limit, soft_nms_sigma=sigma)
    if op.op == "NON_MAX_SUPPRESSION_V5":
        for t, v in zip(op.outputs, (indices, kept_scores, count)):
            ctx.set_output(t, v)
    else:
        ctx.set_output(op.outputs[0], indices)
        ctx.set_output(op.outputs[1], count)


def postprocess_options(ctx, op) -> Dict[str, Any]:
    """The custom op's flexbuffer options, typed, with LiteRT's defaults."""
    try:
        values = op.custom_options_map()
    except ValueError as exc:
        raise InvalidInput("%s: %s" % (ctx.where(), exc)) from None
    out: Dict[str, Any] = {}
    for key, (kind, default) in _POSTPROCESS_OPTIONS.items():
        v = values.get(key)
        if v is None:
            if default is None:
                raise UnsupportedOpError("%s: %s without its %r option" % (ctx.where(), DETECTION_POSTPROCESS, key))
            v = default
        out[key] = kind(v)
    return out


@CONVERTERS.register(DETECTION_POSTPROCESS)
def _detection_postprocess(ctx, op) -> None:
    opts = postprocess_options(ctx, op)
    opts["use_regular_nms"] = int(opts["use_regular_nms"])
    outs = ctx.emit("DetectionPostProcess", [ctx.nhwc(i) for i in op.inputs[:3]], outputs=4, domain="tether",
                    **opts)
    for t, v in zip(op.outputs, outs):
        ctx.set_output(t, v)
