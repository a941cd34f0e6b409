"""int8 activations kept channels last between int8 kernels: ``int8_channels_last(graph, params)``.

The int8 conv kernels (graph/passes/quantize_dot.py) compute with the channels innermost: the pixel form packs
its NCHW input channels last on every run and writes its output back NCHW lane by lane, and the depthwise kernel
converts each channel plane. Between two int8 kernels that is a round trip for nothing. This pass (run right after
int8_dot_convs) gives every 8-bit image value that an int8 kernel writes and an int8 kernel reads the layout
``(1, H, W, C)`` instead, as onnxruntime's NhwcTransformer does:

- ``reshape(requantize(qconv2d(x, ...), m, zy))`` writes ``(pixels, channels)`` (``channels_last_out``; the
  per-channel multiplier becomes ``(O,)``, along the last axis), viewed as ``(1, OH, OW, O)``; a conv whose input is
  channels last reads it directly (``channels_last_in``): no repacking unless the conv pads. A pointwise conv of
  the matmul form (planar pixels) becomes the pixel form with its weights repacked (same words, same bias);
- ``requantize(qdepthwise2d(x, w, b), m, zy)`` becomes ``qdepthwise2d_nhwc`` (kernels/qlayout_ops.py), weights
  ``(KH, KW, C)``, the multiplier along the last axis;
- a ``clip`` of a kernel's 8-bit output (a fused ReLU/ReLU6 whose bounds the output range does not make a no-op)
  goes with the kernel: it is elementwise, and a conv applies it before its output's reshape, where the
  write-back takes it in;
- ``qadd(a, b, ...)`` with per-tensor constants is elementwise: it runs on channels-last operands as they are;
- max pooling of 8-bit values (on them, or in the QDQ form between a cast to float32 and one back) runs on the
  bytes channels last (``max_pool_nhwc``, kernels/qlayout_ops.py): the maximum of integers is exact in them;
- global pooling's integer sums (``reduce(cast(x, int32), sum over H, W)``) sum over axes 1, 2 instead: the
  ``(1, 1, 1, C)`` result is the ``(1, C, 1, 1)`` one's memory, a view.

Which values change: a conv's output when an int8 kernel reads it (a pointwise conv reading NCHW then packs its
input as the pixel form does, once, where the NCHW region ends); a depthwise conv's when it reads channels last; a
qadd's when both operands are. Every other reader of
such a value (a graph output, global pooling, a float op...) reads it through one ``transpose`` back to NCHW,
under the value's original name, so nothing else in the graph changes. The kernels compute the same integers in
another order of memory, so the results stay bit for bit what they were.
"""
from __future__ import annotations

import logging
from typing import Dict, List, Set, Tuple

import numpy as np

from tether.graph.ir import Graph, Node, TensorType
from tether.graph.passes.quantize import Rewriter
from tether.ops import qconv as qops

log = logging.getLogger(__name__)

_TO_NCHW = [0, 3, 1, 2]


class _Chain:
    """One int8 kernel's nodes, from the 8-bit image it reads (``src``) to the 8-bit image it writes (``out``)."""

    def __init__(self, kind: str, nodes: List[Node], src: List[str], out: str) -> None:
        self.kind, self.nodes, self.src, self.out = kind, nodes, src, out


def _scalar_params(params: Dict[str, np.ndarray], names: List[str]) -> bool:
    return all(n in params and params[n].size == 1 for n in names)


def _with_clips(graph: Graph, rw: Rewriter, readers: Dict[str, List[Node]], chain: _Chain) -> _Chain:
    """`chain` with the clips that alone read its output, one after another, taken in (their bounds are attributes:
    the same integers in either layout)."""
    while rw.uses.get(chain.out) == 1 and len(readers.get(chain.out, [])) == 1:
        clip = readers[chain.out][0]
        if clip.op != "clip" or len(clip.inputs) != 1 or \
                graph.types[clip.outputs[0]].dtype != graph.types[chain.out].dtype:
            break
        chain = _Chain(chain.kind, chain.nodes + [clip], chain.src, clip.outputs[0])
    return chain


def _chains(graph: Graph, params: Dict[str, np.ndarray], rw: Rewriter) -> List[_Chain]:
    """The int8 kernels in execution order: conv chains (pixel and matmul form), depthwise chains, qadds."""
    readers: Dict[str, List[Node]] = {}
    for n in graph.nodes:
        for i in set(n.inputs):
            readers.setdefault(i, []).append(n)
    found = [_with_clips(graph, rw, readers, ch) for ch in _kernel_chains(graph, params, rw)]
    return found


def _kernel_chains(graph: Graph, params: Dict[str, np.ndarray], rw: Rewriter) -> List[_Chain]:
    producer, uses = rw.producer, rw.uses
    found = []
    for n in graph.nodes:
        if n.op == "qadd" and _scalar_params(params, n.inputs[2:]) and len(graph.types[n.outputs[0]].shape) == 4:
            found.append(_Chain("qadd", [n], list(n.inputs[:2]), n.outputs[0]))
            continue
        if n.op == "requantize" and _scalar_params(params, n.inputs[2:]) and n.inputs[1] in params:
            acc = producer.get(n.inputs[0])
            if acc is not None and acc.op == "qdepthwise2d" and uses.get(acc.outputs[0]) == 1:
                found.append(_Chain("depthwise", [acc, n], [acc.inputs[0]], n.outputs[0]))
            continue
        if n.op == "max_pool" and _plain_pool(n):
            chain = _max_pool_chain(graph, rw, n)
            if chain is not None:
                found.append(chain)
            continue
        if n.op == "reduce" and n.attrs.get("kind") == "sum" and list(n.attrs.get("axes", [])) == [2, 3] and \
                n.attrs.get("keepdims"):
            cast = producer.get(n.inputs[0])
            if cast is not None and cast.op == "cast" and uses.get(cast.outputs[0]) == 1 and \
                    len(graph.types[cast.inputs[0]].shape) == 4:
                found.append(_Chain("pool", [cast, n], [cast.inputs[0]], n.outputs[0]))
            continue
        if n.op != "reshape" or len(graph.types[n.outputs[0]].shape) != 4:
            continue
        rq = producer.get(n.inputs[0])
        if rq is None or rq.op != "requantize" or uses.get(rq.outputs[0]) != 1 or rq.inputs[1] not in params \
                or not _scalar_params(params, rq.inputs[2:]):
            continue
        conv = producer.get(rq.inputs[0])
        if conv is None or conv.op != "qconv2d" or uses.get(conv.outputs[0]) != 1:
            continue
        if len(params[conv.inputs[1]].shape) == 3:        # the pixel form: its input is the image itself
            if len(graph.types[conv.inputs[0]].shape) == 4:
                found.append(_Chain("pixels", [conv, rq, n], [conv.inputs[0]], n.outputs[0]))
            continue
        view = producer.get(conv.inputs[0])               # the matmul form reads a (C, H*W) view
        if view is not None and view.op == "reshape" and uses.get(view.outputs[0]) == 1 and \
                len(graph.types[view.inputs[0]].shape) == 4:
            found.append(_Chain("pointwise", [view, conv, rq, n], [view.inputs[0]], n.outputs[0]))
    return found


def _plain_pool(n: Node) -> bool:
    a = n.attrs
    return len(a["kernel"]) == 2 and list(a["dilations"]) == [1, 1] and not a.get("ceil_mode")


def _max_pool_chain(graph: Graph, rw: Rewriter, pool: Node):
    """A max pool of 8-bit values: on them (the QOperator form), or between a cast to float32 and one back (the
    QDQ form's moved Q/DQ pair, passes/quantize.py)."""
    producer, uses = rw.producer, rw.uses
    x, out, nodes = pool.inputs[0], pool.outputs[0], [pool]
    if str(graph.types[x].dtype) not in ("uint8", "int8"):
        cast = producer.get(x)
        users = [n for n in graph.nodes if out in n.inputs]
        if cast is None or cast.op != "cast" or uses.get(x) != 1 or uses.get(out) != 1 or len(users) != 1 or \
                users[0].op != "cast":
            return None
        x, out = cast.inputs[0], users[0].outputs[0]
        if str(graph.types[x].dtype) not in ("uint8", "int8") or graph.types[out].dtype != graph.types[x].dtype:
            return None
        nodes = [cast, pool, users[0]]
    if len(graph.types[x].shape) != 4 or graph.types[x].shape[0] != 1:
        return None
    return _Chain("max_pool", nodes, [x], out)


def _layouts(graph: Graph, chains: List[_Chain]) -> Set[str]:
    """The values that go channels last (module doc), deciding each kernel in execution order."""
    reads: Dict[str, List[_Chain]] = {}
    for ch in chains:
        for s in ch.src:
            reads.setdefault(s, []).append(ch)
    last: Set[str] = set()
    for ch in chains:
        src_last = all(s in last for s in ch.src)
        if ch.kind == "pool":
            go = False                                  # its (1, C, 1, 1) sums are the same in either layout
        elif ch.kind in ("qadd", "depthwise", "max_pool"):
            go = src_last
        else:
            go = bool(reads.get(ch.out))
        if go:
            last.add(ch.out)
    return last


def int8_channels_last(graph: Graph, params: Dict[str, np.ndarray]) -> Tuple[Graph, Dict[str, np.ndarray]]:
    graph = graph.copy()
    graph.types = dict(graph.types)
    params = dict(params)
    rw = Rewriter(graph, params)
    chains = _chains(graph, params, rw)
    last = _layouts(graph, chains)
    if not last:
        return graph, params
    nhwc = {}
    for v in last:
        n, c, h, w = graph.types[v].shape
        nhwc[v] = rw.fresh(v + "_nhwc")
        graph.types[nhwc[v]] = TensorType((n, h, w, c), graph.types[v].dtype)
    # the readers that take the channels-last value itself (the chains rewritten below); the others read it
    # through a transpose back, kept under the original name
    direct: Dict[str, int] = {}
    rewrite: Dict[int, List[Node]] = {}
    for ch in chains:
        src_last = [s in last for s in ch.src]
        if not any(src_last) and ch.out not in last:
            continue
        if ch.kind in ("qadd", "depthwise", "pool", "max_pool") and not all(src_last):
            continue
        new = _rewrite(ch, graph, params, rw, nhwc, last)
        for s in ch.src:
            if s in last:
                direct[s] = direct.get(s, 0) + 1
        rewrite[id(ch.nodes[-1])] = new
        for n in ch.nodes[:-1]:
            rewrite[id(n)] = []
    back: Dict[str, Node] = {}
    for v in last:
        if rw.uses.get(v, 0) > direct.get(v, 0):
            back[v] = Node("transpose", rw.fresh(v + "_to_nchw_node"), [nhwc[v]], [v], {"axes": list(_TO_NCHW)})
    back_after = {nhwc[v]: t for v, t in back.items()}
    nodes = []
    for n in graph.nodes:
        for m in rewrite.get(id(n), [n]):
            nodes.append(m)
            nodes.extend(back_after[o] for o in m.outputs if o in back_after)
    graph.nodes = nodes
    log.debug("int8_channels_last: %d int8 values channels last, %d read back as NCHW", len(last), len(back))
    return graph, params


def _rewrite(ch: _Chain, graph: Graph, params: Dict[str, np.ndarray], rw: Rewriter, nhwc: Dict[str, str],
             last: Set[str]) -> List[Node]:
    """The chain's nodes reading its channels-last sources and writing its output in the layout decided."""
    k = next((i for i, n in enumerate(ch.nodes) if n.op == "clip"), len(ch.nodes))
    clips = ch.nodes[k:]
    if not clips:
        return _rewrite_kernel(ch, graph, params, rw, nhwc, last, [])
    kernel_out = ch.nodes[k - 1].outputs[0]
    if ch.kind in ("pixels", "pointwise"):
        # before the reshape to the image: the conv's write-back takes the clips in
        return _rewrite_kernel(_Chain(ch.kind, ch.nodes[:k], ch.src, ch.out), graph, params, rw, nhwc, last, clips)
    if ch.out not in last:
        return _rewrite_kernel(_Chain(ch.kind, ch.nodes[:k], ch.src, kernel_out), graph, params, rw, nhwc, last,
                               []) + clips
    mid = rw.fresh(kernel_out + "_nhwc")
    graph.types[mid] = graph.types[nhwc[ch.out]]
    nodes = _rewrite_kernel(_Chain(ch.kind, ch.nodes[:k], ch.src, kernel_out), graph, params, rw,
                            dict(nhwc, **{kernel_out: mid}), last | {kernel_out}, [])
    return nodes + _clips_between(clips, mid, nhwc[ch.out], graph, rw)


def _clips_between(clips: List[Node], src: str, out: str, graph: Graph, rw: Rewriter) -> List[Node]:
    """The clips rewritten to read `src` and write `out`, through fresh values of `src`'s type."""
    nodes = []
    for i, clip in enumerate(clips):
        if i == len(clips) - 1:
            dst = out
        else:
            dst = rw.fresh(clip.outputs[0] + "_nhwc")
            graph.types[dst] = graph.types[src]
        nodes.append(Node("clip", clip.name, [src], [dst], dict(clip.attrs)))
        src = dst
    return nodes


def _rewrite_kernel(ch: _Chain, graph: Graph, params: Dict[str, np.ndarray], rw: Rewriter, nhwc: Dict[str, str],
                    last: Set[str], clips: List[Node]) -> List[Node]:
    """`_rewrite` of the chain's kernel nodes; a conv applies `clips` to its requantized output."""
    out = nhwc.get(ch.out, ch.out)
    if ch.kind == "qadd":
        (n,) = ch.nodes
        return [Node(n.op, n.name, [nhwc[s] for s in ch.src] + list(n.inputs[2:]), [out], dict(n.attrs))]
    if ch.kind == "max_pool":
        pool = next(n for n in ch.nodes if n.op == "max_pool")
        attrs = {k: list(pool.attrs[k]) for k in ("kernel", "strides", "pads")}
        return [Node("max_pool_nhwc", pool.name, [nhwc[ch.src[0]]], [out], attrs)]
    if ch.kind == "pool":
        # global pooling's integer sums over the pixels, read channels last: (1, 1, 1, C) is (1, C, 1, 1)'s memory
        cast, red = ch.nodes
        dtype = graph.types[cast.outputs[0]].dtype
        wide = rw.fresh(cast.outputs[0] + "_nhwc")
        graph.types[wide] = TensorType(graph.types[nhwc[ch.src[0]]].shape, dtype)
        sums = rw.fresh(red.outputs[0] + "_nhwc")
        c = graph.types[out].shape[1]
        graph.types[sums] = TensorType((1, 1, 1, c), graph.types[out].dtype)
        return [Node("cast", cast.name, [nhwc[ch.src[0]]], [wide], dict(cast.attrs)),
                Node("reduce", red.name, [wide], [sums], dict(red.attrs, axes=[1, 2])),
                Node("reshape", rw.fresh(red.name + "_nchw_view"), [sums], [out], {"shape": (1, c, 1, 1)})]
    if ch.kind == "depthwise":
        dw, rq = ch.nodes
        w = params[dw.inputs[1]]
        wt = rw.const(np.ascontiguousarray(w.transpose(1, 2, 0)), "qdw_nhwc_w")
        acc = rw.fresh(dw.outputs[0] + "_nhwc")
        graph.types[acc] = TensorType(graph.types[out].shape, "float32")
        return [Node("qdepthwise2d_nhwc", dw.name, [nhwc[ch.src[0]], wt, dw.inputs[2]], [acc], dict(dw.attrs)),
                Node("requantize", rq.name, [acc, _along_last(params, rw, rq.inputs[1])] + list(rq.inputs[2:]),
                     [out], dict(rq.attrs))]
    view_or_conv = ch.nodes[0]
    conv, rq, image = ch.nodes[-3:]
    src_last = ch.src[0] in last
    attrs = dict(conv.attrs)
    wname = conv.inputs[1]
    x = conv.inputs[0]
    if ch.kind == "pointwise":
        # the matmul form reads planar pixels: as the pixel form, the same weights in its panels
        oc, c = attrs["out_channels"], attrs["channels"]
        wname = rw.const(qops.pack_weights(qops.unpack_weights(params[wname], oc, c, (1, 1))), "qconv_w")
        x = view_or_conv.inputs[0]
    if src_last:
        x, attrs["channels_last_in"] = nhwc[ch.src[0]], 1
    nodes: List[Node] = []
    if ch.out not in last:
        acc, y, m = conv.outputs[0], rq.outputs[0], rq.inputs[1]
    else:
        attrs["channels_last_out"] = 1
        oc = attrs["out_channels"]
        acc = rw.fresh(conv.outputs[0] + "_nhwc")
        y = rw.fresh(rq.outputs[0] + "_nhwc")
        pixels = graph.types[conv.outputs[0]].shape[1]
        graph.types[acc] = TensorType((pixels, oc), "int32")
        graph.types[y] = TensorType((pixels, oc), graph.types[rq.outputs[0]].dtype)
        m = _along_last(params, rw, rq.inputs[1])
    nodes.append(Node("qconv2d", conv.name, [x, wname, conv.inputs[2]], [acc], attrs))
    if clips:
        requantized = rw.fresh(y + "_requantized")
        graph.types[requantized] = graph.types[y]
        nodes.append(Node("requantize", rq.name, [acc, m] + list(rq.inputs[2:]), [requantized], dict(rq.attrs)))
        nodes.extend(_clips_between(clips, requantized, y, graph, rw))
    else:
        nodes.append(Node("requantize", rq.name, [acc, m] + list(rq.inputs[2:]), [y], dict(rq.attrs)))
    nodes.append(Node("reshape", image.name, [y], [out], {"shape": tuple(graph.types[out].shape)}))
    return nodes


def _along_last(params: Dict[str, np.ndarray], rw: Rewriter, name: str) -> str:
    """A per-channel constant (any shape with one axis of C) as (C,), broadcasting along the last axis."""
    v = params[name]
    return name if v.size == 1 else rw.const(np.ascontiguousarray(v.reshape(-1)), name + "_nhwc")
