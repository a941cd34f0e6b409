"""float32 math computed in half precision: ``half_precision`` (``build_graph(precision="fp16")``).

The ops of ``HALF_OPS`` whose float inputs are all float32 compute in float16: their outputs become float16 and
their constant inputs (weights, biases) are rounded to float16 once, here, so the kernels read half the bytes and
the target's half arithmetic (aarch64 +fullfp16: fmla on 8 lanes, codegen/types.py) does twice the work per
instruction, as XNNPACK's fp16 path does. Every other op keeps its float32 arithmetic: a float16 value it reads is
cast to float32 before it. The model's interface stays float32: a graph input is cast to float16 where a half op
reads it, and a float16 graph output is cast back to float32 under the output's own name.

Why these ops and not the others: products and sums of a few thousand terms (convs, matmuls) lose about
sqrt(K) half ulps, and the elementwise ops and window pools here are exact in float16 or round once. The ops left
out are unsafe in half: exp/log/tanh and softmax overflow or lose their tails (float16 tops out at 65504), the
normalisations' mean and variance and the global pools and reductions sum over many elements, where a float16
accumulator stops moving once the sum is 2048 times the next term.

Run after batch-norm folding (so the folded weights are rounded once, from their float32 values) and before
fusion (the casts it adds join their neighbours' kernels there).
"""
from __future__ import annotations

from typing import Dict, List, Set, Tuple

import numpy as np

from tether.graph.ir import Graph, Node, TensorType, unique_name

#: ops computed in float16 when their float inputs are float32 (graph ops, tether's names)
HALF_OPS = frozenset({
    "conv2d", "dense", "batch_matmul",                          # products: the time goes here
    "add", "sub", "mul", "maximum", "minimum", "maximum_nan", "minimum_nan",   # elementwise, one rounding each
    "relu", "clip", "leaky_relu", "neg", "abs", "prelu", "hard_sigmoid", "hard_swish", "scale_shift",
    "max_pool", "avg_pool", "global_max_pool",                  # windows of a few elements (max is exact)
    "reshape", "transpose", "concat", "pad", "strided_slice", "broadcast_to",   # data movement, exact
})


def _float_inputs_are_f32(node: Node, graph: Graph, params: Dict[str, np.ndarray]) -> bool:
    saw_float = False
    for v in node.inputs:
        dt = str(params[v].dtype) if v in params else graph.types[v].dtype if v in graph.types else None
        if dt is None or not dt.startswith(("float", "bfloat")):
            continue
        if dt != "float32":
            return False
        saw_float = True
    return saw_float and all(graph.types[o].dtype == "float32" for o in node.outputs if o in graph.types)


def half_precision(graph: Graph, params: Dict[str, np.ndarray]) -> Tuple[Graph, Dict[str, np.ndarray]]:
    """The graph with the float32 math of ``HALF_OPS`` in float16 (see the module's docstring); pure."""
    graph = graph.copy()
    graph.types = dict(graph.types)
    params = dict(params)
    taken: Set[str] = set(graph.types) | set(params) | {n.name for n in graph.nodes}

    def fresh(hint: str) -> str:
        name = unique_name(hint, taken)
        taken.add(name)
        return name

    half_nodes = {id(n) for n in graph.nodes if n.op in HALF_OPS and _float_inputs_are_f32(n, graph, params)}
    if not half_nodes:
        return graph, params
    half_values: Set[str] = set()          # float32 values that are now float16
    casts: Dict[Tuple[str, str], str] = {}  # (value, dtype) -> its cast, made once
    half_params: Dict[str, str] = {}       # float32 param -> its float16 copy
    nodes: List[Node] = []

    def cast(v: str, to: str) -> str:
        key = (v, to)
        if key not in casts:
            out = fresh("%s_%s" % (v, "f16" if to == "float16" else "f32"))
            graph.types[out] = TensorType(graph.types[v].shape, to)
            nodes.append(Node("cast", fresh("cast_" + out), [v], [out], {"to": to}))
            casts[key] = out
        return casts[key]

    for n in graph.nodes:
        if id(n) in half_nodes:
            ins = []
            for v in n.inputs:
                if v in params and str(params[v].dtype) == "float32":
                    if v not in half_params:
                        hp = fresh(v + "_f16")
                        params[hp] = params[v].astype(np.float16)
                        graph.types[hp] = TensorType(params[hp].shape, "float16")
                        half_params[v] = hp
                    ins.append(half_params[v])
                elif v in half_values or v in params or graph.types[v].dtype != "float32":
                    ins.append(v)
                else:                                    # a graph input, or the output of a float32 op
                    ins.append(cast(v, "float16"))
            for o in n.outputs:
                if graph.types[o].dtype == "float32":
                    graph.types[o] = TensorType(graph.types[o].shape, "float16")
                    half_values.add(o)
            nodes.append(Node(n.op, n.name, ins, list(n.outputs), dict(n.attrs)))
        else:
            ins = [cast(v, "float32") if v in half_values else v for v in n.inputs]
            nodes.append(Node(n.op, n.name, ins, list(n.outputs), dict(n.attrs)))

    # the interface stays float32: a half output gets its name back on a cast
    outputs = []
    for o in graph.outputs:
        if o in half_values:
            inner = fresh(o + "_f16")
            for n in nodes:
                n.inputs = [inner if v == o else v for v in n.inputs]
                n.outputs = [inner if v == o else v for v in n.outputs]
            graph.types[inner] = graph.types[o]
            graph.types[o] = TensorType(graph.types[o].shape, "float32")
            nodes.append(Node("cast", fresh("cast_" + o), [inner], [o], {"to": "float32"}))
        outputs.append(o)
    graph.nodes = nodes
    graph.outputs = outputs
    for v in list(half_params):     # float32 params only half ops read are gone
        if not any(v in n.inputs for n in nodes):
            del params[v]
            graph.types.pop(v, None)
    return graph, params
