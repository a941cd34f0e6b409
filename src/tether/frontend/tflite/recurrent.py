"""Fused recurrent layers: UNIDIRECTIONAL/BIDIRECTIONAL_SEQUENCE_LSTM and UNIDIRECTIONAL/BIDIRECTIONAL_SEQUENCE_RNN,
as ONNX LSTM/RNN nodes (tether's recurrent kernel), or an ONNX Scan over LiteRT's step (``lstm_scan``) for an LSTM
that ONNX's cannot state.

TFLite keeps one weight tensor per gate (input, forget, cell, output); ONNX stacks them in the order i, o, f, c.
Peepholes read the previous cell state for the input and forget gates and the new one for the output gate in both.
A CIFG LSTM (no input gate: i = 1 - f) maps onto ONNX's ``input_forget`` (f = 1 - i) by giving ONNX's input gate
the negated forget-gate weights, bias and peephole: sigmoid(-z) = 1 - sigmoid(z). The fused activation is the
cell input and output activation (g and h); the gates use the sigmoid. The state tensors are variables LiteRT
starts at zero (or at their stored value), so they start there here.

A projection layer, layer-normalized gates, a cell or projection clip (ONNX's clip bounds the gate inputs instead)
or another activation take the Scan. Refused by name: auxiliary inputs and quantized (hybrid) weights.

The one-step cells (LSTM, RNN, SVDF) read a (batch, input) input and a state variable: the LSTM is the sequence
layer over one step; the RNN and SVDF fold their (constant) state into a bias.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from tether.errors import UnsupportedOpError
from tether.frontend.tflite import fused, lstm_scan
from tether.frontend.tflite.table import ConverterTable

CONVERTERS = ConverterTable("tflite recurrent")

_ACTIVATIONS = {fused.RELU: "Relu", fused.TANH: "Tanh"}


def _activation(ctx, op) -> str:
    code = int(op.options.get("fused_activation_function", fused.TANH) or 0)
    if code not in _ACTIVATIONS:
        raise UnsupportedOpError("%s: fused activation %d (tether's recurrent kernels take TANH or RELU here)"
                                 % (ctx.where(), code))
    return _ACTIVATIONS[code]


def _weight(ctx, index: int, what: str) -> Optional[np.ndarray]:
    if index < 0:
        return None
    value = ctx.const(index)
    if value is None:
        raise UnsupportedOpError("%s: its %s (tensor %d) is computed at run time; tether needs constant weights"
                                 % (ctx.where(), what, index))
    if value.dtype.kind != "f":
        raise UnsupportedOpError("%s: its %s is %s (quantized recurrent weights are not converted)"
                                 % (ctx.where(), what, value.dtype))
    return value.astype(np.float32)


def _initial_state(ctx, index: int, shape: Sequence[int]) -> np.ndarray:
    """A state variable's starting value: its stored data, else zeros."""
    t = ctx.tensor(index)
    if t.data is not None and t.data.size == int(np.prod(shape)):
        return np.asarray(t.data, np.float32).reshape(shape)
    return np.zeros(shape, np.float32)


def _refuse_if(ctx, cond: bool, what: str) -> None:
    if cond:
        raise UnsupportedOpError("%s: %s is not expressible as an ONNX LSTM" % (ctx.where(), what))


def _present(op, index: int) -> bool:
    return len(op.inputs) > index and op.inputs[index] >= 0


def _gates(ctx, op, base: int, peep_base: int, bias_base: int, proj: int, ln_base: Optional[int],
           what: str) -> Dict[str, Any]:
    """One direction's weights as TFLite holds them, per gate (i, f, c, o; None where absent)."""
    get = lambda k, name: _weight(ctx, op.inputs[k], "%s %s" % (what, name)) if len(op.inputs) > k else None  # noqa
    d = {"w": [get(base + k, "input weights %d" % k) for k in range(4)],
         "r": [get(base + 4 + k, "recurrent weights %d" % k) for k in range(4)],
         "p": [get(peep_base + k, "peephole %d" % k) for k in range(3)],
         "b": [get(bias_base + k, "bias %d" % k) for k in range(4)],
         "proj_w": get(proj, "projection weights"), "proj_b": get(proj + 1, "projection bias"),
         "ln": [get(ln_base + k, "layer norm %d" % k) for k in range(4)] if ln_base is not None else [None] * 4}
    w, r = d["w"], d["r"]
    if any(v is None for v in w[1:] + r[1:]):
        raise UnsupportedOpError("%s: %s forget, cell or output weights are missing" % (ctx.where(), what))
    d["cifg"] = w[0] is None
    if d["cifg"] != (r[0] is None):
        raise UnsupportedOpError("%s: %s input gate has %s weights only"
                                 % (ctx.where(), what, "recurrent" if d["cifg"] else "input"))
    d["hidden"] = w[1].shape[0]
    d["outputs"] = d["proj_w"].shape[0] if d["proj_w"] is not None else d["hidden"]
    return d


def _onnx_expressible(op, dirs: Sequence[Dict[str, Any]]) -> bool:
    """Whether ONNX's LSTM computes these directions: no projection, layer norm or clip, a tanh or relu."""
    o = op.options
    act = int(o.get("fused_activation_function", fused.TANH) or 0)
    return act in _ACTIVATIONS and not float(o.get("cell_clip", 0.0) or 0.0) > 0 and \
        not float(o.get("proj_clip", 0.0) or 0.0) > 0 and \
        all(d["proj_w"] is None and d["proj_b"] is None and all(v is None for v in d["ln"]) for d in dirs)


class _LstmWeights:
    """One direction's ONNX W (4H, I), R (4H, H), B (8H), P (3H) or None, and whether it is CIFG."""

    def __init__(self, d: Dict[str, Any]) -> None:
        w, r, p = list(d["w"]), list(d["r"]), list(d["p"])
        hidden = d["hidden"]
        self.cifg, self.hidden = d["cifg"], hidden
        zeros_h = np.zeros((hidden,), np.float32)
        bias = [v if v is not None else zeros_h for v in d["b"]]
        if self.cifg:       # ONNX input gate = the forget gate negated; input_forget then gives f = 1 - i
            w[0], r[0], bias[0] = -w[1], -r[1], -bias[1]
            if p[1] is not None:
                p[0] = -p[1]
        # TFLite gate order (i, f, c, o) -> ONNX (i, o, f, c)
        self.W = np.concatenate([w[0], w[3], w[1], w[2]], 0)
        self.R = np.concatenate([r[0], r[3], r[1], r[2]], 0)
        self.B = np.concatenate([bias[0], bias[3], bias[1], bias[2], np.zeros((4 * hidden,), np.float32)])
        if any(v is not None for v in p):
            self.P = np.concatenate([v if v is not None else zeros_h for v in (p[0], p[2], p[1])])
        else:
            self.P = None


def _lstm(ctx, op, dirs: List[_LstmWeights], states: List[int], time_major: bool, direction: str,
          x_value: Optional[str] = None) -> List[str]:
    """An ONNX LSTM over the op's input (or ``x_value``, time-major); returns Y as (batch, time, directions,
    hidden) or (time, directions, batch, hidden) when time-major (ONNX layout 0/1)."""
    x = op.inputs[0]
    shape = ctx.shape(x)
    batch = shape[1] if time_major and x_value is None else shape[0]
    hidden = dirs[0].hidden
    stack = lambda attr: ctx.add_const(np.stack([getattr(d, attr) for d in dirs]), attr)    # noqa: E731
    h0 = np.stack([_initial_state(ctx, op.inputs[s], (batch, hidden)) for s in states[0::2]])
    c0 = np.stack([_initial_state(ctx, op.inputs[s], (batch, hidden)) for s in states[1::2]])
    inputs = [x_value or ctx.nhwc(x), stack("W"), stack("R"), stack("B"), "", ctx.add_const(h0, "h0"),
              ctx.add_const(c0, "c0")]
    if any(d.P is not None for d in dirs):
        inputs.append(ctx.add_const(np.stack([d.P if d.P is not None else np.zeros((3 * hidden,), np.float32)
                                              for d in dirs]), "P"))
    act = _activation(ctx, op)
    acts = ["Sigmoid", act, act] * len(dirs)
    y = ctx.emit("LSTM", inputs, outputs=1, hidden_size=hidden, direction=direction, activations=acts,
                 input_forget=int(dirs[0].cifg), layout=0 if time_major else 1)[0]
    return y


def _time_major_input(ctx, x: int, time_major: bool) -> str:
    value = ctx.nhwc(x)
    return value if time_major else ctx.emit1("Transpose", [value], perm=[1, 0, 2])


def _scanned(ctx, op, d: Dict[str, Any], x_tm: str, states: Sequence[int], reverse: bool) -> str:
    """One direction through ``lstm_scan``: (T, B, outputs), time-major."""
    batch = ctx.shape(op.inputs[0])[1 if op.options.get("time_major") else 0]
    h0 = _initial_state(ctx, op.inputs[states[0]], (batch, d["outputs"]))
    c0 = _initial_state(ctx, op.inputs[states[1]], (batch, d["hidden"]))
    o = op.options
    return lstm_scan.lstm_scan(ctx, x_tm, d, h0, c0, int(o.get("fused_activation_function", fused.TANH) or 0),
                               float(o.get("cell_clip", 0.0) or 0.0), float(o.get("proj_clip", 0.0) or 0.0),
                               reverse)


@CONVERTERS.register("UNIDIRECTIONAL_SEQUENCE_LSTM")
def _unidirectional_lstm(ctx, op) -> None:
    d = _gates(ctx, op, 1, 9, 12, 16, 20, "the")
    time_major = bool(op.options.get("time_major", False))
    if not _onnx_expressible(op, [d]):
        y = _scanned(ctx, op, d, _time_major_input(ctx, op.inputs[0], time_major), (18, 19), False)
        ctx.set_output(op.outputs[0], y if time_major else ctx.emit1("Transpose", [y], perm=[1, 0, 2]))
        return
    y = _lstm(ctx, op, [_LstmWeights(d)], [18, 19], time_major, "forward")
    # squeeze the directions axis: (T, 1, B, H) or (B, T, 1, H)
    axis = 1 if time_major else 2
    ctx.set_output(op.outputs[0], ctx.emit1("Squeeze", [y, ctx.add_const(np.array([axis], np.int64), "axes")]))


@CONVERTERS.register("BIDIRECTIONAL_SEQUENCE_LSTM")
def _bidirectional_lstm(ctx, op) -> None:
    _refuse_if(ctx, any(_present(op, k) for k in range(39, 48)), "an auxiliary input")
    fw = _gates(ctx, op, 1, 9, 12, 16, None, "the forward")
    bw = _gates(ctx, op, 18, 26, 29, 33, None, "the backward")
    time_major = bool(op.options.get("time_major", False))
    merge = bool(op.options.get("merge_outputs", False))
    if not _onnx_expressible(op, [fw, bw]) or fw["cifg"] != bw["cifg"]:
        x_tm = _time_major_input(ctx, op.inputs[0], time_major)
        ys = [_scanned(ctx, op, fw, x_tm, (35, 36), False), _scanned(ctx, op, bw, x_tm, (37, 38), True)]
        if merge:
            ys = [ctx.emit1("Concat", ys, axis=2)]
        for t, y in zip(op.outputs, ys):
            ctx.set_output(t, y if time_major else ctx.emit1("Transpose", [y], perm=[1, 0, 2]))
        return
    y = _lstm(ctx, op, [_LstmWeights(fw), _LstmWeights(bw)], [35, 36, 37, 38], time_major, "bidirectional")
    axis = 1 if time_major else 2
    hidden = fw["hidden"]
    if merge:
        # (T, 2, B, H) -> (T, B, 2H); (B, T, 2, H) -> (B, T, 2H)
        if time_major:
            y = ctx.emit1("Transpose", [y], perm=[0, 2, 1, 3])
        shape = ctx.shape(op.outputs[0])
        ctx.set_output(op.outputs[0], ctx.emit1("Reshape", [y, ctx.add_const(
            np.array(shape[:2] + [2 * hidden], np.int64), "shape")]))
        return
    fw_y, bw_y = ctx.emit("Split", [y, ctx.add_const(np.array([1, 1], np.int64), "split")], outputs=2, axis=axis)
    axes = ctx.add_const(np.array([axis], np.int64), "axes")
    ctx.set_output(op.outputs[0], ctx.emit1("Squeeze", [fw_y, axes]))
    if len(op.outputs) > 1 and op.outputs[1] >= 0:
        ctx.set_output(op.outputs[1], ctx.emit1("Squeeze", [bw_y, axes]))


def _rnn(ctx, op, weights: Sequence[int], states: Sequence[int], direction: str) -> str:
    """An ONNX RNN over the op's input (``weights``: per direction the input weights, recurrent weights and bias
    tensors); Y as (T, D, B, H) time-major, (B, T, D, H) otherwise."""
    x = op.inputs[0]
    time_major = bool(op.options.get("time_major", False))
    shape = ctx.shape(x)
    batch = shape[1] if time_major else shape[0]
    ws, rs, bs, h0s = [], [], [], []
    for k, state in enumerate(states):
        w, r, b = weights[3 * k:3 * k + 3]
        wv = _weight(ctx, w, "input weights")
        rv = _weight(ctx, r, "recurrent weights")
        bv = _weight(ctx, b, "bias")
        hidden = wv.shape[0]
        ws.append(wv)
        rs.append(rv)
        bs.append(np.concatenate([bv if bv is not None else np.zeros((hidden,), np.float32),
                                  np.zeros((hidden,), np.float32)]))
        h0s.append(_initial_state(ctx, state, (batch, hidden)))
    acts = [_activation(ctx, op)] * len(states)
    return ctx.emit("RNN", [ctx.nhwc(x), ctx.add_const(np.stack(ws), "W"), ctx.add_const(np.stack(rs), "R"),
                            ctx.add_const(np.stack(bs), "B"), "", ctx.add_const(np.stack(h0s), "h0")], outputs=1,
                    hidden_size=ws[0].shape[0], activations=acts, direction=direction,
                    layout=0 if time_major else 1)[0]


@CONVERTERS.register("UNIDIRECTIONAL_SEQUENCE_RNN")
def _unidirectional_rnn(ctx, op) -> None:
    y = _rnn(ctx, op, op.inputs[1:4], op.inputs[4:5], "forward")
    axis = 1 if op.options.get("time_major", False) else 2
    ctx.set_output(op.outputs[0], ctx.emit1("Squeeze", [y, ctx.add_const(np.array([axis], np.int64), "axes")]))


@CONVERTERS.register("BIDIRECTIONAL_SEQUENCE_RNN")
def _bidirectional_rnn(ctx, op) -> None:
    _refuse_if(ctx, any(_present(op, k) for k in range(9, 12)), "an auxiliary input")
    y = _rnn(ctx, op, op.inputs[1:4] + op.inputs[5:8], [op.inputs[4], op.inputs[8]], "bidirectional")
    time_major = bool(op.options.get("time_major", False))
    axis = 1 if time_major else 2
    if op.options.get("merge_outputs", False):
        if time_major:          # (T, 2, B, H) -> (T, B, 2, H)
            y = ctx.emit1("Transpose", [y], perm=[0, 2, 1, 3])
        shape = ctx.shape(op.outputs[0])
        ctx.set_output(op.outputs[0], ctx.emit1("Reshape", [y, ctx.add_const(
            np.array([-1, shape[1], shape[2]], np.int64), "shape")]))
        return
    fw_y, bw_y = ctx.emit("Split", [y, ctx.add_const(np.array([1, 1], np.int64), "split")], outputs=2, axis=axis)
    axes = ctx.add_const(np.array([axis], np.int64), "axes")
    ctx.set_output(op.outputs[0], ctx.emit1("Squeeze", [fw_y, axes]))
    if len(op.outputs) > 1 and op.outputs[1] >= 0:
        ctx.set_output(op.outputs[1], ctx.emit1("Squeeze", [bw_y, axes]))


# -- one-step cells: LSTM, RNN, SVDF (their state is a variable tensor, read at its starting value in one call)

def _vector_activation(ctx, value: str, code: int) -> str:
    """The activation these cells apply to their output vector (LiteRT's ApplyActivationToVector): unlike the
    fused clamp of a convolution, TANH here is the tanh."""
    if code == fused.TANH:
        return ctx.emit1("Tanh", [value])
    if code in (fused.NONE, fused.RELU, fused.RELU_N1_TO_1, fused.RELU6):
        return fused.apply(ctx, value, code)
    raise UnsupportedOpError("%s: activation %d (expected NONE, RELU, RELU_N1_TO_1, RELU6 or TANH)"
                             % (ctx.where(), code))


def _float_input(ctx, op) -> None:
    dtype = ctx.tensor(op.inputs[0]).dtype
    if dtype != "float32":
        raise UnsupportedOpError("%s: a %s input (expected float32)" % (ctx.where(), dtype))


@CONVERTERS.register("LSTM")
def _lstm_cell(ctx, op) -> None:
    """One step of the full LSTM kernel: the sequence layer's inputs and math, on a (batch, input) input."""
    if int(op.options.get("kernel_type", 0) or 0) != 0:
        raise UnsupportedOpError("%s: the BASIC kernel type (expected the FULL kernel)" % ctx.where())
    _float_input(ctx, op)
    d = _gates(ctx, op, 1, 9, 12, 16, 20, "the")
    x_tm = ctx.emit1("Unsqueeze", [ctx.nhwc(op.inputs[0]), ctx.add_const(np.array([0], np.int64), "axes")])
    batch = ctx.shape(op.inputs[0])[0]
    if _onnx_expressible(op, [d]):
        y = _lstm(ctx, op, [_LstmWeights(d)], [18, 19], True, "forward", x_value=x_tm)
        axes = [0, 1]                               # (1, 1, B, H)
    else:
        o = op.options
        h0 = _initial_state(ctx, op.inputs[18], (batch, d["outputs"]))
        c0 = _initial_state(ctx, op.inputs[19], (batch, d["hidden"]))
        y = lstm_scan.lstm_scan(ctx, x_tm, d, h0, c0, int(o.get("fused_activation_function", fused.TANH) or 0),
                                float(o.get("cell_clip", 0.0) or 0.0), float(o.get("proj_clip", 0.0) or 0.0),
                                False)
        axes = [0]                                  # (1, B, outputs)
    ctx.set_output(op.outputs[0], ctx.emit1("Squeeze", [y, ctx.add_const(np.array(axes, np.int64), "axes")]))


@CONVERTERS.register("RNN")
def _rnn_cell(ctx, op) -> None:
    """``act(x W' + h R' + b)``: the state ``h`` is a constant here, so ``h R' + b`` folds into one bias."""
    _float_input(ctx, op)
    w = _weight(ctx, op.inputs[1], "input weights")
    r = _weight(ctx, op.inputs[2], "recurrent weights")
    b = _weight(ctx, op.inputs[3], "bias")
    hidden, batch = w.shape[0], ctx.shape(op.inputs[0])[0]
    h0 = _initial_state(ctx, op.inputs[4], (batch, hidden))
    bias = h0 @ r.T + (b if b is not None else np.zeros((hidden,), np.float32))
    z = ctx.emit1("Add", [ctx.emit1("MatMul", [ctx.nhwc(op.inputs[0]), ctx.add_const(np.ascontiguousarray(w.T),
                                                                                      "W")]),
                          ctx.add_const(bias.astype(np.float32), "bias")])
    code = int(op.options.get("fused_activation_function", fused.NONE) or 0)
    ctx.set_output(op.outputs[0], _vector_activation(ctx, z, code))


@CONVERTERS.register("SVDF")
def _svdf(ctx, op) -> None:
    """LiteRT shifts each filter's memory left by one, writes ``x . feature_weights`` into the newest slot, takes
    each filter's memory dotted with its time weights, and sums each unit's ``rank`` filters (+ bias). With the
    state constant, every slot but the newest is known now: the output is ``x Wc + c``, where ``Wc`` is the
    feature weights scaled by the newest slot's time weight and summed per unit, and ``c`` the older slots'."""
    _float_input(ctx, op)
    rank = int(op.options.get("rank", 0) or 0)
    wf = _weight(ctx, op.inputs[1], "feature weights")
    wt = _weight(ctx, op.inputs[2], "time weights")
    b = _weight(ctx, op.inputs[3], "bias") if len(op.inputs) > 3 else None
    filters, memory = wt.shape
    if rank <= 0 or filters % rank:
        raise UnsupportedOpError("%s: rank %d (expected a positive divisor of its %d filters)"
                                 % (ctx.where(), rank, filters))
    units, batch = filters // rank, ctx.shape(op.inputs[0])[0]
    state = _initial_state(ctx, op.inputs[4], (batch, filters, memory))
    per_unit = np.repeat(np.eye(units, dtype=np.float32), rank, axis=0)           # (filters, units)
    weights = (wf.T * wt[:, -1]) @ per_unit                                         # (input, units)
    older = (state[:, :, 1:] * wt[None, :, :-1]).sum(-1) @ per_unit                 # (batch, units)
    if b is not None:
        older = older + b
    z = ctx.emit1("Add", [ctx.emit1("MatMul", [ctx.nhwc(op.inputs[0]), ctx.add_const(weights, "W")]),
                          ctx.add_const(older.astype(np.float32), "bias")])
    code = int(op.options.get("fused_activation_function", fused.NONE) or 0)
    ctx.set_output(op.outputs[0], _vector_activation(ctx, z, code))
