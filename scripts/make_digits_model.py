#!/usr/bin/env python3
"""Train a tiny CNN on scikit-learn's bundled 8x8 digits with plain numpy and export it to ONNX.

    python scripts/make_digits_model.py [-o tests/data/digits_cnn.onnx] [--epochs 25]

Architecture (NCHW, float32): Conv(1->8, 3x3, pad 1) -> Relu -> Conv(8->16, 3x3, pad 1) -> BatchNormalization
-> Relu -> MaxPool(2x2) -> Flatten -> Gemm(256->10) -> Softmax. The batch norm is there on purpose (identity
statistics except a learned-free rescale) so the compiled model exercises BN folding with real weights.

Split: samples whose index is a multiple of 4 are the held-out test set (``held_out_split`` below; the test
in tests/test_models.py uses the same function through this file). Training is deterministic (seed 0).
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Tuple

import numpy as np

# the scripts' shared helpers, also when a test or benchmark loads this file by its path
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _onnx_model import checked_model  # noqa: E402


def load_digits_nchw() -> Tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    d = load_digits()
    x = (d.images.astype(np.float32) / 16.0).reshape(-1, 1, 8, 8)
    return x, d.target.astype(np.int64)


def held_out_split(x: np.ndarray, y: np.ndarray):
    test = np.arange(len(x)) % 4 == 0
    return x[~test], y[~test], x[test], y[test]


# ---------------------------------------------------------------- numpy layers (forward + backward)
def im2col(x: np.ndarray, k: int, pad: int) -> np.ndarray:
    n, c, h, w = x.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    cols = np.empty((n, c, k, k, h, w), dtype=x.dtype)
    for i in range(k):
        for j in range(k):
            cols[:, :, i, j] = xp[:, :, i:i + h, j:j + w]
    return cols.transpose(0, 4, 5, 1, 2, 3).reshape(n * h * w, c * k * k)


def col2im(cols: np.ndarray, shape, k: int, pad: int) -> np.ndarray:
    n, c, h, w = shape
    cols = cols.reshape(n, h, w, c, k, k).transpose(0, 3, 4, 5, 1, 2)
    xp = np.zeros((n, c, h + 2 * pad, w + 2 * pad), dtype=cols.dtype)
    for i in range(k):
        for j in range(k):
            xp[:, :, i:i + h, j:j + w] += cols[:, :, i, j]
    return xp[:, :, pad:pad + h, pad:pad + w]


def conv_fwd(x, w, b):
    n, _, h, wd = x.shape
    oc, _, k, _ = w.shape
    cols = im2col(x, k, k // 2)
    out = cols @ w.reshape(oc, -1).T + b
    return out.reshape(n, h, wd, oc).transpose(0, 3, 1, 2), cols


def conv_bwd(dout, cols, x_shape, w):
    oc, _, k, _ = w.shape
    d2 = dout.transpose(0, 2, 3, 1).reshape(-1, oc)
    dw = (d2.T @ cols).reshape(w.shape)
    db = d2.sum(axis=0)
    dx = col2im(d2 @ w.reshape(oc, -1), x_shape, k, k // 2)
    return dx, dw, db


class Model:
    def __init__(self, rng: np.random.Generator):
        def he(*shape):
            fan_in = int(np.prod(shape[1:]))
            return (rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32)
        self.p = {"w1": he(8, 1, 3, 3), "b1": np.zeros(8, np.float32),
                  "w2": he(16, 8, 3, 3), "b2": np.zeros(16, np.float32),
                  "wf": he(10, 256), "bf": np.zeros(10, np.float32)}

    def forward(self, x):
        c = {}
        c["a1"], c["cols1"] = conv_fwd(x, self.p["w1"], self.p["b1"])
        c["r1"] = np.maximum(c["a1"], 0)
        c["a2"], c["cols2"] = conv_fwd(c["r1"], self.p["w2"], self.p["b2"])
        c["r2"] = np.maximum(c["a2"], 0)
        n = x.shape[0]
        win = c["r2"].reshape(n, 16, 4, 2, 4, 2)
        c["pool"] = win.max(axis=(3, 5))
        c["mask"] = (win == c["pool"][:, :, :, None, :, None])
        c["flat"] = c["pool"].reshape(n, 256)
        logits = c["flat"] @ self.p["wf"].T + self.p["bf"]
        c["x"] = x
        return logits, c

    def backward(self, dlogits, c):
        g = {}
        n = dlogits.shape[0]
        g["wf"] = dlogits.T @ c["flat"]
        g["bf"] = dlogits.sum(axis=0)
        dpool = (dlogits @ self.p["wf"]).reshape(n, 16, 4, 4)
        dwin = c["mask"] * dpool[:, :, :, None, :, None]
        dwin = dwin / np.maximum(c["mask"].sum(axis=(3, 5), keepdims=True), 1)
        dr2 = dwin.reshape(n, 16, 8, 8) * (c["a2"] > 0)
        dr1, g["w2"], g["b2"] = conv_bwd(dr2, c["cols2"], c["r1"].shape, self.p["w2"])
        _, g["w1"], g["b1"] = conv_bwd(dr1 * (c["a1"] > 0), c["cols1"], c["x"].shape, self.p["w1"])
        return g


def train(x, y, epochs: int, seed: int = 0) -> Model:
    rng = np.random.default_rng(seed)
    model = Model(rng)
    m = {k: np.zeros_like(v) for k, v in model.p.items()}
    v = {k: np.zeros_like(val) for k, val in model.p.items()}
    lr, b1, b2, step = 2e-3, 0.9, 0.999, 0
    for _ in range(epochs):
        order = rng.permutation(len(x))
        for s in range(0, len(x), 32):
            idx = order[s:s + 32]
            logits, cache = model.forward(x[idx])
            e = np.exp(logits - logits.max(axis=1, keepdims=True))
            prob = e / e.sum(axis=1, keepdims=True)
            prob[np.arange(len(idx)), y[idx]] -= 1
            grads = model.backward(prob / len(idx), cache)
            step += 1
            for k, gk in grads.items():
                m[k] = b1 * m[k] + (1 - b1) * gk
                v[k] = b2 * v[k] + (1 - b2) * gk * gk
                mh, vh = m[k] / (1 - b1 ** step), v[k] / (1 - b2 ** step)
                model.p[k] = (model.p[k] - lr * mh / (np.sqrt(vh) + 1e-8)).astype(np.float32)
    return model


def to_onnx(model: Model):
    from onnx import helper, numpy_helper

    p = model.p
    # A batch norm with non-trivial but exactly-compensated parameters: y = (x - mean) / sqrt(var + eps) * g + b
    # equals x, so accuracy is the trained network's while BN folding runs on real numbers.
    var = np.linspace(0.5, 2.0, 16).astype(np.float32)
    eps = 1e-5
    gamma = np.sqrt(var + eps).astype(np.float32)
    mean = np.linspace(-0.1, 0.1, 16).astype(np.float32)
    inits = [numpy_helper.from_array(a, name) for name, a in (
        ("w1", p["w1"]), ("b1", p["b1"]), ("w2", p["w2"]), ("b2", p["b2"]), ("bn_scale", gamma), ("bn_bias", mean),
        ("bn_mean", mean), ("bn_var", var), ("wf", p["wf"]), ("bf", p["bf"]))]
    nodes = [
        helper.make_node("Conv", ["input", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], name="conv2"),
        helper.make_node("BatchNormalization", ["c2", "bn_scale", "bn_bias", "bn_mean", "bn_var"], ["bn"],
                         epsilon=eps, name="bn2"),
        helper.make_node("Relu", ["bn"], ["r2"], name="relu2"),
        helper.make_node("MaxPool", ["r2"], ["p"], kernel_shape=[2, 2], strides=[2, 2], name="pool"),
        helper.make_node("Flatten", ["p"], ["f"], axis=1, name="flatten"),
        helper.make_node("Gemm", ["f", "wf", "bf"], ["logits"], transB=1, name="fc"),
        helper.make_node("Softmax", ["logits"], ["probs"], axis=1, name="softmax"),
    ]
    return checked_model("digits_cnn", nodes, inits, ("input", ["N", 1, 8, 8]), ("probs", ["N", 10]),
                         "tether scripts/make_digits_model.py")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-o", "--output", default=os.path.join(os.path.dirname(__file__), "..", "tests", "data",
                                                           "digits_cnn.onnx"))
    ap.add_argument("--epochs", type=int, default=25)
    args = ap.parse_args()
    x, y = load_digits_nchw()
    xtr, ytr, xte, yte = held_out_split(x, y)
    model = train(xtr, ytr, args.epochs)
    acc = (model.forward(xte)[0].argmax(axis=1) == yte).mean()
    import onnx
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    onnx.save(to_onnx(model), args.output)
    print("held-out accuracy (numpy training model): %.4f on %d samples; wrote %s (%d bytes)"
          % (acc, len(yte), args.output, os.path.getsize(args.output)))


if __name__ == "__main__":
    main()
