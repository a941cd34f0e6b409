"""Graph node -> te tensors of one kernel, through the op library (``tether.ops``).

``LOWER[op](attrs, *te_inputs) -> te.Tensor`` lowers one op; ``lower_kernel(node, types)`` lowers a whole node
(a fused one by walking its body in order), so conv2d -> add -> relu becomes one te expression tree whose
elementwise tail ``ops.schedule`` inlines into the conv's write-back. The few ops the library does not cover in
the needed generality (N-D pooling, LRN, slicing, reflect/edge padding, run-time pad values) are written here
directly in te. Single-image convolutions can run as GEMMs (``conv_gemm``), with constant weights packed into
panels once at build time (``pack_conv_weights``).
"""
from __future__ import annotations

import math
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np

from tether import ops, te
from tether.errors import UnsupportedOpError
from tether.graph import ops as graph_ops
from tether.graph.ir import Graph, Node, TensorType
from tether.graph.ops import pool_out_size
from tether.ops import common as c

Lowering = Callable[..., "te.Tensor"]
LOWER: Dict[str, Lowering] = {}


def lowering(*names: str):
    def deco(fn):
        for n in names:
            LOWER[n] = fn
        return fn
    return deco


def _unary_expr(x, fn, name):
    return c.compute(x.shape, lambda *i: fn(x[i]), name, c.ELEMWISE)


for _n, _f in {"relu": ops.relu, "sigmoid": ops.sigmoid, "tanh": ops.tanh, "exp": ops.exp, "log": ops.log,
               "sqrt": ops.sqrt, "neg": ops.negative, "abs": ops.abs, "hard_swish": ops.hard_swish}.items():
    LOWER[_n] = (lambda f: lambda attrs, x: f(x))(_f)

for _n, _f in {"add": ops.add, "sub": ops.subtract, "mul": ops.multiply, "div": ops.divide,
               "maximum": ops.maximum, "minimum": ops.minimum, "pow": ops.power}.items():
    LOWER[_n] = (lambda f: lambda attrs, a, b: f(a, b))(_f)


@lowering("clip")
def _clip(attrs, x):
    lo, hi = attrs.get("min", -math.inf), attrs.get("max", math.inf)

    def f(v):
        if math.isfinite(lo):
            v = c.max2(v, c.const(lo, x.dtype))
        if math.isfinite(hi):
            v = c.min2(v, c.const(hi, x.dtype))
        return v
    return _unary_expr(x, f, "clip")


@lowering("leaky_relu")
def _leaky(attrs, x):
    return ops.leaky_relu(x, attrs.get("alpha", 0.01))


@lowering("hard_sigmoid")
def _hsig(attrs, x):
    return ops.hard_sigmoid(x, attrs.get("alpha", 0.2), attrs.get("beta", 0.5))


@lowering("scale_shift")
def _scale_shift(attrs, x):
    s, b = c.const(attrs.get("scale", 1.0), x.dtype), c.const(attrs.get("shift", 0.0), x.dtype)
    return _unary_expr(x, lambda v: v * s + b, "scale_shift")


@lowering("reshape")
def _reshape(attrs, x):
    return ops.reshape(x, attrs["shape"])


@lowering("transpose")
def _transpose(attrs, x):
    return ops.transpose(x, attrs["axes"])


@lowering("concat")
def _concat(attrs, *xs):
    return ops.concat(list(xs), attrs["axis"])


@lowering("pad")
def _pad(attrs, x, *value):
    shape = c.shape_of(x)
    n = len(shape)
    pads = list(attrs["pads"])
    if any(p < 0 for p in pads):    # negative pads crop first
        begin = [max(-pads[i], 0) for i in range(n)]
        end = [shape[i] - max(-pads[i + n], 0) for i in range(n)]
        x = _strided_slice({"begin": begin, "end": end, "step": [1] * n}, x)
        shape = c.shape_of(x)
        pads = [max(p, 0) for p in pads]
    before, after = pads[:n], pads[n:]
    mode = attrs.get("mode", "constant")
    if mode == "constant" and not value:
        return ops.pad(x, before, after, attrs.get("value", 0.0))
    out_shape = tuple(e + b + a for e, b, a in zip(shape, before, after))

    def f(*idx):
        if mode == "constant":
            conds = [cond for i, e, b in zip(idx, shape, before) for cond in (i >= b, i < b + e)]
            src = x[tuple(te.min(te.max(i - b, 0), e - 1) for i, e, b in zip(idx, shape, before))]
            return te.if_then_else(c.all_of(conds), src, value[0][0])
        src = []
        for i, e, b in zip(idx, shape, before):
            j = i - b
            if mode == "edge":
                src.append(te.min(te.max(j, 0), e - 1))
            else:   # reflect (no edge repeat); pads are smaller than the extent
                j = te.if_then_else(j < 0, 0 - j, j)
                src.append(te.if_then_else(j > e - 1, 2 * (e - 1) - j, j))
        return x[tuple(src)]
    return c.compute(out_shape, f, "pad", c.INJECTIVE)


@lowering("strided_slice")
def _strided_slice(attrs, x):
    begin, end, step = attrs["begin"], attrs["end"], attrs["step"]
    out_shape = tuple(len(range(b, e, s)) for b, e, s in zip(begin, end, step))
    return c.compute(out_shape, lambda *idx: x[tuple(b + i * s for i, b, s in zip(idx, begin, step))],
                     "strided_slice", c.INJECTIVE)


@lowering("broadcast_to")
def _broadcast_to(attrs, x):
    shape = tuple(attrs["shape"])
    return c.compute(shape, lambda *idx: c.broadcast_load(x, idx, x.dtype), "broadcast_to", c.BROADCAST)


@lowering("dense")
def _dense(attrs, x, w):
    return ops.dense(x, w)


@lowering("batch_matmul")
def _bmm(attrs, a, b):
    return ops.batch_matmul(a, b)


@lowering("conv2d")
def _conv2d(attrs, x, w, *bias):
    return ops.conv2d(x, w, stride=tuple(attrs["strides"]), padding=tuple(attrs["pads"]),
                      dilation=tuple(attrs["dilations"]), groups=attrs["groups"], bias=bias[0] if bias else None)


def _window_counts(out: int, k: int, s: int, d: int, lo: int, hi: int) -> np.ndarray:
    start = np.arange(out)[:, None] * s + np.arange(k)[None, :] * d
    return ((start >= lo) & (start < hi)).sum(axis=1)


def _pool_nd(kind: str, attrs, x):
    """N-D max/avg pooling written directly in te (the library covers 2-D)."""
    shape = c.shape_of(x)
    nd = len(shape) - 2
    k, s, d, p = attrs["kernel"], attrs["strides"], attrs["dilations"], attrs["pads"]
    outs = [pool_out_size(shape[2 + i], k[i], s[i], d[i], p[i], p[i + nd], attrs["ceil_mode"]) for i in range(nd)]
    hi = [max(p[i + nd], (outs[i] - 1) * s[i] + (k[i] - 1) * d[i] + 1 - shape[2 + i] - p[i]) for i in range(nd)]
    fill = float(np.finfo(np.float32).min) if kind == "max" else 0.0
    xp = ops.pad(x, [0, 0] + list(p[:nd]), [0, 0] + hi, fill) if any(p[:nd]) or any(hi) else x
    rs = [te.reduce_axis((0, k[i]), name="r%d" % i) for i in range(nd)]

    def f(*idx):
        src = tuple(idx[:2]) + tuple(idx[2 + i] * s[i] + rs[i] * d[i] for i in range(nd))
        return te.max(xp[src], axis=rs) if kind == "max" else te.sum(xp[src], axis=rs)
    win = c.compute(tuple(shape[:2]) + tuple(outs), f, kind + "_pool", c.REDUCE)
    if kind == "max":
        return win
    tables = []
    for i in range(nd):
        lo_ = 0 if attrs.get("count_include_pad") else p[i]
        hi_ = (p[i] + shape[2 + i] + p[i + nd]) if attrs.get("count_include_pad") else p[i] + shape[2 + i]
        tables.append(_const_table(1.0 / _window_counts(outs[i], k[i], s[i], d[i], lo_, hi_), x.dtype))

    def g(*idx):
        v = win[idx]
        for i in range(nd):
            v = v * tables[i](idx[2 + i])
        return v
    return c.compute(win.shape, g, "avg_pool", c.BROADCAST)


def _const_table(values: np.ndarray, dtype: str):
    vals = [float(v) for v in values]
    # run-length encode: the divisor only changes near the borders
    runs = []
    for i, v in enumerate(vals):
        if runs and runs[-1][1] == v:
            runs[-1] = (i + 1, v)
        else:
            runs.append((i + 1, v))

    def table(i):
        expr = c.const(runs[-1][1], dtype)
        for end, v in reversed(runs[:-1]):
            expr = te.if_then_else(i < end, c.const(v, dtype), expr)
        return expr
    return table


def _pool(kind: str):
    def lower(attrs, x):
        nd = len(attrs["kernel"])
        if nd == 2:
            k, s, d, p = attrs["kernel"], attrs["strides"], attrs["dilations"], attrs["pads"]
            args = dict(kernel=tuple(k), stride=tuple(s), padding=tuple(p), dilation=tuple(d),
                        ceil_mode=bool(attrs["ceil_mode"]))
            if kind == "max":
                return ops.max_pool2d(x, **args)
            return ops.avg_pool2d(x, count_include_pad=bool(attrs.get("count_include_pad")), **args)
        return _pool_nd(kind, attrs, x)
    return lower


LOWER["max_pool"] = _pool("max")
LOWER["avg_pool"] = _pool("avg")


def _global_pool(kind: str):
    def lower(attrs, x):
        shape = c.shape_of(x)
        if len(shape) == 4:
            return ops.global_max_pool2d(x) if kind == "max" else ops.global_avg_pool2d(x)
        rs = [te.reduce_axis((0, e), name="r%d" % i) for i, e in enumerate(shape[2:])]
        inv = c.const(1.0 / float(np.prod(shape[2:])), x.dtype)

        def f(*idx):
            src = tuple(idx[:2]) + tuple(rs)
            return te.max(x[src], axis=rs) if kind == "max" else te.sum(x[src] * inv, axis=rs)
        return c.compute(tuple(shape[:2]) + (1,) * (len(shape) - 2), f, "global_pool", c.REDUCE)
    return lower


LOWER["global_max_pool"] = _global_pool("max")
LOWER["global_avg_pool"] = _global_pool("avg")


@lowering("softmax")
def _softmax(attrs, x):
    return ops.softmax(x, attrs["axis"])


@lowering("batch_norm")
def _bn(attrs, x, scale, bias, mean, var):
    return ops.batch_norm(x, scale, bias, mean, var, axis=1, epsilon=attrs["epsilon"])


@lowering("mean")
def _mean(attrs, x):
    return ops.mean(x, tuple(attrs["axes"]), bool(attrs.get("keepdims", True)))


@lowering("lrn")
def _lrn(attrs, x):
    shape = c.shape_of(x)
    size, alpha, beta, bias = attrs["size"], attrs["alpha"], attrs["beta"], attrs["bias"]
    lo, hi = (size - 1) // 2, size // 2
    nd = len(shape)
    sq = c.compute(shape, lambda *i: x[i] * x[i], "lrn_sq", c.ELEMWISE)
    padded = ops.pad(sq, [0, lo] + [0] * (nd - 2), [0, hi] + [0] * (nd - 2), 0.0)
    r = te.reduce_axis((0, size), name="rc")
    acc = c.compute(shape, lambda *i: te.sum(padded[(i[0], i[1] + r) + tuple(i[2:])], axis=r), "lrn_sum", c.REDUCE)
    a, b, bt = c.const(alpha / size, x.dtype), c.const(bias, x.dtype), c.const(beta, x.dtype)
    return c.compute(shape, lambda *i: x[i] / te.pow(b + a * acc[i], bt), "lrn", c.BROADCAST)


def lower_node(op: str, attrs: dict, inputs: Sequence["te.Tensor"]) -> "te.Tensor":
    fn = LOWER.get(op)
    if fn is None:
        raise UnsupportedOpError("graph op %r has no lowering to te" % op)
    return fn(attrs, *inputs)


def kernel_shape(shape: Sequence[int]) -> tuple:
    """Kernels never see rank-0 tensors: a scalar is passed as one element of shape (1,)."""
    return tuple(int(d) for d in shape) or (1,)


# Convolutions of one image run as matrix products with output channels as the vector axis: pointwise ones as
# a plain matmul (weights (oc, ic) x input (ic, h*w)), the others as an implicit GEMM over flattened output pixels
# (ops.conv2d_pixels). Both fill whole vectors at any output width, where the row-vectorized direct convolution
# wastes most lanes of a 13- to 55-wide row: measured 1.3-3x on squeezenet/resnet layers.


# A pointwise conv with at most this many output channels runs as conv2d_pixels rather than a matmul (in
# squeezenet's and mobilenet_v2's 1x1 layers 1.2-1.5x faster at 16..64 channels; slower when expanding to
# 96..576, where the matmul's packed activations pay off).
POINTWISE_PIXELS_MAX_CHANNELS = 64


def _gemm_plan(body: List, params: List[str], types: dict, panel_weights: Optional[dict] = None):
    """Kernel-argument shapes for running a conv2d(+elementwise epilogue) body as a GEMM, or None.
    ``panel_weights`` maps weights already packed into panels (pack_conv_weights) to their conv shapes."""
    ci = _conv_index(body)
    if ci is None:
        return None
    conv = body[ci]
    panel_weights = panel_weights or {}
    wname = conv.inputs[1]
    ws = panel_weights.get(wname) or types[wname].shape
    xs, os_ = types[conv.inputs[0]].shape, types[conv.outputs[0]].shape
    n, ic, h, w = xs
    oc, _, kh, kw = ws
    oh, ow = os_[2], os_[3]
    g = conv.attrs["groups"]
    pointwise = (kh, kw) == (1, 1) and list(conv.attrs["strides"]) == [1, 1] and not any(conv.attrs["pads"])
    # a pointwise conv is a plain matrix product (a grouped one a batch of them, one per group); with few input
    # channels conv2d_pixels runs it faster (no per-run packing of the activations)
    as_matmul = pointwise and (g != 1 or oc > POINTWISE_PIXELS_MAX_CHANNELS)
    # a grouped conv runs as conv2d_pixels when every group's output channels fill whole panels
    grouped_pixels = g != 1 and not pointwise and (oc // g) % ops.linear.PANEL == 0
    if n != 1 or conv.inputs[0] == conv.inputs[1] or (g != 1 and not pointwise and not grouped_pixels):
        return None
    data = conv.inputs[0] if ci == 0 else _prologue_input(body[:ci], conv.inputs[0], params, types)
    if data is None:
        return None
    if grouped_pixels:
        shapes = {conv.inputs[0]: (ic, h, w),
                  wname: types[wname].shape if wname in panel_weights else (oc, ic // g * kh * kw)}
        lead, rows = (), oc
    elif g == 1:
        shapes = {conv.inputs[0]: (ic, h * w) if as_matmul else (ic, h, w),
                  wname: types[wname].shape if wname in panel_weights else (oc, ic * kh * kw)}
        lead, rows = (), oc
    else:
        shapes = {conv.inputs[0]: (g, ic // g, h * w), conv.inputs[1]: (g, oc // g, ic // g)}
        lead, rows = (g,), oc // g
    # a prologue (elementwise ops on the conv's input: a pre-activation batch norm + relu) runs on the input's view,
    # its per-channel operands as (channels, 1[, 1])
    view = shapes.pop(conv.inputs[0])
    shapes[data] = view
    for node in body[:ci]:
        for v in node.inputs:
            if v != data and v in params and v not in shapes:
                per_channel = int(np.prod(types[v].shape, dtype=np.int64)) == ic
                shapes[v] = (ic if per_channel else 1,) + (1,) * (len(view) - 1)
    for node in body[ci + 1:]:
        if graph_ops.pattern(node.op) != "elemwise":
            return None
        for v in node.inputs:
            if v in shapes or v not in params:
                continue
            t = (1,) * (4 - len(types[v].shape)) + tuple(types[v].shape)
            if len(t) != 4 or t[0] != 1 or t[1] not in (1, oc) or t[2:] not in ((oh, ow), (1, 1)):
                return None
            if not lead:
                shapes[v] = (t[1], t[2] * t[3])
            elif t[1] == 1:
                shapes[v] = (1, 1, t[2] * t[3])
            else:
                shapes[v] = (g, oc // g, t[2] * t[3])
    if any(p in (conv.inputs[0], conv.inputs[1], data) for node in body[ci + 1:] for p in node.inputs):
        return None
    shapes["__out__"] = lead + (rows, oh * ow)
    shapes["__data__"] = data
    return shapes


def _conv_index(body: List) -> Optional[int]:
    """Where the body's conv2d is: first, or after an elementwise prologue (fuse_prologues), else None."""
    for k, node in enumerate(body):
        if node.op == "conv2d":
            return k if len(node.inputs) == 2 else None
        if graph_ops.pattern(node.op) != "elemwise":
            return None
    return None


def _prologue_input(prologue: List, conv_input: str, params: List[str], types: dict) -> Optional[str]:
    """The one full-size kernel argument an elementwise prologue maps to the conv's input, when every other
    operand is per channel ((1, C, 1, 1) or a scalar), else None."""
    full = tuple(types[conv_input].shape)
    internal = {o for node in prologue for o in node.outputs}
    if prologue[-1].outputs != [conv_input]:
        return None
    data = None
    for node in prologue:
        if tuple(types[node.outputs[0]].shape) != full:
            return None
        for v in node.inputs:
            if v in internal:
                continue
            if v not in params:
                return None
            shape = tuple(types[v].shape)
            if shape == full:
                if data not in (None, v):
                    return None
                data = v
            elif not (len(shape) <= 4 and all(d == 1 for i, d in enumerate((1,) * (4 - len(shape)) + shape)
                                                  if i != 1) and (shape[-3:-2] or (1,))[0] in (1, full[1])):
                return None
    return data


def _conv_as_gemm(conv, x, w, ws, prepacked: bool):
    oc, _, kh, kw = ws
    if len(c.shape_of(w)) == 3 and not prepacked:     # grouped pointwise: (g, ocg, icg) x (g, icg, h*w)
        return ops.batch_matmul(w, x)
    if len(c.shape_of(x)) == 2:     # pointwise: the input already is the (ic, h*w) column matrix
        return ops.matmul(w, x)
    pads = conv.attrs["pads"]
    return ops.conv2d_pixels(x, w, (kh, kw), conv.attrs["strides"], (pads[0], pads[1], pads[2], pads[3]),
                             conv.attrs["dilations"], out_channels=oc, groups=conv.attrs["groups"], name="conv2d")


def pack_conv_weights(graph: Graph, params: Dict[str, np.ndarray]) -> Dict[str, tuple]:
    """Pack the constant weights of convs that run as ops.conv2d_pixels into its panels once, at build time,
    instead of in every run (a pass over all the weights per call: about 1 ms on resnet50's 512-channel layers).
    Rewrites ``params`` and ``graph.types`` in place and returns {weight name: its conv shape (O, C, KH, KW)}
    for lower_kernel. A weight read by more than one node keeps its layout."""
    uses: Dict[str, int] = {}
    for node in graph.nodes:
        for v in set(node.inputs):
            uses[v] = uses.get(v, 0) + 1
    packed: Dict[str, tuple] = {}
    for node in graph.nodes:
        body = node.body()
        ci = _conv_index(body)
        if ci is None:
            continue
        conv = body[ci]
        wname = conv.inputs[1]
        if wname not in params or uses.get(wname) != 1 or wname in graph.outputs or wname in packed:
            continue
        plan = _gemm_plan(body, node.body_params(), graph.types)
        if plan is None or len(plan[wname]) != 2 or len(plan[plan["__data__"]]) != 3:
            continue      # not run as conv2d_pixels (pointwise, grouped or batched)
        w = np.asarray(params[wname])
        params[wname] = ops.linear.pack_panels_array(w.reshape(w.shape[0], -1))
        graph.types[wname] = TensorType(params[wname].shape, str(w.dtype))
        packed[wname] = tuple(w.shape)
    return packed


def lower_kernel(node: Node, types: Dict[str, TensorType], conv_gemm: bool = True,
                 panel_weights: Optional[Dict[str, tuple]] = None) -> tuple:
    """The kernel of `node`: placeholders for its ``body_params()`` (in order), the te tensor of the body's last
    output, and the kernel's argument shapes (params then output) when they differ from the graph's (None
    otherwise). ``conv_gemm`` allows running single-image convolutions as GEMMs (docs/graph.md);
    ``panel_weights`` comes from pack_conv_weights."""
    body, params = node.body(), node.body_params()
    plan = _gemm_plan(body, params, types, panel_weights) if conv_gemm else None
    env = {}
    placeholders = []
    for k, name in enumerate(params):
        t = types[name]
        shape = plan[name] if plan is not None and name in plan else kernel_shape(t.shape)
        ph = te.placeholder(shape, t.dtype, name="in%d" % k)
        env[name] = ph
        placeholders.append(ph)
    planned = body[_conv_index(body)] if plan is not None else None
    for node in body:
        if node is planned:
            wname = node.inputs[1]
            packed_shape = (panel_weights or {}).get(wname)
            env[node.outputs[0]] = _conv_as_gemm(node, env[node.inputs[0]], env[wname],
                                                 packed_shape or types[wname].shape, packed_shape is not None)
            continue
        if node.op == "reshape":
            env[node.outputs[0]] = ops.reshape(env[node.inputs[0]], kernel_shape(node.attrs["shape"]))
            continue
        env[node.outputs[0]] = lower_node(node.op, node.attrs, [env[i] for i in node.inputs])
    out = env[body[-1].outputs[0]]
    shapes = None
    if plan is not None:
        shapes = [list(c.shape_of(ph)) for ph in placeholders] + [list(c.shape_of(out))]
    return placeholders, out, shapes
