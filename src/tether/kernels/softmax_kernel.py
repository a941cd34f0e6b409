"""The ``softmax`` op over the last axis, written directly as loop IR: one task per row, three passes over the row.

The te form (ops.reduction.softmax) is four stages, each a parallel loop over all rows: the row maxima (a serial
scalar reduction: one dependent ``max`` per element), ``exp(x - max)`` materialized into a scratch tensor as large
as the input, the row sums (serial again) and the division. Over a CTC classifier's 80 x 6625 scores that ran at
2x onnxruntime's kernel. Here each row is one task that keeps its data in L1 (6625 floats: 26 KB), as
onnxruntime's MLAS does:
1. the maximum, in ``U`` vectors of partial maxima (independent chains, so the loop is not bound by the latency
   of one ``max``);
2. ``y = exp(x - max)`` written straight to the output, summed in ``U`` vectors of partial sums;
3. ``y *= 1 / sum``.
The partial maxima and sums are combined as vectors first, then across one vector's lanes.
Each pass runs its row as blocks of U vectors, then whole vectors, then scalars. Terms whose exponent is below
ops.reduction.EXP_FLUSH_BELOW are flushed to zero as in the te form (no subnormal arithmetic). A softmax over
another axis, or of another dtype, is the te form, lowered here to the same PrimFunc interface.
"""
from __future__ import annotations

from typing import Callable, Dict

from tether import ops, te
from tether.graph.ir import Node, TensorType
from tether.kernels.registry import LoopKernel, Strategy, kernel_shape
from tether.ops.reduction import EXP_FLUSH_BELOW
from tether.ops.schedules import family_of
from tether.te.lower import lower as te_lower
from tether.tir import Allocate, Buffer, Const, Expr, For, Load, PrimFunc, Stmt, Store, Var, seq

# partial maxima / sums per row: U vectors (4 x 16 lanes on AVX-512), enough independent chains to hide the
# latency of a vector max or add
ACC_VECTORS = 4


def _i(v: int) -> Const:
    return Const(v, "int32")


def _loop(name: str, extent: int, body: Callable[[Expr], Stmt], kind: str = "serial") -> Stmt:
    v = Var(name)
    return For(v, _i(0), _i(extent), kind, body(v),
               max_extent=extent if kind in ("vectorized", "unrolled") else None)


def _row_pass(n: int, lanes: int, unroll: int, fn: Callable[[Expr, Expr], Stmt]) -> Stmt:
    """fn(accumulator slot, element) over one row of n: blocks of ``unroll`` vectors, then vectors, then scalars
    (the scalars and vectors of the tail use the first slots)."""
    block = unroll * lanes
    parts = []
    nb = n // block
    if nb:
        parts.append(_loop("c", nb, lambda co: _loop("u", unroll, lambda u: _loop(
            "l", lanes, lambda l: fn(u * lanes + l, co * block + u * lanes + l), "vectorized"), "unrolled")))
    start = nb * block
    nv = (n - start) // lanes
    if nv:
        parts.append(_loop("v", nv, lambda vo: _loop(
            "l", lanes, lambda l: fn(l, start + vo * lanes + l), "vectorized")))
    start += nv * lanes
    if n - start:
        parts.append(_loop("s", n - start, lambda s: fn(_i(0), start + s)))
    return seq(*parts)


def _direct(name: str, shape: tuple, dtype: str, lanes: int, parallel_min: int) -> PrimFunc:
    n = int(shape[-1])
    rows = 1
    for d in shape[:-1]:
        rows *= int(d)
    x_ph = te.placeholder(shape, dtype, name="x")
    y_ph = te.placeholder(shape, dtype, name="y")
    x, y = Buffer("x", shape, dtype, "param"), Buffer("y", shape, dtype, "param")
    unroll = ACC_VECTORS if n >= ACC_VECTORS * lanes else 1
    slots = unroll * lanes
    zero, lo = te.const(0.0, dtype), te.const(EXP_FLUSH_BELOW, dtype)

    def row(r: Expr) -> Stmt:
        acc = Buffer("acc", (slots,), dtype, "local")
        st = Buffer("st", (1,), dtype, "local")        # the row's max, then its 1 / sum
        base = r * n
        xs = lambda e: Load(x, base + e)              # noqa: E731
        total = Load(st, _i(0))

        def fold(combine) -> Stmt:
            """st[0] = the slots combined: the U vectors into the first as vectors, then its lanes one by one (one
            by one over all U x lanes slots, a row of 256 spent more time here than in its three passes)."""
            vectors = [_loop("u", unroll - 1, lambda u: _loop("l", lanes, lambda l: Store(
                acc, l, combine(Load(acc, l), Load(acc, (u + 1) * lanes + l))), "vectorized"))] if unroll > 1 else []
            return seq(*vectors, Store(st, _i(0), Load(acc, _i(0))),
                       _loop("a", lanes - 1, lambda a: Store(st, _i(0), combine(total, Load(acc, a + 1)))))

        def exp_term(e: Expr) -> Expr:
            d = xs(e) - total
            return te.if_then_else(d < lo, zero, te.exp(te.max(d, lo)))

        init = lambda v: _loop("a", slots, lambda a: Store(acc, a, v))     # noqa: E731
        body = seq(
            init(xs(_i(0))),
            _row_pass(n, lanes, unroll, lambda a, e: Store(acc, a, te.max(Load(acc, a), xs(e)))),
            fold(te.max),
            init(zero),
            _row_pass(n, lanes, unroll, lambda a, e: seq(Store(y, base + e, exp_term(e)),
                                                         Store(acc, a, Load(acc, a) + Load(y, base + e)))),
            fold(lambda p, q: p + q),
            Store(st, _i(0), te.const(1.0, dtype) / total),
            _row_pass(n, lanes, unroll, lambda a, e: Store(y, base + e, Load(y, base + e) * total)),
        )
        return Allocate(acc, Allocate(st, body))

    kind = "parallel" if rows > 1 and rows * n >= parallel_min else "serial"
    return PrimFunc(name, [x_ph, y_ph], [x, y], _loop("r", rows, row, kind))


def softmax_kernel(node: Node, types: Dict[str, TensorType], target, name: str) -> PrimFunc:
    """The PrimFunc of one ``softmax`` node: arguments are its input, then its output."""
    t = types[node.inputs[0]]
    shape = kernel_shape(t.shape)
    axis = int(node.attrs["axis"]) % len(shape)
    fam = family_of(target)
    if t.dtype == "float32" and axis == len(shape) - 1:
        return _direct(name, shape, t.dtype, fam.lanes, fam.parallel_min)
    x = te.placeholder(shape, t.dtype, name="x")
    out = ops.softmax(x, axis)
    return te_lower(ops.schedule([out], target), [x, out], name)


CPU_STRATEGIES: Dict[str, Strategy] = {
    "softmax": LoopKernel(lambda node, types, target, name, compile_body: softmax_kernel(node, types, target, name)),
}
