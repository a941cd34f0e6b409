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

GPU schedules (docs/gpu.md "Scheduling for GPUs"): loops bound with Stage.bind become ``For`` loops of kind
"thread"; a stage attached inside them reuses the thread index for its own loops bound to the same tag; shared
caches cover the whole work-group's region and are filled between barriers; the guards of such stages wrap their
stores, so loop extents stay uniform across a work-group. A reduction axis bound to threadIdx becomes a
work-group tree reduction (``_allreduce``). tether.tir.device_split makes kernels of the result.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

from tether.errors import CompileError, ScheduleError
from tether.te.expr import IterVar, combiner_identity
from tether.te.schedule import Schedule, Split, Stage
from tether.te.tensor import PlaceholderOp, Tensor, collect_tensors
from tether.tir.buffer import Buffer
from tether.tir.device import Barrier
from tether.tir.dtype import bits as dtype_bits, is_int
from tether.tir.expr import Binary, Compare, Const, Expr, Load, Reduce, TensorLoad, Var
from tether.tir.simplify import Simplifier, simplify
from tether.tir.stmt import Allocate, For, IfThenElse, Prefetch, PrimFunc, Stmt, Store, seq
from tether.tir.transform import check_loops, partition_tails
from tether.tir.visit import rebuild, substitute, uses_var, walk


# Stage.prefetch: the cache line it assumes, and the most lines prefetched per read per iteration
PREFETCH_LINE_BYTES = 64
PREFETCH_MAX_LINES = 4


def _c(v: int) -> Const:
    return Const(v, "int32")


def _combine(combiner: str, acc: Expr, x: Expr) -> Expr:
    if combiner == "sum":
        return Binary("add", acc, x, acc.dtype)
    if combiner == "prod":
        return Binary("mul", acc, x, acc.dtype)
    return Binary(combiner, acc, x, acc.dtype)


class _StageInfo:
    """Loop structure of one stage for one placement (region)."""

    def __init__(self, stage: Stage):
        self.stage = stage
        self.leaves: List[IterVar] = list(stage.leaf_iter_vars)
        self.ext: Dict[IterVar, int] = {}
        self.value: Dict[IterVar, Expr] = {}
        self.guards: List[Expr] = []
        self.root_abs: Dict[IterVar, Expr] = {}
        # GPU: bound leaves that reuse the thread index of an enclosing loop bound to the same tag (no loop)
        self.merged: set = set()
        # whether the stage runs in GPU threads (it has bound loops or sits inside them): its guards then wrap its
        # stores instead of clamping loops, so that loop extents stay uniform across the threads of a work-group
        self.gpu = False


class Lowering:
    def __init__(self, sch: Schedule, args: Sequence[Tensor], name: str):
        self.sch = sch
        self.args = list(args)
        self.name = name
        self.ranges: Dict[Var, Tuple[int, int]] = {}
        self.buffers: Dict[Tensor, Tuple[Buffer, List[Expr]]] = {}
        self.eff_body: Dict[Stage, Expr] = {}
        self.children: Dict[int, List[Stage]] = {}   # id(attach ivar) -> stages
        self.prefetch_at: Dict[int, List[Stmt]] = {}  # id(leaf) -> the prefetches opening each of its iterations

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
            for t in collect_tensors(self.eff_body[st]):
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
        check_loops(body)
        body = partition_tails(body)
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
            return Reduce(body.combiner, rebuild(body.source, fn), body.axis, rebuild(body.identity, fn))
        return rebuild(body, fn)

    # ---------------------------------------------------------------------------------------------------------
    def _structure(self, st: Stage, region: Optional[List[Tuple[Expr, int]]], env: Dict[str, Tuple[Var, int]]
                   ) -> _StageInfo:
        info = _StageInfo(st)
        info.gpu = bool(env) or bool(st.bound)
        shape = st.op.output(0).shape
        if region is None:
            region = [(_c(0), d) for d in shape]
        for iv, (_lo, e) in zip(st.axis, region):
            info.ext[iv] = e
        for iv in st.reduce_axis:
            info.ext[iv] = iv.extent
        split_guards = []
        shifted = {}        # split -> its extent: the last tile ends at the extent (Stage.split shift_tail)
        for r in st.relations:
            if isinstance(r, Split):
                e = info.ext[r.parent]
                if r.factor is not None:
                    inner, outer = r.factor, -(-e // r.factor)
                else:
                    outer, inner = r.nparts, -(-e // r.nparts)
                info.ext[r.outer], info.ext[r.inner] = outer, inner
                if outer * inner != e and r.shift_tail and e > inner:
                    shifted[id(r)] = e
                elif outer * inner != e:
                    split_guards.append((r.parent, e))
            else:
                info.ext[r.fused] = info.ext[r.outer] * info.ext[r.inner]
        merge_guards = []
        for leaf in info.leaves:
            # a loop of one iteration is not emitted: its variable is simply 0
            info.value[leaf] = _c(0) if info.ext[leaf] == 1 else leaf
            self.ranges[leaf] = (0, info.ext[leaf] - 1)
            tiv = st.bound.get(leaf)
            if tiv is None:
                continue
            tag, ext = tiv.thread_tag, info.ext[leaf]
            if tiv.extent is not None and tiv.extent != ext:
                raise ScheduleError(f"bind: stage {st.name!r}: axis {leaf.name!r} has extent {ext} but is bound to "
                                    f"{tag}, declared with extent {tiv.extent}")
            if tag in env:
                # inside a loop bound to the same index: this loop is that thread index, and when it is shorter
                # only the first threads take part (TVM does the same)
                outer_var, outer_ext = env[tag]
                if ext > outer_ext:
                    raise ScheduleError(f"bind: stage {st.name!r}: axis {leaf.name!r} (extent {ext}) is bound to "
                                        f"{tag} inside a loop bound to it with extent {outer_ext}; it must not be "
                                        "longer")
                info.merged.add(leaf)
                info.value[leaf] = outer_var
                if ext < outer_ext:
                    merge_guards.append(Compare("lt", outer_var, _c(ext)))
            else:
                info.value[leaf] = leaf      # a thread loop is kept even with one iteration: it is a launch index
        for r in reversed(st.relations):
            if isinstance(r, Split):
                start = Binary("mul", info.value[r.outer], _c(info.ext[r.inner]))
                if id(r) in shifted:
                    start = Binary("min", start, _c(shifted[id(r)] - info.ext[r.inner]))
                info.value[r.parent] = simplify(Binary("add", start, info.value[r.inner]), self.ranges)
            else:
                ei = _c(info.ext[r.inner])
                info.value[r.outer] = simplify(Binary("floordiv", info.value[r.fused], ei), self.ranges)
                info.value[r.inner] = simplify(Binary("floormod", info.value[r.fused], ei), self.ranges)
        for parent, e in split_guards:
            info.guards.append(Compare("lt", info.value[parent], _c(e)))
        info.guards.extend(merge_guards)
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
    def build_stage(self, st: Stage, region: Optional[List[Tuple[Expr, int]]],
                    env: Optional[Dict[str, Tuple[Var, int]]] = None) -> Stmt:
        """The loops of ``st`` over ``region`` (None: its whole output); ``env`` maps the thread tags of the loops
        enclosing this placement to their (variable, extent)."""
        env = env or {}
        info = self._structure(st, region, env)
        t = st.op.output(0)
        body = self.eff_body[st]
        mapping = dict(info.root_abs)
        if isinstance(body, Reduce):
            src_abs = substitute(body.source, mapping)
        else:
            src_abs = substitute(body, mapping)

        # regions of the stages attached inside this one (before converting loads: they define the offsets)
        attached: Dict[int, list] = {}     # id(leaf) -> [(child stage, its new buffer or None, region, env)]
        child_env = dict(env)
        for pos, leaf in enumerate(info.leaves):
            if leaf in st.bound and leaf not in info.merged:
                child_env[st.bound[leaf].thread_tag] = (leaf, info.ext[leaf])
            for child in self.children.get(id(leaf), []):
                if child.attach_stage is not st:
                    continue
                creg = self._infer_region(child, src_abs, info, pos, env)
                ct = child.op.output(0)
                new_buf = None
                if ct not in self.buffers:      # an output attached inside keeps its (absolute) param buffer
                    new_buf = Buffer(ct.name, [e for _, e in creg], ct.dtype, getattr(child, "scope", "local"))
                    self.buffers[ct] = (new_buf, [lo for lo, _ in creg])
                attached.setdefault(id(leaf), []).append((child, new_buf, creg, dict(child_env)))

        out_idx = [info.root_abs[iv] for iv in st.axis]
        sbuf, sidx = self._address(t, out_idx)
        value = self._to_loads(src_abs)
        value = simplify(value, self.ranges)
        for leaf, wanted in st.prefetches.items():
            if leaf in info.leaves:
                self.prefetch_at[id(leaf)] = self._prefetches(info, leaf, wanted, value)

        def attach_stmts(leaf: IterVar) -> List[Tuple[Stmt, Optional[Buffer]]]:
            out = []
            synced = []
            for child, new_buf, creg, cenv in attached.get(id(leaf), []):
                out.append((self.build_stage(child, creg, cenv), new_buf))
                if getattr(child, "scope", "local") == "shared" and (cenv or child.bound):
                    synced.append(child.name)
            if synced:
                # a work-group fills shared memory together: wait until every thread is done reading the previous
                # tile before overwriting it (when the fill repeats in a loop), and until the whole tile is
                # written before anyone reads it
                after = Barrier()
                after.stage = synced[-1]
                out.append((after, None))
                if leaf not in st.bound:
                    before = Barrier()
                    before.stage = synced[0]
                    out.insert(0, (before, None))
            return out

        leaves = info.leaves
        if isinstance(body, Reduce):
            p = next((n for n, lv in enumerate(leaves) if lv.kind == "reduce"), len(leaves))
            outer, tail = leaves[:p], leaves[p:]
            init_leaves = [lv for lv in tail if lv.kind == "data"]
            g_outer, g_tail = self._split_guards(info.guards, outer, tail)
            red_vars = [lv for lv in tail if lv.kind == "reduce"]
            if any(lv in st.bound for lv in red_vars):
                return self._allreduce(st, info, body, value, sbuf, sidx, outer, tail, env, attach_stmts)
            # an init value may read the output's indices and tensors (a conv's bias per output channel)
            init = Store(sbuf, sidx, simplify(self._to_loads(substitute(body.identity, mapping)), self.ranges))
            update = Store(sbuf, sidx, simplify(_combine(body.combiner, Load(sbuf, sidx), value), self.ranges),
                           reduction=body.combiner)
            if info.gpu:
                init = self._guard(init, [g for g in info.guards if not uses_var(g, red_vars)])
                update = self._guard(update, info.guards)
                g_outer, g_tail = [], []
            init_stmt = self._make_loops(st, info, init_leaves, init,
                                         [g for g in g_tail if not uses_var(g, red_vars)], None)
            upd_stmt = self._make_loops(st, info, tail, update, g_tail, attach_stmts)
            return self._make_loops(st, info, outer, seq(init_stmt, upd_stmt), g_outer, attach_stmts, top=True)
        store = Store(sbuf, sidx, value)
        if info.gpu:
            return self._make_loops(st, info, leaves, self._guard(store, info.guards), [], attach_stmts, top=True)
        return self._make_loops(st, info, leaves, store, info.guards, attach_stmts, top=True)

    def _prefetches(self, info: _StageInfo, leaf: IterVar, wanted: list, value: Expr) -> List[Stmt]:
        """The Prefetch statements of Stage.prefetch at ``leaf``: for each read of a wanted tensor in ``value``,
        ``offset`` iterations on, the lines of what one iteration reads along the innermost loop inside ``leaf``
        that the read's index uses, at each value of the other such loops (at most PREFETCH_MAX_LINES in all)."""
        inner = info.leaves[info.leaves.index(leaf) + 1:]
        out: List[Stmt] = []
        seen = set()
        for tensor, offset in wanted:
            if tensor not in self.buffers:
                continue
            buf = self.buffers[tensor][0]
            per_line = max(1, PREFETCH_LINE_BYTES * 8 // dtype_bits(buf.dtype))
            for load in walk(value):
                if not (isinstance(load, Load) and load.buffer is buf) or str(load.index) in seen:
                    continue
                seen.add(str(load.index))
                ahead = substitute(load.index, {leaf: leaf + offset})
                used = [lv for lv in inner if uses_var(ahead, [lv])]
                along, others = (used[-1], used[:-1]) if used else (None, [])
                points: List[Dict] = [{lv: _c(0) for lv in inner}]
                for lv in others:      # (unrolled loops over panels: one stream each; never more than kept)
                    points = [{**pt, lv: _c(k)} for pt in points
                              for k in range(min(info.ext[lv], PREFETCH_MAX_LINES))][:PREFETCH_MAX_LINES]
                for pt in points[:PREFETCH_MAX_LINES]:
                    first = simplify(substitute(ahead, pt), self.ranges)
                    lines = 1
                    if along is not None:
                        last = simplify(substitute(ahead, {**pt, along: _c(info.ext[along] - 1)}), self.ranges)
                        span = simplify(last - first, self.ranges)
                        lines = span.value // per_line + 1 if isinstance(span, Const) and span.value >= 0 else 1
                    for k in range(min(lines, PREFETCH_MAX_LINES)):
                        out.append(Prefetch(buf, simplify(first + k * per_line, self.ranges)))
        return out[:PREFETCH_MAX_LINES]

    def _allreduce(self, st: Stage, info: _StageInfo, body: Reduce, value: Expr, sbuf: Buffer, sidx: Expr,
                   outer: List[IterVar], tail: List[IterVar], env: Dict[str, Tuple[Var, int]], attach_fn) -> Stmt:
        """A reduction axis bound to threadIdx: a work-group tree reduction (TVM's allreduce).

        Each thread combines its part of the reduction in a register, the partials go to a shared array of the
        block size, and a tree halves the active threads per step down to element 0. The tree is unrolled (the
        block size is a constant) and every barrier sits outside the ``if tx < stride`` guards, so all threads of
        the work-group reach each one."""
        tx_leaf = tail[0]
        tiv = st.bound.get(tx_leaf)
        if tiv is None:
            bound = next(lv for lv in tail if lv in st.bound)
            raise ScheduleError(f"bind: stage {st.name!r}: reduction axis {bound.name!r} is bound to "
                                f"{st.bound[bound].thread_tag} inside loop {tx_leaf.name!r}; reorder the bound "
                                "reduction axis outermost among the reduction loops")
        tag = tiv.thread_tag
        if tx_leaf in info.merged or tag in env:
            raise ScheduleError(f"bind: stage {st.name!r}: reduction axis {tx_leaf.name!r} is bound to {tag} inside "
                                f"a loop of its consumer bound to {tag}; attach the stage outside the consumer's "
                                f"{tag} loop (e.g. at its blockIdx loop)")
        for lv in tail[1:]:
            if lv.kind == "data" and info.ext[lv] > 1:
                raise ScheduleError(f"bind: stage {st.name!r}: data axis {lv.name!r} is inside the reduction axis "
                                    f"{tx_leaf.name!r} bound to {tag}; reorder the data axes outside it")
        block = info.ext[tx_leaf]
        # other thread dimensions of the work-group (a row per threadIdx.y) each reduce in their own slice
        others: List[Tuple[Expr, int]] = []
        for lv in outer:
            t = st.bound.get(lv)
            if t is not None and t.thread_tag.startswith("threadIdx") and lv not in info.merged:
                others.append((lv, info.ext[lv]))
        for t, (var, ext) in env.items():
            if t.startswith("threadIdx"):
                others.append((var, ext))
        base: Expr = _c(0)
        slices = 1
        for var, ext in others:
            base = Binary("add", Binary("mul", base, _c(ext)), var)
            slices *= ext
        base = simplify(Binary("mul", base, _c(block)), self.ranges)
        dtype = sbuf.dtype
        acc = Buffer(f"{st.name}.acc", [1], dtype, "local")
        red = Buffer(f"{st.name}.red", [slices * block], dtype, "shared")
        zero = _c(0)
        red_vars = [lv for lv in tail if lv.kind == "reduce"]
        # threads past the end of the reduction take no step and contribute the combiner's identity
        update = Store(acc, zero, simplify(_combine(body.combiner, Load(acc, zero), value), self.ranges),
                       reduction=body.combiner)
        update = self._guard(update, info.guards)
        accumulate = self._make_loops(st, info, tail[1:], update, [], attach_fn)
        tx = tx_leaf

        def at(offset: Expr) -> Expr:
            return simplify(Binary("add", base, offset), self.ranges)

        def barrier() -> Barrier:
            b = Barrier()
            b.stage = st.name
            return b

        # every thread starts from the combiner's own identity: an init value (te.sum(..., init=5)) is combined in
        # once, into the result, not once per thread
        neutral = combiner_identity(body.combiner, dtype)
        init = body.identity
        custom_init = not (isinstance(init, Const) and init.value == neutral.value)
        steps: List[Stmt] = [Store(acc, zero, neutral), accumulate, Store(red, at(tx), Load(acc, zero)),
                             barrier()]
        n = block
        while n > 1:
            half = n // 2
            stride = n - half      # a non-power-of-two count folds its top elements onto the bottom ones
            combined = _combine(body.combiner, Load(red, at(tx)), Load(red, at(Binary("add", tx, _c(stride)))))
            steps.append(IfThenElse(Compare("lt", tx, _c(half)), Store(red, at(tx), combined)))
            steps.append(barrier())
            n = stride
        data_guards = [g for g in info.guards if not uses_var(g, red_vars)]
        total = Load(red, at(zero))
        result = Store(sbuf, sidx, _combine(body.combiner, init, total) if custom_init else total)
        if sbuf.scope == "local":
            # a register result: every thread keeps it (its consumer may read it in any thread), then waits so that
            # no thread overwrites red[0] in a next round while another still reads it
            steps += [self._guard(result, data_guards), barrier()]
        else:
            # one thread writes the element
            steps.append(self._guard(result, data_guards + [Compare("eq", tx, zero)]))
        in_thread = Allocate(acc, seq(*steps))
        stmt = self._make_loops(st, info, [tx_leaf], in_thread, [], attach_fn)
        stmt = Allocate(red, stmt)
        return self._make_loops(st, info, outer, stmt, [], attach_fn, top=True)

    def _guard(self, stmt: Stmt, guards: List[Expr]) -> Stmt:
        conds = []
        for g in guards:
            g = simplify(g, self.ranges)
            if not (isinstance(g, Const) and g.value):
                conds.append(g)
        return IfThenElse(_conjunction(conds), stmt) if conds else stmt

    def _split_guards(self, guards: List[Expr], outer: List[IterVar], tail: List[IterVar]):
        g_outer, g_tail = [], []
        for g in guards:
            (g_tail if uses_var(g, tail) else g_outer).append(g)
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
            prefetches = self.prefetch_at.get(id(lv))
            if prefetches:
                stmt = seq(*prefetches, stmt)
            if attach_fn is not None:
                producers = attach_fn(lv)
                if producers:
                    stmt = seq(*[p for p, _ in producers], stmt)
                    for _, b in reversed(producers):
                        if b is not None:
                            stmt = Allocate(b, stmt)
            if ifs:
                stmt = IfThenElse(_conjunction(ifs), stmt)
            if lv in info.merged or (ext == 1 and isinstance(extent, Const) and lv not in st.bound):
                continue
            kind = st.iter_kind.get(lv, "serial")
            tiv = st.bound.get(lv)
            stmt = For(lv, _c(0), extent, kind, stmt, max_extent=ext,
                       thread_tag=tiv.thread_tag if tiv is not None else None)
            stmt.stage = st.name
        if top_guards:
            stmt = IfThenElse(_conjunction(top_guards), stmt)
        if top:
            stmt.stage = st.name
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
            elif uses_var(atom, [lv]):
                return None
            else:
                rest[k] = [atom, c]
        if coef <= 0:
            return None
        # coef*lv + rest < 0  <=>  lv < ceil(-rest / coef)
        neg_rest = s.from_linear({k: [a, -c] for k, (a, c) in rest.items()}, -const + coef - 1, "int32")
        return simplify(Binary("floordiv", neg_rest, _c(coef)), self.ranges)

    # ---------------------------------------------------------------------------------------------------------
    def _infer_region(self, child: Stage, consumer_src: Expr, info: _StageInfo, pos: int,
                      env: Dict[str, Tuple[Var, int]]):
        """Region of ``child`` read by one iteration of the consumer's leaf loop at ``pos`` (``env``: the thread
        loops enclosing the consumer)."""
        ct = child.op.output(0)
        varying = {lv: info.ext[lv] for lv in info.leaves[pos + 1:]}
        if getattr(child, "scope", "local") == "shared":
            # work-group memory holds what every thread of the work-group reads: relax the threadIdx loops too
            for lv in info.leaves[:pos + 1]:
                tiv = info.stage.bound.get(lv)
                if tiv is not None and tiv.thread_tag.startswith("threadIdx"):
                    varying[lv] = info.ext[lv]
            for tag, (var, ext) in env.items():
                if tag.startswith("threadIdx"):
                    varying[var] = ext
        loads = [n for n in walk(consumer_src) if isinstance(n, TensorLoad) and n.tensor is ct]
        # a loop of one iteration is 0 (a thread loop of extent 1 stays a variable, but is always thread 0):
        # without this, (x + t) % n with such a t would look like it covers all of [0, n)
        ones = {lv: _c(0) for lv, e in varying.items() if e == 1}
        region = []
        for d, extent in enumerate(ct.shape):
            lo_hi = None
            for ld in loads:
                b = _sym_bound(substitute(ld.indices[d], ones) if ones else ld.indices[d], varying, self.ranges)
                if b is None:
                    lo_hi = None
                    break
                if lo_hi is None:
                    lo_hi = b
                else:
                    lo_hi = (_sym_pick(lo_hi[0], b[0], "min", self.ranges),
                             _sym_pick(lo_hi[1], b[1], "max", self.ranges))
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


def _conjunction(conds: List[Expr]) -> Expr:
    """``conds[0] && conds[1] && ...`` (left-nested)."""
    out = conds[0]
    for c in conds[1:]:
        out = Binary("and", out, c, "bool")
    return out


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
        elif not uses_var(atom, varying):
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


def lower(sch: Schedule, args: Sequence[Tensor], name: str = "default") -> PrimFunc:
    """Lower schedule ``sch`` with kernel parameters ``args`` (inputs then outputs) to a tir.PrimFunc."""
    if not isinstance(sch, Schedule):
        raise CompileError(f"lower: expected a te Schedule (te.create_schedule), got {type(sch).__name__}")
    return Lowering(sch, args, name).run()
