"""Constant pads taken into the padding of the conv that reads them: ``fold_pads(graph, params)`` for float convs,
and ``input_pad`` for the int8 convs of passes/quantize_dot.py.

A model converted from TensorFlow or TFLite writes a strided conv's asymmetric "SAME" padding as an explicit Pad
node ahead of it (on the NHWC tensor, before the transpose into the conv's NCHW). A conv pads its input itself,
with zeros for a float conv and with the zero point for an int8 one, at no extra cost (its packing stage reads the
input once anyway); a separate pad kernel is one more call and one more copy of the image. So a constant pad that
fills with what the conv would read, on the image axes only, goes into the conv's pads.
"""
from __future__ import annotations

from typing import Callable, Dict, List, Optional, Tuple

import numpy as np

from tether.graph.ir import Graph, Node, TensorType
from tether.graph.passes.quantize import Rewriter

# NHWC -> NCHW: the transpose a TFLite model's pad may sit behind
_TO_NCHW = [0, 3, 1, 2]


def input_pad(graph: Graph, producer: Dict[str, Node], uses: Dict[str, int], fresh: Callable[[str], str], src: str,
              value: float) -> Optional[Tuple[List[int], str, List[Node]]]:
    """``(extra pads (top, left, bottom, right), the conv's new input, nodes to add before the conv)`` when the
    conv input ``src`` (NCHW) is a constant pad of the image axes that fills with ``value``, or that pad behind a
    NHWC -> NCHW transpose (a transpose of the unpadded tensor then takes its place); None otherwise. The pad (and
    transpose), each read once, are left to dce."""
    n = producer.get(src)
    tr = None
    if n is not None and n.op == "transpose" and list(n.attrs["axes"]) == _TO_NCHW and uses.get(src) == 1:
        tr, n = n, producer.get(n.inputs[0])
    if n is None or n.op != "pad" or len(n.inputs) != 1 or n.attrs.get("mode", "constant") != "constant":
        return None
    if n.attrs.get("value", 0.0) != value or uses.get(n.outputs[0]) != 1:
        return None
    pads = list(n.attrs["pads"])
    # (top, left, bottom, right) of the image axes: H, W at 1, 2 (NHWC, before the transpose) or 2, 3 (NCHW)
    hw = (1, 2) if tr is not None else (2, 3)
    if len(pads) != 8 or min(pads) < 0 or any(pads[i] or pads[i + 4] for i in range(4) if i not in hw):
        return None
    extra = [pads[hw[0]], pads[hw[1]], pads[hw[0] + 4], pads[hw[1] + 4]]
    new_src = n.inputs[0]
    pre: List[Node] = []
    if tr is not None:
        nhwc = graph.types[new_src].shape
        new_src = fresh(src + "_unpadded")
        graph.types[new_src] = TensorType(tuple(nhwc[i] for i in _TO_NCHW), graph.types[src].dtype)
        pre.append(Node("transpose", fresh(tr.name + "_unpadded"), [n.inputs[0]], [new_src], dict(tr.attrs)))
    return extra, new_src, pre


def padded(conv: Node, extra: List[int], new_src: str) -> Node:
    """``conv`` reading ``new_src`` with ``extra`` added to its pads."""
    attrs = dict(conv.attrs, pads=[a + b for a, b in zip(conv.attrs["pads"], extra)])
    return Node(conv.op, conv.name, [new_src] + list(conv.inputs[1:]), list(conv.outputs), attrs)


def fold_pads(graph: Graph, params: Dict[str, np.ndarray]) -> Tuple[Graph, Dict[str, np.ndarray]]:
    """Zero pads of a float conv2d's input taken into its pads (module doc)."""
    out = graph.copy()
    out.types = dict(graph.types)
    rw = Rewriter(graph, params)     # producers, uses and fresh names

    nodes: List[Node] = []
    for n in graph.nodes:
        if n.op == "conv2d" and len(graph.types[n.inputs[0]].shape) == 4 and \
                str(graph.types[n.inputs[0]].dtype) in ("float32", "float16"):
            found = input_pad(out, rw.producer, rw.uses, rw.fresh, n.inputs[0], 0.0)
            if found is not None:
                extra, new_src, pre = found
                nodes.extend(pre)
                n = padded(n, extra, new_src)
        nodes.append(n)
    out.nodes = nodes
    return out, params
