"""A numpy interpreter for graphs: the oracle that passes and the importer are tested against.

It runs every node with the op's numpy definition (``tether.graph.ops``), including fused nodes (their body
is interpreted in order), so a pass is correct when ``run(pass(g)) == run(g)``.
"""
from __future__ import annotations

from typing import Dict, List, Mapping

import numpy as np

from tether.graph import ops
from tether.graph.ir import Graph, Node


def run_nodes(nodes: List[Node], env: Dict[str, np.ndarray]) -> None:
    for node in nodes:
        if node.op == "fused":
            inner = {name: env[src] for name, src in zip(node.body_params(), node.inputs)}
            run_nodes(node.body(), inner)
            for out, src in zip(node.outputs, node.attrs["results"]):
                env[out] = inner[src]
            continue
        outs = ops.evaluate(node.op, node.attrs, [env[i] for i in node.inputs])
        for name, value in zip(node.outputs, outs):
            env[name] = value


def run(graph: Graph, params: Mapping[str, np.ndarray], inputs: Mapping[str, np.ndarray]) -> List[np.ndarray]:
    env: Dict[str, np.ndarray] = dict(params)
    for name in graph.inputs:
        t = graph.types[name]
        env[name] = np.asarray(inputs[name], dtype=t.dtype).reshape(t.shape)
    run_nodes(graph.nodes, env)
    return [env[o] for o in graph.outputs]
