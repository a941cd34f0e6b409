"""Graph nodes that run as numpy on the device (op pattern ``numpy``: NonZero, Compress, Unique,
NonMaxSuppression, Det) instead of as compiled kernels, and the values whose shape is known only at run time.

A data-dependent output has no static shape, so no kernel can be compiled for a consumer of it: such a value may
only be a graph output or feed other numpy nodes (``check_dynamic`` refuses anything else); the ONNX frontend
turns the common post-processing of such values (Cast, Transpose, Slice, Gather, arithmetic, ...) into numpy
nodes too (frontend/onnx/dynamic_values.py, kernels/dynamic_op.py). In the graph JSON
(version 3) a numpy node is ``{"name", "numpy": op, "attrs", "inputs", "outputs"}`` and a data-dependent value's
entry carries ``"dynamic": true`` (its shape is the largest it can be; the device keeps the real array).
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Set

import numpy as np

from tether.errors import UnsupportedOpError
from tether.graph import op_info
from tether.graph.ir import Graph, Node

#: the graph JSON version that has numpy nodes (graphs without them stay at the version the executor writes)
NUMPY_GRAPH_VERSION = 3


def is_numpy(node: Node) -> bool:
    return node.op != "fused" and node.op in op_info.OPS and op_info.pattern(node.op) == "numpy"


def dynamic_values(graph: Graph) -> Dict[str, Node]:
    """Data-dependent value -> the numpy node that computes it."""
    out: Dict[str, Node] = {}
    for node in graph.nodes:
        if is_numpy(node):
            for k in op_info.dynamic_outputs(node.op, any(i in out for i in node.inputs)):
                if k < len(node.outputs) and node.outputs[k]:
                    out[node.outputs[k]] = node
    return out


def check_dynamic(graph: Graph) -> Set[str]:
    """The data-dependent values of ``graph``; UnsupportedOpError if one feeds anything but a numpy node."""
    dyn = dynamic_values(graph)
    for node in graph.nodes:
        if is_numpy(node):
            continue
        for i in node.inputs:
            if i in dyn:
                raise UnsupportedOpError(
                    "node %s (%s) reads %r, whose shape is data-dependent (computed by %s, %s): tether compiles "
                    "kernels for static shapes only, so such a value may only be a graph output or feed numpy "
                    "nodes" % (node.name, node.ops_label(), i, dyn[i].name,
                                                              dyn[i].op))
    return set(dyn)


def _jsonable(v: Any) -> Any:
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, np.integer):
        return int(v)
    if isinstance(v, np.floating):
        return float(v)
    return v


def node_json(node: Node, entry: Callable[[str], int]) -> Dict[str, Any]:
    return {"name": node.name, "numpy": node.op, "attrs": {k: _jsonable(v) for k, v in node.attrs.items()},
            "inputs": [entry(v) for v in node.inputs], "outputs": [entry(v) for v in node.outputs],
            "ops": node.op}
