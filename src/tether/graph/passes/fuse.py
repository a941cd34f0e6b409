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

from tether.graph import op_info
from tether.graph.ir import Graph, Node, fused_node

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
        if op_info.pattern(node.op) != "elemwise" or len(node.outputs) != 1:
            continue
        out_shape = graph.types[node.outputs[0]].shape
        for v in node.inputs:
            if v in params or v not in producer_index:
                continue
            if len(consumers.get(v, [])) != 1 or v in outputs or graph.types[v].shape != out_shape:
                continue
            g = group_of[producer_index[v]]
            anchor = graph.nodes[g]
            if op_info.pattern(anchor.op) not in _ANCHORS or len(anchor.outputs) != 1:
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
        new_nodes.append(fused_node(body[0].name, body))
    graph.nodes = new_nodes
    return graph, params


def fuse_prologues(graph: Graph, params: Dict[str, np.ndarray]) -> Tuple[Graph, Dict[str, np.ndarray]]:
    """opt_level 3: an elementwise chain whose only reader is a batch-1 conv2d, as that conv's data input, joins the
    conv's kernel as a prologue (densenet's pre-activation batch norm + relu before every conv).

    At opt_level 3 such a conv runs as a GEMM whose input is read once into a packing or padding stage
    (graph/conv_gemm.py), where the prologue is computed per element for free; this saves a kernel and a pass over
    memory per layer (densenet121: 62 kernels)."""
    graph = graph.copy()
    consumers = graph.consumers()
    outputs = set(graph.outputs)
    position = {id(n): k for k, n in enumerate(graph.nodes)}
    prologue_of: Dict[int, Node] = {}       # consumer position -> the prologue node it absorbs
    for node in graph.nodes:
        body = node.body()
        if len(node.outputs) != 1 or not all(op_info.pattern(b.op) == "elemwise" for b in body):
            continue
        v = node.outputs[0]
        users = consumers.get(v, [])
        if v in outputs or len(users) != 1 or graph.types[v].shape[:1] != (1,):
            continue
        user = users[0]
        ubody = user.body()
        conv = ubody[0]
        if (conv.op != "conv2d" or len(conv.inputs) != 2 or conv.inputs[0] != v or conv.inputs[1] == v
                or any(v in b.inputs for b in ubody[1:]) or position[id(user)] in prologue_of):
            continue
        prologue_of[position[id(user)]] = node
    absorbed = {id(n) for n in prologue_of.values()}
    new_nodes: List[Node] = []
    for k, node in enumerate(graph.nodes):
        if id(node) in absorbed:
            continue
        if k not in prologue_of:
            new_nodes.append(node)
            continue
        new_nodes.append(fused_node(node.name, prologue_of[k].body() + node.body()))
    graph.nodes = new_nodes
    return graph, params
