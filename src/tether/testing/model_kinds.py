"""The kinds of ONNX model real users bring, built with onnx.helper with the structure and layer sizes the shipped
models have (random weights; no download): shared by ``tests/test_model_kinds.py`` (small inputs) and
``scripts/bench_model_kinds.py`` (the inputs the models run on).

Each builder takes ``size`` ("test" or "bench") and returns ``(model, feeds)``:

- ``db_detector``: a DB text detector (PP-OCR det): MobileNetV3-large x0.5 backbone, an FPN with nearest ``Resize``
  upsampling and a ``Concat`` of four levels, a head of Conv + two ``ConvTranspose`` (2x2, stride 2) + Sigmoid.
- ``svtr_recognizer``: an SVTR-tiny text recognizer: conv patch embedding, attention blocks whose layer norm is
  written out as ``ReduceMean``/``Sub``/``Pow``/``Sqrt``/``Div`` (Paddle2ONNX below opset 17), local mixing as an
  additive window mask, Erf-based GELU, conv merging, a CTC head with Softmax.
- ``yolov8_detector``: YOLOv8n: Conv-BN-SiLU, C2f (``Split``, bottlenecks, ``Concat``), SPPF, PAN neck with
  ``Resize``, a decoupled head, DFL (Softmax + 1x1 conv), anchors from ``Range``/``Expand`` and box decoding.
- ``yolox_detector``: YOLOX-tiny: Focus (strided ``Slice``), CSPDarknet, SPP, PAFPN with ``Resize``, decoupled
  heads with objectness, outputs concatenated and transposed.
- ``picodet_layout``: a PicoDet layout detector: LCNet (depthwise, hard-swish, SE), a PAN neck with ``Resize``,
  GFL heads whose output is ``Split`` into class scores and a DFL box distribution.
- ``crnn_recognizer``: a CRNN: VGG-style convs and max pools to a height of one, two bidirectional ``LSTM`` layers,
  a CTC classifier with Softmax.
- ``vad``: a Silero-style voice-activity detector: an STFT as a strided 1-D conv, magnitude, a 1-D conv encoder,
  two LSTM layers with state in and out, a 1-D conv decoder, ``ReduceMean`` over time, a run-time ``If``.
- ``mobilenetv3_cls``: the PP-OCR text-orientation classifier: MobileNetV3-small x0.35 (hard-swish,
  squeeze-excitation with HardSigmoid) on a 48x192 text line, two classes.
- ``transformer_encoder``: a two-layer encoder as torch.onnx writes ``nn.TransformerEncoder`` (d_model 128,
  4 heads, feed-forward 512, GELU as ``Erf``, ``LayerNormalization``) on 64 tokens.
- ``efficientnet_b0``: EfficientNet-B0: SiLU as ``Mul(x, Sigmoid(x))``, MBConv blocks (expand 1x1, depthwise
  3x3/5x5, squeeze-excite with SiLU and Sigmoid, project 1x1, residuals), head and classifier, at 224x224.
- ``mobilevit_xs``: MobileViT-XS: MV2 blocks, MobileViT blocks that unfold 2x2 patches with ``Reshape`` and
  ``Transpose``, run transformer layers (``LayerNormalization``, multi-head attention, SiLU MLP), fold them back
  and fuse them with the local branch through a ``Concat``, at 256x256.
- ``wav2vec2_encoder``: a wav2vec2-base-like audio encoder, narrower: seven strided 1-D convs (512 channels)
  with GroupNorm (as torch writes it: ``InstanceNormalization`` between reshapes) and Erf GELU, feature
  projection, a grouped positional conv (kernel 128, 16 groups), post-norm transformer layers, on 1 s at 16 kHz.
- ``crnn_dynquant``: ``crnn_recognizer`` dynamically quantized as onnxruntime's ``quantize_dynamic`` writes it:
  ``DynamicQuantizeLinear`` on activations, ``ConvInteger``/``MatMulInteger`` with int8 weights, ``Cast`` and
  ``Mul`` by the scales, and ``DynamicQuantizeLSTM`` (com.microsoft) for the LSTMs.
- ``r2plus1d_video`` and ``unet3d``: 3-D convolutions, from ``tether.testing.volume_models``.
"""
from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from tether.testing import volume_models

Feeds = Dict[str, np.ndarray]


def relative_error(got: np.ndarray, ref: np.ndarray) -> float:
    """max |got - ref| / max |ref|: the error the model-kind checks bound (1e-4 for fp32)."""
    ref = np.asarray(ref)
    if ref.dtype == np.bool_ or np.issubdtype(ref.dtype, np.integer):
        return float(np.any(np.asarray(got) != ref))
    return float(np.abs(np.asarray(got, np.float64) - ref).max() / max(float(np.abs(ref).max()), 1e-30))


class _Builder:
    """Appends nodes and initializers; every op returns its output name(s)."""

    def __init__(self, seed: int = 0):
        self.rng = np.random.default_rng(seed)
        self.nodes: list = []
        self.inits: Dict[str, np.ndarray] = {}
        self._n = 0

    def fresh(self, prefix: str) -> str:
        self._n += 1
        return "%s_%d" % (prefix, self._n)

    def const(self, value, prefix: str = "k") -> str:
        name = self.fresh(prefix)
        self.inits[name] = np.asarray(value)
        return name

    def weight(self, *shape, fan_in: Optional[int] = None, gain: float = 1.0) -> str:
        fan = fan_in if fan_in is not None else int(np.prod(shape[1:])) or 1
        return self.const((self.rng.standard_normal(shape) * gain / np.sqrt(fan)).astype(np.float32), "w")

    def op(self, op_type: str, inputs: Sequence[str], n_out: int = 1, **attrs):
        from onnx import helper

        outs = [self.fresh(op_type.lower()) for _ in range(n_out)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, name=self.fresh("n_" + op_type), **attrs))
        return outs[0] if n_out == 1 else outs

    def i64(self, *values) -> str:
        return self.const(np.array(values, np.int64), "i")

    def f32(self, value) -> str:
        return self.const(np.array(value, np.float32), "f")

    # -- layers
    def act(self, x: str, kind: Optional[str]) -> str:
        if kind is None:
            return x
        if kind == "relu":
            return self.op("Relu", [x])
        if kind == "hardswish":
            return self.op("HardSwish", [x])
        if kind == "silu":       # torch.onnx writes SiLU as x * sigmoid(x)
            return self.op("Mul", [x, self.op("Sigmoid", [x])])
        if kind == "gelu":       # x * 0.5 * (1 + erf(x / sqrt(2)))
            e = self.op("Erf", [self.op("Div", [x, self.f32(np.sqrt(2.0))])])
            return self.op("Mul", [self.op("Mul", [x, self.op("Add", [e, self.f32(1.0)])]), self.f32(0.5)])
        raise ValueError("unknown activation %r" % kind)

    def conv(self, x: str, cin: int, cout: int, k=3, stride=1, group: int = 1, act: Optional[str] = "relu",
             pad=None, dims: int = 2, bias: bool = True) -> str:
        """Conv with the batch norm folded into weight and bias, as exporters write a Conv-BN pair."""
        ks = list(k) if isinstance(k, (tuple, list)) else [k] * dims
        st = list(stride) if isinstance(stride, (tuple, list)) else [stride] * dims
        pads = pad if pad is not None else [kk // 2 for kk in ks] * 2
        ins = [x, self.weight(cout, cin // group, *ks, gain=1.4 if act else 1.0)]
        if bias:
            ins.append(self.const((self.rng.standard_normal(cout) * 0.1).astype(np.float32), "b"))
        y = self.op("Conv", ins, kernel_shape=ks, strides=st, pads=pads, group=group)
        return self.act(y, act)

    def linear(self, x: str, nin: int, nout: int) -> str:
        w = self.weight(nin, nout, fan_in=nin)
        b = self.const((self.rng.standard_normal(nout) * 0.1).astype(np.float32), "b")
        return self.op("Add", [self.op("MatMul", [x, w]), b])

    def resize2x(self, x: str, scale: int = 2) -> str:
        return self.op("Resize", [x, "", self.const(np.array([1, 1, scale, scale], np.float32), "scales")],
                       mode="nearest")

    def se(self, x: str, c: int, squeeze: int, gate: str = "hardsigmoid", pool: str = "reducemean") -> str:
        if pool == "reducemean":
            p = self.op("ReduceMean", [x, self.i64(2, 3)], keepdims=1)
        else:
            p = self.op("GlobalAveragePool", [x])
        s = self.conv(p, c, squeeze, 1, act="relu")
        s = self.conv(s, squeeze, c, 1, act=None)
        s = self.op("HardSigmoid", [s], alpha=0.2, beta=0.5) if gate == "hardsigmoid" else self.op("Sigmoid", [s])
        return self.op("Mul", [x, s])

    def model(self, inputs: Feeds, outputs: Sequence[str], opset: int = 18, name: str = "model"):
        from onnx import helper, numpy_helper

        dtypes = {"float32": 1, "int64": 7, "bool": 9}
        opsets = [helper.make_opsetid("", opset)]
        if any(n.domain == "com.microsoft" for n in self.nodes):
            opsets.append(helper.make_opsetid("com.microsoft", 1))
        graph = helper.make_graph(
            self.nodes, name,
            [helper.make_tensor_value_info(k, dtypes[str(v.dtype)], list(v.shape)) for k, v in inputs.items()],
            [helper.ValueInfoProto(name=o) for o in outputs],
            [numpy_helper.from_array(v, k) for k, v in self.inits.items()])
        return typed_outputs(helper.make_model(graph, opset_imports=opsets, ir_version=8,
                                               producer_name="tether.testing.model_kinds"))


def typed_outputs(model):
    """``model`` with its graph outputs given the types ONNX shape inference finds (onnxruntime needs them)."""
    import onnx

    inferred = onnx.shape_inference.infer_shapes(model)
    known = {v.name: v for v in inferred.graph.value_info}
    for out in model.graph.output:
        if out.name in known:
            out.type.CopyFrom(known[out.name].type)
    return model


def _make_divisible(v: float, divisor: int = 8) -> int:
    new_v = max(divisor, int(v + divisor / 2) // divisor * divisor)
    return new_v + divisor if new_v < 0.9 * v else new_v


# ---------------------------------------------------------------- MobileNetV3 (classifier, DB backbone)
# kernel, expanded, out, squeeze-excite, activation, stride
_MNV3_LARGE = [(3, 16, 16, False, "relu", 1), (3, 64, 24, False, "relu", 2), (3, 72, 24, False, "relu", 1),
               (5, 72, 40, True, "relu", 2), (5, 120, 40, True, "relu", 1), (5, 120, 40, True, "relu", 1),
               (3, 240, 80, False, "hardswish", 2), (3, 200, 80, False, "hardswish", 1),
               (3, 184, 80, False, "hardswish", 1), (3, 184, 80, False, "hardswish", 1),
               (3, 480, 112, True, "hardswish", 1), (3, 672, 112, True, "hardswish", 1),
               (5, 672, 160, True, "hardswish", 2), (5, 960, 160, True, "hardswish", 1),
               (5, 960, 160, True, "hardswish", 1)]
_MNV3_SMALL = [(3, 16, 16, True, "relu", 2), (3, 72, 24, False, "relu", 2), (3, 88, 24, False, "relu", 1),
               (5, 96, 40, True, "hardswish", 2), (5, 240, 40, True, "hardswish", 1),
               (5, 240, 40, True, "hardswish", 1), (5, 120, 48, True, "hardswish", 1),
               (5, 144, 48, True, "hardswish", 1), (5, 288, 96, True, "hardswish", 2),
               (5, 576, 96, True, "hardswish", 1), (5, 576, 96, True, "hardswish", 1)]


def _mobilenet_v3(b: _Builder, x: str, config, scale: float) -> Tuple[str, int, List[Tuple[str, int]]]:
    """Stem + inverted residual blocks; returns (output, channels, [(feature before each stride-2 block, ch)])."""
    cin = _make_divisible(16 * scale)
    y = b.conv(x, 3, cin, 3, 2, act="hardswish")
    taps = []
    for k, exp, cout, se, act, stride in config:
        exp, cout = _make_divisible(scale * exp), _make_divisible(scale * cout)
        if stride == 2:
            taps.append((y, cin))
        h = b.conv(y, cin, exp, 1, act=act) if exp != cin else y
        h = b.conv(h, exp, exp, k, stride, group=exp, act=act)
        if se:
            h = b.se(h, exp, _make_divisible(exp // 4))
        h = b.conv(h, exp, cout, 1, act=None)
        y = b.op("Add", [y, h]) if stride == 1 and cin == cout else h
        cin = cout
    return y, cin, taps


def _mobilenet_v3_head(b: _Builder, config, scale: float, last: int):
    """The backbone and its final 1x1 conv to ``last`` (scaled) channels: (output, channels, taps)."""
    y, c, taps = _mobilenet_v3(b, "x", config, scale)
    last = _make_divisible(last * scale)
    return b.conv(y, c, last, 1, act="hardswish"), last, taps


def mobilenetv3_cls(size: str = "bench"):
    b = _Builder(1)
    hw = (48, 192) if size == "bench" else (48, 96)
    y, last, _ = _mobilenet_v3_head(b, _MNV3_SMALL, 0.35, 576)
    y = b.op("GlobalAveragePool", [y])
    y = b.op("Flatten", [y], axis=1)
    y = b.op("Softmax", [b.linear(y, last, 2)], axis=-1)
    feeds = {"x": b.rng.uniform(-1, 1, (1, 3) + hw).astype(np.float32)}
    return b.model(feeds, [y], name="mobilenetv3_cls"), feeds


# ---------------------------------------------------------------- DB text detector
def db_detector(size: str = "bench"):
    b = _Builder(2)
    hw = (640, 640) if size == "bench" else (64, 96)
    c5, last, taps = _mobilenet_v3_head(b, _MNV3_LARGE, 0.5, 960)
    feats = [t for t in taps[1:]] + [(c5, last)]          # strides 4, 8, 16, 32
    inner, outc = 96, 24
    lat = [b.conv(f, ch, inner, 1, act=None, bias=False) for f, ch in feats]
    for i in range(len(lat) - 2, -1, -1):                  # top-down: upsample and add
        lat[i] = b.op("Add", [lat[i], b.resize2x(lat[i + 1])])
    outs = [b.conv(t, inner, outc, 3, act=None, bias=False) for t in lat]
    outs = [b.resize2x(o, 2 ** i) if i else o for i, o in enumerate(outs)]
    fuse = b.op("Concat", outs[::-1], axis=1)              # 4 * 24 channels at stride 4
    h = b.conv(fuse, 4 * outc, outc, 3, act="relu")
    h = b.op("ConvTranspose", [h, b.weight(outc, outc, 2, 2, fan_in=outc), b.const(np.zeros(outc, np.float32))],
             strides=[2, 2], kernel_shape=[2, 2])
    h = b.act(h, "relu")
    h = b.op("ConvTranspose", [h, b.weight(outc, 1, 2, 2, fan_in=outc), b.const(np.zeros(1, np.float32))],
             strides=[2, 2], kernel_shape=[2, 2])
    prob = b.op("Sigmoid", [h])
    feeds = {"x": b.rng.uniform(-1, 1, (1, 3) + hw).astype(np.float32)}
    return b.model(feeds, [prob], name="db_detector"), feeds


# ---------------------------------------------------------------- SVTR recognizer
def _layer_norm_decomposed(b: _Builder, x: str, dim: int) -> str:
    ax = b.i64(-1)
    m = b.op("ReduceMean", [x, ax], keepdims=1)
    d = b.op("Sub", [x, m])
    v = b.op("ReduceMean", [b.op("Pow", [d, b.f32(2.0)]), ax], keepdims=1)
    n = b.op("Div", [d, b.op("Sqrt", [b.op("Add", [v, b.f32(1e-6)])])])
    g = b.const((1 + 0.1 * b.rng.standard_normal(dim)).astype(np.float32), "ln_g")
    return b.op("Add", [b.op("Mul", [n, g]), b.const((0.1 * b.rng.standard_normal(dim)).astype(np.float32))])


def _window_mask(h: int, w: int, kh: int, kw: int) -> np.ndarray:
    """Additive attention mask of SVTR's local mixing: token i sees tokens within a kh x kw window."""
    ys, xs = np.divmod(np.arange(h * w), w)
    near = (np.abs(ys[:, None] - ys[None, :]) <= kh // 2) & (np.abs(xs[:, None] - xs[None, :]) <= kw // 2)
    return np.where(near, 0.0, -1e4).astype(np.float32)[None, None]


def _svtr_block(b: _Builder, x: str, n: int, dim: int, heads: int, mask: Optional[np.ndarray]) -> str:
    dh = dim // heads
    h = _layer_norm_decomposed(b, x, dim)
    qkv = b.linear(h, dim, 3 * dim)
    qkv = b.op("Transpose", [b.op("Reshape", [qkv, b.i64(0, n, 3, heads, dh)])], perm=[2, 0, 3, 1, 4])
    q, k, v = [b.op("Squeeze", [t, b.i64(0)]) for t in b.op("Split", [qkv], n_out=3, axis=0, num_outputs=3)]
    s = b.op("MatMul", [b.op("Mul", [q, b.f32(dh ** -0.5)]), b.op("Transpose", [k], perm=[0, 1, 3, 2])])
    if mask is not None:
        s = b.op("Add", [s, b.const(mask, "mask")])
    a = b.op("MatMul", [b.op("Softmax", [s], axis=-1), v])
    a = b.op("Reshape", [b.op("Transpose", [a], perm=[0, 2, 1, 3]), b.i64(0, n, dim)])
    x = b.op("Add", [x, b.linear(a, dim, dim)])
    h = _layer_norm_decomposed(b, x, dim)
    h = b.linear(b.act(b.linear(h, dim, 4 * dim), "gelu"), 4 * dim, dim)
    return b.op("Add", [x, h])


def svtr_recognizer(size: str = "bench"):
    """SVTR-T: dims 64/128/256, heads 2/4/8, blocks 3/6/3 (local, local, global mixing) on a 32x100 text line."""
    b = _Builder(3)
    hw = (32, 100) if size == "bench" else (32, 40)
    h, w = hw[0] // 4, hw[1] // 4
    y = b.conv(b.conv("x", 3, 32, 3, 2, act="gelu"), 32, 64, 3, 2, act="gelu")
    dims, heads, depth, local = (64, 128, 256), (2, 4, 8), (3, 6, 3), (True, True, False)
    for stage in range(3):
        dim = dims[stage]
        n = h * w
        t = b.op("Transpose", [b.op("Reshape", [y, b.i64(0, dim, n)])], perm=[0, 2, 1])     # (1, n, dim)
        mask = _window_mask(h, w, 7, 11) if local[stage] else None
        for _ in range(depth[stage]):
            t = _svtr_block(b, t, n, dim, heads[stage], mask)
        y = b.op("Reshape", [b.op("Transpose", [t], perm=[0, 2, 1]), b.i64(0, dim, h, w)])
        if stage < 2:                                   # merging: halve the height, widen the channels
            y = b.conv(y, dim, dims[stage + 1], 3, (2, 1), act=None)
            h = (h + 1) // 2
            t = b.op("Transpose", [b.op("Reshape", [y, b.i64(0, dims[stage + 1], h * w)])], perm=[0, 2, 1])
            t = _layer_norm_decomposed(b, t, dims[stage + 1])
            y = b.op("Reshape", [b.op("Transpose", [t], perm=[0, 2, 1]), b.i64(0, dims[stage + 1], h, w)])
    pooled = b.op("ReduceMean", [y, b.i64(2)], keepdims=0)                               # (1, 256, w)
    seq = b.op("Transpose", [pooled], perm=[0, 2, 1])
    feat = b.act(b.linear(seq, 256, 192), "hardswish")
    probs = b.op("Softmax", [b.linear(feat, 192, 37)], axis=-1)
    feeds = {"x": b.rng.uniform(-1, 1, (1, 3) + hw).astype(np.float32)}
    return b.model(feeds, [probs], name="svtr_recognizer"), feeds


# ---------------------------------------------------------------- YOLOv8n
def _c2f(b: _Builder, x: str, cin: int, cout: int, n: int, shortcut: bool) -> str:
    c = cout // 2
    y = b.conv(x, cin, 2 * c, 1, act="silu")
    parts = list(b.op("Split", [y, b.i64(c, c)], n_out=2, axis=1))
    for _ in range(n):
        h = b.conv(b.conv(parts[-1], c, c, 3, act="silu"), c, c, 3, act="silu")
        parts.append(b.op("Add", [parts[-1], h]) if shortcut else h)
    return b.conv(b.op("Concat", parts, axis=1), (2 + n) * c, cout, 1, act="silu")


def _sppf(b: _Builder, x: str, c: int) -> str:
    y = b.conv(x, c, c // 2, 1, act="silu")
    pools = [y]
    for _ in range(3):
        pools.append(b.op("MaxPool", [pools[-1]], kernel_shape=[5, 5], pads=[2, 2, 2, 2], strides=[1, 1]))
    return b.conv(b.op("Concat", pools, axis=1), 2 * c, c, 1, act="silu")


def _anchor_points(b: _Builder, h: int, w: int) -> str:
    """(1, 2, h*w) cell centres, as Range/Expand over the grid (folded once the shape is known)."""
    def centres(n: int) -> str:
        r = b.op("Range", [b.const(np.array(0, np.int64)), b.const(np.array(n, np.int64)),
                           b.const(np.array(1, np.int64))])
        return b.op("Add", [b.op("Cast", [r], to=1), b.f32(0.5)])
    xs, ys = centres(w), centres(h)
    gx = b.op("Expand", [b.op("Unsqueeze", [xs, b.i64(0)]), b.i64(h, w)])
    gy = b.op("Expand", [b.op("Unsqueeze", [ys, b.i64(1)]), b.i64(h, w)])
    g = b.op("Concat", [b.op("Unsqueeze", [gx, b.i64(0)]), b.op("Unsqueeze", [gy, b.i64(0)])], axis=0)
    return b.op("Reshape", [g, b.i64(1, 2, h * w)])


def yolov8_detector(size: str = "bench"):
    b = _Builder(4)
    hw = (640, 640) if size == "bench" else (64, 96)
    w = [16, 32, 64, 128, 256]
    y = b.conv("x", 3, w[0], 3, 2, act="silu")
    y = _c2f(b, b.conv(y, w[0], w[1], 3, 2, act="silu"), w[1], w[1], 1, True)
    p3 = _c2f(b, b.conv(y, w[1], w[2], 3, 2, act="silu"), w[2], w[2], 2, True)
    p4 = _c2f(b, b.conv(p3, w[2], w[3], 3, 2, act="silu"), w[3], w[3], 2, True)
    p5 = _sppf(b, _c2f(b, b.conv(p4, w[3], w[4], 3, 2, act="silu"), w[4], w[4], 1, True), w[4])
    n4 = _c2f(b, b.op("Concat", [b.resize2x(p5), p4], axis=1), w[4] + w[3], w[3], 1, False)
    o3 = _c2f(b, b.op("Concat", [b.resize2x(n4), p3], axis=1), w[3] + w[2], w[2], 1, False)
    o4 = _c2f(b, b.op("Concat", [b.conv(o3, w[2], w[2], 3, 2, act="silu"), n4], axis=1), w[2] + w[3], w[3], 1,
              False)
    o5 = _c2f(b, b.op("Concat", [b.conv(o4, w[3], w[3], 3, 2, act="silu"), p5], axis=1), w[3] + w[4], w[4], 1,
              False)
    reg_max, classes, c2, c3 = 16, 80, 64, 80
    levels, anchors, strides = [], [], []
    for feat, ch, stride in ((o3, w[2], 8), (o4, w[3], 16), (o5, w[4], 32)):
        box = b.conv(b.conv(b.conv(feat, ch, c2, 3, act="silu"), c2, c2, 3, act="silu"), c2, 4 * reg_max, 1,
                     act=None)
        cls = b.conv(b.conv(b.conv(feat, ch, c3, 3, act="silu"), c3, c3, 3, act="silu"), c3, classes, 1, act=None)
        levels.append(b.op("Reshape", [b.op("Concat", [box, cls], axis=1), b.i64(1, 4 * reg_max + classes, -1)]))
        gh, gw = hw[0] // stride, hw[1] // stride
        anchors.append(_anchor_points(b, gh, gw))
        strides.append(b.const(np.full((1, 1, gh * gw), stride, np.float32), "stride"))
    out = b.op("Concat", levels, axis=2)
    anchor = b.op("Concat", anchors, axis=2)
    stride = b.op("Concat", strides, axis=2)
    box, cls = b.op("Split", [out, b.i64(4 * reg_max, classes)], n_out=2, axis=1)
    dist = b.op("Transpose", [b.op("Reshape", [box, b.i64(1, 4, reg_max, -1)])], perm=[0, 2, 1, 3])
    dfl = b.const(np.arange(reg_max, dtype=np.float32).reshape(1, reg_max, 1, 1), "dfl")
    dist = b.op("Reshape", [b.op("Conv", [b.op("Softmax", [dist], axis=1), dfl]), b.i64(1, 4, -1)])
    lt, rb = b.op("Split", [dist, b.i64(2, 2)], n_out=2, axis=1)
    x1y1, x2y2 = b.op("Sub", [anchor, lt]), b.op("Add", [anchor, rb])
    cxy = b.op("Div", [b.op("Add", [x1y1, x2y2]), b.f32(2.0)])
    boxes = b.op("Mul", [b.op("Concat", [cxy, b.op("Sub", [x2y2, x1y1])], axis=1), stride])
    y = b.op("Concat", [boxes, b.op("Sigmoid", [cls])], axis=1)
    feeds = {"x": b.rng.uniform(0, 1, (1, 3) + hw).astype(np.float32)}
    return b.model(feeds, [y], name="yolov8_detector"), feeds


# ---------------------------------------------------------------- YOLOX-tiny
def _csp(b: _Builder, x: str, cin: int, cout: int, n: int, shortcut: bool) -> str:
    hid = cout // 2
    x1 = b.conv(x, cin, hid, 1, act="silu")
    x2 = b.conv(x, cin, hid, 1, act="silu")
    for _ in range(n):
        h = b.conv(b.conv(x1, hid, hid, 1, act="silu"), hid, hid, 3, act="silu")
        x1 = b.op("Add", [x1, h]) if shortcut else h
    return b.conv(b.op("Concat", [x1, x2], axis=1), 2 * hid, cout, 1, act="silu")


def yolox_detector(size: str = "bench"):
    b = _Builder(5)
    hw = (416, 416) if size == "bench" else (64, 96)
    h, w = hw
    # Focus: the four pixel phases side by side in channels (strided Slice, as the exporter writes it)
    phases = []
    for dy, dx in ((0, 0), (1, 0), (0, 1), (1, 1)):
        phases.append(b.op("Slice", ["x", b.i64(dy, dx), b.i64(h, w), b.i64(2, 3), b.i64(2, 2)]))
    c = [24, 48, 96, 192, 384]
    y = b.conv(b.op("Concat", phases, axis=1), 12, c[0], 3, act="silu")
    d2 = _csp(b, b.conv(y, c[0], c[1], 3, 2, act="silu"), c[1], c[1], 1, True)
    d3 = _csp(b, b.conv(d2, c[1], c[2], 3, 2, act="silu"), c[2], c[2], 3, True)
    d4 = _csp(b, b.conv(d3, c[2], c[3], 3, 2, act="silu"), c[3], c[3], 3, True)
    d5 = b.conv(d4, c[3], c[4], 3, 2, act="silu")
    s = b.conv(d5, c[4], c[4] // 2, 1, act="silu")        # SPP
    pools = [s] + [b.op("MaxPool", [s], kernel_shape=[k, k], pads=[k // 2] * 4, strides=[1, 1]) for k in (5, 9, 13)]
    d5 = _csp(b, b.conv(b.op("Concat", pools, axis=1), 2 * c[4], c[4], 1, act="silu"), c[4], c[4], 1, False)
    f0 = b.conv(d5, c[4], c[3], 1, act="silu")
    f_out0 = _csp(b, b.op("Concat", [b.resize2x(f0), d4], axis=1), 2 * c[3], c[3], 1, False)
    f1 = b.conv(f_out0, c[3], c[2], 1, act="silu")
    out0 = _csp(b, b.op("Concat", [b.resize2x(f1), d3], axis=1), 2 * c[2], c[2], 1, False)
    out1 = _csp(b, b.op("Concat", [b.conv(out0, c[2], c[2], 3, 2, act="silu"), f1], axis=1), 2 * c[2], c[3], 1,
                False)
    out2 = _csp(b, b.op("Concat", [b.conv(out1, c[3], c[3], 3, 2, act="silu"), f0], axis=1), 2 * c[3], c[4], 1,
                False)
    hc, classes, outs = 96, 80, []
    for feat, ch in ((out0, c[2]), (out1, c[3]), (out2, c[4])):
        stem = b.conv(feat, ch, hc, 1, act="silu")
        cf = b.conv(b.conv(stem, hc, hc, 3, act="silu"), hc, hc, 3, act="silu")
        rf = b.conv(b.conv(stem, hc, hc, 3, act="silu"), hc, hc, 3, act="silu")
        reg = b.conv(rf, hc, 4, 1, act=None)
        obj = b.op("Sigmoid", [b.conv(rf, hc, 1, 1, act=None)])
        cls = b.op("Sigmoid", [b.conv(cf, hc, classes, 1, act=None)])
        outs.append(b.op("Reshape", [b.op("Concat", [reg, obj, cls], axis=1), b.i64(1, 5 + classes, -1)]))
    y = b.op("Transpose", [b.op("Concat", outs, axis=2)], perm=[0, 2, 1])
    feeds = {"x": b.rng.uniform(0, 1, (1, 3) + hw).astype(np.float32)}
    return b.model(feeds, [y], name="yolox_detector"), feeds


# ---------------------------------------------------------------- PicoDet layout detector
_LCNET = [(3, 16, 32, 1, False), (3, 32, 64, 2, False), (3, 64, 64, 1, False), (3, 64, 128, 2, False),
          (3, 128, 128, 1, False), (3, 128, 256, 2, False)] + [(5, 256, 256, 1, False)] * 5 + \
         [(5, 256, 512, 2, True), (5, 512, 512, 1, True)]


def picodet_layout(size: str = "bench"):
    """picodet_lcnet_x1_0_layout: LCNet x1.0, a 128-channel PAN over strides 8..64, GFL heads (5 classes)."""
    b = _Builder(6)
    hw = (800, 608) if size == "bench" else (64, 64)
    y = b.conv("x", 3, 16, 3, 2, act="hardswish")
    feats = []
    for i, (k, cin, cout, stride, se) in enumerate(_LCNET):
        y = b.conv(y, cin, cin, k, stride, group=cin, act="hardswish")
        if se:
            y = b.se(y, cin, cin // 4, pool="gap")
        y = b.conv(y, cin, cout, 1, act="hardswish")
        if i in (4, 10, 12):                               # strides 8, 16, 32
            feats.append((y, cout))
    nc = 128
    lat = [b.conv(f, ch, nc, 1, act="hardswish") for f, ch in feats]
    for i in (1, 0):                                       # top-down
        up = b.resize2x(lat[i + 1])
        cat = b.op("Concat", [up, lat[i]], axis=1)
        lat[i] = b.conv(b.conv(cat, 2 * nc, 2 * nc, 5, group=2 * nc, act="hardswish"), 2 * nc, nc, 1,
                        act="hardswish")
    for i in (1, 2):                                       # bottom-up
        down = b.conv(b.conv(lat[i - 1], nc, nc, 5, 2, group=nc, act="hardswish"), nc, nc, 1, act="hardswish")
        cat = b.op("Concat", [down, lat[i]], axis=1)
        lat[i] = b.conv(b.conv(cat, 2 * nc, 2 * nc, 5, group=2 * nc, act="hardswish"), 2 * nc, nc, 1,
                        act="hardswish")
    lat.append(b.conv(b.conv(lat[2], nc, nc, 5, 2, group=nc, act="hardswish"), nc, nc, 1, act="hardswish"))
    classes, reg_max = 5, 7
    scores, boxes = [], []
    proj = b.const(np.arange(reg_max + 1, dtype=np.float32).reshape(reg_max + 1, 1), "proj")
    for feat in lat:
        h = feat
        for _ in range(2):
            h = b.conv(b.conv(h, nc, nc, 5, group=nc, act="hardswish"), nc, nc, 1, act="hardswish")
        out = b.conv(h, nc, classes + 4 * (reg_max + 1), 1, act=None)
        cls, reg = b.op("Split", [out, b.i64(classes, 4 * (reg_max + 1))], n_out=2, axis=1)
        scores.append(b.op("Reshape", [b.op("Sigmoid", [cls]), b.i64(1, classes, -1)]))
        dist = b.op("Softmax", [b.op("Reshape", [b.op("Transpose", [b.op("Reshape", [reg, b.i64(1, 4 * (reg_max + 1),
                                                                                              -1)])],
                                                               perm=[0, 2, 1]), b.i64(1, -1, 4, reg_max + 1)])],
                    axis=-1)
        boxes.append(b.op("Reshape", [b.op("MatMul", [dist, proj]), b.i64(1, -1, 4)]))
    y_s = b.op("Concat", scores, axis=2)
    y_b = b.op("Concat", boxes, axis=1)
    feeds = {"x": b.rng.uniform(0, 1, (1, 3) + hw).astype(np.float32)}
    return b.model(feeds, [y_s, y_b], name="picodet_layout"), feeds


# ---------------------------------------------------------------- CRNN
def _lstm(b: _Builder, x: str, nin: int, hid: int, direction: str, h0: str = "", c0: str = "") -> Tuple[str, ...]:
    d = 2 if direction == "bidirectional" else 1
    s = 1 / np.sqrt(hid)
    W = b.const((b.rng.uniform(-s, s, (d, 4 * hid, nin))).astype(np.float32), "W")
    R = b.const((b.rng.uniform(-s, s, (d, 4 * hid, hid))).astype(np.float32), "R")
    B = b.const((b.rng.uniform(-s, s, (d, 8 * hid))).astype(np.float32), "B")
    ins = [x, W, R, B] + (["", h0, c0] if h0 else [])
    return b.op("LSTM", ins, n_out=3, hidden_size=hid, direction=direction)


def _crnn(b: _Builder, size: str) -> Tuple[Feeds, str]:
    """A CRNN (chineseocr-lite style): VGG convs on a 32-pixel line, 2 x BiLSTM(256 -> 2 x 128), 6625 classes."""
    hw = (32, 320) if size == "bench" else (32, 48)
    classes = 6625 if size == "bench" else 97
    y = b.op("MaxPool", [b.conv("x", 3, 32, 3)], kernel_shape=[2, 2], strides=[2, 2])
    y = b.op("MaxPool", [b.conv(y, 32, 64, 3)], kernel_shape=[2, 2], strides=[2, 2])
    y = b.op("MaxPool", [b.conv(b.conv(y, 64, 128, 3), 128, 128, 3)], kernel_shape=[2, 1], strides=[2, 1])
    y = b.op("MaxPool", [b.conv(b.conv(y, 128, 256, 3), 256, 256, 3)], kernel_shape=[2, 1], strides=[2, 1])
    y = b.op("MaxPool", [y], kernel_shape=[2, 1], strides=[2, 1])                    # (1, 256, 1, W/4)
    seq = b.op("Transpose", [b.op("Squeeze", [y, b.i64(2)])], perm=[2, 0, 1])           # (T, 1, 256)
    t = hw[1] // 4
    for _ in range(2):
        Y = _lstm(b, seq, 256, 128, "bidirectional")[0]                               # (T, 2, 1, 128)
        seq = b.op("Reshape", [b.op("Transpose", [Y], perm=[0, 2, 1, 3]), b.i64(t, 1, 256)])
    logits = b.linear(b.op("Reshape", [seq, b.i64(t, 256)]), 256, classes)
    probs = b.op("Softmax", [logits], axis=-1)
    feeds = {"x": b.rng.uniform(-1, 1, (1, 3) + hw).astype(np.float32)}
    return feeds, probs


def crnn_recognizer(size: str = "bench"):
    b = _Builder(7)
    feeds, probs = _crnn(b, size)
    return b.model(feeds, [probs], name="crnn_recognizer", opset=14), feeds


def _quantize_int8(w: np.ndarray, axis: Optional[int] = None) -> Tuple[np.ndarray, np.ndarray]:
    """quantize_dynamic's weights: symmetric int8 in [-127, 127], zero point 0, one scale (per ``axis`` slice)."""
    amax = np.abs(w).max() if axis is None else np.abs(w).reshape(w.shape[axis], -1).max(axis=1)
    scale = (np.asarray(amax, np.float32) / np.float32(127)).astype(np.float32)
    shaped = scale if axis is None else scale.reshape((-1,) + (1,) * (w.ndim - 1))
    return np.clip(np.rint(w / shaped), -127, 127).astype(np.int8), scale


def _quantize_dynamic(b: _Builder) -> None:
    """Rewrites the builder's Conv, MatMul (constant weight) and LSTM nodes the way onnxruntime's
    ``quantize_dynamic(weight_type=QInt8)`` does (onnxruntime 1.x, default options): each activation through its
    own ``DynamicQuantizeLinear``; ``ConvInteger``/``MatMulInteger`` on int8 weights with zero point 0, ``Cast``
    to float and ``Mul`` by ``x_scale * w_scale``, the conv bias added after (reshaped to (1, C, 1, ...));
    ``DynamicQuantizeLSTM`` with W and R transposed to [D, in, 4H] and one scale per direction."""
    from onnx import helper

    nodes, b.nodes = b.nodes, []
    for n in nodes:
        ins = list(n.input)
        attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
        if n.op_type == "LSTM":
            w, r = b.inits.pop(ins[1]), b.inits.pop(ins[2])
            qw, sw = _quantize_int8(w.transpose(0, 2, 1), axis=0)
            qr, sr = _quantize_int8(r.transpose(0, 2, 1), axis=0)
            zp = np.zeros(w.shape[0], np.int8)
            q_ins = [ins[0], b.const(qw, "W_q"), b.const(qr, "R_q"), ins[3] if len(ins) > 3 else ""]
            q_ins += (ins[4:8] + [""] * 4)[:4]
            q_ins += [b.const(sw, "W_s"), b.const(zp, "W_zp"), b.const(sr, "R_s"), b.const(zp.copy(), "R_zp")]
            b.nodes.append(helper.make_node("DynamicQuantizeLSTM", q_ins, list(n.output), name=n.name,
                                            domain="com.microsoft", **attrs))
            continue
        if n.op_type not in ("Conv", "MatMul") or ins[1] not in b.inits:
            b.nodes.append(n)
            continue
        xq, xs, xzp = b.op("DynamicQuantizeLinear", [ins[0]], n_out=3)
        qw, sw = _quantize_int8(b.inits.pop(ins[1]))
        wq, ws, wzp = b.const(qw, "w_q"), b.const(sw, "w_s"), b.const(np.array(0, np.int8), "w_zp")
        scale = b.op("Mul", [xs, ws])
        if n.op_type == "Conv":
            acc = b.op("ConvInteger", [xq, wq, xzp, wzp], **attrs)
        else:
            acc = b.op("MatMulInteger", [xq, wq, xzp, wzp])
        scaled = [b.op("Cast", [acc], to=1), scale]
        if len(ins) > 2:
            bias = b.op("Reshape", [ins[2], b.i64(1, -1, *([1] * (qw.ndim - 2)))])
            b.nodes.append(helper.make_node("Add", [b.op("Mul", scaled), bias], list(n.output), name=n.name))
        else:
            b.nodes.append(helper.make_node("Mul", scaled, list(n.output), name=n.name))


def crnn_dynquant(size: str = "bench"):
    """``crnn_recognizer`` (the same weights) after onnxruntime's dynamic quantization: every conv, the LSTMs and
    the classifier on int8 weights and activations quantized at run time."""
    b = _Builder(7)
    feeds, probs = _crnn(b, size)
    _quantize_dynamic(b)
    return b.model(feeds, [probs], name="crnn_dynquant", opset=14), feeds


# ---------------------------------------------------------------- voice-activity detector
def vad(size: str = "bench"):
    """Silero-VAD-like: STFT (n_fft 256, hop 128) as a 1-D conv, |.|, a 1-D conv encoder (129 -> 16 -> 32 -> 32
    -> 64, strides 1/2/2/1), two LSTM(64) with state in and out, decoder conv + Sigmoid, mean over time; an If
    on the chunk's energy gives the probability or zero."""
    from onnx import helper

    b = _Builder(8)
    samples = 1536 if size == "bench" else 512
    hid, nfft, hop = 64, 256, 128
    audio = b.op("Unsqueeze", ["audio", b.i64(1)])                                       # (1, 1, samples)
    audio = b.op("Pad", [audio, b.i64(0, 0, 64, 0, 0, 64)], mode="reflect")
    k = np.arange(nfft // 2 + 1)[:, None] * np.arange(nfft)[None, :] * 2 * np.pi / nfft
    win = np.hanning(nfft + 1)[:-1]
    basis = np.concatenate([np.cos(k) * win, -np.sin(k) * win])[:, None, :].astype(np.float32)
    spec = b.op("Conv", [audio, b.const(basis, "stft")], strides=[hop])                  # (1, 258, frames)
    re, im = b.op("Split", [spec, b.i64(129, 129)], n_out=2, axis=1)
    mag = b.op("Sqrt", [b.op("Add", [b.op("Mul", [re, re]), b.op("Mul", [im, im])])])
    y = mag
    for cin, cout, stride in ((129, 16, 1), (16, 32, 2), (32, 32, 2), (32, 64, 1)):
        y = b.conv(y, cin, cout, 3, stride, act="relu", dims=1)
    seq = b.op("Transpose", [y], perm=[2, 0, 1])                                         # (frames, 1, 64)
    hs, cs = b.op("Split", ["h", b.i64(1, 1)], n_out=2, axis=0), b.op("Split", ["c", b.i64(1, 1)], n_out=2, axis=0)
    h_out, c_out = [], []
    for layer in range(2):
        Y, hn, cn = _lstm(b, seq, hid, hid, "forward", hs[layer], cs[layer])
        seq = b.op("Squeeze", [Y, b.i64(1)])
        h_out.append(hn)
        c_out.append(cn)
    dec = b.op("Transpose", [b.op("Relu", [seq])], perm=[1, 2, 0])                      # (1, 64, frames)
    prob = b.op("Sigmoid", [b.conv(dec, hid, 1, 1, act=None, dims=1)])
    prob = b.op("ReduceMean", [prob, b.i64(2)], keepdims=0)                               # (1, 1)
    energy = b.op("ReduceMean", [b.op("Mul", ["audio", "audio"])], keepdims=0)
    loud = b.op("Greater", [energy, b.f32(1e-4)])
    zero = b.f32(np.zeros((1, 1)))
    then_g = helper.make_graph([helper.make_node("Identity", [prob], ["p_then"])], "loud", [],
                               [helper.make_tensor_value_info("p_then", 1, None)])
    else_g = helper.make_graph([helper.make_node("Mul", [prob, zero], ["p_else"])], "quiet", [],
                               [helper.make_tensor_value_info("p_else", 1, None)])
    out = b.op("If", [loud], then_branch=then_g, else_branch=else_g)
    h_n = b.op("Concat", h_out, axis=0)
    c_n = b.op("Concat", c_out, axis=0)
    feeds = {"audio": (b.rng.standard_normal((1, samples)) * 0.1).astype(np.float32),
             "h": (b.rng.standard_normal((2, 1, hid)) * 0.5).astype(np.float32),
             "c": (b.rng.standard_normal((2, 1, hid)) * 0.5).astype(np.float32)}
    return b.model(feeds, [out, h_n, c_n], name="vad"), feeds


# ---------------------------------------------------------------- transformer encoder
def transformer_encoder(size: str = "bench"):
    """nn.TransformerEncoder(d_model 128, nhead 4, dim_feedforward 512, GELU, batch_first, 2 layers), as the
    TorchScript exporter writes it (opset 17: LayerNormalization, Erf-based GELU)."""
    b = _Builder(9)
    seq, d, heads, ff = (64, 128, 4, 512)
    if size != "bench":
        seq = 16
    dh = d // heads
    x = "x"
    for _ in range(2):
        q, k, v = [b.op("Transpose", [b.op("Reshape", [b.linear(x, d, d), b.i64(1, seq, heads, dh)])],
                        perm=[0, 2, 1, 3]) for _ in range(3)]
        s = b.op("MatMul", [b.op("Mul", [q, b.f32(dh ** -0.5)]), b.op("Transpose", [k], perm=[0, 1, 3, 2])])
        a = b.op("MatMul", [b.op("Softmax", [s], axis=-1), v])
        a = b.op("Reshape", [b.op("Transpose", [a], perm=[0, 2, 1, 3]), b.i64(1, seq, d)])
        x = b.op("Add", [x, b.linear(a, d, d)])
        g1, b1 = [b.const((1 + 0.1 * b.rng.standard_normal(d) * i).astype(np.float32)) for i in (1, 0)]
        x = b.op("LayerNormalization", [x, g1, b1], axis=-1, epsilon=1e-5)
        h = b.linear(b.act(b.linear(x, d, ff), "gelu"), ff, d)
        x = b.op("Add", [x, h])
        g2, b2 = [b.const((1 + 0.1 * b.rng.standard_normal(d) * i).astype(np.float32)) for i in (1, 0)]
        x = b.op("LayerNormalization", [x, g2, b2], axis=-1, epsilon=1e-5)
    feeds = {"x": b.rng.standard_normal((1, seq, d)).astype(np.float32)}
    return b.model(feeds, [x], name="transformer_encoder", opset=17), feeds


# ---------------------------------------------------------------- EfficientNet-B0
# expand ratio, kernel, stride, in, out, repeats (torchvision's efficientnet_b0)
_EFFNET_B0 = [(1, 3, 1, 32, 16, 1), (6, 3, 2, 16, 24, 2), (6, 5, 2, 24, 40, 2), (6, 3, 2, 40, 80, 3),
              (6, 5, 1, 80, 112, 3), (6, 5, 2, 112, 192, 4), (6, 3, 1, 192, 320, 1)]


def efficientnet_b0(size: str = "bench"):
    """EfficientNet-B0 as torch.onnx writes it: Conv-BN folded, SiLU as x * Sigmoid(x), squeeze-excite of
    GlobalAveragePool, 1x1 conv, SiLU, 1x1 conv, Sigmoid and Mul (squeeze to a quarter of the block's input)."""
    b = _Builder(10)
    hw = (224, 224) if size == "bench" else (64, 64)
    y = b.conv("x", 3, 32, 3, 2, act="silu")
    for expand, k, stride, cin, cout, repeats in _EFFNET_B0:
        for i in range(repeats):
            c_in, s = (cin, stride) if i == 0 else (cout, 1)
            exp = c_in * expand
            h = b.conv(y, c_in, exp, 1, act="silu") if expand != 1 else y
            h = b.conv(h, exp, exp, k, s, group=exp, act="silu")
            sq = b.conv(b.op("GlobalAveragePool", [h]), exp, max(1, c_in // 4), 1, act="silu")
            h = b.op("Mul", [h, b.op("Sigmoid", [b.conv(sq, max(1, c_in // 4), exp, 1, act=None)])])
            h = b.conv(h, exp, cout, 1, act=None)
            y = b.op("Add", [h, y]) if s == 1 and c_in == cout else h
    y = b.conv(y, 320, 1280, 1, act="silu")
    y = b.op("Flatten", [b.op("GlobalAveragePool", [y])], axis=1)
    y = b.linear(y, 1280, 1000)
    feeds = {"x": b.rng.uniform(-1, 1, (1, 3) + hw).astype(np.float32)}
    return b.model(feeds, [y], name="efficientnet_b0"), feeds


# ---------------------------------------------------------------- MobileViT-XS
def _layer_norm(b: _Builder, x: str, dim: int, eps: float = 1e-5) -> str:
    g = b.const((1 + 0.1 * b.rng.standard_normal(dim)).astype(np.float32), "ln_g")
    beta = b.const((0.1 * b.rng.standard_normal(dim)).astype(np.float32), "ln_b")
    return b.op("LayerNormalization", [x, g, beta], axis=-1, epsilon=eps)


def _attention(b: _Builder, x: str, batch: int, n: int, dim: int, heads: int) -> str:
    """Multi-head self-attention over (batch, n, dim) as torch.onnx writes it: q, k, v projections, heads split
    by Reshape/Transpose, scaled scores, Softmax, heads merged, output projection."""
    dh = dim // heads
    q, k, v = [b.op("Transpose", [b.op("Reshape", [b.linear(x, dim, dim), b.i64(batch, n, heads, dh)])],
                    perm=[0, 2, 1, 3]) for _ in range(3)]
    s = b.op("MatMul", [b.op("Mul", [q, b.f32(dh ** -0.5)]), b.op("Transpose", [k], perm=[0, 1, 3, 2])])
    a = b.op("MatMul", [b.op("Softmax", [s], axis=-1), v])
    a = b.op("Reshape", [b.op("Transpose", [a], perm=[0, 2, 1, 3]), b.i64(batch, n, dim)])
    return b.linear(a, dim, dim)


def _mv2(b: _Builder, x: str, cin: int, cout: int, stride: int, expand: int = 4) -> str:
    h = b.conv(x, cin, cin * expand, 1, act="silu")
    h = b.conv(h, cin * expand, cin * expand, 3, stride, group=cin * expand, act="silu")
    h = b.conv(h, cin * expand, cout, 1, act=None)
    return b.op("Add", [x, h]) if stride == 1 and cin == cout else h


def _mobilevit_block(b: _Builder, x: str, c: int, d: int, layers: int, hw: Tuple[int, int]) -> str:
    """Local 3x3 + 1x1 conv to ``d``; unfold into 2x2 patches as (4, N, d) (HF MobileViT's Reshape/Transpose
    chain); ``layers`` pre-norm transformer layers (4 heads, SiLU MLP of 2d); fold back; 1x1 conv to ``c``,
    Concat with the block's input and a 3x3 conv."""
    h, w = hw
    nh, nw = h // 2, w // 2
    n = nh * nw
    y = b.conv(b.conv(x, c, c, 3, act="silu"), c, d, 1, act=None, bias=False)
    t = b.op("Transpose", [b.op("Reshape", [y, b.i64(d * nh, 2, nw, 2)])], perm=[0, 2, 1, 3])
    t = b.op("Transpose", [b.op("Reshape", [t, b.i64(1, d, n, 4)])], perm=[0, 3, 2, 1])
    t = b.op("Reshape", [t, b.i64(4, n, d)])
    for _ in range(layers):
        t = b.op("Add", [t, _attention(b, _layer_norm(b, t, d), 4, n, d, 4)])
        m = b.linear(b.act(b.linear(_layer_norm(b, t, d), d, 2 * d), "silu"), 2 * d, d)
        t = b.op("Add", [t, m])
    t = _layer_norm(b, t, d)
    t = b.op("Transpose", [b.op("Reshape", [t, b.i64(1, 4, n, d)])], perm=[0, 3, 2, 1])
    t = b.op("Transpose", [b.op("Reshape", [t, b.i64(d * nh, nw, 2, 2)])], perm=[0, 2, 1, 3])
    y = b.conv(b.op("Reshape", [t, b.i64(1, d, h, w)]), d, c, 1, act="silu")
    return b.conv(b.op("Concat", [x, y], axis=1), 2 * c, c, 3, act="silu")


def mobilevit_xs(size: str = "bench"):
    """MobileViT-XS (apple/mobilevit-x-small): channels 16/32/48/64/80/96, transformer dims 96/120/144 with
    2/4/3 layers, MV2 expansion 4, 1000 classes, at 256x256."""
    b = _Builder(11)
    hw = (256, 256) if size == "bench" else (64, 64)
    h, w = hw[0] // 2, hw[1] // 2
    y = b.conv("x", 3, 16, 3, 2, act="silu")
    y = _mv2(b, y, 16, 32, 1)
    y = _mv2(b, _mv2(b, _mv2(b, y, 32, 48, 2), 48, 48, 1), 48, 48, 1)
    h, w = h // 2, w // 2
    for cin, c, d, layers in ((48, 64, 96, 2), (64, 80, 120, 4), (80, 96, 144, 3)):
        y = _mv2(b, y, cin, c, 2)
        h, w = h // 2, w // 2
        # one transformer layer per block at the test size: the repeats add compile time, not coverage
        y = _mobilevit_block(b, y, c, d, layers if size == "bench" else 1, (h, w))
    y = b.conv(y, 96, 384, 1, act="silu")
    y = b.op("Flatten", [b.op("GlobalAveragePool", [y])], axis=1)
    y = b.linear(y, 384, 1000)
    feeds = {"x": b.rng.uniform(0, 1, (1, 3) + hw).astype(np.float32)}
    return b.model(feeds, [y], name="mobilevit_xs", opset=17), feeds


# ---------------------------------------------------------------- wav2vec2 encoder
def wav2vec2_encoder(size: str = "bench"):
    """wav2vec2-base's structure, narrower (hidden 384, 6 heads, feed-forward 1536, 4 layers): the feature
    extractor of seven bias-free Conv1d (512 channels, kernels 10,3,3,3,3,2,2, strides 5,2,2,2,2,2,2), GroupNorm
    (512 groups) after the first as torch writes it (Reshape, InstanceNormalization, Reshape, Mul, Add), Erf
    GELU; LayerNorm and the feature projection; the positional conv (kernel 128, 16 groups, the padding's extra
    frame sliced off, GELU) added; LayerNorm; post-norm transformer layers. 1 s of 16 kHz audio."""
    b = _Builder(12)
    samples = 16000 if size == "bench" else 3200
    hidden, heads, ff, layers, c = 384, 6, 1536, 4, 512
    y = b.op("Unsqueeze", ["audio", b.i64(1)])                                           # (1, 1, samples)
    length = samples
    for i, (k, s) in enumerate(zip((10, 3, 3, 3, 3, 2, 2), (5, 2, 2, 2, 2, 2, 2))):
        y = b.conv(y, 1 if i == 0 else c, c, k, s, act=None, pad=[0, 0], dims=1, bias=False)
        length = (length - k) // s + 1
        if i == 0:
            g = b.op("InstanceNormalization", [b.op("Reshape", [y, b.i64(1, c, -1)]),
                                               b.f32(np.ones(c)), b.f32(np.zeros(c))], epsilon=1e-5)
            y = b.op("Reshape", [g, b.i64(1, c, length)])
            y = b.op("Add", [b.op("Mul", [y, b.f32((1 + 0.1 * b.rng.standard_normal((c, 1))))]),
                             b.f32(0.1 * b.rng.standard_normal((c, 1)))])
        y = b.act(y, "gelu")
    t = _layer_norm(b, b.op("Transpose", [y], perm=[0, 2, 1]), c)                      # (1, frames, 512)
    t = b.linear(t, c, hidden)
    pos = b.conv(b.op("Transpose", [t], perm=[0, 2, 1]), hidden, hidden, 128, group=16, act=None, pad=[64, 64],
                 dims=1)
    pos = b.op("Slice", [pos, b.i64(0), b.i64(length), b.i64(2)])
    t = b.op("Add", [t, b.op("Transpose", [b.act(pos, "gelu")], perm=[0, 2, 1])])
    t = _layer_norm(b, t, hidden)
    for _ in range(layers):
        t = _layer_norm(b, b.op("Add", [t, _attention(b, t, 1, length, hidden, heads)]), hidden)
        t = _layer_norm(b, b.op("Add", [t, b.linear(b.act(b.linear(t, hidden, ff), "gelu"), ff, hidden)]), hidden)
    feeds = {"audio": (b.rng.standard_normal((1, samples)) * 0.1).astype(np.float32)}
    return b.model(feeds, [t], name="wav2vec2_encoder", opset=17), feeds



KINDS: Dict[str, Callable[..., tuple]] = {
    "db_detector": db_detector, "svtr_recognizer": svtr_recognizer, "yolov8_detector": yolov8_detector,
    "yolox_detector": yolox_detector, "picodet_layout": picodet_layout, "crnn_recognizer": crnn_recognizer,
    "vad": vad, "mobilenetv3_cls": mobilenetv3_cls, "transformer_encoder": transformer_encoder,
    "efficientnet_b0": efficientnet_b0, "mobilevit_xs": mobilevit_xs, "wav2vec2_encoder": wav2vec2_encoder,
    "crnn_dynquant": crnn_dynquant,
    # 3-D convolutions (tether.testing.volume_models)
    "r2plus1d_video": volume_models.r2plus1d, "unet3d": volume_models.unet3d,
}
