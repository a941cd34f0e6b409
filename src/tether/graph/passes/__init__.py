"""Graph passes. Each is ``pass_(graph, params) -> (graph, params)``, pure (inputs are not modified) and testable
alone; ``optimize`` runs the standard pipeline for an opt level, and ``str(graph)`` prints the result."""
from __future__ import annotations

import logging
from typing import Callable, Dict, List, Tuple

import numpy as np

from tether.graph.ir import Graph
from tether.graph.passes.concat_views import concat_views, is_concat_view, view_layout
from tether.graph.passes.constant_fold import constant_fold
from tether.graph.passes.dce import dce
from tether.graph.passes.fold_batchnorm import fold_batchnorm
from tether.graph.passes.fuse import fuse, fuse_prologues
from tether.graph.passes.memory_plan import MemoryPlan, needs_kernel, plan_memory

log = logging.getLogger(__name__)

Pass = Callable[[Graph, Dict[str, np.ndarray]], Tuple[Graph, Dict[str, np.ndarray]]]

# opt_level -> passes, in order. Level 0 still folds constants: kernels never take compile-time constants
# computed at run time. concat_views splits fused groups headed by a concat it makes free; fuse_prologues (level 3
# only, where batch-1 convs run as GEMMs that read their input once) then moves elementwise chains into the conv
# that reads them.
PIPELINES: Dict[int, List[Pass]] = {
    0: [constant_fold, dce],
    1: [constant_fold, dce, fold_batchnorm, constant_fold, dce, concat_views],
    2: [constant_fold, dce, fold_batchnorm, constant_fold, dce, fuse, concat_views],
    3: [constant_fold, dce, fold_batchnorm, constant_fold, dce, fuse, concat_views, fuse_prologues],
}


def optimize(graph: Graph, params: Dict[str, np.ndarray], opt_level: int = 3) -> Tuple[Graph, Dict[str, np.ndarray]]:
    for p in PIPELINES[max(0, min(3, opt_level))]:
        graph, params = p(graph, params)
        log.debug("after %s:\n%s", p.__name__, graph)
    return graph, params


__all__ = ["concat_views", "is_concat_view", "view_layout", "constant_fold", "dce", "fold_batchnorm", "fuse",
           "fuse_prologues", "plan_memory", "MemoryPlan", "needs_kernel", "optimize", "PIPELINES"]

# ---------------------------------------------------------------- int8 models (issue 12)
# The QDQ form's DQ -> op -> Q groups become integer kernels first, before constant folding dequantizes their
# int8 weights (passes/quantize.py); at every level, since it decides the rounding (onnxruntime's).
# Then (level >= 1, after folding) integer products whose sums provably fit float32's 24 bits run as the fp32
# kernels (passes/quantize_float.py).
from tether.graph.passes.quantize import fuse_qdq  # noqa: E402
from tether.graph.passes.quantize_float import exact_float_products  # noqa: E402

for _level, _passes in PIPELINES.items():
    _passes.insert(0, fuse_qdq)
    if _level >= 1:
        _passes.insert(_passes.index(dce) + 1, exact_float_products)
__all__ += ["fuse_qdq", "exact_float_products"]

# ---- int8 convs on the dot-product kernels (issue 12): before the exact-float32 pass, which takes what they leave
# (grouped/depthwise convs, dense)
from tether.graph.passes.quantize_dot import int8_dot_convs  # noqa: E402

for _level, _passes in PIPELINES.items():
    if _level >= 1:
        _passes.insert(_passes.index(exact_float_products), int8_dot_convs)
__all__ += ["int8_dot_convs"]

# ---- int8 activations channels last between int8 kernels (issue 12): right after int8_dot_convs, whose kernels it
# rewrites
from tether.graph.passes.int8_layout import int8_channels_last  # noqa: E402

for _level, _passes in PIPELINES.items():
    if _level >= 1:
        _passes.insert(_passes.index(int8_dot_convs) + 1, int8_channels_last)
__all__ += ["int8_channels_last"]

# ---- reshapes that keep their input's shape are dropped before fusion (they split dense -> bias add; issue 11)
from tether.graph.passes.identity_reshape import drop_identity_reshapes  # noqa: E402

for _level, _passes in PIPELINES.items():
    if fuse in _passes:
        _passes.insert(_passes.index(fuse), drop_identity_reshapes)
__all__ += ["drop_identity_reshapes"]
