"""The QDQ form of int8 models as integer kernels: ``fuse_qdq(graph, params)``.

quantize_static's QDQ form writes float ops between DequantizeLinear and QuantizeLinear. onnxruntime runs each
recognised ``DQ -> op -> Q`` group as one integer kernel (its QLinearConv, QGemm, QLinearAdd, ...), which rounds
differently from the float op, so tether does the same. The pass runs before constant folding (the frontend keeps
the DequantizeLinear of constant weights as nodes) and rewrites, for each ``quantize`` node whose producer chain
matches:

Patterns (per-tensor activations, constant weights, scales and zero points) and what they become:

- ``Q(conv2d(DQ(x), DQ(w)) [+ DQ(bias int32, scale sx * sw)])``
  becomes ``requantize(conv2d(int32(x) - zx, w - zw) + bias, sx * sw / sy, zy)``;
- ``Q([reshape](dense([reshape](DQ(a)), [transpose](DQ(w))) [+ DQ(bias)]))``
  becomes the same with ``dense`` (Gemm, MatMul).
| ``Q(add(DQ(a), DQ(b)))`` | ``qadd(a, b, ...)`` (onnxruntime's QLinearAdd) |
| ``Q(global_avg_pool(DQ(x)))`` | ``requantize(sum(int32(x)) - zx * HW, sx / (sy * HW), zy)`` |
| ``Q(reshape*(DQ(x)))`` with the same scale, zero point and type | ``reshape*(x)`` (Flatten, Reshape: no arithmetic) |

Also (a later block, onnxruntime 1.32's x86 CPU QDQ transformer row by row; docs/graph.md "More QDQ groups"):

| pattern | becomes | onnxruntime |
|---|---|---|
| ``Q(avg_pool(DQ(x)))`` 2-D, no dilation/ceil_mode | ``qavg_pool`` (kernels/qpool_ops.py) | QLinearAveragePool |
| ``Q(concat(DQ(x_i)...))`` | ``concat(table_i[x_i])``, ``table_i = Q(DQ(v))`` | QLinearConcat |
| ``Q(f(DQ(x)))``, f sigmoid or leaky_relu | ``table[x]``, ``table = Q(f(DQ(v)))`` | QLinearSigmoid/LeakyRelu |
| ``Q(op(DQ(x)))``, op a max pool, nearest resize, transpose, slice or pad; equal params | ``op(x)`` | drops Q/DQ |

A constant pad pads the integers with ``Q(value)``. HardSwish, HardSigmoid, Tanh and linear Resize stay float, as
onnxruntime leaves them.

With int8 activations the Add row and convs whose input dequantize has other readers stay unfused, as onnxruntime
on x86 leaves them. A Relu or Clip right before the Q is looked through when Q's saturation already does what it
does (zero point at the type's minimum; clip bounds covering Q's range), as onnxruntime removes it.

Weights are per channel along the output channels (conv axis 0, dense rows) or per tensor. A group that does not
match (a per-channel activation, a run-time scale, an op outside the table) stays as it is: dequantize, the float
op, quantize, which computes what the ONNX model says, one rounding apart from onnxruntime's integer kernel.
"""
from __future__ import annotations

import logging
from typing import Dict, List, Optional, Tuple

import numpy as np

from tether.graph import op_info
from tether.kernels import quantize_ops
from tether.graph.ir import Graph, Node, TensorType, unique_name

log = logging.getLogger(__name__)

F32 = np.float32


class Rewriter:
    """Nodes and params added for one graph; names fresh against every value of the graph."""

    def __init__(self, graph: Graph, params: Dict[str, np.ndarray]) -> None:
        self.graph, self.params = graph, params
        self.producer = {o: n for n in graph.nodes for o in n.outputs}
        self.uses: Dict[str, int] = {}
        for n in graph.nodes:
            for i in n.inputs:
                self.uses[i] = self.uses.get(i, 0) + 1
        for o in graph.outputs:
            self.uses[o] = self.uses.get(o, 0) + 1
        self.taken = set(graph.types) | set(params)
        self.out: List[Node] = []

    def fresh(self, hint: str) -> str:
        name = unique_name(hint, self.taken)
        self.taken.add(name)
        return name

    def const(self, value: np.ndarray, hint: str) -> str:
        name = self.fresh(hint)
        value = np.array(value, order="C")    # (ascontiguousarray would make a scalar 1-D)
        self.params[name] = value
        self.graph.types[name] = TensorType(value.shape, value.dtype)
        return name

    def emit(self, op: str, inputs: List[str], attrs: Optional[dict] = None, out: Optional[str] = None,
             hint: str = "q") -> str:
        attrs = dict(attrs or {})
        (t,) = op_info.infer(op, attrs, [self.graph.types[i] for i in inputs])
        out = out or self.fresh(hint + "_" + op)
        self.graph.types[out] = t
        self.out.append(Node(op, self.fresh(hint + "_" + op + "_node"), list(inputs), [out], attrs))
        return out

    # ---- matching
    def only_use(self, value: str, op: str) -> Optional[Node]:
        """The producer of ``value`` if it is an ``op`` node whose output nothing else reads."""
        n = self.producer.get(value)
        return n if n is not None and n.op == op and self.uses.get(value, 0) == 1 else None

    def dq(self, value: str) -> Optional[Tuple[str, np.ndarray, np.ndarray]]:
        """(integer input, scale, zero point) of a dequantize node with constant scale and zero point."""
        n = self.producer.get(value)
        if n is None or n.op != "dequantize" or n.inputs[1] not in self.params or n.inputs[2] not in self.params:
            return None
        return n.inputs[0], self.params[n.inputs[1]], self.params[n.inputs[2]]

    def dq_tensor(self, value: str) -> Optional[Tuple[str, float, int]]:
        """A per-tensor dequantize of a run-time (or constant) value, seen through reshapes."""
        n = self.producer.get(value)
        shape = None
        while n is not None and n.op == "reshape":
            shape = shape or tuple(n.attrs["shape"])
            n = self.producer.get(n.inputs[0])
        if n is None:
            return None
        d = self.dq(n.outputs[0])
        if d is None or d[1].size != 1 or d[2].size != 1:
            return None
        x = d[0]
        if shape is not None:
            x = self.emit("reshape", [x], {"shape": shape})
        return x, float(d[1].reshape(-1)[0]), int(d[2].reshape(-1)[0])

    def weight(self, value: str, transposed_ok: bool) -> Optional[Tuple[np.ndarray, np.ndarray]]:
        """(int32 weight minus its zero point, per-output-channel scale) of a dequantized constant weight (through
        one transpose for dense), when scale and zero point vary along the first axis at most."""
        n = self.producer.get(value)
        axes = None
        if transposed_ok and n is not None and n.op == "transpose":
            axes = n.attrs["axes"]
            n = self.producer.get(n.inputs[0])
        if n is None:
            return None
        d = self.dq(n.outputs[0])
        if d is None or d[0] not in self.params:
            return None
        w, s, z = self.params[d[0]], d[1], d[2]
        if w.dtype not in (np.int8, np.uint8):
            return None
        s = np.broadcast_to(s, w.shape)
        w32 = w.astype(np.int32) - np.broadcast_to(z, w.shape).astype(np.int32)
        if axes is not None:
            w32, s = np.transpose(w32, axes), np.transpose(s, axes)
        s2 = s.reshape(s.shape[0], -1)
        if not (s2 == s2[:, :1]).all():
            return None
        return np.ascontiguousarray(w32), s2[:, 0].astype(F32)

    def bias(self, value: str, channels: int, scale: np.ndarray) -> Optional[np.ndarray]:
        """An int32 bias: a dequantize (zero point 0) of a constant, seen through reshapes, as (channels,), whose
        scale is the accumulator's (``scale``, sx * sw in float32, as quantize_static writes it): only then are its
        integers in the accumulator's units."""
        n = self.producer.get(value)
        while n is not None and n.op == "reshape":
            n = self.producer.get(n.inputs[0])
        d = self.dq(n.outputs[0]) if n is not None else None
        if d is None or d[0] not in self.params:
            return None
        b = self.params[d[0]]
        if b.dtype != np.int32 or b.size != channels or np.any(d[2] != 0):
            return None
        if not np.array_equal(np.broadcast_to(d[1].reshape(-1), (channels,)), np.broadcast_to(scale, (channels,))):
            return None
        return b.reshape(channels)


def _output_params(rw: Rewriter, q: Node) -> Optional[Tuple[float, str]]:
    s, z = q.inputs[1], q.inputs[2]
    if s not in rw.params or z not in rw.params or rw.params[s].size != 1 or rw.params[z].size != 1:
        return None
    return float(rw.params[s].reshape(-1)[0]), rw.const(rw.params[z].reshape(()), "zy")


def _int8_activation(rw: Rewriter, x: str) -> bool:
    """onnxruntime on x86 (tether's reference) fuses fewer QDQ groups with int8 activations than with uint8: no
    QLinearAdd, and no conv whose input's DequantizeLinear also feeds another node. Matching it keeps the roundings
    where onnxruntime has them."""
    return str(rw.graph.types[x].dtype) == "int8"


def _head(rw: Rewriter, q: Node, op: str) -> Tuple[Optional[Node], Optional[Tuple[float, str]]]:
    """The ``op`` node that only ``q`` reads, and q's output scale and zero point; (None, None) if either fails."""
    n = rw.only_use(q.inputs[0], op)
    out = _output_params(rw, q) if n is not None else None
    return (n, out) if out is not None else (None, None)


def _int_input(rw: Rewriter, x: str, zx: int) -> str:
    x32 = rw.emit("cast", [x], {"to": "int32"})
    return rw.emit("sub", [x32, rw.const(np.array(zx, np.int32), "zx")]) if zx else x32


def _product(rw: Rewriter, q: Node) -> bool:
    """Q([reshape](conv2d | dense [+ bias]))."""
    out = _output_params(rw, q)
    if out is None:
        return False
    sy, zy = out
    v = q.inputs[0]
    final = rw.only_use(v, "reshape")
    if final is not None:
        v = final.inputs[0]
    add = rw.only_use(v, "add")
    bias_value = None
    if add is not None:
        for k in (0, 1):
            p = rw.producer.get(add.inputs[k])
            if p is not None and p.op in ("conv2d", "dense") and rw.uses.get(add.inputs[k]) == 1:
                v, bias_value = add.inputs[k], add.inputs[1 - k]
                break
        else:
            return False
    prod = rw.producer.get(v)
    if prod is None or prod.op not in ("conv2d", "dense") or (add is None and rw.uses.get(v) != 1):
        return False
    a = rw.dq_tensor(prod.inputs[0])
    if a is not None and _int8_activation(rw, a[0]) and rw.uses.get(prod.inputs[0], 0) > 1:
        return False
    w = rw.weight(prod.inputs[1], transposed_ok=prod.op == "dense")
    if a is None or w is None or len(prod.inputs) > 2:
        return False
    x, sx, zx = a
    w32, sw = w
    oc = w32.shape[0]
    bias = rw.bias(bias_value, oc, F32(sx) * sw) if bias_value is not None else None
    if bias_value is not None and bias is None:
        return False
    mult = (F32(sx) * sw) / F32(sy)
    lead = (1, oc, 1, 1) if prod.op == "conv2d" else (oc,)
    acc = rw.emit(prod.op, [_int_input(rw, x, zx), rw.const(w32, "w_int")], prod.attrs)
    if bias is not None:
        acc = rw.emit("add", [acc, rw.const(bias.reshape(lead), "bias_int")])
    m = rw.const(mult.reshape(lead) if mult.size > 1 else mult.reshape(()), "multiplier")
    dtype = q.attrs["dtype"]
    if final is None:
        rw.emit("requantize", [acc, m, zy], {"dtype": dtype}, out=q.outputs[0])
    else:
        y = rw.emit("requantize", [acc, m, zy], {"dtype": dtype})
        rw.emit("reshape", [y], final.attrs, out=q.outputs[0])
    return True


def _add(rw: Rewriter, q: Node) -> bool:
    add, out = _head(rw, q, "add")
    if add is None or q.attrs["dtype"] == "int8":
        return False
    a, b = rw.dq_tensor(add.inputs[0]), rw.dq_tensor(add.inputs[1])
    if a is None or b is None:
        return False
    sy = out[0]
    zy = int(rw.params[out[1]])
    ra, rb, fixed = quantize_ops.qadd_constants(a[1], a[2], b[1], b[2], sy, zy)
    rw.emit("qadd", [a[0], b[0], rw.const(ra, "ra"), rw.const(rb, "rb"), rw.const(fixed, "fixed")],
            {"dtype": q.attrs["dtype"]}, out=q.outputs[0])
    return True


def _global_avg_pool(rw: Rewriter, q: Node) -> bool:
    pool, out = _head(rw, q, "global_avg_pool")
    if pool is None:
        return False
    a = rw.dq_tensor(pool.inputs[0])
    if a is None:
        return False
    x, sx, zx = a
    shape = rw.graph.types[x].shape
    hw = int(np.prod(shape[2:], dtype=np.int64))
    acc = rw.emit("reduce", [rw.emit("cast", [x], {"to": "int32"})],
                  {"kind": "sum", "axes": list(range(2, len(shape))), "keepdims": True})
    if zx:
        acc = rw.emit("sub", [acc, rw.const(np.array(zx * hw, np.int32), "zx_hw")])
    mult = F32(sx) / (F32(out[0]) * F32(hw))
    rw.emit("requantize", [acc, rw.const(np.array(mult, F32), "multiplier"), out[1]], {"dtype": q.attrs["dtype"]},
            out=q.outputs[0])
    return True


def _same_scale_reshape(rw: Rewriter, q: Node) -> bool:
    r, out = _head(rw, q, "reshape")
    if r is None:
        return False
    a = rw.dq_tensor(q.inputs[0])
    if a is None or a[1] != out[0] or a[2] != int(rw.params[out[1]]) or \
            str(rw.graph.types[a[0]].dtype) != q.attrs["dtype"]:
        return False
    rw.emit("reshape", [a[0]], {"shape": tuple(rw.graph.types[q.outputs[0]].shape)}, out=q.outputs[0])
    return True


PATTERNS = (_product, _add, _global_avg_pool, _same_scale_reshape)


# ---------------------------------------------------------------- pooling, Resize, Concat, activations (session 5)
# Each row is onnxruntime 1.32's CPU QDQ transformer on x86 (its selectors_actions): what it runs as an integer
# kernel, tether does too, with the same roundings; what it leaves to float (HardSwish, HardSigmoid, Tanh, Relu
# without a saturating Q, linear Resize) tether leaves to the unfused path as well.
_MOVES = ("max_pool", "global_max_pool", "resize", "transpose", "strided_slice", "pad")
_LUT_OPS = ("sigmoid", "leaky_relu")          # onnxruntime's QLinearSigmoid / QLinearLeakyRelu: 256-entry tables


def _zy(rw: Rewriter, out: Tuple[float, str]) -> int:
    return int(rw.params[out[1]].reshape(-1)[0])


def _same_params_move(rw: Rewriter, q: Node) -> bool:
    """Q(op(DQ(x))) with equal scale (positive) and zero point on both sides, op moving or selecting elements
    (MaxPool, transposes, slices, nearest Resize): op(x) on the integers, as onnxruntime drops the pair. Exact:
    Q(DQ(v)) == v. Max pooling runs on x as float32 (exact), its padding being the float kernel's."""
    n = rw.producer.get(q.inputs[0])
    if n is None or n.op not in _MOVES or rw.uses.get(q.inputs[0]) != 1:
        return False
    if n.op == "resize" and any(a["weights"] or a["inside"] for a in n.attrs["axes"]):
        return False        # linear/cubic: onnxruntime interpolates in float
    if n.op == "pad" and (n.attrs.get("mode", "constant") != "constant" or len(n.inputs) != 1):
        return False        # only a constant pad whose value the graph holds (edge/reflect modes stay float)
    out = _output_params(rw, q)
    a = rw.dq_tensor(n.inputs[0]) if out is not None else None
    dt = q.attrs["dtype"]
    if a is None or a[1] != out[0] or a[1] <= 0 or a[2] != _zy(rw, out) or str(rw.graph.types[a[0]].dtype) != dt:
        return False
    if n.op in ("max_pool", "global_max_pool"):
        y = rw.emit(n.op, [rw.emit("cast", [a[0]], {"to": "float32"})] + list(n.inputs[1:]), n.attrs)
        rw.emit("cast", [y], {"to": dt}, out=q.outputs[0])
    elif n.op == "pad":
        # the padding is Q(value): a TFLite int8 model's explicit Pad before a strided depthwise conv pads with
        # the zero point, which the conv then reads as its own padding
        fill = op_info.evaluate("quantize", {"dtype": dt}, [np.array([n.attrs.get("value", 0.0)], F32),
                                                           np.array(out[0], F32), rw.params[out[1]]])[0]
        rw.emit("pad", [a[0]], dict(n.attrs, value=float(fill.reshape(-1)[0])), out=q.outputs[0])
    else:
        rw.emit(n.op, [a[0]] + list(n.inputs[1:]), n.attrs, out=q.outputs[0])
    return True


def _table(rw: Rewriter, x: str, f, sx: float, zx: int, out: Tuple[float, str], dtype: str) -> str:
    """``x`` through the 256-entry table ``Q(f(DQ(v)))`` built with the graph ops' numpy definitions (the same
    arithmetic as the unfused kernels), indexed by the integer itself: the int8 table lists 0..127 then
    -128..-1, so a negative index wraps to its entry as gather's do."""
    src = str(rw.graph.types[x].dtype)
    v = np.arange(256).astype(np.uint8).view(np.int8) if src == "int8" else np.arange(256).astype(np.uint8)
    fv = op_info.evaluate("dequantize", {}, [v, np.array(sx, F32), np.array(zx, np.int32)])[0]
    table = op_info.evaluate("quantize", {"dtype": dtype}, [f(fv), np.array(out[0], F32), rw.params[out[1]]])[0]
    if np.array_equal(table, v.astype(dtype)):
        return x
    idx = rw.emit("cast", [x], {"to": "int32"})
    return rw.emit("gather", [rw.const(table, "qtable"), idx],
                   {"axis": 0, "shape": list(rw.graph.types[x].shape)})


def _lut_activation(rw: Rewriter, q: Node) -> bool:
    n = rw.producer.get(q.inputs[0])
    if n is None or n.op not in _LUT_OPS or rw.uses.get(q.inputs[0]) != 1:
        return False
    out = _output_params(rw, q)
    a = rw.dq_tensor(n.inputs[0]) if out is not None else None
    if a is None or str(rw.graph.types[a[0]].dtype) != q.attrs["dtype"]:
        return False
    f = lambda fv: op_info.evaluate(n.op, n.attrs, [fv])[0]    # noqa: E731
    y = _table(rw, a[0], f, a[1], a[2], out, q.attrs["dtype"])
    rw.emit("reshape", [y], {"shape": tuple(rw.graph.types[q.outputs[0]].shape)}, out=q.outputs[0])
    return True


def _concat(rw: Rewriter, q: Node) -> bool:
    """onnxruntime's QLinearConcat: each input requantized to the output's scale and zero point (a table per
    input, none where they already agree), then the integer concat."""
    n, out = _head(rw, q, "concat")
    if n is None:
        return False
    dt = q.attrs["dtype"]
    ins = [rw.dq_tensor(v) for v in n.inputs]
    if any(a is None or str(rw.graph.types[a[0]].dtype) != dt for a in ins):
        return False
    parts = [_table(rw, x, lambda fv: fv, sx, zx, out, dt) for x, sx, zx in ins]
    rw.emit("concat", parts, n.attrs, out=q.outputs[0])
    return True


def _avg_pool(rw: Rewriter, q: Node) -> bool:
    """onnxruntime's QLinearAveragePool (kernels/qpool_ops.py): 2-D, no dilation, no ceil_mode."""
    n, out = _head(rw, q, "avg_pool")
    if n is None or len(n.attrs["kernel"]) != 2 or n.attrs.get("ceil_mode") or any(
            d != 1 for d in n.attrs["dilations"]):
        return False
    dq = rw.producer.get(n.inputs[0])
    if dq is None or dq.op != "dequantize" or rw.dq_tensor(n.inputs[0]) is None or \
            str(rw.graph.types[dq.inputs[0]].dtype) != q.attrs["dtype"]:
        return False
    attrs = {k: n.attrs[k] for k in ("kernel", "strides", "pads")}
    attrs.update(count_include_pad=int(bool(n.attrs.get("count_include_pad"))), dtype=q.attrs["dtype"],
                 sy=out[0], zy=_zy(rw, out))
    rw.emit("qavg_pool", [n.inputs[0]], attrs, out=q.outputs[0])
    return True


PATTERNS += (_concat, _avg_pool, _lut_activation, _same_params_move)


def _skip_saturated_activation(rw: Rewriter, q: Node) -> Node:
    """Q(relu(v)) is Q(v) when Q's zero point is its type's minimum, and Q(clip(v, a, b)) is Q(v) when [a, b]
    covers Q's range: Q saturates there anyway (onnxruntime's ReluQuantFusion/ClipQuantFusion). Returns q reading
    v in that case, else q."""
    n = rw.producer.get(q.inputs[0])
    if n is None or n.op not in ("relu", "clip") or rw.uses.get(q.inputs[0]) != 1:
        return q
    if q.inputs[1] not in rw.params or q.inputs[2] not in rw.params or rw.params[q.inputs[1]].size != 1:
        return q
    lo, hi = quantize_ops.RANGES[q.attrs["dtype"]]
    s = float(rw.params[q.inputs[1]].reshape(-1)[0])
    z = int(rw.params[q.inputs[2]].reshape(-1)[0])
    if n.op == "relu":
        redundant = z == lo
    else:
        redundant = n.attrs.get("min", -np.inf) <= (lo - z) * s and n.attrs.get("max", np.inf) >= (hi - z) * s
    if not redundant:
        return q
    return Node(q.op, q.name, [n.inputs[0]] + list(q.inputs[1:]), list(q.outputs), dict(q.attrs))


def fuse_qdq(graph: Graph, params: Dict[str, np.ndarray]) -> Tuple[Graph, Dict[str, np.ndarray]]:
    if not any(n.op == "quantize" for n in graph.nodes):
        return graph, params
    graph = graph.copy()
    graph.types = dict(graph.types)
    params = dict(params)
    rw = Rewriter(graph, params)
    nodes: List[Node] = []
    fused = 0
    for n in graph.nodes:
        if n.op == "quantize":
            rw.out = []
            if any(p(rw, _skip_saturated_activation(rw, n)) for p in PATTERNS):
                nodes.extend(rw.out)
                fused += 1
                continue
            # a pattern that failed half way may have emitted helper nodes: they are unused, dce drops them
            nodes.extend(rw.out)
        nodes.append(n)
    graph.nodes = nodes
    log.debug("fuse_qdq: %d quantize groups run as integer kernels", fused)
    return graph, params
