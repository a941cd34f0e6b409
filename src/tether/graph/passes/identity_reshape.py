"""Drop reshapes that keep their input's shape, so they do not split a fusible chain.

The ONNX frontend names each converted node's result with the model's own value name, through a final
``reshape`` when the computation ends in another shape; where the shapes already agree (a 2-D MatMul's product)
that reshape changes nothing but still stands between the product and its bias ``Add``, and fusion
(passes/fuse.py) then leaves the add as a kernel of its own: one more pass over the output (80 x 6625 floats in a
CTC classifier head, 0.27 ms). A reshape whose output is a graph output stays (it carries the output's name), and
so does one with attributes beyond its shape (the guarded views of control_flow.py's If branches).
"""
from __future__ import annotations

from typing import Dict, Tuple

import numpy as np

from tether.graph.guards import GUARD_ATTR
from tether.graph.ir import Graph


def drop_identity_reshapes(graph: Graph, params: Dict[str, np.ndarray]) -> Tuple[Graph, Dict[str, np.ndarray]]:
    graph = graph.copy()
    outputs = set(graph.outputs)
    consumers = graph.consumers()
    # values named by guards (a run-time If's condition flag) are looked up by name later: they keep their node
    guard_flags = {str(w[0]) for n in graph.nodes for w in n.attrs.get(GUARD_ATTR, []) or []}
    alias: Dict[str, str] = {}
    kept = []
    for node in graph.nodes:
        node.inputs = [alias.get(v, v) for v in node.inputs]
        # (a reshape with marks of its own stays: a run-time If's branch outputs leave through such views,
        # guarded, precisely so that no branch kernel fuses with the select that always runs)
        if (node.op == "reshape" and len(node.inputs) == 1 and len(node.outputs) == 1
                and set(node.attrs) <= {"shape"}):
            src, out = node.inputs[0], node.outputs[0]
            st, ot = graph.types.get(src), graph.types[out]
            if (out not in outputs and out not in guard_flags and st is not None and tuple(st.shape) == tuple(ot.shape)
                    and st.dtype == ot.dtype and not any(_nests(u) for u in consumers.get(out, []))):
                alias[out] = src
                continue
        kept.append(node)
    graph.nodes = kept
    for v in alias:
        graph.types.pop(v, None)
    return graph, params


def _nests(node) -> bool:
    """Whether ``node`` holds nodes of its own (a fused body, a compiled loop's body) that name values: those are
    not renamed here, so a reshape they read stays."""
    return node.op == "fused" or any(k.startswith("_") or k == "body" for k in node.attrs)
