"""Graph passes. Each is ``pass_(graph, params) -> (graph, params)``, pure (inputs are not modified) and testable
alone; ``optimize`` runs the pipeline of an opt level (``PIPELINES``), and ``str(graph)`` prints the result.

The levels, each written out in full below:
- 0: ``fuse_qdq``, then constant folding and DCE. Even level 0 folds constants, since kernels never compute
  compile-time constants at run time; and it fuses the int8 QDQ groups, since that decides the rounding
  (onnxruntime's), not only the speed.
- 1: adds the int8 kernels (dot-product convs, channels-last activations, exact float32 products), batch-norm
  folding, zero pads into float convs (then folding and DCE again) and concats as views.
- 2: adds fusion: identity reshapes are dropped first, then elementwise chains join their producers.
- 3 (the default): adds ``fuse_prologues``, and ``build_graph`` runs batch-1 convs as GEMMs.

``tether compile --print-passes -O N`` prints a level's pipeline with ``SUMMARIES``.
"""
from __future__ import annotations

import logging
from typing import Callable, Dict, List, Tuple

import numpy as np

from tether.graph.ir import Graph
from tether.graph.passes.concat_views import concat_views, is_concat_view, view_layout
from tether.graph.passes.constant_fold import constant_fold
from tether.graph.passes.dce import dce
from tether.graph.passes.float_layout import float_channels_last
from tether.graph.passes.fold_batchnorm import fold_batchnorm
from tether.graph.passes.fuse import fuse, fuse_prologues
from tether.graph.passes.half_precision import HALF_OPS, half_precision
from tether.graph.passes.identity_reshape import drop_identity_reshapes, lift_over_unit_reshapes
from tether.graph.passes.int8_layout import int8_channels_last
from tether.graph.passes.pad_into_conv import fold_pads
from tether.graph.passes.memory_plan import MemoryPlan, needs_kernel, plan_memory
from tether.graph.passes.quantize import fuse_qdq
from tether.graph.passes.quantize_dot import int8_dot_convs
from tether.graph.passes.quantize_float import exact_float_products

log = logging.getLogger(__name__)

Pass = Callable[[Graph, Dict[str, np.ndarray]], Tuple[Graph, Dict[str, np.ndarray]]]

# opt_level -> passes, in order. Why this order:
# - fuse_qdq first: the QDQ form's DQ -> op -> Q groups must become integer kernels before constant folding
#   dequantizes their int8 weights.
# - int8_dot_convs, then int8_channels_last (which rewrites the kernels int8_dot_convs makes), then
#   exact_float_products (which takes what they leave: grouped/depthwise convs, dense), all after the first fold.
# - lift_over_unit_reshapes, then drop_identity_reshapes, right before fuse: such reshapes split conv1d ->
#   activation and dense -> bias add.
# - float_channels_last right before fuse (level 3: its dense kernels take prepacked weights), after the reshape
#   passes, which would move its elementwise ops across the views it makes.
# - concat_views after fuse: it splits fused groups headed by a concat it makes free.
# - fuse_prologues last and only at level 3, where batch-1 convs run as GEMMs that read their input once.
PIPELINES: Dict[int, List[Pass]] = {
    0: [fuse_qdq, constant_fold, dce],
    1: [fuse_qdq, constant_fold, dce,
        int8_dot_convs, int8_channels_last, exact_float_products,
        fold_batchnorm, fold_pads, constant_fold, dce,
        concat_views],
    2: [fuse_qdq, constant_fold, dce,
        int8_dot_convs, int8_channels_last, exact_float_products,
        fold_batchnorm, fold_pads, constant_fold, dce,
        lift_over_unit_reshapes, drop_identity_reshapes, fuse, concat_views],
    3: [fuse_qdq, constant_fold, dce,
        int8_dot_convs, int8_channels_last, exact_float_products,
        fold_batchnorm, fold_pads, constant_fold, dce,
        lift_over_unit_reshapes, drop_identity_reshapes, float_channels_last, fuse, concat_views, fuse_prologues],
}

# pass name -> what it does, in one line (``tether compile --print-passes``; docs/graph.md has the long form)
SUMMARIES: Dict[str, str] = {
    "fuse_qdq": "QDQ groups (dequantize -> op -> quantize) become integer kernels",
    "constant_fold": "evaluate nodes whose inputs are all constants",
    "dce": "drop nodes that reach no output, and unused params",
    "int8_dot_convs": "int8 convs run on the dot-product kernels",
    "int8_channels_last": "int8 activations stay channels last between int8 kernels",
    "exact_float_products": "integer products whose sums fit float32 exactly run as fp32 kernels",
    "fold_batchnorm": "batch norm becomes per-channel mul+add, folded into conv weights",
    "fold_pads": "a zero pad of a float conv's input goes into the conv's own padding",
    "lift_over_unit_reshapes": "elementwise ops after a reshape that drops a unit axis run before it",
    "drop_identity_reshapes": "drop reshapes that keep their input's shape",
    "float_channels_last": "float activations stay channels last through depthwise-separable blocks",
    "fuse": "elementwise chains join their producer's kernel",
    "concat_views": "concats that can be views of their inputs need no kernel",
    "fuse_prologues": "an elementwise chain read only by a batch-1 conv joins that conv's kernel",
    "half_precision": "float32 convs, matmuls and elementwise ops compute in float16 (--precision fp16)",
}


def pipeline(opt_level: int, precision: str = "fp32") -> List[Pass]:
    """The passes ``optimize`` runs at ``opt_level`` (clamped to 0..3), in order. ``precision="fp16"`` adds
    ``half_precision`` after the last dce before fusion: the weights are rounded once they are folded, and its
    casts fuse like any elementwise op."""
    passes = PIPELINES[max(0, min(3, opt_level))]
    if precision != "fp16":
        return passes
    at = max(i for i, p in enumerate(passes) if p is dce) + 1
    return passes[:at] + [half_precision] + passes[at:]


def optimize(graph: Graph, params: Dict[str, np.ndarray], opt_level: int = 3,
             precision: str = "fp32") -> Tuple[Graph, Dict[str, np.ndarray]]:
    for p in pipeline(opt_level, precision):
        graph, params = p(graph, params)
        log.debug("after %s:\n%s", p.__name__, graph)
    return graph, params


__all__ = ["concat_views", "is_concat_view", "view_layout", "constant_fold", "dce", "fold_batchnorm", "fold_pads",
           "fuse", "fuse_prologues", "plan_memory", "MemoryPlan", "needs_kernel", "optimize", "pipeline", "PIPELINES",
           "SUMMARIES", "fuse_qdq", "exact_float_products", "int8_dot_convs", "int8_channels_last",
           "float_channels_last", "drop_identity_reshapes", "lift_over_unit_reshapes", "half_precision", "HALF_OPS"]
