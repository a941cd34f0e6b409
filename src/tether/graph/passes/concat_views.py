"""Concatenation as views: a concat whose inputs are contiguous byte ranges of its output costs nothing.

When every dimension before the concat axis is 1 (batch-1 NCHW along channels, or axis 0), input ``j`` of
``concat(x_0, .., x_n)`` is exactly the bytes ``[off_j, off_j + nbytes(x_j))`` of the output. So the memory
planner can place each ``x_j`` *inside* the concat's storage at that offset: the producers write straight into
their slice and the concat node needs no kernel and no copy. This pass only decides which concats may do that
and marks them ``attrs["view"] = True``; ``plan_memory`` places the values (``view_layout`` below) and
``build_graph`` emits no kernel for a marked concat.

Views nest: an input that is itself a view concat is placed at its offset, and its own inputs inside it. So a
densenet block (``c_k = concat(c_{k-1}, new_k)``, every ``c_k`` also read by its own batch norm) becomes one
storage of the block's largest concat, with every ``c_k`` a prefix of it. That is correct because every byte of
such a tree has exactly one writer (each value is an input of at most one view concat, once), nobody writes a
concat, and the planner keeps the whole storage alive from the first member's definition to the last read of
any member: no write can clobber bytes a still-live reader needs.

An input is not eligible (the concat then keeps its kernel) when it is a graph input or a param (the executor
fills those buffers itself), a reshape's output (its bytes belong to the reshape's input), read twice by the
concat, or an input of another concat as well (it cannot live at two places). A concat is eligible when its
layout fits and all its inputs are. A fused node anchored on an eligible concat (``concat+bn+relu``) is split
into the free concat and the elementwise rest.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import numpy as np

from tether.graph import op_info
from tether.graph.ir import Graph, Node, body_inputs

VIEW_ATTR = "view"


def is_concat_view(node: Node) -> bool:
    """A node that needs no kernel because its inputs live inside its output (see the module doc)."""
    return node.op == "concat" and bool(node.attrs.get(VIEW_ATTR, False))


def _concat_of(node: Node) -> Optional[Node]:
    """The concat at the head of `node` (itself, or the anchor of a fused group), else None."""
    head = node.body()[0]
    return head if head.op == "concat" else None


def _layout_fits(graph: Graph, concat: Node) -> bool:
    shape = graph.types[concat.outputs[0]].shape
    axis = int(concat.attrs["axis"]) % max(len(shape), 1)
    return all(d == 1 for d in shape[:axis])


def _eligible(graph: Graph, params: Dict[str, np.ndarray], concat: Node, producers: Dict[str, Node],
              concat_reads: Dict[str, int]) -> bool:
    if len(concat.outputs) != 1 or not _layout_fits(graph, concat):
        return False
    if len(set(concat.inputs)) != len(concat.inputs):
        return False
    for v in concat.inputs:
        prod = producers.get(v)
        if v in params or v in graph.inputs or prod is None:
            return False
        if op_info.is_alias(prod):
            return False
        if concat_reads.get(v, 0) != 1:
            return False
    return True


def _split_fused(node: Node) -> List[Node]:
    """fused[concat+elementwise...] -> the concat and the elementwise rest (one node or a smaller fused one)."""
    body = node.body()
    concat, rest = body[0], body[1:]
    outer = dict(zip(node.body_params(), node.inputs))
    head = Node("concat", concat.name, [outer[i] for i in concat.inputs], list(concat.outputs), dict(concat.attrs))
    ext = body_inputs(rest)
    # the rest reads the concat's output under its body name, which is now a graph value of that name
    outer[concat.outputs[0]] = concat.outputs[0]
    if len(rest) == 1:
        r = rest[0]
        tail = Node(r.op, r.name, [outer[i] for i in r.inputs], list(node.outputs), dict(r.attrs))
    else:
        results = node.attrs["results"]
        tail = Node("fused", rest[0].name, [outer[i] for i in ext], list(node.outputs),
                    {"body": list(rest), "params": list(ext), "results": list(results)})
    return [head, tail]


def concat_views(graph: Graph, params: Dict[str, np.ndarray]) -> Tuple[Graph, Dict[str, np.ndarray]]:
    """Mark every concat that can be a view of its inputs (``attrs["view"]``); split fused groups headed by one."""
    graph = graph.copy()
    producers = graph.producers()
    concat_reads: Dict[str, int] = {}
    for node in graph.nodes:
        c = _concat_of(node)
        if c is None:
            continue
        outer = dict(zip(node.body_params(), node.inputs)) if node.op == "fused" else {}
        for i in c.inputs:
            v = outer.get(i, i)
            concat_reads[v] = concat_reads.get(v, 0) + 1
    new_nodes: List[Node] = []
    for node in graph.nodes:
        c = _concat_of(node)
        if c is None:
            new_nodes.append(node)
            continue
        parts = _split_fused(node) if node.op == "fused" else [node]
        head = parts[0]
        if not _eligible(graph, params, head, producers, concat_reads):
            new_nodes.append(node)
            continue
        if node.op == "fused" and head.outputs[0] not in graph.types:
            new_nodes.append(node)      # cannot happen with fuse's output, but never emit an untyped value
            continue
        head.attrs[VIEW_ATTR] = True
        new_nodes.extend(parts)
    graph.nodes = new_nodes
    return graph, params


def view_layout(graph: Graph) -> Dict[str, Tuple[str, int]]:
    """For every value inside a view tree: (the tree's root value, byte offset in the root). Roots map to
    themselves at 0. Raises ValueError if the marked concats do not form trees (a value placed twice)."""
    layout: Dict[str, Tuple[str, int]] = {}
    # a concat comes after the concats it feeds into in reverse order, so its own place is known first
    for node in reversed(graph.nodes):
        if not is_concat_view(node):
            continue
        out = node.outputs[0]
        root, base = layout.setdefault(out, (out, 0))
        off = 0
        for v in node.inputs:
            if v in layout:
                raise ValueError("concat view %s: %r is already placed inside another concat" % (node.name, v))
            layout[v] = (root, base + off)
            off += graph.types[v].nbytes
        if off != graph.types[out].nbytes:
            raise ValueError("concat view %s: inputs hold %d bytes, the output %d" % (node.name, off,
                                                                                     graph.types[out].nbytes))
    return layout
