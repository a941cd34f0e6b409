"""Dead-code elimination: drop nodes none of whose outputs reach a graph output, and params nobody reads."""
from __future__ import annotations

from typing import Dict, Tuple

import numpy as np

from tether.graph.ir import Graph


def dce(graph: Graph, params: Dict[str, np.ndarray]) -> Tuple[Graph, Dict[str, np.ndarray]]:
    graph = graph.copy()
    live = set(graph.outputs)
    kept = []
    for node in reversed(graph.nodes):
        if any(o in live for o in node.outputs):
            kept.append(node)
            live.update(node.inputs)
    graph.nodes = kept[::-1]
    defined = set(graph.inputs) | {o for n in graph.nodes for o in n.outputs}
    graph.types = {k: t for k, t in graph.types.items() if k in live or k in defined}
    return graph, {k: v for k, v in params.items() if k in live}
