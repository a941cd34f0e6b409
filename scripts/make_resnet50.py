#!/usr/bin/env python3
"""Build ResNet-50 (v1, 224x224, 1000 classes) as ONNX with random weights, using onnx.helper only.

    python scripts/make_resnet50.py [-o resnet50.onnx] [--seed 0] [--size 224]

Conv -> BatchNormalization -> Relu, bottleneck blocks (1x1, 3x3, 1x1 with 4x expansion, projection shortcuts
where the shape changes, the stride on the 3x3), residual Add -> Relu, MaxPool after the stem, GlobalAveragePool
-> Flatten -> Gemm. Weights are He-normal, batch-norm statistics random; the last BN of each block is scaled
down (0.2..0.5) so the residual sum stays in range over 16 blocks. Also importable: ``build_resnet50(seed, size)``.
"""
from __future__ import annotations

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _onnx_model import checked_model, image_model_options, save_model  # noqa: E402
from make_mobilenet_v2 import _Builder  # noqa: E402

STAGES = [(64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)]    # (bottleneck width, blocks, first stride)


def _relu(b: _Builder, x: str) -> str:
    from onnx import helper
    out = b.name("relu")
    b.nodes.append(helper.make_node("Relu", [x], [out], name=out))
    return out


def _shrink(b: _Builder, k: int) -> None:
    """Scale initializer k (the last BN's scale) by 0.2..0.5."""
    from onnx import numpy_helper
    t = b.inits[k]
    b.inits[k] = numpy_helper.from_array(numpy_helper.to_array(t) * b.rng.uniform(0.2, 0.5, t.dims).astype(np.float32),
                                         t.name)


def build_resnet50(seed: int = 0, size: int = 224, classes: int = 1000):
    from onnx import helper

    b = _Builder(seed)
    x = _relu(b, b.conv_bn("input", 3, 64, 7, 2, relu6=False))
    pool = b.name("maxpool")
    b.nodes.append(helper.make_node("MaxPool", [x], [pool], kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4,
                                    name=pool))
    x, cin = pool, 64
    for width, blocks, stride in STAGES:
        for i in range(blocks):
            s = stride if i == 0 else 1
            y = _relu(b, b.conv_bn(x, cin, width, 1, 1, relu6=False))
            y = _relu(b, b.conv_bn(y, width, width, 3, s, relu6=False))
            y = b.conv_bn(y, width, width * 4, 1, 1, relu6=False)
            # keep the residual branch small, as trained networks do (else 16 sums overflow any int8 scale)
            _shrink(b, -4)
            shortcut = x if (s == 1 and cin == width * 4) else b.conv_bn(x, cin, width * 4, 1, s, relu6=False)
            add = b.name("add")
            b.nodes.append(helper.make_node("Add", [shortcut, y], [add], name=add))
            x, cin = _relu(b, add), width * 4
    out = b.classifier(x, cin, classes)
    return checked_model("resnet50", b.nodes, b.inits, ("input", [1, 3, size, size]), (out, [1, classes]),
                         "tether scripts/make_resnet50.py")


def main() -> None:
    args = image_model_options(__doc__, "resnet50.onnx").parse_args()
    save_model(build_resnet50(args.seed, args.size), args.output)


if __name__ == "__main__":
    main()
