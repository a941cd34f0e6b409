"""CPU strategies of the core graph ops: each op as te computes through the op library (``tether.ops``).

``LOWERINGS[op](attrs, *te_inputs) -> te.Tensor`` lowers one op; ``tether.kernels.table`` registers each as the
op's ``cpu`` strategy (``registry.TeLowering``), and ``graph/to_te.lower_kernel`` walks a node's body through
them, so conv2d -> add -> relu becomes one te expression tree whose elementwise tail ``ops.schedule`` inlines into
the conv's write-back. The few ops the library does not cover in the needed generality (N-D pooling, LRN,
slicing, reflect/edge padding, run-time pad values) are written here directly in te.
"""
from __future__ import annotations

import math
from typing import Callable, Dict

import numpy as np

from tether_rpc import dtypes

from tether import ops, te
from tether.ops import common as c

Lowering = Callable[..., "te.Tensor"]
LOWERINGS: Dict[str, Lowering] = {}


def _add(name: str, fn: Lowering) -> None:
    if name in LOWERINGS:
        raise ValueError("graph op %r has a second te lowering" % name)
    LOWERINGS[name] = fn


def lowering(*names: str):
    def deco(fn):
        for n in names:
            _add(n, fn)
        return fn
    return deco


def _unary_expr(x, fn, name):
    return c.compute(x.shape, lambda *i: fn(x[i]), name, c.ELEMWISE)


for _n, _f in {"relu": ops.relu, "sigmoid": ops.sigmoid, "tanh": ops.tanh, "exp": ops.exp, "log": ops.log,
               "sqrt": ops.sqrt, "neg": ops.negative, "abs": ops.abs, "hard_swish": ops.hard_swish}.items():
    _add(_n, (lambda f: lambda attrs, x: f(x))(_f))

for _n, _f in {"add": ops.add, "sub": ops.subtract, "mul": ops.multiply, "div": ops.divide,
               "maximum": ops.maximum, "minimum": ops.minimum}.items():
    _add(_n, (lambda f: lambda attrs, a, b: f(a, b))(_f))


@lowering("clip")
def _clip(attrs, x):
    lo, hi = attrs.get("min", -math.inf), attrs.get("max", math.inf)

    def f(v):
        if math.isfinite(lo):
            v = c.max2(v, c.const(lo, x.dtype))
        if math.isfinite(hi):
            v = c.min2(v, c.const(hi, x.dtype))
        return v
    return _unary_expr(x, f, "clip")


@lowering("leaky_relu")
def _leaky(attrs, x):
    return ops.leaky_relu(x, attrs.get("alpha", 0.01))


@lowering("hard_sigmoid")
def _hsig(attrs, x):
    return ops.hard_sigmoid(x, attrs.get("alpha", 0.2), attrs.get("beta", 0.5))


@lowering("scale_shift")
def _scale_shift(attrs, x):
    s, b = c.const(attrs.get("scale", 1.0), x.dtype), c.const(attrs.get("shift", 0.0), x.dtype)
    return _unary_expr(x, lambda v: v * s + b, "scale_shift")


@lowering("reshape")
def _reshape(attrs, x):
    return ops.reshape(x, attrs["shape"])


@lowering("transpose")
def _transpose(attrs, x):
    return ops.transpose(x, attrs["axes"])


@lowering("concat")
def _concat(attrs, *xs):
    return ops.concat(list(xs), attrs["axis"])


@lowering("pad")
def _pad(attrs, x, *value):
    shape = c.shape_of(x)
    n = len(shape)
    pads = list(attrs["pads"])
    if any(p < 0 for p in pads):    # negative pads crop first
        begin = [max(-pads[i], 0) for i in range(n)]
        end = [shape[i] - max(-pads[i + n], 0) for i in range(n)]
        x = _strided_slice({"begin": begin, "end": end, "step": [1] * n}, x)
        shape = c.shape_of(x)
        pads = [max(p, 0) for p in pads]
    before, after = pads[:n], pads[n:]
    mode = attrs.get("mode", "constant")
    if mode == "constant" and not value:
        return ops.pad(x, before, after, attrs.get("value", 0.0))
    out_shape = tuple(e + b + a for e, b, a in zip(shape, before, after))

    def f(*idx):
        if mode == "constant":
            conds = [cond for i, e, b in zip(idx, shape, before) for cond in (i >= b, i < b + e)]
            src = x[tuple(te.min(te.max(i - b, 0), e - 1) for i, e, b in zip(idx, shape, before))]
            return te.if_then_else(c.all_of(conds), src, value[0][0])
        src = []
        for i, e, b in zip(idx, shape, before):
            j = i - b
            if mode == "edge":
                src.append(te.min(te.max(j, 0), e - 1))
            else:   # reflect (no edge repeat); pads are smaller than the extent
                j = te.if_then_else(j < 0, 0 - j, j)
                src.append(te.if_then_else(j > e - 1, 2 * (e - 1) - j, j))
        return x[tuple(src)]
    return c.compute(out_shape, f, "pad", c.INJECTIVE)


@lowering("strided_slice")
def _strided_slice(attrs, x):
    begin, end, step = attrs["begin"], attrs["end"], attrs["step"]
    out_shape = tuple(len(range(b, e, s)) for b, e, s in zip(begin, end, step))
    return c.compute(out_shape, lambda *idx: x[tuple(b + i * s for i, b, s in zip(idx, begin, step))],
                     "strided_slice", c.INJECTIVE)


@lowering("broadcast_to")
def _broadcast_to(attrs, x):
    shape = tuple(attrs["shape"])
    return c.compute(shape, lambda *idx: c.broadcast_load(x, idx, x.dtype), "broadcast_to", c.BROADCAST)


@lowering("dense")
def _dense(attrs, x, w):
    if attrs.get("packed_n"):      # the weight was packed into panels at build time (graph/dense_panels.py)
        return ops.linear.dense_prepacked(x, w, attrs["packed_n"], block=attrs.get("packed_block"))
    return ops.dense(x, w)


@lowering("batch_matmul")
def _bmm(attrs, a, b):
    return ops.batch_matmul(a, b)


@lowering("conv2d")
def _conv2d(attrs, x, w, *bias):
    if attrs.get("channels_last_in"):
        # (a conv that does not run as a GEMM: its NHWC input read as NCHW)
        x = ops.transpose(x, (0, 3, 1, 2), name="conv2d_nchw_in")
    y = ops.conv2d(x, w, stride=tuple(attrs["strides"]), padding=tuple(attrs["pads"]),
                   dilation=tuple(attrs["dilations"]), groups=attrs["groups"], bias=bias[0] if bias else None)
    if not attrs.get("channels_last_out"):
        return y
    # (a conv that does not run as a GEMM: its NCHW result read back as (OH*OW, O))
    _, oc, oh, ow = (int(v) for v in y.shape)
    return c.compute((oh * ow, oc), lambda p, o: y[0, o, p // ow, p % ow], "conv2d_channels_last", c.INJECTIVE)


def _pool_nd(kind: str, attrs, x):
    return ops.pooling.pool_nd(x, kind, attrs["kernel"], attrs["strides"], attrs["dilations"], attrs["pads"],
                               bool(attrs["ceil_mode"]), bool(attrs.get("count_include_pad")))


def _pool(kind: str):
    def lower(attrs, x):
        nd = len(attrs["kernel"])
        if nd == 2:
            k, s, d, p = attrs["kernel"], attrs["strides"], attrs["dilations"], attrs["pads"]
            args = dict(kernel=tuple(k), stride=tuple(s), padding=tuple(p), dilation=tuple(d),
                        ceil_mode=bool(attrs["ceil_mode"]))
            if kind == "max":
                return ops.max_pool2d(x, **args)
            return ops.avg_pool2d(x, count_include_pad=bool(attrs.get("count_include_pad")), **args)
        return _pool_nd(kind, attrs, x)
    return lower


_add("max_pool", _pool("max"))
_add("avg_pool", _pool("avg"))


def _global_pool(kind: str):
    def lower(attrs, x):
        shape = c.shape_of(x)
        if len(shape) == 4:
            return ops.global_max_pool2d(x) if kind == "max" else ops.global_avg_pool2d(x)
        rs = [te.reduce_axis((0, e), name="r%d" % i) for i, e in enumerate(shape[2:])]
        inv = c.const(1.0 / float(np.prod(shape[2:])), x.dtype)

        def f(*idx):
            src = tuple(idx[:2]) + tuple(rs)
            return te.max(x[src], axis=rs) if kind == "max" else te.sum(x[src] * inv, axis=rs)
        return c.compute(tuple(shape[:2]) + (1,) * (len(shape) - 2), f, "global_pool", c.REDUCE)
    return lower


_add("global_max_pool", _global_pool("max"))
_add("global_avg_pool", _global_pool("avg"))


@lowering("batch_norm")
def _bn(attrs, x, scale, bias, mean, var):
    return ops.batch_norm(x, scale, bias, mean, var, axis=1, epsilon=attrs["epsilon"])


@lowering("mean")
def _mean(attrs, x):
    return ops.mean(x, tuple(attrs["axes"]), bool(attrs.get("keepdims", True)))


@lowering("lrn")
def _lrn(attrs, x):
    shape = c.shape_of(x)
    size, alpha, beta, bias = attrs["size"], attrs["alpha"], attrs["beta"], attrs["bias"]
    lo, hi = (size - 1) // 2, size // 2
    nd = len(shape)
    sq = c.compute(shape, lambda *i: x[i] * x[i], "lrn_sq", c.ELEMWISE)
    padded = ops.pad(sq, [0, lo] + [0] * (nd - 2), [0, hi] + [0] * (nd - 2), 0.0)
    r = te.reduce_axis((0, size), name="rc")
    acc = c.compute(shape, lambda *i: te.sum(padded[(i[0], i[1] + r) + tuple(i[2:])], axis=r), "lrn_sum", c.REDUCE)
    a, b, bt = c.const(alpha / size, x.dtype), c.const(bias, x.dtype), c.const(beta, x.dtype)
    return c.compute(shape, lambda *i: x[i] / te.pow(b + a * acc[i], bt), "lrn", c.BROADCAST)


# ---------------------------------------------------------------- ONNX elementwise: comparison, logic, selection,
# math with attributes, casts. Each op is a scalar function mapped over broadcast inputs
# (ops.elementwise). Float32 math whose plain formula cancels (expm1, sinh, round's +0.5) runs in float64.
_CMP = {"equal": lambda a, b: a == b, "less": lambda a, b: a < b, "less_equal": lambda a, b: a <= b,
        "greater": lambda a, b: a > b, "greater_equal": lambda a, b: a >= b,
        "logical_and": lambda a, b: te.all(a, b), "logical_or": lambda a, b: te.any(a, b),
        "logical_xor": lambda a, b: a != b}
for _n, _f in _CMP.items():
    _add(_n, (lambda n, f: lambda attrs, a, b: ops.elementwise(f, [a, b], n))(_n, _f))


@lowering("logical_not")
def _logical_not(attrs, x):
    return ops.elementwise(lambda v: te.if_then_else(v, te.const(False, "bool"), te.const(True, "bool")), [x],
                           "logical_not")


@lowering("where")
def _where(attrs, cond, x, y):
    return ops.elementwise(lambda cv, a, b: te.if_then_else(cv, a, b), [cond, x, y], "where")


def _trunc(v):
    return te.if_then_else(v < c.const(0.0, v.dtype), te.ceil(v), te.floor(v))


def _wide(v):
    """float32 -> float64 for the formulas that lose float32 precision; float64 stays."""
    return v.astype("float64") if v.dtype == "float32" else v


@lowering("mod")
def _mod(attrs, a, b):
    def int_fmod(x, y):     # C's %: the sign of the dividend
        q = x // y
        q = te.if_then_else(te.all(q * y != x, q < 0), q + 1, q)
        return x - q * y

    def float_fmod(x, y):
        xw, yw = _wide(x), _wide(y)
        return (xw - _trunc(xw / yw) * yw).astype(x.dtype)
    if attrs.get("fmod", 0):
        f = float_fmod if "float" in a.dtype else int_fmod
    else:
        f = te.floormod     # Python's %: the sign of the divisor (integers only, checked by the frontend)
    return ops.elementwise(f, [a, b], "mod")


@lowering("prelu")
def _prelu(attrs, x, slope):
    return ops.elementwise(lambda v, s: te.if_then_else(v < c.const(0, v.dtype), v * s, v), [x, slope], "prelu")


def _expm1(v):
    w = _wide(v)
    return (te.exp(w) - c.const(1.0, w.dtype)).astype(v.dtype)


def _softplus(v):
    zero, one = c.const(0.0, v.dtype), c.const(1.0, v.dtype)
    return c.max2(v, zero) + te.log(one + te.exp(zero - te.abs(v)))


def _round_even(v):
    if v.dtype in ("float32", "float64"):
        # IEEE roundeven: one instruction where the target rounds natively (codegen/mathlib.py); the formula
        # below took 40 instructions a vector in float64 (an int8 TFLite MUL's requantize: 154 us @96x48x48)
        return te.round_even(v)
    w = _wide(v)
    half, one, two = c.const(0.5, w.dtype), c.const(1.0, w.dtype), c.const(2.0, w.dtype)
    r = te.floor(w + half)
    odd = (r - two * te.floor(r * half)) == one
    r = te.if_then_else(te.all((r - w) == half, odd), r - one, r)
    # |x| >= 2**52 is an integer already (and x + 0.5 would round)
    r = te.if_then_else(te.abs(w) >= c.const(2.0 ** 52, w.dtype), w, r)
    return r.astype(v.dtype)


def _sign(v):
    one, zero = c.const(1, v.dtype), c.const(0, v.dtype)
    neg = c.const(-1, v.dtype) if not v.dtype.startswith("uint") else zero
    s = te.if_then_else(v > zero, one, te.if_then_else(v < zero, neg, zero))
    return te.if_then_else(v == v, s, v) if "float" in v.dtype else s     # NaN stays NaN


def _gelu(a, v):
    half, one = c.const(0.5, v.dtype), c.const(1.0, v.dtype)
    if a.get("approximate", "none") == "tanh":
        k, b = c.const(math.sqrt(2.0 / math.pi), v.dtype), c.const(0.044715, v.dtype)
        return half * v * (one + te.tanh(k * (v + b * v * v * v)))
    return half * v * (one + te.erf(v * c.const(1.0 / math.sqrt(2.0), v.dtype)))


def _in_wide(fn):
    def f(a, v):
        w = _wide(v)
        return fn(a, w).astype(v.dtype)
    return f


def _k(v, x):
    return c.const(x, v.dtype)


_MATH = {
    "erf": lambda a, v: te.erf(v),
    "gelu": _gelu,
    "reciprocal": lambda a, v: _k(v, 1.0) / v,
    "floor": lambda a, v: te.floor(v),
    "ceil": lambda a, v: te.ceil(v),
    "round": lambda a, v: _round_even(v),
    "sign": lambda a, v: _sign(v),
    "elu": lambda a, v: te.if_then_else(v > _k(v, 0.0), v, _k(v, a["alpha"]) * _expm1(v)),
    "selu": lambda a, v: _k(v, a["gamma"]) * te.if_then_else(v > _k(v, 0.0), v, _k(v, a["alpha"]) * _expm1(v)),
    "celu": lambda a, v: c.max2(v, _k(v, 0.0)) + c.min2(_k(v, 0.0),
                                                          _k(v, a["alpha"]) * _expm1(v / _k(v, a["alpha"]))),
    "softplus": lambda a, v: _softplus(v),
    "softsign": lambda a, v: v / (_k(v, 1.0) + te.abs(v)),
    "mish": lambda a, v: v * te.tanh(_softplus(v)),
    "thresholded_relu": lambda a, v: te.if_then_else(v > _k(v, a["alpha"]), v, _k(v, 0.0)),
    "sinh": _in_wide(lambda a, w: (te.exp(w) - te.exp(_k(w, 0.0) - w)) * _k(w, 0.5)),
    "cosh": _in_wide(lambda a, w: (te.exp(w) + te.exp(_k(w, 0.0) - w)) * _k(w, 0.5)),
    "asinh": _in_wide(lambda a, w: te.if_then_else(w < _k(w, 0.0), _k(w, -1.0), _k(w, 1.0))
                      * te.log(te.abs(w) + te.sqrt(w * w + _k(w, 1.0)))),
    "acosh": _in_wide(lambda a, w: te.log(w + te.sqrt(w * w - _k(w, 1.0)))),
    "atanh": _in_wide(lambda a, w: _k(w, 0.5) * te.log((_k(w, 1.0) + w) / (_k(w, 1.0) - w))),
    "isnan": lambda a, v: v != v,
}
for _n, _f in _MATH.items():
    _add(_n, (lambda n, f: lambda attrs, x: ops.elementwise(lambda v: f(attrs, v), [x], n))(_n, _f))


@lowering("isinf")
def _isinf(attrs, x):
    def f(v):
        conds = []
        if attrs.get("detect_positive", 1):
            conds.append(v == c.const(math.inf, v.dtype))
        if attrs.get("detect_negative", 1):
            conds.append(v == c.const(-math.inf, v.dtype))
        return te.any(*conds) if conds else te.const(False, "bool")
    return ops.elementwise(f, [x], "isinf")


@lowering("cast")
def _cast(attrs, x):
    to = attrs["to"]

    def f(v):
        if v.dtype == "bool":      # true is 1 (a plain int conversion of the 1-bit value would sign-extend)
            return te.if_then_else(v, c.const(1, to), c.const(0, to))
        if "float" in v.dtype and to != "bool" and "float" not in to:
            # truncate toward zero through int64, then wrap to the narrower type as numpy does
            return te.cast(te.cast(v, "int64"), to)
        if to == "bfloat16" and v.dtype == "float64":
            # onnxruntime rounds float64 to float32 first, then to bfloat16 (nearest even both times)
            return te.cast(te.cast(v, "float32"), to)
        return te.cast(v, to)
    return ops.elementwise(f, [x], "cast")


@lowering("log_softmax")
def _log_softmax(attrs, x):
    return ops.log_softmax(x, attrs["axis"])


@lowering("hardmax")
def _hardmax(attrs, x):
    shape = c.shape_of(x)
    ax = attrs["axis"]
    n = shape[ax]
    r = te.reduce_axis((0, n), name="rmax")
    mx = c.compute(shape[:ax] + shape[ax + 1:], lambda *i: te.max(x[i[:ax] + (r,) + i[ax:]], axis=r),
                   "hardmax_max", c.REDUCE)
    r2 = te.reduce_axis((0, n), name="rarg")
    first = c.compute(shape[:ax] + shape[ax + 1:],
                      lambda *i: te.min(te.if_then_else(x[i[:ax] + (r2,) + i[ax:]] == mx[i], r2, n), axis=r2),
                      "hardmax_arg", c.REDUCE)
    return c.compute(shape, lambda *i: te.if_then_else(first[i[:ax] + i[ax + 1:]] == i[ax], c.const(1.0, x.dtype),
                                                       c.const(0.0, x.dtype)), "hardmax", c.BROADCAST)


@lowering("pow")
def _pow_typed(attrs, a, b):
    """ONNX Pow: the output has the base's dtype, whatever the exponent's. Same-dtype float pow is unchanged."""
    if a.dtype == b.dtype and "float" in a.dtype:
        return ops.power(a, b)

    def f(x, y):
        if "float" in x.dtype:
            return te.pow(x, y.astype(x.dtype))
        # integer base: pow in float64 (exact below 2**53 for integral exponents), then back to the integer type:
        # rounded for an integral exponent, truncated (as the spec's cast does) otherwise, nudged up by 2**-40
        # so that an exact integer result computed as 1.9999999... does not truncate to 1
        xd, yd = x.astype("float64"), y.astype("float64")
        r = te.pow(xd, yd)
        # a negative integral exponent gives a fraction (or +-1 exactly), which truncates like C's integer pow
        integral = te.all(te.floor(yd) == yd, yd >= c.const(0.0, "float64"))
        rounded = te.floor(r + c.const(0.5, "float64"))
        nudged = _trunc(r * c.const(1.0 + 2.0 ** -40, "float64"))
        return te.if_then_else(integral, rounded, nudged).astype("int64").astype(x.dtype)
    return ops.elementwise(f, [a, b], "pow")


# ---------------------------------------------------------------- ONNX bitwise ops and BitShift
for _n, _b in {"bitwise_and": "bitand", "bitwise_or": "bitor", "bitwise_xor": "bitxor"}.items():
    _add(_n, (lambda n, b: lambda attrs, x, y: ops.elementwise(lambda u, v: te.bitwise(b, u, v), [x, y], n))(
        _n, _b))


@lowering("bitwise_not")
def _bitwise_not(attrs, x):
    def all_ones(dtype: str) -> int:
        # -1 in a signed type; in an unsigned one, every bit of its width (uint16's is 65535, not uint8's 255)
        row = dtypes.lookup(dtype)
        return (1 << row.bits) - 1 if row.kind == "uint" else -1
    return ops.elementwise(lambda v: te.bitwise("bitxor", v, c.const(all_ones(v.dtype), v.dtype)), [x], "bitwise_not")


@lowering("bit_shift")
def _bit_shift(attrs, x, y):
    op = "shl" if attrs["direction"] == "LEFT" else "shr"

    def f(u, v):
        zero = c.const(0, u.dtype)
        width = c.const(int(u.dtype.lstrip("uint")), u.dtype)
        # a shift by a negative amount or by the width or more (undefined in LLVM) leaves only the sign fill:
        # -1 for a right shift of a negative signed value, 0 otherwise (the ONNX spec)
        fill = zero
        if op == "shr" and not u.dtype.startswith("uint"):
            fill = te.if_then_else(u < zero, c.const(-1, u.dtype), zero)
        out = te.any(v < zero, v >= width) if not u.dtype.startswith("uint") else v >= width
        return te.if_then_else(out, fill, te.bitwise(op, u, v))
    return ops.elementwise(f, [x, y], "bit_shift")


# ---------------------------------------------------------------- ONNX Max/Min on floats: NaN propagates
# (ops.maximum keeps the other operand, which is what relu/clip want and what Max/Min must not do)
for _n, _f in {"maximum_nan": c.max2, "minimum_nan": c.min2}.items():
    _add(_n, (lambda n, f: lambda attrs, x, y: ops.elementwise(
        lambda u, v: te.if_then_else(u != u, u, te.if_then_else(v != v, v, f(u, v))), [x, y], n))(_n, _f))


# ---------------------------------------------------------------- reductions (ONNX Reduce*, ArgMax/ArgMin)
@lowering("reduce")
def _reduce_kind(attrs, x):
    return ops.reduce(x, attrs["kind"], tuple(attrs["axes"]), bool(attrs.get("keepdims", True)))


@lowering("arg_reduce")
def _arg_reduce(attrs, x):
    return ops.arg_reduce(x, attrs["kind"], attrs["axis"], bool(attrs.get("keepdims", True)),
                          bool(attrs.get("select_last_index", 0)))


# ---------------------------------------------------------------- layer / instance / group normalization
@lowering("normalize")
def _normalize(attrs, x, *rest):
    rest = list(rest)
    scale = rest.pop(0) if attrs.get("has_scale") else None
    bias = rest.pop(0) if attrs.get("has_bias") else None
    return ops.normalize(x, attrs["axis"], attrs["epsilon"], scale, bias)


# ---------------------------------------------------------------- resize (ONNX Resize/Upsample)
@lowering("resize")
def _resize(attrs, x, *tables):
    return ops.resize_tables(x, attrs["shape"], attrs["axes"], tables, attrs.get("extrapolation"))


# ---------------------------------------------------------------- index-driven ops (Gather*, OneHot, Trilu)
@lowering("gather")
def _gather(attrs, data, idx):
    return ops.gather(data, idx, attrs["axis"], attrs["shape"])


@lowering("gather_elements")
def _gather_elements(attrs, data, idx):
    return ops.gather_elements(data, idx, attrs["axis"])


@lowering("gather_nd")
def _gather_nd(attrs, data, idx):
    return ops.gather_nd(data, idx, attrs["batch_dims"], attrs["shape"])


@lowering("one_hot")
def _one_hot(attrs, idx, values):
    return ops.one_hot(idx, values, attrs["depth"], attrs["axis"], attrs["shape"])


@lowering("trilu")
def _trilu(attrs, x):
    return ops.trilu(x, attrs["k"], bool(attrs["upper"]))


# ---------------------------------------------------------------- RMS normalization
@lowering("rms_normalize")
def _rms_normalize(attrs, x, *rest):
    return ops.rms_normalize(x, attrs["axis"], attrs["epsilon"], rest[0] if attrs.get("has_scale") else None)


# ---------------------------------------------------------------- rotary position embedding
@lowering("rotary_embedding")
def _rotary_embedding(attrs, x, cos, sin):
    return ops.rotary_embedding(x, cos, sin, attrs["seq_axis"], attrs["rotary_dim"], bool(attrs["interleaved"]))


# ---------------------------------------------------------------- trigonometry, indexing, signal ops
for _n in ("sin", "cos", "tan", "asin", "acos", "atan"):
    _add(_n, (lambda f, n: lambda attrs, x: ops.elementwise(f, [x], n))(getattr(te, _n), _n))


@lowering("cumulative")
def _cumulative(attrs, x):
    from tether.ops.scan import cumulative
    return cumulative(x, attrs["axis"], attrs["kind"], bool(attrs.get("exclusive", 0)),
                      bool(attrs.get("reverse", 0)))


@lowering("topk_indices")
def _topk_indices(attrs, x):
    from tether.ops.topk import topk_indices
    return topk_indices(x, attrs["k"], attrs["axis"], bool(attrs.get("largest", 1)))


@lowering("float_mod")
def _float_mod(attrs, a, b):
    """numpy's float mod: fmod (exact for float32 in double), then moved into the divisor's sign; an infinite
    divisor leaves a finite x (or the infinity, for opposite signs); a zero result takes the divisor's sign."""
    def f(x, y):
        xw, yw = _wide(x), _wide(y)
        zero = c.const(0.0, xw.dtype)
        r = xw - _trunc(xw / yw) * yw
        inf = c.const(math.inf, xw.dtype)
        r = te.if_then_else(te.all(te.abs(yw) == inf, te.abs(xw) < inf), xw, r)
        flip = te.all(r != zero, (r < zero) != (yw < zero))
        r = te.if_then_else(flip, r + yw, r)
        r = te.if_then_else(r == zero, te.if_then_else(yw < zero, c.const(-0.0, xw.dtype), zero), r)
        return r.astype(x.dtype)
    return ops.elementwise(f, [a, b], "float_mod")


@lowering("grid_sample")
def _grid_sample(attrs, x, grid):
    from tether.ops.grid_sample import grid_sample
    return grid_sample(x, grid, attrs["mode"], attrs["padding_mode"], bool(attrs["align_corners"]))


@lowering("max_pool_indices")
def _max_pool_indices(attrs, x):
    """ONNX MaxPool's Indices: per window, the smallest flat input index (row-major over the whole tensor)
    holding the window's maximum, i.e. the first maximum in scan order; padding positions never count."""
    shape = c.shape_of(x)
    nd = len(shape) - 2
    k, s, d, p = attrs["kernel"], attrs["strides"], attrs["dilations"], attrs["pads"]
    m = _pool_nd("max", attrs, x)
    rs = [te.reduce_axis((0, k[i]), name="q%d" % i) for i in range(nd)]
    strides = [int(np.prod(shape[j + 1:])) for j in range(len(shape))]
    big = c.const(int(np.prod(shape)), "int64")

    def f(*idx):
        pos = [idx[2 + i] * s[i] + rs[i] * d[i] - p[i] for i in range(nd)]
        inside = c.all_of([(q >= 0) & (q < shape[2 + i]) for i, q in enumerate(pos)])
        src = tuple(idx[:2]) + tuple(c.clamp_index(q, shape[2 + i]) for i, q in enumerate(pos))
        flat = te.cast(idx[0], "int64") * c.const(strides[0], "int64") + \
            te.cast(idx[1], "int64") * c.const(strides[1], "int64")
        for i in range(nd):
            flat = flat + te.cast(src[2 + i], "int64") * c.const(strides[2 + i], "int64")
        hit = inside & (x[src] == m[idx])
        return te.min(te.if_then_else(hit, flat, big), axis=rs)
    first = c.compute(c.shape_of(m), f, "max_pool_indices", c.REDUCE)
    if not attrs.get("storage_order", 0):
        return first
    # storage_order 1: the same element numbered with the spatial axes reversed (column-major over H, W)
    rev = list(shape[:2]) + list(shape[2:][::-1])
    rstrides = [int(np.prod(rev[j + 1:])) for j in range(len(rev))]

    def g(*idx):
        v = first[idx]
        coords = [(v // c.const(strides[j], "int64")) % c.const(shape[j], "int64") for j in range(len(shape))]
        coords = coords[:2] + coords[2:][::-1]
        out = c.const(0, "int64")
        for j, q in enumerate(coords):
            out = out + q * c.const(rstrides[j], "int64")
        return out
    return c.compute(c.shape_of(m), g, "max_pool_indices_cm", c.INJECTIVE)


@lowering("deform_conv2d")
def _deform_conv2d(attrs, x, w, offset, *rest):
    from tether.ops.deform_conv import deform_conv2d
    mask = rest[attrs["mask_at"] - 3] if attrs.get("mask_at") else None
    bias = rest[attrs["bias_at"] - 3] if attrs.get("bias_at") else None
    return deform_conv2d(x, w, offset, mask, bias, attrs["strides"], attrs["pads"], attrs["dilations"],
                         attrs["group"], attrs["offset_group"])
