"""Drop reshapes that keep their input's shape, so they do not split a fusible chain.

The ONNX frontend names each converted node's result with the model's own value name, through a final
``reshape`` when the computation ends in another shape; where the shapes already agree (a 2-D MatMul's product)
that reshape changes nothing but still stands between the product and its bias ``Add``, and fusion
(passes/fuse.py) then leaves the add as a kernel of its own: one more pass over the output (80 x 6625 floats in a
CTC classifier head, 0.27 ms). A reshape whose output is a graph output stays (it carries the output's name), and
so does one with attributes beyond its shape (the guarded views of control_flow.py's If branches).

A reshape of a reshape reads the first one's input instead (both are views of the same elements), so a 1-D conv's
``(1, C, 1, L) -> (1, C, L) -> (1, C, 1, L)`` between two convs (the second's input unsqueezed again) is no
reshape at all, and a pass that follows the image from conv to conv (float_layout.py) sees one value.
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
    view_of: Dict[str, str] = {}        # the output of a plain reshape -> the value it views
    kept = []
    for node in graph.nodes:
        node.inputs = [alias.get(v, v) for v in node.inputs]
        # (a reshape with marks of its own stays: a run-time If's branch outputs leave through such views,
        # guarded, precisely so that no branch kernel fuses with the select that always runs)
        if (node.op == "reshape" and len(node.inputs) == 1 and len(node.outputs) == 1
                and set(node.attrs) <= {"shape"}):
            if node.inputs[0] in view_of and node.inputs[0] not in guard_flags:
                node.inputs = [view_of[node.inputs[0]]]
            src, out = node.inputs[0], node.outputs[0]
            view_of[out] = src
            st, ot = graph.types.get(src), graph.types[out]
            if (out not in outputs and out not in guard_flags and st is not None and tuple(st.shape) == tuple(ot.shape)
                    and st.dtype == ot.dtype and not any(_nests(u) for u in consumers.get(out, []))):
                alias[out] = src
                continue
        kept.append(node)
    # the reshapes that only fed other reshapes (now reading past them) go, unless a node with a body of its own
    # could read them by name
    read = set(outputs) | guard_flags | {v for n in kept for v in n.inputs}
    if not any(_nests(n) for n in kept):
        kept = [n for n in kept if not (n.op == "reshape" and n.outputs[0] in view_of and n.outputs[0] not in read)]
    graph.nodes = kept
    for v in alias:
        graph.types.pop(v, None)
    return graph, params


def _nests(node) -> bool:
    """Whether ``node`` holds nodes of its own (a fused body, a compiled loop's body) that name values: those are
    not renamed here, so a reshape they read stays."""
    return node.op == "fused" or any(k.startswith("_") or k == "body" for k in node.attrs)


def _unit_axis(big: Tuple[int, ...], small: Tuple[int, ...]):
    """The axis at which ``big`` is ``small`` with one unit axis inserted, or None."""
    if len(big) != len(small) + 1:
        return None
    for a in range(len(big)):
        if big[a] == 1 and big[:a] + big[a + 1:] == small:
            return a
    return None


def lift_over_unit_reshapes(graph: Graph, params: Dict[str, np.ndarray]) -> Tuple[Graph, Dict[str, np.ndarray]]:
    """Elementwise nodes read through a reshape that only drops a unit axis run on the reshape's input instead,
    their result reshaped after them.

    A 1-D conv runs as a 2-D conv over a height of one (frontend/onnx/nn.py), its result reshaped back to 3-D;
    the activation after it (wav2vec2's GELU, a 1-D encoder's ReLU) then reads a reshape, which fusion does not
    cross, and ran as a kernel of its own: one more pass over the whole feature map. Each elementwise node whose
    run-time inputs all have such a higher-rank twin of its output's shape, and whose other inputs are constants,
    gets a twin computed on the twins (constants given the unit axis); the reshapes left unread go."""
    from tether.graph import op_info
    from tether.graph.ir import Node, TensorType, unique_name

    graph = graph.copy()
    params = dict(params)
    outputs = set(graph.outputs)
    twin: Dict[str, Tuple[str, int]] = {}      # value -> (its rank+1 twin, the unit axis)
    replaced = set()                           # constants given a unit axis
    taken = set(graph.types) | set(params)
    new_nodes = []
    for node in graph.nodes:
        new_nodes.append(node)
        if node.op == "reshape" and set(node.attrs) <= {"shape"} and len(node.inputs) == 1:
            src, out = node.inputs[0], node.outputs[0]
            if src in graph.types and src not in params:
                a = _unit_axis(tuple(graph.types[src].shape), tuple(graph.types[out].shape))
                if a is not None:
                    twin[out] = (src, a)
            continue
        if op_info.pattern(node.op) != "elemwise" or len(node.outputs) != 1 or node.attrs.get(GUARD_ATTR):
            continue
        out_t = graph.types[node.outputs[0]]
        lifted = [twin[v] for v in node.inputs if v in twin]
        if not lifted or len({a for _, a in lifted}) != 1:
            continue
        axis = lifted[0][1]
        ins = []
        for v in node.inputs:
            if v in twin and tuple(graph.types[v].shape) == tuple(out_t.shape):
                ins.append(twin[v][0])
            elif v in params and params[v].ndim <= len(out_t.shape):
                p = params[v]
                if p.ndim:
                    p = np.expand_dims(p.reshape((1,) * (len(out_t.shape) - p.ndim) + p.shape), axis)
                    name = unique_name(v + "_unit", taken)
                    taken.add(name)
                    params[name] = p
                    graph.types[name] = TensorType(p.shape, graph.types[v].dtype)
                    replaced.add(v)
                    v = name
                ins.append(v)
            else:
                break
        else:
            out = node.outputs[0]
            shape = tuple(out_t.shape[:axis]) + (1,) + tuple(out_t.shape[axis:])
            out4 = unique_name(out + "_unit", taken)
            taken.add(out4)
            graph.types[out4] = TensorType(shape, out_t.dtype)
            new_nodes[-1] = Node(node.op, node.name, ins, [out4], dict(node.attrs))
            new_nodes.append(Node("reshape", node.name + "_unit", [out4], [out], {"shape": tuple(out_t.shape)}))
            twin[out] = (out4, axis)
    read = {v for n in new_nodes for v in n.inputs} | outputs
    graph.nodes = [n for n in new_nodes if not (n.op == "reshape" and n.outputs[0] not in read)]
    read = {v for n in graph.nodes for v in n.inputs} | outputs
    for v in replaced - read:
        del params[v]
    return graph, params
