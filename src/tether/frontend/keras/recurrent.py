"""LSTM, GRU and SimpleRNN (also inside Bidirectional) as ONNX LSTM/GRU/RNN nodes (time-major, layout 0, which
every ONNX runtime implements; transposes move the batch first around them).

Keras orders an LSTM's gates i, f, c, o and ONNX i, o, f, c; GRU gates are z, r, h in both, and Keras'
reset_after is ONNX's linear_before_reset (its bias is then the input and recurrent halves). A layer with
go_backwards returns its sequence in the order it processed it (reversed), which ONNX's reverse direction
does not, so that output is flipped back in time; Bidirectional flips its backward half itself, so ONNX's
bidirectional node gives it directly.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import numpy as np

from tether.frontend.keras.activations import activation_name
from tether.frontend.keras.builder import Value
from tether.frontend.keras.layer import Call, LayerTable

LAYERS = LayerTable(__name__)

ONNX_CELL = {"LSTM": "LSTM", "GRU": "GRU", "SimpleRNN": "RNN"}


def _onnx_activation(c: Call, spec) -> Tuple[str, List[float], List[float]]:
    """(ONNX recurrent activation, its alpha list, its beta list) for a Keras activation."""
    name = activation_name(spec) or "linear"
    if name == "hard_sigmoid":
        return "HardSigmoid", [0.2 if c.version.startswith(("1.", "2.")) else 1.0 / 6.0], [0.5]
    table = {"sigmoid": ("Sigmoid", [], []), "tanh": ("Tanh", [], []), "relu": ("Relu", [], []),
             "linear": ("Affine", [1.0], [0.0]), "elu": ("Elu", [1.0], []), "softsign": ("Softsign", [], []),
             "softplus": ("Softplus", [], [])}
    if name not in table:
        raise c.refuse("recurrent activation %r (tether converts %s)" % (name, ", ".join(sorted(table)
                                                                                          + ["hard_sigmoid"])))
    return table[name]


def _gates(w: np.ndarray, order: List[int], n: int) -> np.ndarray:
    """Reorder the ``n`` gate blocks of the last axis of ``w``."""
    blocks = np.split(w, n, axis=-1)
    return np.concatenate([blocks[k] for k in order], axis=-1)


def _direction_weights(c: Call, cell: str, cfg: Dict, w: List[np.ndarray]) -> Tuple[np.ndarray, np.ndarray,
                                                                                        np.ndarray]:
    """One direction's ONNX W (gates*units, in), R (gates*units, units) and B (2*gates*units)."""
    units = int(cfg["units"])
    kernel, recurrent = w[0], w[1]
    bias = w[2] if len(w) > 2 else None
    if cell == "LSTM":
        order, n = [0, 3, 1, 2], 4          # i f c o -> i o f c
    elif cell == "GRU":
        order, n = [0, 1, 2], 3             # z r h in both
    else:
        order, n = [0], 1
    wx, wh = _gates(kernel, order, n).T, _gates(recurrent, order, n).T
    zeros = np.zeros(n * units, np.float32)
    if bias is None:
        b = np.concatenate([zeros, zeros])
    elif bias.ndim == 2:                    # GRU reset_after: input and recurrent biases
        b = np.concatenate([_gates(bias[0], order, n), _gates(bias[1], order, n)])
    else:
        b = np.concatenate([_gates(bias, order, n), zeros])
    return wx, wh, b


def _weight_count(cfg: Dict) -> int:
    return 3 if cfg.get("use_bias", True) else 2


def rnn_node(c: Call, cell: str, cfgs: List[Dict], weights: List[List[np.ndarray]], direction: str,
             x: str, initial: Optional[List[str]] = None) -> List[str]:
    """The ONNX recurrent node of one or two directions, ``x`` batch first: its outputs Y as (batch, time, dirs,
    units), Y_h and Y_c as (batch, dirs, units)."""
    cfg = cfgs[0]
    units = int(cfg["units"])
    ws = [_direction_weights(c, cell, cf, w) for cf, w in zip(cfgs, weights)]
    b = c.b
    acts, alphas, betas = [], [], []
    for cf in cfgs:
        specs = [cf.get("recurrent_activation", "sigmoid"), cf.get("activation", "tanh")]
        if cell == "LSTM":
            specs.append(cf.get("activation", "tanh"))
        if cell == "RNN":
            specs = [cf.get("activation", "tanh")]
        for spec in specs:
            name, al, be = _onnx_activation(c, spec)
            acts.append(name)
            alphas += al
            betas += be
    attrs = {"hidden_size": units, "direction": direction, "activations": acts}
    if alphas:
        attrs["activation_alpha"] = alphas
    if betas:
        attrs["activation_beta"] = betas
    if cell == "GRU":
        attrs["linear_before_reset"] = int(bool(cfg.get("reset_after", True)))
    ins = [b.transpose(x, [1, 0, 2], c.hint("_time_major")), b.const(np.stack([w[0] for w in ws]), c.hint("_W")),
           b.const(np.stack([w[1] for w in ws]), c.hint("_R")),
           b.const(np.stack([w[2] for w in ws]), c.hint("_B")), ""]
    if initial:
        ins += initial
    n_out = 3 if cell == "LSTM" else 2
    outs = b.op(cell, ins, c.hint(), outputs=n_out, **attrs)
    return [b.transpose(outs[0], [2, 0, 1, 3], c.hint("_y"))] + [b.transpose(s, [1, 0, 2], c.hint("_state"))
                                                                  for s in outs[1:]]


def _flip_time(c: Call, y: str) -> str:
    b = c.b
    return b.op("Slice", [y, b.ints([-1], c.hint("_s")), b.ints([np.iinfo(np.int64).min], c.hint("_e")),
                          b.ints([1], c.hint("_a")), b.ints([-1], c.hint("_st"))], c.hint("_flip"))


@LAYERS.register("LSTM", "GRU", "SimpleRNN")
def _rnn(c: Call) -> List[Value]:
    cell = ONNX_CELL[c.class_name]
    if c.x.rank != 3:
        raise c.refuse("an input of rank %d (expected batch, time, features)" % c.x.rank)
    if "mask" in c.tensor_kwargs:
        raise c.refuse("a mask tensor")
    w = c.weights((_weight_count(c.config),))
    b = c.b
    x = b.keras_order(c.x)
    initial = None
    states = c.tensor_kwargs.get("initial_state")
    if states is not None:
        states = states if isinstance(states, list) else [states]
        initial = [b.op("Unsqueeze", [b.keras_order(s), b.ints([0], c.hint("_ax"))], c.hint("_state"))
                   for s in states]
    backwards = bool(c.get("go_backwards", False))
    outs = rnn_node(c, cell, [c.config], [w], "reverse" if backwards else "forward", x, initial)
    units = int(c.get("units"))
    if c.get("return_sequences", False):
        y = b.op("Reshape", [outs[0], b.ints([0, 0, units], c.hint("_seq"))], c.hint())
        result = [Value(_flip_time(c, y) if backwards else y, 3)]
    else:
        result = [Value(b.op("Reshape", [outs[1], b.ints([0, units], c.hint("_last"))], c.hint()), 2)]
    if c.get("return_state", False):
        for s in outs[1:]:
            result.append(Value(b.op("Reshape", [s, b.ints([0, units], c.hint("_st"))], c.hint()), 2))
    return result


@LAYERS.register("Bidirectional")
def _bidirectional(c: Call) -> List[Value]:
    inner = c.get("layer") or {}
    cls = str(inner.get("class_name"))
    if cls not in ONNX_CELL:
        raise c.refuse("wrapping a %s (tether converts LSTM, GRU and SimpleRNN)" % cls)
    cell = ONNX_CELL[cls]
    fwd = inner.get("config", {})
    bwd = (c.get("backward_layer") or {}).get("config", fwd)
    if fwd.get("go_backwards", False):
        raise c.refuse("a forward layer with go_backwards")
    if c.x.rank != 3:
        raise c.refuse("an input of rank %d (expected batch, time, features)" % c.x.rank)
    n = _weight_count(fwd)
    w = c.weights((n + _weight_count(bwd),))
    b = c.b
    outs = rnn_node(c, cell, [fwd, bwd], [w[:n], w[n:]], "bidirectional", b.keras_order(c.x))
    units = int(fwd["units"])
    mode = c.get("merge_mode", "concat")
    seq = fwd.get("return_sequences", False)
    y = outs[0] if seq else outs[1]
    axis = 2 if seq else 1
    lead = [0, 0] if seq else [0]
    if mode == "concat":
        merged = [b.op("Reshape", [y, b.ints(lead + [2 * units], c.hint("_cat"))], c.hint())]
    elif mode in ("sum", "ave", "mul"):
        op = {"sum": "ReduceSum", "ave": "ReduceMean", "mul": "ReduceProd"}[mode]
        merged = [b.op(op, [y, b.ints([axis], c.hint("_ax"))] if op == "ReduceSum" else [y], c.hint(),
                       keepdims=0, **({} if op == "ReduceSum" else {"axes": [axis]}))]
    elif mode is None:
        halves = b.op("Split", [y], c.hint(), outputs=2, axis=axis)
        merged = [b.op("Reshape", [h, b.ints(lead + [units], c.hint("_half"))], c.hint()) for h in halves]
    else:
        raise c.refuse("merge_mode %r" % mode)
    result = [Value(m, 3 if seq else 2) for m in merged]
    if fwd.get("return_state", False):
        states = []
        for s in outs[1:]:
            for d in b.op("Split", [s], c.hint(), outputs=2, axis=1):
                states.append(b.op("Reshape", [d, b.ints([0, units], c.hint("_st"))], c.hint()))
        per = len(outs) - 1         # Keras lists the forward states, then the backward ones
        ordered = [states[2 * k] for k in range(per)] + [states[2 * k + 1] for k in range(per)]
        result += [Value(s, 2) for s in ordered]
    return result
