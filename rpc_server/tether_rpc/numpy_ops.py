"""The ops a graph runs as numpy on the device, between its compiled kernels: the ones whose output shape depends
on the values (NonZero, Compress, Unique, NonMaxSuppression, TopK with a run-time k), the ops that read such values
(dynamic_ops.py) and Det (LU-based, no kernel).

A graph JSON node ``{"numpy": op, "attrs": {...}, "inputs": [...], "outputs": [...]}`` (version 3, docs/graph.md)
calls ``OPS[op](attrs, *arrays)``, which returns the output arrays. The host compiler uses these same functions as
the ops' numpy meaning (constant folding), so the device and the host agree by construction. Device code: stdlib +
numpy 1.19, Python 3.9.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List

import numpy as np

from . import dynamic_ops
from .detection_ops import detection_postprocess, nms_padded


def _nonzero(attrs: Dict[str, Any], x: np.ndarray) -> List[np.ndarray]:
    if x.ndim == 0:
        x = x.reshape(1)
    return [np.array(np.nonzero(x), dtype=np.int64).reshape(x.ndim, -1)]


def _compress(attrs: Dict[str, Any], x: np.ndarray, cond: np.ndarray) -> List[np.ndarray]:
    cond = cond.reshape(-1).astype(bool)
    axis = attrs.get("axis")
    if axis is None:
        flat = x.reshape(-1)
        return [flat[:cond.size][cond[:flat.size]]]
    n = x.shape[axis]
    return [np.compress(cond[:n], x, axis=axis)]


def _unique(attrs: Dict[str, Any], x: np.ndarray) -> List[np.ndarray]:
    axis = attrs.get("axis")
    if axis is None:
        y, first, inverse, counts = np.unique(x.reshape(-1), return_index=True, return_inverse=True,
                                              return_counts=True)
    else:
        y, first, inverse, counts = np.unique(x, return_index=True, return_inverse=True, return_counts=True,
                                              axis=axis)
    inverse = inverse.reshape(-1)
    if not attrs.get("sorted", 1):
        # first-occurrence order: renumber the unique values by where they first appear
        order = np.argsort(first, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(order.size)
        first, counts, inverse = first[order], counts[order], rank[inverse]
        y = x.reshape(-1)[first] if axis is None else np.take(x, first, axis=axis)
    return [y, first.astype(np.int64), inverse.astype(np.int64), counts.astype(np.int64)]


def _corners(boxes: np.ndarray, center_point_box: int) -> np.ndarray:
    """(n, 4) boxes -> (n, 4) as (y_min, x_min, y_max, x_max)."""
    b = boxes.astype(np.float64)
    if center_point_box:
        xc, yc, w, h = b[:, 0], b[:, 1], b[:, 2] / 2, b[:, 3] / 2
        return np.stack([yc - h, xc - w, yc + h, xc + w], axis=1)
    return np.stack([np.minimum(b[:, 0], b[:, 2]), np.minimum(b[:, 1], b[:, 3]),
                     np.maximum(b[:, 0], b[:, 2]), np.maximum(b[:, 1], b[:, 3])], axis=1)


def _iou_above(c: np.ndarray, i: int, js: np.ndarray, threshold: float) -> bool:
    """Whether box i overlaps any of boxes js by more than threshold (ONNX's suppress_by_iou)."""
    if js.size == 0:
        return False
    ih = np.minimum(c[i, 2], c[js, 2]) - np.maximum(c[i, 0], c[js, 0])
    iw = np.minimum(c[i, 3], c[js, 3]) - np.maximum(c[i, 1], c[js, 1])
    inter = np.where((ih > 0) & (iw > 0), ih * iw, 0.0)
    area_i = (c[i, 2] - c[i, 0]) * (c[i, 3] - c[i, 1])
    area_j = (c[js, 2] - c[js, 0]) * (c[js, 3] - c[js, 1])
    union = area_i + area_j - inter
    ok = (inter > 0) & (area_i > 0) & (area_j > 0) & (union > 0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return bool(np.any(ok & (inter / np.where(ok, union, 1.0) > threshold)))


def _non_max_suppression(attrs: Dict[str, Any], boxes: np.ndarray, scores: np.ndarray, max_out: np.ndarray,
                         iou: np.ndarray, score: np.ndarray) -> List[np.ndarray]:
    """ONNX NonMaxSuppression: per batch and class, greedy by descending score (ties: the lower box index)."""
    limit = max(int(max_out.reshape(-1)[0]), 0) if max_out.size else 0
    iou_t = float(iou.reshape(-1)[0]) if iou.size else 0.0
    use_score = bool(attrs.get("has_score_threshold", 0)) and score.size > 0
    score_t = float(score.reshape(-1)[0]) if use_score else 0.0
    out = []
    for b in range(boxes.shape[0]):
        corners = _corners(boxes[b], int(attrs.get("center_point_box", 0)))
        for k in range(scores.shape[1]):
            s = scores[b, k]
            cand = np.nonzero(s > score_t)[0] if use_score else np.arange(s.size)
            cand = cand[np.argsort(-s[cand].astype(np.float64), kind="stable")]
            chosen: List[int] = []
            for i in cand:
                if len(chosen) >= limit:
                    break
                if not _iou_above(corners, int(i), np.asarray(chosen, dtype=np.int64), iou_t):
                    chosen.append(int(i))
                    out.append((b, k, int(i)))
    return [np.asarray(out, dtype=np.int64).reshape(-1, 3)]


def _topk(attrs: Dict[str, Any], x: np.ndarray, k: np.ndarray) -> List[np.ndarray]:
    """TopK with a run-time k: stable sort, so ties keep the lower index first (as onnxruntime)."""
    axis = int(attrs["axis"])
    kk = int(k.reshape(-1)[0])
    if not 0 <= kk <= x.shape[axis]:
        raise ValueError("TopK k=%d for an axis of %d" % (kk, x.shape[axis]))
    key = x.astype(np.float64) if x.dtype.kind == "f" else x.astype(np.int64)
    if attrs.get("largest", 1):
        key = -key if key.dtype.kind == "f" else ~key
    order = np.take(np.argsort(key, axis=axis, kind="stable"), np.arange(kk), axis=axis)
    return [np.take_along_axis(x, order, axis=axis), order.astype(np.int64)]


def _det(attrs: Dict[str, Any], x: np.ndarray) -> List[np.ndarray]:
    return [np.asarray(np.linalg.det(x), dtype=x.dtype)]


OPS: Dict[str, Callable[..., List[np.ndarray]]] = {
    "nonzero": _nonzero, "compress": _compress, "unique": _unique, "non_max_suppression": _non_max_suppression,
    "det": _det, "topk": _topk, "detection_postprocess": detection_postprocess,
    "nms_padded": nms_padded,
}
# the post-processing of data-dependent values (Cast, Transpose, Slice, Gather, arithmetic, ...), in their own module
for _name, _fn in dynamic_ops.OPS.items():
    if _name in OPS:
        raise ValueError("numpy op %r is defined twice" % _name)
    OPS[_name] = _fn


def bind_node(node: Dict[str, Any], entries: List[np.ndarray], dynamic: Dict[int, np.ndarray]) -> Callable[[], None]:
    """The call that runs a graph JSON numpy node: reads its input entries (a data-dependent one from ``dynamic``,
    entry id -> the array the last run produced), runs the op, and stores each output: a data-dependent output
    in ``dynamic`` (its entry's shape bounds it), a static one into its entry. The JSON is untrusted: a bad node
    raises ValueError here, a result that breaks its bound raises ValueError when it runs."""
    op = node["numpy"]
    if op not in OPS:
        raise ValueError("graph node %r runs numpy op %.40r; this runtime has %s"
                         % (node.get("name"), op, ", ".join(sorted(OPS))))
    fn = OPS[op]
    attrs = node.get("attrs") or {}
    if not isinstance(attrs, dict):
        raise ValueError("graph node %r: attrs must be an object" % node.get("name"))
    inputs = [int(i) for i in node["inputs"]]
    outputs = [int(i) for i in node["outputs"]]
    for i in inputs + outputs:
        if not 0 <= i < len(entries):
            raise ValueError("graph node %r names entry %d of %d" % (node.get("name"), i, len(entries)))
    name = node.get("name")

    def call() -> None:
        args = [dynamic[i] if i in dynamic else entries[i] for i in inputs]
        results = fn(attrs, *args)
        for i, r in zip(outputs, results):
            bound = entries[i]
            r = np.asarray(r)
            if i in dynamic:
                if r.ndim != bound.ndim or any(d > b for d, b in zip(r.shape, bound.shape)):
                    raise ValueError("numpy node %r: output of shape %s exceeds its bound %s"
                                     % (name, r.shape, bound.shape))
                dynamic[i] = np.asarray(r, dtype=bound.dtype, order="C")   # a 0-d result stays 0-d
            else:
                if r.size != bound.size:
                    raise ValueError("numpy node %r: output of shape %s, the graph says %s"
                                     % (name, r.shape, bound.shape))
                np.copyto(bound, r.reshape(bound.shape), casting="unsafe")
    return call
