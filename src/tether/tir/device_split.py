"""The host/device split: a lowered PrimFunc whose loops are bound to GPU threads -> the kernels to launch.

Lowering keeps bound loops as ``For`` nodes of kind ``"thread"``. Here each root stage of the function (each
top-level loop nest) becomes one :class:`~tether.tir.device.DeviceKernel`, launched in program order: its thread
loops disappear (their variables become the thread indices, their extents the launch's grid and block), its
work-group ("shared") allocations move to the top of the kernel, and the function's intermediate buffers become
global temporaries the runtime allocates and passes like parameters.

Everything a GPU cannot run is refused here, at build time, with one line naming the stage and the axis: a loop
outside the thread loops (it would run in every thread), a stage with no bound loop, a work-group over the
thread or shared-memory limit, a barrier that not every thread of a work-group reaches, a vectorized loop over a
run-time extent, a parallel loop.
"""
from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence, Tuple

from tether.errors import ScheduleError
from tether.tir.buffer import Buffer
from tether.tir.device import THREAD_TAGS, Barrier, DeviceKernel, tag_dim
from tether.tir.dtype import bits
from tether.tir.expr import Compare, Const, Expr, Load, Var
from tether.tir.stmt import Allocate, For, IfThenElse, PrimFunc, SeqStmt, Stmt, Store, seq
from tether.tir.visit import rebuild, replace, walk

_BOUND_HINT = "a GPU kernel's outer loops must be bound to blockIdx/threadIdx"


class DeviceProgram:
    """The kernels of one PrimFunc in launch order, and the buffers each one takes.

    ``buffers`` are the function's parameter buffers followed by ``temporaries`` (global intermediates the runtime
    allocates for the duration of a call); ``args[k]`` lists, in order, the indices into ``buffers`` that kernel
    ``k`` takes as its ``params``.
    """

    def __init__(self, name: str, params: Sequence[Buffer], temporaries: Sequence[Buffer],
                 kernels: Sequence[DeviceKernel], args: Sequence[Sequence[int]]):
        self.name = name
        self.params = list(params)
        self.temporaries = list(temporaries)
        self.kernels = list(kernels)
        self.args = [list(a) for a in args]

    @property
    def buffers(self) -> List[Buffer]:
        return self.params + self.temporaries

    def launch_info(self) -> Dict[str, object]:
        """What a module's metadata records to run this function: temporaries to allocate, then the launches."""
        return {"name": self.name,
                "temporaries": [{"name": b.name, "dtype": b.dtype, "size": b.size} for b in self.temporaries],
                "kernels": [dict(k.launch_info(), args=a) for k, a in zip(self.kernels, self.args)]}

    def __str__(self) -> str:
        out = [f"program {self.name}: params {[b.name for b in self.params]}, "
               f"temporaries {[b.name for b in self.temporaries]}"]
        for k, a in zip(self.kernels, self.args):
            out.append(f"# args {a}")
            out.append(str(k))
        return "\n".join(out)

    __repr__ = __str__


def split_host_device(func: PrimFunc, max_threads_per_block: int = 1024,
                      max_shared_bytes: int = 48 * 1024) -> DeviceProgram:
    """Split ``func`` (lowered from a schedule with bound loops) into its device kernels, verifying each."""
    body = func.body
    temporaries: List[Buffer] = []
    remap: Dict[int, Buffer] = {}
    while isinstance(body, Allocate):
        b = body.buffer
        if b.scope == "shared":
            raise ScheduleError(f"stage {b.name!r}: a shared-memory cache must be attached inside a kernel's thread "
                                "loops (compute_at); work-group memory does not outlive a kernel")
        tmp = Buffer(b.name, b.shape, b.dtype, "param")
        temporaries.append(tmp)
        remap[id(b)] = tmp
        body = body.body
    all_buffers = list(func.param_buffers) + temporaries
    kernels, args = [], []
    for stage, stmts in _root_stages(body):
        kernel = _make_kernel(f"{func.name}_kernel{len(kernels)}", stage, seq(*stmts), remap,
                              max_threads_per_block, max_shared_bytes)
        used = _buffers_used(kernel.body)
        idx = [n for n, b in enumerate(all_buffers) if id(b) in used]
        kernel.params = [all_buffers[n] for n in idx]
        kernels.append(kernel)
        args.append(idx)
    if not kernels:
        raise ScheduleError(f"function {func.name!r}: nothing to compute on the device (no stage)")
    return DeviceProgram(func.name, func.param_buffers, temporaries, kernels, args)


# ---- grouping the body into root stages ----------------------------------------------------------------------

def _stage_of(s: Stmt) -> str:
    """The name of the stage a top-level statement belongs to (lowering records it; else the buffer stored)."""
    name = getattr(s, "stage", None)
    if name:
        return name
    for n in walk(s):
        if getattr(n, "stage", None):
            return n.stage
    for n in walk(s):
        if isinstance(n, Store):
            return n.buffer.name
    return "?"


def _root_stages(body: Stmt) -> List[Tuple[str, List[Stmt]]]:
    parts = body.stmts if isinstance(body, SeqStmt) else [body]
    groups: List[Tuple[str, List[Stmt]]] = []
    for s in parts:
        name = _stage_of(s)
        if groups and groups[-1][0] == name:
            groups[-1][1].append(s)
        else:
            groups.append((name, [s]))
    return groups


# ---- one kernel -------------------------------------------------------------------------------------------------

def _make_kernel(name: str, stage: str, body: Stmt, remap: Dict[int, Buffer], max_threads: int,
                 max_shared: int) -> DeviceKernel:
    loops = _check_structure(stage, body)
    launch: Dict[str, Tuple[Var, int]] = {}     # tag -> (the kernel's variable for it, launch extent)
    for f in loops:
        if not (isinstance(f.min, Const) and f.min.value == 0 and isinstance(f.extent, Const)):
            raise ScheduleError(f"stage {stage!r}: axis {f.var.name!r} is bound to {f.thread_tag} over a range that "
                                "is not [0, constant); a launch dimension needs a constant extent")
        ext = int(f.extent.value)
        var, old = launch.get(f.thread_tag, (f.var, 0))
        launch[f.thread_tag] = (var, max(old, ext))
    thread_var = {id(f.var): launch[f.thread_tag][0] for f in loops}

    def strip(s: Stmt) -> Stmt:
        # a thread loop shorter than its launch dimension runs in the first threads only
        if isinstance(s, For) and s.kind == "thread":
            inner = strip(s.body)
            var, ext = launch[s.thread_tag]
            if int(s.extent.value) < ext:
                inner = IfThenElse(Compare("lt", var, Const(int(s.extent.value), "int32")), inner)
            return inner
        return _map_stmt(s, strip)

    def expr_fn(e: Expr) -> Optional[Expr]:
        if isinstance(e, Var) and id(e) in thread_var:
            return thread_var[id(e)]
        if isinstance(e, Load) and id(e.buffer) in remap:
            return Load(remap[id(e.buffer)], rebuild(e.index, expr_fn))
        return None

    kbody = _rewrite_exprs(strip(body), lambda e: rebuild(e, expr_fn), remap)
    kbody, shared = _take_shared(kbody)
    for b in reversed(shared):
        kbody = Allocate(b, kbody)
    thread_of = {var: tag for tag, (var, _) in launch.items()}
    grid, block = [1, 1, 1], [1, 1, 1]
    for tag, (_, ext) in launch.items():
        (grid if tag.startswith("blockIdx") else block)[tag_dim(tag)] = ext
    kernel = DeviceKernel(name, [], kbody, thread_of, tuple(grid), tuple(block))
    axes = {f.thread_tag: f.var.name for f in loops}
    if kernel.threads_per_block > max_threads:
        dims = " x ".join(str(b) for b in block)
        names = ", ".join(f"{axes[t]} -> {t}" for t in THREAD_TAGS if t in axes and t.startswith("threadIdx"))
        raise ScheduleError(f"stage {stage!r}: a work-group of {dims} = {kernel.threads_per_block} threads ({names}) "
                            f"is over the limit of {max_threads} threads per block; split the threadIdx axes smaller")
    if kernel.shared_bytes() > max_shared:
        names = ", ".join(f"{s.buffer.name} ({s.buffer.size * _itemsize(s.buffer)} bytes)" for s in walk(kbody)
                          if isinstance(s, Allocate) and s.buffer.scope == "shared")
        raise ScheduleError(f"stage {stage!r}: shared memory of {kernel.shared_bytes()} bytes ({names}) is over the "
                            f"limit of {max_shared} bytes; use smaller tiles (split the axis it is attached at)")
    thread_idx = {id(var): (tag, axes[tag]) for tag, (var, _) in launch.items() if tag.startswith("threadIdx")}
    _check_barriers(stage, kbody, thread_idx)
    return kernel


def _check_structure(stage: str, body: Stmt) -> List[For]:
    """The thread loops of one root stage, after checking that they enclose everything else."""
    loops: List[For] = []

    def visit(s: Stmt, in_thread: bool, enclosing: Optional[For], tags: Tuple[str, ...]) -> None:
        if isinstance(s, For):
            if s.kind == "thread":
                if enclosing is not None:
                    raise ScheduleError(f"stage {stage!r}: axis {s.var.name!r} is bound to {s.thread_tag} inside "
                                        f"loop {enclosing.var.name!r}, which is not bound; {_BOUND_HINT} "
                                        "(put the bound loops outermost with reorder)")
                if s.thread_tag in tags:
                    raise ScheduleError(f"stage {stage!r}: axis {s.var.name!r} is bound to {s.thread_tag} inside "
                                        f"another loop bound to it")
                loops.append(s)
                visit(s.body, True, None, tags + (s.thread_tag,))
                return
            if s.kind == "parallel":
                raise ScheduleError(f"stage {stage!r}: axis {s.var.name!r} is a parallel loop; device code has no "
                                    "parallel loops (bind it to blockIdx/threadIdx instead)")
            if s.kind == "vectorized" and not isinstance(s.extent, Const):
                raise ScheduleError(f"stage {stage!r}: axis {s.var.name!r} is vectorized over the non-constant extent "
                                    f"{s.extent}; vectorize a loop whose extent divides evenly")
            if not in_thread:
                raise ScheduleError(f"stage {stage!r}: axis {s.var.name!r} is not bound to a thread; {_BOUND_HINT}")
            visit(s.body, in_thread, s if enclosing is None else enclosing, tags)
            return
        if isinstance(s, Store) and not in_thread:
            raise ScheduleError(f"stage {stage!r}: the store to {s.buffer.name!r} is outside every thread loop "
                                f"(no axis of the stage is bound to a thread); {_BOUND_HINT}")
        for c in _stmt_children(s):
            visit(c, in_thread, enclosing, tags)

    has_thread = any(isinstance(s, For) and s.kind == "thread" for s in walk(body))
    if not has_thread:
        axes = [s.var.name for s in walk(body) if isinstance(s, For)]
        what = f"none of its axes ({', '.join(axes)}) is" if axes else "no axis is"
        raise ScheduleError(f"stage {stage!r}: {what} bound to a thread; a stage on a GPU needs its outer loops bound "
                            "to blockIdx/threadIdx (s[stage].bind(axis, te.thread_axis(...)))")
    visit(body, False, None, ())
    return loops


def _check_barriers(stage: str, body: Stmt, thread_idx: Dict[int, Tuple[str, str]]) -> None:
    """Refuse a barrier that only some threads of a work-group reach (under a threadIdx-dependent condition or in
    a loop whose trip count depends on threadIdx): the others would never arrive, and the work-group hangs."""
    def divergent(e: Expr) -> Optional[Tuple[str, str]]:
        for n in walk(e):
            if isinstance(n, Var) and id(n) in thread_idx:
                return thread_idx[id(n)]
        return None

    def visit(s: Stmt, why: Optional[str]) -> None:
        if isinstance(s, Barrier):
            if why is not None:
                who = getattr(s, "stage", stage)
                raise ScheduleError(f"stage {who!r}: barrier {why}; divergent control flow: every thread of a "
                                    "work-group must reach each barrier")
            return
        if isinstance(s, IfThenElse) and why is None:
            d = divergent(s.cond)
            if d is not None:
                why = f"under the condition {s.cond}, which depends on {d[0]} (axis {d[1]!r})"
        if isinstance(s, For) and why is None:
            d = divergent(s.min) or divergent(s.extent)
            if d is not None:
                why = f"inside loop {s.var.name!r} whose range depends on {d[0]} (axis {d[1]!r})"
        for c in _stmt_children(s):
            visit(c, why)
    visit(body, None)


# ---- helpers over statements ------------------------------------------------------------------------------------

def _stmt_children(s: Stmt) -> List[Stmt]:
    out: List[Stmt] = []
    for field in s._fields:
        v = getattr(s, field)
        if isinstance(v, list):
            out.extend(v)
        elif v is not None:
            out.append(v)
    return out


def _map_stmt(s: Stmt, fn: Callable[[Stmt], Stmt]) -> Stmt:
    """``s`` with ``fn`` applied to each child statement."""
    if isinstance(s, SeqStmt):
        return SeqStmt([fn(c) for c in s.stmts])
    changes = {}
    for field in s._fields:
        v = getattr(s, field)
        if v is not None:
            changes[field] = fn(v)
    return replace(s, **changes) if changes else s


def _rewrite_exprs(s: Stmt, fn: Callable[[Expr], Expr], remap: Dict[int, Buffer]) -> Stmt:
    """``s`` with ``fn`` applied to every expression and stored buffers renamed by ``remap``."""
    s = _map_stmt(s, lambda c: _rewrite_exprs(c, fn, remap))
    if isinstance(s, For):
        return replace(s, min=fn(s.min), extent=fn(s.extent))
    if isinstance(s, Store):
        return replace(s, buffer=remap.get(id(s.buffer), s.buffer), index=fn(s.index), value=fn(s.value))
    if isinstance(s, IfThenElse):
        return replace(s, cond=fn(s.cond))
    return s


def _take_shared(s: Stmt) -> Tuple[Stmt, List[Buffer]]:
    """``s`` without its shared-memory Allocate nodes, and their buffers (OpenCL declares ``__local`` arrays at
    the kernel's outermost scope; every backend can)."""
    found: List[Buffer] = []

    def go(n: Stmt) -> Stmt:
        if isinstance(n, Allocate) and n.buffer.scope == "shared":
            found.append(n.buffer)
            return go(n.body)
        return _map_stmt(n, go)
    return go(s), found


def _buffers_used(body: Stmt) -> set:
    used = set()
    for s in walk(body):
        exprs: List[Expr] = []
        if isinstance(s, Store):
            used.add(id(s.buffer))
            exprs = [s.index, s.value]
        elif isinstance(s, For):
            exprs = [s.min, s.extent]
        elif isinstance(s, IfThenElse):
            exprs = [s.cond]
        for e in exprs:
            used.update(id(n.buffer) for n in walk(e) if isinstance(n, Load))
    return used


def _itemsize(b: Buffer) -> int:
    return max(bits(b.dtype) // 8, 1)

