"""Schedules: how each compute stage's loops are split, ordered, annotated and placed.

A Schedule holds one Stage per operation. Stages record *relations* (split/fuse) between iteration variables
and annotations on the resulting leaf loops; extents of derived loops are inferred at lowering time, because a
stage attached with compute_at iterates over a region that only bound inference knows.
"""
from __future__ import annotations

from typing import Any, Sequence

from tether.errors import ScheduleError
from tether.te.expr import IterVar
from tether.te.tensor import ComputeOp, Operation, PlaceholderOp, Tensor
from tether.te.thread import ThreadAxis
from tether.tir.expr import Expr, Reduce, TensorLoad
from tether.tir.visit import rebuild, substitute, walk

LOOP_KINDS = ("serial", "vectorized", "unrolled", "parallel")


class Split:
    def __init__(self, parent: IterVar, outer: IterVar, inner: IterVar, factor: int | None, nparts: int | None,
                 shift_tail: bool = False):
        self.parent, self.outer, self.inner, self.factor, self.nparts = parent, outer, inner, factor, nparts
        self.shift_tail = shift_tail


class Fuse:
    def __init__(self, outer: IterVar, inner: IterVar, fused: IterVar):
        self.outer, self.inner, self.fused = outer, inner, fused


class Stage:
    """Scheduling state of one operation."""

    def __init__(self, op: Operation, schedule: "Schedule"):
        self.op = op
        self.schedule = schedule
        self.is_placeholder = isinstance(op, PlaceholderOp)
        if isinstance(op, ComputeOp):
            # The stage's own copy of the computation: cache_write rewrites it without touching the op.
            self.axis: list[IterVar] = list(op.axis)
            self.reduce_axis: list[IterVar] = list(op.reduce_axis)
            self.body: Expr | None = op.body
        else:
            self.axis, self.reduce_axis, self.body = [], [], None
        self.leaf_iter_vars: list[IterVar] = self.axis + self.reduce_axis
        self.relations: list[Any] = []
        self.iter_kind: dict[IterVar, str] = {}
        self.bound: dict[IterVar, ThreadAxis] = {}    # leaf -> the thread index it is bound to (kind "thread")
        # leaf -> [(tensor, offset)]: read tensor `offset` iterations of that loop ahead (prefetch)
        self.prefetches: dict[IterVar, list] = {}
        self.attach_type = "root"          # root | inline | scope
        self.attach_stage: Stage | None = None
        self.attach_ivar: IterVar | None = None

    @property
    def name(self) -> str:
        return self.op.name

    @property
    def all_iter_vars(self) -> list[IterVar]:
        out = list(self.axis) + list(self.reduce_axis)
        for r in self.relations:
            out.extend([r.outer, r.inner] if isinstance(r, Split) else [r.fused])
        return out

    def __repr__(self) -> str:
        return f"Stage({self.name})"

    # helpers ------------------------------------------------------------------------------------------------
    def _need_compute(self, what: str) -> None:
        if self.is_placeholder:
            raise ScheduleError(f"{what}: {self.name!r} is a placeholder (an input); only computes have loops")

    def _leaf_index(self, iv: Any, what: str) -> int:
        self._need_compute(what)
        if isinstance(iv, IterVar):
            for n, leaf in enumerate(self.leaf_iter_vars):
                if leaf is iv:
                    return n
            if any(iv is x for x in self.all_iter_vars):
                raise ScheduleError(f"{what}: axis {iv.name!r} of stage {self.name!r} was already split or fused; "
                                    "use the axes that split/fuse returned")
            raise ScheduleError(f"{what}: axis {iv.name!r} does not belong to stage {self.name!r} (leaf axes: "
                                f"{', '.join(v.name for v in self.leaf_iter_vars)})")
        raise ScheduleError(f"{what}: expected an axis (IterVar) of stage {self.name!r}, got {iv!r}")

    # primitives ---------------------------------------------------------------------------------------------
    def split(self, parent: IterVar, factor: int | None = None, nparts: int | None = None, *,
              shift_tail: bool = False):
        """Split ``parent`` into (outer, inner) with inner extent ``factor`` (or outer extent ``nparts``).

        ``shift_tail`` (with ``factor``): when ``factor`` does not divide the extent, the last tile is shifted back
        to end at the extent (it overlaps the one before and recomputes those points) instead of being a partial
        tile with clamped loops. Only for stages whose points may be computed twice (pure stores, not
        accumulation into their output)."""
        pos = self._leaf_index(parent, "split")
        if (factor is None) == (nparts is None):
            raise ScheduleError(f"split of {parent.name!r}: give exactly one of factor= or nparts=")
        if shift_tail and factor is None:
            raise ScheduleError(f"split of {parent.name!r}: shift_tail needs factor=")
        value = factor if factor is not None else nparts
        if isinstance(value, Expr) or int(value) != value or int(value) <= 0:
            raise ScheduleError(f"split of {parent.name!r}: factor/nparts must be a positive int, got {value!r}")
        value = int(value)
        outer = IterVar(parent.name + ".outer", None, parent.kind)
        inner = IterVar(parent.name + ".inner", None, parent.kind)
        self.relations.append(Split(parent, outer, inner, value if factor is not None else None,
                                    value if nparts is not None else None, shift_tail))
        self.leaf_iter_vars[pos:pos + 1] = [outer, inner]
        return outer, inner

    def tile(self, x_parent: IterVar, y_parent: IterVar, x_factor: int, y_factor: int):
        """2-D tiling: returns (x_outer, y_outer, x_inner, y_inner) in that loop order."""
        xo, xi = self.split(x_parent, factor=x_factor)
        yo, yi = self.split(y_parent, factor=y_factor)
        self.reorder(xo, yo, xi, yi)
        return xo, yo, xi, yi

    def fuse(self, *axes: IterVar) -> IterVar:
        """Fuse adjacent leaf axes (outermost first) into one loop."""
        if len(axes) == 1 and isinstance(axes[0], (list, tuple)):
            axes = tuple(axes[0])
        if not axes:
            raise ScheduleError("fuse: no axes given")
        positions = [self._leaf_index(a, "fuse") for a in axes]
        for a, b in zip(positions, positions[1:]):
            if b != a + 1:
                raise ScheduleError(f"fuse: axes {', '.join(x.name for x in axes)} of stage {self.name!r} must be "
                                    "adjacent leaf loops given outermost first; reorder them first")
        kinds = {a.kind for a in axes}
        if len(kinds) > 1:
            raise ScheduleError(f"fuse: cannot fuse data and reduction axes of stage {self.name!r} "
                                f"({', '.join(a.name for a in axes)})")
        fused = axes[0]
        for nxt in axes[1:]:
            new = IterVar(f"{fused.name}.{nxt.name}.fused", None, fused.kind)
            self.relations.append(Fuse(fused, nxt, new))
            pos = self._leaf_index(fused, "fuse")
            self.leaf_iter_vars[pos:pos + 2] = [new]
            fused = new
        return fused

    def reorder(self, *axes: IterVar) -> None:
        """Put the given leaf axes in this order, in the positions they occupy now."""
        if len(axes) == 1 and isinstance(axes[0], (list, tuple)):
            axes = tuple(axes[0])
        positions = [self._leaf_index(a, "reorder") for a in axes]
        if len(set(positions)) != len(positions):
            raise ScheduleError(f"reorder: an axis is listed twice ({', '.join(a.name for a in axes)})")
        for pos, ax in zip(sorted(positions), axes):
            self.leaf_iter_vars[pos] = ax

    def _annotate(self, iv: IterVar, kind: str) -> None:
        self._leaf_index(iv, kind)
        old = self.iter_kind.get(iv)
        if old is not None and old != kind:
            raise ScheduleError(f"{kind}: axis {iv.name!r} of stage {self.name!r} is already {old}")
        self.iter_kind[iv] = kind

    def vectorize(self, iv: IterVar) -> None:
        if iv.kind == "reduce":
            raise ScheduleError(f"vectorize: {iv.name!r} is a reduction axis of stage {self.name!r}; vectorize a "
                                "data axis instead (e.g. the innermost output axis inside the reduction loop)")
        self._annotate(iv, "vectorized")

    def unroll(self, iv: IterVar) -> None:
        self._annotate(iv, "unrolled")

    def parallel(self, iv: IterVar) -> None:
        if iv.kind == "reduce":
            raise ScheduleError(f"parallel: {iv.name!r} is a reduction axis of stage {self.name!r}; parallel "
                                "iterations would race on the same output element")
        self._annotate(iv, "parallel")

    def prefetch(self, tensor: Tensor, iv: IterVar, offset: int) -> None:
        """At the top of every iteration of loop ``iv``, prefetch what this stage reads of ``tensor`` ``offset``
        iterations later (TVM's Stage.prefetch): the cache lines one iteration's read of it starts at, moved on
        ``offset`` steps of ``iv``. For a tensor read as a stream, so that its lines arrive before they are needed
        (a hint: results never change, and reading past the tensor's end is allowed)."""
        self._need_compute("prefetch")
        self._leaf_index(iv, "prefetch")
        if not isinstance(offset, int) or offset < 1:
            raise ScheduleError(f"prefetch: offset must be a positive number of iterations, got {offset!r}")
        if tensor.op not in {t.op for t in self.op.input_tensors}:
            raise ScheduleError(f"prefetch: stage {self.name!r} does not read {tensor.op.name!r}")
        self.prefetches.setdefault(iv, []).append((tensor, offset))

    def bind(self, iv: IterVar, thread_ivar: ThreadAxis) -> None:
        """Run leaf loop ``iv`` as the GPU thread index ``thread_ivar`` (te.thread_axis): one work-group per
        iteration for blockIdx.*, one thread per iteration for threadIdx.*."""
        self._leaf_index(iv, "bind")
        if not isinstance(thread_ivar, ThreadAxis):
            raise ScheduleError(f"bind: stage {self.name!r}: axis {iv.name!r} can only be bound to a "
                                f"te.thread_axis(tag), got {thread_ivar!r}")
        tag = thread_ivar.thread_tag
        if iv.kind == "reduce":
            if tag.startswith("blockIdx"):
                raise ScheduleError(f"bind: stage {self.name!r}: axis {iv.name!r} is a reduction axis and cannot be "
                                    f"bound to {tag}; work-groups cannot combine their partial results")
            # a work-group tree reduction (lowering combines the threads' partials in shared memory): one per stage,
            # because the partials of two thread dimensions would need a two-level tree
            for other, t in self.bound.items():
                if other.kind == "reduce":
                    raise ScheduleError(f"bind: stage {self.name!r}: axis {iv.name!r} cannot be bound to {tag}, "
                                        f"reduction axis {other.name!r} already is bound to {t.thread_tag} (one "
                                        "cross-thread reduction per stage; fuse the reduction axes first)")
        old = self.iter_kind.get(iv)
        if old is not None:
            what = f"bound to {self.bound[iv].thread_tag}" if old == "thread" else old
            raise ScheduleError(f"bind: stage {self.name!r}: axis {iv.name!r} is already {what}")
        for other, t in self.bound.items():
            if t.thread_tag == tag:
                raise ScheduleError(f"bind: stage {self.name!r}: axis {iv.name!r} cannot be bound to {tag}, "
                                    f"axis {other.name!r} already is (one loop per thread index)")
        self.iter_kind[iv] = "thread"
        self.bound[iv] = thread_ivar

    def pragma(self, iv: IterVar, name: str, value: Any = None) -> None:  # accepted for TVM-style scripts
        self._leaf_index(iv, "pragma")

    def compute_inline(self) -> None:
        self._need_compute("compute_inline")
        if isinstance(self.body, Reduce):
            raise ScheduleError(f"compute_inline: {self.name!r} is a reduction; only elementwise/injective stages "
                                "can be inlined (use compute_at instead)")
        if self.relations or self.iter_kind:
            raise ScheduleError(f"compute_inline: {self.name!r} already has loop transformations; an inlined "
                                "stage has no loops of its own")
        self.attach_type, self.attach_stage, self.attach_ivar = "inline", None, None

    def compute_root(self) -> None:
        self._need_compute("compute_root")
        self.attach_type, self.attach_stage, self.attach_ivar = "root", None, None

    def compute_at(self, parent: "Stage", ivar: IterVar) -> None:
        """Compute this stage inside ``parent``'s loop ``ivar``, just the region that one iteration needs."""
        self._need_compute("compute_at")
        if not isinstance(parent, Stage):
            raise ScheduleError(f"compute_at: expected a stage (s[T]), got {parent!r}")
        if parent is self:
            raise ScheduleError(f"compute_at: stage {self.name!r} cannot be attached to itself")
        parent._leaf_index(ivar, "compute_at")
        s = parent
        while s is not None and s.attach_type == "scope":
            if s.attach_stage is self:
                raise ScheduleError(f"compute_at: {self.name!r} -> {parent.name!r} would form an attach cycle")
            s = s.attach_stage
        self.attach_type, self.attach_stage, self.attach_ivar = "scope", parent, ivar


class Schedule:
    """The stages of every operation reachable from the outputs, producers first."""

    def __init__(self, ops: Sequence[Operation]):
        self.outputs = list(ops)
        self.stages: list[Stage] = []
        self.stage_map: dict[Operation, Stage] = {}
        seen: set[int] = set()

        def visit(op: Operation) -> None:
            if id(op) in seen:
                return
            seen.add(id(op))
            for t in op.input_tensors:
                visit(t.op)
            st = Stage(op, self)
            self.stages.append(st)
            self.stage_map[op] = st

        for op in self.outputs:
            visit(op)

    def __getitem__(self, x: Tensor | Operation) -> Stage:
        op = x.op if isinstance(x, Tensor) else x
        try:
            return self.stage_map[op]
        except KeyError:
            raise ScheduleError(f"{getattr(op, 'name', op)!r} is not part of this schedule") from None

    def __contains__(self, x: Any) -> bool:
        op = x.op if isinstance(x, Tensor) else x
        return op in self.stage_map

    def cache_read(self, tensor: Tensor, scope: str, readers: Sequence[Tensor | Operation | Stage]) -> Tensor:
        """A new stage copying ``tensor`` into memory of ``scope`` ("shared": a GPU work-group's, "local": one
        thread's, "global"), which ``readers`` read instead of ``tensor``.

        Attach it with compute_at inside the readers' loops so that it copies only the tile they need; a shared
        cache inside thread loops is filled by the work-group together (bind its loops to threadIdx.*), with a
        barrier before and after the fill.
        """
        if scope not in ("shared", "local", "global"):
            raise ScheduleError(f"cache_read: unknown scope {scope!r} (use 'shared', 'local' or 'global')")
        if not isinstance(tensor, Tensor) or tensor.op not in self.stage_map:
            raise ScheduleError(f"cache_read: {getattr(tensor, 'name', tensor)!r} is not a tensor of this schedule")
        if isinstance(readers, (Tensor, Operation, Stage)):
            readers = [readers]
        reader_stages = []
        for r in readers:
            st = r if isinstance(r, Stage) else self[r]
            st._need_compute("cache_read")
            if not any(isinstance(n, TensorLoad) and n.tensor is tensor for n in _walk_body(st.body)):
                raise ScheduleError(f"cache_read: stage {st.name!r} does not read {tensor.name!r}")
            reader_stages.append(st)
        if not reader_stages:
            raise ScheduleError(f"cache_read of {tensor.name!r}: give the stages that read it (readers)")
        axis = [IterVar(f"ax{d}", n, "data") for d, n in enumerate(tensor.shape)]
        cache_op = ComputeOp(f"{tensor.name}.{scope}", "", {}, axis, tensor[tuple(axis)])
        cache_stage = Stage(cache_op, self)
        cache_stage.scope = scope
        self.stages.insert(self.stages.index(self[tensor]) + 1, cache_stage)
        self.stage_map[cache_op] = cache_stage
        cache = cache_op.output(0)

        def redirect(n: Expr):
            if isinstance(n, TensorLoad) and n.tensor is tensor:
                return cache[tuple(rebuild(i, redirect) for i in n.indices)]
            return None
        for st in reader_stages:
            body = st.body
            if isinstance(body, Reduce):
                st.body = Reduce(body.combiner, rebuild(body.source, redirect), body.axis,
                                 rebuild(body.identity, redirect))
            else:
                st.body = rebuild(body, redirect)
        return cache

    def cache_write(self, tensor: Tensor, scope: str = "local") -> Tensor:
        """Compute ``tensor`` into a new cache stage and make ``tensor``'s stage a copy out of it.

        The usual use is register blocking: attach the cache stage with compute_at inside the output tile so its
        small buffer (and the reduction accumulators) stay in registers.
        """
        if scope not in ("local", "shared", "global"):
            raise ScheduleError(f"cache_write: unknown scope {scope!r} (use 'local', 'shared' or 'global')")
        st = self[tensor]
        st._need_compute("cache_write")
        if st.relations or st.iter_kind or st.attach_type != "root" or st.leaf_iter_vars != st.axis + st.reduce_axis:
            raise ScheduleError(f"cache_write: call it on {tensor.name!r} before splitting, reordering or "
                                "attaching that stage")
        suffix = "." + scope
        new_axis = [IterVar(iv.name + ".c", iv.extent, "data") for iv in st.axis]
        new_raxis = [IterVar(iv.name, iv.extent, "reduce", iv.dom_min) for iv in st.reduce_axis]
        mapping = dict(zip(st.axis, new_axis))
        mapping.update(zip(st.reduce_axis, new_raxis))
        body = st.body
        if isinstance(body, Reduce):
            body = Reduce(body.combiner, substitute(body.source, mapping), new_raxis,
                          substitute(body.identity, mapping))
        else:
            body = substitute(body, mapping)
        cache_op = ComputeOp(tensor.name + suffix, getattr(st.op, "tag", ""), {}, new_axis, body)
        cache_stage = Stage(cache_op, self)
        cache_stage.scope = scope
        self.stages.insert(self.stages.index(st), cache_stage)
        self.stage_map[cache_op] = cache_stage
        cache = cache_op.output(0)
        st.body = cache[tuple(st.axis)]
        st.reduce_axis = []
        st.leaf_iter_vars = list(st.axis)
        return cache


def _walk_body(body: Expr | None):
    if body is None:
        return []
    return walk(body.source if isinstance(body, Reduce) else body)


def create_schedule(ops: Operation | Tensor | Sequence[Operation | Tensor]) -> Schedule:
    if not isinstance(ops, (list, tuple)):
        ops = [ops]
    out = []
    for op in ops:
        op = op.op if isinstance(op, Tensor) else op
        if not isinstance(op, Operation):
            raise TypeError(f"create_schedule: expected ops or tensors, got {op!r}")
        out.append(op)
    return Schedule(out)
