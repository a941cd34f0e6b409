"""int8 convolutions on the dot-product kernels: ``int8_dot_convs(graph, params)``.

After fuse_qdq (the QDQ form) and the QLinearConv converter (the QOperator form) an int8 conv is
``requantize(conv2d(int32(x) [- zx], w) [+ bias], multiplier, zy)`` with int32 operands. When the weights are
int8 values (any zero point already subtracted, the result still within [-128, 127]: every per-channel int8
weight of quantize_static) and the conv is not grouped, this pass writes instead

    reshape(requantize(qconv2d(x, packed w, bias - zx * sum_k w), multiplier, zy), (1, O, OH, OW))

with the 8-bit activations read directly (kernels/qconv_ops.py, ops/qconv.py): the weights packed once here, the zero
point of x folded into the bias (padding reads zx, which contributes nothing), the requantize fused into the
kernel's write-back by the fusion pass; a one-row ``dense`` (a classifier head) becomes the same on a 1x1 image
of K channels. The integers are the same as the int32 conv's, so the requantize rounds
them as before: bit for bit onnxruntime's. Grouped and depthwise convs, and anything else, stay as they are (the
exact-float32 pass, passes/quantize_float.py, still runs them as fp32 kernels when their sums fit), except
depthwise convs whose sums fit float32: ``requantize(qdepthwise2d(x, w, bias), multiplier, zy)``, the 8-bit input
read directly (ops/qdepthwise.py).
"""
from __future__ import annotations

import logging
from typing import Dict, List, Optional, Tuple

import numpy as np

from tether.graph.ir import Graph, Node, TensorType
from tether.graph.passes.pad_into_conv import input_pad, padded
from tether.graph.passes.quantize import Rewriter
from tether.graph.passes.quantize_float import int8_activation
from tether.ops import qconv as qops

log = logging.getLogger(__name__)


def _conv_chain(graph: Graph, params: Dict[str, np.ndarray], producer: Dict[str, Node], uses: Dict[str, int],
                rq: Node) -> Optional[Tuple[Node, Optional[np.ndarray]]]:
    """(conv2d or dense, int32 bias or None) feeding requantize ``rq`` through at most an add, each read once."""
    n = producer.get(rq.inputs[0])
    bias = None
    if n is not None and n.op == "add" and uses.get(n.outputs[0]) == 1:
        for k in (0, 1):
            conv, other = producer.get(n.inputs[k]), n.inputs[1 - k]
            if conv is not None and conv.op in ("conv2d", "dense") and other in params and \
                    params[other].dtype == np.int32:
                n, bias = conv, params[other]
                break
        else:
            return None
    if n is None or n.op not in ("conv2d", "dense") or uses.get(n.outputs[0]) != 1 or len(n.inputs) != 2:
        return None
    if bias is not None and bias.size != graph.types[n.inputs[1]].shape[0]:
        return None
    return n, bias


def _depthwise(graph: Graph, conv: Node, act, w: np.ndarray, bias: Optional[np.ndarray], rq: Node, const,
               fresh) -> Optional[List[Node]]:
    """A depthwise conv (one filter per channel, no dilation) as qdepthwise2d, when its sums provably stay below
    2**24 (then float32 holds them exactly); None otherwise."""
    src, zx, xmax = act
    ch = graph.types[src].shape[1]
    if conv.attrs["groups"] != ch or w.shape[:2] != (ch, 1) or list(conv.attrs["dilations"]) != [1, 1]:
        return None
    b = np.zeros(ch, np.int64) if bias is None else bias.reshape(-1).astype(np.int64)
    bound = np.abs(w.astype(np.int64)).reshape(ch, -1).sum(axis=1) * xmax + np.abs(b)
    if bound.max() >= 2 ** 24:
        return None
    attrs = {"strides": list(conv.attrs["strides"]), "pads": list(conv.attrs["pads"]), "pad_value": int(zx)}
    acc = fresh(conv.name + "_acc")
    graph.types[acc] = TensorType(graph.types[conv.outputs[0]].shape, "float32")
    return [Node("qdepthwise2d", conv.name, [src, const(w[:, 0].astype(np.float32), "qdw_w"),
                                             const(b.astype(np.float32), "qdw_bias")], [acc], attrs),
            Node("requantize", rq.name, [acc] + list(rq.inputs[1:]), list(rq.outputs), dict(rq.attrs))]


def int8_dot_convs(graph: Graph, params: Dict[str, np.ndarray]) -> Tuple[Graph, Dict[str, np.ndarray]]:
    graph = graph.copy()
    graph.types = dict(graph.types)
    params = dict(params)
    rw = Rewriter(graph, params)       # producers, uses, fresh names and constants
    producer, uses, fresh, const = rw.producer, rw.uses, rw.fresh, rw.const
    rewrite: Dict[int, List[Node]] = {}
    for rq in graph.nodes:
        if rq.op != "requantize" or rq.inputs[1] not in params or rq.inputs[2] not in params:
            continue
        chain = _conv_chain(graph, params, producer, uses, rq)
        if chain is None:
            continue
        conv, bias = chain
        pre: List[Node] = []
        w = params.get(conv.inputs[1])
        act = int8_activation(graph, params, producer, conv.inputs[0])
        if w is None or w.dtype != np.int32 or act is None:
            continue
        if conv.op == "conv2d":
            # a pad that fills with the zero point, which the int8 conv reads outside the image anyway
            found = input_pad(graph, producer, uses, fresh, act[0], act[1])
            if found is not None:
                extra, new_src, pre = found
                conv = padded(conv, extra, conv.inputs[0])
                act = (new_src,) + tuple(act[1:])
        if conv.op == "dense":
            # one row: a 1x1 conv of a 1x1 image (the pixel form: output channels in vectors)
            if graph.types[conv.inputs[0]].shape[0] != 1:
                continue
            conv = Node("conv2d", conv.name, conv.inputs, conv.outputs, {"strides": [1, 1], "pads": [0, 0, 0, 0],
                                                                         "dilations": [1, 1], "groups": 1})
            w = w.reshape(w.shape + (1, 1))
            src = act[0]
            view = fresh(src + "_image")
            graph.types[view] = TensorType((1, graph.types[src].shape[1], 1, 1), graph.types[src].dtype)
            pre = [Node("reshape", fresh("qdense_view_node"), [src], [view], {"shape": graph.types[view].shape})]
            act = (view,) + tuple(act[1:])
        if conv.attrs["groups"] != 1:
            dw = _depthwise(graph, conv, act, w, bias, rq, const, fresh)
            if dw is not None:
                rewrite[id(rq)] = pre + dw
            continue
        if w.min(initial=0) < -128 or w.max(initial=0) > 127:
            continue
        src, zx, _ = act
        n, ch, h, wd = graph.types[src].shape
        oc, _, kh, kw = w.shape
        mult, zy = params[rq.inputs[1]], params[rq.inputs[2]]
        if n != 1 or mult.size not in (1, oc) or zy.size != 1:
            continue
        pointwise = (kh, kw) == (1, 1) and list(conv.attrs["strides"]) == [1, 1] and not any(conv.attrs["pads"]) \
            and h * wd >= qops.POINTWISE_PIXEL_MULTIPLE
        wp = qops.pack_rows(w) if pointwise else qops.pack_weights(w)
        b = (np.zeros(oc, np.int64) if bias is None else bias.reshape(-1).astype(np.int64)) \
            - zx * qops.weight_sums(wp, oc)
        if b.min() < -2 ** 31 or b.max() >= 2 ** 31:
            continue
        attrs = {"kernel": [kh, kw], "strides": list(conv.attrs["strides"]), "pads": list(conv.attrs["pads"]),
                 "dilations": list(conv.attrs["dilations"]), "channels": ch, "out_channels": oc, "image": [h, wd],
                 "pad_value": int(zx), "kind": "", "flip": 0}
        new: List[Node] = pre
        x = src
        if pointwise:
            x = fresh(src + "_pixels")
            graph.types[x] = TensorType((ch, h * wd), graph.types[src].dtype)
            new.append(Node("reshape", fresh("qconv_view_node"), [src], [x], {"shape": (ch, h * wd)}))
        out_t = graph.types[rq.outputs[0]]
        acc = fresh(conv.name + "_acc")
        graph.types[acc] = TensorType((oc, out_t.size // oc), "int32")
        new.append(Node("qconv2d", conv.name, [x, const(wp, "qconv_w"), const(b.astype(np.int32), "qconv_bias")],
                        [acc], attrs))
        y = fresh(rq.outputs[0] + "_rows")
        graph.types[y] = TensorType((oc, out_t.size // oc), out_t.dtype)
        m = const(mult.reshape(oc, 1) if mult.size > 1 else mult.reshape(()), "qconv_multiplier")
        new.append(Node("requantize", rq.name, [acc, m, const(zy.reshape(()), "qconv_zy")], [y], dict(rq.attrs)))
        new.append(Node("reshape", fresh("qconv_image_node"), [y], list(rq.outputs), {"shape": tuple(out_t.shape)}))
        rewrite[id(rq)] = new
    graph.nodes = [m for n in graph.nodes for m in rewrite.get(id(n), [n])]
    if rewrite:
        log.debug("int8_dot_convs: %d convs run on the int8 dot-product kernels", len(rewrite))
    return graph, params
