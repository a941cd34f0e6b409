"""Constant folding: a node whose inputs are all constants is evaluated once, at compile time, with its numpy
definition, and its outputs become params."""
from __future__ import annotations

import logging
from typing import Dict, Tuple

import numpy as np

from tether.graph import op_info
from tether.graph.ir import Graph

log = logging.getLogger(__name__)


def constant_fold(graph: Graph, params: Dict[str, np.ndarray]) -> Tuple[Graph, Dict[str, np.ndarray]]:
    graph = graph.copy()
    params = dict(params)
    kept = []
    folded = 0
    for node in graph.nodes:
        if node.op != "fused" and all(i in params for i in node.inputs):
            values = op_info.evaluate(node.op, node.attrs, [params[i] for i in node.inputs])
            for name, value in zip(node.outputs, values):
                params[name] = value
            folded += 1
            continue
        kept.append(node)
    graph.nodes = kept
    log.debug("constant_fold: folded %d nodes", folded)
    return graph, params
