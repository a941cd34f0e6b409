"""Converters of elementwise ONNX ops: unary math and activations, binary arithmetic, comparison, logic,
bitwise ops, selection and casts."""
from __future__ import annotations

import numpy as np

from tether.errors import UnsupportedOpError
from tether.frontend.onnx.importer import (FLOATS, INTS, NUMERIC, ONNX_DTYPES, ConverterTable, alias_container,
                                           emit_reshape, no_legacy_broadcast, node_output, norm_axis, require_dtype,
                                           reshape_alias, str_attr)
from tether.graph import op_info

CONVERTERS = ConverterTable(__name__)


_UNARY = {"Relu": "relu", "Sigmoid": "sigmoid", "Tanh": "tanh", "Exp": "exp", "Log": "log", "Sqrt": "sqrt",
          "Neg": "neg", "Abs": "abs", "HardSwish": "hard_swish"}


@CONVERTERS.register(*_UNARY)
def _unary(im, node, ins, a):
    im.emit(_UNARY[node.op_type], ins[:1], {}, node.name, node_output(node))


@CONVERTERS.register("LeakyRelu")
def _leaky(im, node, ins, a):
    im.emit("leaky_relu", ins[:1], {"alpha": float(a.get("alpha", 0.01))}, node.name, node_output(node))


@CONVERTERS.register("HardSigmoid")
def _hsig(im, node, ins, a):
    im.emit("hard_sigmoid", ins[:1], {"alpha": float(a.get("alpha", 0.2)), "beta": float(a.get("beta", 0.5))},
            node.name, node_output(node))


_BINARY = {"Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div", "Pow": "pow"}


@CONVERTERS.register(*_BINARY)
def _binary(im, node, ins, a):
    if node.op_type == "Pow" and _pow_as_square(im, node, ins):
        return
    im.emit(_BINARY[node.op_type], ins[:2], {}, node.name, node_output(node))


# ---- Pow(x, 2) as x * x: layer norms written out (ReduceMean, Sub, Pow, ...) square with Pow, which
# the kernels compute as exp(2 log|x|) in double; x * x is the same correctly rounded value, 10-20x cheaper
def _pow_as_square(im, node, ins) -> bool:
    xt = im.type(ins[0])
    e = im.const(ins[1])
    if e is None or xt.dtype not in ("float32", "float16") or np.size(e) != 1 or np.ndim(e) > len(xt.shape):
        return False
    if float(np.asarray(e).reshape(())) != 2.0:
        return False
    im.emit("mul", [ins[0], ins[0]], {}, node.name, node_output(node))
    return True


def _fold_variadic(im, node, ins, op: str) -> None:
    """A variadic op as a chain of broadcasting binary ``op`` nodes; one input is an alias of it."""
    if len(ins) == 1:
        reshape_alias(im, ins[0], node)
        return
    acc = ins[0]
    for k, x in enumerate(ins[1:]):
        last = k == len(ins) - 2
        acc = im.emit(op, [acc, x], {}, node.name if last else node.name + "_%d" % k,
                      node_output(node) if last else None)


@CONVERTERS.register("Sum")
def _sum(im, node, ins, a):
    _fold_variadic(im, node, ins, "add")




@CONVERTERS.register("Identity")
def _identity(im, node, ins, a):
    # a sequence or an optional passes through as the same values (importer.alias_container); a tensor as a view
    if not alias_container(im, ins[0], node.output[0]):
        reshape_alias(im, ins[0], node)


@CONVERTERS.register("Dropout")
def _dropout(im, node, ins, a):
    # the identity, with an all-true mask, at inference and whenever the ratio is 0 (then training_mode, a
    # constant or not, changes nothing); random dropping in training is not computed
    ratio = im.const(ins[1]) if len(ins) > 1 and ins[1] else None
    zero_ratio = ratio is not None and float(np.asarray(ratio)) == 0.0
    if len(ins) > 2 and ins[2] and not zero_ratio:
        tm = im.require_const(ins[2], "Dropout training_mode", node.name)
        if bool(np.asarray(tm)):
            raise UnsupportedOpError("node %s: Dropout with training_mode=true and a ratio other than 0 drops at "
                                     "random; tether computes inference (training_mode false)" % node.name)
    reshape_alias(im, ins[0], node)
    if len(node.output) > 1 and node.output[1]:
        im.add_const(np.ones(im.type(ins[0]).shape, dtype=bool), name=node.output[1])


@CONVERTERS.register("Clip")
def _clip(im, node, ins, a):
    lo, hi = a.get("min", -np.inf), a.get("max", np.inf)
    x = ins[0]
    rest = []
    if im.opset >= 11:
        for k, default in ((1, -np.inf), (2, np.inf)):
            if len(ins) > k and ins[k]:
                c = im.const(ins[k])
                if c is None:
                    rest.append((k, ins[k]))
                elif k == 1:
                    lo = float(c)
                else:
                    hi = float(c)
    if not rest:
        im.emit("clip", [x], {"min": float(lo), "max": float(hi)}, node.name, node_output(node))
        return
    # bounds given at run time: max(x, lo) then min(., hi)
    cur = x
    if np.isfinite(lo):
        cur = im.emit("maximum", [cur, im.add_const(np.array(lo, dtype=im.type(x).dtype))])
    for k, v in rest:
        last = (k, v) == rest[-1]
        cur = im.emit("maximum" if k == 1 else "minimum", [cur, v], {}, node.name + "_%d" % k,
                      node_output(node) if last and not (k == 1 and np.isfinite(hi)) else None)
    if np.isfinite(hi) and rest[-1][0] == 1:
        im.emit("minimum", [cur, im.add_const(np.array(hi, dtype=im.type(x).dtype))], {}, node.name, node_output(node))

_COMPARE = {"Equal": "equal", "Less": "less", "LessOrEqual": "less_equal", "Greater": "greater",
            "GreaterOrEqual": "greater_equal"}
_LOGICAL = {"And": "logical_and", "Or": "logical_or", "Xor": "logical_xor"}


@CONVERTERS.register(*_COMPARE)
def _compare(im, node, ins, a):
    no_legacy_broadcast(node, a)
    allowed = NUMERIC + ("bool",) if node.op_type == "Equal" else NUMERIC
    dt = require_dtype(im, node, ins[0], allowed)
    require_dtype(im, node, ins[1], (dt,))
    im.emit(_COMPARE[node.op_type], ins[:2], {}, node.name, node_output(node))


@CONVERTERS.register(*_LOGICAL)
def _logical(im, node, ins, a):
    no_legacy_broadcast(node, a)
    for x in ins[:2]:
        require_dtype(im, node, x, ("bool",))
    im.emit(_LOGICAL[node.op_type], ins[:2], {}, node.name, node_output(node))


@CONVERTERS.register("Not")
def _not(im, node, ins, a):
    require_dtype(im, node, ins[0], ("bool",))
    im.emit("logical_not", ins[:1], {}, node.name, node_output(node))


@CONVERTERS.register("Where")
def _where(im, node, ins, a):
    require_dtype(im, node, ins[0], ("bool",))
    dt = require_dtype(im, node, ins[1], NUMERIC + ("bool",))
    require_dtype(im, node, ins[2], (dt,))
    im.emit("where", ins[:3], {}, node.name, node_output(node))


@CONVERTERS.register("Mod")
def _mod(im, node, ins, a):
    fmod = int(a.get("fmod", 0))
    dt = require_dtype(im, node, ins[0], NUMERIC)
    require_dtype(im, node, ins[1], (dt,))
    if dt in FLOATS and not fmod:
        if im.opset < 28:
            raise UnsupportedOpError("node %s: Mod of %s tensors with fmod=0 (defined from opset 28; the model has "
                                     "opset %d)" % (node.name, dt, im.opset))
        # opset 28: numpy's float %, the sign of the divisor
        im.emit("float_mod", ins[:2], {}, node.name, node_output(node))
        return
    im.emit("mod", ins[:2], {"fmod": fmod}, node.name, node_output(node))


@CONVERTERS.register("PRelu")
def _prelu(im, node, ins, a):
    dt = require_dtype(im, node, ins[0], FLOATS + ("int32", "int64"))
    require_dtype(im, node, ins[1], (dt,))
    xs, ss = im.type(ins[0]).shape, im.type(ins[1]).shape
    slope = ins[1]
    if im.opset < 7 and len(ss) == 1 and len(xs) > 2 and ss[0] == xs[1]:
        slope = emit_reshape(im, slope, (ss[0],) + (1,) * (len(xs) - 2))   # opset 6: a per-channel slope
        ss = im.type(slope).shape
    try:
        ok = op_info.broadcast_shapes(xs, ss) == tuple(xs)
    except ValueError:
        ok = False
    if not ok:
        raise UnsupportedOpError("node %s: PRelu slope of shape %s does not broadcast to the input's %s"
                                 % (node.name, ss, xs))
    im.emit("prelu", [ins[0], slope], {}, node.name, node_output(node))




# ONNX op -> (graph op, attribute defaults, dtypes)
_MATH_OPS = {
    "Erf": ("erf", {}, FLOATS), "Reciprocal": ("reciprocal", {}, FLOATS), "Floor": ("floor", {}, FLOATS),
    "Ceil": ("ceil", {}, FLOATS), "Round": ("round", {}, FLOATS), "Sign": ("sign", {}, NUMERIC),
    "IsNaN": ("isnan", {}, FLOATS), "IsInf": ("isinf", {"detect_positive": 1, "detect_negative": 1}, FLOATS),
    "Elu": ("elu", {"alpha": 1.0}, FLOATS),
    "Selu": ("selu", {"alpha": 1.67326319217681884765625, "gamma": 1.05070102214813232421875}, FLOATS),
    "Celu": ("celu", {"alpha": 1.0}, FLOATS), "Softplus": ("softplus", {}, FLOATS),
    "Softsign": ("softsign", {}, FLOATS), "Mish": ("mish", {}, FLOATS),
    "ThresholdedRelu": ("thresholded_relu", {"alpha": 1.0}, FLOATS),
    "Sinh": ("sinh", {}, FLOATS), "Cosh": ("cosh", {}, FLOATS), "Asinh": ("asinh", {}, FLOATS),
    "Acosh": ("acosh", {}, FLOATS), "Atanh": ("atanh", {}, FLOATS),
}


@CONVERTERS.register(*_MATH_OPS)
def _math(im, node, ins, a):
    op, defaults, dtypes = _MATH_OPS[node.op_type]
    require_dtype(im, node, ins[0], dtypes)
    attrs = {k: type(v)(a.get(k, v)) for k, v in defaults.items()}
    im.emit(op, ins[:1], attrs, node.name, node_output(node))


@CONVERTERS.register("Gelu")
def _gelu(im, node, ins, a):
    require_dtype(im, node, ins[0], FLOATS)
    approx = str_attr(a, "approximate", "none")
    if approx not in ("none", "tanh"):
        raise UnsupportedOpError("node %s: Gelu approximate=%r (the spec has 'none' and 'tanh')" % (node.name, approx))
    im.emit("gelu", ins[:1], {"approximate": approx}, node.name, node_output(node))


@CONVERTERS.register("Mean")
def _mean_variadic(im, node, ins, a):
    dt = require_dtype(im, node, ins[0], FLOATS)
    for x in ins[1:]:
        require_dtype(im, node, x, (dt,))
    if len(ins) == 1:
        reshape_alias(im, ins[0], node)
        return
    acc = ins[0]
    for k, x in enumerate(ins[1:]):
        acc = im.emit("add", [acc, x], {}, node.name + "_%d" % k)
    im.emit("div", [acc, im.add_const(np.array(len(ins), dtype=dt))], {}, node.name, node_output(node))


def _coerced_2d(im, node, ins, op: str, a):
    """Softmax-family ops: from opset 13 along one axis; before, over the input coerced to 2-D at ``axis``."""
    t = im.type(ins[0])
    require_dtype(im, node, ins[0], FLOATS)
    nd = len(t.shape)
    if im.opset >= 13:
        im.emit(op, [ins[0]], {"axis": norm_axis(a.get("axis", -1), nd)}, node.name, node_output(node))
        return
    axis = norm_axis(a.get("axis", 1), nd)
    lead = int(np.prod(t.shape[:axis], dtype=np.int64))
    flat = emit_reshape(im, ins[0], (lead, t.size // max(lead, 1)))
    y = im.emit(op, [flat], {"axis": 1}, node.name)
    emit_reshape(im, y, t.shape, node.name + "reshape", node.output[0])


@CONVERTERS.register("LogSoftmax")
def _log_softmax(im, node, ins, a):
    _coerced_2d(im, node, ins, "log_softmax", a)


@CONVERTERS.register("Hardmax")
def _hardmax(im, node, ins, a):
    _coerced_2d(im, node, ins, "hardmax", a)


# Cast: every dtype the kernels implement, in both directions; others (float8, int4, strings, ...) are refused.
_CAST_DTYPES = NUMERIC + ("bool", "float16", "bfloat16")


@CONVERTERS.register("Cast")
def _cast(im, node, ins, a):
    to = ONNX_DTYPES.get(a["to"], "elem_type_%d" % a["to"])
    if "saturate" in a and not a["saturate"] and to.startswith("float8"):
        raise UnsupportedOpError("node %s: Cast with saturate=0" % node.name)
    c = im.const(ins[0])
    if to not in _CAST_DTYPES:
        raise UnsupportedOpError("node %s: Cast to %s (tether casts between %s)" % (node.name, to,
                                                                                 ", ".join(_CAST_DTYPES)))
    if c is not None and c.dtype != object:
        im.add_const(op_info.evaluate("cast", {"to": to}, [c])[0], name=node.output[0])
        return
    src = require_dtype(im, node, ins[0], _CAST_DTYPES)
    if src == to:
        reshape_alias(im, ins[0], node)
        return
    im.emit("cast", ins[:1], {"to": to}, node.name, node_output(node))


@CONVERTERS.register("CastLike")
def _cast_like(im, node, ins, a):
    # CastLike(x, like) is Cast(x, to=like's dtype); saturate only concerns float8 targets, which are refused
    inv = {v: k for k, v in ONNX_DTYPES.items()}
    dt = str(im.type(ins[1]).dtype)
    if dt not in inv:
        raise UnsupportedOpError("node %s: CastLike to %s" % (node.name, dt))
    _cast(im, node, ins[:1], {"to": inv[dt]})


# ---------------------------------------------------------------- reductions (ONNX Reduce*, ArgMax/ArgMin)

# ---------------------------------------------------------------- bitwise ops and BitShift
_BITWISE = {"BitwiseAnd": "bitwise_and", "BitwiseOr": "bitwise_or", "BitwiseXor": "bitwise_xor"}


@CONVERTERS.register(*_BITWISE)
def _bitwise(im, node, ins, a):
    dt = require_dtype(im, node, ins[0], INTS)
    require_dtype(im, node, ins[1], (dt,))
    im.emit(_BITWISE[node.op_type], ins[:2], {}, node.name, node_output(node))


@CONVERTERS.register("BitwiseNot")
def _bitwise_not(im, node, ins, a):
    require_dtype(im, node, ins[0], INTS)
    im.emit("bitwise_not", ins[:1], {}, node.name, node_output(node))


@CONVERTERS.register("BitShift")
def _bit_shift(im, node, ins, a):
    # unsigned types, and from opset 28 signed ones (arithmetic right shift); the kernels lack uint16..uint64
    dt = require_dtype(im, node, ins[0], INTS)
    require_dtype(im, node, ins[1], (dt,))
    direction = str_attr(a, "direction", "")
    if direction not in ("LEFT", "RIGHT"):
        raise UnsupportedOpError("node %s: BitShift direction %r (LEFT or RIGHT)" % (node.name, direction))
    im.emit("bit_shift", ins[:2], {"direction": direction}, node.name, node_output(node))


# ---------------------------------------------------------------- Max/Min: NaN propagates on floats
@CONVERTERS.register("Max", "Min")
def _max_min(im, node, ins, a):
    """Variadic, broadcasting Max/Min; a NaN operand makes the element NaN (numpy, onnxruntime)."""
    dt = require_dtype(im, node, ins[0], NUMERIC)
    for x in ins[1:]:
        require_dtype(im, node, x, (dt,))
    op = ("maximum" if node.op_type == "Max" else "minimum") + ("_nan" if dt in FLOATS else "")
    _fold_variadic(im, node, ins, op)
