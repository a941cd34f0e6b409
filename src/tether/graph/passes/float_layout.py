"""float activations kept channels last through depthwise-separable blocks: ``float_channels_last(graph, params)``.

A depthwise conv computed on NCHW planes vectorizes along a row of output columns: a stride takes every other
lane, rows of 4 to 16 columns fill a vector badly, and each tap is an unaligned load. With the channels innermost
every tap is one aligned vector load and one fused multiply-add whatever the stride or the map size, as XNNPACK
and the int8 kernels here (graph/passes/int8_layout.py) do it. Around it, a pointwise conv on channels-last
activations is a plain matrix product, ``(pixels, C) x (C, O)``, that writes its rows as they are computed, where
the NCHW one transposes its register block on the way out. So MobileNet-style blocks (pointwise expand,
depthwise, pointwise project, residual add) run channels last from the first depthwise conv on:

- a depthwise conv (one filter per channel, no dilation, batch 1) becomes ``depthwise_conv2d_nhwc``
  (kernels/layout_ops.py), weights ``(KH, KW, C)``, and takes in the per-channel add that follows it as its bias.
  It seeds a region only when a pointwise conv reads its result (through elementwise ops);
- a 1-D conv (a map one row high, a kernel wider than one tap or strided, groups 1) reads its input channels last
  and writes ``(OW, O)``, wherever it is (``conv2d {channels_last_in, channels_last_out}``): its patches are
  then runs of contiguous elements (ops.conv2d_pixels), and a chain of them (an audio encoder's feature
  extractor) passes its activations on with no transpose between;
- a conv reading NCHW (groups 1, a map larger than 1x1) whose result a channels-last kernel reads writes
  ``(OH*OW, O)`` itself (``conv2d {channels_last_out}``: conv2d_pixels' register blocks as they are); an NCHW
  value any other channels-last node reads is transposed in, once;
- a pointwise conv (1x1, stride 1, no padding, batch 1) whose input is channels last becomes ``dense`` on the
  ``(H*W, C)`` view of it, with the weights ``(O, C)`` (build time packs them into the matmul's panels);
- an elementwise op with a channels-last image operand runs on the images as they are, its per-channel constants
  and computed ``(1, C, 1, 1)`` operands (a squeeze-excite scale) viewed as ``(C,)``;
- max pools become ``max_pool_nhwc``, pads permute their pads, global average pooling averages over the pixels
  (``(1, C)``, viewed as ``(1, C, 1, 1)``), and a transpose to NHWC of a channels-last value (a TFLite model's
  output edge) is a view;
- a resize over the height and width and a concat along the channels follow where a channels-last node reads
  their result (an FPN neck feeding depthwise convs), else they stay NCHW (``_unread_moves``).

A connected region that holds a depthwise conv over channels no 8-lane vector divides stays NCHW
(``_vector_regions``). A channels-last value is held as ``(H*W, C)`` or ``(1, H, W, C)``, whichever its producer
writes; the other is a view (a reshape: no kernel, no copy). Every other reader (a graph output, a 3x3 conv...)
reads it through one ``transpose`` back to NCHW under the value's original name, so nothing else in the graph
changes. Float results differ from the NCHW kernels' only in the order of each sum's terms.
"""
from __future__ import annotations

import logging
from typing import Callable, Dict, List, Optional, Set, Tuple

import numpy as np

from tether.graph import op_info
from tether.graph.guards import GUARD_ATTR
from tether.graph.ir import Graph, Node, TensorType
from tether.graph.passes.quantize import Rewriter

log = logging.getLogger(__name__)

# the activations the pass moves: float32, and float16 where half_precision computes in it
FLOATS = ("float32", "float16")
# A depthwise conv over channels this does not divide keeps its region NCHW (_vector_regions)
VECTOR_CHANNELS = 8



def _image(graph: Graph, v: str) -> bool:
    t = graph.types.get(v)
    return t is not None and len(t.shape) == 4 and t.shape[0] == 1 and str(t.dtype) in FLOATS


def _same_float(graph: Graph, n: Node, w: np.ndarray) -> bool:
    """Float weights of the dtype of the node's input (float32, or float16 after half_precision)."""
    return str(w.dtype) in FLOATS and str(w.dtype) == str(graph.types[n.inputs[0]].dtype)


def _float_conv(graph: Graph, params: Dict[str, np.ndarray], n: Node) -> Optional[np.ndarray]:
    """The weights of a conv2d of one float image by constant 4-D weights of its dtype, or None."""
    if n.op != "conv2d" or len(n.inputs) != 2 or n.inputs[1] not in params or not _image(graph, n.inputs[0]):
        return None
    w = params[n.inputs[1]]
    return w if w.ndim == 4 and _same_float(graph, n, w) else None


def _depthwise(graph: Graph, params: Dict[str, np.ndarray], n: Node) -> bool:
    w = _float_conv(graph, params, n)
    if w is None:
        return False
    ch = graph.types[n.inputs[0]].shape[1]
    return n.attrs["groups"] == ch and w.shape[:2] == (ch, 1) and list(n.attrs["dilations"]) == [1, 1]


def _pointwise(graph: Graph, params: Dict[str, np.ndarray], n: Node) -> bool:
    w = _float_conv(graph, params, n)
    return (w is not None and n.attrs["groups"] == 1 and w.shape[2:] == (1, 1)
            and list(n.attrs["strides"]) == [1, 1] and not any(n.attrs["pads"]))


# A 1-D conv reduces over at least this many input elements per output to go channels last (_row_conv): below it
# the transposes in and out cost more than the contiguous patches save
ROW_CONV_MIN_REDUCE = 64


def _row_conv(graph: Graph, params: Dict[str, np.ndarray], n: Node) -> bool:
    """A 1-D conv (one float image one row high, groups 1, no dilation) that is not a pointwise one, with at least
    ROW_CONV_MIN_REDUCE products per output: it runs channels last in and out."""
    w = _float_conv(graph, params, n)
    if w is None or n.attrs["groups"] != 1 or list(n.attrs["dilations"]) != [1, 1]:
        return False
    h = graph.types[n.inputs[0]].shape[2]
    pads = list(n.attrs["pads"])
    return (h == 1 and w.shape[2] == 1 and pads[0] == pads[2] == 0 and w.shape[1] * w.shape[3] >= ROW_CONV_MIN_REDUCE
            and (w.shape[3] > 1 or list(n.attrs["strides"]) != [1, 1]))


def _per_channel(params: Dict[str, np.ndarray], v: str, ch: int) -> bool:
    """A constant that broadcasts over an NCHW image along its channels only: (C, 1, 1), (1, C, 1, 1) or a scalar."""
    if v not in params:
        return False
    s = params[v].shape
    if params[v].size == 1 and len(s) <= 4:
        return True
    s4 = (1,) * (4 - len(s)) + tuple(s) if len(s) <= 4 else None
    return s4 is not None and s4[0] == 1 and s4[1] == ch and s4[2:] == (1, 1)


def _elementwise(graph: Graph, params: Dict[str, np.ndarray], n: Node) -> Optional[List[str]]:
    """The image operands of an elementwise node that could run channels last (its output's shape, every other
    operand per channel), or None."""
    if op_info.pattern(n.op) != "elemwise" or len(n.outputs) != 1 or not _image(graph, n.outputs[0]):
        return None
    shape = graph.types[n.outputs[0]].shape
    images = []
    for v in n.inputs:
        if v in params:
            if not _per_channel(params, v, shape[1]):
                return None
        elif tuple(graph.types[v].shape) == tuple(shape) and graph.types[v].dtype == graph.types[n.outputs[0]].dtype:
            images.append(v)
        elif tuple(graph.types[v].shape) != (1, shape[1], 1, 1):    # (a squeeze-excite scale: per channel)
            return None
    return images or None


def _global_pool(graph: Graph, n: Node) -> bool:
    return n.op == "global_avg_pool" and _image(graph, n.inputs[0])


def _max_pool(graph: Graph, n: Node) -> bool:
    a = n.attrs
    return (n.op == "max_pool" and len(n.outputs) == 1 and _image(graph, n.inputs[0]) and len(a["kernel"]) == 2
            and list(a["dilations"]) == [1, 1] and not a.get("ceil_mode"))


def _pad(graph: Graph, n: Node) -> bool:
    return n.op == "pad" and len(n.inputs) == 1 and len(n.attrs["pads"]) == 8 and _image(graph, n.inputs[0])


def _resize(graph: Graph, n: Node) -> bool:
    """A resize of an image over its height and width only (an FPN's upsampling)."""
    return (n.op == "resize" and len(n.outputs) == 1 and _image(graph, n.inputs[0])
            and all(a["axis"] in (2, 3) for a in n.attrs["axes"]))


def _concat(graph: Graph, n: Node) -> bool:
    """A concatenation of images along their channels."""
    return (n.op == "concat" and len(n.outputs) == 1 and n.attrs["axis"] in (1, -3)
            and all(_image(graph, v) for v in n.inputs))


def _to_nhwc(graph: Graph, n: Node) -> bool:
    return n.op == "transpose" and list(n.attrs["axes"]) == [0, 2, 3, 1] and _image(graph, n.inputs[0])


def _layouts(graph: Graph, params: Dict[str, np.ndarray], readers: Dict[str, List[Node]]) -> Set[str]:
    """The NCHW values that go channels last, deciding each node in execution order."""
    last: Set[str] = set()
    for n in graph.nodes:
        if _depthwise(graph, params, n):
            src = n.inputs[0]
            if src in last or _feeds_pointwise(graph, params, readers, n.outputs[0]):
                last.add(n.outputs[0])
        elif _pointwise(graph, params, n) and n.inputs[0] in last:
            last.add(n.outputs[0])
        elif _row_conv(graph, params, n):
            last.add(n.outputs[0])
        elif _conv(graph, params, n):
            if _feeds_region(graph, params, readers, n.outputs[0]):
                last.add(n.outputs[0])
        elif _max_pool(graph, n) or _pad(graph, n) or _resize(graph, n):
            if n.inputs[0] in last:
                last.add(n.outputs[0])
        elif _concat(graph, n):
            if any(v in last for v in n.inputs):
                last.add(n.outputs[0])
        else:
            # (an image operand still NCHW is transposed in: one pass, where the value itself would need two)
            images = _elementwise(graph, params, n)
            if images and any(v in last for v in images):
                last.add(n.outputs[0])
    return _unread_moves(graph, params, readers, _vector_regions(graph, params, last))


def _unread_moves(graph: Graph, params: Dict[str, np.ndarray], readers: Dict[str, List[Node]],
                  last: Set[str]) -> Set[str]:
    """`last` without the resizes and concats whose result nothing reads channels last: moved, they would only
    move the transpose back to NCHW after them (onto a resize's larger output). Only where a channels-last node
    reads them (an FPN's upsample + concat feeding a depthwise conv: PicoDet's neck) they save a round trip."""
    def reads_last(r: Node) -> bool:
        if _to_nhwc(graph, r) or _global_pool(graph, r):
            return True
        return bool(r.outputs) and r.outputs[0] in last and not (
            _conv(graph, params, r) and not _row_conv(graph, params, r))    # (that conv reads NCHW)

    movable = {n.outputs[0] for n in graph.nodes
               if n.outputs and n.outputs[0] in last and (_resize(graph, n) or _concat(graph, n))}
    changed = True
    while changed:
        changed = False
        for v in list(movable):
            if v not in graph.outputs and any(reads_last(r) for r in readers.get(v, [])):
                continue
            last.discard(v)
            movable.discard(v)
            changed = True
    return last


def _vector_regions(graph: Graph, params: Dict[str, np.ndarray], last: Set[str]) -> Set[str]:
    """`last` without its connected regions that hold a depthwise conv over channels no 8-lane vector divides:
    such a conv runs channels last on quarter vectors or lane by lane, and BlazeFace's (28, 36 and 42 channels
    at 32x32 and 64x64) ran slower so than on NCHW rows, for the whole model (AVX-512, one thread)."""
    root: Dict[str, str] = {v: v for v in last}

    def find(v: str) -> str:
        while root[v] != v:
            root[v] = root[root[v]]
            v = root[v]
        return v

    for n in graph.nodes:
        if n.outputs and n.outputs[0] in last:
            for v in n.inputs:
                if v in last:
                    root[find(v)] = find(n.outputs[0])
    bad = {find(n.outputs[0]) for n in graph.nodes
           if n.outputs and n.outputs[0] in last and _depthwise(graph, params, n)
           and graph.types[n.inputs[0]].shape[1] % VECTOR_CHANNELS}
    return {v for v in last if find(v) not in bad}


def _conv(graph: Graph, params: Dict[str, np.ndarray], n: Node) -> bool:
    """A conv2d that can write channels last (``channels_last_out``: conv2d_pixels' own (pixels, O) blocks):
    one image, groups 1, constant float weights, a map larger than one pixel."""
    # (over a 1x1 map, a squeeze-excite's, both layouts are the same bytes: nothing to gain)
    return (_float_conv(graph, params, n) is not None and n.attrs["groups"] == 1
            and tuple(graph.types[n.inputs[0]].shape[2:]) != (1, 1))


def _reaches(graph: Graph, params: Dict[str, np.ndarray], readers: Dict[str, List[Node]], v: str,
             target: Callable[[Node], bool]) -> bool:
    """Whether a node for which `target` holds reads `v` as its image (first) input, directly or through
    elementwise ops (a bias add, an activation), within a few values."""
    frontier, seen = [v], set()
    while frontier and len(seen) < 16:
        x = frontier.pop()
        seen.add(x)
        for r in readers.get(x, []):
            if r.inputs and r.inputs[0] == x and target(r):
                return True
            if _elementwise(graph, params, r) is not None and r.outputs[0] not in seen:
                frontier.append(r.outputs[0])
    return False


def _feeds_pointwise(graph: Graph, params: Dict[str, np.ndarray], readers: Dict[str, List[Node]], v: str) -> bool:
    return _reaches(graph, params, readers, v, lambda r: _pointwise(graph, params, r))


def _feeds_region(graph: Graph, params: Dict[str, np.ndarray], readers: Dict[str, List[Node]], v: str) -> bool:
    """Whether a depthwise conv that starts a region (a pointwise conv reads its result) reads `v`. (Only
    depthwise convs start regions: a ResNet's 3x3 -> 1x1 pairs stay NCHW.)"""
    return _reaches(graph, params, readers, v, lambda r: _depthwise(graph, params, r)
                    and _feeds_pointwise(graph, params, readers, r.outputs[0]))


def _form_type(graph: Graph, v: str, rank: int) -> TensorType:
    """The type of NCHW image `v` channels last: (1, H, W, C) for `rank` 4, the (H*W, C) view for 2."""
    _, c, h, w = graph.types[v].shape
    return TensorType((1, h, w, c) if rank == 4 else (h * w, c), graph.types[v].dtype)


def _form_suffix(rank: int) -> str:
    return "_nhwc" if rank == 4 else "_pc"


class _Values:
    """The channels-last forms of the values in ``last``: (H*W, C) and (1, H, W, C), one made, the other a view."""

    def __init__(self, graph: Graph, rw: Rewriter) -> None:
        self.graph, self.rw = graph, rw
        self.forms: Dict[str, Dict[int, str]] = {}

    def new(self, v: str, rank: int) -> str:
        name = self.rw.fresh(v + _form_suffix(rank))
        self.graph.types[name] = _form_type(self.graph, v, rank)
        self.forms[v] = {rank: name}
        return name

    def get(self, v: str, rank: int, out: List[Node]) -> str:
        """The value as `rank` 4 or 2, adding a reshape view to `out` the first time it is asked for."""
        forms = self.forms[v]
        if rank not in forms:
            (have,) = forms.values()
            forms[rank] = _view(self.graph, self.rw, v, have, rank, out)
        return forms[rank]


def _view(graph: Graph, rw: Rewriter, v: str, have: str, rank: int, out: List[Node]) -> str:
    """A reshape view of `have` (a channels-last form of `v`) as `rank` 4 or 2, added to `out`."""
    t = _form_type(graph, v, rank)
    name = rw.fresh(v + _form_suffix(rank))
    graph.types[name] = t
    out.append(Node("reshape", rw.fresh(name + "_view"), [have], [name], {"shape": t.shape}))
    return name


def float_channels_last(graph: Graph, params: Dict[str, np.ndarray]) -> Tuple[Graph, Dict[str, np.ndarray]]:
    graph = graph.copy()
    graph.types = dict(graph.types)
    params = dict(params)
    readers: Dict[str, List[Node]] = {}
    for n in graph.nodes:
        for v in set(n.inputs):
            readers.setdefault(v, []).append(n)
    last = _layouts(graph, params, readers)
    if not last:
        return graph, params
    rw = Rewriter(graph, params)
    vals = _Values(graph, rw)
    entered: Dict[str, Dict[int, str]] = {}     # NCHW value -> its transpose to (1, H, W, C) and views, made once
    taken: Set[int] = set()             # nodes folded into an earlier rewrite (a depthwise conv's bias add)
    nodes: List[Node] = []
    direct: Dict[str, int] = {}         # channels-last value -> readers that take it as it is

    def read(v: str, rank: int) -> str:
        """Image operand `v` of a rewritten node as `rank` 2 or 4: its channels-last form, or an NCHW value
        transposed in."""
        if v in vals.forms:
            direct[v] = direct.get(v, 0) + 1
            return vals.get(v, rank, nodes)
        if v not in entered:
            name = rw.fresh(v + "_to_nhwc")
            graph.types[name] = _form_type(graph, v, 4)
            nodes.append(Node("transpose", rw.fresh(v + "_to_nhwc_node"), [v], [name], {"axes": [0, 2, 3, 1]}))
            entered[v] = {4: name}
        if rank not in entered[v]:
            entered[v][rank] = _view(graph, rw, v, entered[v][4], rank, nodes)
        return entered[v][rank]

    def channel_view(v: str) -> str:
        """A computed (1, C, 1, 1) operand as (C,): the same memory."""
        c = graph.types[v].shape[1]
        name = rw.fresh(v + "_c")
        graph.types[name] = TensorType((c,), graph.types[v].dtype)
        nodes.append(Node("reshape", rw.fresh(name + "_view"), [v], [name], {"shape": (c,)}))
        return name

    def channel_const(v: str) -> str:
        p = params[v]
        return v if p.size == 1 and p.ndim <= 1 else rw.const(np.ascontiguousarray(p.reshape(-1)), v + "_c")

    for n in graph.nodes:
        if id(n) in taken:
            continue
        out = n.outputs[0]
        if _to_nhwc(graph, n) and n.inputs[0] in vals.forms:
            # a transpose to channels last (a TFLite model's output edge) of a value that already is: a view
            nodes.append(Node("reshape", n.name, [read(n.inputs[0], 4)], [out], {"shape": graph.types[out].shape}))
            continue
        if out not in last and not (_global_pool(graph, n) and n.inputs[0] in last):
            nodes.append(n)
            continue
        if _depthwise(graph, params, n):
            x = read(n.inputs[0], 4)
            w = params[n.inputs[1]]
            wt = rw.const(np.ascontiguousarray(w[:, 0].transpose(1, 2, 0)), n.inputs[1] + "_hwc")
            bias_add = _bias_add(graph, params, readers, n)
            ch = w.shape[0]
            if bias_add is not None:
                taken.add(id(bias_add))
                b = params[next(v for v in bias_add.inputs if v != out)]
                bias = rw.const(np.ascontiguousarray(np.broadcast_to(b.reshape(-1), (ch,)), dtype=w.dtype),
                                n.inputs[1] + "_bias")
                out = bias_add.outputs[0]
            else:
                bias = rw.const(np.zeros(ch, w.dtype), n.inputs[1] + "_bias")
            attrs = dict(_marks(n), strides=list(n.attrs["strides"]), pads=list(n.attrs["pads"]))
            nodes.append(Node("depthwise_conv2d_nhwc", n.name, [x, wt, bias], [vals.new(out, 4)], attrs))
        elif _pointwise(graph, params, n) and n.inputs[0] in last:
            x = read(n.inputs[0], 2)
            w = params[n.inputs[1]]
            wm = rw.const(np.ascontiguousarray(w.reshape(w.shape[0], w.shape[1])), n.inputs[1] + "_oc")
            nodes.append(Node("dense", n.name, [x, wm], [vals.new(out, 2)], _marks(n)))
        elif _row_conv(graph, params, n):
            nodes.append(Node("conv2d", n.name, [read(n.inputs[0], 4), n.inputs[1]], [vals.new(out, 2)],
                              dict(n.attrs, channels_last_in=1, channels_last_out=1)))
        elif _conv(graph, params, n):
            # (its input is NCHW: a channels-last one is read through its transpose back)
            nodes.append(Node("conv2d", n.name, list(n.inputs), [vals.new(out, 2)],
                              dict(n.attrs, channels_last_out=1)))
        elif _max_pool(graph, n):
            attrs = dict(_marks(n), **{k: list(n.attrs[k]) for k in ("kernel", "strides", "pads")})
            nodes.append(Node("max_pool_nhwc", n.name, [read(n.inputs[0], 4)], [vals.new(out, 4)], attrs))
        elif _resize(graph, n):
            nhwc_axis = {2: 1, 3: 2}
            axes = [dict(a, axis=nhwc_axis[a["axis"]]) for a in n.attrs["axes"]]
            nodes.append(Node("resize", n.name, [read(n.inputs[0], 4)] + list(n.inputs[1:]), [vals.new(out, 4)],
                              dict(n.attrs, axes=axes, shape=list(_form_type(graph, out, 4).shape))))
        elif _concat(graph, n):
            nodes.append(Node("concat", n.name, [read(v, 4) for v in n.inputs], [vals.new(out, 4)],
                              dict(n.attrs, axis=3)))
        elif _pad(graph, n):
            p8 = list(n.attrs["pads"])
            pads = [p8[i] for i in (0, 2, 3, 1, 4, 6, 7, 5)]
            nodes.append(Node("pad", n.name, [read(n.inputs[0], 4)], [vals.new(out, 4)], dict(n.attrs, pads=pads)))
        elif _global_pool(graph, n):
            x = read(n.inputs[0], 2)
            c = graph.types[n.inputs[0]].shape[1]
            mean = rw.fresh(out + "_pc")
            graph.types[mean] = TensorType((1, c), graph.types[out].dtype)
            nodes.append(Node("reduce", n.name, [x], [mean], dict(_marks(n), kind="mean", axes=[0], keepdims=1)))
            nodes.append(Node("reshape", rw.fresh(out + "_view"), [mean], [out], {"shape": (1, c, 1, 1)}))
        else:
            # an elementwise node: its image operands in the form of the first channels-last one
            images = _elementwise(graph, params, n)
            first = next(v for v in images if v in vals.forms)
            rank = 4 if 4 in vals.forms[first] else 2
            ins = [channel_const(v) if v in params else read(v, rank) if v in images else channel_view(v)
                   for v in n.inputs]
            nodes.append(Node(n.op, n.name, ins, [vals.new(out, rank)], dict(n.attrs)))
    # the readers that are not rewritten read a channels-last value through one transpose back, under its name
    uses: Dict[str, int] = {}
    for n in graph.nodes:
        if id(n) in taken:
            continue
        for v in n.inputs:
            uses[v] = uses.get(v, 0) + 1
    for v in graph.outputs:
        uses[v] = uses.get(v, 0) + 1
    back = [v for v in vals.forms if uses.get(v, 0) > direct.get(v, 0)]
    produced_at = {o: k for k, m in enumerate(nodes) for o in m.outputs}
    inserts: Dict[int, List[Node]] = {}
    for v in back:
        # read the form v's producer writes, right after it (a view made for a later reader comes too late)
        first = next(iter(vals.forms[v].values()))
        tmp: List[Node] = []
        x = first if len(graph.types[first].shape) == 4 else _view(graph, rw, v, first, 4, tmp)
        tmp.append(Node("transpose", rw.fresh(v + "_to_nchw_node"), [x], [v], {"axes": [0, 3, 1, 2]}))
        inserts.setdefault(produced_at[first], []).extend(tmp)
    graph.nodes = [m for k, n in enumerate(nodes) for m in [n] + inserts.get(k, [])]
    log.debug("float_channels_last: %d float values channels last, %d read back as NCHW", len(vals.forms), len(back))
    return graph, params


def _marks(n: Node) -> dict:
    """The run-time branch guard of `n` (graph/guards.py), for the node that replaces it."""
    return {GUARD_ATTR: n.attrs[GUARD_ATTR]} if GUARD_ATTR in n.attrs else {}


def _bias_add(graph: Graph, params: Dict[str, np.ndarray], readers: Dict[str, List[Node]], conv: Node):
    """The add of a per-channel constant that is the only reader of `conv`'s output, or None."""
    out = conv.outputs[0]
    rs = readers.get(out, [])
    if len(rs) != 1 or rs[0].op != "add" or out in graph.outputs or len(rs[0].inputs) != 2:
        return None
    other = next((v for v in rs[0].inputs if v != out), None)
    if other is None or not _per_channel(params, other, graph.types[out].shape[1]) or \
            tuple(graph.types[rs[0].outputs[0]].shape) != tuple(graph.types[out].shape):
        return None
    return rs[0]
