"""Video and volume models built with onnx.helper (random weights), the model kinds of 3-D convolutions: an
R(2+1)D-style video classifier and a two-level 3-D U-Net, each at the input size the real network runs on
(``size="bench"``) or a small one for tests (``size="test"``). Each builder returns (model, {input: array})."""
from __future__ import annotations

from typing import Dict, List, Tuple

import numpy as np
from onnx import helper, numpy_helper


class _Net:
    """Nodes and initializers, with conv + batch norm (+ relu) blocks; random weights from one seeded generator."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: List = []
        self.inits: Dict[str, np.ndarray] = {}

    def r(self, *shape) -> np.ndarray:
        return self.rng.standard_normal(shape).astype(np.float32)

    def node(self, op: str, ins: List[str], out: str, **attrs) -> str:
        self.nodes.append(helper.make_node(op, ins, [out], **attrs))
        return out

    def conv(self, x: str, cin: int, cout: int, k: Tuple[int, ...], name: str, strides=(1, 1, 1), pads=None,
             relu: bool = True) -> str:
        self.inits[name + "_w"] = self.r(cout, cin, *k) * np.float32((2.0 / (cin * int(np.prod(k)))) ** 0.5)
        pads = list(pads) if pads is not None else [ki // 2 for ki in k] * 2
        y = self.node("Conv", [x, name + "_w"], name + "_c", strides=list(strides), pads=pads)
        bn = [name + s for s in ("_s", "_b", "_m", "_v")]
        self.inits[bn[0]], self.inits[bn[1]] = 1 + 0.1 * self.r(cout), 0.1 * self.r(cout)
        self.inits[bn[2]], self.inits[bn[3]] = 0.1 * self.r(cout), 1 + 0.1 * np.abs(self.r(cout))
        y = self.node("BatchNormalization", [y] + bn, name + "_bn")
        return self.node("Relu", [y], name) if relu else y

    def model(self, x: np.ndarray, output: str, out_shape: Tuple[int, ...]):
        inits = [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in self.inits.items()]
        graph = helper.make_graph(self.nodes, "volume", [helper.make_tensor_value_info("x", 1, list(x.shape))],
                                  [helper.make_tensor_value_info(output, 1, list(out_shape))], inits)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), {"x": x}


def r2plus1d(size: str = "bench"):
    """Shaped like torchvision's r2plus1d_18 (its first two stages): a (2+1)D stem (1x7x7 spatial to 45 channels,
    then 3x1x1 temporal to 64), residual blocks of (2+1)D convs with a strided 1x1x1 shortcut, 3-D max pooling,
    global pooling and a linear head; 16 frames of 112x112 (``test``: 2 clips of 8 frames of 32x32, narrower)."""
    net = _Net(5)
    bench = size == "bench"
    mid, width = (45, 64) if bench else (16, 16)
    y = net.conv("x", 3, mid, (1, 7, 7), "stem_s", strides=(1, 2, 2), pads=[0, 3, 3, 0, 3, 3])
    y = net.conv(y, mid, width, (3, 1, 1), "stem_t")
    y = net.node("MaxPool", [y], "pool", kernel_shape=[1, 3, 3], strides=[1, 2, 2], pads=[0, 1, 1, 0, 1, 1])
    cin = width
    for i, (cout, stride) in enumerate([(width, 1), (2 * width, 2)]):
        a = net.conv(y, cin, cout, (1, 3, 3), "b%d_s1" % i, strides=(1, stride, stride))
        a = net.conv(a, cout, cout, (3, 1, 1), "b%d_t1" % i, strides=(stride, 1, 1))
        a = net.conv(a, cout, cout, (1, 3, 3), "b%d_s2" % i)
        a = net.conv(a, cout, cout, (3, 1, 1), "b%d_t2" % i, relu=False)
        short = y if stride == 1 and cin == cout else net.conv(y, cin, cout, (1, 1, 1), "b%d_down" % i,
                                                               strides=(stride,) * 3, pads=[0] * 6, relu=False)
        y = net.node("Relu", [net.node("Add", [a, short], "b%d_sum" % i)], "b%d" % i)
        cin = cout
    net.inits["fc_w"], net.inits["fc_b"] = 0.1 * net.r(400 if bench else 10, cin), 0.1 * net.r(400 if bench else 10)
    y = net.node("Flatten", [net.node("GlobalAveragePool", [y], "gap")], "flat")
    net.node("Gemm", [y, "fc_w", "fc_b"], "logits", transB=1)
    x = net.r(*((1, 3, 16, 112, 112) if bench else (2, 3, 8, 32, 32)))
    return net.model(x, "logits", (x.shape[0], 400 if bench else 10))


def unet3d(size: str = "bench"):
    """A two-level 3-D U-Net (volume segmentation, 3D U-Net / nnU-Net style): 3x3x3 convs, max pooling, a 2x2x2
    stride-2 ConvTranspose back up, the skip concatenated, a 1x1x1 head and a softmax over 3 classes; a 32x64x64
    volume (``test``: 8x16x16, narrower)."""
    net = _Net(6)
    bench = size == "bench"
    c = 16 if bench else 8
    e1 = net.conv("x", 1, c, (3, 3, 3), "e1")
    net.node("MaxPool", [e1], "p1", kernel_shape=[2, 2, 2], strides=[2, 2, 2])
    e2 = net.conv("p1", c, 2 * c, (3, 3, 3), "e2")
    net.inits["up_w"], net.inits["up_b"] = 0.2 * net.r(2 * c, c, 2, 2, 2), 0.1 * net.r(c)
    net.node("ConvTranspose", [e2, "up_w", "up_b"], "up", strides=[2, 2, 2])
    d1 = net.conv(net.node("Concat", ["up", e1], "cat", axis=1), 2 * c, c, (3, 3, 3), "d1")
    net.inits["head_w"], net.inits["head_b"] = 0.3 * net.r(3, c, 1, 1, 1), 0.1 * net.r(3)
    net.node("Softmax", [net.node("Conv", [d1, "head_w", "head_b"], "head")], "prob", axis=1)
    x = net.r(*((1, 1, 32, 64, 64) if bench else (1, 1, 8, 16, 16)))
    return net.model(x, "prob", (1, 3) + x.shape[2:])


MODELS = {"r2plus1d_video": r2plus1d, "unet3d": unet3d}
