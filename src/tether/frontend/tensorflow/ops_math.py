"""Elementwise math, reductions, matrix products and selections.

Elementwise ops keep their operands' layout: when one operand is stored NCHW (it comes from a convolution), a
constant operand is broadcast to rank 4 and transposed at translation time, so ``conv * scale + shift`` needs
no transposes. Every op folds when all its inputs are constants.
"""
from __future__ import annotations

import math
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from tether.frontend.tensorflow.graph import TFNode
from tether.frontend.tensorflow.translate import Converter, Perm, Translator, Value, node_dtype, require_const

_erf = np.vectorize(math.erf, otypes=[np.float64])


def broadcast_shape(shapes: Sequence[Optional[Tuple]]) -> Optional[Tuple]:
    if any(s is None for s in shapes):
        return None
    rank = max(len(s) for s in shapes)
    out: List[Optional[int]] = []
    for i in range(rank):
        dims = [s[len(s) - rank + i] for s in shapes if len(s) - rank + i >= 0]
        known = [d for d in dims if d is not None and d != 1]
        out.append(known[0] if known else (None if any(d is None for d in dims) else 1))
    return tuple(out)


def _operand(t: Translator, v: Value, perm: Perm) -> Optional[str]:
    """``v`` stored in layout ``perm`` for a broadcasting op, or None when its rank is unknown."""
    if perm is None:
        return t.tf(v)
    if v.perm == perm:
        return t.name(v)
    n = len(perm)
    if v.const is not None:
        if v.const.ndim > n:
            return None
        return t.name(t.constant(np.transpose(v.const.reshape((1,) * (n - v.const.ndim) + v.const.shape), perm)))
    if v.rank is None or v.rank > n:
        return None
    x = t.tf(v)
    if v.rank < n:
        x = t.emit1("Unsqueeze", [x, t.ints(range(n - v.rank))])
    return t.view(Value(x, None, (1,) * (n - v.rank) + tuple(v.shape)), perm)


def broadcast_operands(t: Translator, values: Sequence[Value]) -> Tuple[List[str], Perm]:
    """The ONNX names of ``values`` in one shared layout, and that layout."""
    perms = {v.perm for v in values if v.const is None and v.perm is not None}
    if len(perms) == 1:
        perm = perms.pop()
        names = [_operand(t, v, perm) for v in values]
        if all(n is not None for n in names):
            return names, perm
    return [t.tf(v) for v in values], None


def elementwise(onnx_op: str, fold: Callable, **attrs) -> Converter:
    def convert(t: Translator, node: TFNode, ins: List[Value]) -> List[Value]:
        if all(v.const is not None for v in ins):
            return [t.constant(np.asarray(fold(*[v.const for v in ins])))]
        names, perm = broadcast_operands(t, ins)
        out = t.emit1(onnx_op, names, **attrs)
        dtype = np.dtype(np.bool_) if onnx_op in _BOOL_OUT else next((v.dtype for v in ins if v.dtype), None)
        return [t.out(out, shape=broadcast_shape([v.shape for v in ins]), perm=perm, dtype=dtype)]
    return convert


_BOOL_OUT = {"Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "And", "Or", "Xor", "Not", "IsNaN",
             "IsInf"}


def _keep(fold: Callable) -> Callable:
    """A numpy fold that keeps its first operand's dtype (TensorFlow ops do not promote)."""
    def f(*args):
        return np.asarray(fold(*args)).astype(np.asarray(args[0]).dtype)
    return f


def unary(onnx_op: str, fold: Callable, **attrs) -> Converter:
    return elementwise(onnx_op, _keep(fold), **attrs)


def _chain(fold: Callable, build: Callable[[Translator, str, TFNode, Value], str]) -> Converter:
    """A unary op written as several ONNX nodes by ``build(t, x, node, value)`` (the layout is kept)."""
    def convert(t: Translator, node: TFNode, ins: List[Value]) -> List[Value]:
        v = ins[0]
        if v.const is not None:
            return [t.constant(np.asarray(fold(v.const, node)).astype(v.const.dtype))]
        return [t.out(build(t, t.name(v), node, v), like=v, perm=v.perm)]
    return convert


def _scalar(t: Translator, v: Value, x: float) -> str:
    return t.name(t.constant(np.asarray(x, dtype=v.dtype or np.float32)))


def _relu6(t, x, node, v):
    return t.emit1("Clip", [x, _scalar(t, v, 0), _scalar(t, v, 6)])


def _rsqrt(t, x, node, v):
    return t.emit1("Reciprocal", [t.emit1("Sqrt", [x])])


def _square(t, x, node, v):
    return t.emit1("Mul", [x, x])


def _erfc(t, x, node, v):
    return t.emit1("Sub", [_scalar(t, v, 1), t.emit1("Erf", [x])])


def _leaky(t, x, node, v):
    return t.emit1("LeakyRelu", [x], alpha=float(node.attr("alpha", 0.2)))


def _gelu(t, x, node, v):
    if node.attr("approximate", False):
        # 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
        x3 = t.emit1("Mul", [t.emit1("Mul", [x, x]), x])
        inner = t.emit1("Add", [x, t.emit1("Mul", [x3, _scalar(t, v, 0.044715)])])
        th = t.emit1("Tanh", [t.emit1("Mul", [inner, _scalar(t, v, math.sqrt(2 / math.pi))])])
        return t.emit1("Mul", [t.emit1("Mul", [x, _scalar(t, v, 0.5)]), t.emit1("Add", [th, _scalar(t, v, 1)])])
    erf = t.emit1("Erf", [t.emit1("Mul", [x, _scalar(t, v, 1 / math.sqrt(2))])])
    return t.emit1("Mul", [t.emit1("Mul", [x, _scalar(t, v, 0.5)]), t.emit1("Add", [erf, _scalar(t, v, 1)])])


def _gelu_fold(x, node):
    if node.attr("approximate", False):
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    return 0.5 * x * (1 + _erf(x / math.sqrt(2)))


def _squared_difference(t: Translator, node: TFNode, ins: List[Value]) -> List[Value]:
    d = elementwise("Sub", lambda a, b: a - b)(t, node, ins)[0]
    return elementwise("Mul", lambda a, b: a * b)(t, node, [d, d])


def _floor_div(t: Translator, node: TFNode, ins: List[Value]) -> List[Value]:
    if all(v.const is not None for v in ins):
        return [t.constant(np.floor_divide(ins[0].const, ins[1].const))]
    names, perm = broadcast_operands(t, ins)
    dtype = ins[0].dtype
    if dtype is not None and np.issubdtype(dtype, np.integer):
        # exact for 32-bit integers in double; ONNX Div truncates integers, TensorFlow floors
        f = [t.emit1("Cast", [n], to=11) for n in names]
        out = t.emit1("Cast", [t.emit1("Floor", [t.emit1("Div", f)])], to=_onnx_type(dtype))
    else:
        out = t.emit1("Floor", [t.emit1("Div", names)])
    return [t.out(out, shape=broadcast_shape([v.shape for v in ins]), perm=perm, dtype=dtype)]


def _floor_mod(t: Translator, node: TFNode, ins: List[Value]) -> List[Value]:
    if all(v.const is not None for v in ins):
        return [t.constant(np.mod(ins[0].const, ins[1].const))]
    names, perm = broadcast_operands(t, ins)
    dtype = ins[0].dtype
    if dtype is not None and np.issubdtype(dtype, np.integer):
        out = t.emit1("Mod", names, fmod=0)            # the result takes the divisor's sign, as in TensorFlow
    else:
        q = t.emit1("Floor", [t.emit1("Div", names)])
        out = t.emit1("Sub", [names[0], t.emit1("Mul", [q, names[1]])])
    return [t.out(out, shape=broadcast_shape([v.shape for v in ins]), perm=perm, dtype=dtype)]


def _onnx_type(dtype) -> int:
    from tether.frontend.tensorflow.translate import ONNX_TYPES
    return ONNX_TYPES[np.dtype(dtype)]


def _not_equal(t: Translator, node: TFNode, ins: List[Value]) -> List[Value]:
    eq = elementwise("Equal", np.equal)(t, node, ins)[0]
    if eq.const is not None:
        return [t.constant(~eq.const)]
    return [t.out(t.emit1("Not", [eq.name]), like=eq, perm=eq.perm)]


def _is_finite(t: Translator, node: TFNode, ins: List[Value]) -> List[Value]:
    x = ins[0]
    if x.const is not None:
        return [t.constant(np.isfinite(x.const))]
    bad = t.emit1("Or", [t.emit1("IsNaN", [t.name(x)]), t.emit1("IsInf", [t.name(x)])])
    return [t.out(t.emit1("Not", [bad]), like=x, perm=x.perm, dtype=np.dtype(np.bool_))]


def _add_n(t: Translator, node: TFNode, ins: List[Value]) -> List[Value]:
    if len(ins) == 1:
        return ins
    return elementwise("Sum", lambda *a: np.sum(a, axis=0).astype(a[0].dtype))(t, node, ins)


def _clip(t: Translator, node: TFNode, ins: List[Value]) -> List[Value]:
    lo = elementwise("Min", _keep(np.minimum))(t, node, [ins[0], ins[2]])[0]
    return elementwise("Max", _keep(np.maximum))(t, node, [lo, ins[1]])


def _select(t: Translator, node: TFNode, ins: List[Value]) -> List[Value]:
    cond, a, b = ins
    if node.op == "Select" and cond.rank == 1 and (a.rank or 1) > 1:
        # the v1 op: a vector condition picks whole rows of the first dimension
        c = cond.const.reshape((-1,) + (1,) * (a.rank - 1)) if cond.const is not None else None
        if c is not None:
            cond = t.constant(c)
        else:
            cond = Value(t.emit1("Reshape", [t.tf(cond), t.ints([-1] + [1] * (a.rank - 1))]), None,
                         (cond.shape[0],) + (1,) * (a.rank - 1), None, cond.dtype)
    if all(v.const is not None for v in (cond, a, b)):
        return [t.constant(np.where(cond.const, a.const, b.const))]
    names, perm = broadcast_operands(t, [cond, a, b])
    return [t.out(t.emit1("Where", names), shape=broadcast_shape([v.shape for v in (cond, a, b)]), perm=perm,
                  dtype=a.dtype or b.dtype)]


# -- reductions ----------------------------------------------------------------------------------------------
def _reduced_perm(perm: Perm, onnx_axes: Sequence[int]) -> Perm:
    """The layout left when the stored axes ``onnx_axes`` are dropped from a value stored in ``perm``."""
    if perm is None:
        return None
    kept = [perm[i] for i in range(len(perm)) if i not in onnx_axes]
    ranks = tuple(sorted(kept).index(k) for k in kept)
    return None if ranks == tuple(range(len(ranks))) else ranks


def reduction(onnx_op: str, fold: Callable) -> Converter:
    def convert(t: Translator, node: TFNode, ins: List[Value]) -> List[Value]:
        x, axes_v = ins
        axes = [int(a) for a in np.asarray(require_const(node, axes_v, "axes")).reshape(-1)]
        keep = bool(node.attr("keep_dims", False))
        if x.const is not None:
            return [t.constant(np.asarray(fold(x.const, axis=tuple(axes), keepdims=keep)).astype(x.const.dtype))]
        if not axes:
            return [x]
        rank = x.rank
        if x.perm is not None:
            onnx_axes = sorted(x.perm.index(a % len(x.perm)) for a in axes)
        else:
            onnx_axes = axes
        shape = None
        if rank is not None and x.shape is not None:
            norm = {a % rank for a in axes}
            shape = tuple(1 if i in norm else d for i, d in enumerate(x.shape) if keep or i not in norm)
        out = t.emit1(onnx_op, [t.name(x), t.ints(onnx_axes)], keepdims=int(keep))
        perm = x.perm if keep else _reduced_perm(x.perm, onnx_axes)
        return [t.out(out, shape=shape, perm=perm, dtype=x.dtype)]
    return convert


def _any_all(onnx_op: str, fold: Callable) -> Converter:
    def convert(t: Translator, node: TFNode, ins: List[Value]) -> List[Value]:
        x, axes_v = ins
        axes = [int(a) for a in np.asarray(require_const(node, axes_v, "axes")).reshape(-1)]
        keep = bool(node.attr("keep_dims", False))
        if x.const is not None:
            return [t.constant(np.asarray(fold(x.const, axis=tuple(axes), keepdims=keep)))]
        as_int = t.emit1("Cast", [t.tf(x)], to=6)
        red = t.emit1(onnx_op, [as_int, t.ints(axes)], keepdims=int(keep))
        return [t.out(t.emit1("Cast", [red], to=9), dtype=np.dtype(np.bool_))]
    return convert


def _arg(onnx_op: str, fold: Callable) -> Converter:
    def convert(t: Translator, node: TFNode, ins: List[Value]) -> List[Value]:
        x, axis_v = ins
        axis = int(np.asarray(require_const(node, axis_v, "axis")).reshape(-1)[0])
        dtype = node_dtype(node, "output_type") or np.dtype(np.int64)
        if x.const is not None:
            return [t.constant(fold(x.const, axis=axis).astype(dtype))]
        out = t.emit1(onnx_op, [t.tf(x)], axis=axis, keepdims=0)
        if dtype != np.int64:
            out = t.emit1("Cast", [out], to=_onnx_type(dtype))
        return [t.out(out, dtype=dtype)]
    return convert


def _softmax(onnx_op: str) -> Converter:
    def convert(t: Translator, node: TFNode, ins: List[Value]) -> List[Value]:
        x = ins[0]
        axis = t.onnx_axis(x, -1) if x.perm is not None else -1
        return [t.out(t.emit1(onnx_op, [t.name(x)], axis=axis), like=x, perm=x.perm)]
    return convert


# -- products ------------------------------------------------------------------------------------------------
def _swap_last(t: Translator, v: Value) -> str:
    if v.const is not None:
        return t.name(t.constant(np.swapaxes(v.const, -1, -2)))
    r = v.rank
    perm = list(range(r))
    perm[-1], perm[-2] = perm[-2], perm[-1]
    return t.emit1("Transpose", [t.tf(v)], perm=perm)


def _matmul(t: Translator, node: TFNode, ins: List[Value]) -> List[Value]:
    a, b = ins
    ta = bool(node.attr("transpose_a", False) or node.attr("adj_x", False))
    tb = bool(node.attr("transpose_b", False) or node.attr("adj_y", False))
    if a.const is not None and b.const is not None:
        ac = np.swapaxes(a.const, -1, -2) if ta else a.const
        bc = np.swapaxes(b.const, -1, -2) if tb else b.const
        return [t.constant(np.matmul(ac, bc).astype(a.const.dtype))]
    if (ta and a.rank is None) or (tb and b.rank is None):
        eq = "...%s,...%s->...ik" % ("ji" if ta else "ij", "kj" if tb else "jk")
        return [t.out(t.emit1("Einsum", [t.tf(a), t.tf(b)], equation=eq), dtype=a.dtype)]
    na = _swap_last(t, a) if ta else t.tf(a)
    nb = _swap_last(t, b) if tb else t.tf(b)
    shape = None
    if a.shape is not None and b.shape is not None and a.rank >= 2 and b.rank >= 2:
        m = a.shape[-1] if ta else a.shape[-2]
        n = b.shape[-2] if tb else b.shape[-1]
        batch = broadcast_shape([a.shape[:-2], b.shape[:-2]])
        shape = None if batch is None else batch + (m, n)
    return [t.out(t.emit1("MatMul", [na, nb]), shape=shape, dtype=a.dtype)]


def _einsum(t: Translator, node: TFNode, ins: List[Value]) -> List[Value]:
    eq = node.attr("equation")
    if all(v.const is not None for v in ins):
        return [t.constant(np.einsum(eq, *[v.const for v in ins]))]
    return [t.out(t.emit1("Einsum", [t.tf(v) for v in ins], equation=eq), dtype=ins[0].dtype)]


CONVERTERS: Dict[str, Converter] = {
    "Relu": unary("Relu", lambda x: np.maximum(x, 0)),
    "Relu6": _chain(lambda x, n: np.clip(x, 0, 6), _relu6),
    "Elu": unary("Elu", lambda x: np.where(x > 0, x, np.expm1(np.minimum(x, 0)))),
    "Selu": unary("Selu", lambda x: 1.0507009873554805 * np.where(x > 0, x, 1.6732632423543772 *
                                                                  np.expm1(np.minimum(x, 0)))),
    "LeakyRelu": _chain(lambda x, n: np.where(x > 0, x, x * n.attr("alpha", 0.2)), _leaky),
    "Sigmoid": unary("Sigmoid", lambda x: 1 / (1 + np.exp(-x))),
    "Tanh": unary("Tanh", np.tanh),
    "Softplus": unary("Softplus", lambda x: np.logaddexp(0, x)),
    "Softsign": unary("Softsign", lambda x: x / (1 + np.abs(x))),
    "Exp": unary("Exp", np.exp),
    "Log": unary("Log", np.log),
    "Neg": unary("Neg", np.negative),
    "Abs": unary("Abs", np.abs),
    "Sqrt": unary("Sqrt", np.sqrt),
    "Rsqrt": _chain(lambda x, n: 1 / np.sqrt(x), _rsqrt),
    "Square": _chain(lambda x, n: x * x, _square),
    "Reciprocal": unary("Reciprocal", lambda x: 1 / x),
    "Inv": unary("Reciprocal", lambda x: 1 / x),
    "Erf": unary("Erf", _erf),
    "Erfc": _chain(lambda x, n: 1 - _erf(x), _erfc),
    "Gelu": _chain(_gelu_fold, _gelu),
    "Floor": unary("Floor", np.floor),
    "Ceil": unary("Ceil", np.ceil),
    "Round": unary("Round", np.round),             # both round half to even
    "Sign": unary("Sign", np.sign),
    "Sin": unary("Sin", np.sin),
    "Cos": unary("Cos", np.cos),
    "Tan": unary("Tan", np.tan),
    "Asin": unary("Asin", np.arcsin),
    "Acos": unary("Acos", np.arccos),
    "Atan": unary("Atan", np.arctan),
    "Sinh": unary("Sinh", np.sinh),
    "Cosh": unary("Cosh", np.cosh),
    "Asinh": unary("Asinh", np.arcsinh),
    "Acosh": unary("Acosh", np.arccosh),
    "Atanh": unary("Atanh", np.arctanh),
    "Rint": unary("Round", np.round),
    "Log1p": _chain(lambda x, n: np.log1p(x), lambda t, x, node, v: t.emit1("Log", [t.emit1("Add", [
        x, _scalar(t, v, 1)])])),
    "Expm1": _chain(lambda x, n: np.expm1(x), lambda t, x, node, v: t.emit1("Sub", [t.emit1("Exp", [x]),
                                                                                     _scalar(t, v, 1)])),
    "IsNan": elementwise("IsNaN", np.isnan),
    "IsInf": elementwise("IsInf", np.isinf),
    "IsFinite": _is_finite,
    "LogicalNot": elementwise("Not", np.logical_not),
    "Add": elementwise("Add", _keep(np.add)),
    "AddV2": elementwise("Add", _keep(np.add)),
    "Sub": elementwise("Sub", _keep(np.subtract)),
    "Mul": elementwise("Mul", _keep(np.multiply)),
    "RealDiv": elementwise("Div", _keep(np.divide)),
    "Div": elementwise("Div", _keep(np.divide)),
    "FloorDiv": _floor_div,
    "FloorMod": _floor_mod,
    "Mod": elementwise("Mod", _keep(np.fmod), fmod=1),              # C's fmod: the result takes x's sign
    "TruncateMod": elementwise("Mod", _keep(np.fmod), fmod=1),
    "TruncateDiv": elementwise("Div", lambda a, b: np.trunc(np.divide(a, b)).astype(np.asarray(a).dtype)),
    "Maximum": elementwise("Max", _keep(np.maximum)),
    "Minimum": elementwise("Min", _keep(np.minimum)),
    "Pow": elementwise("Pow", _keep(np.power)),
    "SquaredDifference": _squared_difference,
    "Equal": elementwise("Equal", np.equal),
    "NotEqual": _not_equal,
    "Less": elementwise("Less", np.less),
    "LessEqual": elementwise("LessOrEqual", np.less_equal),
    "Greater": elementwise("Greater", np.greater),
    "GreaterEqual": elementwise("GreaterOrEqual", np.greater_equal),
    "LogicalAnd": elementwise("And", np.logical_and),
    "LogicalOr": elementwise("Or", np.logical_or),
    "AddN": _add_n,
    "ClipByValue": _clip,
    "Select": _select,
    "SelectV2": _select,
    "Mean": reduction("ReduceMean", np.mean),
    "Sum": reduction("ReduceSum", np.sum),
    "Max": reduction("ReduceMax", np.max),
    "Min": reduction("ReduceMin", np.min),
    "Prod": reduction("ReduceProd", np.prod),
    "All": _any_all("ReduceMin", np.all),
    "Any": _any_all("ReduceMax", np.any),
    "ArgMax": _arg("ArgMax", np.argmax),
    "ArgMin": _arg("ArgMin", np.argmin),
    "Softmax": _softmax("Softmax"),
    "LogSoftmax": _softmax("LogSoftmax"),
    "MatMul": _matmul,
    "BatchMatMul": _matmul,
    "BatchMatMulV2": _matmul,
    "BatchMatMulV3": _matmul,
    "Einsum": _einsum,
}
