"""Core ML NeuralNetwork recurrent layers (uni- and biDirectionalLSTM, gru, simpleRecurrent), unrolled over time.

The sequence length is static, so each step becomes a few ONNX nodes: that keeps Core ML's own recurrences
exactly, which ONNX's LSTM cannot (Core ML clips every gate's input to [-50, 50] and the LSTM cell state to
+-cellClipThreshold, 50 by default; any gate activation Core ML allows is applied as its layer would). The
input projections of all steps are one matmul. Tensors are Core ML's rank-5 ``[Seq, Batch, C, 1, 1]`` (or a
rank-3 ``[C, 1, 1]`` for one step of batch one); states ``[1, Batch, H, 1, 1]``. With ``reverseInput`` the
sequence is read from its end and the outputs are listed in that processing order.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from tether.frontend.coreml import neuralnetwork as nn
from tether.frontend.coreml.weights import weight_array

Refused = nn.Refused


def _sequence(ctx: nn.Context, x: str, size: int, name: str) -> Tuple[str, int, int, List[int]]:
    """``x`` as ``[Seq, Batch, size]``, with Seq, Batch and the shape outputs take (``[.., H, 1, 1]``)."""
    s = ctx.shape(x, "a recurrent layer")
    if len(s) == 5:
        seq, batch = s[0], s[1]
    elif len(s) == 3:
        seq, batch = 1, 1
    else:
        raise Refused("a recurrent input of rank %d (needs [Seq, Batch, C, 1, 1])" % len(s))
    if int(np.prod(s)) != seq * batch * size:
        raise Refused("an input of shape %s for input size %d" % (list(s), size))
    return ctx.g.reshape(x, [seq, batch, size], name + "_seq"), seq, batch, list(s)


def _state(ctx: nn.Context, layer, index: int, batch: int, hidden: int, name: str) -> str:
    """Initial state ``index`` of the layer's inputs (zeros when not given) as ``[Batch, H]``."""
    if len(layer.input) > index and layer.input[index]:
        return ctx.g.reshape(ctx.env[layer.input[index]], [batch, hidden], name)
    return ctx.g.const(np.zeros((batch, hidden), np.float32), name)


def _matrix(wp, rows: int, cols: int, what: str) -> np.ndarray:
    return weight_array(wp, rows * cols, what).reshape(rows, cols)


def _vector(wp, n: int, what: str, present: bool = True) -> np.ndarray:
    return weight_array(wp, n, what) if present else np.zeros(n, np.float32)


def _outputs(ctx: nn.Context, layer, steps: List[str], finals: Sequence[str], seq_out: bool, in_shape: List[int],
             batch: int, hidden: int) -> List[str]:
    """The sequence output and the final states in the input's layout."""
    g = ctx.g
    rank5 = len(in_shape) == 5
    if seq_out:
        y = g.node("Concat", [g.unsqueeze(h, [0]) for h in steps], layer.name + "_steps", axis=0)
        y = g.reshape(y, [len(steps), batch, hidden, 1, 1] if rank5 else [hidden, 1, 1], layer.name + "_y")
    else:
        y = g.reshape(steps[-1], [1, batch, hidden, 1, 1] if rank5 else [hidden, 1, 1], layer.name + "_y")
    states = [g.reshape(f, [1, batch, hidden, 1, 1] if rank5 else [hidden, 1, 1], layer.name + "_state")
              for f in finals]
    return [y] + states


def _project(ctx: nn.Context, xs: str, weights: np.ndarray, bias: np.ndarray, name: str) -> str:
    """x W^T + b for every step at once: ``[Seq, Batch, gates * H]``."""
    g = ctx.g
    y = g.node("MatMul", [xs, g.const(np.ascontiguousarray(weights.T), name + "_W")], name + "_xw")
    return g.node("Add", [y, g.const(bias, name + "_b")], name + "_xwb")


def _step_inputs(ctx: nn.Context, proj: str, seq: int, reverse: bool, name: str) -> List[str]:
    g = ctx.g
    order = range(seq - 1, -1, -1) if reverse else range(seq)
    return [g.node("Gather", [proj, g.const(np.asarray(t, np.int64))], name + "_t", axis=0) for t in order]


def _gate(ctx: nn.Context, pre: str, act, name: str) -> str:
    """A gate: its activation of the pre-activation clipped to [-50, 50], as Core ML computes every gate."""
    g = ctx.g
    return nn.activate(ctx, g.node("Clip", [pre, g.scalar(-50.0), g.scalar(50.0)], name + "_clip"), act, name)


def _activations(layer_acts, defaults: int) -> List[object]:
    if len(layer_acts) != defaults:
        raise Refused("%d activations (needs %d)" % (len(layer_acts), defaults))
    return list(layer_acts)


def _lstm_run(ctx: nn.Context, xs: str, seq: int, n_in: int, hidden: int, params, w, acts, reverse: bool,
              h: str, c: str, name: str) -> Tuple[List[str], str, str]:
    """One LSTM direction over ``xs`` ``[Seq, Batch, n_in]``: its step outputs (in processing order), last h, c."""
    g = ctx.g
    f_act, g_act, h_act = acts
    # gate blocks in the order input, forget, block input (z), output
    wx = np.concatenate([_matrix(m, hidden, n_in, "LSTM input weights") for m in (
        w.inputGateWeightMatrix, w.forgetGateWeightMatrix, w.blockInputWeightMatrix, w.outputGateWeightMatrix)])
    wh = np.concatenate([_matrix(m, hidden, hidden, "LSTM recursion weights") for m in (
        w.inputGateRecursionMatrix, w.forgetGateRecursionMatrix, w.blockInputRecursionMatrix,
        w.outputGateRecursionMatrix)])
    b = np.concatenate([_vector(v, hidden, "LSTM bias", params.hasBiasVectors) for v in (
        w.inputGateBiasVector, w.forgetGateBiasVector, w.blockInputBiasVector, w.outputGateBiasVector)])
    if params.forgetBias:
        b[hidden:2 * hidden] += 1.0
    peep: Optional[List[str]] = None
    if params.hasPeepholeVectors:
        peep = [g.const(_vector(v, hidden, "LSTM peephole"), name + "_p") for v in (
            w.inputGatePeepholeVector, w.forgetGatePeepholeVector, w.outputGatePeepholeVector)]
    clip = params.cellClipThreshold or 50.0
    proj = _project(ctx, xs, wx, b, name)
    rec = g.const(np.ascontiguousarray(wh.T), name + "_R")
    split = g.ints([hidden] * 4, name + "_split")
    lo, hi = g.scalar(-clip, name + "_clip_lo"), g.scalar(clip, name + "_clip_hi")
    steps = []
    for t, xw in enumerate(_step_inputs(ctx, proj, seq, reverse, name)):
        nm = "%s_s%d" % (name, t)
        pre = g.node("Add", [xw, g.node("MatMul", [h, rec])], nm + "_pre")
        gi, gf, gz, go = g.node("Split", [pre, split], nm + "_gates", outputs=4, axis=-1)
        if peep is not None:
            gi = g.node("Add", [gi, g.node("Mul", [c, peep[0]])])
            gf = g.node("Add", [gf, g.node("Mul", [c, peep[1]])])
        i = _gate(ctx, gi, f_act, nm + "_i")
        z = _gate(ctx, gz, g_act, nm + "_z")
        if params.coupledInputAndForgetGate:
            f = g.node("Sub", [g.scalar(1.0), i], nm + "_f")
        else:
            f = _gate(ctx, gf, f_act, nm + "_f")
        c = g.node("Add", [g.node("Mul", [f, c]), g.node("Mul", [i, z])], nm + "_c_raw")
        c = g.node("Clip", [c, lo, hi], nm + "_c")
        if peep is not None:
            go = g.node("Add", [go, g.node("Mul", [c, peep[2]])])
        o = _gate(ctx, go, f_act, nm + "_o")
        h = g.node("Mul", [o, nn.activate(ctx, c, h_act, nm + "_hc")], nm + "_h")
        steps.append(h)
    return steps, h, c


def _uni_lstm(ctx: nn.Context, layer, p) -> List[str]:
    n_in, hidden = int(p.inputVectorSize), int(p.outputVectorSize)
    xs, seq, batch, in_shape = _sequence(ctx, ctx.inp(layer), n_in, layer.name)
    h0 = _state(ctx, layer, 1, batch, hidden, layer.name + "_h0")
    c0 = _state(ctx, layer, 2, batch, hidden, layer.name + "_c0")
    steps, h, c = _lstm_run(ctx, xs, seq, n_in, hidden, p.params, p.weightParams, _activations(p.activations, 3),
                            p.reverseInput, h0, c0, layer.name)
    return _outputs(ctx, layer, steps, [h, c], p.params.sequenceOutput, in_shape, batch, hidden)


def _bi_lstm(ctx: nn.Context, layer, p) -> List[str]:
    """A forward and a backward LSTM; each time step's output is the pair (forward, backward) of that input
    position, the final output the two last states."""
    g = ctx.g
    n_in, hidden = int(p.inputVectorSize), int(p.outputVectorSize)
    if len(p.weightParams) != 2:
        raise Refused("%d weight sets (needs 2)" % len(p.weightParams))
    xs, seq, batch, in_shape = _sequence(ctx, ctx.inp(layer), n_in, layer.name)
    runs = []
    for d, (acts, weights) in enumerate(((p.activationsForwardLSTM, p.weightParams[0]),
                                         (p.activationsBackwardLSTM, p.weightParams[1]))):
        nm = layer.name + ("_fw", "_bw")[d]
        h0 = _state(ctx, layer, 1 + 2 * d, batch, hidden, nm + "_h0")
        c0 = _state(ctx, layer, 2 + 2 * d, batch, hidden, nm + "_c0")
        runs.append(_lstm_run(ctx, xs, seq, n_in, hidden, p.params, weights, _activations(acts, 3), d == 1, h0, c0,
                              nm))
    (fw, h_f, c_f), (bw, h_b, c_b) = runs
    if p.params.sequenceOutput:
        pairs = [g.node("Concat", [f, b], layer.name + "_pair", axis=-1) for f, b in zip(fw, bw[::-1])]
    else:
        pairs = [g.node("Concat", [h_f, h_b], layer.name + "_pair", axis=-1)]
    y = _outputs(ctx, layer, pairs, [], p.params.sequenceOutput, in_shape, batch, 2 * hidden)
    return y + _outputs(ctx, layer, [h_f], [h_f, c_f, h_b, c_b], False, in_shape, batch, hidden)[1:]


def _gru(ctx: nn.Context, layer, p) -> List[str]:
    g = ctx.g
    n_in, hidden = int(p.inputVectorSize), int(p.outputVectorSize)
    f_act, g_act = _activations(p.activations, 2)
    xs, seq, batch, in_shape = _sequence(ctx, ctx.inp(layer), n_in, layer.name)
    # gate blocks in the order update (z), reset (r), output (o)
    wx = np.concatenate([_matrix(m, hidden, n_in, "GRU input weights") for m in (
        p.updateGateWeightMatrix, p.resetGateWeightMatrix, p.outputGateWeightMatrix)])
    rz = np.concatenate([_matrix(m, hidden, hidden, "GRU recursion weights") for m in (
        p.updateGateRecursionMatrix, p.resetGateRecursionMatrix)])
    ro = _matrix(p.outputGateRecursionMatrix, hidden, hidden, "GRU recursion weights")
    b = np.concatenate([_vector(v, hidden, "GRU bias", p.hasBiasVectors) for v in (
        p.updateGateBiasVector, p.resetGateBiasVector, p.outputGateBiasVector)])
    proj = _project(ctx, xs, wx, b, layer.name)
    rec_zr = g.const(np.ascontiguousarray(rz.T), layer.name + "_Rzr")
    rec_o = g.const(np.ascontiguousarray(ro.T), layer.name + "_Ro")
    split = g.ints([hidden] * 3, layer.name + "_split")
    split2 = g.ints([hidden] * 2, layer.name + "_split2")
    h = _state(ctx, layer, 1, batch, hidden, layer.name + "_h0")
    steps = []
    for t, xw in enumerate(_step_inputs(ctx, proj, seq, p.reverseInput, layer.name)):
        nm = "%s_s%d" % (layer.name, t)
        xz, xr, xo = g.node("Split", [xw, split], nm + "_x", outputs=3, axis=-1)
        hz, hr = g.node("Split", [g.node("MatMul", [h, rec_zr]), split2], nm + "_h", outputs=2, axis=-1)
        z = _gate(ctx, g.node("Add", [xz, hz]), f_act, nm + "_z")
        r = _gate(ctx, g.node("Add", [xr, hr]), f_act, nm + "_r")
        o = _gate(ctx, g.node("Add", [xo, g.node("MatMul", [g.node("Mul", [h, r]), rec_o])]), g_act, nm + "_o")
        # h = (1 - z) o + z h = o + z (h - o)
        h = g.node("Add", [o, g.node("Mul", [z, g.node("Sub", [h, o])])], nm + "_hn")
        steps.append(h)
    return _outputs(ctx, layer, steps, [h], p.sequenceOutput, in_shape, batch, hidden)


def _simple_recurrent(ctx: nn.Context, layer, p) -> List[str]:
    g = ctx.g
    n_in, hidden = int(p.inputVectorSize), int(p.outputVectorSize)
    xs, seq, batch, in_shape = _sequence(ctx, ctx.inp(layer), n_in, layer.name)
    wx = _matrix(p.weightMatrix, hidden, n_in, "RNN input weights")
    rec = g.const(np.ascontiguousarray(_matrix(p.recursionMatrix, hidden, hidden, "RNN recursion weights").T),
                  layer.name + "_R")
    proj = _project(ctx, xs, wx, _vector(p.biasVector, hidden, "RNN bias", p.hasBiasVector), layer.name)
    h = _state(ctx, layer, 1, batch, hidden, layer.name + "_h0")
    steps = []
    for t, xw in enumerate(_step_inputs(ctx, proj, seq, p.reverseInput, layer.name)):
        h = _gate(ctx, g.node("Add", [xw, g.node("MatMul", [h, rec])]), p.activation, "%s_s%d_h" % (layer.name, t))
        steps.append(h)
    return _outputs(ctx, layer, steps, [h], p.sequenceOutput, in_shape, batch, hidden)


LAYERS: Dict[str, nn.Converter] = {
    "uniDirectionalLSTM": _uni_lstm, "biDirectionalLSTM": _bi_lstm, "gru": _gru,
    "simpleRecurrent": _simple_recurrent,
}
