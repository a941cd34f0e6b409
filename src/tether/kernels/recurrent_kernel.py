"""The ``recurrent`` op's kernel, written directly as loop IR: te describes one value per output element and has
no loop that carries state, so the recurrence over time is a serial tir loop around each step's work.

Per direction (unrolled at build time) and time step:
1. the recurrent product ``gates[b, :] = xw[t, b, d, :] + h[b, :] @ rt[d]``: a register block of ``U`` vectors of
   output columns accumulates over the hidden units (each step reads ``rt`` once per batch row: the step is a
   matrix-vector product at batch 1, bound by the weights' bytes, as in onnxruntime);
2. the gate arithmetic for each hidden unit, vectorized: activations, the cell update and the ``seq_lens`` mask,
   writing ``y`` and the running state, which lives in the ``y_h`` (and ``y_c``) outputs themselves.
A GRU without ``linear_before_reset`` runs the product in two parts: z and r first, then ``(r * h) @ Rh``.
With ``quant_h`` (DynamicQuantizeLSTM) a step first quantizes the direction's hidden state (``quantize_h``); the
product then runs on those integers, exact in float32 (the frontend checks the bound), and is scaled into the gates.
"""
from __future__ import annotations

from typing import Callable, Dict, List, Optional

from tether import te
from tether.errors import UnsupportedOpError
from tether.graph.ir import Node, TensorType
from tether.kernels.recurrent_op import GATES, input_names
from tether.kernels.registry import LoopKernel, Strategy
from tether.ops.qnn import round_half_even
from tether.ops.schedules import family_of
from tether.tir import Allocate, Buffer, Const, Expr, For, IfThenElse, Load, PrimFunc, Stmt, Store, Var, seq

Act = Callable[[Expr], Expr]


def _k(v: float, dtype: str) -> Expr:
    return te.const(float(v), dtype)


def activation(name: str, alpha: float, beta: float, dtype: str) -> Act:
    zero, one = _k(0.0, dtype), _k(1.0, dtype)
    a, b = _k(alpha, dtype), _k(beta, dtype)
    table: Dict[str, Act] = {
        "relu": lambda x: te.max(x, zero),
        "tanh": te.tanh,
        "sigmoid": te.sigmoid,
        "affine": lambda x: a * x + b,
        "leakyrelu": lambda x: te.if_then_else(x >= zero, x, a * x),
        "thresholdedrelu": lambda x: te.if_then_else(x > a, x, zero),
        "scaledtanh": lambda x: a * te.tanh(b * x),
        "hardsigmoid": lambda x: te.min(te.max(a * x + b, zero), one),
        "elu": lambda x: te.if_then_else(x >= zero, x, a * (te.exp(x) - one)),
        "softsign": lambda x: x / (one + te.abs(x)),
        "softplus": lambda x: te.max(x, zero) + te.log(one + te.exp(zero - te.abs(x))),
    }
    return table[name]


class _Builder:
    def __init__(self, node: Node, types: Dict[str, TensorType], target, name: str):
        a = node.attrs
        self.a = a
        self.cell = a["cell"]
        self.H = a["hidden"]
        self.G = GATES[self.cell]
        self.N = self.G * self.H
        xw_t = types[node.inputs[0]]
        self.S, self.B = xw_t.shape[0], xw_t.shape[1]
        self.D = len(a["directions"])
        self.dtype = xw_t.dtype
        if self.dtype != "float32":
            raise UnsupportedOpError("node %s: %s on %s tensors (tether implements float32)"
                                     % (node.name, self.cell.upper(), self.dtype))
        fam = family_of(target)
        self.V = fam.lanes if self.H % fam.lanes == 0 else 1
        self.U_max = 4 if fam.name == "armv7" else 8     # accumulator vectors: half the register file
        names = input_names(a)
        self.params = [te.placeholder(types[v].shape, types[v].dtype, name=n) for n, v in zip(names, node.inputs)]
        out_names = ["y", "y_h", "y_c"][:len(node.outputs)]
        self.params += [te.placeholder(types[v].shape, types[v].dtype, name=n) for n, v in zip(out_names,
                                                                                              node.outputs)]
        self.buf = {p.name: Buffer(p.name, p.shape, p.dtype, "param") for p in self.params}
        self.name = name
        clip = a.get("clip")
        self.clip = None if clip is None else (_k(-clip, self.dtype), _k(clip, self.dtype))

    # ---- helpers
    def ld(self, buf: str, idx: Expr) -> Expr:
        return Load(self.buf[buf], idx)

    def cl(self, x: Expr) -> Expr:
        return x if self.clip is None else te.min(te.max(x, self.clip[0]), self.clip[1])

    def loop(self, name: str, extent: int, body: Callable[[Expr], Stmt], kind: str = "serial") -> Stmt:
        v = Var(name)
        return For(v, Const(0, "int32"), Const(extent, "int32"), kind, body(v),
                   max_extent=extent if kind in ("vectorized", "unrolled") else None)

    def vloop(self, name: str, extent: int, body: Callable[[Expr], Stmt]) -> Stmt:
        """``for j in range(extent)`` as vectors of V lanes (extent is a multiple of V)."""
        if self.V == 1:
            return self.loop(name, extent, body)
        return self.loop(name + "o", extent // self.V,
                         lambda jo: self.loop(name + "i", self.V, lambda ji: body(jo * self.V + ji), "vectorized"))

    # ---- step 1: the recurrent product over columns [c0, c1) of one direction
    def product(self, d: int, c0: int, c1: int, init: Callable[[Expr, Expr], Expr], src: Callable[[Expr, Expr], Expr],
                gates: Buffer, post: Optional[Callable[[Expr, Expr, Expr], Expr]] = None) -> Stmt:
        """A register block of Bb batch rows x U vectors of columns: each vector of R^T loaded per k serves Bb
        rows, so a batch reads the weights once per step, not once per row."""
        n, V = c1 - c0, self.V
        Bb = max(r for r in range(1, min(self.B, self.U_max // 2, 4) + 1) if self.B % r == 0) if self.B > 1 else 1
        U = next(u for u in range(max(1, self.U_max // Bb), 0, -1) if n % (u * V) == 0)
        acc = Buffer("acc", (Bb * U * V,), self.dtype, "local")

        def block(bo, jo):
            def lanes(fn):
                """fn(row in block, column in block, accumulator index) over the Bb x U x V block"""
                def vec(bi, u):
                    if V == 1:
                        return fn(bi, u, bi * U + u)
                    return self.loop("l", V, lambda l: fn(bi, u * V + l, (bi * U + u) * V + l), "vectorized")
                return self.loop("bi", Bb, lambda bi: self.loop("u", U, lambda u: vec(bi, u), "unrolled"),
                                 "unrolled")
            row = lambda bi: bo * Bb + bi                   # noqa: E731
            col = lambda i: jo * (U * V) + c0 + i           # noqa: E731
            first = lanes(lambda bi, i, a: Store(acc, a, init(row(bi), col(i))))
            upd = self.loop("k", self.H, lambda k: lanes(lambda bi, i, a: Store(
                acc, a, Load(acc, a) + self.ld("rt", (d * self.H + k) * self.N + col(i)) * src(row(bi), k))))
            out = lanes(lambda bi, i, a: Store(gates, row(bi) * self.N + col(i), Load(acc, a) if post is None
                                               else post(row(bi), col(i), Load(acc, a))))
            return Allocate(acc, seq(first, upd, out))
        return self.loop("bo", self.B // Bb, lambda bo: self.loop("jo", n // (U * V), lambda jo: block(bo, jo)))

    # ---- step 2: the cell update
    def state(self, d: int, b: Expr, j: Expr) -> Expr:
        """The flat index of unit j of batch row b, direction d, in the state outputs (D, B, H)."""
        return (d * self.B + b) * self.H + j

    def update(self, d: int, t: Expr, gates: Buffer, acts: List[Act]) -> Stmt:
        H, N, dt = self.H, self.N, self.dtype
        zero, one = _k(0.0, dt), _k(1.0, dt)
        has_lens = self.a.get("has_seq_lens")

        def unit(b, j):
            g = lambda k: Load(gates, b * N + k * H + j)    # noqa: E731
            x = lambda k: self.ld("xw", ((t * self.B + b) * self.D + d) * N + k * H + j)   # noqa: E731
            si = self.state(d, b, j)
            h = self.ld("y_h", si)
            stores = []
            if self.cell == "lstm":
                c = self.ld("y_c", si)
                peep = (lambda k, v: self.ld("p", d * 3 * H + k * H + j) * v) if self.a.get("has_peephole") \
                    else (lambda k, v: zero)
                i = acts[0](self.cl(g(0) + peep(0, c)))
                f = one - i if self.a.get("input_forget") else acts[0](self.cl(g(2) + peep(2, c)))
                cn = f * c + i * acts[1](self.cl(g(3)))
                o = acts[0](self.cl(g(1) + peep(1, cn)))
                hn = o * acts[2](cn)
                new_c = cn
            elif self.cell == "gru":
                z = acts[0](self.cl(g(0)))
                if self.a.get("linear_before_reset"):
                    r = acts[0](self.cl(g(1)))
                    hh = acts[1](self.cl(x(2) + r * (g(2) + self.ld("rbh", d * H + j))))
                else:
                    hh = acts[1](self.cl(g(2)))
                hn = (one - z) * hh + z * h
            else:
                hn = acts[0](self.cl(g(0)))
            yi = ((t * self.D + d) * self.B + b) * H + j
            # Expressions are trees evaluated at each store: ``hn`` reads the old c and h, so y_c is written last
            # and y_h after y (the new c reads neither h nor y); LLVM merges the repeated arithmetic.
            if has_lens:
                valid = t < self.ld("seq_lens", b)
                stores.append(Store(self.buf["y"], yi, te.if_then_else(valid, hn, zero)))
                stores.append(Store(self.buf["y_h"], si, te.if_then_else(valid, hn, h)))
                if self.cell == "lstm":
                    stores.append(Store(self.buf["y_c"], si, te.if_then_else(valid, new_c, c)))
            else:
                stores.append(Store(self.buf["y"], yi, hn))
                stores.append(Store(self.buf["y_h"], si, hn))
                if self.cell == "lstm":
                    stores.append(Store(self.buf["y_c"], si, new_c))
            return seq(*stores)
        return self.loop("b", self.B, lambda b: self.vloop("j", H, lambda j: unit(b, j)))

    def gru_reset(self, d: int, gates: Buffer, rh: Buffer, act: Act) -> Stmt:
        """``rh = r * h`` for the second part of a GRU product (without linear_before_reset)."""
        H, N = self.H, self.N
        return self.loop("b", self.B, lambda b: self.vloop("j", H, lambda j: Store(
            rh, b * H + j, act(self.cl(Load(gates, b * N + H + j))) * self.ld("y_h", self.state(d, b, j)))))

    # ---- DynamicQuantizeLSTM: the hidden state quantized per step
    def quantize_h(self, d: int, hq: Buffer, qp: Buffer) -> Stmt:
        """``hq = round(clamp(h / s, -zp, 255 - zp))`` over the direction's B x H state, ``qp = [s, min, max]``:
        onnxruntime's GetQuantizationParameter (range widened to 0, s = (max - min) / 255, zp rounded half to
        even) and MlasQuantizeLinear (clamped before rounding), minus the zero point."""
        dt, n = self.dtype, self.B * self.H
        zero, one, top = _k(0.0, dt), _k(1.0, dt), _k(255.0, dt)
        slot = lambda k: Const(k, "int32")           # noqa: E731
        h = lambda i: self.ld("y_h", d * n + i)      # noqa: E731
        s, mn, mx = Load(qp, slot(0)), Load(qp, slot(1)), Load(qp, slot(2))
        find = seq(Store(qp, slot(1), zero), Store(qp, slot(2), zero),
                   self.loop("i", n, lambda i: seq(Store(qp, slot(1), te.min(mn, h(i))),
                                                   Store(qp, slot(2), te.max(mx, h(i))))))
        scale = Store(qp, slot(0), te.if_then_else(mx == mn, one, (mx - mn) / top))
        zp = round_half_even(te.min(te.max(zero - mn / s, zero), top))
        quant = self.loop("i", n, lambda i: Store(hq, i, round_half_even(te.min(te.max(h(i) / s, zero - zp),
                                                                                top - zp))))
        return seq(find, scale, quant)

    # ---- the whole kernel
    def build(self) -> PrimFunc:
        a, H, N = self.a, self.H, self.N
        n_state = self.D * self.B * H
        init = [self.loop("s", n_state, lambda i: Store(self.buf["y_h"], i, self.ld("h0", i)))]
        if self.cell == "lstm":
            init.append(self.loop("s", n_state, lambda i: Store(self.buf["y_c"], i, self.ld("c0", i))))
        # the directions write disjoint parts of y, y_h and y_c: with enough work each, they run as the two tasks of
        # a parallel loop (a bidirectional layer's second thread otherwise idles through the serial recurrence)
        dirs = [self.direction(d, direction) for d, direction in enumerate(a["directions"])]
        if len(dirs) == 2 and self.S * self.B * N * H >= PARALLEL_DIRECTIONS_MIN_MACS:
            dv = Var("d")
            body = seq(*init, For(dv, Const(0, "int32"), Const(2, "int32"), "parallel",
                                  IfThenElse(dv == Const(0, "int32"), dirs[0], dirs[1])))
        else:
            body = seq(*init, *dirs)
        return PrimFunc(self.name, self.params, [self.buf[p.name] for p in self.params], body)

    def direction(self, d: int, direction: str) -> Stmt:
        """Every time step of direction ``d``, with its own scratch buffers."""
        a, dt, H, N = self.a, self.dtype, self.H, self.N
        gates = Buffer("gates", (self.B * N,), dt, "local")
        rh = Buffer("rh", (self.B * H,), dt, "local")
        hq = Buffer("hq", (self.B * H,), dt, "local")      # quant_h: the quantized state minus its zero point
        qp = Buffer("qp", (3,), dt, "local")               # quant_h: scale, min, max
        acts = [activation(n, al, be, dt) for n, al, be in a["acts"][d]]

        def step(s):
            t = s if direction == "forward" else (self.S - 1) - s
            xrow = lambda b, col: self.ld("xw", ((t * self.B + b) * self.D + d) * N + col)   # noqa: E731
            hsrc = lambda b, k: self.ld("y_h", self.state(d, b, k))                    # noqa: E731
            parts = []
            if self.cell == "gru" and not a.get("linear_before_reset"):
                parts.append(self.product(d, 0, 2 * H, xrow, hsrc, gates))
                parts.append(self.gru_reset(d, gates, rh, acts[0]))
                parts.append(self.product(d, 2 * H, 3 * H, xrow, lambda b, k: Load(rh, b * H + k), gates))
            elif self.cell == "gru":
                zero = _k(0.0, dt)
                parts.append(self.product(d, 0, 2 * H, xrow, hsrc, gates))
                parts.append(self.product(d, 2 * H, 3 * H, lambda b, col: zero, hsrc, gates))
            elif a.get("quant_h"):
                zero = _k(0.0, dt)
                parts.append(self.quantize_h(d, hq, qp))
                parts.append(self.product(
                    d, 0, N, lambda b, col: zero, lambda b, k: Load(hq, b * H + k), gates,
                    lambda b, col, acc: xrow(b, col) + acc * (Load(qp, Const(0, "int32"))
                                                              * self.ld("r_scale", d * N + col))))
            else:
                parts.append(self.product(d, 0, N, xrow, hsrc, gates))
            parts.append(self.update(d, t, gates, acts))
            return seq(*parts)
        stmt = Allocate(gates, self.loop("t", self.S, step))
        if self.cell == "gru" and not a.get("linear_before_reset"):
            stmt = Allocate(rh, stmt)
        if a.get("quant_h"):
            stmt = Allocate(hq, Allocate(qp, stmt))
        return stmt


# A bidirectional layer runs its directions in parallel from this many multiply-adds (steps x batch x gate
# columns x hidden units) per direction: a CRNN's 80 steps of 512 x 128 (5.2 M) gain ~2x at 2 threads; a
# parallel launch costs a few microseconds.
PARALLEL_DIRECTIONS_MIN_MACS = 1 << 18


def recurrent_kernel(node: Node, types: Dict[str, TensorType], target, name: str) -> PrimFunc:
    """The PrimFunc of one ``recurrent`` node: arguments are the node's inputs, then its outputs."""
    return _Builder(node, types, target, name).build()


# the body compiler is not needed: the cell's arithmetic is written here
CPU_STRATEGIES: Dict[str, Strategy] = {
    "recurrent": LoopKernel(
        lambda node, types, target, name, compile_body: recurrent_kernel(node, types, target, name)),
}
