"""Expression emission: tir expressions -> llvmlite values, scalar or ``<N x T>`` inside a vectorized loop.

Inside a vectorized loop (``self.vec``) an expression that does not depend on the loop variable is emitted once
as a scalar (splatted where it meets a vector); a load whose index moves by one element per lane is one vector
load; one moving by a small constant stride is one load of the lanes' span and a shufflevector, by a larger
constant stride one llvm.masked.gather; any other index is gathered lane by lane. ``self.mask`` (a select whose
arms might fault) switches lanes off: their loads are skipped and their divisors replaced by one.

Each expression node type, binary operator and cast is one row of a table below.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional

from llvmlite import ir

from tether.codegen import block_transpose, hostcall, int8dot
from tether.codegen.halfconv import FROM_STORAGE, TO_STORAGE, f64_to_f32_odd, half_value
from tether.codegen.intcse import IntCSE
from tether.codegen.types import (F16, F32, I1, I8, I32, PTR, const_like, const_of, elem_bytes, int_vector, is_unsigned,
                                  is_vec, like, mem_type, native_half, scalar_type, splat_const)
from tether.errors import CompileError
from tether.tir import (Binary, Buffer, Call, Cast, Compare, Const, Expr, Load, Not, PackedCall, Select, Var,
                        byte_of_parts, children, dot4_kind, is_bool, is_float, is_pair_dot, is_quad_sum, substitute,
                        walk)
from tether.tir.simplify import Simplifier
from tether.tir.visit import by_class

_CMP = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}
# operator -> IRBuilder method, for the operators that are one instruction
_FLOAT_OPS = {"add": "fadd", "sub": "fsub", "mul": "fmul", "div": "fdiv"}
_INT_OPS = {"add": "add", "sub": "sub", "mul": "mul"}
_BOOL_OPS = {"and": "and_", "or": "or_"}
_BIT_OPS = {"bitand": "and_", "bitor": "or_", "bitxor": "xor", "shl": "shl"}
_DIV_OPS = ("floordiv", "floormod", "div")
_MINMAX = {"min": "<", "max": ">"}
_MINMAX_NUM = {"min": "llvm.minnum", "max": "llvm.maxnum"}
# integer dtypes whose arithmetic cannot wrap (lowering's index math): add/sub/mul carry nsw
_NSW_DTYPES = ("int32", "int64")


# const()'s shared integer constants, by (dtype, value); a constant is immutable once made
_INT_CONSTANTS: Dict[tuple, ir.Constant] = {}
_INT_CONSTANTS_MAX = 65536


def _never_nan(e: Expr) -> bool:
    """A float32/float64 expression that is never NaN: a finite constant, an integer converted, or the sum or
    difference of a finite constant and an integer converted (finite: no inf - inf)."""
    if isinstance(e, Const):
        return e.value == e.value and abs(e.value) != float("inf")
    if isinstance(e, Cast):
        return not is_float(e.value.dtype) and not is_bool(e.value.dtype)
    if isinstance(e, Binary) and e.op in ("add", "sub"):
        return any(isinstance(x, Const) and _never_nan(x) and isinstance(y, Cast) and _never_nan(y)
                   for x, y in ((e.a, e.b), (e.b, e.a)))
    return False


def linear_coefficient(index: Expr, var: Var) -> Optional[int]:
    """How far ``index`` moves per step of ``var``: an int, or None when it is not linear in it."""
    terms, _ = Simplifier({}).linear(index)
    coef = 0
    for atom, c in terms.values():
        if atom is var:
            coef += c
        elif uses(atom, var):
            return None
    return coef


def uses(e: Expr, var: Var) -> bool:
    return any(n is var for n in walk(e))


class ExprEmitter:
    """The expression half of a function emitter (codegen/function.py supplies ``b``, ``fn``, ``bufs``, ``env``,
    ``vec``, ``vec_index``, ``mask``, ``ranges``, ``clamps``, the memo tables, ``fm``, ``ctx`` and ``lane_groups``)."""

    b: ir.IRBuilder
    fn: ir.Function
    env: Dict[Var, ir.Value]
    bufs: Dict[Buffer, ir.Value]
    vec: Optional[tuple]
    vec_index: Optional[ir.Value]
    row_stores: Dict[Buffer, Optional[int]]
    column_memo: Dict[tuple, tuple]
    mask: Optional[ir.Value]
    reassoc_node: Optional[Expr]
    ranges: Dict[Var, tuple]
    clamps: Dict[Var, Expr]
    unsafe_memo: Dict[int, bool]
    unsafe_keep: List[Expr]
    lane_memo: Dict[int, bool]
    lane_keep: List[Expr]
    fm: tuple
    ctx: Any
    expr_emitters: Dict[type, Any]
    lane_groups: List[Any]   # codegen/lane_groups.LaneGroups of the unrolled loops being emitted, inner last

    # ---- helpers --------------------------------------------------------------------------------------------
    def lanes(self) -> int:
        return self.vec[1]

    def splat(self, v: ir.Value, n: int) -> ir.Value:
        if is_vec(v):
            return v
        if isinstance(v, ir.Constant) and v.constant is not ir.Undefined:
            return splat_const(v, n)
        vty = ir.VectorType(v.type, n)
        if isinstance(v, ir.Constant):
            return ir.Constant(vty, [v.constant] * n)
        undef = ir.Constant(vty, ir.Undefined)
        one = self.b.insert_element(undef, v, ir.Constant(I32, 0))
        return self.b.shuffle_vector(one, undef, int_vector(I32, [0] * n))

    def match(self, a: ir.Value, b: ir.Value):
        if is_vec(a) and not is_vec(b):
            return a, self.splat(b, a.type.count)
        if is_vec(b) and not is_vec(a):
            return self.splat(a, b.type.count), b
        return a, b

    def const(self, dtype: str, value) -> ir.Constant:
        # Integer constants (index arithmetic, most of them) are shared: one object, printed once.
        key = (dtype, value) if type(value) is int else None
        if key is not None:
            hit = _INT_CONSTANTS.get(key)
            if hit is not None:
                return hit
        ty = scalar_type(dtype)
        if is_bool(dtype):
            c = ir.Constant(I1, 1 if value else 0)
        else:
            if dtype in TO_STORAGE:     # a float16/bfloat16 constant holds that type's nearest value
                value = half_value(dtype, value)
            c = ir.Constant(ty, value)
        if key is not None:
            if len(_INT_CONSTANTS) >= _INT_CONSTANTS_MAX:
                _INT_CONSTANTS.clear()
            _INT_CONSTANTS[key] = c
        return c

    # ---- expressions ----------------------------------------------------------------------------------------
    def lane_stride(self, index: Expr) -> Optional[int]:
        """How far ``index`` moves per lane of the vector loop: an int, or None when it is not linear."""
        return linear_coefficient(index, self.vec[0])

    def ev_at_base(self, e: Expr, unmasked: bool = False) -> ir.Value:
        """``e`` as a scalar, the vector loop variable at its first lane (``unmasked``: with every lane on)."""
        saved = self.vec, self.mask
        self.vec = None
        if unmasked:
            self.mask = None
        try:
            return self.ev(e)
        finally:
            self.vec, self.mask = saved

    def ev_at_lane(self, e: Expr, lane: int, unmasked: bool = False) -> ir.Value:
        """``e`` as a scalar for one lane of the vector loop."""
        var, _, base = self.vec
        self.env[var] = self.index_add(base, lane) if lane else base
        try:
            return self.ev_at_base(e, unmasked)
        finally:
            self.env[var] = base

    def uses_lane(self, e: Expr) -> bool:
        """Whether ``e`` depends on the vector loop variable (memoised per vector body: ev asks at every node)."""
        key = id(e)
        hit = self.lane_memo.get(key)
        if hit is None:
            var = self.vec[0]
            hit = self.lane_memo[key] = (e is var) or any(self.uses_lane(c) for c in children(e))
            self.lane_keep.append(e)
        return hit

    def ev(self, e: Expr) -> ir.Value:
        if self.vec is not None and not self.uses_lane(e):
            return self.ev_at_base(e)
        table = self.expr_emitters
        emit = table.get(type(e)) or by_class(table, type(e))
        if emit is None:
            raise CompileError(f"codegen: cannot generate code for {type(e).__name__} ({e})")
        return emit(self, e)

    def ev_const(self, e: Const) -> ir.Value:
        return self.const(e.dtype, e.value)

    def ev_var(self, e: Var) -> ir.Value:
        if self.vec is not None and e is self.vec[0]:
            return self.vec_index
        try:
            return self.env[e]
        except KeyError:
            raise CompileError(f"codegen: variable {e.name!r} is used outside its loop") from None

    def ev_not(self, e: Not) -> ir.Value:
        a = self.ev(e.a)
        return self.b.xor(a, self.splat(ir.Constant(I1, 1), a.type.count) if is_vec(a) else ir.Constant(I1, 1))

    def select(self, e: Select) -> ir.Value:
        if self.unsafe(e.t) or self.unsafe(e.f):
            return self.guarded_select(e)
        c, t, f = self.ev(e.cond), self.ev(e.t), self.ev(e.f)
        t, f = self.match(t, f)
        if is_vec(c) and not is_vec(t):
            t, f = self.splat(t, c.type.count), self.splat(f, c.type.count)
        return self.b.select(c, t, f)

    def ev_cast(self, e: Cast) -> ir.Value:
        v = e.value
        if (e.dtype == "int32" and isinstance(v, Call) and v.name == "round_even" and v.dtype == "float32"
                and getattr(getattr(self.ctx, "target", None), "arch", None) == "aarch64"):
            return self.nearest_int32(self.ev(v.args[0]))
        return self.cast(self.ev(e.value), e.value.dtype, e.dtype)

    def nearest_int32(self, x: ir.Value) -> ir.Value:
        """``int32(round_even(x))`` of float32 on AArch64: fcvtns, which converts rounding to nearest with ties to
        even itself, where frintn + fcvtzs were two instructions (every int8 requantize ends so). Both saturate and
        give 0 for NaN. The intrinsic takes 4 lanes at most: wider vectors go by quarters."""
        B = self.b

        def fcvtns(arg: ir.Type, ret: ir.Type, suffix: str) -> ir.Function:
            name = "llvm.aarch64.neon.fcvtns." + suffix
            return B.module.globals.get(name) or ir.Function(B.module, ir.FunctionType(ret, [arg]), name)

        if not is_vec(x):
            return B.call(fcvtns(F32, I32, "i32.f32"), [x])
        fn = fcvtns(ir.VectorType(F32, 4), ir.VectorType(I32, 4), "v4i32.v4f32")
        n = x.type.count
        if n % 4:
            return B.fptosi(B.call(self.intrinsic_of("llvm.roundeven", x.type, 1), [x]), ir.VectorType(I32, n))
        undef = ir.Constant(x.type, ir.Undefined)
        parts = [B.call(fn, [B.shuffle_vector(x, undef, ir.Constant(ir.VectorType(I32, 4), list(range(k, k + 4))))])
                 for k in range(0, n, 4)]
        while len(parts) > 1:
            w = parts[0].type.count
            joined = ir.Constant(ir.VectorType(I32, 2 * w), list(range(2 * w)))
            parts = [B.shuffle_vector(parts[k], parts[k + 1], joined) for k in range(0, len(parts), 2)]
        return parts[0]

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
            elif coef is not None and coef != 0:
                v = self.strided_load(buf, e.index, coef)
            else:
                v = self.gather(buf, self.ev(e.index), check_contiguous=coef is None)
            if buf.dtype == "bool":
                v = self.b.icmp_unsigned("!=", v, ir.Constant(v.type, [0] * n))
            return self.from_half(v, buf.dtype)
        def pointer(ld: Load) -> ir.Value:
            return self.b.gep(self.bufs[buf], [self.ev(ld.index)], inbounds=True, source_etype=ety)

        for groups in reversed(self.lane_groups):   # codegen/lane_groups.py
            v = groups.load(self, e, pointer, ety, align)
            if v is not None:
                return v
        v = self.b.load(pointer(e), typ=ety, align=align)
        if buf.dtype == "bool":
            v = self.b.icmp_unsigned("!=", v, ir.Constant(I8, 0))
        return self.from_half(v, buf.dtype)

    def from_half(self, v: ir.Value, dtype: str) -> ir.Value:
        """A loaded float16/bfloat16 bit pattern as the float32 it is computed with; other values unchanged."""
        return FROM_STORAGE[dtype](self.b, v) if dtype in FROM_STORAGE and not native_half(dtype) else v

    # ---- lazily evaluated if_then_else ------------------------------------------------------------------------
    def unsafe(self, e: Expr) -> bool:
        """Whether evaluating ``e`` where its condition is false could fault: a load not provably in bounds
        (padding reads) or an integer division by something that may be zero."""
        key = id(e)
        hit = self.unsafe_memo.get(key)
        if hit is None:
            if isinstance(e, Load):
                idx = e.index
                clamped = {v: Binary("min", v, last, "int32") for v, last in self.clamps.items() if uses(idx, v)}
                if clamped:   # v == min(v, last): exposes the tail clamp to the bound
                    idx = substitute(idx, clamped)
                b = Simplifier(self.ranges).bound(idx)
                here = b is None or b[0] < 0 or b[1] >= e.buffer.size
            elif isinstance(e, Binary) and e.op in ("floordiv", "floormod", "div") and not is_float(e.dtype):
                b = Simplifier(self.ranges).bound(e.b)
                here = b is None or b[0] <= 0 <= b[1]
            else:
                here = False
            hit = self.unsafe_memo[key] = here or any(self.unsafe(c) for c in children(e))
            self.unsafe_keep.append(e)
        return hit

    def guarded_select(self, e: Select) -> ir.Value:
        c = self.ev(e.cond)
        if is_vec(c):
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
            if not is_vec(t):
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
            idx = self.ev_at_base(e.index, unmasked=True)
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
                ptr = B.gep(self.bufs[buf], [self.ev_at_base(e.index, unmasked=True)], inbounds=True, source_etype=ety)
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
                idx = self.ev_at_lane(e.index, lane, unmasked=True)
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
            v = self.join(end_bb, incoming, vty)
        if buf.dtype == "bool":
            z = ir.Constant(v.type, [0] * n) if is_vec(v) else ir.Constant(I8, 0)
            v = B.icmp_unsigned("!=", v, z)
        return self.from_half(v, buf.dtype)

    def strided_load(self, buf: Buffer, index: Expr, stride: int) -> ir.Value:
        """The lanes of ``index``, which moves by the constant ``stride`` (not 0 or 1) per lane. A small stride
        loads the span from the lowest to the highest lane's element ((n-1)*|stride|+1 elements, none the lanes
        do not cover at either end) as one vector and shuffles the lanes out; a large one is one llvm.masked.gather
        with every lane on (vgather on AVX2, scalar loads where the target has no gathers)."""
        B = self.b
        ety = mem_type(buf.dtype)
        align = elem_bytes(buf.dtype)
        n = self.lanes()
        base = self.ev_at_base(index)
        if 2 <= abs(stride) <= _SHUFFLE_MAX_STRIDE:
            span = (n - 1) * abs(stride) + 1
            lo = base if stride > 0 else B.add(base, ir.Constant(base.type, (n - 1) * stride), flags=("nsw",))
            ptr = B.gep(self.bufs[buf], [lo], inbounds=True, source_etype=ety)
            wide = B.load(ptr, typ=ir.VectorType(ety, span), align=align)
            picks = [lane * stride if stride > 0 else span - 1 + lane * stride for lane in range(n)]
            return B.shuffle_vector(wide, ir.Constant(ir.VectorType(ety, span), ir.Undefined),
                                    ir.Constant(ir.VectorType(I32, n), picks))
        if buf.scope == "local" and n <= _LOCAL_LANES_MAX:
            return self.local_lanes(buf, base, stride)
        offsets = ir.Constant(ir.VectorType(base.type, n), [lane * stride for lane in range(n)])
        idxv = B.add(self.splat(base, n), offsets, flags=("nsw",))
        return self.masked_gather(buf, idxv, ir.Constant(ir.VectorType(I1, n), [1] * n))

    # ---------------------------------------------------------------- strided lanes of a local block
    def local_lanes(self, buf: Buffer, base: ir.Value, stride: int) -> ir.Value:
        """The lanes of a large constant stride in a local (stack) buffer as scalar loads at ``base + lane *
        stride``. Why: a register block read back transposed (conv2d_pixels' pixels x channels block written to
        NCHW rows) was a llvm.masked.gather from its stack copy, which kept the block in memory and cost a vgather
        and its address vector per row; scalar loads at constant offsets let LLVM keep the block in registers
        (SROA) and move the lanes with shuffles."""
        B = self.b
        ety = mem_type(buf.dtype)
        align = elem_bytes(buf.dtype)
        n = self.lanes()
        column = self.block_column(buf, base, stride, n)
        if column is not None:
            return column
        v = ir.Constant(ir.VectorType(ety, n), ir.Undefined)
        for lane in range(n):
            idx = base if lane == 0 else self.index_add(base, lane * stride)
            x = B.load(B.gep(self.bufs[buf], [idx], inbounds=True, source_etype=ety), typ=ety, align=align)
            v = B.insert_element(v, x, ir.Constant(I32, lane))
        return v

    def block_column(self, buf: Buffer, base: ir.Value, stride: int, n: int) -> Optional[ir.Value]:
        """Column ``base % stride`` of rows ``base // stride ..`` + n of a local block whose every store wrote
        whole rows of ``stride`` elements (codegen/block_transpose.py), from the transposed block this basic block
        already built when nothing since could have written the buffer; None where that does not apply."""
        if not (isinstance(base, ir.Constant) and isinstance(base.constant, int)
                and isinstance(self.bufs[buf], ir.AllocaInstr)     # (a register block: not shared scratch)
                and self.row_stores.get(buf) == stride and block_transpose.usable(n, stride)):
            return None
        r0, c = divmod(base.constant, stride)
        if (r0 + n) * stride > buf.size:
            return None
        B = self.b
        key = (buf, n, r0)
        hit = self.column_memo.get(key)
        if hit is not None and hit[0] is B.block and not _may_write(B.block.instructions[hit[1]:], self.bufs[buf]):
            return hit[2][c]
        ety = mem_type(buf.dtype)
        rows = [B.load(B.gep(self.bufs[buf], [ir.Constant(I32, (r0 + r) * stride)], inbounds=True, source_etype=ety),
                       typ=ir.VectorType(ety, stride), align=elem_bytes(buf.dtype)) for r in range(n)]
        cols = block_transpose.columns(B, rows, stride)
        self.column_memo[key] = (B.block, len(B.block.instructions), cols)
        return cols[c]

    def masked_gather(self, buf: Buffer, idxv: ir.Value, mask: ir.Value) -> ir.Value:
        """``llvm.masked.gather`` of the elements of ``buf`` at index vector ``idxv`` (lanes off in ``mask`` read
        no memory and give zero)."""
        B = self.b
        ety = mem_type(buf.dtype)
        n = idxv.type.count
        vty = ir.VectorType(ety, n)
        ptrs = _vector_gep(B, self.bufs[buf], idxv, ety)
        name = "llvm.masked.gather.v%d%s.v%dp0" % (n, _intrinsic_suffix(ety), n)
        module = B.module
        fn = module.globals.get(name)
        if fn is None:
            fn = ir.Function(module, ir.FunctionType(vty, [ir.VectorType(PTR, n), I32, ir.VectorType(I1, n), vty]),
                             name)
        return B.call(fn, [ptrs, ir.Constant(I32, elem_bytes(buf.dtype)), mask, ir.Constant(vty, [0] * n)])

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
            expect = B.add(self.splat(first, n), int_vector(I32, range(n)))
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
        return self.join(end_bb, incoming, vty)

    def join(self, end_bb: ir.Block, incoming: List[tuple], ty: ir.Type) -> ir.Value:
        """Branch to ``end_bb`` and merge the (value, block) pairs of the paths that reach it in one phi."""
        B = self.b
        B.branch(end_bb)
        B.position_at_end(end_bb)
        phi = B.phi(ty)
        for val, bb in incoming:
            phi.add_incoming(val, bb)
        return phi

    def binary(self, e: Binary) -> ir.Value:
        fused = int8dot.fused_operands(e)   # acc + dot4(a, b): one dot-product instruction (codegen/int8dot.py)
        if fused is not None:
            return int8dot.emit(self, *fused)
        fma = self.half_fma(e)
        if fma is not None:
            return fma
        a, b = self.match(self.ev(e.a), self.ev(e.b))
        op, dt = e.op, e.a.dtype
        B = self.b
        if op in _BOOL_OPS:
            return getattr(B, _BOOL_OPS[op])(a, b)
        if is_float(dt):
            return self.float_binary(e, a, b)
        if op in _INT_OPS:
            flags = ("nsw",) if dt in _NSW_DTYPES else ()
            return self.int_cse().emit(B, op, a, b, flags, lambda: getattr(B, _INT_OPS[op])(a, b, flags=flags))
        if op in _MINMAX:
            cmp = (B.icmp_unsigned if is_unsigned(dt) else B.icmp_signed)(_MINMAX[op], a, b)
            return B.select(cmp, a, b)
        if op in _BIT_OPS:
            return getattr(B, _BIT_OPS[op])(a, b)
        if op == "shr":
            return (B.lshr if is_unsigned(dt) else B.ashr)(a, b)
        if op in _DIV_OPS:
            return self.int_division(e, a, b)
        raise CompileError(f"codegen: integer operator {op!r} is not supported")

    def half_fma(self, e: Binary) -> Optional[ir.Value]:
        """``acc + x * y`` in native half as one llvm.fma, else None. LLVM contracts fmul+fadd into the same fmla
        (the flags allow it), but for a contracted one AArch64 broadcasts a loaded scalar operand with ld1r, which
        takes no offset: an address add per broadcast, one per pixel and reduction step in a conv's register
        block; for the intrinsic it loads ldr h (with the offset) and uses the indexed fmla .8h."""
        if e.op != "add" or not native_half(e.dtype):
            return None
        for mul, acc in ((e.b, e.a), (e.a, e.b)):
            if isinstance(mul, Binary) and mul.op == "mul" and native_half(mul.dtype):
                ops = [self.ev(mul.a), self.ev(mul.b), self.ev(acc)]
                lanes = max((v.type.count for v in ops if is_vec(v)), default=0)
                if lanes:
                    ops = [self.splat(v, lanes) for v in ops]
                return self.b.call(self.intrinsic_of("llvm.fma", ops[0].type, 3), ops)
        return None

    def float_binary(self, e: Binary, a: ir.Value, b: ir.Value) -> ir.Value:
        B = self.b
        fm = self.fm
        # A reduction's order is unspecified (see FunctionEmitter.store): its combine may be reassociated.
        reduction = e is self.reassoc_node and "fast" not in fm
        if reduction:
            fm = fm + ("reassoc",)
        if e.op in _FLOAT_OPS:
            return getattr(B, _FLOAT_OPS[e.op])(a, b, flags=fm)
        if e.op in _MINMAX:
            if reduction:
                # a max/min reduction: without these flags LLVM will not keep per-lane running maxima
                fm = fm + ("nnan", "nsz")
            elif self.native_minmax_num(e):
                return B.call(self.intrinsic_of(_MINMAX_NUM[e.op], a.type), [a, b])
            cmp = B.fcmp_ordered(_MINMAX[e.op], a, b, flags=fm)
            return B.select(cmp, a, b, flags=fm)
        raise CompileError(f"codegen: float operator {e.op!r} is not supported")

    def native_minmax_num(self, e: Binary) -> bool:
        """Whether float ``max(a, b)``/``min(a, b)`` may be llvm.maxnum/minnum here: one instruction (AArch64 fmaxnm,
        fminnm) where the select is a compare and a bit select. They agree with ``a > b ? a : b`` whenever ``b`` is
        not NaN (a NaN ``a`` gives ``b`` in both), so only for a ``b`` that cannot be NaN: a constant, an integer
        converted, or their sum or difference (a requantize's clamp, ``-128.0 - float(zero_point)``; with constant
        bounds LLVM already selects fmaxnm). The sign of a zero result may differ (min(-0, +0))."""
        # (a GPU kernel's math target has no arch: it keeps the select)
        arch = getattr(getattr(self.ctx, "target", None), "arch", None)
        return arch == "aarch64" and e.dtype in ("float32", "float64") and _never_nan(e.b)

    def intrinsic_of(self, name: str, ty: ir.Type, nargs: int = 2) -> ir.Function:
        """The overloaded LLVM intrinsic ``name`` of ``nargs`` operands of type ``ty`` (scalar or vector)."""
        suffix = ("v%d%s" % (ty.count, _intrinsic_suffix(ty.element)) if isinstance(ty, ir.VectorType)
                  else _intrinsic_suffix(ty))
        module = self.b.module
        full = "%s.%s" % (name, suffix)
        return module.globals.get(full) or ir.Function(module, ir.FunctionType(ty, [ty] * nargs), full)

    def int_division(self, e: Binary, a: ir.Value, b: ir.Value) -> ir.Value:
        """floordiv/floormod (and div, which floors too) of integers. 64-bit division on armv7 becomes a call of
        the module's own __aeabi_ldivmod (codegen/runtime.py), so it is emitted as plain sdiv/srem here."""
        op, dt, B = e.op, e.a.dtype, self.b
        if is_unsigned(dt):
            return self.unsigned_division(op, a, b)
        if isinstance(e.b, Const) and e.b.value > 0 and dt in _NSW_DTYPES:
            lo = Simplifier(self.ranges).bound(e.a)
            if lo is not None and lo[0] >= 0:   # index math: floor == truncation, unsigned is cheapest
                return self.unsigned_division(op, a, b)
        if self.mask is not None and not isinstance(e.b, Const):
            # lanes the mask switches off may divide by zero (which traps): divide them by one instead
            m = self.mask
            if not is_vec(b):   # one divisor for all lanes: it matters if any lane is on
                m = B.icmp_unsigned("!=", B.bitcast(m, ir.IntType(m.type.count)),
                                    ir.Constant(ir.IntType(m.type.count), 0))
            b = B.select(m, b, const_of(b, 1))
        q = B.sdiv(a, b)
        r = B.srem(a, b)
        zero = const_of(a, 0)
        adjust = B.and_(B.icmp_signed("!=", r, zero), B.icmp_signed("<", B.xor(r, b), zero))
        if op == "floormod":
            return B.add(r, B.select(adjust, b, zero))
        return B.sub(q, B.zext(adjust, a.type))

    # ---- integer index arithmetic once per block (codegen/intcse.py)
    def int_cse(self) -> IntCSE:
        cse = self.__dict__.get("_int_cse")
        if cse is None:
            cse = self.__dict__["_int_cse"] = IntCSE()
        return cse

    def index_add(self, base: ir.Value, k: int) -> ir.Value:
        """base + k for an unrolled iteration or a lane (i32, nsw), folded when base is a constant."""
        B, c = self.b, ir.Constant(I32, k)
        return self.int_cse().emit(B, "add", base, c, ("nsw",), lambda: B.add(base, c, flags=("nsw",)))

    def unsigned_division(self, op: str, a: ir.Value, b: ir.Value) -> ir.Value:
        B, opcode = self.b, ("urem" if op == "floormod" else "udiv")
        return self.int_cse().emit(B, opcode, a, b, (), lambda: getattr(B, opcode)(a, b))

    def compare(self, e: Compare) -> ir.Value:
        a, b = self.match(self.ev(e.a), self.ev(e.b))
        dt = e.a.dtype
        sym = _CMP[e.op]
        if is_float(dt):
            if e.op == "ne":
                return self.b.fcmp_unordered("!=", a, b)
            return self.b.fcmp_ordered(sym, a, b)
        return (self.b.icmp_unsigned if is_unsigned(dt) else self.b.icmp_signed)(sym, a, b)

    def cast(self, v: ir.Value, src: str, dst: str) -> ir.Value:
        if src == dst:
            return v
        B = self.b
        ty = scalar_type(dst)
        vty = like(v, ty)
        if dst == "bool":
            zero = const_like(v, scalar_type(src), 0)
            return B.fcmp_unordered("!=", v, zero) if is_float(src) else B.icmp_unsigned("!=", v, zero)
        if is_float(dst):
            if not is_float(src):
                v = (B.uitofp if is_unsigned(src) else B.sitofp)(v, vty)
            elif src == "float64" and dst in TO_STORAGE and not native_half(dst):
                v = f64_to_f32_odd(B, v)    # so that the rounding to the half type below is the only one
            elif scalar_type(src) != ty:
                wider = _float_bits(ty) > _float_bits(v.type.element if is_vec(v) else v.type)
                v = B.fpext(v, vty) if wider else B.fptrunc(v, vty)
            if dst in TO_STORAGE and not native_half(dst):   # a float32 holding only that type's values
                v = FROM_STORAGE[dst](B, TO_STORAGE[dst](B, v))
            return v
        # integer destination (64-bit conversions on armv7 become calls of the module's __aeabi_* helpers)
        if is_float(src):
            return (B.fptoui if is_unsigned(dst) else B.fptosi)(v, vty)
        sb, db = (v.type.element if is_vec(v) else v.type).width, ty.width
        if sb == db:
            return v
        if sb > db:
            return B.trunc(v, vty)
        return (B.zext if is_unsigned(src) else B.sext)(v, vty)

    def call(self, e: Call) -> ir.Value:
        if dot4_kind(e) is not None:
            return int8dot.emit(self, e)
        if byte_of_parts(e) is not None:
            return int8dot.emit_byte(self, e)
        if is_pair_dot(e):
            return int8dot.emit_pair_dot(self, e)
        if is_quad_sum(e):
            return int8dot.emit_quad_sum(self, e)
        args = [self.ev(a) for a in e.args]
        if len(args) == 2:
            args = list(self.match(args[0], args[1]))
        if e.name == "abs" and not is_float(e.dtype):
            a = args[0]
            if is_unsigned(e.dtype):
                return a
            zero = const_of(a, 0)
            return self.b.select(self.b.icmp_signed("<", a, zero), self.b.sub(zero, a), a)
        half = any(_is_half(a) for a in args)
        if half:    # native half: the math library is written for float32/64, so in float32 and rounded once
            args = [self.b.fpext(a, like(a, F32)) if _is_half(a) else a for a in args]
        fn = self.ctx.math(e.name, args[0].type)
        out = self.b.call(fn, args, fastmath=self.fm if getattr(self.ctx, "fast_math", False) else ())
        if half and str(out.type.element if is_vec(out) else out.type) == "float":
            out = self.b.fptrunc(out, like(out, F16))
        return out


# strides up to this many elements per lane load their span as one vector and shuffle; larger ones gather
_SHUFFLE_MAX_STRIDE = 4
# local buffers: strided vectors up to this many lanes are loaded lane by lane (Emitter.local_lanes)
_LOCAL_LANES_MAX = 16


def _may_write(instructions: List[ir.Instruction], alloca: ir.Value) -> bool:
    """Whether any of ``instructions`` may write the local buffer at ``alloca``: a store through it (or a GEP of
    it, or a pointer of unknown origin) or a call other than an LLVM intrinsic that reads no memory."""
    for ins in instructions:
        if isinstance(ins, ir.StoreInstr):
            ptr = ins.operands[1]
            while ptr is not alloca and isinstance(ptr, ir.GEPInstr):
                ptr = ptr.pointer
            if ptr is alloca or not isinstance(ptr, (ir.Argument, ir.AllocaInstr, ir.GlobalVariable)):
                return True
        elif isinstance(ins, ir.CallInstr):
            name = getattr(ins.callee, "name", "")
            if not name.startswith("llvm.") or name.startswith(("llvm.mem", "llvm.masked.store",
                                                                 "llvm.masked.scatter")):
                return True
    return False


def _is_half(v: ir.Value) -> bool:
    return str(v.type.element if is_vec(v) else v.type) == "half"


def _float_bits(ty: ir.Type) -> int:
    return {"half": 16, "bfloat": 16, "float": 32, "double": 64}[str(ty)]


def _intrinsic_suffix(ty: ir.Type) -> str:
    """The type suffix of an overloaded intrinsic's name: f32, f64, half, i8, i32, ..."""
    if isinstance(ty, ir.IntType):
        return "i%d" % ty.width
    return {"float": "f32", "double": "f64", "half": "f16", "bfloat": "bf16"}[str(ty)]


def _vector_gep(B: ir.IRBuilder, base: ir.Value, idxv: ir.Value, ety: ir.Type) -> ir.Value:
    """``getelementptr inbounds ety, ptr base, <n x iK> idxv``: a vector of n pointers (llvmlite's gep types a
    vector index as one pointer, so the instruction is built here with the right type)."""
    instr = ir.instructions.GEPInstr(B.block, base, [idxv], inbounds=True, name="", source_etype=ety)
    instr.type = ir.VectorType(PTR, idxv.type.count)
    B._insert(instr)
    return instr


# expression node type -> its emitter (a new node type is one row)
_EXPR_EMITTERS = {
    Const: ExprEmitter.ev_const,
    Var: ExprEmitter.ev_var,
    Load: ExprEmitter.load,
    Binary: ExprEmitter.binary,
    Compare: ExprEmitter.compare,
    Not: ExprEmitter.ev_not,
    Select: ExprEmitter.select,
    Cast: ExprEmitter.ev_cast,
    Call: ExprEmitter.call,
    PackedCall: lambda em, e: hostcall.emit_packed_call(em, e),
}
# a class attribute, so that another target's emitter (codegen/ptx.py) can change rows in a copy of its own
ExprEmitter.expr_emitters = _EXPR_EMITTERS
