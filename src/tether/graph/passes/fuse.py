"""Operator fusion: elementwise chains merge into the node that produces their input.

A node whose op is ``elemwise`` joins the group of the producer of one of its inputs when
- that input is used only by this node and is not a graph output (so the intermediate never needs memory),
- the producer group's anchor is a ``complex`` op (conv2d, dense, pools ...) or elementwise,
- the node does not broadcast its fused input to a larger shape (the kernel's iteration space is the anchor's).
Each group of two or more nodes becomes one ``fused`` node placed where its last member was (every external
input is defined by then), so conv2d -> add(bias) -> relu is one kernel.
"""
from __future__ import annotations

from typing import Dict, List, Tuple

import numpy as np

from tether.graph import ops
from tether.graph.ir import Graph, Node

_ANCHORS = ("complex", "elemwise", "injective")


def fuse(graph: Graph, params: Dict[str, np.ndarray]) -> Tuple[Graph, Dict[str, np.ndarray]]:
    graph = graph.copy()
    consumers = graph.consumers()
    outputs = set(graph.outputs)
    group_of: Dict[int, int] = {}          # node index -> group id (the index of its anchor)
    members: Dict[int, List[int]] = {}
    producer_index = {o: k for k, n in enumerate(graph.nodes) for o in n.outputs}
    for k, node in enumerate(graph.nodes):
        group_of[k] = k
        members[k] = [k]
        if ops.pattern(node.op) != "elemwise" or len(node.outputs) != 1:
            continue
        out_shape = graph.types[node.outputs[0]].shape
        for v in node.inputs:
            if v in params or v not in producer_index:
                continue
            if len(consumers.get(v, [])) != 1 or v in outputs or graph.types[v].shape != out_shape:
                continue
            g = group_of[producer_index[v]]
            anchor = graph.nodes[g]
            if ops.pattern(anchor.op) not in _ANCHORS or len(anchor.outputs) != 1:
                continue
            # the group's last node must be the producer of v (a chain, no side outputs)
            if members[g][-1] != producer_index[v]:
                continue
            members[g].append(k)
            del members[k]
            group_of[k] = g
            break
    last_of = {ms[-1]: g for g, ms in members.items()}
    new_nodes: List[Node] = []
    for k, node in enumerate(graph.nodes):
        if k not in last_of:
            continue
        ms = members[last_of[k]]
        if len(ms) == 1:
            new_nodes.append(node)
            continue
        body = [graph.nodes[m] for m in ms]
        internal = {o for b in body for o in b.outputs}
        ext: List[str] = []
        for b in body:
            for i in b.inputs:
                if i not in internal and i not in ext:
                    ext.append(i)
        anchor = body[0]
        new_nodes.append(Node("fused", anchor.name, ext, list(body[-1].outputs),
                              {"body": body, "params": list(ext), "results": list(body[-1].outputs)}))
    graph.nodes = new_nodes
    return graph, params
