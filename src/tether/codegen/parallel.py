"""Parallel outlining: a ``parallel`` loop becomes ``i32 task(i32 id, i32 n, ptr closure)`` run through the
launcher in ``ctx.parallel_launch_slot`` (serially in-line when it is NULL); see docs/abi.md "Parallel loops".

The loop's free buffers and variables travel in a closure struct; the task unpacks them, takes chunk ``id`` of
``n`` balanced chunks of the loop and calls a body function whose buffer parameters are ``noalias``.
"""
from __future__ import annotations

import os
from typing import Any, Dict, List

from llvmlite import ir

from tether.codegen.types import I32, PTR, scalar_type
from tether.tir import Allocate, Buffer, For, IfThenElse, Load, Stmt, Store, Var, walk

TASK_FN_TYPE = ir.FunctionType(I32, [I32, I32, PTR])
LAUNCHER_FN_TYPE = ir.FunctionType(I32, [PTR, PTR, I32])
PARALLEL_ERROR = 8 << 24
# Upper bound on tasks per parallel loop: each task is one launcher dispatch (a foreign call from the runtime's
# Python thread pool), so a few tasks per core balance load without paying per-iteration dispatch costs.
MAX_PARALLEL_TASKS = 16
# A host build runs on the machine that built it, whose cores are known: two tasks per core there. Fewer, larger
# chunks keep each thread on the same rows from one kernel to the next (on 2 cores, whole detectors ran 3-8% faster
# at 2 threads with 4 tasks than with 16). Device presets keep 16, the slack a busy or big board needs.
HOST_TASKS_PER_CORE = 2


def max_parallel_tasks(target: Any) -> int:
    """The most tasks a parallel loop of a build for ``target`` is split into."""
    if getattr(target, "preset", None) != "host":
        return MAX_PARALLEL_TASKS
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(2, min(MAX_PARALLEL_TASKS, HOST_TASKS_PER_CORE * cores))


def emit_parallel(em: Any, s: For) -> None:
    """Outline parallel loop ``s`` of function emitter ``em`` into a task and run it through the launcher (or
    serially in-line when the slot is NULL); a failing task returns PARALLEL_ERROR from the function."""
    bufs, fvars = _free_symbols(s)
    fields = [PTR] * len(bufs) + [scalar_type(v.dtype) for v in fvars] + [I32, I32]
    cty = ir.LiteralStructType(fields)
    closure = _alloca_struct(em, cty)
    start = em.ev(s.min)
    extent = em.ev(s.extent)
    values = [em.bufs[b] for b in bufs] + [em.env[v] for v in fvars] + [start, extent]
    for k, v in enumerate(values):
        p = em.b.gep(closure, [ir.Constant(I32, 0), ir.Constant(I32, k)], inbounds=True, source_etype=cty)
        em.b.store(v, p)
    task = _make_task(em, s, bufs, fvars, cty)
    # num_tasks = min(extent, MAX): with chunks balanced to within one iteration (_make_task), every thread count
    # that divides the task count gets the same work (ceil-sized chunks left the last one short: 50 iterations
    # made 13 tasks of 4 and one of 2, 28 against 22 iterations at 2 threads).
    one = ir.Constant(I32, 1)
    ext_pos = em.b.select(em.b.icmp_signed("<", extent, one), one, extent)
    cap = ir.Constant(I32, max_parallel_tasks(em.ctx.target))
    ntasks = em.b.select(em.b.icmp_signed("<", ext_pos, cap), ext_pos, cap)
    slot = em.ctx.parallel_launch_slot
    launcher = em.b.load(slot, typ=PTR, align=em.ctx.target.pointer_bytes)
    has = em.b.icmp_unsigned("!=", launcher, ir.Constant(PTR, None))
    launch_bb = em.fn.append_basic_block("par.launch")
    serial_bb = em.fn.append_basic_block("par.serial")
    check_bb = em.fn.append_basic_block("par.check")
    fail_bb = em.fn.append_basic_block("par.fail")
    done_bb = em.fn.append_basic_block("par.done")
    em.b.cbranch(has, launch_bb, serial_bb)
    em.b.position_at_end(launch_bb)
    rc_launch = em.b.call(_FnPointer(launcher, LAUNCHER_FN_TYPE), [task, closure, ntasks])
    em.b.branch(check_bb)
    em.b.position_at_end(serial_bb)
    loop_bb = em.fn.append_basic_block("par.serial.loop")
    em.b.branch(loop_bb)
    em.b.position_at_end(loop_bb)
    tid = em.b.phi(I32)
    tid.add_incoming(ir.Constant(I32, 0), serial_bb)
    rc_t = em.b.call(task, [tid, ntasks, closure])
    nxt = em.b.add(tid, one)
    tid.add_incoming(nxt, loop_bb)
    more = em.b.and_(em.b.icmp_signed("<", nxt, ntasks), em.b.icmp_signed("==", rc_t, ir.Constant(I32, 0)))
    em.b.cbranch(more, loop_bb, check_bb)
    em.b.position_at_end(check_bb)
    rc = em.b.phi(I32)
    rc.add_incoming(rc_launch, launch_bb)
    rc.add_incoming(rc_t, loop_bb)
    em.b.cbranch(em.b.icmp_signed("==", rc, ir.Constant(I32, 0)), done_bb, fail_bb)
    em.b.position_at_end(fail_bb)
    em.rets.append(em.b.ret(em.b.or_(em.b.and_(rc, ir.Constant(I32, 0xFFFFFF)),
                                           ir.Constant(I32, PARALLEL_ERROR))))
    em.b.position_at_end(done_bb)


def _alloca_struct(em: Any, ty: ir.Type) -> ir.Value:
    a = ir.IRBuilder(em.entry).alloca(ty, name="closure")
    a.align = 8
    a.type = PTR
    return a


def _make_task(parent: Any, s: For, bufs: List[Buffer], fvars: List[Var], cty: ir.Type) -> ir.Function:
    """The task function (closure unpacking and chunking) around a body function whose buffer pointers are
    ``noalias`` parameters, so the loop body keeps the aliasing facts the impl's parameters carry."""
    k = parent.counter[0]
    parent.counter[0] += 1
    module = parent.ctx.module
    var_types = [scalar_type(v.dtype) for v in fvars]
    body_fn = ir.Function(module, ir.FunctionType(I32, [PTR] * len(bufs) + var_types + [I32, I32]),
                          f"{parent.name}__task{k}.body")
    body_fn.linkage = "internal"
    body_fn.attributes.add("nounwind")
    # (Not noinline, although the body is then optimised twice, in the task and in the impl's serial fallback:
    # inlined there it sees the impl's constants, and squeezenet ran 14% slower at 1 thread without that.)
    em = type(parent)(parent.ctx, body_fn, parent.name, parent.counter)
    em.in_task = True
    em.ranges = dict(parent.ranges)
    em.clamps = dict(parent.clamps)
    em.bind_buffers(body_fn.args, bufs)
    for arg, v in zip(body_fn.args[len(bufs):], fvars):
        arg.name = v.name
        em.env[v] = arg
    lo, hi = body_fn.args[-2:]
    em.serial_range(s.var, lo, em.b.sub(hi, lo), lambda: em.stmt(s.body))
    em.b.ret(ir.Constant(I32, 0))
    em.seal()

    fn = ir.Function(module, TASK_FN_TYPE, f"{parent.name}__task{k}")
    fn.linkage = "internal"
    fn.attributes.add("nounwind")
    tid, ntasks, closure = fn.args
    tid.name, ntasks.name, closure.name = "task_id", "num_tasks", "closure"
    b = ir.IRBuilder(fn.append_basic_block("entry"))

    def field(n: int, ty: ir.Type) -> ir.Value:
        p = b.gep(closure, [ir.Constant(I32, 0), ir.Constant(I32, n)], inbounds=True, source_etype=cty)
        return b.load(p, typ=ty)

    values = [field(n, PTR) for n in range(len(bufs))]
    values += [field(len(bufs) + n, t) for n, t in enumerate(var_types)]
    start = field(len(bufs) + len(fvars), I32)
    extent = field(len(bufs) + len(fvars) + 1, I32)
    # chunk id of n, balanced: the first extent % n chunks get one iteration more than the others, for any n >= 1
    # (the "chunked" contract of docs/abi.md), in 32-bit arithmetic (armv7 has no 64-bit division).
    zero = ir.Constant(I32, 0)
    ext = b.select(b.icmp_signed("<", extent, zero), zero, extent)
    q = b.sdiv(ext, ntasks)
    r = b.sub(ext, b.mul(q, ntasks))
    lo = b.add(b.mul(tid, q), b.select(b.icmp_signed("<", tid, r), tid, r))
    hi = b.add(b.add(lo, q), b.zext(b.icmp_signed("<", tid, r), I32))
    # a task id past num_tasks (a misbehaving launcher) gets an empty chunk, never iterations past the extent
    lo = b.select(b.icmp_signed("<", lo, ext), lo, ext)
    hi = b.select(b.icmp_signed("<", hi, ext), hi, ext)
    b.ret(b.call(body_fn, values + [b.add(start, lo), b.add(start, hi)]))
    return fn


def _free_symbols(loop: For):
    """Buffers and Vars a parallel loop uses from outside: they travel to the task in its closure."""
    bound: set = {id(loop.var)}
    allocated: set = set()
    bufs: Dict[int, Buffer] = {}
    fvars: Dict[int, Var] = {}

    def exprs_of(s: Stmt):
        if isinstance(s, Store):
            return [s.index, s.value]
        if isinstance(s, For):
            bound.add(id(s.var))
            return [s.min, s.extent]
        if isinstance(s, IfThenElse):
            return [s.cond]
        if isinstance(s, Allocate):
            allocated.add(id(s.buffer))
        return []

    stmts = list(walk(loop.body))
    for s in stmts:
        if isinstance(s, Store):
            bufs.setdefault(id(s.buffer), s.buffer)
    all_exprs = []
    for s in stmts:
        all_exprs.extend(exprs_of(s))
    for e in all_exprs:
        for n in walk(e):
            if isinstance(n, Load):
                bufs.setdefault(id(n.buffer), n.buffer)
            elif isinstance(n, Var) and id(n) not in bound:
                fvars.setdefault(id(n), n)
    return ([b for k, b in bufs.items() if k not in allocated], list(fvars.values()))



class _FnPointer:
    """A loaded function pointer with the function type llvmlite's call needs (opaque pointers carry none)."""

    def __init__(self, value: ir.Value, fnty: ir.FunctionType):
        self.value, self.function_type, self.type = value, fnty, value.type

    def get_reference(self) -> str:
        return self.value.get_reference()
