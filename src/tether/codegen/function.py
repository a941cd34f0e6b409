"""Function emission: a tir.PrimFunc body -> one llvmlite function (``i32 @<name>__impl(ptr noalias p0, ...)``,
docs/design.md "Compiler contracts"); statements, loops, allocation and stores.

- ``vectorized`` loops are emitted once with explicit ``<N x T>`` values (codegen/expr.py). A clamped tail
  (extent ``min(N, rest)``) gets a scalar loop beside the vector body. Bodies that cannot be vectorized (a
  lane-dependent ``if``) fall back to a scalar loop.
- ``unrolled`` loops are copied with constant loop variables, so small local buffers (cache_write "local")
  are only addressed at constant offsets and LLVM's SROA keeps them in registers.
- ``parallel`` loops are outlined into task functions (codegen/parallel.py).
"""
from __future__ import annotations

import logging
from typing import Any, Callable, Dict, List, Optional

from llvmlite import ir

from tether.codegen import block_transpose, cpu_dispatch, lane_groups, parallel, scratch
from tether.codegen.expr import ExprEmitter, linear_coefficient, uses
from tether.codegen.halfconv import TO_STORAGE
from tether.codegen.types import (F32, I1, I8, I32, PTR, elem_bytes, half_arithmetic, int_vector, is_vec, mem_type,
                                  native_half)
from tether.errors import CompileError
from tether.target import has_half_arithmetic
from tether.tir import (Allocate, Binary, Buffer, Const, Expr, For, IfThenElse, Load, Prefetch, PrimFunc, SeqStmt,
                        Stmt, Store, Var, is_float, walk)
from tether.tir.visit import by_class

log = logging.getLogger(__name__)

# Internal buffers up to this size live on the stack (entry-block allocas, promotable to registers); larger
# ones outside parallel loops become static zero-initialised scratch (the module has no malloc).
STACK_BYTES = 64 * 1024


class FunctionEmitter(ExprEmitter):
    """Emits one LLVM function body (the impl or a parallel task's body) from loop IR."""

    stmt_emitters: Dict[type, Callable[..., None]]
    loop_emitters: Dict[str, Callable[..., bool]]

    def __init__(self, ctx: Any, fn: ir.Function, name: str, counter: List[int]):
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
        self.unroll_copy: Dict[Var, int] = {}      # unrolled loop variable -> the copy being emitted
        self.lane_groups: List[lane_groups.LaneGroups] = []    # of the unrolled loops being emitted, inner last
        self.fm = ("fast",) if getattr(ctx, "fast_math", False) else ("contract",)
        # local buffer -> the width of the row vectors every store to it so far wrote (whole rows at constant
        # offsets), None once another store did; and the blocks' columns built from those rows (ExprEmitter.
        # local_lanes): (buffer, lanes, first row) -> (basic block, instructions before, column vectors)
        self.row_stores: Dict[Buffer, Optional[int]] = {}
        self.column_memo: Dict[tuple, tuple] = {}

    # ---- helpers --------------------------------------------------------------------------------------------
    def alloca(self, ty: ir.Type, count: int, name: str, align: int) -> ir.Value:
        # Entry-block allocas of constant size are what SROA/mem2reg promote to registers.
        a = ir.IRBuilder(self.entry).alloca(ir.ArrayType(ty, count), name=name)
        a.align = align
        a.type = PTR  # llvmlite types allocas as typed pointers; the module uses opaque pointers throughout
        return a

    def seal(self, first: Optional[ir.Block] = None) -> None:
        ir.IRBuilder(self.entry).branch(first or self.fn.blocks[1])

    # ---- statements -----------------------------------------------------------------------------------------
    def stmt(self, s: Stmt) -> None:
        table = self.stmt_emitters
        emit = table.get(type(s)) or by_class(table, type(s))
        if emit is None:
            raise CompileError(f"codegen: unknown statement {type(s).__name__}")
        emit(self, s)

    def seq(self, s: SeqStmt) -> None:
        for x in s.stmts:
            self.stmt(x)

    def bind_buffers(self, args, bufs: List[Buffer]) -> None:
        """Name the pointer parameters ``args`` after ``bufs`` and mark them noalias (buffers never overlap)."""
        for arg, buf in zip(args, bufs):
            arg.name = "p_" + "".join(ch if ch.isalnum() else "_" for ch in buf.name)
            arg.add_attribute("noalias")
            self.bufs[buf] = arg

    def allocate(self, s: Allocate) -> None:
        buf = s.buffer
        check_index_range(self.name, buf)
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
            # ---- the module's shared scratch arena (codegen/scratch.py); gv is the fallback when it is taken
            offset = getattr(self, "scratch_offset", 0)
            self.bufs[buf] = scratch.buffer_pointer(self, nbytes, gv)
            self.static_used = True
            self.stmt(s.body)
            scratch.release_scratch(self, offset)
            return
        else:
            if nbytes > STACK_BYTES:
                log.warning("%s: buffer %r (%d bytes) is allocated on the stack of every parallel task; "
                            "attach it at an inner loop (compute_at) to shrink it", self.name, buf.name, nbytes)
            ptr = self.alloca(ety, buf.size, buf.name, 16)
        self.bufs[buf] = ptr
        self.stmt(s.body)

    def if_then_else(self, s: IfThenElse) -> None:
        cond = self.ev(s.cond)
        if is_vec(cond):
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

    def prefetch(self, s: Prefetch) -> None:
        """llvm.prefetch (read, keep in all levels, data) of the line holding ``buffer[index]``. The address may lie
        past the buffer (a stream read ahead), so the GEP is not inbounds: a prefetch never faults."""
        idx = self.ev_at_base(s.index) if self.vec is not None else self.ev(s.index)
        ptr = self.b.gep(self.bufs[s.buffer], [idx], source_etype=mem_type(s.buffer.dtype))
        module = self.b.module
        fn = module.globals.get("llvm.prefetch.p0") or ir.Function(
            module, ir.FunctionType(ir.VoidType(), [PTR, I32, I32, I32]), "llvm.prefetch.p0")
        self.b.call(fn, [ptr, ir.Constant(I32, 0), ir.Constant(I32, 3), ir.Constant(I32, 1)])

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
        if buf.scope == "local":
            self.note_local_store(buf, s.index)
        if self.vec is not None and self.uses_lane(s.index):
            coef = self.lane_stride(s.index)
            n = self.lanes()
            if coef == 1:
                idx = self.ev_at_base(s.index)
                ptr = self.b.gep(self.bufs[buf], [idx], inbounds=True, source_etype=ety)
                v = self.to_mem(self.splat(value, n), buf.dtype)
                self.b.store(v, ptr, align=align)
                return
            # A linear stride addresses every lane as one pointer plus a constant: per-lane index arithmetic
            # made each of an unrolled block's hundreds of scalar stores an opaque address, and dead-store
            # elimination spent half of the -O3 time of such kernels proving them apart. Not for narrow elements:
            # provably adjacent int8 stores were merged by the SLP vectorizer into shuffles costing more than
            # they save (an int8 requantizing conv: 8% more instructions on Cortex-A72).
            first = None
            if coef is not None and align >= 4:
                idx0 = self.ev_at_base(s.index)
                first = self.b.gep(self.bufs[buf], [idx0], inbounds=True, source_etype=ety)
            for lane in range(n):
                if first is not None:
                    ptr = first if lane == 0 else self.b.gep(first, [ir.Constant(idx0.type, lane * coef)],
                                                             inbounds=True, source_etype=ety)
                else:
                    idx = self.ev_at_lane(s.index, lane)
                    ptr = self.b.gep(self.bufs[buf], [idx], inbounds=True, source_etype=ety)
                x = self.b.extract_element(value, ir.Constant(I32, lane)) if is_vec(value) else value
                self.b.store(self.to_mem(x, buf.dtype), ptr, align=align)
            return
        if is_vec(value):  # a lane-invariant location written by every lane: the last lane wins, as in a loop
            value = self.b.extract_element(value, ir.Constant(I32, value.type.count - 1))
        idx = self.ev(s.index)
        ptr = self.b.gep(self.bufs[buf], [idx], inbounds=True, source_etype=ety)
        self.b.store(self.to_mem(value, buf.dtype), ptr, align=align)

    def note_local_store(self, buf: Buffer, index: Expr) -> None:
        """Record whether this store to local ``buf`` writes a whole row vector at a constant offset (a register
        block's row), keeping row_stores[buf] the common width of all such stores (None: not all are). (It
        evaluates the index at the first lane, as store() then does: integer arithmetic is reused (IntCSE), a
        register block's index is a constant, and LLVM drops any other repeat.)"""
        width = None
        if self.vec is not None and self.uses_lane(index) and self.lane_stride(index) == 1:
            base = self.ev_at_base(index)
            n = self.lanes()
            if isinstance(base, ir.Constant) and isinstance(base.constant, int) and base.constant % n == 0:
                width = n
        self.row_stores[buf] = width if self.row_stores.get(buf, width) == width else None

    def to_mem(self, v: ir.Value, dtype: str) -> ir.Value:
        if dtype in TO_STORAGE and not native_half(dtype):  # float16/bfloat16: round the float32 to its bits
            return TO_STORAGE[dtype](self.b, v)
        if dtype != "bool":
            return v
        ty = ir.VectorType(I8, v.type.count) if is_vec(v) else I8
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
        emit = self.loop_emitters.get(s.kind)
        if emit is None or not emit(self, s):
            self.serial(s)

    # Loop kinds other than serial: each emits the loop and returns True, or declines (False: a serial loop).
    def parallel_loop(self, s: For) -> bool:
        if self.in_task:     # nested parallelism runs serially inside the task
            return False
        if self.ctx.parallel_launch_slot is None:   # a single-threaded target (wasm32): a plain loop
            return False
        parallel.emit_parallel(self, s)
        return True

    def vectorized_loop(self, s: For) -> bool:
        if self.vec is not None or not vectorizable(s.body, s.var):
            return False
        self.specialised(s, self.vector_body)
        return True

    def unrolled_loop(self, s: For) -> bool:
        self.specialised(s, self.unrolled_body)
        return True

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
        if self.transposed_stores(s, start):
            return
        groups = lane_groups.plan(self.ctx.target, s) if self.vec is None and self.mask is None else None
        if groups is not None:
            self.lane_groups.append(groups)
        try:
            for k in range(s.max_extent):
                self.env[s.var] = self.index_add(start, k) if k else start
                self.unroll_copy[s.var] = k
                if groups is not None:
                    groups.copy = k
                self.stmt(s.body)
        finally:
            if groups is not None:
                self.lane_groups.pop()
            self.env.pop(s.var, None)
            self.unroll_copy.pop(s.var, None)

    def transposed_stores(self, s: For, start: ir.Value) -> bool:
        """Emit unrolled loop ``s`` over a vectorized store whose lanes lie far apart and whose unrolled copies are
        adjacent (``out[a + u + S*v]``, S >= the copies: a register block's rows written to NCHW channel rows) as
        the copies' value vectors, transposed by codegen/block_transpose.py and stored one contiguous column per
        lane. Lane by lane it was a scalar store per element (12 x 32 for a block), which LLVM's SLP vectorizer
        then spent a fifth of such a conv's compile time on. False (nothing emitted) where the loop is no such
        store. AVX-512 only: what the shuffles cost elsewhere is not measured."""
        v = s.body
        if not (self.vec is None and self.mask is None and isinstance(v, For) and v.kind == "vectorized"
                and isinstance(v.min, Const) and isinstance(v.extent, Const) and v.extent.value == v.max_extent
                and isinstance(v.body, Store) and vectorizable(v.body, v.var)):
            return False
        st, rows, cols = v.body, s.max_extent, v.max_extent
        tgt = self.ctx.target
        if (st.reduction or st.buffer.dtype != "float32" or st.buffer.scope == "local"
                or not (tgt.arch == "x86_64" and tgt.vector_lanes(32) >= 16)
                or not block_transpose.usable(rows, cols) or linear_coefficient(st.index, s.var) != 1):
            return False
        stride = linear_coefficient(st.index, v.var)
        if stride is None or stride < rows or any(isinstance(n, Load) and n.buffer is st.buffer
                                                  for n in walk(st.value)):
            return False
        lo = int(v.min.value)
        self.ranges[v.var] = (lo, lo + cols - 1)
        values = []
        try:
            for k in range(rows):
                self.env[s.var] = self.index_add(start, k) if k else start
                self.unroll_copy[s.var] = k
                values.append(self.vector_body(v, ir.Constant(I32, lo), lambda: self.splat(self.ev(st.value), cols)))
            self.env[s.var], self.env[v.var] = start, ir.Constant(I32, lo)
            first = self.b.gep(self.bufs[st.buffer], [self.ev(st.index)], inbounds=True, source_etype=F32)
        finally:
            self.env.pop(s.var, None)
            self.env.pop(v.var, None)
            self.unroll_copy.pop(s.var, None)
        for c, column in enumerate(block_transpose.columns(self.b, values, cols)):
            ptr = first if c == 0 else self.b.gep(first, [ir.Constant(I32, c * stride)], inbounds=True,
                                                  source_etype=F32)
            self.b.store(column, ptr, align=4)
        return True

    def vector_body(self, s: For, start: ir.Value, body: Optional[Callable[[], Any]] = None) -> Any:
        """Emit ``s``'s body (or call ``body``, returning what it returns) with ``s``'s variable as the lanes."""
        n = s.max_extent
        saved = (self.vec, self.vec_index)
        self.vec = (s.var, n, start)
        self.lane_memo, self.lane_keep = {}, []
        # Built up front so it dominates every use inside the body (a constant start: a constant, no instruction).
        if isinstance(start, ir.Constant) and isinstance(start.constant, int):
            self.vec_index = int_vector(I32, range(start.constant, start.constant + n))
        else:
            self.vec_index = self.b.add(self.splat(start, n), int_vector(I32, range(n)), flags=("nsw",))
        self.env[s.var] = start
        try:
            if body is not None:
                return body()
            self.stmt(s.body)
            return None
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
        if is_vec(start) or is_vec(extent):
            raise CompileError(f"codegen: loop {var.name!r} has lane-dependent bounds inside a vectorized loop")
        end = self.int_cse().emit(self.b, "add", start, extent, ("nsw",),
                                  lambda: self.b.add(start, extent, flags=("nsw",)))
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


def vectorizable(body: Stmt, var: Var) -> bool:
    """Whether every control-flow decision inside a vectorized loop is the same for all lanes."""
    for s in walk(body):
        if isinstance(s, IfThenElse) and uses(s.cond, var):
            return False
        if isinstance(s, For) and (uses(s.min, var) or uses(s.extent, var) or s.kind == "parallel"):
            return False
        if isinstance(s, Allocate):
            return False
    return True


INDEX_LIMIT = 2 ** 31 - 1  # indices are int32 (tir): an element beyond this would wrap around


def check_index_range(func: str, buf: Buffer) -> None:
    """Refuse, at build time, a buffer with more elements than an int32 index reaches."""
    if buf.size > INDEX_LIMIT:
        raise CompileError("%s: buffer %r has %d elements (shape %s), but tether indexes buffers with 32-bit "
                           "integers, so a buffer may hold at most 2**31 - 1 = %d: split the tensor (e.g. compute "
                           "it in pieces along its outer axis)" % (func, buf.name, buf.size, tuple(buf.shape),
                                                                    INDEX_LIMIT))


def emit_function(ctx: Any, primfunc: PrimFunc) -> ir.Function:
    """Emit ``i32 @<name>__impl(ptr noalias p0, ...)`` for ``primfunc`` into ``ctx.module`` (``ctx``: a
    codegen.module.ModuleBuilder)."""
    # a kernel using instructions the device may or may not have: two versions, chosen at load time
    with half_arithmetic(has_half_arithmetic(ctx.target)):
        dispatched = cpu_dispatch.emit(ctx, primfunc, _emit_one)
        return dispatched if dispatched is not None else _emit_one(ctx, primfunc)


def _emit_one(ctx: Any, primfunc: PrimFunc) -> ir.Function:
    params = primfunc.param_buffers
    for buf in params:
        check_index_range(primfunc.name, buf)
    fnty = ir.FunctionType(I32, [PTR] * len(params))
    fn = ir.Function(ctx.module, fnty, f"{primfunc.name}__impl")
    fn.attributes.add("nounwind")
    # the impl stays a symbol of its own (hidden, for C users of the object): not inlined into the packed
    # wrapper as a second copy to optimise
    fn.attributes.add("noinline")
    em = FunctionEmitter(ctx, fn, primfunc.name, [0])
    em.bind_buffers(fn.args, params)
    body_bb = em.b.block
    em.stmt(primfunc.body)
    em.rets.append(em.b.ret(ir.Constant(I32, 0)))
    if not em.static_used or ctx.target.is_wasm:   # (wasm32: the arena needs no lock, codegen/scratch.py)
        em.seal()
        return fn
    # Static scratch is shared by every call: the module's arena, or when another call holds that, this impl's own
    # arrays under a spin lock that serialises concurrent calls (from several threads of the host program)
    # instead of letting them corrupt each other's intermediates (codegen/scratch.py).
    lock = ir.GlobalVariable(ctx.module, I32, f"{primfunc.name}.scratch_lock")
    lock.linkage = "internal"
    lock.initializer = ir.Constant(I32, 0)
    lock.align = 4
    em.seal(scratch.lock_and_unlock(em, lock, body_bb, em.rets))
    return fn


# statement node type -> its emitter (a new statement type is one row)
_STMT_EMITTERS = {
    SeqStmt: FunctionEmitter.seq,
    Store: FunctionEmitter.store,
    Prefetch: FunctionEmitter.prefetch,
    For: FunctionEmitter.loop,
    IfThenElse: FunctionEmitter.if_then_else,
    Allocate: FunctionEmitter.allocate,
}

# For.kind -> its emitter ("serial" and unknown kinds: a plain loop)
_LOOP_EMITTERS = {
    "parallel": FunctionEmitter.parallel_loop,
    "vectorized": FunctionEmitter.vectorized_loop,
    "unrolled": FunctionEmitter.unrolled_loop,
}
# class attributes, so that another target's emitter (codegen/ptx.py) can change rows in copies of its own
FunctionEmitter.stmt_emitters = _STMT_EMITTERS
FunctionEmitter.loop_emitters = _LOOP_EMITTERS
