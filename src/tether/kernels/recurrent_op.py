"""The ``recurrent`` graph op: one LSTM, GRU or RNN layer's recurrence over time (ONNX semantics), after the
input projection.

The frontend splits an ONNX recurrent node in two. The input projection of every time step and direction is one
GEMM (``dense`` + bias, an ordinary kernel). What remains is this op, whose kernel loops over time inside
(``kernels/recurrent_kernel.py``): per step, one matrix product of the hidden state with the recurrent weights and
the fused gate arithmetic.

Inputs, in order (``D`` directions, ``B`` batch, ``H`` hidden, ``G`` gates: 4 LSTM (i, o, f, c), 3 GRU (z, r, h),
1 RNN):
- ``xw`` (S, B, D*G*H): X @ W^T plus every bias that is purely additive (Wb + Rb; for a GRU with
  ``linear_before_reset`` the h gate's Rb stays out, it is input ``rbh``);
- ``rt`` (D, H, G*H): the recurrent weights transposed, so one step's product reads rows of it;
- ``h0`` (D, B, H); ``c0`` (D, B, H) for an LSTM;
- ``p`` (D, 3H) the LSTM peepholes (i, o, f) when ``has_peephole``;
- ``rbh`` (D, H) when ``cell == "gru"`` and ``linear_before_reset``;
- ``seq_lens`` (B,) int32 when ``has_seq_lens``;
- ``r_scale`` (D, G*H) when ``quant_h`` (onnxruntime's DynamicQuantizeLSTM, LSTM only): ``rt`` then holds the
  recurrent weights as integers minus their zero point (exact in float32), and each step quantizes the hidden
  state of all batch rows of the direction to uint8 as DynamicQuantizeLinear does (range with 0, scale
  ``(max - min) / 255``, zero point rounded half to even), so the product is ``float(sum_k hq * rq) *
  (scale * r_scale)``, added to ``xw`` (frontend/onnx/quantized_lstm.py).
Outputs: ``y`` (S, D, B, H), ``y_h`` (D, B, H) and, for an LSTM, ``y_c`` (D, B, H). A batch row stops at its
``seq_lens`` entry: later steps leave its state unchanged and write zeros to ``y`` (as onnxruntime; a reverse
direction starts at the row's last valid step).

Attributes: ``cell``, ``hidden``, ``directions`` (list of "forward"/"reverse"), ``acts`` (per direction a list of
``[name, alpha, beta]``: f, g, h for an LSTM, f, g for a GRU, f for an RNN), ``clip`` (None: none),
``input_forget``, ``linear_before_reset``, ``has_peephole``, ``has_seq_lens``.
"""
from __future__ import annotations

from typing import Dict, List

import numpy as np

from tether.graph.ir import TensorType
from tether.kernels.registry import OpDef

GATES = {"lstm": 4, "gru": 3, "rnn": 1}
ACTIVATION_COUNT = {"lstm": 3, "gru": 2, "rnn": 1}


def np_activation(name: str, alpha: float, beta: float, x: np.ndarray) -> np.ndarray:
    return NP_ACTIVATIONS[name](x, alpha, beta)


NP_ACTIVATIONS = {
    "relu": lambda x, a, b: np.maximum(x, 0),
    "tanh": lambda x, a, b: np.tanh(x),
    "sigmoid": lambda x, a, b: 1.0 / (1.0 + np.exp(-x)),
    "affine": lambda x, a, b: a * x + b,
    "leakyrelu": lambda x, a, b: np.where(x >= 0, x, a * x),
    "thresholdedrelu": lambda x, a, b: np.where(x > a, x, 0.0),
    "scaledtanh": lambda x, a, b: a * np.tanh(b * x),
    "hardsigmoid": lambda x, a, b: np.clip(a * x + b, 0.0, 1.0),
    "elu": lambda x, a, b: np.where(x >= 0, x, a * (np.exp(x) - 1.0)),
    "softsign": lambda x, a, b: x / (1.0 + np.abs(x)),
    "softplus": lambda x, a, b: np.maximum(x, 0) + np.log1p(np.exp(-np.abs(x))),
}


def input_names(attrs: dict) -> List[str]:
    names = ["xw", "rt", "h0"]
    if attrs["cell"] == "lstm":
        names.append("c0")
    if attrs.get("has_peephole"):
        names.append("p")
    if attrs["cell"] == "gru" and attrs.get("linear_before_reset"):
        names.append("rbh")
    if attrs.get("has_seq_lens"):
        names.append("seq_lens")
    if attrs.get("quant_h"):
        names.append("r_scale")
    return names


def dynamic_quantize_rows(h: np.ndarray):
    """(h quantized to uint8 minus its zero point, as float32, and the scale), as onnxruntime's
    GetQuantizationParameter + MlasQuantizeLinear: range widened to 0, clamp before rounding half to even."""
    f32 = np.float32
    h = h.astype(f32)
    mn, mx = min(f32(h.min()), f32(0)), max(f32(h.max()), f32(0))
    scale = f32(1) if mx == mn else f32(f32(mx - mn) / f32(255))
    zp = np.rint(min(max(f32(0) - f32(mn / scale), f32(0)), f32(255)))
    return np.rint(np.clip(h / scale, f32(-zp), f32(255 - zp))).astype(f32), scale


def _infer(attrs, xw, rt, h0, *rest):
    s, b = xw.shape[0], xw.shape[1]
    d, h = len(attrs["directions"]), attrs["hidden"]
    outs = [TensorType((s, d, b, h), xw.dtype), TensorType((d, b, h), xw.dtype)]
    if attrs["cell"] == "lstm":
        outs.append(TensorType((d, b, h), xw.dtype))
    return outs


def _ref(attrs, *arrays):
    ins: Dict[str, np.ndarray] = dict(zip(input_names(attrs), arrays))
    cell, hid = attrs["cell"], attrs["hidden"]
    xw = ins["xw"].astype(np.float64)
    seq, batch = xw.shape[0], xw.shape[1]
    ndir, g = len(attrs["directions"]), GATES[cell]
    xw = xw.reshape(seq, batch, ndir, g * hid)
    clip = attrs.get("clip")
    y = np.zeros((seq, ndir, batch, hid))
    yh = ins["h0"].astype(np.float64).copy()
    yc = ins["c0"].astype(np.float64).copy() if cell == "lstm" else None
    lens = ins["seq_lens"].astype(np.int64) if "seq_lens" in ins else np.full(batch, seq)

    def cl(v):
        return np.clip(v, -clip, clip) if clip is not None else v

    for d, direction in enumerate(attrs["directions"]):
        acts = [lambda v, a=a: np_activation(a[0], a[1], a[2], v) for a in attrs["acts"][d]]
        r = ins["rt"][d].astype(np.float64)                      # (H, G*H)
        steps = range(seq) if direction == "forward" else range(seq - 1, -1, -1)
        for t in steps:
            valid = (t < lens)[:, None]
            h = yh[d]
            pre = xw[t, :, d]
            if cell == "lstm":
                gates = pre + h @ r
                if attrs.get("quant_h"):
                    hq, sh = dynamic_quantize_rows(h)
                    prod = (hq.astype(np.float64) @ r).astype(np.float32)
                    gates = pre + (prod * (sh * ins["r_scale"][d].astype(np.float32))).astype(np.float64)
                c = yc[d]
                p = ins["p"][d].astype(np.float64) if "p" in ins else np.zeros(3 * hid)
                gi, go, gf, gc = (gates[:, k * hid:(k + 1) * hid] for k in range(4))
                i = acts[0](cl(gi + p[:hid] * c))
                f = 1.0 - i if attrs.get("input_forget") else acts[0](cl(gf + p[2 * hid:] * c))
                cn = f * c + i * acts[1](cl(gc))
                o = acts[0](cl(go + p[hid:2 * hid] * cn))
                hn = o * acts[2](cn)
                yc[d] = np.where(valid, cn, c)
            elif cell == "gru":
                zr = pre[:, :2 * hid] + h @ r[:, :2 * hid]
                z, rr = acts[0](cl(zr[:, :hid])), acts[0](cl(zr[:, hid:]))
                if attrs.get("linear_before_reset"):
                    hh = acts[1](cl(pre[:, 2 * hid:] + rr * (h @ r[:, 2 * hid:] + ins["rbh"][d])))
                else:
                    hh = acts[1](cl(pre[:, 2 * hid:] + (rr * h) @ r[:, 2 * hid:]))
                hn = (1.0 - z) * hh + z * h
            else:
                hn = acts[0](cl(pre + h @ r))
            yh[d] = np.where(valid, hn, h)
            y[t, d] = np.where(valid, hn, 0.0)
    dt = ins["xw"].dtype
    outs = [y.astype(dt), yh.astype(dt)]
    if cell == "lstm":
        outs.append(yc.astype(dt))
    return outs


DEFINITIONS: Dict[str, OpDef] = {"recurrent": OpDef("recurrent", "opaque", _infer, _ref)}

