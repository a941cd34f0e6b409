"""Integer convolutions and matrix products accumulated exactly in float32: ``exact_float_products``.

An int8 product ``sum_k (x - zx) * w`` is an integer; float32 holds every integer below 2**24 exactly, so when a
static bound on every partial sum, ``max|x - zx| * sum_k |w[o, k]| + |bias[o]|``, stays below 2**24, the float32
conv/dense (the fast fp32 kernels, fused multiply-adds included: each product and each partial sum is an exact
integer) gives exactly the int32 accumulator, and ``requantize`` reads it as onnxruntime reads its int32 one.
The bound is checked per layer at build time from the constant weights; a layer that may exceed it keeps its
int32 kernel. Only chains that end in ``requantize`` change, so no int32 value a model outputs changes type.

Why: the generic int32 kernels multiply with 32-bit integer multiplies (vpmulld, NEON mul.4s), which run at a
fraction of the rate of float fused multiply-adds; until tether has dot-product int8 kernels (vpdpbusd, sdot),
this runs most int8 layers at the speed of the fp32 build.
"""
from __future__ import annotations

import logging
from typing import Dict, List, Optional, Tuple

import numpy as np

from tether.graph.ir import Graph, Node, TensorType, unique_name

log = logging.getLogger(__name__)

EXACT_LIMIT = 2 ** 24
_RANGES = {"int8": (-128, 127), "uint8": (0, 255)}


def int8_activation(graph: Graph, params: Dict[str, np.ndarray], producer: Dict[str, Node],
                value: str) -> Optional[Tuple[str, int, int]]:
    """(int8/uint8 source, zero point, max |x - zp|) of ``cast(x, int32) [- zp]``."""
    n = producer.get(value)
    zp = 0
    if n is not None and n.op == "sub" and n.inputs[1] in params and params[n.inputs[1]].size == 1:
        zp = int(params[n.inputs[1]].reshape(-1)[0])
        n = producer.get(n.inputs[0])
    if n is None or n.op != "cast" or n.attrs.get("to") != "int32":
        return None
    src = n.inputs[0]
    rng = _RANGES.get(str(graph.types[src].dtype))
    if rng is None:
        return None
    return src, zp, max(abs(rng[0] - zp), abs(rng[1] - zp))


def exact_float_products(graph: Graph, params: Dict[str, np.ndarray]) -> Tuple[Graph, Dict[str, np.ndarray]]:
    producer = {o: n for n in graph.nodes for o in n.outputs}
    consumers: Dict[str, List[Node]] = {}
    for n in graph.nodes:
        for i in n.inputs:
            consumers.setdefault(i, []).append(n)
    outputs = set(graph.outputs)
    rewrite: Dict[int, List[Node]] = {}
    graph = graph.copy()
    graph.types = dict(graph.types)
    params = dict(params)
    taken = set(graph.types) | set(params)

    def fresh(hint: str) -> str:
        name = unique_name(hint, taken)
        taken.add(name)
        return name

    def use_only(value: str) -> Optional[Node]:
        cs = consumers.get(value, [])
        return cs[0] if len(cs) == 1 and value not in outputs else None

    changed = 0
    for n in list(graph.nodes):
        if n.op not in ("conv2d", "dense") or len(n.inputs) != 2 or n.inputs[1] not in params:
            continue
        w = params[n.inputs[1]]
        act = int8_activation(graph, params, producer, n.inputs[0])
        if w.dtype != np.int32 or act is None:
            continue
        nxt = use_only(n.outputs[0])
        bias_node, bias = None, None
        if nxt is not None and nxt.op == "add":
            other = nxt.inputs[1] if nxt.inputs[0] == n.outputs[0] else nxt.inputs[0]
            if other in params and params[other].dtype == np.int32:
                bias_node, bias = nxt, params[other]
                nxt = use_only(nxt.outputs[0])
        if nxt is None or nxt.op != "requantize":
            continue
        src, zp, xmax = act
        per_out = np.abs(w.astype(np.int64)).reshape(w.shape[0], -1).sum(axis=1) * xmax
        if bias is not None:    # conservative: the largest bias on every channel
            per_out = per_out + int(np.abs(bias.astype(np.int64)).max())
        if per_out.max() >= EXACT_LIMIT:
            continue
        # x as float32 minus its zero point (both exact), the weights and bias as float32 constants
        xf = fresh(src + "_f32")
        graph.types[xf] = TensorType(graph.types[src].shape, "float32")
        new = [Node("cast", fresh("cast_f32_node"), [src], [xf], {"to": "float32"})]
        x_in = xf
        if zp:
            zc = fresh("zx_f32")
            params[zc] = np.array(zp, np.float32)
            graph.types[zc] = TensorType((), "float32")
            x_in = fresh(src + "_minus_zp")
            graph.types[x_in] = TensorType(graph.types[src].shape, "float32")
            new.append(Node("sub", fresh("sub_zx_node"), [xf, zc], [x_in], {}))
        wf = fresh(n.inputs[1] + "_f32")
        params[wf] = w.astype(np.float32)
        graph.types[wf] = TensorType(w.shape, "float32")
        out_t = graph.types[n.outputs[0]]
        graph.types[n.outputs[0]] = TensorType(out_t.shape, "float32")
        new.append(Node(n.op, n.name, [x_in, wf], list(n.outputs), dict(n.attrs)))
        rewrite[id(n)] = new
        if bias_node is not None:
            bname = bias_node.inputs[1] if bias_node.inputs[0] == n.outputs[0] else bias_node.inputs[0]
            bf = fresh(bname + "_f32")
            params[bf] = params[bname].astype(np.float32)
            graph.types[bf] = TensorType(params[bf].shape, "float32")
            t = graph.types[bias_node.outputs[0]]
            graph.types[bias_node.outputs[0]] = TensorType(t.shape, "float32")
            rewrite[id(bias_node)] = [Node("add", bias_node.name, [n.outputs[0], bf], list(bias_node.outputs), {})]
        changed += 1
    graph.nodes = [m for n in graph.nodes for m in rewrite.get(id(n), [n])]
    log.debug("exact_float_products: %d integer products run in float32", changed)
    return graph, params
