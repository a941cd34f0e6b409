"""A TFLite LSTM layer that ONNX's LSTM cannot state (a projection, layer-normalized gates, a cell or projection
clip, an activation other than tanh/relu) as an ONNX Scan over time whose body is one LiteRT step.

The input projection of every step is one MatMul before the scan. Per step, with gates i, f, c (g), o in
TFLite's order: ``z = x W + h R`` (+ the peephole times the previous cell state for i and f); layer norm, when the
layer has it, normalizes each gate's ``z`` over its units (mean and variance, epsilon 1e-8) and scales it by its
coefficients; then the bias. ``i, f, o = sigmoid``, ``g = act``; without an input gate (CIFG) ``i = 1 - f``.
``c = f c_prev + i g`` (clipped to +-cell_clip), the output gate's peephole reads the new ``c``, ``h = o act(c)``,
projected (``h Wp + bp``, clipped to +-proj_clip) when the layer has a projection. The scan runs backward for a
bidirectional layer's backward direction, writing each step's output at its own time position.
"""
from __future__ import annotations

from typing import Any, Dict, List

import numpy as np

from tether.errors import UnsupportedOpError
from tether.frontend.tflite import fused

LAYER_NORM_EPSILON = 1e-8


class _Body:
    """Nodes of the scan body, named apart from the parent graph's; constants live in the parent (outer scope)."""

    def __init__(self, ctx, prefix: str) -> None:
        from onnx import helper

        self.ctx, self.helper, self.prefix = ctx, helper, prefix
        self.nodes: List[Any] = []
        self.count = 0

    def const(self, value, hint: str) -> str:
        return self.ctx.add_const(np.asarray(value, np.float32), "%s_%s" % (self.prefix, hint))

    def __call__(self, op_type: str, *inputs: str, **attrs) -> str:
        self.count += 1
        out = "%s_%s_%d" % (self.prefix, op_type.lower(), self.count)
        self.nodes.append(self.helper.make_node(op_type, list(inputs), [out], name=out + "_node", **attrs))
        return out

    def activation(self, x: str, code: int) -> str:
        if code == fused.NONE:
            return x
        if code == fused.RELU:
            return self("Relu", x)
        if code == fused.TANH:
            return self("Tanh", x)
        bounds = {fused.RELU_N1_TO_1: (-1.0, 1.0), fused.RELU6: (0.0, 6.0)}.get(code)
        if bounds is None:
            raise UnsupportedOpError("%s: LSTM activation %d" % (self.ctx.where(), code))
        return self("Clip", x, self.const(bounds[0], "lo"), self.const(bounds[1], "hi"))

    def clip(self, x: str, bound: float) -> str:
        if bound <= 0:
            return x
        return self("Clip", x, self.const(-bound, "clip_lo"), self.const(bound, "clip_hi"))


def lstm_scan(ctx, x_tm: str, d: Dict[str, Any], h0: np.ndarray, c0: np.ndarray, act: int, cell_clip: float,
              proj_clip: float, reverse: bool) -> str:
    """The layer's outputs over time, (T, B, outputs), for the time-major input ``x_tm`` (T, B, I)."""
    from onnx import TensorProto, helper

    hidden, units = d["hidden"], d["outputs"]
    gates = [k for k in range(4) if d["w"][k] is not None]          # i is absent in a CIFG layer
    prefix = ctx.fresh("lstm_step")
    body = _Body(ctx, prefix)
    w_all = np.concatenate([d["w"][k] for k in gates], 0).T          # (I, G*H)
    r_all = np.concatenate([d["r"][k] for k in gates], 0).T          # (units, G*H)
    xw = ctx.emit1("MatMul", [x_tm, ctx.add_const(np.ascontiguousarray(w_all), prefix + "_w")])

    h_in, c_in, xw_in = prefix + "_h", prefix + "_c", prefix + "_xw"
    z = body("Add", xw_in, body("MatMul", h_in, body.const(r_all, "r")))
    zs = {k: "%s_z%d" % (prefix, k) for k in gates}
    sizes = ctx.add_const(np.array([hidden] * len(gates), np.int64), prefix + "_split")
    body.nodes.append(helper.make_node("Split", [z, sizes], [zs[k] for k in gates], name=prefix + "_split",
                                       axis=1))

    def peephole(k: int, zk: str, c: str) -> str:
        p = d["p"][{0: 0, 1: 1, 3: 2}[k]]
        return zk if p is None else body("Add", zk, body("Mul", c, body.const(p, "p%d" % k)))

    def finish(k: int, zk: str) -> str:
        coef = d["ln"][k]
        if coef is not None:
            axes = ctx.add_const(np.array([1], np.int64), prefix + "_axes")
            mean = body("ReduceMean", zk, axes, keepdims=1)
            var = body("Sub", body("ReduceMean", body("Mul", zk, zk), axes, keepdims=1), body("Mul", mean, mean))
            inv = body("Reciprocal", body("Sqrt", body("Add", var, body.const(LAYER_NORM_EPSILON, "eps"))))
            zk = body("Mul", body("Mul", body("Sub", zk, mean), inv), body.const(coef, "ln%d" % k))
        b = d["b"][k]
        return zk if b is None else body("Add", zk, body.const(b, "b%d" % k))

    f = body("Sigmoid", finish(1, peephole(1, zs[1], c_in)))
    if d["cifg"]:
        i = body("Sub", body.const(1.0, "one"), f)
    else:
        i = body("Sigmoid", finish(0, peephole(0, zs[0], c_in)))
    g = body.activation(finish(2, zs[2]), act)
    c_new = body.clip(body("Add", body("Mul", f, c_in), body("Mul", i, g)), cell_clip)
    o = body("Sigmoid", finish(3, peephole(3, zs[3], c_new)))
    h_new = body("Mul", o, body.activation(c_new, act))
    if d["proj_w"] is not None:
        h_new = body("MatMul", h_new, body.const(d["proj_w"].T, "proj"))
        if d["proj_b"] is not None:
            h_new = body("Add", h_new, body.const(d["proj_b"], "proj_b"))
        h_new = body.clip(h_new, proj_clip)
    y = body("Identity", h_new)
    h_out, c_out = body("Identity", h_new), body("Identity", c_new)

    batch = h0.shape[0]
    f32 = TensorProto.FLOAT
    graph = helper.make_graph(
        body.nodes, prefix,
        [helper.make_tensor_value_info(h_in, f32, [batch, units]), helper.make_tensor_value_info(c_in, f32,
                                                                                               [batch, hidden]),
         helper.make_tensor_value_info(xw_in, f32, [batch, len(gates) * hidden])],
        [helper.make_tensor_value_info(v, f32, None) for v in (h_out, c_out, y)])
    direction = [1] if reverse else [0]
    outs = ctx.emit("Scan", [ctx.add_const(h0, prefix + "_h0"), ctx.add_const(c0, prefix + "_c0"), xw], outputs=3,
                    body=graph, num_scan_inputs=1, scan_input_directions=direction,
                    scan_output_directions=direction)
    return outs[2]
