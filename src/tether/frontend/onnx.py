"""ONNX -> tether graph.

``from_onnx(model, shape={...})`` fixes the input shapes, then walks the ONNX nodes once, in order, through a
dispatch table of converters (``CONVERTERS``, ONNX op type -> function). Every emitted op gets its output
type at once (``tether.graph.ops``), and an op whose inputs are all constants is evaluated right away with
its numpy definition. That is what folds the shape subgraphs real exporters write
(Shape -> Gather/Slice -> Concat -> Reshape): once input shapes are fixed, ``Shape`` is a constant, and
everything downstream of it folds before a single kernel exists.

Before converting anything, the whole model is checked: one ``UnsupportedOpError`` lists every unsupported
op type with the names of its nodes.
"""
from __future__ import annotations

import logging
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from tether.errors import UnsupportedOpError
from tether.graph import ops
from tether.graph.ir import Graph, Node, TensorType, unique_name

log = logging.getLogger(__name__)

# ONNX TensorProto element types we accept, by enum value.
_ONNX_DTYPES = {1: "float32", 2: "uint8", 3: "int8", 5: "int16", 6: "int32", 7: "int64", 9: "bool",
                10: "float16", 11: "float64", 12: "uint32", 13: "uint64"}


class _Importer:
    def __init__(self, opset: int) -> None:
        self.opset = opset
        self.nodes: List[Node] = []
        self.types: Dict[str, TensorType] = {}
        self.consts: Dict[str, np.ndarray] = {}
        self.rename: Dict[str, str] = {}        # ONNX value name -> tether value name
        self.counter = 0
        self.reserved: set = set()              # every value name the ONNX graph uses, fresh names avoid them

    # ---- values
    def name(self, onnx_name: str) -> str:
        return self.rename.get(onnx_name, onnx_name)

    def const(self, value: str) -> Optional[np.ndarray]:
        return self.consts.get(value)

    def type(self, value: str) -> TensorType:
        return self.types[value]

    def fresh(self, hint: str) -> str:
        self.counter += 1
        name = "%s_%d" % (hint, self.counter)
        while name in self.types or name in self.reserved:
            self.counter += 1
            name = "%s_%d" % (hint, self.counter)
        return name

    def add_const(self, array: np.ndarray, hint: str = "const", name: Optional[str] = None) -> str:
        array = np.asarray(array, order="C")
        name = name or self.fresh(hint)
        self.consts[name] = array
        self.types[name] = TensorType(array.shape, array.dtype)
        return name

    def emit(self, op: str, inputs: Sequence[str], attrs: Optional[dict] = None, name: str = "",
             outputs: Optional[Sequence[str]] = None) -> str:
        """Add one graph op (or fold it if every input is constant); returns its (first) output name."""
        attrs = dict(attrs or {})
        in_types = [self.types[i] for i in inputs]
        out_types = ops.infer(op, attrs, in_types)
        outs = list(outputs) if outputs else [self.fresh(op) for _ in out_types]
        if all(i in self.consts for i in inputs):
            values = ops.evaluate(op, attrs, [self.consts[i] for i in inputs])
            for o, v in zip(outs, values):
                self.add_const(v, name=o)
            return outs[0]
        for o, t in zip(outs, out_types):
            self.types[o] = t
        self.nodes.append(Node(op, name or self.fresh(op + "_node"), list(inputs), outs, attrs))
        return outs[0]

    def require_const(self, value: str, what: str, node_name: str) -> np.ndarray:
        c = self.consts.get(value)
        if c is None:
            raise UnsupportedOpError(
                "node %s: %s (%r) must be a constant once input shapes are fixed; it is computed at run time"
                % (node_name, what, value))
        return c


# ---------------------------------------------------------------- helpers
def _attrs(node) -> dict:
    from onnx import helper
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _norm_axis(axis: int, ndim: int) -> int:
    return axis + ndim if axis < 0 else axis


def _reshape(im: _Importer, x: str, shape: Sequence[int], name: str = "", out: Optional[str] = None) -> str:
    shape = tuple(int(d) for d in shape)
    if im.type(x).shape == shape and out is None:
        return x
    return im.emit("reshape", [x], {"shape": shape}, name, [out] if out else None)


def _out(node, i: int = 0) -> Optional[List[str]]:
    return [node.output[i]] if len(node.output) > i and node.output[i] else None


# ---------------------------------------------------------------- converters
Converter = Callable[[_Importer, object, List[str], dict], None]
CONVERTERS: Dict[str, Converter] = {}


def converter(*op_types: str):
    def deco(fn: Converter) -> Converter:
        for t in op_types:
            CONVERTERS[t] = fn
        return fn
    return deco


_UNARY = {"Relu": "relu", "Sigmoid": "sigmoid", "Tanh": "tanh", "Exp": "exp", "Log": "log", "Sqrt": "sqrt",
          "Neg": "neg", "Abs": "abs", "HardSwish": "hard_swish"}


@converter(*_UNARY)
def _unary(im, node, ins, a):
    im.emit(_UNARY[node.op_type], ins[:1], {}, node.name, _out(node))


@converter("LeakyRelu")
def _leaky(im, node, ins, a):
    im.emit("leaky_relu", ins[:1], {"alpha": float(a.get("alpha", 0.01))}, node.name, _out(node))


@converter("HardSigmoid")
def _hsig(im, node, ins, a):
    im.emit("hard_sigmoid", ins[:1], {"alpha": float(a.get("alpha", 0.2)), "beta": float(a.get("beta", 0.5))},
            node.name, _out(node))


_BINARY = {"Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div", "Pow": "pow"}


@converter(*_BINARY)
def _binary(im, node, ins, a):
    im.emit(_BINARY[node.op_type], ins[:2], {}, node.name, _out(node))


def _fold_variadic(im, node, ins, op: str) -> None:
    """A variadic op as a chain of broadcasting binary ``op`` nodes; one input is an alias of it."""
    if len(ins) == 1:
        _reshape_alias(im, ins[0], node)
        return
    acc = ins[0]
    for k, x in enumerate(ins[1:]):
        last = k == len(ins) - 2
        acc = im.emit(op, [acc, x], {}, node.name if last else node.name + "_%d" % k, _out(node) if last else None)


@converter("Sum")
def _sum(im, node, ins, a):
    _fold_variadic(im, node, ins, "add")


def _reshape_alias(im, x, node):
    im.emit("reshape", [x], {"shape": im.type(x).shape}, node.name, _out(node))


@converter("Identity")
def _identity(im, node, ins, a):
    _reshape_alias(im, ins[0], node)


@converter("Dropout")
def _dropout(im, node, ins, a):
    # inference: dropout is the identity (training_mode, if given, must be a false constant)
    if len(ins) > 2 and ins[2]:
        tm = im.require_const(ins[2], "Dropout training_mode", node.name)
        if bool(np.asarray(tm)):
            raise UnsupportedOpError("node %s: Dropout with training_mode=true is not supported" % node.name)
    _reshape_alias(im, ins[0], node)
    if len(node.output) > 1 and node.output[1]:
        im.add_const(np.ones(im.type(ins[0]).shape, dtype=bool), name=node.output[1])


@converter("Clip")
def _clip(im, node, ins, a):
    lo, hi = a.get("min", -np.inf), a.get("max", np.inf)
    x = ins[0]
    rest = []
    if im.opset >= 11:
        for k, default in ((1, -np.inf), (2, np.inf)):
            if len(ins) > k and ins[k]:
                c = im.const(ins[k])
                if c is None:
                    rest.append((k, ins[k]))
                elif k == 1:
                    lo = float(c)
                else:
                    hi = float(c)
    if not rest:
        im.emit("clip", [x], {"min": float(lo), "max": float(hi)}, node.name, _out(node))
        return
    # bounds given at run time: max(x, lo) then min(., hi)
    cur = x
    if np.isfinite(lo):
        cur = im.emit("maximum", [cur, im.add_const(np.array(lo, dtype=im.type(x).dtype))])
    for k, v in rest:
        last = (k, v) == rest[-1]
        cur = im.emit("maximum" if k == 1 else "minimum", [cur, v], {}, node.name + "_%d" % k,
                      _out(node) if last and not (k == 1 and np.isfinite(hi)) else None)
    if np.isfinite(hi) and rest[-1][0] == 1:
        im.emit("minimum", [cur, im.add_const(np.array(hi, dtype=im.type(x).dtype))], {}, node.name, _out(node))


@converter("Constant")
def _constant(im, node, ins, a):
    from onnx import numpy_helper
    if "value" in a:
        v = numpy_helper.to_array(a["value"])
    elif "value_float" in a:
        v = np.array(a["value_float"], dtype=np.float32)
    elif "value_floats" in a:
        v = np.array(a["value_floats"], dtype=np.float32)
    elif "value_int" in a:
        v = np.array(a["value_int"], dtype=np.int64)
    elif "value_ints" in a:
        v = np.array(a["value_ints"], dtype=np.int64)
    else:
        raise UnsupportedOpError("node %s: Constant with attributes %s" % (node.name, sorted(a)))
    im.add_const(v, name=node.output[0])


@converter("ConstantOfShape")
def _const_of_shape(im, node, ins, a):
    from onnx import numpy_helper
    shape = im.require_const(ins[0], "ConstantOfShape shape", node.name)
    value = numpy_helper.to_array(a["value"]).reshape(-1)[0] if "value" in a else np.float32(0)
    im.add_const(np.full(tuple(int(d) for d in shape), value, dtype=np.asarray(value).dtype), name=node.output[0])


@converter("Shape")
def _shape(im, node, ins, a):
    shape = np.array(im.type(ins[0]).shape, dtype=np.int64)
    start, end = a.get("start", 0), a.get("end", None)
    im.add_const(shape[start:end], name=node.output[0])


@converter("Gather")
def _gather(im, node, ins, a):
    data = im.const(ins[0])
    idx = im.const(ins[1])
    axis = a.get("axis", 0)
    if idx is None:     # indices computed at run time (embedding lookups): the general gather kernel
        _gather_general(im, node, ins, a)
        return
    if data is not None:
        im.add_const(np.take(data, idx.astype(np.int64), axis=axis), name=node.output[0])
        return
    t = im.type(ins[0])
    axis = _norm_axis(axis, len(t.shape))
    if idx.ndim == 0:
        i = int(idx) % t.shape[axis]
        begin = [0] * len(t.shape)
        end = list(t.shape)
        begin[axis], end[axis] = i, i + 1
        y = im.emit("strided_slice", [ins[0]], {"begin": begin, "end": end, "step": [1] * len(t.shape)})
        shape = t.shape[:axis] + t.shape[axis + 1:]
        _reshape(im, y, shape, node.name, node.output[0])
        return
    _gather_general(im, node, ins, a)


@converter("Slice")
def _slice(im, node, ins, a):
    t = im.type(ins[0])
    nd = len(t.shape)
    if im.opset < 10:
        starts, ends = a["starts"], a["ends"]
        axes = a.get("axes", list(range(len(starts))))
        steps = [1] * len(starts)
    else:
        starts = im.require_const(ins[1], "Slice starts", node.name).tolist()
        ends = im.require_const(ins[2], "Slice ends", node.name).tolist()
        axes = im.require_const(ins[3], "Slice axes", node.name).tolist() if len(ins) > 3 and ins[3] \
            else list(range(len(starts)))
        steps = im.require_const(ins[4], "Slice steps", node.name).tolist() if len(ins) > 4 and ins[4] \
            else [1] * len(starts)
    begin, end, step = [0] * nd, list(t.shape), [1] * nd
    for s, e, ax, st in zip(starts, ends, axes, steps):
        ax = _norm_axis(int(ax), nd)
        b, e2, _ = slice(int(s), int(e), int(st)).indices(t.shape[ax])
        begin[ax], end[ax], step[ax] = b, e2, int(st)
    c = im.const(ins[0])
    if c is not None:
        sl = tuple(slice(b, e if e >= 0 else None, s) for b, e, s in zip(begin, end, step))
        im.add_const(c[sl], name=node.output[0])
        return
    im.emit("strided_slice", [ins[0]], {"begin": begin, "end": end, "step": step}, node.name, _out(node))


@converter("Reshape")
def _reshape_conv(im, node, ins, a):
    t = im.type(ins[0])
    if im.opset >= 5:
        shape = [int(d) for d in im.require_const(ins[1], "Reshape shape", node.name)]
    else:
        shape = list(a["shape"])
    allowzero = a.get("allowzero", 0)
    out = []
    for i, d in enumerate(shape):
        out.append(t.shape[i] if d == 0 and not allowzero else d)
    if -1 in out:
        known = int(np.prod([d for d in out if d != -1], dtype=np.int64))
        out[out.index(-1)] = t.size // known if known else 0
    im.emit("reshape", [ins[0]], {"shape": tuple(out)}, node.name, _out(node))


@converter("Flatten")
def _flatten(im, node, ins, a):
    t = im.type(ins[0])
    axis = _norm_axis(a.get("axis", 1), len(t.shape))
    lead = int(np.prod(t.shape[:axis], dtype=np.int64))
    im.emit("reshape", [ins[0]], {"shape": (lead, t.size // lead if lead else 0)}, node.name, _out(node))


def _axes_arg(im, node, ins, a) -> List[int]:
    if "axes" in a:
        return list(a["axes"])
    if len(ins) > 1 and ins[1]:
        return [int(v) for v in im.require_const(ins[1], node.op_type + " axes", node.name).reshape(-1)]
    return []


@converter("Squeeze")
def _squeeze(im, node, ins, a):
    t = im.type(ins[0])
    axes = [_norm_axis(x, len(t.shape)) for x in _axes_arg(im, node, ins, a)]
    if not axes:
        axes = [i for i, d in enumerate(t.shape) if d == 1]
    shape = tuple(d for i, d in enumerate(t.shape) if i not in axes)
    im.emit("reshape", [ins[0]], {"shape": shape}, node.name, _out(node))


@converter("Unsqueeze")
def _unsqueeze(im, node, ins, a):
    t = im.type(ins[0])
    axes = _axes_arg(im, node, ins, a)
    nd = len(t.shape) + len(axes)
    axes = sorted(_norm_axis(x, nd) for x in axes)
    shape = list(t.shape)
    for ax in axes:
        shape.insert(ax, 1)
    im.emit("reshape", [ins[0]], {"shape": tuple(shape)}, node.name, _out(node))


@converter("Transpose")
def _transpose(im, node, ins, a):
    nd = len(im.type(ins[0]).shape)
    perm = list(a.get("perm", list(range(nd))[::-1]))
    im.emit("transpose", [ins[0]], {"axes": perm}, node.name, _out(node))


@converter("Concat")
def _concat(im, node, ins, a):
    nd = len(im.type(ins[0]).shape)
    parts = [i for i in ins if i and (im.type(i).size > 0 or nd != 1)]
    im.emit("concat", parts, {"axis": _norm_axis(a["axis"], nd)}, node.name, _out(node))


@converter("Pad")
def _pad(im, node, ins, a):
    t = im.type(ins[0])
    nd = len(t.shape)
    mode = a.get("mode", b"constant")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    if im.opset < 11:
        pads = list(a.get("pads", a.get("paddings")))
        value = float(a.get("value", 0.0))
    else:
        raw = [int(v) for v in im.require_const(ins[1], "Pad pads", node.name)]
        value = 0.0
        if len(ins) > 2 and ins[2]:
            c = im.const(ins[2])
            value = float(c) if c is not None else _reshape(im, ins[2], (1,))
        if len(ins) > 3 and ins[3]:
            axes = [_norm_axis(int(x), nd) for x in im.require_const(ins[3], "Pad axes", node.name)]
        else:
            axes = list(range(nd))
        pads = [0] * (2 * nd)
        for k, ax in enumerate(axes):
            pads[ax] = raw[k]
            pads[ax + nd] = raw[k + len(axes)]
    if mode not in ("constant", "reflect", "edge"):
        raise UnsupportedOpError("node %s: Pad mode %r" % (node.name, mode))
    if isinstance(value, str):   # a run-time pad value
        im.emit("pad", [ins[0], value], {"pads": pads, "mode": mode}, node.name, _out(node))
    else:
        im.emit("pad", [ins[0]], {"pads": pads, "value": value, "mode": mode}, node.name, _out(node))


def _spatial_pads(a: dict, in_sp: Sequence[int], k: Sequence[int], s: Sequence[int], d: Sequence[int]) -> List[int]:
    nd = len(in_sp)
    auto = a.get("auto_pad", b"NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else auto
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        begin, end = [], []
        for i in range(nd):
            out = -(-in_sp[i] // s[i])
            total = max((out - 1) * s[i] + (k[i] - 1) * d[i] + 1 - in_sp[i], 0)
            small, big = total // 2, total - total // 2
            begin.append(small if auto == "SAME_UPPER" else big)
            end.append(big if auto == "SAME_UPPER" else small)
        return begin + end
    if auto == "VALID":
        return [0] * (2 * nd)
    return list(a.get("pads", [0] * (2 * nd)))


@converter("Conv")
def _conv(im, node, ins, a):
    xt, wt = im.type(ins[0]), im.type(ins[1])
    nd = len(xt.shape) - 2
    k = list(a.get("kernel_shape", wt.shape[2:]))
    s = list(a.get("strides", [1] * nd))
    d = list(a.get("dilations", [1] * nd))
    pads = _spatial_pads(a, xt.shape[2:], k, s, d)
    group = int(a.get("group", 1))
    x, w = ins[0], ins[1]
    if nd == 1:     # a 1-D conv is a 2-D conv over a height of one
        x = _reshape(im, x, xt.shape[:2] + (1,) + xt.shape[2:])
        w = _reshape(im, w, wt.shape[:2] + (1,) + wt.shape[2:])
        s, d, pads = [1] + s, [1] + d, [0, pads[0], 0, pads[1]]
    elif nd != 2:
        raise UnsupportedOpError("node %s: %d-D Conv (only 1-D and 2-D)" % (node.name, nd))
    attrs = {"strides": s, "dilations": d, "pads": pads, "groups": group}
    has_bias = len(ins) > 2 and ins[2]
    final = _out(node) if nd == 2 and not has_bias else None
    y = im.emit("conv2d", [x, w], attrs, node.name, final)
    if has_bias:
        b = _reshape(im, ins[2], (1, im.type(ins[2]).shape[0], 1, 1))
        y = im.emit("add", [y, b], {}, node.name + "_bias", _out(node) if nd == 2 else None)
    if nd == 1:
        t = im.type(y)
        _reshape(im, y, (t.shape[0], t.shape[1], t.shape[3]), node.name + "_squeeze", node.output[0])


def _pool(kind):
    def conv(im, node, ins, a):
        if len(node.output) > 1 and node.output[1]:
            raise UnsupportedOpError("node %s: MaxPool with an Indices output" % node.name)
        xt = im.type(ins[0])
        nd = len(xt.shape) - 2
        k = list(a["kernel_shape"])
        s = list(a.get("strides", [1] * nd))
        d = list(a.get("dilations", [1] * nd))
        attrs = {"kernel": k, "strides": s, "dilations": d, "pads": _spatial_pads(a, xt.shape[2:], k, s, d),
                 "ceil_mode": int(a.get("ceil_mode", 0)), "count_include_pad": int(a.get("count_include_pad", 0))}
        im.emit(kind, [ins[0]], attrs, node.name, _out(node))
    return conv


CONVERTERS["MaxPool"] = _pool("max_pool")
CONVERTERS["AveragePool"] = _pool("avg_pool")


@converter("GlobalAveragePool", "GlobalMaxPool")
def _gpool(im, node, ins, a):
    op = "global_avg_pool" if node.op_type == "GlobalAveragePool" else "global_max_pool"
    im.emit(op, [ins[0]], {}, node.name, _out(node))


@converter("BatchNormalization")
def _bn(im, node, ins, a):
    if a.get("training_mode", 0) or len([o for o in node.output if o]) > 1:
        _bn_training(im, node, ins, a)
        return
    im.emit("batch_norm", ins[:5], {"epsilon": float(a.get("epsilon", 1e-5))}, node.name, _out(node))


def _bn_training(im, node, ins, a):
    """Training-mode batch norm: normalise with the batch's own statistics and update the running ones."""
    x = ins[0]
    t = im.type(x)
    nd = len(t.shape)
    eps, momentum = float(a.get("epsilon", 1e-5)), float(a.get("momentum", 0.9))
    axes = [i for i in range(nd) if i != 1]
    vec = (1, t.shape[1]) + (1,) * (nd - 2)
    dt = t.dtype

    def const(v):
        return im.add_const(np.array(v, dtype=dt))

    m = im.emit("mean", [x], {"axes": axes, "keepdims": True}, node.name + "_mean")
    d = im.emit("sub", [x, m])
    var = im.emit("mean", [im.emit("mul", [d, d])], {"axes": axes, "keepdims": True}, node.name + "_var")
    inv = im.emit("div", [_reshape(im, ins[1], vec), im.emit("sqrt", [im.emit("add", [var, const(eps)])])])
    im.emit("add", [im.emit("mul", [d, inv]), _reshape(im, ins[2], vec)], {}, node.name, _out(node, 0))
    for k, (running, batch) in enumerate(((ins[3], m), (ins[4], var)), start=1):
        if len(node.output) > k and node.output[k]:
            upd = im.emit("mul", [_reshape(im, batch, (t.shape[1],)), const(1.0 - momentum)])
            im.emit("add", [im.emit("mul", [running, const(momentum)]), upd], {}, node.name + "_running%d" % k,
                    _out(node, k))


@converter("LRN")
def _lrn(im, node, ins, a):
    im.emit("lrn", [ins[0]], {"size": int(a["size"]), "alpha": float(a.get("alpha", 1e-4)),
                              "beta": float(a.get("beta", 0.75)), "bias": float(a.get("bias", 1.0))},
            node.name, _out(node))


@converter("Softmax")
def _softmax(im, node, ins, a):
    t = im.type(ins[0])
    nd = len(t.shape)
    if im.opset >= 13:
        im.emit("softmax", [ins[0]], {"axis": _norm_axis(a.get("axis", -1), nd)}, node.name, _out(node))
        return
    # before opset 13 softmax works on the input coerced to 2-D at `axis`
    axis = _norm_axis(a.get("axis", 1), nd)
    lead = int(np.prod(t.shape[:axis], dtype=np.int64))
    flat = _reshape(im, ins[0], (lead, t.size // max(lead, 1)))
    y = im.emit("softmax", [flat], {"axis": 1}, node.name)
    _reshape(im, y, t.shape, node.name + "_reshape", node.output[0])


@converter("Gemm")
def _gemm(im, node, ins, a):
    alpha, beta = float(a.get("alpha", 1.0)), float(a.get("beta", 1.0))
    A, B = ins[0], ins[1]
    if a.get("transA", 0):
        A = im.emit("transpose", [A], {"axes": [1, 0]}, node.name + "_transA")
    if not a.get("transB", 0):   # dense wants the weight as [N, K]; folds away when B is a constant
        B = im.emit("transpose", [B], {"axes": [1, 0]}, node.name + "_transB")
    has_c = len(ins) > 2 and bool(ins[2]) and beta != 0.0
    last_is_dense = alpha == 1.0 and not has_c
    y = im.emit("dense", [A, B], {}, node.name, _out(node) if last_is_dense else None)
    if alpha != 1.0:
        y = im.emit("scale_shift", [y], {"scale": alpha, "shift": 0.0}, node.name + "_alpha",
                    _out(node) if not has_c else None)
    if has_c:
        C = ins[2]
        if beta != 1.0:
            C = im.emit("scale_shift", [C], {"scale": beta, "shift": 0.0}, node.name + "_beta")
        im.emit("add", [y, C], {}, node.name + "_bias", _out(node))


@converter("MatMul")
def _matmul(im, node, ins, a):
    at, bt = im.type(ins[0]), im.type(ins[1])
    A, B = ins[0], ins[1]
    a_shape, b_shape = list(at.shape), list(bt.shape)
    if len(a_shape) == 1:
        A = _reshape(im, A, [1] + a_shape)
        a_shape = [1] + a_shape
    if len(b_shape) == 1:
        B = _reshape(im, B, b_shape + [1])
        b_shape = b_shape + [1]
    M, K, N = a_shape[-2], a_shape[-1], b_shape[-1]
    batch = list(ops.broadcast_shapes(a_shape[:-2], b_shape[:-2]))
    final_shape = tuple(batch + [M, N])
    onnx_shape = list(batch)
    if len(at.shape) > 1:
        onnx_shape.append(M)
    if len(bt.shape) > 1:
        onnx_shape.append(N)
    nb = int(np.prod(batch, dtype=np.int64)) if batch else 1
    if len(b_shape) == 2:
        # one weight matrix shared by every row: a dense over the flattened rows of A
        A2 = _reshape(im, A, (int(np.prod(a_shape[:-1], dtype=np.int64)), K))
        Bt = im.emit("transpose", [B], {"axes": [1, 0]}, node.name + "_transB")
        y = im.emit("dense", [A2, Bt], {}, node.name)
    else:
        Af = A if tuple(a_shape[:-2]) == tuple(batch) else im.emit("broadcast_to", [A], {"shape": batch + [M, K]})
        Bf = B if tuple(b_shape[:-2]) == tuple(batch) else im.emit("broadcast_to", [B], {"shape": batch + [K, N]})
        y = im.emit("batch_matmul", [_reshape(im, Af, (nb, M, K)), _reshape(im, Bf, (nb, K, N))], {}, node.name)
    im.emit("reshape", [y], {"shape": tuple(onnx_shape)}, node.name + "_out", _out(node))


# ---------------------------------------------------------------- elementwise: comparison, logic, selection, math
# with attributes, casts (issue 11). dtypes outside what the kernels implement are refused by name.
_FLOATS = ("float32", "float64")
_INTS = ("int8", "uint8", "int16", "int32", "int64")
_NUMERIC = _FLOATS + _INTS


def _require_dtype(im, node, value: str, allowed: Sequence[str]) -> str:
    dt = str(im.type(value).dtype)
    if dt not in allowed:
        raise UnsupportedOpError("node %s: %s on %s tensors is not supported (tether implements %s for %s)"
                                 % (node.name, node.op_type, dt, node.op_type, ", ".join(allowed)))
    return dt


def _no_legacy_broadcast(node, a):
    # opset < 7 binary ops broadcast only with broadcast=1 and an explicit axis; numpy-style is what we implement
    if "axis" in a:
        raise UnsupportedOpError("node %s: %s with the legacy 'axis' attribute (opset < 7)" % (node.name, node.op_type))


_COMPARE = {"Equal": "equal", "Less": "less", "LessOrEqual": "less_equal", "Greater": "greater",
            "GreaterOrEqual": "greater_equal"}
_LOGICAL = {"And": "logical_and", "Or": "logical_or", "Xor": "logical_xor"}


@converter(*_COMPARE)
def _compare(im, node, ins, a):
    _no_legacy_broadcast(node, a)
    allowed = _NUMERIC + ("bool",) if node.op_type == "Equal" else _NUMERIC
    dt = _require_dtype(im, node, ins[0], allowed)
    _require_dtype(im, node, ins[1], (dt,))
    im.emit(_COMPARE[node.op_type], ins[:2], {}, node.name, _out(node))


@converter(*_LOGICAL)
def _logical(im, node, ins, a):
    _no_legacy_broadcast(node, a)
    for x in ins[:2]:
        _require_dtype(im, node, x, ("bool",))
    im.emit(_LOGICAL[node.op_type], ins[:2], {}, node.name, _out(node))


@converter("Not")
def _not(im, node, ins, a):
    _require_dtype(im, node, ins[0], ("bool",))
    im.emit("logical_not", ins[:1], {}, node.name, _out(node))


@converter("Where")
def _where(im, node, ins, a):
    _require_dtype(im, node, ins[0], ("bool",))
    dt = _require_dtype(im, node, ins[1], _NUMERIC + ("bool",))
    _require_dtype(im, node, ins[2], (dt,))
    im.emit("where", ins[:3], {}, node.name, _out(node))


@converter("Mod")
def _mod(im, node, ins, a):
    fmod = int(a.get("fmod", 0))
    dt = _require_dtype(im, node, ins[0], _NUMERIC)
    _require_dtype(im, node, ins[1], (dt,))
    if dt in _FLOATS and not fmod:
        raise UnsupportedOpError("node %s: Mod of %s tensors needs fmod=1 (the spec leaves fmod=0 undefined for "
                                 "floats)" % (node.name, dt))
    im.emit("mod", ins[:2], {"fmod": fmod}, node.name, _out(node))


@converter("PRelu")
def _prelu(im, node, ins, a):
    dt = _require_dtype(im, node, ins[0], _FLOATS + ("int32", "int64"))
    _require_dtype(im, node, ins[1], (dt,))
    xs, ss = im.type(ins[0]).shape, im.type(ins[1]).shape
    slope = ins[1]
    if im.opset < 7 and len(ss) == 1 and len(xs) > 2 and ss[0] == xs[1]:
        slope = _reshape(im, slope, (ss[0],) + (1,) * (len(xs) - 2))   # opset 6: a per-channel slope
        ss = im.type(slope).shape
    try:
        ok = ops.broadcast_shapes(xs, ss) == tuple(xs)
    except ValueError:
        ok = False
    if not ok:
        raise UnsupportedOpError("node %s: PRelu slope of shape %s does not broadcast to the input's %s"
                                 % (node.name, ss, xs))
    im.emit("prelu", [ins[0], slope], {}, node.name, _out(node))


def _str_attr(a: dict, key: str, default: str) -> str:
    v = a.get(key, default)
    return v.decode() if isinstance(v, bytes) else v


# ONNX op -> (graph op, attribute defaults, dtypes)
_MATH_OPS = {
    "Erf": ("erf", {}, _FLOATS), "Reciprocal": ("reciprocal", {}, _FLOATS), "Floor": ("floor", {}, _FLOATS),
    "Ceil": ("ceil", {}, _FLOATS), "Round": ("round", {}, _FLOATS), "Sign": ("sign", {}, _NUMERIC),
    "IsNaN": ("isnan", {}, _FLOATS), "IsInf": ("isinf", {"detect_positive": 1, "detect_negative": 1}, _FLOATS),
    "Elu": ("elu", {"alpha": 1.0}, _FLOATS),
    "Selu": ("selu", {"alpha": 1.67326319217681884765625, "gamma": 1.05070102214813232421875}, _FLOATS),
    "Celu": ("celu", {"alpha": 1.0}, _FLOATS), "Softplus": ("softplus", {}, _FLOATS),
    "Softsign": ("softsign", {}, _FLOATS), "Mish": ("mish", {}, _FLOATS),
    "ThresholdedRelu": ("thresholded_relu", {"alpha": 1.0}, _FLOATS),
    "Sinh": ("sinh", {}, _FLOATS), "Cosh": ("cosh", {}, _FLOATS), "Asinh": ("asinh", {}, _FLOATS),
    "Acosh": ("acosh", {}, _FLOATS), "Atanh": ("atanh", {}, _FLOATS),
}


@converter(*_MATH_OPS)
def _math(im, node, ins, a):
    op, defaults, dtypes = _MATH_OPS[node.op_type]
    _require_dtype(im, node, ins[0], dtypes)
    attrs = {k: type(v)(a.get(k, v)) for k, v in defaults.items()}
    im.emit(op, ins[:1], attrs, node.name, _out(node))


@converter("Gelu")
def _gelu(im, node, ins, a):
    _require_dtype(im, node, ins[0], _FLOATS)
    approx = _str_attr(a, "approximate", "none")
    if approx not in ("none", "tanh"):
        raise UnsupportedOpError("node %s: Gelu approximate=%r (the spec has 'none' and 'tanh')" % (node.name, approx))
    im.emit("gelu", ins[:1], {"approximate": approx}, node.name, _out(node))


@converter("Mean")
def _mean_variadic(im, node, ins, a):
    dt = _require_dtype(im, node, ins[0], _FLOATS)
    for x in ins[1:]:
        _require_dtype(im, node, x, (dt,))
    if len(ins) == 1:
        _reshape_alias(im, ins[0], node)
        return
    acc = ins[0]
    for k, x in enumerate(ins[1:]):
        acc = im.emit("add", [acc, x], {}, node.name + "_%d" % k)
    im.emit("div", [acc, im.add_const(np.array(len(ins), dtype=dt))], {}, node.name, _out(node))


def _coerced_2d(im, node, ins, op: str, a):
    """Softmax-family ops: from opset 13 along one axis; before, over the input coerced to 2-D at ``axis``."""
    t = im.type(ins[0])
    _require_dtype(im, node, ins[0], _FLOATS)
    nd = len(t.shape)
    if im.opset >= 13:
        im.emit(op, [ins[0]], {"axis": _norm_axis(a.get("axis", -1), nd)}, node.name, _out(node))
        return
    axis = _norm_axis(a.get("axis", 1), nd)
    lead = int(np.prod(t.shape[:axis], dtype=np.int64))
    flat = _reshape(im, ins[0], (lead, t.size // max(lead, 1)))
    y = im.emit(op, [flat], {"axis": 1}, node.name)
    _reshape(im, y, t.shape, node.name + "_reshape", node.output[0])


@converter("LogSoftmax")
def _log_softmax(im, node, ins, a):
    _coerced_2d(im, node, ins, "log_softmax", a)


@converter("Hardmax")
def _hardmax(im, node, ins, a):
    _coerced_2d(im, node, ins, "hardmax", a)


# Cast: every dtype the kernels implement, in both directions; others (float16, strings, ...) are refused.
_CAST_DTYPES = _NUMERIC + ("bool",)


@converter("Cast")
def _cast(im, node, ins, a):
    to = _ONNX_DTYPES.get(a["to"], "elem_type_%d" % a["to"])
    if "saturate" in a and not a["saturate"] and to.startswith("float8"):
        raise UnsupportedOpError("node %s: Cast with saturate=0" % node.name)
    c = im.const(ins[0])
    if to not in _CAST_DTYPES:
        raise UnsupportedOpError("node %s: Cast to %s (tether casts between %s)" % (node.name, to,
                                                                                 ", ".join(_CAST_DTYPES)))
    if c is not None and c.dtype != object:
        im.add_const(ops.evaluate("cast", {"to": to}, [c])[0], name=node.output[0])
        return
    src = _require_dtype(im, node, ins[0], _CAST_DTYPES)
    if src == to:
        _reshape_alias(im, ins[0], node)
        return
    im.emit("cast", ins[:1], {"to": to}, node.name, _out(node))


@converter("CastLike")
def _cast_like(im, node, ins, a):
    # CastLike(x, like) is Cast(x, to=like's dtype); saturate only concerns float8 targets, which are refused
    inv = {v: k for k, v in _ONNX_DTYPES.items()}
    dt = str(im.type(ins[1]).dtype)
    if dt not in inv:
        raise UnsupportedOpError("node %s: CastLike to %s" % (node.name, dt))
    _cast(im, node, ins[:1], {"to": inv[dt]})


# ---------------------------------------------------------------- reductions (ONNX Reduce*, ArgMax/ArgMin)
_REDUCE_KINDS = {"ReduceSum": "sum", "ReduceMean": "mean", "ReduceMax": "max", "ReduceMin": "min",
                 "ReduceProd": "prod", "ReduceL1": "l1", "ReduceL2": "l2", "ReduceSumSquare": "sum_square",
                 "ReduceLogSum": "log_sum", "ReduceLogSumExp": "log_sum_exp"}
_INT_DTYPES = ("int32", "int64")
_FLOAT_DTYPES = ("float32", "float64")
# kinds whose integer result would need rounding rules (mean) or a float function (sqrt, log): floats only
_FLOAT_ONLY_KINDS = ("mean", "l2", "log_sum", "log_sum_exp")


def _reduce_identity(kind: str, dtype: str):
    """The value a reduction over an empty set yields (ONNX opset 18 'empty set' semantics)."""
    if dtype == "bool":
        lo, hi = False, True
    else:
        lo = -np.inf if dtype in _FLOAT_DTYPES else np.iinfo(dtype).min
        hi = np.inf if dtype in _FLOAT_DTYPES else np.iinfo(dtype).max
    return {"sum": 0, "l1": 0, "l2": 0, "sum_square": 0, "prod": 1, "max": lo, "min": hi,
            "log_sum": -np.inf, "log_sum_exp": -np.inf}[kind]


@converter(*_REDUCE_KINDS)
def _reduce_conv(im, node, ins, a):
    kind = _REDUCE_KINDS[node.op_type]
    t = im.type(ins[0])
    nd = len(t.shape)
    allowed = _FLOAT_DTYPES if kind in _FLOAT_ONLY_KINDS else _FLOAT_DTYPES + _INT_DTYPES
    if kind in ("max", "min"):
        allowed = allowed + ("bool",)     # any / all (opset 20)
    if t.dtype not in allowed:
        raise UnsupportedOpError("node %s: %s on %s tensors (supported: %s)"
                                 % (node.name, node.op_type, t.dtype, ", ".join(allowed)))
    axes_as_input = im.opset >= (13 if node.op_type == "ReduceSum" else 18)
    if axes_as_input:
        axes = None
        if len(ins) > 1 and ins[1]:
            axes = [int(v) for v in im.require_const(ins[1], node.op_type + " axes", node.name).reshape(-1)]
    else:
        axes = list(a["axes"]) if "axes" in a else None
    keepdims = bool(a.get("keepdims", 1))
    if not axes:
        # absent or empty axes: every axis, or none at all with noop_with_empty_axes
        axes = [] if (axes_as_input and a.get("noop_with_empty_axes", 0)) else list(range(nd))
    axes = sorted({_norm_axis(int(x), nd) for x in axes})
    for x in axes:
        if not 0 <= x < nd:
            raise UnsupportedOpError("node %s: %s axis out of range for rank %d" % (node.name, node.op_type, nd))
    out_shape = tuple(1 if i in axes else d for i, d in enumerate(t.shape)) if keepdims else \
        tuple(d for i, d in enumerate(t.shape) if i not in axes)
    if axes and any(t.shape[i] == 0 for i in axes):
        if kind == "mean":
            raise UnsupportedOpError("node %s: ReduceMean over an empty axis (the mean of nothing)" % node.name)
        im.add_const(np.full(out_shape, _reduce_identity(kind, t.dtype), dtype=t.dtype), name=node.output[0])
        return
    if t.size == 0:
        im.add_const(np.zeros(out_shape, dtype=t.dtype), name=node.output[0])
        return
    if kind in ("mean", "max") and nd >= 3 and axes == list(range(2, nd)) and t.dtype == "float32":
        # torch's dynamo exporter writes adaptive average pooling as ReduceMean over the spatial axes: run it
        # as the global-pool kernel (one channel per task, parallel over channels)
        op = "global_avg_pool" if kind == "mean" else "global_max_pool"
        y = im.emit(op, [ins[0]], {}, node.name, _out(node) if keepdims else None)
        if not keepdims:
            _reshape(im, y, out_shape, node.name + "_squeeze", node.output[0])
        return
    if not out_shape:   # kernels never write rank-0 tensors: reduce keeping dims, then reshape to a scalar
        y = im.emit("reduce", [ins[0]], {"kind": kind, "axes": axes, "keepdims": True}, node.name)
        _reshape(im, y, (), node.name + "_scalar", node.output[0])
        return
    im.emit("reduce", [ins[0]], {"kind": kind, "axes": axes, "keepdims": keepdims}, node.name, _out(node))


@converter("ArgMax", "ArgMin")
def _arg_reduce_conv(im, node, ins, a):
    t = im.type(ins[0])
    nd = len(t.shape)
    if t.dtype not in _FLOAT_DTYPES + _INT_DTYPES:
        raise UnsupportedOpError("node %s: %s on %s tensors" % (node.name, node.op_type, t.dtype))
    axis = _norm_axis(int(a.get("axis", 0)), nd)
    if t.shape[axis] == 0:
        raise UnsupportedOpError("node %s: %s over an empty axis" % (node.name, node.op_type))
    keepdims = bool(a.get("keepdims", 1))
    scalar = nd == 1 and not keepdims     # kernels never write rank-0 tensors
    y = im.emit("arg_reduce", [ins[0]], {"kind": "max" if node.op_type == "ArgMax" else "min", "axis": axis,
                                         "keepdims": keepdims or scalar,
                                         "select_last_index": int(a.get("select_last_index", 0))},
                node.name, None if scalar else _out(node))
    if scalar:
        _reshape(im, y, (), node.name + "_scalar", node.output[0])


# ---------------------------------------------------------------- layer / instance / group normalization
def _stash_check(node, a, dtype: str) -> None:
    # stash_type 1 (float32 statistics) is the only kind: on float32 inputs it changes nothing
    if dtype != "float32":
        raise UnsupportedOpError("node %s: %s on %s tensors (float32 only)" % (node.name, node.op_type, dtype))
    if int(a.get("stash_type", 1)) != 1:
        raise UnsupportedOpError("node %s: %s stash_type=%d (only 1, float32)"
                                 % (node.name, node.op_type, int(a["stash_type"])))


@converter("LayerNormalization")
def _layer_norm(im, node, ins, a):
    t = im.type(ins[0])
    _stash_check(node, a, t.dtype)
    nd = len(t.shape)
    axis = _norm_axis(int(a.get("axis", -1)), nd)
    eps = float(a.get("epsilon", 1e-5))
    inputs = [ins[0], ins[1]]
    has_bias = len(ins) > 2 and bool(ins[2])
    if has_bias:
        inputs.append(ins[2])
    im.emit("normalize", inputs, {"axis": axis, "epsilon": eps, "has_scale": True, "has_bias": has_bias},
            node.name, _out(node))
    want_mean = len(node.output) > 1 and node.output[1]
    want_inv = len(node.output) > 2 and node.output[2]
    if want_mean or want_inv:
        # the optional statistics outputs (training exports): mean and 1/sqrt(var + eps) over [axis, ndim)
        axes = list(range(axis, nd))
        m = im.emit("reduce", [ins[0]], {"kind": "mean", "axes": axes, "keepdims": True}, node.name + "_mean",
                    _out(node, 1) if want_mean else None)
        if want_inv:
            d = im.emit("sub", [ins[0], m])
            v = im.emit("reduce", [im.emit("mul", [d, d])], {"kind": "mean", "axes": axes, "keepdims": True})
            sd = im.emit("sqrt", [im.emit("add", [v, im.add_const(np.array(eps, np.float32))])])
            im.emit("div", [im.add_const(np.array(1.0, np.float32)), sd], {}, node.name + "_invstd", _out(node, 2))


@converter("InstanceNormalization")
def _instance_norm(im, node, ins, a):
    t = im.type(ins[0])
    _stash_check(node, a, t.dtype)
    nd = len(t.shape)
    if nd < 3:
        raise UnsupportedOpError("node %s: InstanceNormalization of a rank-%d tensor (needs N, C, D1, ...)"
                                 % (node.name, nd))
    vec = (t.shape[1],) + (1,) * (nd - 2)
    im.emit("normalize", [ins[0], _reshape(im, ins[1], vec), _reshape(im, ins[2], vec)],
            {"axis": 2, "epsilon": float(a.get("epsilon", 1e-5)), "has_scale": True, "has_bias": True},
            node.name, _out(node))


@converter("GroupNormalization")
def _group_norm(im, node, ins, a):
    t = im.type(ins[0])
    _stash_check(node, a, t.dtype)
    nd = len(t.shape)
    g = int(a["num_groups"])
    n, ch = t.shape[0], t.shape[1]
    if nd < 3 or g <= 0 or ch % g:
        raise UnsupportedOpError("node %s: GroupNormalization with num_groups=%d on shape %s (channels must "
                                 "split into the groups)" % (node.name, g, t.shape))
    spatial = int(np.prod(t.shape[2:], dtype=np.int64))
    x = _reshape(im, ins[0], (n, g, ch // g, spatial))
    # opset 18 took scale/bias per group, opset 21 per channel (18's form was withdrawn as ambiguous)
    per_channel = im.opset >= 21
    want = ch if per_channel else g
    for k in (1, 2):
        if im.type(ins[k]).shape != (want,):
            raise UnsupportedOpError("node %s: GroupNormalization (opset %d) wants %s of shape (%d,), got %s"
                                     % (node.name, im.opset, "scale" if k == 1 else "bias", want,
                                        im.type(ins[k]).shape))
    vec = (g, ch // g, 1) if per_channel else (g, 1, 1)
    y = im.emit("normalize", [x, _reshape(im, ins[1], vec), _reshape(im, ins[2], vec)],
                {"axis": 2, "epsilon": float(a.get("epsilon", 1e-5)), "has_scale": True, "has_bias": True},
                node.name)
    _reshape(im, y, t.shape, node.name + "_unflatten", node.output[0])


# ---------------------------------------------------------------- shape ops: Split, Expand, Tile, Range, Size
@converter("Split")
def _split(im, node, ins, a):
    t = im.type(ins[0])
    nd = len(t.shape)
    axis = _norm_axis(int(a.get("axis", 0)), nd)
    dim = t.shape[axis]
    outs = list(node.output)
    if im.opset >= 13:
        sizes = None
        if len(ins) > 1 and ins[1]:
            sizes = [int(v) for v in im.require_const(ins[1], "Split split", node.name).reshape(-1)]
    else:
        sizes = list(a["split"]) if "split" in a else None
    if sizes is None:
        n = int(a["num_outputs"]) if "num_outputs" in a else len(outs)
        if "num_outputs" in a and n != len(outs):
            raise UnsupportedOpError("node %s: Split num_outputs=%d but %d outputs" % (node.name, n, len(outs)))
        if im.opset >= 18:
            # equal chunks of ceil(dim / n), the last one smaller
            chunk = -(-dim // n)
            sizes = [max(0, min(chunk, dim - k * chunk)) for k in range(n)]
        else:
            if dim % n:
                raise UnsupportedOpError("node %s: Split of extent %d into %d equal parts" % (node.name, dim, n))
            sizes = [dim // n] * n
    if len(sizes) != len(outs) or sum(sizes) != dim or any(v < 0 for v in sizes):
        raise UnsupportedOpError("node %s: Split sizes %s do not cover extent %d in %d outputs"
                                 % (node.name, sizes, dim, len(outs)))
    start = 0
    c = im.const(ins[0])
    for k, (o, size) in enumerate(zip(outs, sizes)):
        begin, end = [0] * nd, list(t.shape)
        begin[axis], end[axis] = start, start + size
        start += size
        if not o:
            continue
        if c is not None:
            im.add_const(np.ascontiguousarray(c[tuple(slice(b, e) for b, e in zip(begin, end))]), name=o)
        elif size == 0:
            im.add_const(np.zeros(tuple(e - b for b, e in zip(begin, end)), dtype=t.dtype), name=o)
        elif size == dim:
            im.emit("reshape", [ins[0]], {"shape": t.shape}, node.name, [o])
        else:
            im.emit("strided_slice", [ins[0]], {"begin": begin, "end": end, "step": [1] * nd},
                    node.name + "_%d" % k, [o])


@converter("Expand")
def _expand(im, node, ins, a):
    t = im.type(ins[0])
    shape = [int(d) for d in im.require_const(ins[1], "Expand shape", node.name).reshape(-1)]
    out = tuple(ops.broadcast_shapes(t.shape, shape))   # bidirectional: a 1 in `shape` keeps x's extent
    if out == tuple(t.shape):
        _reshape_alias(im, ins[0], node)
        return
    im.emit("broadcast_to", [ins[0]], {"shape": list(out)}, node.name, _out(node))


@converter("Tile")
def _tile(im, node, ins, a):
    t = im.type(ins[0])
    reps = [int(v) for v in im.require_const(ins[1], "Tile repeats", node.name).reshape(-1)]
    if len(reps) != len(t.shape) or any(r < 0 for r in reps):
        raise UnsupportedOpError("node %s: Tile repeats %s for a rank-%d input" % (node.name, reps, len(t.shape)))
    c = im.const(ins[0])
    if c is not None:
        im.add_const(np.tile(c, reps), name=node.output[0])
        return
    if all(r == 1 for r in reps):
        _reshape_alias(im, ins[0], node)
        return
    # x (d0, d1, ...) tiled (r0, r1, ...) is x viewed as (1, d0, 1, d1, ...) broadcast to (r0, d0, r1, d1, ...)
    inter = [v for d in t.shape for v in (1, d)]
    full = [v for r, d in zip(reps, t.shape) for v in (r, d)]
    y = im.emit("broadcast_to", [_reshape(im, ins[0], inter)], {"shape": full}, node.name)
    _reshape(im, y, [r * d for r, d in zip(reps, t.shape)], node.name + "_merge", node.output[0])


@converter("Range")
def _range(im, node, ins, a):
    start, limit, delta = (im.require_const(ins[k], "Range " + w, node.name)
                           for k, w in enumerate(("start", "limit", "delta")))
    dt = np.asarray(start).dtype
    n = max(int(np.ceil((float(limit) - float(start)) / float(delta))), 0)
    im.add_const((np.asarray(start) + np.arange(n, dtype=dt) * np.asarray(delta)).astype(dt), name=node.output[0])


@converter("Size")
def _size(im, node, ins, a):
    im.add_const(np.array(im.type(ins[0]).size, dtype=np.int64), name=node.output[0])


# ---------------------------------------------------------------- bitwise ops and BitShift (issue 11)
_BITWISE = {"BitwiseAnd": "bitwise_and", "BitwiseOr": "bitwise_or", "BitwiseXor": "bitwise_xor"}


@converter(*_BITWISE)
def _bitwise(im, node, ins, a):
    dt = _require_dtype(im, node, ins[0], _INTS)
    _require_dtype(im, node, ins[1], (dt,))
    im.emit(_BITWISE[node.op_type], ins[:2], {}, node.name, _out(node))


@converter("BitwiseNot")
def _bitwise_not(im, node, ins, a):
    _require_dtype(im, node, ins[0], _INTS)
    im.emit("bitwise_not", ins[:1], {}, node.name, _out(node))


@converter("BitShift")
def _bit_shift(im, node, ins, a):
    # unsigned types, and from opset 28 signed ones (arithmetic right shift); the kernels lack uint16..uint64
    dt = _require_dtype(im, node, ins[0], _INTS)
    _require_dtype(im, node, ins[1], (dt,))
    direction = _str_attr(a, "direction", "")
    if direction not in ("LEFT", "RIGHT"):
        raise UnsupportedOpError("node %s: BitShift direction %r (LEFT or RIGHT)" % (node.name, direction))
    im.emit("bit_shift", ins[:2], {"direction": direction}, node.name, _out(node))


# ---------------------------------------------------------------- Max/Min: NaN propagates on floats (issue 11)
@converter("Max", "Min")
def _max_min(im, node, ins, a):
    """Variadic, broadcasting Max/Min; a NaN operand makes the element NaN (numpy, onnxruntime)."""
    dt = _require_dtype(im, node, ins[0], _NUMERIC)
    for x in ins[1:]:
        _require_dtype(im, node, x, (dt,))
    op = ("maximum" if node.op_type == "Max" else "minimum") + ("_nan" if dt in _FLOATS else "")
    _fold_variadic(im, node, ins, op)


# ---------------------------------------------------------------- run-time dtypes the kernels implement (issue 11)
_KERNEL_DTYPES = ("bool", "int8", "uint8", "int16", "int32", "int64", "float32", "float64")


def _onnx_type_name(vi) -> str:
    import onnx
    elem = vi.type.tensor_type.elem_type
    try:
        return onnx.TensorProto.DataType.Name(elem).lower()
    except ValueError:
        return "elem_type_%d" % elem


# ---------------------------------------------------------------- resize (ONNX Resize, Upsample)
# Scales and sizes are constants once input shapes are fixed, so every output position's source taps and
# weights are computed here, per axis, exactly as ONNX's reference does it (edge-clamped neighbours, ratio 1 on
# integer coordinates), and the kernel only gathers and blends (ops/resize.py).
_RESIZE_COORD_MODES = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric",
                       "tf_crop_and_resize")
_NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


def _resize_source_coords(mode: str, out_int: int, in_w: int, scale: float, roi: Optional[Tuple[float, float]]):
    """Source coordinate of each output position along one axis, and a mask of positions outside the input
    (tf_crop_and_resize only, else None). As the spec and onnxruntime (not the ONNX reference, which uses the
    fractional in_w * scale there): align_corners, tf_crop_and_resize and pytorch_half_pixel's length test use
    the integer output length; and in float32 arithmetic as onnxruntime, so coordinates that land exactly on
    a rounding boundary (a scale of 0.6 maps output 1 to 2.0 in float32, 1.9999999 in float64) round alike."""
    f = np.float32
    y = np.arange(out_int, dtype=f)
    sc, n_in, half = f(scale), f(in_w), f(0.5)
    outside = None
    if mode == "align_corners":
        x = np.zeros(out_int, f) if out_int == 1 else y * (n_in - f(1)) / f(out_int - 1)
    elif mode == "asymmetric":
        x = y / sc
    elif mode == "tf_crop_and_resize":
        r0, r1 = f(roi[0]), f(roi[1])
        x = np.full(out_int, half * (r0 + r1) * (n_in - f(1)), f) if out_int == 1 else \
            r0 * (n_in - f(1)) + (y * (r1 - r0) * (n_in - f(1))) / f(out_int - 1)
        outside = (x < 0) | (x > in_w - 1)
    elif mode == "pytorch_half_pixel":
        x = np.zeros(out_int, f) if out_int == 1 else (y + half) / sc - half
    elif mode == "half_pixel":
        x = (y + half) / sc - half
    else:   # half_pixel_symmetric
        offset = n_in / f(2) * (f(1) - f(out_int) / (sc * n_in))
        x = offset + (y + half) / sc - half
    return x.astype(np.float64), outside


def _resize_coeffs(kind: str, r: float, scale: float, A: float, antialias: bool) -> np.ndarray:
    """Weights of the neighbours of a source coordinate whose distance past the lower neighbour is `r` in
    (0, 1]. With antialias (downscaling) the kernel is stretched by 1/scale, so more taps (ONNX reference)."""
    if antialias:
        s = min(scale, 1.0)
        if kind == "linear":
            lo = int(np.floor(-1 / s) + 1)
            args = (np.arange(lo, lo + 2 - 2 * lo) - r) * s
            c = np.clip(1 - np.abs(args), 0, 1)
        else:
            lo = int(np.floor(-2 / s) + 1)
            xs = np.abs(np.array([s * (i - r) for i in range(lo, 2 - lo)]))
            c = np.where(xs <= 1, (A + 2) * xs ** 3 - (A + 3) * xs ** 2 + 1,
                         np.where(xs < 2, A * xs ** 3 - 5 * A * xs ** 2 + 8 * A * xs - 4 * A, 0.0))
        return c / c.sum()
    if kind == "linear":
        return np.array([1 - r, r])
    return np.array([((A * (r + 1) - 5 * A) * (r + 1) + 8 * A) * (r + 1) - 4 * A,
                     ((A + 2) * r - (A + 3)) * r * r + 1,
                     ((A + 2) * (1 - r) - (A + 3)) * (1 - r) * (1 - r) + 1,
                     ((A * ((1 - r) + 1) - 5 * A) * ((1 - r) + 1) + 8 * A) * ((1 - r) + 1) - 4 * A])


def _resize_axis_tables(kind: str, x_src: np.ndarray, in_w: int, scale: float, nearest_mode: str,
                        cubic_a: float, exclude_outside: bool,
                        antialias: bool = False) -> Tuple[np.ndarray, np.ndarray]:
    """(int32 indices, float32 weights), both (out, taps), for one axis."""
    base = np.floor(x_src)
    integer = x_src == base
    ratio = np.where(integer, 1.0, x_src - base)
    if kind == "nearest":
        if nearest_mode == "simple":       # Resize-10 / Upsample (onnxruntime): floor, or ceil when shrinking
            src = np.ceil(x_src) if scale < 1 else np.floor(x_src)
            return np.clip(src, 0, in_w - 1).astype(np.int32)[:, None], np.ones((len(x_src), 1), np.float32)
        pick_second = {"round_prefer_floor": ratio > 0.5, "round_prefer_ceil": ratio >= 0.5,
                       "floor": np.zeros_like(ratio, dtype=bool), "ceil": np.ones_like(ratio, dtype=bool)}[nearest_mode]
        pick_second = pick_second | integer       # an integer coordinate is its own second neighbour
        # two neighbours: floor and floor+1 (or x-1 and x on integers)
        first = np.where(integer, x_src - 1, base)
        src = first + pick_second
        return np.clip(src, 0, in_w - 1).astype(np.int32)[:, None], np.ones((len(x_src), 1), np.float32)
    coeffs = np.stack([_resize_coeffs(kind, float(r), scale, cubic_a, antialias) for r in ratio])
    taps = coeffs.shape[1]
    # the `taps` neighbours nearest x, preferring lower ones (ONNX reference, edge-clamped below)
    pad = -(-taps // 2)
    xp = x_src + pad
    p = np.floor(xp)
    frac = xp - p
    if taps % 2 == 0:
        offset = np.where(frac == 0, -(taps // 2), -(taps // 2) + 1)
    else:
        offset = np.where(frac <= 0.5, -((taps - 1) // 2), -((taps - 1) // 2) + 1)
    start = p + offset - pad
    idx = start[:, None] + np.arange(taps)[None, :]
    if exclude_outside:
        coeffs = np.where((idx < 0) | (idx >= in_w), 0.0, coeffs)
        total = coeffs.sum(axis=1, keepdims=True)
        coeffs = coeffs / np.where(total == 0, 1.0, total)
    return np.clip(idx, 0, in_w - 1).astype(np.int32), coeffs.astype(np.float32)


def _resize_emit(im, node, x: str, kind: str, coord: str, nearest_mode: str, scales: List[float],
                 out_shape: List[int], roi: Optional[List[float]], cubic_a: float, exclude_outside: bool,
                 extrapolation: float, antialias: bool = False) -> None:
    t = im.type(x)
    nd = len(t.shape)
    if t.dtype != "float32":
        raise UnsupportedOpError("node %s: %s on %s tensors (float32 only)" % (node.name, node.op_type, t.dtype))
    if any(d <= 0 for d in out_shape):
        raise UnsupportedOpError("node %s: %s to an empty output %s" % (node.name, node.op_type, out_shape))
    axes_meta, tables = [], []
    for d in range(nd):
        axis_roi = (roi[d], roi[d + nd]) if roi is not None else (0.0, 1.0)
        if coord != "tf_crop_and_resize" or axis_roi == (0.0, 1.0):
            if out_shape[d] == t.shape[d] and np.isclose(scales[d], 1.0):
                continue          # an untouched axis (batch, channels)
        src, outside = _resize_source_coords(coord, out_shape[d], t.shape[d], scales[d], axis_roi)
        idx, w = _resize_axis_tables(kind, src, t.shape[d], scales[d], nearest_mode, cubic_a, exclude_outside,
                                     antialias)
        meta = {"axis": d, "taps": int(idx.shape[1]), "weights": kind != "nearest",
                "inside": outside is not None and bool(outside.any())}
        if meta["taps"] == 1 and not meta["inside"] and np.array_equal(idx[:, 0], np.arange(t.shape[d])):
            continue              # identity along this axis
        tables.append(im.add_const(idx, "resize_idx"))
        if meta["weights"]:
            tables.append(im.add_const(w, "resize_w"))
        if meta["inside"]:
            tables.append(im.add_const((~outside).astype(np.float32), "resize_inside"))
        axes_meta.append(meta)
    if not axes_meta:
        _reshape_alias(im, x, node)
        return
    terms = int(np.prod([m["taps"] for m in axes_meta]))
    if terms > 256:
        raise UnsupportedOpError("node %s: %s reads %d input elements per output (antialiased downscale by a "
                                 "large factor); at most 256 are supported" % (node.name, node.op_type, terms))
    im.emit("resize", [x] + tables, {"shape": list(out_shape), "axes": axes_meta,
                                     "extrapolation": float(extrapolation)}, node.name, _out(node))


def _resize_kind(node, a: dict, allowed=("nearest", "linear", "cubic")) -> str:
    mode = _str_attr(a, "mode", "nearest")
    if mode in ("bilinear", "trilinear"):     # Upsample-7's spellings
        mode = "linear"
    if mode not in allowed:
        raise UnsupportedOpError("node %s: %s mode %r (supported: %s)" % (node.name, node.op_type, mode,
                                                                          ", ".join(allowed)))
    return mode


@converter("Upsample")
def _upsample(im, node, ins, a):
    t = im.type(ins[0])
    kind = _resize_kind(node, a, ("nearest", "linear"))
    if im.opset >= 9 and len(ins) > 1:
        scales = [float(v) for v in im.require_const(ins[1], "Upsample scales", node.name).reshape(-1)]
    else:
        scales = [float(v) for v in a["scales"]]
    out_shape = [int(np.floor(d * s)) for d, s in zip(t.shape, scales)]
    _resize_emit(im, node, ins[0], kind, "asymmetric", "simple", scales, out_shape, None, -0.75, False, 0.0)


@converter("Resize")
def _resize_conv(im, node, ins, a):
    t = im.type(ins[0])
    nd = len(t.shape)
    kind = _resize_kind(node, a, ("nearest", "linear") if im.opset < 11 else ("nearest", "linear", "cubic"))
    if im.opset < 11:     # Resize-10: X, scales; asymmetric coordinates, onnxruntime's "simple" nearest
        scales = [float(v) for v in im.require_const(ins[1], "Resize scales", node.name).reshape(-1)]
        out_shape = [int(np.floor(d * s)) for d, s in zip(t.shape, scales)]
        _resize_emit(im, node, ins[0], kind, "asymmetric", "simple", scales, out_shape, None, -0.75, False, 0.0)
        return
    coord = _str_attr(a, "coordinate_transformation_mode", "half_pixel")
    if coord not in _RESIZE_COORD_MODES:
        raise UnsupportedOpError("node %s: Resize coordinate_transformation_mode %r (supported: %s)"
                                 % (node.name, coord, ", ".join(_RESIZE_COORD_MODES)))
    nearest_mode = _str_attr(a, "nearest_mode", "round_prefer_floor")
    if kind == "nearest" and nearest_mode not in _NEAREST_MODES:
        raise UnsupportedOpError("node %s: Resize nearest_mode %r" % (node.name, nearest_mode))
    antialias = bool(int(a.get("antialias", 0)))
    if antialias and kind == "nearest":
        raise UnsupportedOpError("node %s: Resize antialias=1 with mode nearest (undefined)" % node.name)
    policy = _str_attr(a, "keep_aspect_ratio_policy", "stretch")
    if policy not in ("stretch", "not_larger", "not_smaller"):
        raise UnsupportedOpError("node %s: Resize keep_aspect_ratio_policy %r" % (node.name, policy))
    axes = [_norm_axis(int(v), nd) for v in a.get("axes", range(nd))]

    def opt(k, what):
        if len(ins) > k and ins[k]:
            v = im.require_const(ins[k], "Resize " + what, node.name).reshape(-1)
            return v if v.size else None
        return None
    roi_in, scales_in, sizes_in = opt(1, "roi"), opt(2, "scales"), opt(3, "sizes")
    if (scales_in is None) == (sizes_in is None):
        raise UnsupportedOpError("node %s: Resize needs exactly one of scales and sizes" % node.name)
    roi = None
    if coord == "tf_crop_and_resize":
        if roi_in is None:
            raise UnsupportedOpError("node %s: Resize tf_crop_and_resize without roi" % node.name)
        roi = [0.0] * nd + [1.0] * nd
        for k, d in enumerate(axes):
            roi[d], roi[d + nd] = float(roi_in[k]), float(roi_in[k + len(axes)])
    if scales_in is not None:
        if len(scales_in) != len(axes):
            raise UnsupportedOpError("node %s: Resize has %d scales for %d axes" % (node.name, len(scales_in),
                                                                                  len(axes)))
        scales = [1.0] * nd
        for k, d in enumerate(axes):
            scales[d] = float(scales_in[k])
        if any(s <= 0 for s in scales):
            raise UnsupportedOpError("node %s: Resize scales %s must be positive" % (node.name, scales))
        out_shape = []
        for d in range(nd):
            extent = t.shape[d] * (roi[d + nd] - roi[d] if roi is not None else 1.0)
            out_shape.append(int(np.floor(extent * scales[d])))
    else:
        if len(sizes_in) != len(axes):
            raise UnsupportedOpError("node %s: Resize has %d sizes for %d axes" % (node.name, len(sizes_in),
                                                                                 len(axes)))
        out_shape = list(t.shape)
        for k, d in enumerate(axes):
            out_shape[d] = int(sizes_in[k])
        scales = [out_shape[d] / t.shape[d] for d in range(nd)]
        if policy != "stretch":
            pick = min if policy == "not_larger" else max
            s = pick(scales[d] for d in axes)
            scales = [s if d in axes else 1.0 for d in range(nd)]
            out_shape = [int(s * t.shape[d] + 0.5) if d in axes else t.shape[d] for d in range(nd)]
    _resize_emit(im, node, ins[0], kind, coord, nearest_mode, scales, out_shape, roi,
                 float(a.get("cubic_coeff_a", -0.75)), bool(a.get("exclude_outside", 0)),
                 float(a.get("extrapolation_value", 0.0)), antialias)


# ---------------------------------------------------------------- ConvTranspose
# A transposed convolution is a stride-1 convolution of the input with zeros inserted between its elements
# (stride - 1 per gap), padded by dilation * (kernel - 1) - pad on each side (negative: cropped), with the kernel
# flipped and its in/out channels swapped per group. That reuses the conv2d kernels (and their GEMM paths); the
# weight rearrangement folds at import when the weight is a constant.
def _conv_transpose_pads(node, a: dict, in_sp, k, s, d, out_pad) -> List[int]:
    nd = len(in_sp)
    auto = _str_attr(a, "auto_pad", "NOTSET")
    if "output_shape" in a or auto in ("SAME_UPPER", "SAME_LOWER"):
        if "output_shape" in a:
            target = list(a["output_shape"])[-nd:]
        else:
            target = [in_sp[i] * s[i] for i in range(nd)]
        begin, end = [], []
        for i in range(nd):
            total = s[i] * (in_sp[i] - 1) + out_pad[i] + ((k[i] - 1) * d[i] + 1) - target[i]
            # onnxruntime (which tether follows): SAME_UPPER puts the odd unit at the end, anything else at
            # the start
            if auto == "SAME_UPPER":
                begin.append(total // 2)
                end.append(total - total // 2)
            else:
                begin.append(total - total // 2)
                end.append(total // 2)
        return begin + end
    if auto == "VALID":
        return [0] * (2 * nd)
    if auto != "NOTSET":
        raise UnsupportedOpError("node %s: ConvTranspose auto_pad %r" % (node.name, auto))
    return list(a.get("pads", [0] * (2 * nd)))


def _conv_transpose_phases(im, node, ins, x, w, xshape, k, s, pads, out_pad, g, mg, nd) -> None:
    """Strided transposed conv as s0*s1 stride-1 convs, one per output phase (oy % s0, ox % s1), each with the
    sub-kernel of the taps that reach that phase: s0*s1 times fewer multiply-adds than convolving the
    zero-inserted input. Output rows oy = s*q + a get sum_t x[q + c_a - t] * w[k0_a + s*t] with
    k0_a = (a + pad) % s and c_a = (a + pad) // s: a correlation with the reversed sub-kernel. The phases are
    stacked (a view concat: each conv writes its slice), interleaved by one transpose, and cropped."""
    n, c, h, wd = xshape
    out = [s[i] * (xshape[2 + i] - 1) + out_pad[i] + k[i] - pads[i] - pads[i + 2] for i in range(2)]
    qmax = [-(-out[i] // s[i]) for i in range(2)]
    # weight (c, m/g, kh, kw) -> (m, c/g, kh, kw), not flipped: each phase slices its taps in reverse
    w5 = _reshape(im, w, (g, c // g, mg, k[0], k[1]))
    w5 = im.emit("transpose", [w5], {"axes": [0, 2, 1, 3, 4]}, node.name + "_wT")
    w4 = _reshape(im, w5, (g * mg, c // g, k[0], k[1]))
    has_bias = len(ins) > 2 and bool(ins[2])
    bias = _reshape(im, ins[2], (1, g * mg, 1, 1)) if has_bias else None
    phases = []
    for a0 in range(s[0]):
        for a1 in range(s[1]):
            begin, end, step, conv_pads = [0, 0], [g * mg, c // g], [1, 1], [0, 0, 0, 0]
            for i, ai in enumerate((a0, a1)):
                k0, ci = (ai + pads[i]) % s[i], (ai + pads[i]) // s[i]
                taps = -(-(k[i] - k0) // s[i])
                last = k0 + s[i] * (taps - 1)
                begin.append(last)
                end.append(k0 - 1)
                step.append(-s[i])
                conv_pads[i] = taps - 1 - ci                                   # may be negative: cropped
                conv_pads[i + 2] = qmax[i] - xshape[2 + i] - conv_pads[i] + taps - 1
            wp = im.emit("strided_slice", [w4], {"begin": begin, "end": end, "step": step},
                         node.name + "_w%d%d" % (a0, a1))
            xp = x
            if any(p < 0 for p in conv_pads):     # conv2d takes non-negative pads: crop (and pad) first
                xp = im.emit("pad", [x], {"pads": [0, 0, conv_pads[0], conv_pads[1], 0, 0, conv_pads[2],
                                                   conv_pads[3]], "value": 0.0, "mode": "constant"},
                             node.name + "_crop%d%d" % (a0, a1))
                conv_pads = [0, 0, 0, 0]
            y = im.emit("conv2d", [xp, wp], {"strides": [1, 1], "dilations": [1, 1],
                                             "pads": [conv_pads[0], conv_pads[1], conv_pads[2], conv_pads[3]],
                                             "groups": g}, node.name + "_phase%d%d" % (a0, a1))
            if bias is not None:
                y = im.emit("add", [y, bias], {}, node.name + "_bias%d%d" % (a0, a1))
            phases.append(y)
    # phase-major along the batch axis: (s0*s1*n, m, q0, q1), a view concat the convs write into directly
    stacked = im.emit("concat", phases, {"axis": 0}, node.name + "_phases") if len(phases) > 1 else phases[0]
    six = _reshape(im, stacked, (s[0], s[1], n, g * mg, qmax[0], qmax[1]))
    inter = im.emit("transpose", [six], {"axes": [2, 3, 4, 0, 5, 1]}, node.name + "_interleave")
    full = _reshape(im, inter, (n, g * mg, qmax[0] * s[0], qmax[1] * s[1]))
    if list(out) != [qmax[0] * s[0], qmax[1] * s[1]]:
        full = im.emit("strided_slice", [full], {"begin": [0, 0, 0, 0], "end": [n, g * mg, out[0], out[1]],
                                                 "step": [1, 1, 1, 1]}, node.name + "_crop")
    if nd == 1:
        _reshape(im, full, (n, g * mg, out[1]), node.name + "_squeeze", node.output[0])
    else:
        _reshape(im, full, (n, g * mg, out[0], out[1]), node.name + "_out", node.output[0])


@converter("ConvTranspose")
def _conv_transpose(im, node, ins, a):
    xt, wt = im.type(ins[0]), im.type(ins[1])
    if xt.dtype != "float32":
        raise UnsupportedOpError("node %s: ConvTranspose on %s tensors (float32 only)" % (node.name, xt.dtype))
    nd = len(xt.shape) - 2
    if nd not in (1, 2):
        raise UnsupportedOpError("node %s: %d-D ConvTranspose (only 1-D and 2-D)" % (node.name, nd))
    g = int(a.get("group", 1))
    n, c = xt.shape[:2]
    cin, mg = wt.shape[:2]
    k = list(a.get("kernel_shape", wt.shape[2:]))
    s = list(a.get("strides", [1] * nd))
    d = list(a.get("dilations", [1] * nd))
    out_pad = list(a.get("output_padding", [0] * nd))
    if cin != c or c % g or list(wt.shape[2:]) != k:
        raise UnsupportedOpError("node %s: ConvTranspose weight %s for input %s, group %d, kernel %s"
                                 % (node.name, wt.shape, xt.shape, g, k))
    pads = _conv_transpose_pads(node, a, list(xt.shape[2:]), k, s, d, out_pad)
    x, w = ins[0], ins[1]
    in_sp = list(xt.shape[2:])
    if nd == 1:     # as 2-D over a height of one
        x = _reshape(im, x, (n, c, 1, in_sp[0]))
        w = _reshape(im, w, (cin, mg, 1, k[0]))
        in_sp, k, s, d, out_pad = [1] + in_sp, [1] + k, [1] + s, [1] + d, [0] + out_pad
        pads = [0, pads[0], 0, pads[1]]
    h, wd = in_sp
    if (s[0] > 1 or s[1] > 1) and d == [1, 1] and all(k[i] >= s[i] for i in range(2)):
        _conv_transpose_phases(im, node, ins, x, w, (n, c, h, wd), k, s, pads, out_pad, g, mg, nd)
        return
    # zeros between elements: (n, c, h, 1, w, 1) padded to (n, c, h, s0, w, s1), flattened, the tail cropped
    if s[0] > 1 or s[1] > 1:
        x6 = _reshape(im, x, (n, c, h, 1, wd, 1))
        x6 = im.emit("pad", [x6], {"pads": [0] * 6 + [0, 0, 0, s[0] - 1, 0, s[1] - 1], "value": 0.0,
                                   "mode": "constant"}, node.name + "_dilate")
        x = _reshape(im, x6, (n, c, h * s[0], wd * s[1]))
    crop = [s[0] - 1, s[1] - 1]
    begin = [d[i] * (k[i] - 1) - pads[i] for i in range(2)]
    end = [d[i] * (k[i] - 1) - pads[i + 2] + out_pad[i] - crop[i] for i in range(2)]
    if any(begin) or any(end):
        x = im.emit("pad", [x], {"pads": [0, 0] + begin + [0, 0] + end, "value": 0.0, "mode": "constant"},
                    node.name + "_pad")
    # weight (c, m/g, kh, kw) -> (g, c/g, m/g, kh, kw) -> (g, m/g, c/g, kh, kw) -> (m, c/g, kh, kw), flipped
    w5 = _reshape(im, w, (g, c // g, mg, k[0], k[1]))
    w5 = im.emit("transpose", [w5], {"axes": [0, 2, 1, 3, 4]}, node.name + "_wT")
    w4 = _reshape(im, w5, (g * mg, c // g, k[0], k[1]))
    w4 = im.emit("strided_slice", [w4], {"begin": [0, 0, k[0] - 1, k[1] - 1], "end": [g * mg, c // g, -1, -1],
                                         "step": [1, 1, -1, -1]}, node.name + "_wflip")
    attrs = {"strides": [1, 1], "dilations": d, "pads": [0, 0, 0, 0], "groups": g}
    has_bias = len(ins) > 2 and bool(ins[2])
    final = _out(node) if nd == 2 and not has_bias else None
    y = im.emit("conv2d", [x, w4], attrs, node.name, final)
    if has_bias:
        b = _reshape(im, ins[2], (1, g * mg, 1, 1))
        y = im.emit("add", [y, b], {}, node.name + "_bias", _out(node) if nd == 2 else None)
    if nd == 1:
        t = im.type(y)
        _reshape(im, y, (t.shape[0], t.shape[1], t.shape[3]), node.name + "_squeeze", node.output[0])


# ---------------------------------------------------------------- index-driven ops: Gather (general),
# GatherElements, GatherND, OneHot, Trilu, EyeLike, DepthToSpace, SpaceToDepth
_INDEX_DTYPES = ("int32", "int64")


def _check_index_dtype(im, node, name: str) -> None:
    dt = im.type(name).dtype
    if dt not in _INDEX_DTYPES:
        raise UnsupportedOpError("node %s: %s indices of type %s (int32 or int64)" % (node.name, node.op_type, dt))


def _gather_general(im, node, ins, a) -> None:
    _check_index_dtype(im, node, ins[1])
    t, it = im.type(ins[0]), im.type(ins[1])
    axis = _norm_axis(int(a.get("axis", 0)), len(t.shape))
    shape = tuple(t.shape[:axis]) + tuple(it.shape) + tuple(t.shape[axis + 1:])
    if not shape:     # kernels never write rank-0 tensors
        y = im.emit("gather", [ins[0], _reshape(im, ins[1], (1,))], {"axis": axis, "shape": [1]}, node.name)
        _reshape(im, y, (), node.name + "_scalar", node.output[0])
        return
    im.emit("gather", [ins[0], ins[1]], {"axis": axis, "shape": list(shape)}, node.name, _out(node))


@converter("GatherElements")
def _gather_elements(im, node, ins, a):
    _check_index_dtype(im, node, ins[1])
    axis = _norm_axis(int(a.get("axis", 0)), len(im.type(ins[0]).shape))
    im.emit("gather_elements", [ins[0], ins[1]], {"axis": axis}, node.name, _out(node))


@converter("GatherND")
def _gather_nd(im, node, ins, a):
    _check_index_dtype(im, node, ins[1])
    t, it = im.type(ins[0]), im.type(ins[1])
    b = int(a.get("batch_dims", 0))
    k = it.shape[-1]
    if b + k > len(t.shape) or tuple(it.shape[:b]) != tuple(t.shape[:b]):
        raise UnsupportedOpError("node %s: GatherND indices %s with batch_dims %d on data %s"
                                 % (node.name, it.shape, b, t.shape))
    shape = tuple(it.shape[:-1]) + tuple(t.shape[b + k:])
    if not shape:
        raise UnsupportedOpError("node %s: GatherND to a scalar" % node.name)
    im.emit("gather_nd", [ins[0], ins[1]], {"batch_dims": b, "shape": list(shape)}, node.name, _out(node))


@converter("OneHot")
def _one_hot_conv(im, node, ins, a):
    it = im.type(ins[0])
    if it.dtype not in _INDEX_DTYPES + ("float32",):
        raise UnsupportedOpError("node %s: OneHot indices of type %s" % (node.name, it.dtype))
    depth_v = im.require_const(ins[1], "OneHot depth", node.name).reshape(-1)[0]
    depth = int(depth_v)
    values = ins[2]
    if im.type(values).size != 2:
        raise UnsupportedOpError("node %s: OneHot values must hold [off, on]" % node.name)
    values = _reshape(im, values, (2,))
    nd = len(it.shape) + 1
    axis = _norm_axis(int(a.get("axis", -1)), nd)
    shape = list(it.shape)
    shape.insert(axis, depth)
    im.emit("one_hot", [ins[0], values], {"depth": depth, "axis": axis, "shape": shape}, node.name, _out(node))


@converter("Trilu")
def _trilu_conv(im, node, ins, a):
    t = im.type(ins[0])
    if len(t.shape) < 2:
        raise UnsupportedOpError("node %s: Trilu of a rank-%d tensor" % (node.name, len(t.shape)))
    k = int(im.require_const(ins[1], "Trilu k", node.name).reshape(-1)[0]) if len(ins) > 1 and ins[1] else 0
    im.emit("trilu", [ins[0]], {"k": k, "upper": int(a.get("upper", 1))}, node.name, _out(node))


@converter("EyeLike")
def _eye_like(im, node, ins, a):
    t = im.type(ins[0])
    if len(t.shape) != 2:
        raise UnsupportedOpError("node %s: EyeLike of a rank-%d tensor (2-D only)" % (node.name, len(t.shape)))
    dt = _ONNX_DTYPES[a["dtype"]] if "dtype" in a else t.dtype
    im.add_const(np.eye(t.shape[0], t.shape[1], k=int(a.get("k", 0)), dtype=dt), name=node.output[0])


@converter("DepthToSpace")
def _depth_to_space(im, node, ins, a):
    n, c, h, w = im.type(ins[0]).shape
    b = int(a["blocksize"])
    mode = _str_attr(a, "mode", "DCR")
    if c % (b * b):
        raise UnsupportedOpError("node %s: DepthToSpace of %d channels by blocksize %d" % (node.name, c, b))
    if mode == "DCR":
        x6 = _reshape(im, ins[0], (n, b, b, c // (b * b), h, w))
        perm = [0, 3, 4, 1, 5, 2]
    elif mode == "CRD":
        x6 = _reshape(im, ins[0], (n, c // (b * b), b, b, h, w))
        perm = [0, 1, 4, 2, 5, 3]
    else:
        raise UnsupportedOpError("node %s: DepthToSpace mode %r (DCR or CRD)" % (node.name, mode))
    y = im.emit("transpose", [x6], {"axes": perm}, node.name)
    _reshape(im, y, (n, c // (b * b), h * b, w * b), node.name + "_merge", node.output[0])


@converter("SpaceToDepth")
def _space_to_depth(im, node, ins, a):
    n, c, h, w = im.type(ins[0]).shape
    b = int(a["blocksize"])
    if h % b or w % b:
        raise UnsupportedOpError("node %s: SpaceToDepth of %dx%d by blocksize %d" % (node.name, h, w, b))
    mode = _str_attr(a, "mode", "DCR")
    if mode not in ("DCR", "CRD"):
        raise UnsupportedOpError("node %s: SpaceToDepth mode %r (DCR or CRD)" % (node.name, mode))
    x6 = _reshape(im, ins[0], (n, c, h // b, b, w // b, b))
    # DCR puts the block offsets before the channels, CRD after (the inverses of DepthToSpace's modes)
    perm = [0, 3, 5, 1, 2, 4] if mode == "DCR" else [0, 1, 3, 5, 2, 4]
    y = im.emit("transpose", [x6], {"axes": perm}, node.name)
    _reshape(im, y, (n, c * b * b, h // b, w // b), node.name + "_merge", node.output[0])


# ---------------------------------------------------------------- entry point
def unsupported_ops(model) -> Dict[str, List[str]]:
    """Every ONNX op type in `model` with no converter, with the names of its nodes."""
    missing: Dict[str, List[str]] = {}
    for i, node in enumerate(model.graph.node):
        if node.op_type not in CONVERTERS or (node.domain not in ("", "ai.onnx")):
            missing.setdefault(node.op_type, []).append(node.name or "#%d" % i)
    return missing


def op_coverage(model) -> List[dict]:
    """Per (domain, op type) of ``model``: its opset, whether a converter covers it, and its nodes' names, in
    order of first use. Covered means there is a converter; a converter may still refuse an attribute value
    or dtype when the model is imported."""
    opsets = {o.domain or "ai.onnx": o.version for o in model.opset_import}
    rows: Dict[Tuple[str, str], dict] = {}
    for i, node in enumerate(model.graph.node):
        domain = node.domain or "ai.onnx"
        key = (domain, node.op_type)
        if key not in rows:
            rows[key] = {"domain": domain, "op_type": node.op_type, "opset": opsets.get(domain),
                         "covered": domain == "ai.onnx" and node.op_type in CONVERTERS, "nodes": []}
        rows[key]["nodes"].append(node.name or "#%d" % i)
    return list(rows.values())


def _value_info_type(vi) -> Tuple[Tuple[Optional[int], ...], str]:
    tt = vi.type.tensor_type
    dims = tuple(d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim)
    return dims, _ONNX_DTYPES.get(tt.elem_type, "elem_type_%d" % tt.elem_type)


def from_onnx(model, shape: Optional[Mapping[str, Sequence[int]]] = None,
              dtype: Optional[Mapping[str, str]] = None,
              constants: Optional[Mapping[str, np.ndarray]] = None) -> Tuple[Graph, Dict[str, np.ndarray]]:
    """Import an ONNX ModelProto (or a path) as (graph, params).

    ``shape`` fixes input shapes (needed for inputs with symbolic dimensions); ``constants`` binds run-time
    inputs to fixed values (e.g. an int64 shape input), which then fold like initializers.
    """
    import onnx
    from onnx import numpy_helper

    if isinstance(model, (str, bytes)) or hasattr(model, "__fspath__"):
        model = onnx.load(model)
    missing = unsupported_ops(model)
    if missing:
        listing = "; ".join("%s (%s)" % (op, ", ".join(names[:8]) + (" ..." if len(names) > 8 else ""))
                            for op, names in sorted(missing.items()))
        raise UnsupportedOpError("the model uses %d unsupported op type(s): %s" % (len(missing), listing))
    opset = max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=13)
    im = _Importer(opset)
    im.reserved = {v for n in model.graph.node for v in list(n.input) + list(n.output)} | \
        {v.name for v in list(model.graph.input) + list(model.graph.output)}
    shape = dict(shape or {})
    dtype = dict(dtype or {})
    constants = dict(constants or {})
    for init in model.graph.initializer:
        im.add_const(numpy_helper.to_array(init), name=init.name)
    inputs: List[str] = []
    runtime = [vi.name for vi in model.graph.input if vi.name not in im.consts and vi.name not in constants]
    unknown = set(shape) - set(runtime)
    if unknown:
        raise ValueError("shape given for %s, which are not run-time inputs of the model (inputs: %s)"
                         % (sorted(unknown), runtime))
    for vi in model.graph.input:
        if vi.name in im.consts:
            continue
        dims, dt = _value_info_type(vi)
        dt = dtype.get(vi.name, dt)
        if vi.name in constants:
            im.add_const(np.asarray(constants[vi.name], dtype=dt), name=vi.name)
            continue
        if vi.name in shape:
            dims = tuple(int(d) for d in shape[vi.name])
        if any(d is None for d in dims):
            raise ValueError("input %r has a symbolic shape %s: fix it with from_onnx(..., shape={%r: (...)}) "
                             "(CLI: --input-shape %s:D0,D1,...)" % (vi.name, dims, vi.name, vi.name))
        if dt not in _KERNEL_DTYPES:
            raise UnsupportedOpError("input %r has element type %s, which tether's kernels do not implement "
                                     "(they take %s)" % (vi.name, _onnx_type_name(vi), ", ".join(_KERNEL_DTYPES)))
        im.types[vi.name] = TensorType(dims, dt)
        inputs.append(vi.name)
    for i, node in enumerate(model.graph.node):
        if not node.name:
            node.name = "%s_%d" % (node.op_type, i)
        ins = [x for x in node.input]
        for x in ins:
            if x and x not in im.types:
                raise ValueError("node %s (%s) reads %r, which nothing defines" % (node.name, node.op_type, x))
        CONVERTERS[node.op_type](im, node, ins, _attrs(node))
        for o in node.output:
            if o and o not in im.types:
                raise UnsupportedOpError("node %s (%s): output %r was not produced" % (node.name, node.op_type, o))
    outputs = [o.name for o in model.graph.output]
    graph = Graph(inputs, outputs, im.nodes, im.types, name=model.graph.name or "main")
    used = {i for n in graph.nodes for i in n.inputs} | set(outputs)
    params = {k: v for k, v in im.consts.items() if k in used}
    graph.types = {k: v for k, v in graph.types.items() if k in used or k in inputs
                   or any(k in n.outputs for n in graph.nodes)}
    graph.validate(params)
    log.info("imported %s: %d nodes, %d params", graph.name, len(graph.nodes), len(params))
    return graph, params
