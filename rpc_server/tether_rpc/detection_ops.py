"""SSD detection post-processing as numpy (TFLite's DETECTION_POSTPROCESS custom op): decode box encodings
against anchors, then pick detections by non-max suppression, into outputs of a fixed size.

Inputs: box encodings (1, boxes, >= 4) as (y, x, h, w) relative to anchors (boxes, 4) given as (y center,
x center, h, w); class scores (1, boxes, classes + label offset), the offset being 1 when column 0 is a
background class. Outputs (all float32): boxes (1, n, 4) as (y_min, x_min, y_max, x_max), classes (1, n),
scores (1, n) and the count (1,), with n = max_detections * max_classes_per_detection; rows past the count
are zero.

Two selections, as LiteRT runs them:
- fast (``use_regular_nms`` false): each box competes once, with its best class score; the kept boxes list
  their top ``max_classes_per_detection`` classes, each in its own row of the box's block;
- regular: NMS per class (at most ``detections_per_class`` each), then the best ``max_detections`` over all
  classes.
NMS keeps scores >= the score threshold, visits them by decreasing score (ties: the lower box first) and drops a
box whose IoU with a kept one is above the IoU threshold. The arithmetic follows LiteRT's: decoding in double
rounded to float32, IoU in float32. Device code: stdlib + numpy 1.19, Python 3.9.
"""
from __future__ import annotations

from typing import Any, Dict, List

import numpy as np


def decode_boxes(enc: np.ndarray, anchors: np.ndarray, scales: List[float]) -> np.ndarray:
    """(boxes, >=4) encodings and (boxes, 4) anchors -> (boxes, 4) corners (y_min, x_min, y_max, x_max)."""
    e = enc[:, :4].astype(np.float64)
    a = anchors.astype(np.float32).astype(np.float64)
    ys, xs, hs, ws = (float(np.float32(s)) for s in scales)
    yc = (e[:, 0] / ys * a[:, 2] + a[:, 0]).astype(np.float32)
    xc = (e[:, 1] / xs * a[:, 3] + a[:, 1]).astype(np.float32)
    half_h = (0.5 * np.exp(e[:, 2] / hs) * a[:, 2]).astype(np.float32)
    half_w = (0.5 * np.exp(e[:, 3] / ws) * a[:, 3]).astype(np.float32)
    return np.stack([yc - half_h, xc - half_w, yc + half_h, xc + half_w], axis=1).astype(np.float32)


def _iou(boxes: np.ndarray, i: int, js: np.ndarray) -> np.ndarray:
    """IoU of box i with each of boxes js, in float32; 0 where either box has no area."""
    bi, bj = boxes[i], boxes[js]
    area_i = (bi[2] - bi[0]) * (bi[3] - bi[1])
    area_j = (bj[:, 2] - bj[:, 0]) * (bj[:, 3] - bj[:, 1])
    ih = np.maximum(np.minimum(bi[2], bj[:, 2]) - np.maximum(bi[0], bj[:, 0]), np.float32(0))
    iw = np.maximum(np.minimum(bi[3], bj[:, 3]) - np.maximum(bi[1], bj[:, 1]), np.float32(0))
    inter = (ih * iw).astype(np.float32)
    union = (area_i + area_j - inter).astype(np.float32)
    ok = (area_i > 0) & (area_j > 0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(ok, inter / np.where(ok, union, np.float32(1)), np.float32(0)).astype(np.float32)


def nms_single_class(boxes: np.ndarray, scores: np.ndarray, limit: int, score_threshold: float,
                     iou_threshold: float) -> List[int]:
    """Indices of the boxes NMS keeps for one score column, best first, at most ``limit``."""
    keep = np.nonzero(scores >= np.float32(score_threshold))[0]
    order = keep[np.argsort(-scores[keep].astype(np.float64), kind="stable")]
    active = np.ones(order.size, dtype=bool)
    selected: List[int] = []
    for pos in range(order.size):
        if len(selected) >= limit:
            break
        if not active[pos]:
            continue
        i = int(order[pos])
        selected.append(i)
        rest = np.nonzero(active[pos + 1:])[0] + pos + 1
        if rest.size:
            active[rest[_iou(boxes, i, order[rest]) > np.float32(iou_threshold)]] = False
    return selected


def _top_classes(row: np.ndarray, k: int) -> np.ndarray:
    """The k best class columns of one box, by decreasing score (ties: the lower column first)."""
    return np.argsort(-row.astype(np.float64), kind="stable")[:k]


def detection_postprocess(attrs: Dict[str, Any], box_encodings: np.ndarray, class_scores: np.ndarray,
                          anchors: np.ndarray) -> List[np.ndarray]:
    max_det = int(attrs["max_detections"])
    per_det = int(attrs["max_classes_per_detection"])
    num_classes = int(attrs["num_classes"])
    score_t, iou_t = float(attrs["nms_score_threshold"]), float(attrs["nms_iou_threshold"])
    if box_encodings.shape[0] != 1 or class_scores.shape[0] != 1:
        raise ValueError("DetectionPostProcess runs on a batch of 1, not %d" % box_encodings.shape[0])
    offset = class_scores.shape[2] - num_classes
    boxes = decode_boxes(box_encodings[0], anchors, [attrs["y_scale"], attrs["x_scale"], attrs["h_scale"],
                                                     attrs["w_scale"]])
    if np.any(boxes[:, 0] > boxes[:, 2]) or np.any(boxes[:, 1] > boxes[:, 3]):
        raise ValueError("DetectionPostProcess decoded a box with y_min > y_max or x_min > x_max")
    scores = class_scores[0, :, offset:].astype(np.float32)
    n = max_det * per_det
    out_boxes = np.zeros((n, 4), np.float32)
    out_classes = np.zeros((n,), np.float32)
    out_scores = np.zeros((n,), np.float32)
    if attrs.get("use_regular_nms"):
        found = []          # (score, box, class), best first
        for c in range(num_classes):
            for i in nms_single_class(boxes, scores[:, c], int(attrs["detections_per_class"]), score_t, iou_t):
                found.append((float(scores[i, c]), i, c))
        # the running merge keeps the best max_detections; a stable sort over class-major order matches it
        order = sorted(range(len(found)), key=lambda k: -found[k][0])[:max_det]
        for row, k in enumerate(order):
            _, i, c = found[k]
            out_boxes[row], out_classes[row], out_scores[row] = boxes[i], c, scores[i, c]
        count = len(order)
    else:
        per_box = min(per_det, num_classes)
        best = scores.max(axis=1) if scores.shape[1] else np.zeros((scores.shape[0],), np.float32)
        kept = nms_single_class(boxes, best, max_det, score_t, iou_t)
        for slot, i in enumerate(kept):
            for col, c in enumerate(_top_classes(scores[i], per_box)):
                row = per_det * slot + col
                out_boxes[row], out_classes[row], out_scores[row] = boxes[i], c, scores[i, c]
        count = len(kept)
    return [out_boxes[None], out_classes[None], out_scores[None], np.array([count], np.float32)]


def _corner_iou(boxes: np.ndarray, i: int, j: int) -> float:
    """IoU of two boxes given by any two diagonal corners (y1, x1, y2, x2), in float32; 0 without area."""
    a, b = boxes[i], boxes[j]
    ay0, ay1, ax0, ax1 = min(a[0], a[2]), max(a[0], a[2]), min(a[1], a[3]), max(a[1], a[3])
    by0, by1, bx0, bx1 = min(b[0], b[2]), max(b[0], b[2]), min(b[1], b[3]), max(b[1], b[3])
    area_a, area_b = (ay1 - ay0) * (ax1 - ax0), (by1 - by0) * (bx1 - bx0)
    if area_a <= 0 or area_b <= 0:
        return 0.0
    inter = max(min(ay1, by1) - max(ay0, by0), np.float32(0)) * max(min(ax1, bx1) - max(ax0, bx0), np.float32(0))
    union = area_a + area_b - inter
    return 0.0 if union == 0 else float(np.float32(inter) / np.float32(union))


def nms_padded(attrs: Dict[str, Any], boxes: np.ndarray, scores: np.ndarray, iou: np.ndarray,
               score: np.ndarray) -> List[np.ndarray]:
    """TFLite's NON_MAX_SUPPRESSION_V4/V5 (TensorFlow's NonMaxSuppressionV5 with padding): greedy by decreasing
    score among scores above the threshold; a candidate is dropped by an IoU >= the threshold with a kept box, or,
    with ``soft_nms_sigma`` > 0, its score decays by exp(-0.5 iou^2 / sigma) per kept box and it returns to the
    queue. Outputs: the kept indices (int32) and their scores, zero-padded to ``max_output_size``, and the count."""
    import heapq

    limit = int(attrs["max_output_size"])
    boxes = boxes.reshape(-1, 4).astype(np.float32)
    scores = scores.reshape(-1).astype(np.float32)
    iou_t = float(np.float32(iou.reshape(-1)[0]))
    score_t = float(np.float32(score.reshape(-1)[0]))
    sigma = float(attrs.get("soft_nms_sigma", 0.0))
    scale = -0.5 / sigma if sigma > 0 else 0.0
    # (-score, index, suppress_begin): ties leave the lower index first
    heap = [(-float(scores[i]), i, 0) for i in range(scores.size) if scores[i] > score_t]
    heapq.heapify(heap)
    count = min(len(heap), limit)
    kept: List[int] = []
    kept_scores: List[float] = []
    while len(kept) < count and heap:
        neg, i, begin = heapq.heappop(heap)
        s = original = -neg
        hard = False
        for j in range(len(kept) - 1, begin - 1, -1):
            v = _corner_iou(boxes, i, kept[j])
            if v >= iou_t:
                hard = True
                break
            if sigma > 0:
                s = float(np.float32(s * np.exp(np.float32(scale * v * v))))
            if s <= score_t:
                break
        if hard:
            continue
        begin = len(kept)
        if s == original:
            kept.append(i)
            kept_scores.append(s)
        if s > score_t:
            # as LiteRT: a selected box goes back too, and its IoU of 1 with itself drops it when popped again
            heapq.heappush(heap, (-s, i, begin))
    indices = np.zeros((limit,), np.int32)
    out_scores = np.zeros((limit,), np.float32)
    indices[:len(kept)] = kept
    out_scores[:len(kept)] = kept_scores
    return [indices, out_scores, np.array(len(kept), np.int32)]
