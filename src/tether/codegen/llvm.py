"""tir.PrimFunc -> llvmlite IR: ``i32 @<name>__impl(ptr noalias p0, ...)`` (docs/design.md "Compiler contracts").

- ``vectorized`` loops are emitted once with explicit ``<N x T>`` values: loads/stores whose index moves by one
  element per lane become vector loads/stores, lane-invariant values stay scalar (splat on use), anything else
  is gathered/scattered lane by lane. A clamped tail (extent ``min(N, rest)``) gets a scalar loop beside the
  vector body. Bodies that cannot be vectorized (a lane-dependent ``if``) fall back to a scalar loop.
- ``unrolled`` loops are copied with constant loop variables, so small local buffers (cache_write "local")
  are only addressed at constant offsets and LLVM's SROA keeps them in registers.
- ``parallel`` loops are outlined into ``i32 task(i32 id, i32 n, ptr closure)`` and run through the launcher
  in ``ctx.parallel_launch_slot`` (serially in-line when it is NULL); see docs/abi.md "Parallel loops".
"""
from __future__ import annotations

import logging
from typing import Callable, Dict, List, Optional

from llvmlite import ir

from tether.errors import CompileError
from tether.tir import (Allocate, Binary, Buffer, Call, Cast, Compare, Const, Expr, For, IfThenElse, Load, Not,
                        PrimFunc, Select, SeqStmt, Stmt, Store, Var, children as _children, is_bool, is_float,
                        substitute, walk, walk_stmts)
from tether.tir.simplify import Simplifier

log = logging.getLogger(__name__)

I1, I8, I32, I64 = ir.IntType(1), ir.IntType(8), ir.IntType(32), ir.IntType(64)
PTR = ir.PointerType()
TASK_FN_TYPE = ir.FunctionType(I32, [I32, I32, PTR])
LAUNCHER_FN_TYPE = ir.FunctionType(I32, [PTR, PTR, I32])
PARALLEL_ERROR = 8 << 24
# Upper bound on tasks per parallel loop: each task is one launcher dispatch (a foreign call from the runtime's
# Python thread pool), so a few tasks per core balance load without paying per-iteration dispatch costs.
MAX_PARALLEL_TASKS = 16
# Internal buffers up to this size live on the stack (entry-block allocas, promotable to registers); larger
# ones outside parallel loops become static zero-initialised scratch (the module has no malloc).
STACK_BYTES = 64 * 1024

_SCALAR = {"float32": ir.FloatType(), "float64": ir.DoubleType(), "int8": I8, "uint8": I8,
           "int16": ir.IntType(16), "int32": I32, "int64": I64, "bool": I1}
_FCMP = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}


def scalar_type(dtype: str) -> ir.Type:
    try:
        return _SCALAR[dtype]
    except KeyError:
        raise CompileError(f"dtype {dtype!r} is not supported by the LLVM code generator") from None


def mem_type(dtype: str) -> ir.Type:
    return I8 if dtype == "bool" else scalar_type(dtype)


def elem_bytes(dtype: str) -> int:
    return 1 if dtype == "bool" else int(dtype.lstrip("uintfloat")) // 8


def _is_vec(v: ir.Value) -> bool:
    return isinstance(v.type, ir.VectorType)


def _uses(e: Expr, var: Var) -> bool:
    return any(n is var for n in walk(e))


class _FnPointer:
    """A loaded function pointer with the function type llvmlite's call needs (opaque pointers carry none)."""

    def __init__(self, value: ir.Value, fnty: ir.FunctionType):
        self.value, self.function_type, self.type = value, fnty, value.type

    def get_reference(self) -> str:
        return self.value.get_reference()


class _FunctionEmitter:
    """Emits one LLVM function body (the impl or a parallel task) from loop IR."""

    def __init__(self, ctx, fn: ir.Function, name: str, counter: List[int]):
        self.ctx = ctx
        self.fn = fn
        self.name = name
        self.counter = counter             # shared task counter for unique task names
        # Allocas go to their own entry block (closed by seal()), so inserting one never disturbs the builder.
        self.entry = fn.append_basic_block("entry")
        self.b = ir.IRBuilder(fn.append_basic_block("body"))
        self.env: Dict[Var, ir.Value] = {}
        self.bufs: Dict[Buffer, ir.Value] = {}
        self.vec: Optional[tuple] = None   # (var, lanes, base scalar)
        self.vec_index: Optional[ir.Value] = None
        self.static_used = False            # static scratch buffers: calls must not overlap (see emit_function)
        self.rets: List[ir.Instruction] = []
        self.reassoc_node: Optional[Expr] = None   # the combine of the reduction update being emitted
        self.mask: Optional[ir.Value] = None  # <N x i1>: lanes whose (conditional) value is actually used
        self.ranges: Dict[Var, tuple] = {}   # loop variable -> inclusive range, for bounds proofs
        self.clamps: Dict[Var, Expr] = {}    # loop variable -> its symbolic last value (clamped tails)
        self.unsafe_memo: Dict[int, bool] = {}
        self.unsafe_keep: List[Expr] = []
        self.lane_memo: Dict[int, bool] = {}
        self.lane_keep: List[Expr] = []     # keeps memo keys (ids) alive
        self.in_task = False
        self.fm = ("fast",) if getattr(ctx, "fast_math", False) else ("contract",)
        self.target_bits = getattr(getattr(ctx, "target", None), "bits", 64)

    # ---- helpers --------------------------------------------------------------------------------------------
    def alloca(self, ty: ir.Type, count: int, name: str, align: int) -> ir.Value:
        # Entry-block allocas of constant size are what SROA/mem2reg promote to registers.
        a = ir.IRBuilder(self.entry).alloca(ir.ArrayType(ty, count), name=name)
        a.align = align
        a.type = PTR  # llvmlite types allocas as typed pointers; the module uses opaque pointers throughout
        return a

    def seal(self, first: Optional[ir.Block] = None) -> None:
        ir.IRBuilder(self.entry).branch(first or self.fn.blocks[1])

    def lanes(self) -> int:
        return self.vec[1]

    def splat(self, v: ir.Value, n: int) -> ir.Value:
        if _is_vec(v):
            return v
        vty = ir.VectorType(v.type, n)
        if isinstance(v, ir.Constant):
            return ir.Constant(vty, [v.constant] * n)
        undef = ir.Constant(vty, ir.Undefined)
        one = self.b.insert_element(undef, v, ir.Constant(I32, 0))
        return self.b.shuffle_vector(one, undef, ir.Constant(ir.VectorType(I32, n), [0] * n))

    def match(self, a: ir.Value, b: ir.Value):
        if _is_vec(a) and not _is_vec(b):
            return a, self.splat(b, a.type.count)
        if _is_vec(b) and not _is_vec(a):
            return self.splat(a, b.type.count), b
        return a, b

    def const(self, dtype: str, value) -> ir.Constant:
        ty = scalar_type(dtype)
        if is_bool(dtype):
            return ir.Constant(I1, 1 if value else 0)
        return ir.Constant(ty, value)

    # ---- statements -----------------------------------------------------------------------------------------
    def stmt(self, s: Stmt) -> None:
        if isinstance(s, SeqStmt):
            for x in s.stmts:
                self.stmt(x)
        elif isinstance(s, Store):
            self.store(s)
        elif isinstance(s, For):
            self.loop(s)
        elif isinstance(s, IfThenElse):
            self.if_then_else(s)
        elif isinstance(s, Allocate):
            self.allocate(s)
        else:
            raise CompileError(f"codegen: unknown statement {type(s).__name__}")

    def allocate(self, s: Allocate) -> None:
        buf = s.buffer
        ety = mem_type(buf.dtype)
        nbytes = buf.size * elem_bytes(buf.dtype)
        if nbytes > STACK_BYTES and not self.in_task:
            gv = ir.GlobalVariable(self.ctx.module, ir.ArrayType(ety, buf.size),
                                   f"{self.name}.{buf.name}.scratch.{self.counter[0]}")
            self.counter[0] += 1
            gv.linkage = "internal"
            gv.initializer = ir.Constant(ir.ArrayType(ety, buf.size), None)
            gv.align = 16
            gv.type = PTR   # opaque pointer, like every other buffer (llvmlite types globals as typed pointers)
            ptr = gv
            self.static_used = True
        else:
            if nbytes > STACK_BYTES:
                log.warning("%s: buffer %r (%d bytes) is allocated on the stack of every parallel task; "
                            "attach it at an inner loop (compute_at) to shrink it", self.name, buf.name, nbytes)
            ptr = self.alloca(ety, buf.size, buf.name, 16)
        self.bufs[buf] = ptr
        self.stmt(s.body)

    def if_then_else(self, s: IfThenElse) -> None:
        cond = self.ev(s.cond)
        if _is_vec(cond):
            raise CompileError("codegen: a lane-dependent condition reached a vectorized body")
        then_bb = self.fn.append_basic_block("if.then")
        end_bb = self.fn.append_basic_block("if.end")
        else_bb = self.fn.append_basic_block("if.else") if s.else_case is not None else end_bb
        self.b.cbranch(cond, then_bb, else_bb)
        self.b.position_at_end(then_bb)
        self.stmt(s.then_case)
        self.b.branch(end_bb)
        if s.else_case is not None:
            self.b.position_at_end(else_bb)
            self.stmt(s.else_case)
            self.b.branch(end_bb)
        self.b.position_at_end(end_bb)

    def store(self, s: Store) -> None:
        buf = s.buffer
        ety = mem_type(buf.dtype)
        align = elem_bytes(buf.dtype)
        if s.reduction in ("sum", "prod", "max", "min") and isinstance(s.value, Binary) and is_float(s.value.dtype):
            # A reduction's order is unspecified: reassociation lets LLVM keep several partial sums in vector
            # registers (a row sum runs ~6x faster) at the cost of last-bit differences.
            self.reassoc_node = s.value
        try:
            value = self.ev(s.value)
        finally:
            self.reassoc_node = None
        if self.vec is not None and self.uses_lane(s.index):
            coef = self.lane_stride(s.index)
            n = self.lanes()
            if coef == 1:
                idx = self.ev_at_base(s.index)
                ptr = self.b.gep(self.bufs[buf], [idx], inbounds=True, source_etype=ety)
                v = self.to_mem(self.splat(value, n), buf.dtype)
                self.b.store(v, ptr, align=align)
                return
            for lane in range(n):
                idx = self.ev_at_lane(s.index, lane)
                ptr = self.b.gep(self.bufs[buf], [idx], inbounds=True, source_etype=ety)
                x = self.b.extract_element(value, ir.Constant(I32, lane)) if _is_vec(value) else value
                self.b.store(self.to_mem(x, buf.dtype), ptr, align=align)
            return
        if _is_vec(value):  # a lane-invariant location written by every lane: the last lane wins, as in a loop
            value = self.b.extract_element(value, ir.Constant(I32, value.type.count - 1))
        idx = self.ev(s.index)
        ptr = self.b.gep(self.bufs[buf], [idx], inbounds=True, source_etype=ety)
        self.b.store(self.to_mem(value, buf.dtype), ptr, align=align)

    def to_mem(self, v: ir.Value, dtype: str) -> ir.Value:
        if dtype != "bool":
            return v
        ty = ir.VectorType(I8, v.type.count) if _is_vec(v) else I8
        return self.b.zext(v, ty)

    # ---- loops ----------------------------------------------------------------------------------------------
    def loop(self, s: For) -> None:
        lo = s.min.value if isinstance(s.min, Const) else None
        ext = s.max_extent if s.max_extent is not None else (s.extent.value if isinstance(s.extent, Const) else None)
        if lo is not None and ext is not None:
            self.ranges[s.var] = (lo, lo + max(ext, 1) - 1)   # proves loads in bounds (see unsafe())
        clamp = s.extent if not isinstance(s.extent, Const) else s.bound_extent
        if clamp is not None and lo is not None:
            self.clamps[s.var] = Binary("sub", Binary("add", clamp, Const(lo, "int32")), Const(1, "int32"))
        if s.kind == "parallel" and not self.in_task:
            self.parallel(s)
        elif s.kind == "vectorized" and self.vec is None and _vectorizable(s.body, s.var):
            self.specialised(s, self.vector_body)
        elif s.kind == "unrolled":
            self.specialised(s, self.unrolled_body)
        else:
            self.serial(s)

    def specialised(self, s: For, emit_full: Callable[[For, ir.Value], None]) -> None:
        """Emit ``emit_full`` when the loop runs its full constant extent, else (a tail) a serial loop."""
        start = self.ev(s.min)
        full = s.max_extent
        if isinstance(s.extent, Const):
            if s.extent.value == full:
                emit_full(s, start)
            elif s.extent.value > 0:
                self.serial(s)
            return
        extent = self.ev(s.extent)
        is_full = self.b.icmp_signed("==", extent, ir.Constant(I32, full))
        full_bb = self.fn.append_basic_block(f"{s.var.name}.full")
        tail_bb = self.fn.append_basic_block(f"{s.var.name}.tail")
        end_bb = self.fn.append_basic_block(f"{s.var.name}.end")
        self.b.cbranch(is_full, full_bb, tail_bb)
        self.b.position_at_end(full_bb)
        emit_full(s, start)
        self.b.branch(end_bb)
        self.b.position_at_end(tail_bb)
        self.serial_range(s.var, start, extent, lambda: self.stmt(s.body), tail=True)
        self.b.branch(end_bb)
        self.b.position_at_end(end_bb)

    def unrolled_body(self, s: For, start: ir.Value) -> None:
        for k in range(s.max_extent):
            self.env[s.var] = self.b.add(start, ir.Constant(I32, k), flags=("nsw",)) if k else start
            self.stmt(s.body)
        self.env.pop(s.var, None)

    def vector_body(self, s: For, start: ir.Value) -> None:
        n = s.max_extent
        saved = (self.vec, self.vec_index)
        self.vec = (s.var, n, start)
        self.lane_memo, self.lane_keep = {}, []
        # Built up front so it dominates every use inside the body.
        self.vec_index = self.b.add(self.splat(start, n), ir.Constant(ir.VectorType(I32, n), list(range(n))),
                                    flags=("nsw",))
        self.env[s.var] = start
        try:
            self.stmt(s.body)
        finally:
            self.vec, self.vec_index = saved
            self.env.pop(s.var, None)

    def serial(self, s: For) -> None:
        start = self.ev(s.min)
        extent = self.ev(s.extent)
        self.serial_range(s.var, start, extent, lambda: self.stmt(s.body),
                          known_positive=isinstance(s.extent, Const) and s.extent.value > 0,
                          tail=getattr(s, "tail", False))

    def tail_loop_md(self):
        """Loop metadata for tail loops: no LLVM vectorization/unrolling (cold code; keeps compile time low)."""
        mod = self.ctx.module
        md = getattr(mod, "_tether_tail_loop_md", None)
        if md is None:
            novec = mod.add_metadata([ir.MetaDataString(mod, "llvm.loop.vectorize.enable"), ir.Constant(I1, 0)])
            nounroll = mod.add_metadata([ir.MetaDataString(mod, "llvm.loop.unroll.disable")])
            md = mod.add_metadata([novec, nounroll, ir.MetaDataString(mod, "tether.tail")])
            md.operands = (md,) + md.operands   # loop IDs refer to themselves
            mod._tether_tail_loop_md = md
        return md

    def serial_range(self, var: Var, start: ir.Value, extent: ir.Value, body: Callable[[], None],
                     known_positive: bool = False, tail: bool = False) -> None:
        if _is_vec(start) or _is_vec(extent):
            raise CompileError(f"codegen: loop {var.name!r} has lane-dependent bounds inside a vectorized loop")
        end = self.b.add(start, extent, flags=("nsw",))
        pre = self.b.block
        body_bb = self.fn.append_basic_block(f"{var.name}.body")
        exit_bb = self.fn.append_basic_block(f"{var.name}.exit")
        if known_positive:
            self.b.branch(body_bb)
        else:
            self.b.cbranch(self.b.icmp_signed("<", start, end), body_bb, exit_bb)
        self.b.position_at_end(body_bb)
        phi = self.b.phi(I32, name=var.name)
        phi.add_incoming(start, pre)
        saved = self.env.get(var)
        self.env[var] = phi
        body()
        nxt = self.b.add(phi, ir.Constant(I32, 1), flags=("nsw",))
        phi.add_incoming(nxt, self.b.block)
        latch = self.b.cbranch(self.b.icmp_signed("<", nxt, end), body_bb, exit_bb)
        if tail:
            latch.set_metadata("llvm.loop", self.tail_loop_md())
        self.b.position_at_end(exit_bb)
        if saved is None:
            self.env.pop(var, None)
        else:
            self.env[var] = saved

    # ---- parallel -------------------------------------------------------------------------------------------
    def parallel(self, s: For) -> None:
        bufs, fvars = _free_symbols(s)
        fields = [PTR] * len(bufs) + [scalar_type(v.dtype) for v in fvars] + [I32, I32]
        cty = ir.LiteralStructType(fields)
        closure = self.alloca_struct(cty)
        start = self.ev(s.min)
        extent = self.ev(s.extent)
        values = [self.bufs[b] for b in bufs] + [self.env[v] for v in fvars] + [start, extent]
        for k, v in enumerate(values):
            p = self.b.gep(closure, [ir.Constant(I32, 0), ir.Constant(I32, k)], inbounds=True, source_etype=cty)
            self.b.store(v, p)
        task = self.make_task(s, bufs, fvars, cty)
        # num_tasks = ceil(extent / ceil(extent / MAX)): no empty tasks, at most MAX of them.
        one = ir.Constant(I32, 1)
        ext_pos = self.b.select(self.b.icmp_signed("<", extent, one), one, extent)
        per = self.b.sdiv(self.b.add(ext_pos, ir.Constant(I32, MAX_PARALLEL_TASKS - 1)),
                          ir.Constant(I32, MAX_PARALLEL_TASKS))
        ntasks = self.b.sdiv(self.b.add(ext_pos, self.b.sub(per, one)), per)
        slot = self.ctx.parallel_launch_slot
        launcher = self.b.load(slot, typ=PTR, align=self.target_bits // 8)
        has = self.b.icmp_unsigned("!=", launcher, ir.Constant(PTR, None))
        launch_bb = self.fn.append_basic_block("par.launch")
        serial_bb = self.fn.append_basic_block("par.serial")
        check_bb = self.fn.append_basic_block("par.check")
        fail_bb = self.fn.append_basic_block("par.fail")
        done_bb = self.fn.append_basic_block("par.done")
        self.b.cbranch(has, launch_bb, serial_bb)
        self.b.position_at_end(launch_bb)
        rc_launch = self.b.call(_FnPointer(launcher, LAUNCHER_FN_TYPE), [task, closure, ntasks])
        self.b.branch(check_bb)
        self.b.position_at_end(serial_bb)
        loop_bb = self.fn.append_basic_block("par.serial.loop")
        self.b.branch(loop_bb)
        self.b.position_at_end(loop_bb)
        tid = self.b.phi(I32)
        tid.add_incoming(ir.Constant(I32, 0), serial_bb)
        rc_t = self.b.call(task, [tid, ntasks, closure])
        nxt = self.b.add(tid, one)
        tid.add_incoming(nxt, loop_bb)
        more = self.b.and_(self.b.icmp_signed("<", nxt, ntasks), self.b.icmp_signed("==", rc_t, ir.Constant(I32, 0)))
        self.b.cbranch(more, loop_bb, check_bb)
        self.b.position_at_end(check_bb)
        rc = self.b.phi(I32)
        rc.add_incoming(rc_launch, launch_bb)
        rc.add_incoming(rc_t, loop_bb)
        self.b.cbranch(self.b.icmp_signed("==", rc, ir.Constant(I32, 0)), done_bb, fail_bb)
        self.b.position_at_end(fail_bb)
        self.rets.append(self.b.ret(self.b.or_(self.b.and_(rc, ir.Constant(I32, 0xFFFFFF)),
                                               ir.Constant(I32, PARALLEL_ERROR))))
        self.b.position_at_end(done_bb)

    def alloca_struct(self, ty: ir.Type) -> ir.Value:
        a = ir.IRBuilder(self.entry).alloca(ty, name="closure")
        a.align = 8
        a.type = PTR
        return a

    def make_task(self, s: For, bufs: List[Buffer], fvars: List[Var], cty: ir.Type) -> ir.Function:
        """The task function (closure unpacking and chunking) around a body function whose buffer pointers are
        ``noalias`` parameters, so the loop body keeps the aliasing facts the impl's parameters carry."""
        k = self.counter[0]
        self.counter[0] += 1
        module = self.ctx.module
        var_types = [scalar_type(v.dtype) for v in fvars]
        body_fn = ir.Function(module, ir.FunctionType(I32, [PTR] * len(bufs) + var_types + [I32, I32]),
                              f"{self.name}__task{k}.body")
        body_fn.linkage = "internal"
        body_fn.attributes.add("nounwind")
        # (Not noinline, although the body is then optimised twice, in the task and in the impl's serial fallback:
        # inlined there it sees the impl's constants, and squeezenet ran 14% slower at 1 thread without that.)
        em = _FunctionEmitter(self.ctx, body_fn, self.name, self.counter)
        em.in_task = True
        em.ranges = dict(self.ranges)
        em.clamps = dict(self.clamps)
        for arg, buf in zip(body_fn.args, bufs):
            arg.add_attribute("noalias")
            arg.name = "p_" + "".join(ch if ch.isalnum() else "_" for ch in buf.name)
            em.bufs[buf] = arg
        for arg, v in zip(body_fn.args[len(bufs):], fvars):
            arg.name = v.name
            em.env[v] = arg
        lo, hi = body_fn.args[-2:]
        em.serial_range(s.var, lo, em.b.sub(hi, lo), lambda: em.stmt(s.body))
        em.b.ret(ir.Constant(I32, 0))
        em.seal()

        fn = ir.Function(module, TASK_FN_TYPE, f"{self.name}__task{k}")
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
        one = ir.Constant(I32, 1)
        chunk = b.sdiv(b.add(extent, b.sub(ntasks, one)), ntasks)
        lo = b.mul(tid, chunk)
        hi = b.add(lo, chunk)
        hi = b.select(b.icmp_signed("<", hi, extent), hi, extent)
        b.ret(b.call(body_fn, values + [b.add(start, lo), b.add(start, hi)]))
        return fn

    # ---- expressions ----------------------------------------------------------------------------------------
    def lane_stride(self, index: Expr) -> Optional[int]:
        """How far ``index`` moves per lane of the vector loop: an int, or None when it is not linear."""
        var = self.vec[0]
        s = Simplifier({})
        terms, _ = s.linear(index)
        coef = 0
        for atom, c in terms.values():
            if atom is var:
                coef += c
            elif _uses(atom, var):
                return None
        return coef

    def ev_at_base(self, e: Expr) -> ir.Value:
        saved = self.vec
        self.vec = None
        try:
            return self.ev(e)
        finally:
            self.vec = saved

    def ev_at_lane(self, e: Expr, lane: int) -> ir.Value:
        var, _, base = self.vec
        saved = self.vec
        self.vec = None
        self.env[var] = self.b.add(base, ir.Constant(I32, lane), flags=("nsw",)) if lane else base
        try:
            return self.ev(e)
        finally:
            self.env[var] = base
            self.vec = saved

    def uses_lane(self, e: Expr) -> bool:
        """Whether ``e`` depends on the vector loop variable (memoised per vector body: ev asks at every node)."""
        key = id(e)
        hit = self.lane_memo.get(key)
        if hit is None:
            var = self.vec[0]
            hit = self.lane_memo[key] = (e is var) or any(self.uses_lane(c) for c in _children(e))
            self.lane_keep.append(e)
        return hit

    def ev(self, e: Expr) -> ir.Value:
        if self.vec is not None and not self.uses_lane(e):
            return self.ev_at_base(e)
        if isinstance(e, Const):
            return self.const(e.dtype, e.value)
        if isinstance(e, Var):
            if self.vec is not None and e is self.vec[0]:
                return self.vector_index()
            try:
                return self.env[e]
            except KeyError:
                raise CompileError(f"codegen: variable {e.name!r} is used outside its loop") from None
        if isinstance(e, Load):
            return self.load(e)
        if isinstance(e, Binary):
            return self.binary(e)
        if isinstance(e, Compare):
            return self.compare(e)
        if isinstance(e, Not):
            a = self.ev(e.a)
            return self.b.xor(a, self.splat(ir.Constant(I1, 1), a.type.count) if _is_vec(a) else ir.Constant(I1, 1))
        if isinstance(e, Select):
            if self.unsafe(e.t) or self.unsafe(e.f):
                return self.guarded_select(e)
            c, t, f = self.ev(e.cond), self.ev(e.t), self.ev(e.f)
            t, f = self.match(t, f)
            if _is_vec(c) and not _is_vec(t):
                t, f = self.splat(t, c.type.count), self.splat(f, c.type.count)
            return self.b.select(c, t, f)
        if isinstance(e, Cast):
            return self.cast(self.ev(e.value), e.value.dtype, e.dtype)
        if isinstance(e, Call):
            return self.call(e)
        raise CompileError(f"codegen: cannot generate code for {type(e).__name__} ({e})")

    def vector_index(self) -> ir.Value:
        return self.vec_index

    def load(self, e: Load) -> ir.Value:
        buf = e.buffer
        ety = mem_type(buf.dtype)
        align = elem_bytes(buf.dtype)
        if buf not in self.bufs:
            raise CompileError(f"codegen: buffer {buf.name!r} is used outside its allocation")
        if self.mask is not None:
            return self.masked_load(e)
        if self.vec is not None and self.uses_lane(e.index):
            n = self.lanes()
            coef = self.lane_stride(e.index)
            if coef == 1:
                ptr = self.b.gep(self.bufs[buf], [self.ev_at_base(e.index)], inbounds=True, source_etype=ety)
                v = self.b.load(ptr, typ=ir.VectorType(ety, n), align=align)
            else:
                v = self.gather(buf, self.ev(e.index), check_contiguous=coef is None)
            if buf.dtype == "bool":
                v = self.b.icmp_unsigned("!=", v, ir.Constant(v.type, [0] * n))
            return v
        ptr = self.b.gep(self.bufs[buf], [self.ev(e.index)], inbounds=True, source_etype=ety)
        v = self.b.load(ptr, typ=ety, align=align)
        if buf.dtype == "bool":
            v = self.b.icmp_unsigned("!=", v, ir.Constant(I8, 0))
        return v

    # ---- lazily evaluated if_then_else ------------------------------------------------------------------------
    def unsafe(self, e: Expr) -> bool:
        """Whether evaluating ``e`` where its condition is false could fault: a load not provably in bounds
        (padding reads) or an integer division by something that may be zero."""
        key = id(e)
        hit = self.unsafe_memo.get(key)
        if hit is None:
            if isinstance(e, Load):
                idx = e.index
                clamped = {v: Binary("min", v, last, "int32") for v, last in self.clamps.items() if _uses(idx, v)}
                if clamped:   # v == min(v, last): exposes the tail clamp to the bound
                    idx = substitute(idx, clamped)
                b = Simplifier(self.ranges).bound(idx)
                here = b is None or b[0] < 0 or b[1] >= e.buffer.size
            elif isinstance(e, Binary) and e.op in ("floordiv", "floormod", "div") and not is_float(e.dtype):
                b = Simplifier(self.ranges).bound(e.b)
                here = b is None or b[0] <= 0 <= b[1]
            else:
                here = False
            hit = self.unsafe_memo[key] = here or any(self.unsafe(c) for c in _children(e))
            self.unsafe_keep.append(e)
        return hit

    def guarded_select(self, e: Select) -> ir.Value:
        c = self.ev(e.cond)
        if _is_vec(c):
            # lanes differ: evaluate both sides under masks (loads of switched-off lanes are skipped)
            outer = self.mask
            not_c = self.b.xor(c, ir.Constant(c.type, [1] * c.type.count))
            if outer is not None:
                c_t, c_f = self.b.and_(self.splat(outer, c.type.count), c), self.b.and_(
                    self.splat(outer, c.type.count), not_c)
            else:
                c_t, c_f = c, not_c
            try:
                self.mask = c_t
                t = self.ev(e.t)
                self.mask = c_f
                f = self.ev(e.f)
            finally:
                self.mask = outer
            t, f = self.match(t, f)
            if not _is_vec(t):
                t, f = self.splat(t, c.type.count), self.splat(f, c.type.count)
            return self.b.select(c, t, f)
        want_vec = self.vec is not None and (self.uses_lane(e.t) or self.uses_lane(e.f))
        then_bb = self.fn.append_basic_block("sel.then")
        else_bb = self.fn.append_basic_block("sel.else")
        end_bb = self.fn.append_basic_block("sel.end")
        self.b.cbranch(c, then_bb, else_bb)
        vals = []
        for bb, sub in ((then_bb, e.t), (else_bb, e.f)):
            self.b.position_at_end(bb)
            v = self.ev(sub)
            if want_vec:
                v = self.splat(v, self.lanes())
            vals.append((v, self.b.block))
            self.b.branch(end_bb)
        self.b.position_at_end(end_bb)
        phi = self.b.phi(vals[0][0].type)
        for v, bb in vals:
            phi.add_incoming(v, bb)
        return phi

    def masked_load(self, e: Load) -> ir.Value:
        """A load under ``self.mask``: only active lanes touch memory; inactive lanes read as zero."""
        buf = e.buffer
        ety = mem_type(buf.dtype)
        align = elem_bytes(buf.dtype)
        mask = self.mask
        n = mask.type.count
        B = self.b
        mask_bits = B.bitcast(mask, ir.IntType(n))
        vty = ir.VectorType(ety, n)
        zero = ir.Constant(vty, [0] * n)
        lane_dep = self.vec is not None and self.uses_lane(e.index)
        if not lane_dep:            # one address: load it if any lane is active
            saved = self.mask
            self.mask = None
            try:
                idx = self.ev(e.index)
            finally:
                self.mask = saved
            ld_bb, end_bb = self.fn.append_basic_block("mload"), self.fn.append_basic_block("mload.end")
            pre = B.block
            B.cbranch(B.icmp_unsigned("!=", mask_bits, ir.Constant(ir.IntType(n), 0)), ld_bb, end_bb)
            B.position_at_end(ld_bb)
            x = B.load(B.gep(self.bufs[buf], [idx], inbounds=True, source_etype=ety), typ=ety, align=align)
            B.branch(end_bb)
            B.position_at_end(end_bb)
            v = B.phi(ety)
            v.add_incoming(x, ld_bb)
            v.add_incoming(ir.Constant(ety, 0), pre)
        else:
            coef = self.lane_stride(e.index)
            all_on = B.icmp_unsigned("==", mask_bits, ir.Constant(ir.IntType(n), (1 << n) - 1))
            full_bb = self.fn.append_basic_block("mload.full") if coef == 1 else None
            part_bb = self.fn.append_basic_block("mload.lanes")
            end_bb = self.fn.append_basic_block("mload.end")
            incoming = []
            if full_bb is not None:
                B.cbranch(all_on, full_bb, part_bb)
                B.position_at_end(full_bb)
                ptr = B.gep(self.bufs[buf], [self.ev_at_base_unmasked(e.index)], inbounds=True, source_etype=ety)
                incoming.append((B.load(ptr, typ=vty, align=align), B.block))
                B.branch(end_bb)
            else:
                B.branch(part_bb)
            B.position_at_end(part_bb)
            v = zero
            for lane in range(n):
                on = B.extract_element(mask, ir.Constant(I32, lane))
                ld_bb = self.fn.append_basic_block("mload.lane")
                nxt_bb = self.fn.append_basic_block("mload.next")
                pre = B.block
                B.cbranch(on, ld_bb, nxt_bb)
                B.position_at_end(ld_bb)
                idx = self.ev_at_lane_unmasked(e.index, lane)
                x = B.load(B.gep(self.bufs[buf], [idx], inbounds=True, source_etype=ety), typ=ety, align=align)
                v_on = B.insert_element(v, x, ir.Constant(I32, lane))
                ld_end = B.block
                B.branch(nxt_bb)
                B.position_at_end(nxt_bb)
                phi = B.phi(vty)
                phi.add_incoming(v_on, ld_end)
                phi.add_incoming(v, pre)
                v = phi
            incoming.append((v, B.block))
            B.branch(end_bb)
            B.position_at_end(end_bb)
            out = B.phi(vty)
            for val, bb in incoming:
                out.add_incoming(val, bb)
            v = out
        if buf.dtype == "bool":
            z = ir.Constant(v.type, [0] * n) if _is_vec(v) else ir.Constant(I8, 0)
            v = B.icmp_unsigned("!=", v, z)
        return v

    def ev_at_base_unmasked(self, e: Expr) -> ir.Value:
        saved = self.mask
        self.mask = None
        try:
            return self.ev_at_base(e)
        finally:
            self.mask = saved

    def ev_at_lane_unmasked(self, e: Expr, lane: int) -> ir.Value:
        saved = self.mask
        self.mask = None
        try:
            return self.ev_at_lane(e, lane)
        finally:
            self.mask = saved

    def gather(self, buf: Buffer, idxv: ir.Value, check_contiguous: bool) -> ir.Value:
        """Load the lanes of index vector ``idxv`` one by one. For non-linear indices (clamped or wrapped, as
        in padding) first test at run time whether they happen to be consecutive, and then load one vector."""
        B = self.b
        ety = mem_type(buf.dtype)
        align = elem_bytes(buf.dtype)
        n = idxv.type.count
        vty = ir.VectorType(ety, n)
        first = B.extract_element(idxv, ir.Constant(I32, 0))
        incoming = []
        end_bb = None
        if check_contiguous:
            expect = B.add(self.splat(first, n), ir.Constant(ir.VectorType(I32, n), list(range(n))))
            same = B.bitcast(B.icmp_signed("==", idxv, expect), ir.IntType(n))
            vec_bb = self.fn.append_basic_block("gather.contig")
            lanes_bb = self.fn.append_basic_block("gather.lanes")
            end_bb = self.fn.append_basic_block("gather.end")
            B.cbranch(B.icmp_unsigned("==", same, ir.Constant(ir.IntType(n), (1 << n) - 1)), vec_bb, lanes_bb)
            B.position_at_end(vec_bb)
            ptr = B.gep(self.bufs[buf], [first], inbounds=True, source_etype=ety)
            incoming.append((B.load(ptr, typ=vty, align=align), B.block))
            B.branch(end_bb)
            B.position_at_end(lanes_bb)
        v = ir.Constant(vty, ir.Undefined)
        for lane in range(n):
            idx = first if lane == 0 else B.extract_element(idxv, ir.Constant(I32, lane))
            x = B.load(B.gep(self.bufs[buf], [idx], inbounds=True, source_etype=ety), typ=ety, align=align)
            v = B.insert_element(v, x, ir.Constant(I32, lane))
        if end_bb is None:
            return v
        incoming.append((v, B.block))
        B.branch(end_bb)
        B.position_at_end(end_bb)
        phi = B.phi(vty)
        for val, bb in incoming:
            phi.add_incoming(val, bb)
        return phi

    def binary(self, e: Binary) -> ir.Value:
        a, b = self.match(self.ev(e.a), self.ev(e.b))
        op, dt = e.op, e.a.dtype
        B = self.b
        if op == "and":
            return B.and_(a, b)
        if op == "or":
            return B.or_(a, b)
        if is_float(dt):
            fm = self.fm
            if e is self.reassoc_node and "fast" not in fm:
                fm = fm + ("reassoc",)
            if op == "add":
                return B.fadd(a, b, flags=fm)
            if op == "sub":
                return B.fsub(a, b, flags=fm)
            if op == "mul":
                return B.fmul(a, b, flags=fm)
            if op == "div":
                return B.fdiv(a, b, flags=fm)
            if op in ("min", "max"):
                if e is self.reassoc_node and "fast" not in fm:
                    # a max/min reduction: without these flags LLVM will not keep per-lane running maxima
                    fm = fm + ("nnan", "nsz")
                cmp = B.fcmp_ordered("<" if op == "min" else ">", a, b, flags=fm)
                return B.select(cmp, a, b, flags=fm)
            raise CompileError(f"codegen: float operator {op!r} is not supported")
        signed = not dt.startswith("uint") and dt != "bool"
        nsw = ("nsw",) if dt in ("int32", "int64") else ()
        if op == "add":
            return B.add(a, b, flags=nsw)
        if op == "sub":
            return B.sub(a, b, flags=nsw)
        if op == "mul":
            return B.mul(a, b, flags=nsw)
        if op in ("min", "max"):
            cmp = (B.icmp_signed if signed else B.icmp_unsigned)("<" if op == "min" else ">", a, b)
            return B.select(cmp, a, b)
        if op in ("floordiv", "floormod", "div"):
            if not signed:
                return B.udiv(a, b) if op != "floormod" else B.urem(a, b)
            if isinstance(e.b, Const) and e.b.value > 0 and dt in ("int32", "int64") and \
                    not (self.target_bits == 32 and dt == "int64"):
                lo = Simplifier(self.ranges).bound(e.a)
                if lo is not None and lo[0] >= 0:   # index math: floor == truncation, unsigned is cheapest
                    return B.udiv(a, b) if op != "floormod" else B.urem(a, b)
            if self.mask is not None and not isinstance(e.b, Const):
                # lanes the mask switches off may divide by zero (which traps): divide them by one instead
                m = self.mask
                if not _is_vec(b):   # one divisor for all lanes: it matters if any lane is on
                    m = B.icmp_unsigned("!=", B.bitcast(m, ir.IntType(m.type.count)),
                                        ir.Constant(ir.IntType(m.type.count), 0))
                b = B.select(m, b, ir.Constant(b.type, [1] * b.type.count) if _is_vec(b) else ir.Constant(b.type, 1))
            if self.target_bits == 32 and (a.type.element if _is_vec(a) else a.type).width == 64:
                q, r = self.sdivrem64(a, b)     # no __aeabi_ldivmod in a self-contained module
            else:
                q = B.sdiv(a, b)
                r = B.srem(a, b)
            zero = ir.Constant(a.type, [0] * a.type.count) if _is_vec(a) else ir.Constant(a.type, 0)
            adjust = B.and_(B.icmp_signed("!=", r, zero), B.icmp_signed("<", B.xor(r, b), zero))
            if op == "floormod":
                return B.add(r, B.select(adjust, b, zero))
            return B.sub(q, B.zext(adjust, a.type))
        raise CompileError(f"codegen: integer operator {op!r} is not supported")

    def compare(self, e: Compare) -> ir.Value:
        a, b = self.match(self.ev(e.a), self.ev(e.b))
        dt = e.a.dtype
        sym = _FCMP[e.op]
        if is_float(dt):
            if e.op == "ne":
                return self.b.fcmp_unordered("!=", a, b)
            return self.b.fcmp_ordered(sym, a, b)
        if dt.startswith("uint") or dt == "bool":
            return self.b.icmp_unsigned(sym, a, b)
        return self.b.icmp_signed(sym, a, b)

    def cast(self, v: ir.Value, src: str, dst: str) -> ir.Value:
        if src == dst:
            return v
        B = self.b
        n = v.type.count if _is_vec(v) else None
        ty = scalar_type(dst)
        vty = ir.VectorType(ty, n) if n else ty

        def zero(t):
            return ir.Constant(ir.VectorType(t, n), [0] * n) if n else ir.Constant(t, 0)
        if dst == "bool":
            if is_float(src):
                return B.fcmp_unordered("!=", v, zero(scalar_type(src)))
            return B.icmp_unsigned("!=", v, zero(scalar_type(src)))
        if is_float(dst):
            if is_float(src):
                return B.fpext(v, vty) if dst == "float64" else B.fptrunc(v, vty)
            if src.startswith("uint") or src == "bool":
                return B.uitofp(v, vty)
            if self.target_bits == 32 and src == "int64":
                return self.i64_to_float(v, dst)
            return B.sitofp(v, vty)
        # integer destination
        if is_float(src):
            if self.target_bits == 32 and dst == "int64":
                return self.float_to_i64(v, src)
            return B.fptoui(v, vty) if dst.startswith("uint") else B.fptosi(v, vty)
        sb, db = v.type.element.width if n else v.type.width, ty.width
        if sb == db:
            return v
        if sb > db:
            return B.trunc(v, vty)
        return B.zext(v, vty) if (src.startswith("uint") or src == "bool") else B.sext(v, vty)

    # ---- 64-bit integer helpers for 32-bit targets (LLVM would call compiler-rt, which the module lacks) ------
    def _c(self, like: ir.Value, ty: ir.Type, value) -> ir.Constant:
        if _is_vec(like):
            return ir.Constant(ir.VectorType(ty, like.type.count), [value] * like.type.count)
        return ir.Constant(ty, value)

    def _ty(self, like: ir.Value, ty: ir.Type) -> ir.Type:
        return ir.VectorType(ty, like.type.count) if _is_vec(like) else ty

    def i64_to_float(self, v: ir.Value, dst: str) -> ir.Value:
        B, D = self.b, ir.DoubleType()
        hi = B.trunc(B.ashr(v, self._c(v, I64, 32)), self._ty(v, I32))
        lo = B.trunc(v, self._ty(v, I32))
        r = B.fadd(B.fmul(B.sitofp(hi, self._ty(v, D)), self._c(v, D, 4294967296.0)),
                   B.uitofp(lo, self._ty(v, D)))
        return r if dst == "float64" else B.fptrunc(r, self._ty(v, scalar_type(dst)))

    def float_to_i64(self, v: ir.Value, src: str) -> ir.Value:
        B, D = self.b, ir.DoubleType()
        x = v if src == "float64" else B.fpext(v, self._ty(v, D))
        dty = x.type
        trunc = B.select(B.fcmp_ordered(">=", x, self._c(x, D, 0.0)), B.call(self.ctx.math("floor", dty), [x]),
                         B.call(self.ctx.math("ceil", dty), [x]))
        hi_f = B.call(self.ctx.math("floor", dty), [B.fmul(trunc, self._c(x, D, 2.0 ** -32))])
        lo_f = B.fsub(trunc, B.fmul(hi_f, self._c(x, D, 4294967296.0)))
        hi = B.sext(B.fptosi(hi_f, self._ty(x, I32)), self._ty(x, I64))
        lo = B.zext(B.fptoui(lo_f, self._ty(x, I32)), self._ty(x, I64))
        return B.or_(B.shl(hi, self._c(x, I64, 32)), lo)

    def sdivrem64(self, a: ir.Value, b: ir.Value):
        """Truncating i64 quotient and remainder (lane by lane for vectors) through a shift-subtract helper."""
        if _is_vec(a):
            q = ir.Constant(a.type, ir.Undefined)
            r = ir.Constant(a.type, ir.Undefined)
            for lane in range(a.type.count):
                k = ir.Constant(I32, lane)
                ql, rl = self.sdivrem64(self.b.extract_element(a, k), self.b.extract_element(b, k))
                q, r = self.b.insert_element(q, ql, k), self.b.insert_element(r, rl, k)
            return q, r
        B = self.b
        zero = ir.Constant(I64, 0)
        na, nb = B.icmp_signed("<", a, zero), B.icmp_signed("<", b, zero)
        ua = B.select(na, B.sub(zero, a), a)
        ub = B.select(nb, B.sub(zero, b), b)
        res = B.call(_udivmod64(self.ctx.module), [ua, ub])
        uq, ur = B.extract_value(res, 0), B.extract_value(res, 1)
        q = B.select(B.xor(na, nb), B.sub(zero, uq), uq)
        r = B.select(na, B.sub(zero, ur), ur)
        return q, r

    def call(self, e: Call) -> ir.Value:
        args = [self.ev(a) for a in e.args]
        if len(args) == 2:
            args = list(self.match(args[0], args[1]))
        ty = args[0].type
        if e.name == "abs" and not is_float(e.dtype):
            a = args[0]
            zero = ir.Constant(ty, [0] * ty.count) if _is_vec(a) else ir.Constant(ty, 0)
            if e.dtype.startswith("uint") or e.dtype == "bool":
                return a
            return self.b.select(self.b.icmp_signed("<", a, zero), self.b.sub(zero, a), a)
        fn = self.ctx.math(e.name, ty)
        return self.b.call(fn, args, fastmath=self.fm if getattr(self.ctx, "fast_math", False) else ())


def _udivmod64(module: ir.Module) -> ir.Function:
    """``{i64 q, i64 r} tether.udivmod64(i64 n, i64 d)``: restoring binary long division (d != 0)."""
    name = "tether.udivmod64"
    fn = module.globals.get(name)
    if fn is not None:
        return fn
    sty = ir.LiteralStructType([I64, I64])
    fn = ir.Function(module, ir.FunctionType(sty, [I64, I64]), name)
    fn.linkage = "internal"
    fn.attributes.add("nounwind")
    n, d = fn.args
    entry, loop, done = (fn.append_basic_block(x) for x in ("entry", "loop", "done"))
    b = ir.IRBuilder(entry)
    b.branch(loop)
    b.position_at_end(loop)
    i = b.phi(I64)
    q = b.phi(I64)
    r = b.phi(I64)
    one = ir.Constant(I64, 1)
    bit = b.and_(b.lshr(n, i), one)
    r2 = b.or_(b.shl(r, one), bit)
    ge = b.icmp_unsigned(">=", r2, d)
    r3 = b.select(ge, b.sub(r2, d), r2)
    q3 = b.select(ge, b.or_(q, b.shl(one, i)), q)
    i2 = b.sub(i, one)
    i.add_incoming(ir.Constant(I64, 63), entry)
    q.add_incoming(ir.Constant(I64, 0), entry)
    r.add_incoming(ir.Constant(I64, 0), entry)
    i.add_incoming(i2, loop)
    q.add_incoming(q3, loop)
    r.add_incoming(r3, loop)
    b.cbranch(b.icmp_signed(">=", i2, ir.Constant(I64, 0)), loop, done)
    b.position_at_end(done)
    out = b.insert_value(ir.Constant(sty, ir.Undefined), q3, 0)
    b.ret(b.insert_value(out, r3, 1))
    return fn


def _vectorizable(body: Stmt, var: Var) -> bool:
    """Whether every control-flow decision inside a vectorized loop is the same for all lanes."""
    for s in walk_stmts(body):
        if isinstance(s, IfThenElse) and _uses(s.cond, var):
            return False
        if isinstance(s, For) and (_uses(s.min, var) or _uses(s.extent, var) or s.kind == "parallel"):
            return False
        if isinstance(s, Allocate):
            return False
    return True


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

    stmts = list(walk_stmts(loop.body))
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


def emit_function(ctx, primfunc: PrimFunc) -> ir.Function:
    """Emit ``i32 @<name>__impl(ptr noalias p0, ...)`` for ``primfunc`` into ``ctx.module``."""
    params = primfunc.param_buffers
    fnty = ir.FunctionType(I32, [PTR] * len(params))
    fn = ir.Function(ctx.module, fnty, f"{primfunc.name}__impl")
    for a, buf in zip(fn.args, params):
        a.name = "p_" + "".join(ch if ch.isalnum() else "_" for ch in buf.name)
        a.add_attribute("noalias")
    fn.attributes.add("nounwind")
    # the impl stays a symbol of its own (hidden, for C users of the object): not inlined into the packed
    # wrapper as a second copy to optimise
    fn.attributes.add("noinline")
    em = _FunctionEmitter(ctx, fn, primfunc.name, [0])
    for a, buf in zip(fn.args, params):
        em.bufs[buf] = a
    body_bb = em.b.block
    em.stmt(primfunc.body)
    em.rets.append(em.b.ret(ir.Constant(I32, 0)))
    if not em.static_used:
        em.seal()
        return fn
    # Static scratch is shared by every call: a spin lock serialises concurrent calls (from several threads of
    # the host program) instead of letting them corrupt each other's intermediates.
    lock = ir.GlobalVariable(ctx.module, I32, f"{primfunc.name}.scratch_lock")
    lock.linkage = "internal"
    lock.initializer = ir.Constant(I32, 0)
    lock.align = 4
    spin = fn.append_basic_block("scratch.lock")
    b = ir.IRBuilder(spin)
    old = b.atomic_rmw("xchg", lock, ir.Constant(I32, 1), "acquire")
    b.cbranch(b.icmp_unsigned("==", old, ir.Constant(I32, 0)), body_bb, spin)
    for ret in em.rets:
        b.position_before(ret)
        b.store_atomic(ir.Constant(I32, 0), lock, "release", 4)
    em.seal(spin)
    return fn
