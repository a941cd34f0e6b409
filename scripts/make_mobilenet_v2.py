#!/usr/bin/env python3
"""Build MobileNetV2 (1.0, 224x224, 1000 classes) as ONNX with random weights, using onnx.helper only.

    python scripts/make_mobilenet_v2.py [-o mobilenet_v2.onnx] [--seed 0] [--size 224]

The graph is what exporters produce: Conv -> BatchNormalization -> Clip(0, 6) blocks, inverted residuals with
depthwise 3x3 convs and residual Adds, then GlobalAveragePool -> Flatten -> Gemm. Weights are He-normal and the
batch-norm statistics random, so BN folding and every kernel see non-trivial numbers. Also importable:
``build_mobilenet_v2(seed, size, width)`` returns the ModelProto.
"""
from __future__ import annotations

import os
import sys
from typing import List

import numpy as np

# the scripts' shared helpers, also when a test or benchmark loads this file by its path
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _onnx_model import checked_model, image_model_options, save_model  # noqa: E402

# (expansion t, output channels c, repeats n, first stride s), from the MobileNetV2 paper
INVERTED_RESIDUAL_SETTING = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
                             (6, 160, 3, 2), (6, 320, 1, 1)]


def _make_divisible(v: float, divisor: int = 8) -> int:
    new_v = max(divisor, int(v + divisor / 2) // divisor * divisor)
    return new_v + divisor if new_v < 0.9 * v else new_v


class _Builder:
    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.nodes: List = []
        self.inits: List = []
        self.n = 0

    def name(self, base: str) -> str:
        self.n += 1
        return "%s_%d" % (base, self.n)

    def init(self, base: str, value: np.ndarray) -> str:
        from onnx import numpy_helper
        name = self.name(base)
        self.inits.append(numpy_helper.from_array(value.astype(np.float32), name))
        return name

    def conv_bn(self, x: str, cin: int, cout: int, k: int, stride: int, groups: int = 1, relu6: bool = True) -> str:
        from onnx import helper
        fan_in = cin // groups * k * k
        w = self.init("w", self.rng.standard_normal((cout, cin // groups, k, k)) * np.sqrt(2.0 / fan_in))
        conv = self.name("conv")
        self.nodes.append(helper.make_node("Conv", [x, w], [conv], kernel_shape=[k, k], strides=[stride, stride],
                                           pads=[k // 2] * 4, group=groups, name=conv))
        scale = self.init("bn_scale", self.rng.uniform(0.5, 1.5, cout))
        bias = self.init("bn_bias", self.rng.uniform(-0.2, 0.2, cout))
        mean = self.init("bn_mean", self.rng.uniform(-0.2, 0.2, cout))
        var = self.init("bn_var", self.rng.uniform(0.5, 1.5, cout))
        bn = self.name("bn")
        self.nodes.append(helper.make_node("BatchNormalization", [conv, scale, bias, mean, var], [bn], epsilon=1e-5,
                                           name=bn))
        if not relu6:
            return bn
        out = self.name("relu6")
        self.nodes.append(helper.make_node("Clip", [bn, "clip_min", "clip_max"], [out], name=out))
        return out

    def classifier(self, x: str, channels: int, classes: int) -> str:
        """The ImageNet head: global average pool, flatten, fully connected to ``classes`` logits ("output")."""
        from onnx import helper
        self.nodes.append(helper.make_node("GlobalAveragePool", [x], ["pool"], name="pool"))
        self.nodes.append(helper.make_node("Flatten", ["pool"], ["flat"], axis=1, name="flatten"))
        fc_w = self.init("fc_w", self.rng.standard_normal((classes, channels)) * np.sqrt(1.0 / channels))
        fc_b = self.init("fc_b", np.zeros(classes))
        self.nodes.append(helper.make_node("Gemm", ["flat", fc_w, fc_b], ["output"], transB=1, name="fc"))
        return "output"


def build_mobilenet_v2(seed: int = 0, size: int = 224, width: float = 1.0, classes: int = 1000):
    from onnx import helper, numpy_helper

    b = _Builder(seed)
    b.inits += [numpy_helper.from_array(np.array(0.0, np.float32), "clip_min"),
                numpy_helper.from_array(np.array(6.0, np.float32), "clip_max")]
    cin = _make_divisible(32 * width)
    x = b.conv_bn("input", 3, cin, 3, 2)
    for t, c, n, s in INVERTED_RESIDUAL_SETTING:
        cout = _make_divisible(c * width)
        for i in range(n):
            stride = s if i == 0 else 1
            hidden = cin * t
            y = x if t == 1 else b.conv_bn(x, cin, hidden, 1, 1)
            y = b.conv_bn(y, hidden, hidden, 3, stride, groups=hidden)
            y = b.conv_bn(y, hidden, cout, 1, 1, relu6=False)
            if stride == 1 and cin == cout:
                add = b.name("add")
                b.nodes.append(helper.make_node("Add", [x, y], [add], name=add))
                y = add
            x, cin = y, cout
    last = _make_divisible(1280 * max(1.0, width))
    out = b.classifier(b.conv_bn(x, cin, last, 1, 1), last, classes)
    return checked_model("mobilenet_v2", b.nodes, b.inits, ("input", [1, 3, size, size]), (out, [1, classes]),
                         "tether scripts/make_mobilenet_v2.py")


def main() -> None:
    ap = image_model_options(__doc__, "mobilenet_v2.onnx")
    ap.add_argument("--width", type=float, default=1.0)
    args = ap.parse_args()
    save_model(build_mobilenet_v2(args.seed, args.size, args.width), args.output)


if __name__ == "__main__":
    main()
