"""Lowering: a te Schedule -> a tir.PrimFunc (loop nests over flat buffers).

Per stage: leaf loops come from the split/fuse relations, tails of non-dividing splits become clamped loop
extents (``min(f, n - xo*f)``) or, when the condition is not linear in the innermost loop, an ``if`` guard.
Stages attached with compute_at compute only the region their consumer's inner loops read (interval bound
inference over the consumer's index expressions) into a small buffer offset by the region's start.
Clamped vectorized/unrolled loops are then partitioned (``if full: constant extents else: serial remainder``)
at the loop their clamp depends on, so hot loops carry no tail checks.

Intermediate buffers are ``Allocate`` nodes; codegen puts them on the stack (entry-block allocas that LLVM
promotes to registers) or, when large and outside parallel loops, in static scratch memory (the module has no
heap); a spin lock then serialises concurrent calls of that kernel.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

from tether.errors import CompileError, ScheduleError
from tether.te.expr import Binary, Compare, Const, Expr, IterVar, Reduce, TensorLoad, Var, is_int
from tether.te.schedule import MAX_VECTOR_LANES, Schedule, Split, Stage
from tether.te.tensor import PlaceholderOp, Tensor, rebuild, substitute, walk
from tether.tir.nodes import Allocate, Buffer, For, IfThenElse, Load, PrimFunc, Stmt, Store, seq, walk_stmts
from tether.tir.simplify import Simplifier, simplify

MAX_UNROLL = 1024


def _c(v: int) -> Const:
    return Const(v, "int32")


def _combine(combiner: str, acc: Expr, x: Expr) -> Expr:
    if combiner == "sum":
        return Binary("add", acc, x, acc.dtype)
    if combiner == "prod":
        return Binary("mul", acc, x, acc.dtype)
    return Binary(combiner, acc, x, acc.dtype)


def _uses_var(e: Expr, vs) -> bool:
    ids = {id(v) for v in vs}
    return any(isinstance(n, Var) and id(n) in ids for n in walk(e))


class _StageInfo:
    """Loop structure of one stage for one placement (region)."""

    def __init__(self, stage: Stage):
        self.stage = stage
        self.leaves: List[IterVar] = list(stage.leaf_iter_vars)
        self.ext: Dict[IterVar, int] = {}
        self.value: Dict[IterVar, Expr] = {}
        self.guards: List[Expr] = []
        self.root_abs: Dict[IterVar, Expr] = {}


class Lowering:
    def __init__(self, sch: Schedule, args: Sequence[Tensor], name: str):
        self.sch = sch
        self.args = list(args)
        self.name = name
        self.ranges: Dict[Var, Tuple[int, int]] = {}
        self.buffers: Dict[Tensor, Tuple[Buffer, List[Expr]]] = {}
        self.eff_body: Dict[Stage, Expr] = {}
        self.children: Dict[int, List[Stage]] = {}   # id(attach ivar) -> stages

    # ---------------------------------------------------------------------------------------------------------
    def run(self) -> PrimFunc:
        sch, args = self.sch, self.args
        if not args:
            raise CompileError(f"lower {self.name!r}: args is empty; pass the input and output tensors")
        seen = set()
        for t in args:
            if not isinstance(t, Tensor):
                raise CompileError(f"lower {self.name!r}: args must be te tensors, got {t!r}")
            if id(t) in seen:
                raise CompileError(f"lower {self.name!r}: tensor {t.name!r} is listed twice in args")
            seen.add(id(t))
            if t.op not in sch.stage_map and not isinstance(t.op, PlaceholderOp):  # unused inputs are fine
                raise CompileError(f"lower {self.name!r}: tensor {t.name!r} is not part of the schedule")
        arg_ops = {t.op for t in args}
        param_buffers = []
        for t in args:
            b = Buffer(t.name, t.shape, t.dtype, "param")
            param_buffers.append(b)
            self.buffers[t] = (b, [_c(0)] * len(t.shape))

        # inline substitution, producers first
        stages = [st for st in sch.stages]
        for st in stages:
            if st.is_placeholder:
                continue
            if st.attach_type == "inline" and st.op in arg_ops:
                raise ScheduleError(f"compute_inline: {st.name!r} is a kernel argument (an output); it must be "
                                    "computed into its buffer, not inlined")
            self.eff_body[st] = self._inline(st.body)

        readers: Dict[int, List[Stage]] = {}
        for st in stages:
            if st.is_placeholder or st.attach_type == "inline":
                continue
            for t in _loaded_tensors(self.eff_body[st]):
                readers.setdefault(id(t.op), []).append(st)
                if isinstance(t.op, PlaceholderOp) and t.op not in arg_ops:
                    raise CompileError(f"lower {self.name!r}: input {t.name!r} is used by {st.name!r} but is not "
                                       "in args")
        for st in stages:
            if st.is_placeholder or st.attach_type == "inline":
                continue
            if st.op not in arg_ops and not readers.get(id(st.op)):
                raise CompileError(f"lower {self.name!r}: {st.name!r} is computed but neither passed in args nor "
                                   "used by another stage; add it to args")
            if st.attach_type == "scope":
                parent = st.attach_stage
                if parent.attach_type == "inline":
                    raise ScheduleError(f"compute_at: {st.name!r} is attached to {parent.name!r}, which is inlined")
                rd = readers.get(id(st.op), [])
                if any(r is not parent for r in rd) or not rd:
                    names = ", ".join(sorted({r.name for r in rd})) or "nobody"
                    raise ScheduleError(f"compute_at: {st.name!r} is attached to {parent.name!r} but is read by "
                                        f"{names}; attach a stage only inside its single consumer")
                self.children.setdefault(id(st.attach_ivar), []).append(st)

        body_parts = []
        root_locals = []
        for st in stages:
            if st.is_placeholder or st.attach_type != "root":
                continue
            t = st.op.output(0)
            if t not in self.buffers:
                b = Buffer(t.name, t.shape, t.dtype, getattr(st, "scope", "local"))
                self.buffers[t] = (b, [_c(0)] * len(t.shape))
                root_locals.append(b)
            body_parts.append(self.build_stage(st, None))
        body = seq(*body_parts)
        for b in reversed(root_locals):
            body = Allocate(b, body)
        _check_loops(body)
        body = _partition_tails(body, frozenset())
        return PrimFunc(self.name, args, param_buffers, body)

    # ---------------------------------------------------------------------------------------------------------
    def _inline(self, body: Expr) -> Expr:
        def fn(n: Expr) -> Optional[Expr]:
            if isinstance(n, TensorLoad):
                st = self.sch.stage_map.get(n.tensor.op)
                if st is not None and st.attach_type == "inline":
                    idx = [rebuild(i, fn) for i in n.indices]
                    return substitute(self.eff_body[st], dict(zip(st.axis, idx)))
            return None
        if isinstance(body, Reduce):
            return Reduce(body.combiner, rebuild(body.source, fn), body.axis, body.identity)
        return rebuild(body, fn)

    # ---------------------------------------------------------------------------------------------------------
    def _structure(self, st: Stage, region: Optional[List[Tuple[Expr, int]]]) -> _StageInfo:
        info = _StageInfo(st)
        shape = st.op.output(0).shape
        if region is None:
            region = [(_c(0), d) for d in shape]
        for iv, (_lo, e) in zip(st.axis, region):
            info.ext[iv] = e
        for iv in st.reduce_axis:
            info.ext[iv] = iv.extent
        split_guards = []
        for r in st.relations:
            if isinstance(r, Split):
                e = info.ext[r.parent]
                if r.factor is not None:
                    inner, outer = r.factor, -(-e // r.factor)
                else:
                    outer, inner = r.nparts, -(-e // r.nparts)
                info.ext[r.outer], info.ext[r.inner] = outer, inner
                if outer * inner != e:
                    split_guards.append((r.parent, e))
            else:
                info.ext[r.fused] = info.ext[r.outer] * info.ext[r.inner]
        for leaf in info.leaves:
            # a loop of one iteration is not emitted: its variable is simply 0
            info.value[leaf] = _c(0) if info.ext[leaf] == 1 else leaf
            self.ranges[leaf] = (0, info.ext[leaf] - 1)
        for r in reversed(st.relations):
            if isinstance(r, Split):
                info.value[r.parent] = simplify(
                    Binary("add", Binary("mul", info.value[r.outer], _c(info.ext[r.inner])), info.value[r.inner]),
                    self.ranges)
            else:
                ei = _c(info.ext[r.inner])
                info.value[r.outer] = simplify(Binary("floordiv", info.value[r.fused], ei), self.ranges)
                info.value[r.inner] = simplify(Binary("floormod", info.value[r.fused], ei), self.ranges)
        for parent, e in split_guards:
            info.guards.append(Compare("lt", info.value[parent], _c(e)))
        for d, (iv, (lo, e)) in enumerate(zip(st.axis, region)):
            info.root_abs[iv] = simplify(Binary("add", lo, info.value[iv]), self.ranges)
            if not (isinstance(lo, Const) and lo.value == 0 and e <= shape[d]):
                hi_b = Simplifier(self.ranges).bound(Binary("add", lo, _c(e - 1)))
                lo_b = Simplifier(self.ranges).bound(lo)
                if hi_b is None or hi_b[1] > shape[d] - 1:
                    info.guards.append(Compare("lt", info.root_abs[iv], _c(shape[d])))
                if lo_b is None or lo_b[0] < 0:
                    info.guards.append(Compare("ge", info.root_abs[iv], _c(0)))
        for iv in st.reduce_axis:
            info.root_abs[iv] = simplify(Binary("add", _c(iv.dom_min), info.value[iv]), self.ranges)
        return info

    def _to_loads(self, e: Expr) -> Expr:
        def fn(n: Expr) -> Optional[Expr]:
            if isinstance(n, TensorLoad):
                idx = [rebuild(i, fn) for i in n.indices]
                return Load(*self._address(n.tensor, idx))
            return None
        return rebuild(e, fn)

    def _address(self, t: Tensor, idx: List[Expr]) -> Tuple[Buffer, Expr]:
        if t not in self.buffers:
            raise CompileError(f"lower {self.name!r}: no buffer for {t.name!r} (internal error: producer order)")
        buf, offs = self.buffers[t]
        strides = [1] * len(idx)
        for d in reversed(range(len(idx) - 1)):
            strides[d] = strides[d + 1] * buf.shape[d + 1]
        flat: Expr = _c(0)
        for d in range(len(idx)):
            flat = Binary("add", flat, Binary("mul", Binary("sub", idx[d], offs[d]), _c(strides[d])))
        return buf, simplify(flat, self.ranges)

    # ---------------------------------------------------------------------------------------------------------
    def build_stage(self, st: Stage, region: Optional[List[Tuple[Expr, int]]]) -> Stmt:
        info = self._structure(st, region)
        t = st.op.output(0)
        body = self.eff_body[st]
        mapping = dict(info.root_abs)
        if isinstance(body, Reduce):
            src_abs = substitute(body.source, mapping)
        else:
            src_abs = substitute(body, mapping)

        # regions of the stages attached inside this one (before converting loads: they define the offsets)
        attached: Dict[int, list] = {}     # id(leaf) -> [(child stage, its new local buffer or None, region)]
        for pos, leaf in enumerate(info.leaves):
            for child in self.children.get(id(leaf), []):
                if child.attach_stage is not st:
                    continue
                creg = self._infer_region(child, src_abs, info, pos)
                ct = child.op.output(0)
                new_buf = None
                if ct not in self.buffers:      # an output attached inside keeps its (absolute) param buffer
                    new_buf = Buffer(ct.name, [e for _, e in creg], ct.dtype, getattr(child, "scope", "local"))
                    self.buffers[ct] = (new_buf, [lo for lo, _ in creg])
                attached.setdefault(id(leaf), []).append((child, new_buf, creg))

        out_idx = [info.root_abs[iv] for iv in st.axis]
        sbuf, sidx = self._address(t, out_idx)
        value = self._to_loads(src_abs)
        value = simplify(value, self.ranges)

        def attach_stmts(leaf: IterVar) -> List[Tuple[Stmt, Optional[Buffer]]]:
            out = []
            for child, new_buf, creg in attached.get(id(leaf), []):
                out.append((self.build_stage(child, creg), new_buf))
            return out

        leaves = info.leaves
        if isinstance(body, Reduce):
            p = next((n for n, lv in enumerate(leaves) if lv.kind == "reduce"), len(leaves))
            outer, tail = leaves[:p], leaves[p:]
            init_leaves = [lv for lv in tail if lv.kind == "data"]
            g_outer, g_tail = self._split_guards(info.guards, outer, tail)
            red_vars = [lv for lv in tail if lv.kind == "reduce"]
            init = Store(sbuf, sidx, body.identity)
            update = Store(sbuf, sidx, simplify(_combine(body.combiner, Load(sbuf, sidx), value), self.ranges),
                           reduction=body.combiner)
            init_stmt = self._make_loops(st, info, init_leaves, init,
                                         [g for g in g_tail if not _uses_var(g, red_vars)], None)
            upd_stmt = self._make_loops(st, info, tail, update, g_tail, attach_stmts)
            return self._make_loops(st, info, outer, seq(init_stmt, upd_stmt), g_outer, attach_stmts, top=True)
        store = Store(sbuf, sidx, value)
        return self._make_loops(st, info, leaves, store, info.guards, attach_stmts, top=True)

    def _split_guards(self, guards: List[Expr], outer: List[IterVar], tail: List[IterVar]):
        g_outer, g_tail = [], []
        for g in guards:
            (g_tail if _uses_var(g, tail) else g_outer).append(g)
        return g_outer, g_tail

    def _make_loops(self, st: Stage, info: _StageInfo, loops: List[IterVar], inner: Stmt, guards: List[Expr],
                    attach_fn, top: bool = False) -> Stmt:
        pos = {id(lv): n for n, lv in enumerate(loops)}
        per_level: Dict[int, List[Expr]] = {}
        top_guards = []
        for g in guards:
            g = simplify(g, self.ranges)
            if isinstance(g, Const):
                if g.value:
                    continue
            deepest = -1
            for n in walk(g):
                if isinstance(n, Var) and id(n) in pos:
                    deepest = max(deepest, pos[id(n)])
            if deepest < 0:
                top_guards.append(g)
            else:
                per_level.setdefault(deepest, []).append(g)
        stmt = inner
        for n in reversed(range(len(loops))):
            lv = loops[n]
            ext = info.ext[lv]
            extent: Expr = _c(ext)
            ifs = []
            for g in per_level.get(n, []):
                bound = self._clamp(g, lv)
                if bound is None:
                    ifs.append(g)
                else:
                    extent = simplify(Binary("min", extent, bound), self.ranges)
            if attach_fn is not None:
                producers = attach_fn(lv)
                if producers:
                    stmt = seq(*[p for p, _ in producers], stmt)
                    for _, b in reversed(producers):
                        if b is not None:
                            stmt = Allocate(b, stmt)
            if ifs:
                cond = ifs[0]
                for g in ifs[1:]:
                    cond = Binary("and", cond, g, "bool")
                stmt = IfThenElse(cond, stmt)
            if ext == 1 and isinstance(extent, Const):
                continue
            kind = st.iter_kind.get(lv, "serial")
            stmt = For(lv, _c(0), extent, kind, stmt, max_extent=ext)
        if top_guards:
            cond = top_guards[0]
            for g in top_guards[1:]:
                cond = Binary("and", cond, g, "bool")
            stmt = IfThenElse(cond, stmt)
        return stmt

    def _clamp(self, g: Expr, lv: IterVar) -> Optional[Expr]:
        """For ``g`` = ``a < b`` linear in ``lv`` with a positive coefficient: the loop extent that enforces it."""
        if not (isinstance(g, Compare) and g.op == "lt" and is_int(g.a.dtype)):
            return None
        s = Simplifier(self.ranges)
        terms, const = s.linear(Binary("sub", g.a, g.b))
        coef = 0
        rest = {}
        for k, (atom, c) in terms.items():
            if atom is lv:
                coef = c
            elif _uses_var(atom, [lv]):
                return None
            else:
                rest[k] = [atom, c]
        if coef <= 0:
            return None
        # coef*lv + rest < 0  <=>  lv < ceil(-rest / coef)
        neg_rest = s.from_linear({k: [a, -c] for k, (a, c) in rest.items()}, -const + coef - 1, "int32")
        return simplify(Binary("floordiv", neg_rest, _c(coef)), self.ranges)

    # ---------------------------------------------------------------------------------------------------------
    def _infer_region(self, child: Stage, consumer_src: Expr, info: _StageInfo, pos: int):
        """Region of ``child`` read by one iteration of the consumer's leaf loop at ``pos``."""
        ct = child.op.output(0)
        varying = {lv: info.ext[lv] for lv in info.leaves[pos + 1:]}
        loads = [n for n in walk(consumer_src) if isinstance(n, TensorLoad) and n.tensor is ct]
        region = []
        for d, extent in enumerate(ct.shape):
            lo_hi = None
            for ld in loads:
                b = _sym_bound(ld.indices[d], varying, self.ranges)
                if b is None:
                    lo_hi = None
                    break
                if lo_hi is None:
                    lo_hi = b
                else:
                    lo_hi = (_sym_pick(lo_hi[0], b[0], "min", self.ranges), _sym_pick(lo_hi[1], b[1], "max", self.ranges))
                    if lo_hi[0] is None or lo_hi[1] is None:
                        lo_hi = None
                        break
            if lo_hi is None:
                region.append((_c(0), extent))
                continue
            lo, hi = lo_hi
            ext = simplify(Binary("add", Binary("sub", hi, lo), _c(1)), self.ranges)
            if not isinstance(ext, Const) or ext.value >= extent:
                region.append((_c(0), extent))
            else:
                region.append((simplify(lo, self.ranges), max(int(ext.value), 1)))
        return region


def _sym_pick(a: Expr, b: Expr, op: str, ranges) -> Optional[Expr]:
    d = simplify(Binary("sub", a, b), ranges)
    if not isinstance(d, Const):
        return None
    if op == "min":
        return a if d.value <= 0 else b
    return a if d.value >= 0 else b


def _sym_bound(e: Expr, varying: Dict[IterVar, int], ranges) -> Optional[Tuple[Expr, Expr]]:
    """Symbolic inclusive bounds of integer ``e`` when the ``varying`` loops run over [0, extent)."""
    s = Simplifier(ranges)
    terms, const = s.linear(simplify(e, ranges))
    lo: Expr = _c(const)
    hi: Expr = _c(const)
    vids = {id(v) for v in varying}
    for atom, c in terms.values():
        if isinstance(atom, Var) and id(atom) in vids:
            b = (_c(0), _c(varying[atom] - 1))
        elif not any(isinstance(n, Var) and id(n) in vids for n in walk(atom)):
            b = (atom, atom)
        else:
            b = _sym_bound_atom(atom, varying, ranges)
            if b is None:
                return None
        x = (Binary("mul", b[0], _c(c)), Binary("mul", b[1], _c(c)))
        if c < 0:
            x = (x[1], x[0])
        lo, hi = Binary("add", lo, x[0]), Binary("add", hi, x[1])
    return simplify(lo, ranges), simplify(hi, ranges)


def _sym_bound_atom(e: Expr, varying, ranges) -> Optional[Tuple[Expr, Expr]]:
    if isinstance(e, Binary) and isinstance(e.b, Const) and e.b.value > 0:
        if e.op == "floordiv":
            b = _sym_bound(e.a, varying, ranges)
            if b is None:
                return None
            return (Binary("floordiv", b[0], e.b), Binary("floordiv", b[1], e.b))
        if e.op == "floormod":
            return (_c(0), _c(e.b.value - 1))
    if isinstance(e, Binary) and e.op in ("min", "max"):
        ba, bb = _sym_bound(e.a, varying, ranges), _sym_bound(e.b, varying, ranges)
        if ba is None or bb is None:
            return None
        return (Binary(e.op, ba[0], bb[0]), Binary(e.op, ba[1], bb[1]))
    return None


def _loaded_tensors(e: Expr) -> List[Tensor]:
    seen = {}
    for n in walk(e):
        if isinstance(n, TensorLoad):
            seen.setdefault(id(n.tensor), n.tensor)
    return list(seen.values())


def _check_loops(body: Stmt) -> None:
    """Reject loop-kind nestings the code generator cannot honour, naming the loops involved."""
    def visit(s: Stmt, vec: Optional[For], par: Optional[For]) -> None:
        if isinstance(s, For):
            if s.kind == "vectorized":
                if vec is not None:
                    raise ScheduleError(f"vectorized loop {s.var.name!r} is nested inside vectorized loop "
                                        f"{vec.var.name!r}; vectorize only one (the innermost) loop")
                if s.max_extent > MAX_VECTOR_LANES:
                    raise ScheduleError(f"vectorize {s.var.name!r}: extent {s.max_extent} is too wide (max "
                                        f"{MAX_VECTOR_LANES} lanes); split it and vectorize the inner part")
            if s.kind == "parallel":
                if vec is not None:
                    raise ScheduleError(f"parallel loop {s.var.name!r} is inside vectorized loop "
                                        f"{vec.var.name!r}; parallelize an outer loop")
                if par is not None:
                    raise ScheduleError(f"parallel loop {s.var.name!r} is nested inside parallel loop "
                                        f"{par.var.name!r}; mark only one loop of a nest parallel (fuse them)")
            if s.kind == "unrolled" and s.max_extent > MAX_UNROLL:
                raise ScheduleError(f"unroll {s.var.name!r}: extent {s.max_extent} is too large to unroll "
                                    f"(max {MAX_UNROLL}); split it first")
            visit(s.body, s if s.kind == "vectorized" else vec, s if s.kind == "parallel" else par)
            return
        if isinstance(s, Allocate) and vec is not None:
            raise ScheduleError(f"compute_at inside vectorized loop {vec.var.name!r} ({s.buffer.name!r}); "
                                "attach it at an outer loop")
        from tether.tir.nodes import stmt_children
        for c in stmt_children(s):
            visit(c, vec, par)
    visit(body, None, None)


def _expr_var_ids(e: Expr) -> set:
    return {id(n) for n in walk(e) if isinstance(n, Var)}


def _with_body(s: For, body: Stmt) -> For:
    out = For(s.var, s.min, s.extent, s.kind, body, s.max_extent)
    out.tail, out.bound_extent = s.tail, s.bound_extent
    return out


def _map_loops(s: Stmt, fn) -> Stmt:
    """Rebuild ``s`` with every For replaced by ``fn(for_with_mapped_body)``."""
    from tether.tir.nodes import SeqStmt
    if isinstance(s, For):
        return fn(_with_body(s, _map_loops(s.body, fn)))
    if isinstance(s, SeqStmt):
        return SeqStmt([_map_loops(x, fn) for x in s.stmts])
    if isinstance(s, IfThenElse):
        return IfThenElse(s.cond, _map_loops(s.then_case, fn),
                          None if s.else_case is None else _map_loops(s.else_case, fn))
    if isinstance(s, Allocate):
        return Allocate(s.buffer, _map_loops(s.body, fn))
    return s


def _partition_tails(s: Stmt, bound: frozenset) -> Stmt:
    """Loop partitioning for clamped vectorized/unrolled loops.

    Inside the loop whose variable their tail clamp depends on, emit ``if all clamps are full: <body with
    constant extents> else: <body with those loops serial>``, so the hot path has no per-iteration tail checks
    and the code size stays linear in the number of clamped loops.
    """
    from tether.tir.nodes import SeqStmt
    if isinstance(s, For):
        inner = bound | {id(s.var)}
        clamps = [f for f in walk_stmts(s.body)
                  if isinstance(f, For) and f.kind in ("vectorized", "unrolled") and not isinstance(f.extent, Const)
                  and id(s.var) in _expr_var_ids(f.extent) and _expr_var_ids(f.extent) <= inner]
        body = s.body
        if clamps:
            ids = {id(f) for f in clamps}
            cond: Optional[Expr] = None
            seen_keys = set()
            keyer = Simplifier({})
            for f in clamps:
                c = Compare("eq", f.extent, _c(f.max_extent))
                k = keyer.key(c)
                if k in seen_keys:
                    continue
                seen_keys.add(k)
                cond = c if cond is None else Binary("and", cond, c, "bool")
            full = _partition_tails(_map_loops_by_id(body, ids, full=True), inner)
            generic = _partition_tails(_map_loops_by_id(body, ids, full=False), inner)
            split = _full_prefix(s, cond)
            if split is not None:
                return _split_loop(s, split, full, generic)
            body = IfThenElse(cond, full, generic)
        else:
            body = _partition_tails(body, inner)
        return _with_body(s, body)
    if isinstance(s, SeqStmt):
        return SeqStmt([_partition_tails(x, bound) for x in s.stmts])
    if isinstance(s, IfThenElse):
        return IfThenElse(s.cond, _partition_tails(s.then_case, bound),
                          None if s.else_case is None else _partition_tails(s.else_case, bound))
    if isinstance(s, Allocate):
        return Allocate(s.buffer, _partition_tails(s.body, bound))
    return s


def _full_prefix(s: For, cond: Expr) -> Optional[int]:
    """How many leading iterations of constant loop ``s`` have every tail clamp full, when ``cond`` depends on
    ``s``'s variable alone and holds on a prefix of the iterations (clamps ``min(f, n - v*f)`` do); else None."""
    if not (isinstance(s.min, Const) and isinstance(s.extent, Const)) or _expr_var_ids(cond) != {id(s.var)}:
        return None
    lo, n = int(s.min.value), int(s.extent.value)

    def full_at(k: int) -> Optional[bool]:
        v = simplify(substitute(cond, {s.var: _c(lo + k)}))
        return bool(v.value) if isinstance(v, Const) else None

    if n <= 0 or full_at(0) is not True:
        return None if n <= 0 or full_at(0) is None else (0 if full_at(n - 1) is False else None)
    good, bad = 0, n        # full_at(good) holds; bad is the first iteration known not to (or n)
    if full_at(n - 1) is True:
        return n
    bad = n - 1
    while bad - good > 1:
        mid = (good + bad) // 2
        r = full_at(mid)
        if r is None:
            return None
        good, bad = (mid, bad) if r else (good, mid)
    # the clamps are monotone in the loop variable, but check the remainder really is partial
    return bad if all(full_at(k) is False for k in range(bad, n)) else None


def _split_loop(s: For, k: int, full: Stmt, generic: Stmt) -> Stmt:
    """``s`` as its first ``k`` iterations over ``full`` (constant extents, no checks) followed by the remaining
    partial ones over ``generic``: the tail runs once, after the loop, instead of a test in every iteration."""
    lo, n = int(s.min.value), int(s.extent.value)
    parts = []
    if k > 0:
        head = For(s.var, _c(lo), _c(k), s.kind, full, k)
        parts.append(head)
    if k < n:
        tail = For(s.var, _c(lo + k), _c(n - k), "serial" if s.kind == "parallel" else s.kind, generic, n - k)
        parts.append(tail)
    return seq(*parts)


def _map_loops_by_id(s: Stmt, ids: set, full: bool) -> Stmt:
    from tether.tir.nodes import SeqStmt
    if isinstance(s, For):
        body = _map_loops_by_id(s.body, ids, full)
        if id(s) in ids:
            if full:
                out = For(s.var, s.min, _c(s.max_extent), s.kind, body, s.max_extent)
                out.bound_extent = s.extent
                return out
            tail = For(s.var, s.min, s.extent, "serial", body, s.max_extent)
            tail.tail = True    # a cold remainder: codegen keeps LLVM from vectorizing/unrolling it
            return tail
        return _with_body(s, body)
    if isinstance(s, SeqStmt):
        return SeqStmt([_map_loops_by_id(x, ids, full) for x in s.stmts])
    if isinstance(s, IfThenElse):
        return IfThenElse(s.cond, _map_loops_by_id(s.then_case, ids, full),
                          None if s.else_case is None else _map_loops_by_id(s.else_case, ids, full))
    if isinstance(s, Allocate):
        return Allocate(s.buffer, _map_loops_by_id(s.body, ids, full))
    return s


def lower(sch: Schedule, args: Sequence[Tensor], name: str = "default", simple_mode: bool = False) -> PrimFunc:
    """Lower schedule ``sch`` with kernel parameters ``args`` (inputs then outputs) to a tir.PrimFunc."""
    if not isinstance(sch, Schedule):
        raise CompileError(f"lower: expected a te Schedule (te.create_schedule), got {type(sch).__name__}")
    return Lowering(sch, args, name).run()
