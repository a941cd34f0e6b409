"""A numpy interpreter for graphs: the oracle that passes and the importer are tested against.

It runs every node with the op's numpy definition (the op table, ``tether.kernels``), including fused nodes (their body
is interpreted in order), so a pass is correct when ``run(pass(g)) == run(g)``.
"""
from __future__ import annotations

from typing import Dict, List, Mapping

import numpy as np

from tether.graph.ir import Graph, Node
from tether.kernels.table import OPS


def run_nodes(nodes: List[Node], env: Dict[str, np.ndarray]) -> None:
    OPS.run_nodes(nodes, env)


def run(graph: Graph, params: Mapping[str, np.ndarray], inputs: Mapping[str, np.ndarray]) -> List[np.ndarray]:
    env: Dict[str, np.ndarray] = dict(params)
    for name in graph.inputs:
        t = graph.types[name]
        env[name] = np.asarray(inputs[name], dtype=t.dtype).reshape(t.shape)
    run_nodes(graph.nodes, env)
    return [env[o] for o in graph.outputs]
