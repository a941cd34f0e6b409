"""The core graph ops' definitions: attributes, shape/dtype inference, numpy semantics and fusion pattern.

``DEFINITIONS`` (op name -> ``registry.OpDef``) holds them; ``tether.kernels.table`` puts them into the op table
beside the other op modules' (quantized, recurrent, loop). Each says
- ``pattern``: how the op fuses (see below);
- ``infer(attrs, in_types) -> [TensorType]``: static output types;
- ``ref(attrs, *arrays) -> [ndarray]``: the numpy meaning of the op, used by constant folding and by the
  reference interpreter that tests compare passes against.

Patterns, from most to least fusable:
- ``elemwise``: output element i depends only on input elements i (after broadcasting): fusable as an
  epilogue into any producer;
- ``alias``: a pure reinterpretation of the same bytes with another shape (reshape): no kernel at all, the
  executor gives the output a view of its input's storage;
- ``injective``: transpose, pad, concat ...: their own kernel;
- ``complex``: conv2d, dense, pools ...: their own kernel, which accepts elementwise epilogues;
- ``opaque``: softmax, lrn, batch_norm ...: their own kernel, nothing fused.
"""
from __future__ import annotations

from typing import Callable, Dict, Sequence, Tuple

import numpy as np

from tether.graph.ir import TensorType
from tether.kernels.registry import OpDef

DEFINITIONS: Dict[str, OpDef] = {}


def _register(name: str, pattern: str, infer: Callable, ref: Callable) -> None:
    if name in DEFINITIONS:
        raise ValueError("graph op %r is defined twice" % name)
    DEFINITIONS[name] = OpDef(name, pattern, infer, ref)


def _same(attrs, t, *rest):
    return [t]


def broadcast_shapes(*shapes: Sequence[int]) -> Tuple[int, ...]:
    return tuple(np.broadcast_shapes(*[tuple(s) for s in shapes]))


# ---------------------------------------------------------------- elementwise
def _f32(fn):
    """numpy ufuncs may upcast (e.g. float32 * python float); keep the input dtype."""
    def wrapped(attrs, x, *rest):
        return [np.asarray(fn(attrs, x, *rest)).astype(x.dtype, copy=False)]
    return wrapped


def _sigmoid(a, x):
    return 1.0 / (1.0 + np.exp(-x.astype(np.float64)))


UNARY = {
    "relu": lambda a, x: np.maximum(x, 0),
    "sigmoid": _sigmoid,
    "tanh": lambda a, x: np.tanh(x),
    "exp": lambda a, x: np.exp(x),
    "log": lambda a, x: np.log(x),
    "sqrt": lambda a, x: np.sqrt(x),
    "neg": lambda a, x: -x,
    "abs": lambda a, x: np.abs(x),
    "clip": lambda a, x: np.minimum(np.maximum(x, a.get("min", -np.inf)), a.get("max", np.inf)),
    "leaky_relu": lambda a, x: np.where(x >= 0, x, x * a.get("alpha", 0.01)),
    "hard_sigmoid": lambda a, x: np.clip(x * a.get("alpha", 0.2) + a.get("beta", 0.5), 0, 1),
    "hard_swish": lambda a, x: x * np.clip(x / 6.0 + 0.5, 0, 1),
    "scale_shift": lambda a, x: x * a.get("scale", 1.0) + a.get("shift", 0.0),
}
for _n, _fn in UNARY.items():
    _register(_n, "elemwise", _same, _f32(_fn))


def _binary_infer(attrs, a, b):
    return [TensorType(broadcast_shapes(a.shape, b.shape), a.dtype)]


def _int_trunc_div(a, b):
    """Integer division truncating toward zero (ONNX Div, C), exact for int64 (a float quotient is not)."""
    a, b = np.asarray(a), np.asarray(b)
    q = np.floor_divide(a, b)
    return q + ((q * b != a) & (q < 0))


BINARY = {
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "div": lambda a, b: (a / b) if np.issubdtype(np.asarray(a).dtype, np.floating) else _int_trunc_div(a, b),
    "maximum": np.maximum,
    "minimum": np.minimum,
    "pow": np.power,
}
for _n, _fn in BINARY.items():
    _register(_n, "elemwise", _binary_infer,
              (lambda fn: lambda attrs, a, b: [np.asarray(fn(a, b)).astype(a.dtype, copy=False)])(_fn))


# ---------------------------------------------------------------- shape ops
def _reshape_infer(attrs, x):
    shape = tuple(attrs["shape"])
    if int(np.prod(shape, dtype=np.int64)) != x.size:
        raise ValueError("reshape of %s to %s changes the element count" % (x, shape))
    return [TensorType(shape, x.dtype)]


_register("reshape", "alias", _reshape_infer, lambda attrs, x: [x.reshape(tuple(attrs["shape"]))])


def _transpose_infer(attrs, x):
    return [TensorType(tuple(x.shape[p] for p in attrs["axes"]), x.dtype)]


_register("transpose", "injective", _transpose_infer,
          lambda attrs, x: [np.asarray(np.transpose(x, attrs["axes"]), order="C")])


def _concat_infer(attrs, *xs):
    axis = attrs["axis"]
    shape = list(xs[0].shape)
    shape[axis] = sum(x.shape[axis] for x in xs)
    return [TensorType(tuple(shape), xs[0].dtype)]


_register("concat", "injective", _concat_infer, lambda attrs, *xs: [np.concatenate(xs, axis=attrs["axis"])])


def _pad_infer(attrs, x, *value):
    pads = attrs["pads"]
    n = len(x.shape)
    return [TensorType(tuple(x.shape[i] + pads[i] + pads[i + n] for i in range(n)), x.dtype)]


def _pad_ref(attrs, x, *value):
    # the pad value is an attribute, or a one-element tensor computed at run time (second input)
    fill = float(np.asarray(value[0]).reshape(-1)[0]) if value else attrs.get("value", 0.0)
    n = x.ndim
    pads = attrs["pads"]
    # negative pads crop
    sl = tuple(slice(max(-pads[i], 0), x.shape[i] - max(-pads[i + n], 0)) for i in range(n))
    x = x[sl]
    width = [(max(pads[i], 0), max(pads[i + n], 0)) for i in range(n)]
    mode = attrs.get("mode", "constant")
    if mode == "constant":
        return [np.pad(x, width, mode="constant", constant_values=fill).astype(x.dtype)]
    return [np.pad(x, width, mode={"reflect": "reflect", "edge": "edge"}[mode])]


_register("pad", "injective", _pad_infer, _pad_ref)


def _slice_infer(attrs, x):
    shape = [len(range(b, e, s)) for b, e, s in zip(attrs["begin"], attrs["end"], attrs["step"])]
    return [TensorType(tuple(shape), x.dtype)]


_register("strided_slice", "injective", _slice_infer,
          lambda attrs, x: [np.ascontiguousarray(
              x[tuple(slice(b, e if e >= 0 else None, s) for b, e, s in zip(attrs["begin"], attrs["end"],
                                                                             attrs["step"]))])])


def _bcast_to_infer(attrs, x):
    return [TensorType(tuple(attrs["shape"]), x.dtype)]


_register("broadcast_to", "injective", _bcast_to_infer,
          lambda attrs, x: [np.ascontiguousarray(np.broadcast_to(x, tuple(attrs["shape"])))])


# ---------------------------------------------------------------- linear algebra
def _dense_infer(attrs, x, w):
    return [TensorType((x.shape[0], w.shape[0]), x.dtype)]


_register("dense", "complex", _dense_infer, lambda attrs, x, w: [(x @ w.T).astype(x.dtype)])


def _bmm_infer(attrs, a, b):
    return [TensorType((a.shape[0], a.shape[1], b.shape[2]), a.dtype)]


_register("batch_matmul", "complex", _bmm_infer, lambda attrs, a, b: [np.matmul(a, b).astype(a.dtype)])


# ---------------------------------------------------------------- convolution and pooling
def conv_out_size(n: int, k: int, s: int, d: int, pb: int, pe: int) -> int:
    return (n + pb + pe - ((k - 1) * d + 1)) // s + 1


def _conv_infer(attrs, x, w, *bias):
    s, d, p = attrs["strides"], attrs["dilations"], attrs["pads"]
    # channels_last_in (graph/passes/float_layout.py): x is the NHWC image (1, H, W, C)
    h, wd = x.shape[1:3] if attrs.get("channels_last_in") else x.shape[2:4]
    oh = conv_out_size(h, w.shape[2], s[0], d[0], p[0], p[2])
    ow = conv_out_size(wd, w.shape[3], s[1], d[1], p[1], p[3])
    if attrs.get("channels_last_out"):
        # (graph/passes/float_layout.py) one image's output as (OH*OW, O): the pixels of the NHWC image
        if x.shape[0] != 1:
            raise ValueError("conv2d with channels_last_out takes one image, got a batch of %d" % x.shape[0])
        return [TensorType((oh * ow, w.shape[0]), x.dtype)]
    return [TensorType((x.shape[0], w.shape[0], oh, ow), x.dtype)]


def _conv_ref(attrs, x, w, *bias):
    if attrs.get("channels_last_in"):
        nchw = np.ascontiguousarray(x.transpose(0, 3, 1, 2))
        return _conv_ref({k: v for k, v in attrs.items() if k != "channels_last_in"}, nchw, w, *bias)
    if attrs.get("channels_last_out"):
        (y,) = _conv_ref({k: v for k, v in attrs.items() if k != "channels_last_out"}, x, w, *bias)
        return [np.ascontiguousarray(y[0].reshape(y.shape[1], -1).T)]
    (t,) = _conv_infer(attrs, TensorType(x.shape, x.dtype), TensorType(w.shape, w.dtype))
    s, d, p, g = attrs["strides"], attrs["dilations"], attrs["pads"], attrs["groups"]
    n, c, h, wd = x.shape
    oc, icg, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (p[0], p[2]), (p[1], p[3])))
    oh, ow = t.shape[2], t.shape[3]
    xg = xp.reshape(n, g, c // g, xp.shape[2], xp.shape[3])
    wg = w.reshape(g, oc // g, icg, kh, kw)
    out = np.zeros((n, g, oc // g, oh, ow), dtype=np.float64)
    for i in range(kh):
        for j in range(kw):
            patch = xg[:, :, :, i * d[0]: i * d[0] + (oh - 1) * s[0] + 1: s[0],
                       j * d[1]: j * d[1] + (ow - 1) * s[1] + 1: s[1]]
            out += np.einsum("ngchw,goc->ngohw", patch, wg[:, :, :, i, j], optimize=True)
    out = out.reshape(n, oc, oh, ow)
    if bias:
        out += bias[0].reshape(1, oc, 1, 1)
    return [out.astype(x.dtype)]


_register("conv2d", "complex", _conv_infer, _conv_ref)


def pool_out_size(n, k, s, d, pb, pe, ceil_mode) -> int:
    span = n + pb + pe - ((k - 1) * d + 1)
    out = (-(-span // s) if ceil_mode else span // s) + 1
    if ceil_mode and (out - 1) * s >= n + pb:
        out -= 1   # the last window would start inside the end padding
    return out


def _pool_infer(attrs, x):
    nd = len(attrs["kernel"])
    k, s, d, p = attrs["kernel"], attrs["strides"], attrs["dilations"], attrs["pads"]
    spatial = tuple(pool_out_size(x.shape[2 + i], k[i], s[i], d[i], p[i], p[i + nd], attrs["ceil_mode"])
                    for i in range(nd))
    return [TensorType(tuple(x.shape[:2]) + spatial, x.dtype)]


def _pool_ref(kind):
    def ref(attrs, x):
        (t,) = _pool_infer(attrs, TensorType(x.shape, x.dtype))
        nd = len(attrs["kernel"])
        k, s, d, p = attrs["kernel"], attrs["strides"], attrs["dilations"], attrs["pads"]
        out_sp = t.shape[2:]
        # pad generously so ceil-mode windows never index out of range
        extra = [max(0, (out_sp[i] - 1) * s[i] + (k[i] - 1) * d[i] + 1 - (x.shape[2 + i] + p[i] + p[i + nd]))
                 for i in range(nd)]
        width = [(0, 0), (0, 0)] + [(p[i], p[i + nd] + extra[i]) for i in range(nd)]
        fill = -np.inf if kind == "max" else 0.0
        xp = np.pad(x.astype(np.float64), width, constant_values=fill)
        valid = np.pad(np.ones(x.shape[2:]), width[2:], constant_values=0.0)
        # positions inside the declared padding (not the ceil-mode overhang) count when count_include_pad
        inpad = np.pad(np.ones(tuple(x.shape[2 + i] + p[i] + p[i + nd] for i in range(nd))),
                       [(0, extra[i]) for i in range(nd)], constant_values=0.0)
        acc = np.full(x.shape[:2] + tuple(out_sp), fill, dtype=np.float64)
        cnt = np.zeros(tuple(out_sp))
        for off in np.ndindex(*k):
            sl = tuple(slice(off[i] * d[i], off[i] * d[i] + (out_sp[i] - 1) * s[i] + 1, s[i]) for i in range(nd))
            win = xp[(slice(None), slice(None)) + sl]
            if kind == "max":
                acc = np.maximum(acc, win)
            else:
                acc = acc + win
                cnt = cnt + (inpad[sl] if attrs.get("count_include_pad") else valid[sl])
        if kind == "avg":
            acc = acc / np.maximum(cnt, 1)
        return [acc.astype(x.dtype)]
    return ref


_register("max_pool", "complex", _pool_infer, _pool_ref("max"))
_register("avg_pool", "complex", _pool_infer, _pool_ref("avg"))


def _gpool_infer(attrs, x):
    return [TensorType(tuple(x.shape[:2]) + (1,) * (len(x.shape) - 2), x.dtype)]


_register("global_avg_pool", "complex", _gpool_infer,
          lambda attrs, x: [x.mean(axis=tuple(range(2, x.ndim)), keepdims=True, dtype=np.float64).astype(x.dtype)])
_register("global_max_pool", "complex", _gpool_infer,
          lambda attrs, x: [x.max(axis=tuple(range(2, x.ndim)), keepdims=True)])


# ---------------------------------------------------------------- normalisation
def _softmax_ref(attrs, x):
    ax = attrs["axis"]
    e = np.exp(x.astype(np.float64) - x.max(axis=ax, keepdims=True))
    return [(e / e.sum(axis=ax, keepdims=True)).astype(x.dtype)]


_register("softmax", "opaque", _same, _softmax_ref)


def _bn_ref(attrs, x, scale, bias, mean, var):
    shape = (1, -1) + (1,) * (x.ndim - 2)
    inv = scale / np.sqrt(var + attrs["epsilon"])
    return [((x - mean.reshape(shape)) * inv.reshape(shape) + bias.reshape(shape)).astype(x.dtype)]


_register("batch_norm", "opaque", _same, _bn_ref)


def _lrn_ref(attrs, x):
    size, alpha, beta, bias = attrs["size"], attrs["alpha"], attrs["beta"], attrs["bias"]
    sq = np.square(x.astype(np.float64))
    c = x.shape[1]
    lo, hi = (size - 1) // 2, size // 2
    padded = np.pad(sq, [(0, 0), (lo, hi)] + [(0, 0)] * (x.ndim - 2))
    acc = sum(padded[:, i:i + c] for i in range(size))
    return [(x / (bias + alpha / size * acc) ** beta).astype(x.dtype)]


_register("lrn", "opaque", _same, _lrn_ref)


def _reduce_infer(attrs, x):
    axes = attrs["axes"]
    if attrs.get("keepdims", True):
        shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape))
    else:
        shape = tuple(d for i, d in enumerate(x.shape) if i not in axes)
    return [TensorType(shape, x.dtype)]


_register("mean", "opaque", _reduce_infer,
          lambda attrs, x: [x.mean(axis=tuple(attrs["axes"]), keepdims=bool(attrs.get("keepdims", True)),
                                   dtype=np.float64).astype(x.dtype)])


# ---------------------------------------------------------------- ONNX elementwise: comparison, logic, selection,
# math with attributes, casts. Output dtypes follow ONNX: comparisons and IsNaN/IsInf give bool.
def _bcast_infer(dtype=None):
    def infer(attrs, *xs):
        return [TensorType(broadcast_shapes(*[x.shape for x in xs]), dtype or xs[-1].dtype)]
    return infer


COMPARE = {"equal": np.equal, "less": np.less, "less_equal": np.less_equal, "greater": np.greater,
           "greater_equal": np.greater_equal, "logical_and": np.logical_and, "logical_or": np.logical_or,
           "logical_xor": np.logical_xor}
for _n, _fn in COMPARE.items():
    _register(_n, "elemwise", _bcast_infer("bool"),
              (lambda fn: lambda attrs, a, b: [np.asarray(fn(a, b), dtype=bool)])(_fn))
_register("logical_not", "elemwise", lambda attrs, x: [TensorType(x.shape, "bool")],
          lambda attrs, x: [np.logical_not(x)])
_register("where", "elemwise", lambda attrs, cnd, x, y: [TensorType(broadcast_shapes(cnd.shape, x.shape, y.shape),
                                                                     x.dtype)],
          lambda attrs, cnd, x, y: [np.where(cnd, x, y).astype(x.dtype, copy=False)])


def _mod_ref(attrs, a, b):
    if attrs.get("fmod", 0):
        if np.issubdtype(a.dtype, np.floating):
            return [np.fmod(a, b)]
        return [(a - b * _int_trunc_div(a, b)).astype(a.dtype)]
    return [np.mod(a, b).astype(a.dtype)]


_register("mod", "elemwise", _bcast_infer(), _mod_ref)
_register("prelu", "elemwise", lambda attrs, x, s: [x],
          lambda attrs, x, s: [np.where(x < 0, x * s, x).astype(x.dtype)])


def _erf_np(x):
    import math
    return np.vectorize(math.erf, otypes=[np.float64])(x)


def _round_half_even(x):
    return np.round(x)


def _softplus(x):
    x = x.astype(np.float64)
    return np.maximum(x, 0) + np.log1p(np.exp(-np.abs(x)))


def _gelu_ref(a, x):
    x64 = x.astype(np.float64)
    if a.get("approximate", "none") == "tanh":
        return 0.5 * x64 * (1 + np.tanh(np.sqrt(2 / np.pi) * (x64 + 0.044715 * x64 ** 3)))
    return 0.5 * x64 * (1 + _erf_np(x64 / np.sqrt(2)))


def _isinf_ref(a, x):
    pos, neg = a.get("detect_positive", 1), a.get("detect_negative", 1)
    return [((np.isposinf(x) & bool(pos)) | (np.isneginf(x) & bool(neg)))]


def _expm1(x):
    return np.expm1(x.astype(np.float64))


MATH = {
    "erf": lambda a, x: _erf_np(x),
    "gelu": _gelu_ref,
    "reciprocal": lambda a, x: 1.0 / x,
    "floor": lambda a, x: np.floor(x),
    "ceil": lambda a, x: np.ceil(x),
    "round": lambda a, x: _round_half_even(x),
    "sign": lambda a, x: np.sign(x),
    "elu": lambda a, x: np.where(x > 0, x, a["alpha"] * _expm1(x)),
    "selu": lambda a, x: a["gamma"] * np.where(x > 0, x, a["alpha"] * _expm1(x)),
    "celu": lambda a, x: np.maximum(x, 0) + np.minimum(0, a["alpha"] * _expm1(x / a["alpha"])),
    "softplus": lambda a, x: _softplus(x),
    "softsign": lambda a, x: x / (1 + np.abs(x)),
    "mish": lambda a, x: x * np.tanh(_softplus(x)),
    "thresholded_relu": lambda a, x: np.where(x > a["alpha"], x, 0),
    "sinh": lambda a, x: np.sinh(x.astype(np.float64)),
    "cosh": lambda a, x: np.cosh(x.astype(np.float64)),
    "asinh": lambda a, x: np.arcsinh(x.astype(np.float64)),
    "acosh": lambda a, x: np.arccosh(x.astype(np.float64)),
    "atanh": lambda a, x: np.arctanh(x.astype(np.float64)),
}
for _n, _fn in MATH.items():
    _register(_n, "elemwise", _same, _f32(_fn))
_register("isnan", "elemwise", lambda attrs, x: [TensorType(x.shape, "bool")], lambda attrs, x: [np.isnan(x)])
_register("isinf", "elemwise", lambda attrs, x: [TensorType(x.shape, "bool")], _isinf_ref)


def _cast_ref(attrs, x):
    to = attrs["to"]
    # bfloat16 (ml_dtypes on the host): exact to float32 first; into bfloat16 through float32 as onnxruntime rounds
    if x.dtype.name == "bfloat16":
        x = x.astype(np.float32)
    if to == "bfloat16":
        import ml_dtypes
        return [x.astype(np.float32).astype(ml_dtypes.bfloat16)]
    if np.issubdtype(x.dtype, np.floating) and np.issubdtype(np.dtype(to), np.integer):
        # float -> integer truncates toward zero; out-of-range values wrap through int64 as the kernel does
        return [np.trunc(x).astype(np.int64).astype(to)]
    return [x.astype(to)]


_register("cast", "elemwise", lambda attrs, x: [TensorType(x.shape, attrs["to"])], _cast_ref)


def _axis_softmax_like(fn):
    def ref(attrs, x):
        return [fn(x, attrs["axis"]).astype(x.dtype)]
    return ref


def _log_softmax_np(x, ax):
    x64 = x.astype(np.float64)
    m = x64.max(axis=ax, keepdims=True)
    return x64 - m - np.log(np.exp(x64 - m).sum(axis=ax, keepdims=True))


def _hardmax_np(x, ax):
    idx = np.expand_dims(np.argmax(x, axis=ax), ax)
    out = np.zeros_like(x)
    np.put_along_axis(out, idx, 1, axis=ax)
    return out


_register("log_softmax", "opaque", _same, _axis_softmax_like(_log_softmax_np))
_register("hardmax", "opaque", _same, _axis_softmax_like(_hardmax_np))


# ---------------------------------------------------------------- ONNX bitwise ops and BitShift
def _shift_ref(attrs, x, y):
    x, y = np.broadcast_arrays(x, y)
    bits = x.dtype.itemsize * 8
    out_of_range = (y < 0) | (y >= bits)
    safe = np.where(out_of_range, 0, y)
    if attrs["direction"] == "LEFT":
        u = np.dtype("u%d" % x.dtype.itemsize)
        out = np.left_shift(x.view(u), safe.astype(u)).view(x.dtype)
        fill = np.zeros_like(x)
    else:
        out = np.right_shift(x, safe.astype(x.dtype))
        fill = np.where(x < 0, -1, 0).astype(x.dtype)
    return [np.where(out_of_range, fill, out).astype(x.dtype)]


for _n, _fn in {"bitwise_and": np.bitwise_and, "bitwise_or": np.bitwise_or,
                "bitwise_xor": np.bitwise_xor}.items():
    _register(_n, "elemwise", _bcast_infer(),
              (lambda fn: lambda attrs, a, b: [np.asarray(fn(a, b)).astype(a.dtype)])(_fn))
_register("bitwise_not", "elemwise", _same, lambda attrs, x: [np.invert(x)])
_register("bit_shift", "elemwise", _bcast_infer(), _shift_ref)


# ---------------------------------------------------------------- ONNX Max/Min on floats: NaN propagates
for _n, _fn in {"maximum_nan": np.maximum, "minimum_nan": np.minimum}.items():
    _register(_n, "elemwise", _bcast_infer(),
              (lambda fn: lambda attrs, a, b: [np.asarray(fn(a, b)).astype(a.dtype)])(_fn))



# ---------------------------------------------------------------- reductions (ONNX Reduce*, ArgMax/ArgMin)
# One op "reduce" for every ONNX Reduce* kind; ``axes`` are normalised and sorted, and may be empty (a reduction
# over no axis is the kind's per-element transform: abs for l1, x*x for sum_square, ... as the ONNX reference).
def _reduce_np(kind: str, x: np.ndarray, axes: tuple, keepdims: bool) -> np.ndarray:
    f = x.astype(np.float64) if np.issubdtype(x.dtype, np.floating) else x
    if kind == "sum":
        r = np.sum(f, axis=axes, keepdims=keepdims)
    elif kind == "mean":
        r = np.mean(f, axis=axes, keepdims=keepdims)
    elif kind == "max":
        r = np.max(f, axis=axes, keepdims=keepdims) if axes else f
    elif kind == "min":
        r = np.min(f, axis=axes, keepdims=keepdims) if axes else f
    elif kind == "prod":
        r = np.prod(f, axis=axes, keepdims=keepdims)
    elif kind == "l1":
        r = np.sum(np.abs(f), axis=axes, keepdims=keepdims)
    elif kind == "l2":
        r = np.sqrt(np.sum(f * f, axis=axes, keepdims=keepdims))
    elif kind == "sum_square":
        r = np.sum(f * f, axis=axes, keepdims=keepdims)
    elif kind == "log_sum":
        r = np.log(np.sum(f, axis=axes, keepdims=keepdims))
    elif kind == "log_sum_exp":
        m = np.max(f, axis=axes, keepdims=True) if axes else f
        r = np.log(np.sum(np.exp(f - m), axis=axes, keepdims=True)) + m
        if not keepdims:
            r = np.squeeze(r, axis=axes)
    else:
        raise ValueError("reduce: unknown kind %r" % kind)
    return np.asarray(r).astype(x.dtype)


def _reduce_kind_infer(attrs, x):
    return _reduce_infer(attrs, x)


_register("reduce", "opaque", _reduce_kind_infer,
          lambda attrs, x: [_reduce_np(attrs["kind"], x, tuple(attrs["axes"]), bool(attrs.get("keepdims", True)))])


def _argreduce_infer(attrs, x):
    ax = attrs["axis"]
    if attrs.get("keepdims", True):
        shape = tuple(1 if i == ax else d for i, d in enumerate(x.shape))
    else:
        shape = tuple(d for i, d in enumerate(x.shape) if i != ax)
    return [TensorType(shape, "int64")]


def _argreduce_ref(attrs, x):
    ax, keep = attrs["axis"], bool(attrs.get("keepdims", True))
    fn = np.argmax if attrs["kind"] == "max" else np.argmin
    if attrs.get("select_last_index"):
        n = x.shape[ax]
        r = n - 1 - fn(np.flip(x, axis=ax), axis=ax)
    else:
        r = fn(x, axis=ax)
    if keep:
        r = np.expand_dims(r, ax)
    return [np.asarray(r, dtype=np.int64)]


_register("arg_reduce", "opaque", _argreduce_infer, _argreduce_ref)


# ---------------------------------------------------------------- layer / instance / group normalization
# "normalize": inputs x[, scale][, bias] (attrs has_scale/has_bias say which), statistics over axes
# [axis, ndim); scale and bias broadcast to x (right-aligned).
def _normalize_ref(attrs, x, *rest):
    axes = tuple(range(attrs["axis"], x.ndim))
    f = x.astype(np.float64)
    m = f.mean(axis=axes, keepdims=True)
    v = ((f - m) ** 2).mean(axis=axes, keepdims=True)
    y = (f - m) / np.sqrt(v + attrs["epsilon"])
    rest = list(rest)
    if attrs.get("has_scale"):
        y = y * rest.pop(0)
    if attrs.get("has_bias"):
        y = y + rest.pop(0)
    return [y.astype(x.dtype)]


_register("normalize", "opaque", _same, _normalize_ref)


# ---------------------------------------------------------------- resize (ONNX Resize/Upsample)
# "resize": inputs x, then per resized axis (attrs["axes"], in order) its int32 index table (out, taps), its
# weight table (out, taps) when "weights", its 1/0 inside table (out,) when "inside" (tf_crop_and_resize).
def _resize_infer(attrs, x, *tables):
    return [TensorType(tuple(attrs["shape"]), x.dtype)]


def _resize_ref(attrs, x, *tables):
    it = iter(tables)
    y = x.astype(np.float64)
    inside_all = np.ones(tuple(attrs["shape"]), dtype=bool)
    for a in attrs["axes"]:
        d = a["axis"]
        idx = next(it)
        w = next(it) if a["weights"] else np.ones(idx.shape)
        g = np.take(y, idx.astype(np.int64), axis=d)          # (..., out, taps, ...)
        wshape = (1,) * d + w.shape + (1,) * (y.ndim - d - 1)
        y = (g * w.reshape(wshape)).sum(axis=d + 1)
        if a["inside"]:
            ins = next(it).astype(bool)
            inside_all &= ins.reshape((1,) * d + ins.shape + (1,) * (y.ndim - d - 1))
    if not inside_all.all():
        y = np.where(inside_all, y, attrs.get("extrapolation", 0.0))
    return [y.astype(x.dtype)]


_register("resize", "injective", _resize_infer, _resize_ref)


# ---------------------------------------------------------------- index-driven ops (Gather*, OneHot, Trilu)
def _wrap_np(idx: np.ndarray, n: int) -> np.ndarray:
    idx = idx.astype(np.int64)
    return np.clip(np.where(idx < 0, idx + n, idx), 0, n - 1)


def _gather_infer(attrs, data, idx):
    ax = attrs["axis"]
    return [TensorType(tuple(data.shape[:ax]) + tuple(idx.shape) + tuple(data.shape[ax + 1:]), data.dtype)]


_register("gather", "injective", _gather_infer,
          lambda attrs, data, idx: [np.take(data, _wrap_np(idx, data.shape[attrs["axis"]]), axis=attrs["axis"])])


def _gather_elements_infer(attrs, data, idx):
    return [TensorType(tuple(idx.shape), data.dtype)]


_register("gather_elements", "injective", _gather_elements_infer,
          lambda attrs, data, idx: [np.take_along_axis(data, _wrap_np(idx, data.shape[attrs["axis"]]),
                                                       axis=attrs["axis"])])


def _gather_nd_infer(attrs, data, idx):
    b, k = attrs["batch_dims"], idx.shape[-1]
    return [TensorType(tuple(idx.shape[:-1]) + tuple(data.shape[b + k:]), data.dtype)]


def _gather_nd_ref(attrs, data, idx):
    b = attrs["batch_dims"]
    k = idx.shape[-1]
    (t,) = _gather_nd_infer(attrs, TensorType(data.shape, data.dtype), TensorType(idx.shape, idx.dtype))
    out = np.empty(t.shape, data.dtype)
    for pos in np.ndindex(*idx.shape[:-1]):
        src = tuple(pos[:b]) + tuple(int(_wrap_np(np.array(idx[pos + (j,)]), data.shape[b + j])) for j in range(k))
        out[pos] = data[src]
    return [out]


_register("gather_nd", "injective", _gather_nd_infer, _gather_nd_ref)


def _one_hot_infer(attrs, idx, values):
    shape = list(idx.shape)
    shape.insert(attrs["axis"], attrs["depth"])
    return [TensorType(tuple(shape), values.dtype)]


def _one_hot_ref(attrs, idx, values):
    depth, axis = attrs["depth"], attrs["axis"]
    j = idx.astype(np.int64)
    j = np.where(j < 0, j + depth, j)
    hot = np.expand_dims(j, axis) == np.arange(depth).reshape((-1,) + (1,) * (idx.ndim - axis))
    return [np.where(hot, values[1], values[0]).astype(values.dtype)]


_register("one_hot", "injective", _one_hot_infer, _one_hot_ref)


def _trilu_ref(attrs, x):
    k = attrs["k"]
    return [np.triu(x, k) if attrs["upper"] else np.tril(x, k)]


_register("trilu", "injective", _same, _trilu_ref)


# ---------------------------------------------------------------- trigonometry, indexing, signal ops
TRIG = {"sin": np.sin, "cos": np.cos, "tan": np.tan, "asin": np.arcsin, "acos": np.arccos, "atan": np.arctan}
for _n, _fn in TRIG.items():
    _register(_n, "elemwise", _same, _f32((lambda f: lambda a, x: f(x.astype(np.float64)))(_fn)))


def _cumulative_ref(attrs, x):
    axis, rev = attrs["axis"], attrs.get("reverse", 0)
    y = np.flip(x, axis) if rev else x
    y = (np.cumsum if attrs["kind"] == "sum" else np.cumprod)(y, axis=axis, dtype=x.dtype)
    if attrs.get("exclusive", 0):
        ident = np.full_like(np.take(y, [0], axis=axis), 0 if attrs["kind"] == "sum" else 1)
        y = np.concatenate([ident, np.take(y, np.arange(x.shape[axis] - 1), axis=axis)], axis=axis)
    return [np.flip(y, axis) if rev else y]


_register("cumulative", "opaque", _same, _cumulative_ref)


def _topk_infer(attrs, x):
    shape = list(x.shape)
    shape[attrs["axis"]] = attrs["k"]
    return [TensorType(tuple(shape), "int64")]


def _topk_ref(attrs, x):
    axis, k = attrs["axis"], attrs["k"]
    key = x.astype(np.float64) if x.dtype.kind == "f" else x.astype(np.int64)
    if attrs.get("largest", 1):
        key = -key if key.dtype.kind == "f" else ~key      # ~ reverses int64 order without overflowing
    order = np.argsort(key, axis=axis, kind="stable")      # stable: ties stay in index order
    return [np.take(order, np.arange(k), axis=axis).astype(np.int64)]


_register("topk_indices", "opaque", _topk_infer, _topk_ref)


def _bitcast_infer(attrs, x):
    to = np.dtype(attrs["to"])
    if to.itemsize != np.dtype(x.dtype).itemsize:
        raise ValueError("bitcast of %s to %s changes the element size" % (x.dtype, to))
    return [TensorType(x.shape, str(to))]


# an alias like reshape: the output is the input's bytes read as another type of the same width (no kernel)
_register("bitcast", "alias", _bitcast_infer, lambda attrs, x: [x.view(np.dtype(attrs["to"]))])

# float x mod y with the sign of y (numpy's np.mod, Python's %): ONNX Mod fmod=0 on floats
_register("float_mod", "elemwise", _bcast_infer(), lambda attrs, a, b: [np.mod(a, b).astype(a.dtype)])


def _grid_sample_infer(attrs, x, grid):
    return [TensorType((x.shape[0], x.shape[1]) + tuple(grid.shape[1:-1]), x.dtype)]


def _grid_sample_ref(attrs, x, grid):
    from tether.ops.grid_sample import grid_sample_np
    return [grid_sample_np(x, grid, attrs["mode"], attrs["padding_mode"], bool(attrs["align_corners"]))]


_register("grid_sample", "injective", _grid_sample_infer, _grid_sample_ref)


def _max_pool_indices_ref(attrs, x):
    """The flat (row-major, over the whole input) index of each window's first maximum (ONNX MaxPool Indices)."""
    (t,) = _pool_infer(attrs, TensorType(x.shape, x.dtype))
    nd = len(attrs["kernel"])
    k, s, d, p = attrs["kernel"], attrs["strides"], attrs["dilations"], attrs["pads"]
    out = np.zeros(t.shape, np.int64)
    flat = np.arange(x.size).reshape(x.shape)
    for o in np.ndindex(*t.shape[2:]):
        best, arg = None, None
        for r in np.ndindex(*k):
            pos = [o[i] * s[i] + r[i] * d[i] - p[i] for i in range(nd)]
            if all(0 <= q < x.shape[2 + i] for i, q in enumerate(pos)):
                v = x[(slice(None), slice(None)) + tuple(pos)]
                f = flat[(slice(None), slice(None)) + tuple(pos)]
                if best is None:
                    best, arg = v.copy(), f.copy()
                else:
                    better = v > best
                    best, arg = np.where(better, v, best), np.where(better, f, arg)
        out[(slice(None), slice(None)) + o] = arg
    if attrs.get("storage_order", 0):       # the same element, numbered with the spatial axes reversed
        coords = np.unravel_index(out, x.shape)
        out = np.ravel_multi_index(coords[:2] + coords[2:][::-1], x.shape[:2] + x.shape[2:][::-1])
    return [out.astype(np.int64)]


def _deform_conv_ref(attrs, x, w, offset, *rest):
    from tether.ops.deform_conv import deform_conv2d_np
    mask = rest[attrs["mask_at"] - 3] if attrs.get("mask_at") else None
    bias = rest[attrs["bias_at"] - 3] if attrs.get("bias_at") else None
    return [deform_conv2d_np(x, w, offset, mask, bias, attrs["strides"], attrs["pads"], attrs["dilations"],
                             attrs["group"], attrs["offset_group"])]


# inputs: x, w, offset, then the optional mask and bias at the positions mask_at / bias_at (0: absent)
_register("deform_conv2d", "opaque",
          lambda attrs, x, w, offset, *rest: [TensorType((x.shape[0], w.shape[0]) + tuple(offset.shape[2:]),
                                                         x.dtype)], _deform_conv_ref)
_register("max_pool_indices", "opaque", lambda attrs, x: [TensorType(_pool_infer(attrs, x)[0].shape, "int64")],
          _max_pool_indices_ref)


# numpy ops: run as numpy on the device between kernels (tether_rpc/numpy_ops.py, graph JSON version 3). Their
# types give the largest shape a data-dependent output can take; NUMPY_DYNAMIC lists those outputs, whose real
# shape is known only at run time (docs/graph.md: such a value may feed numpy ops and graph outputs only).
NUMPY_DYNAMIC = {"nonzero": (0,), "compress": (0,), "unique": (0, 1, 3), "non_max_suppression": (0,), "det": (),
                 "topk": (0, 1)}


def _compress_infer(attrs, x, cond):
    if attrs.get("axis") is None:
        return [TensorType((min(x.size, cond.size),), x.dtype)]
    shape = list(x.shape)
    shape[attrs["axis"]] = min(shape[attrs["axis"]], cond.size)
    return [TensorType(tuple(shape), x.dtype)]


def _unique_infer(attrs, x):
    n = x.size if attrs.get("axis") is None else x.shape[attrs["axis"]]
    y = (x.size,) if attrs.get("axis") is None else x.shape
    return [TensorType(y, x.dtype)] + [TensorType((n,), "int64")] * 3


def _nms_infer(attrs, boxes, scores, *rest):
    per_class = min(boxes.shape[1], attrs.get("max_per_class", boxes.shape[1]))
    return [TensorType((boxes.shape[0] * scores.shape[1] * max(per_class, 0), 3), "int64")]


def _numpy_ref(name):
    def ref(attrs, *xs):
        from tether_rpc.numpy_ops import OPS as NUMPY_OPS
        return NUMPY_OPS[name](attrs, *xs)
    return ref


for _n, _infer in (("nonzero", lambda attrs, x: [TensorType((max(len(x.shape), 1), x.size), "int64")]),
                   ("compress", _compress_infer), ("unique", _unique_infer), ("non_max_suppression", _nms_infer),
                   ("det", lambda attrs, x: [TensorType(x.shape[:-2], x.dtype)]),
                   ("topk", lambda attrs, x, k: [x, TensorType(x.shape, "int64")])):
    _register(_n, "numpy", _infer, _numpy_ref(_n))


# ---------------------------------------------------------------- RMS normalization
# "rms_normalize": inputs x[, scale] (attrs has_scale), the mean square over axes [axis, ndim); scale broadcasts
# to x (right-aligned).
def _rms_normalize_ref(attrs, x, *rest):
    axes = tuple(range(attrs["axis"], x.ndim))
    f = x.astype(np.float64)
    y = f / np.sqrt((f * f).mean(axis=axes, keepdims=True) + attrs["epsilon"])
    if attrs.get("has_scale"):
        y = y * rest[0]
    return [y.astype(x.dtype)]


_register("rms_normalize", "opaque", _same, _rms_normalize_ref)


# ---------------------------------------------------------------- rotary position embedding
# "rotary_embedding": inputs x (rank 4, heads last: (B, S, N, H) for seq_axis 1, (B, N, S, H) for 2), cos and
# sin (B, S, rotary_dim / 2); attrs seq_axis, rotary_dim, interleaved.
def _rotary_ref(attrs, x, cos, sin):
    rd, half = attrs["rotary_dim"], attrs["rotary_dim"] // 2
    f = x.astype(np.float64)
    shape = (cos.shape[0], cos.shape[1], 1, half) if attrs["seq_axis"] == 1 else (cos.shape[0], 1, cos.shape[1], half)
    co, si = cos.reshape(shape), sin.reshape(shape)
    rot = f[..., :rd]
    x1, x2 = (rot[..., 0::2], rot[..., 1::2]) if attrs["interleaved"] else (rot[..., :half], rot[..., half:])
    real, imag = x1 * co - x2 * si, x1 * si + x2 * co
    if attrs["interleaved"]:
        rot = np.stack([real, imag], axis=-1).reshape(rot.shape)
    else:
        rot = np.concatenate([real, imag], axis=-1)
    return [np.concatenate([rot, f[..., rd:]], axis=-1).astype(x.dtype)]


_register("rotary_embedding", "injective", lambda attrs, x, cos, sin: [x], _rotary_ref)
