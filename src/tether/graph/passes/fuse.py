"""Operator fusion: elementwise chains merge into the node that produces their input.

A node whose op is ``elemwise`` joins the group of the producer of one of its inputs when
- that input is used only by this node and is not a graph output (so the intermediate never needs memory),
- the producer group's anchor is a ``complex`` op (conv2d, dense, pools ...) or elementwise,
- the node does not broadcast its fused input to a larger shape (the kernel's iteration space is the anchor's).
Each group of two or more nodes becomes one ``fused`` node placed where its last member was (every external
input is defined by then), so conv2d -> add(bias) -> relu is one kernel.

Before that, an elementwise region that reads one value through several nodes and joins again in one node (SiLU
as ``x * sigmoid(x)``, GELU as ``x * 0.5 * (1 + erf(x / sqrt(2)))``) is contracted into one elementwise node: the
chain rule alone would keep it out of its producer's kernel (the value has two readers), so it ran as a kernel of
its own or, worse, as the next conv's prologue, where a depthwise conv evaluates it once per window tap.
"""
from __future__ import annotations

from typing import Dict, List, Tuple

import numpy as np

from tether.graph import op_info
from tether.graph.ir import Graph, Node, fused_node

_ANCHORS = ("complex", "elemwise", "injective")
# the most nodes a contracted region may hold (GELU written out is five)
_REGION_LIMIT = 12


def _elementwise(node: Node) -> bool:
    return len(node.outputs) == 1 and all(op_info.pattern(b.op) == "elemwise" for b in node.body())


def _region_of(graph: Graph, v: str, consumers, outputs, position) -> List[Node]:
    """The smallest elementwise region that takes in every reader of ``v`` and lets exactly one value out (its last
    node's), every node of the shape of ``v``; [] when there is none within ``_REGION_LIMIT`` nodes."""
    shape = graph.types[v].shape
    readers = consumers.get(v, [])
    if len(readers) < 2 or any(not _elementwise(n) or graph.types[n.outputs[0]].shape != shape for n in readers):
        return []
    # the elementwise nodes of v's shape downstream of v, in graph order
    ahead: Dict[int, Node] = {}
    frontier = list(readers)
    while frontier and len(ahead) <= _REGION_LIMIT:
        n = frontier.pop()
        if id(n) in ahead or not _elementwise(n) or graph.types[n.outputs[0]].shape != shape:
            continue
        ahead[id(n)] = n
        frontier.extend(consumers.get(n.outputs[0], []))
    produced = {n.outputs[0]: n for n in ahead.values()}
    reader_ids = {id(n) for n in readers}
    for sink in sorted(ahead.values(), key=lambda n: position[id(n)]):
        region: Dict[int, Node] = {}
        stack = [sink]
        while stack:                     # the sink and its ancestors inside ``ahead``
            n = stack.pop()
            if id(n) in region:
                continue
            region[id(n)] = n
            stack.extend(produced[i] for i in n.inputs if i in produced)
        if not reader_ids <= set(region) or len(region) > _REGION_LIMIT:
            continue
        if all(n is sink or (n.outputs[0] not in outputs
                             and all(id(c) in region for c in consumers.get(n.outputs[0], [])))
               for n in region.values()):
            return sorted(region.values(), key=lambda n: position[id(n)])
    return []


def _contract_elementwise_regions(graph: Graph) -> None:
    """Replaces, in ``graph`` (a pass's own copy), each elementwise region over one value (``_region_of``) with one
    ``fused`` node where the region's last node was: the others' outputs are read only inside it, so no node
    between them needs them."""
    consumers = graph.consumers()
    outputs = set(graph.outputs)
    position = {id(n): k for k, n in enumerate(graph.nodes)}
    taken: Dict[int, List[Node]] = {}      # id of a region's last node -> the region
    inside: set = set()
    for node in graph.nodes:
        for v in node.outputs:
            region = _region_of(graph, v, consumers, outputs, position)
            if region and not any(id(n) in inside for n in region):
                inside.update(id(n) for n in region)
                taken[id(region[-1])] = region
    new_nodes: List[Node] = []
    for node in graph.nodes:
        if id(node) in taken:
            body = [b for n in taken[id(node)] for b in n.body()]
            new_nodes.append(fused_node(body[0].name, body))
        elif id(node) not in inside:
            new_nodes.append(node)
    graph.nodes = new_nodes


def fuse(graph: Graph, params: Dict[str, np.ndarray]) -> Tuple[Graph, Dict[str, np.ndarray]]:
    graph = graph.copy()
    _contract_elementwise_regions(graph)
    consumers = graph.consumers()
    outputs = set(graph.outputs)
    group_of: Dict[int, int] = {}          # node index -> group id (the index of its anchor)
    members: Dict[int, List[int]] = {}
    producer_index = {o: k for k, n in enumerate(graph.nodes) for o in n.outputs}
    for k, node in enumerate(graph.nodes):
        group_of[k] = k
        members[k] = [k]
        if not _elementwise(node):
            continue
        out_shape = graph.types[node.outputs[0]].shape
        for v in node.inputs:
            if v in params or v not in producer_index:
                continue
            if len(consumers.get(v, [])) != 1 or v in outputs or graph.types[v].shape != out_shape:
                continue
            g = group_of[producer_index[v]]
            anchor = graph.nodes[g]
            if len(anchor.outputs) != 1 or not (_elementwise(anchor) or op_info.pattern(anchor.op) in _ANCHORS):
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
        body = [b for m in ms for b in graph.nodes[m].body()]
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
        # (a conv writing channels last, float_layout.py, runs as conv2d_pixels without a prologue)
        if (conv.op != "conv2d" or len(conv.inputs) != 2 or conv.inputs[0] != v or conv.inputs[1] == v
                or conv.attrs.get("channels_last_out")
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
