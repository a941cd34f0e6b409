"""DeviceKernel -> SPIR-V for Vulkan compute (Shader capability, logical addressing, GLCompute), in pure Python.

Why not LLVM: llvmlite's ``spirv64`` target writes OpenCL-flavoured SPIR-V (Kernel capability, Physical64
addressing, CrossWorkgroup pointers), which Vulkan refuses; its logical ``spirv-unknown-vulkan`` target expects an
HLSL front end (shader attributes, resource-handle intrinsics) and writes SPIR-V 1.4 or later. docs/gpu.md "SPIR-V
for Vulkan" records what each gives and what spirv-val says about it.

The ABI (tether.tir.device): buffer parameter k is a StorageBuffer block ``{ T data[]; }`` at descriptor set 0,
binding k; the int32 scalars are the members of one push-constant block (offset 4*k); the thread variables read
the WorkgroupId / LocalInvocationId built-ins; ``block`` is the LocalSize. Shared buffers are Workgroup arrays,
local buffers Function arrays. Loops and ifs are structured control flow (OpLoopMerge / OpSelectionMerge in the
canonical header / body / continue / merge shape).

Values mirror the CPU backend (codegen/expr.py, codegen/mathlib.py): float16 is computed as float32 and rounded
where it is stored or cast to; integer floordiv/floormod floor (built from the truncating OpSDiv/OpSRem); float
min/max select like the CPU's ordered compare (a NaN in ``a`` yields ``b``); log, tanh, sigmoid, erf, asin and acos
are the CPU's formulas, since GLSL.std.450 has no erf and leaves the precision of the others to the driver (measured
on lavapipe: log 2e-3 relative near 1, asin/acos 4e-4). Each tir node type, operator,
cast and math call is one row of a table below.

With ``fp16=True`` (the target promises half arithmetic: GpuTarget.fp16, Vulkan's shaderFloat16) float16 is
computed as a 16-bit float instead: half-typed arithmetic, each operation rounded to half as numpy's float16 does;
math calls on float16 are computed in float32 and rounded to half once (GLSL's 16-bit variants leave precision to
the driver). The Float16 capability is declared only by a kernel that computes in half (or stores it).
"""
from __future__ import annotations

import math
from typing import Callable, Dict, List, Sequence, Set, Tuple

import numpy as np

from tether.codegen.mathlib import _ASIN_Q, _ERFC_F32
from tether.codegen.spirv_words import (BUILTIN, GLSL, OP, SCOPE_WORKGROUP, SEMANTICS_ACQUIRE_RELEASE,
                                        SEMANTICS_WORKGROUP_MEMORY, STORAGE, ModuleBuilder, instruction)
from tether.errors import CompileError
from tether.tir.buffer import Buffer
from tether.tir.device import Barrier, DeviceKernel, tag_dim
from tether.tir.dtype import bits, is_bool, is_float, is_unsigned
from tether.tir.expr import Binary, Call, Cast, Compare, Const, Expr, Load, Not, Select, Var
from tether.tir.int8 import DOT4_KINDS
from tether.tir.stmt import Allocate, For, IfThenElse, Prefetch, SeqStmt, Stmt, Store
from tether.tir.visit import by_class, walk

# scope of a buffer -> the SPIR-V storage class of its memory
_SCOPE_STORAGE = {"param": "StorageBuffer", "shared": "Workgroup", "local": "Function"}
# the device feature (DeviceKernel.needs) and capabilities each narrow or wide dtype takes
_DTYPE_NEEDS = {"int8": "int8", "uint8": "int8", "int16": "int16", "uint16": "int16", "float16": "fp16",
                "int64": "int64", "uint64": "int64", "float64": "fp64"}
_INT_CAP = {8: "Int8", 16: "Int16", 64: "Int64"}
_FLOAT_CAP = {16: "Float16", 64: "Float64"}
_LOOP_UNROLL = 0x1     # LoopControl Unroll


def spirv_module(kernels: List[DeviceKernel], fp16: bool = False) -> bytes:
    """One SPIR-V 1.3 module with one GLCompute entry point per kernel, named ``kernel.name``.

    Adds to each kernel's ``needs`` the optional device features its code uses ("fp16", "int8", "int16",
    "fp64", "int64"). CompileError names a node, dtype or math call that has no translation. ``fp16``: compute
    float16 in half precision (the target promises it), else as float32 like the CPU.
    """
    mb = ModuleBuilder()
    seen: Set[str] = set()
    shared = _ModuleState(mb)
    for k in kernels:
        if k.name in seen:
            raise CompileError(f"spirv: two kernels are named {k.name!r}; entry point names must be unique")
        seen.add(k.name)
        em = _KernelEmitter(shared, k, fp16)
        em.emit()
        k.needs = k.needs | frozenset(em.needs)
    return mb.to_bytes()


class _ModuleState:
    """What the kernels of one module share: the builder and the built-in input variables."""

    def __init__(self, mb: ModuleBuilder) -> None:
        self.mb = mb
        self.builtins: Dict[str, int] = {}

    def builtin(self, name: str) -> int:
        if name not in self.builtins:
            mb = self.mb
            uvec3 = mb.t_vector(mb.t_int(32, False), 3)
            var = mb.variable(mb.t_pointer("Input", uvec3), "Input")
            mb.decorate(var, "BuiltIn", BUILTIN[name])
            mb.name(var, name)
            self.builtins[name] = var
        return self.builtins[name]


class _KernelEmitter:
    """The entry-point function of one kernel: statements and expressions through the tables below."""

    def __init__(self, state: _ModuleState, kernel: DeviceKernel, fp16: bool = False) -> None:
        self.state = state
        self.fp16 = fp16                   # float16 values computed as 16-bit floats, not as float32
        self.mb = state.mb
        self.k = kernel
        self.needs: Set[str] = set()
        self.fn_id = self.mb.new_id()
        self.body: List[int] = []
        self.fn_vars: List[int] = []       # Function-storage OpVariables: the first instructions of the entry block
        self.block = 0                     # label of the block being written
        self.env: Dict[Var, int] = {}
        self.bufs: Dict[Buffer, Tuple[int, str]] = {}     # buffer -> (variable, storage class)
        self.interface: List[int] = []

    # ---- types -------------------------------------------------------------------------------------------
    def use_dtype(self, dtype: str) -> None:
        if dtype == "bfloat16":
            raise CompileError("spirv: bfloat16 has no Vulkan translation yet (use float16 or float32)")
        if dtype in _DTYPE_NEEDS:
            self.needs.add(_DTYPE_NEEDS[dtype])

    def int_type(self, width: int, signed: bool) -> int:
        if width in _INT_CAP:
            self.mb.require(_INT_CAP[width])
        return self.mb.t_int(width, signed)

    def float_type(self, width: int) -> int:
        if width in _FLOAT_CAP:
            self.mb.require(_FLOAT_CAP[width])
        return self.mb.t_float(width)

    def ty(self, dtype: str) -> int:
        """The type a value of ``dtype`` is computed in (float16 as float32, like the CPU, unless fp16)."""
        self.use_dtype(dtype)
        if is_bool(dtype):
            return self.mb.t_bool()
        if dtype == "float16" and not self.fp16:
            return self.float_type(32)
        if is_float(dtype):
            return self.float_type(bits(dtype))
        return self.int_type(bits(dtype), not is_unsigned(dtype))

    def mem_ty(self, dtype: str, storage: str) -> int:
        """The element type of a buffer of ``dtype`` in ``storage`` (bool is a byte in a storage buffer)."""
        self.use_dtype(dtype)
        if storage == "StorageBuffer":
            width = bits(dtype)
            if width == 8:
                self.mb.require("StorageBuffer8BitAccess", "SPV_KHR_8bit_storage")
            elif width == 16:
                self.mb.require("StorageBuffer16BitAccess", "SPV_KHR_16bit_storage")
            if is_bool(dtype):
                self.needs.add("int8")
                return self.int_type(8, False)
        if dtype == "float16":
            return self.float_type(16)
        return self.ty(dtype)

    # ---- instructions ------------------------------------------------------------------------------------
    def op(self, name: str, result_type: int, *operands: int) -> int:
        rid = self.mb.new_id()
        self.body += instruction(OP[name], [result_type, rid, *operands])
        return rid

    def op_void(self, name: str, *operands: int) -> None:
        self.body += instruction(OP[name], list(operands))

    def label(self, lid: int) -> None:
        self.op_void("Label", lid)
        self.block = lid

    def ext(self, name: str, result_type: int, *args: int) -> int:
        return self.op("ExtInst", result_type, self.mb.glsl, GLSL[name], *args)

    def const(self, dtype: str, value) -> int:
        mb = self.mb
        if is_bool(dtype):
            return mb.const_bool(bool(value))
        self.ty(dtype)
        if dtype == "float16":      # the half value it holds (past 65504: infinity, like the CPU's rounding)
            with np.errstate(over="ignore"):
                return mb.const_float(float(np.float16(value)), 16 if self.fp16 else 32)
        if is_float(dtype):
            return mb.const_float(float(value), bits(dtype))
        return mb.const_int(int(value), bits(dtype), not is_unsigned(dtype))

    def u32(self, value: int) -> int:
        return self.mb.const_int(value, 32, False)

    # ---- the function ------------------------------------------------------------------------------------
    def emit(self) -> None:
        mb, k = self.mb, self.k
        self.label(mb.new_id())
        self.bind_params()
        self.bind_scalars()
        self.bind_threads()
        self.stmt(k.body)
        self.op_void("Return")
        void = mb.t_void()
        head = instruction(OP["Function"], [void, self.fn_id, 0, mb.t_function(void)])
        first_label = self.body[:2]
        mb.functions += head + first_label + self.fn_vars + self.body[2:] + instruction(OP["FunctionEnd"], [])
        mb.name(self.fn_id, k.name)
        mb.entry_point(self.fn_id, k.name, self.interface, k.block)

    def bind_params(self) -> None:
        mb = self.mb
        stored = {s.buffer for s in walk(self.k.body) if isinstance(s, Store)}
        for binding, buf in enumerate(self.k.params):
            if buf.scope != "param":
                raise CompileError(f"spirv: kernel parameter {buf.name!r} has scope {buf.scope!r}, expected 'param'")
            elem = self.mem_ty(buf.dtype, "StorageBuffer")
            arr = mb.t_laid_out_runtime_array(elem, max(bits(buf.dtype) // 8, 1))
            block = mb.t_struct([arr])
            mb.decorate(block, "Block")
            mb.member_decorate(block, 0, "Offset", 0)
            if buf not in stored:   # an input: the driver may cache it as read-only memory
                mb.member_decorate(block, 0, "NonWritable")
            var = mb.variable(mb.t_pointer("StorageBuffer", block), "StorageBuffer")
            mb.decorate(var, "DescriptorSet", 0)
            mb.decorate(var, "Binding", binding)
            mb.name(var, buf.name)
            self.bufs[buf] = (var, "StorageBuffer")

    def bind_scalars(self) -> None:
        if not self.k.scalars:
            return
        mb = self.mb
        i32 = self.int_type(32, True)
        block = mb.t_struct([i32] * len(self.k.scalars))
        mb.decorate(block, "Block")
        for i in range(len(self.k.scalars)):
            mb.member_decorate(block, i, "Offset", 4 * i)
        var = mb.variable(mb.t_pointer("PushConstant", block), "PushConstant")
        mb.name(var, self.k.name + ".scalars")
        ptr = mb.t_pointer("PushConstant", i32)
        for i, v in enumerate(self.k.scalars):
            value = self.op("Load", i32, self.op("AccessChain", ptr, var, self.u32(i)))
            self.env[v] = self.convert(value, "int32", v.dtype)

    def bind_threads(self) -> None:
        mb = self.mb
        u32 = mb.t_int(32, False)
        uvec3 = mb.t_vector(u32, 3)
        loaded: Dict[str, int] = {}
        for v, tag in self.k.thread_of.items():
            builtin = "WorkgroupId" if tag.startswith("blockIdx") else "LocalInvocationId"
            if builtin not in loaded:
                var = self.state.builtin(builtin)
                self.interface.append(var)
                loaded[builtin] = self.op("Load", uvec3, var)
            idx = self.op("CompositeExtract", u32, loaded[builtin], tag_dim(tag))
            self.env[v] = self.convert(idx, "uint32", v.dtype)

    # ---- statements --------------------------------------------------------------------------------------
    def stmt(self, s: Stmt) -> None:
        emit = _STMT_EMITTERS.get(type(s))
        if emit is None:
            raise CompileError(f"spirv: cannot generate code for statement {type(s).__name__}")
        emit(self, s)

    def seq(self, s: SeqStmt) -> None:
        for x in s.stmts:
            self.stmt(x)

    def loop(self, s: For) -> None:
        if s.kind == "thread":
            raise CompileError(f"spirv: thread loop over {s.var.name!r} left in a device kernel body (the "
                               "host/device split turns thread loops into thread_of)")
        t = self.ty(s.var.dtype)
        lo = self.ev(s.min)
        hi = self.op("IAdd", t, lo, self.ev(s.extent))
        pre = self.block
        header, body, cont, merge, nxt = (self.mb.new_id() for _ in range(5))
        self.op_void("Branch", header)
        self.label(header)
        i = self.op("Phi", t, lo, pre, nxt, cont)
        less = self.op("ULessThan" if is_unsigned(s.var.dtype) else "SLessThan", self.mb.t_bool(), i, hi)
        # an unrolled (or vectorized) loop asks the driver's compiler to unroll it; others leave it free
        self.op_void("LoopMerge", merge, cont, _LOOP_UNROLL if s.kind in ("unrolled", "vectorized") else 0)
        self.op_void("BranchConditional", less, body, merge)
        self.label(body)
        self.env[s.var] = i
        self.stmt(s.body)
        self.op_void("Branch", cont)
        self.label(cont)
        self.body += instruction(OP["IAdd"], [t, nxt, i, self.const(s.var.dtype, 1)])
        self.op_void("Branch", header)
        self.label(merge)
        del self.env[s.var]

    def if_then_else(self, s: IfThenElse) -> None:
        cond = self.ev(s.cond)
        then_l, merge = self.mb.new_id(), self.mb.new_id()
        else_l = self.mb.new_id() if s.else_case is not None else merge
        self.op_void("SelectionMerge", merge, 0)
        self.op_void("BranchConditional", cond, then_l, else_l)
        self.label(then_l)
        self.stmt(s.then_case)
        self.op_void("Branch", merge)
        if s.else_case is not None:
            self.label(else_l)
            self.stmt(s.else_case)
            self.op_void("Branch", merge)
        self.label(merge)

    def allocate(self, s: Allocate) -> None:
        buf, mb = s.buffer, self.mb
        storage = _SCOPE_STORAGE.get(buf.scope)
        if storage is None or storage == "StorageBuffer":
            raise CompileError(f"spirv: cannot allocate buffer {buf.name!r} of scope {buf.scope!r} in a kernel "
                               "(expected 'shared' or 'local')")
        arr = mb.t_array(self.mem_ty(buf.dtype, storage), buf.size)
        ptr = mb.t_pointer(storage, arr)
        if storage == "Workgroup":
            var = mb.variable(ptr, "Workgroup")
        else:
            var = mb.new_id()
            self.fn_vars += instruction(OP["Variable"], [ptr, var, STORAGE["Function"]])
        mb.name(var, buf.name)
        self.bufs[buf] = (var, storage)
        self.stmt(s.body)
        del self.bufs[buf]

    def element_pointer(self, buf: Buffer, index: Expr) -> int:
        if buf not in self.bufs:
            raise CompileError(f"spirv: buffer {buf.name!r} is used outside its allocation")
        var, storage = self.bufs[buf]
        ptr = self.mb.t_pointer(storage, self.mem_ty(buf.dtype, storage))
        idx = self.ev(index)
        if storage == "StorageBuffer":
            return self.op("AccessChain", ptr, var, self.u32(0), idx)
        return self.op("AccessChain", ptr, var, idx)

    def store(self, s: Store) -> None:
        buf = s.buffer
        value = self.convert(self.ev(s.value), s.value.dtype, buf.dtype)
        ptr = self.element_pointer(buf, s.index)
        _, storage = self.bufs[buf]
        self.op_void("Store", ptr, self.to_memory(value, buf.dtype, storage))

    def barrier(self, s: Barrier) -> None:
        sem = SEMANTICS_ACQUIRE_RELEASE | SEMANTICS_WORKGROUP_MEMORY
        scope = self.u32(SCOPE_WORKGROUP)
        self.op_void("ControlBarrier", scope, scope, self.u32(sem))

    def to_memory(self, v: int, dtype: str, storage: str) -> int:
        """A computed value as the buffer element type (bool -> byte, float16 rounded to half)."""
        if is_bool(dtype) and storage == "StorageBuffer":
            u8 = self.int_type(8, False)
            return self.op("Select", u8, v, self.mb.const_int(1, 8, False), self.mb.const_int(0, 8, False))
        if dtype == "float16" and not self.fp16:
            return self.op("FConvert", self.float_type(16), v)
        return v

    def from_memory(self, v: int, dtype: str, storage: str) -> int:
        if is_bool(dtype) and storage == "StorageBuffer":
            return self.op("INotEqual", self.mb.t_bool(), v, self.mb.const_int(0, 8, False))
        if dtype == "float16" and not self.fp16:
            return self.op("FConvert", self.float_type(32), v)
        return v

    # ---- expressions -------------------------------------------------------------------------------------
    def ev(self, e: Expr) -> int:
        emit = _EXPR_EMITTERS.get(type(e)) or by_class(_EXPR_EMITTERS, type(e))
        if emit is None:
            raise CompileError(f"spirv: cannot generate code for {type(e).__name__} ({e})")
        return emit(self, e)

    def ev_const(self, e: Const) -> int:
        return self.const(e.dtype, e.value)

    def ev_var(self, e: Var) -> int:
        try:
            return self.env[e]
        except KeyError:
            raise CompileError(f"spirv: variable {e.name!r} is used outside its loop (or is not a thread index "
                               "or scalar of the kernel)") from None

    def ev_load(self, e: Load) -> int:
        ptr = self.element_pointer(e.buffer, e.index)
        _, storage = self.bufs[e.buffer]
        v = self.op("Load", self.mem_ty(e.buffer.dtype, storage), ptr)
        return self.from_memory(v, e.buffer.dtype, storage)

    def ev_not(self, e: Not) -> int:
        return self.op("LogicalNot", self.mb.t_bool(), self.ev(e.a))

    def ev_select(self, e: Select) -> int:
        t = self.ty(e.dtype)
        if not (_may_fault(e.t) or _may_fault(e.f)):
            return self.op("Select", t, self.ev(e.cond), self.ev(e.t), self.ev(e.f))
        # an arm that may read out of bounds or divide by zero is evaluated only where it is selected
        cond = self.ev(e.cond)
        then_l, else_l, merge = (self.mb.new_id() for _ in range(3))
        self.op_void("SelectionMerge", merge, 0)
        self.op_void("BranchConditional", cond, then_l, else_l)
        incoming = []
        for lab, arm in ((then_l, e.t), (else_l, e.f)):
            self.label(lab)
            incoming += [self.ev(arm), self.block]
            self.op_void("Branch", merge)
        self.label(merge)
        return self.op("Phi", t, *incoming)

    def ev_cast(self, e: Cast) -> int:
        return self.convert(self.ev(e.value), e.value.dtype, e.dtype)

    def convert(self, v: int, src: str, dst: str) -> int:
        """``v`` (computed as ``src``) as ``dst``, the way codegen/expr.py's cast does it."""
        if src == dst:
            return v
        if is_bool(dst):
            zero = self.const(src, 0)
            return self.op("FUnordNotEqual" if is_float(src) else "INotEqual", self.mb.t_bool(), v, zero)
        if is_bool(src):    # bool is unsigned: true -> 1
            return self.op("Select", self.ty(dst), v, self.const(dst, 1), self.const(dst, 0))
        t = self.ty(dst)
        if is_float(dst):
            if dst == "float16" and is_float(src) and src != "float16" and not self.fp16:
                # one rounding to half (float64 -> half directly: no double rounding through float32)
                return self.op("FConvert", t, self.op("FConvert", self.float_type(16), v))
            if not is_float(src):
                v = self.op("ConvertUToF" if is_unsigned(src) else "ConvertSToF", t, v)
                if dst == "float16" and not self.fp16:
                    v = self.op("FConvert", t, self.op("FConvert", self.float_type(16), v))
            elif self.ty(src) != t:
                v = self.op("FConvert", t, v)
            return v        # (float16 -> float32 without fp16: already computed as float32)
        if is_float(src):       # truncation toward zero
            if is_unsigned(dst):
                return self.op("ConvertFToU", t, v)
            return self.op("ConvertFToS", t, v)
        sb, db = bits(src), bits(dst)
        s_signed, d_signed = not is_unsigned(src), not is_unsigned(dst)
        if sb != db:
            # extension follows the source's signedness; the result type keeps it, then a bitcast renames it
            v = self.op("SConvert" if s_signed else "UConvert", self.int_type(db, s_signed), v)
        if s_signed != d_signed:
            v = self.op("Bitcast", t, v)
        return v

    def ev_binary(self, e: Binary) -> int:
        dt = e.a.dtype
        if e.op in ("and", "or") or is_bool(dt):
            table = _BOOL_BINARY
        elif is_float(dt):
            table = _FLOAT_BINARY
        else:
            table = _INT_BINARY
        emit = table.get(e.op)
        if emit is None:
            raise CompileError(f"spirv: operator {e.op!r} on {dt} has no translation")
        a = self.ev(e.a)
        b = self.ev(e.b)
        return emit(self, dt, self.ty(e.dtype), a, b)

    def ev_compare(self, e: Compare) -> int:
        dt = e.a.dtype
        a, b = self.ev(e.a), self.ev(e.b)
        if is_bool(dt):
            if e.op in ("eq", "ne"):
                return self.op("LogicalEqual" if e.op == "eq" else "LogicalNotEqual", self.mb.t_bool(), a, b)
            a, b = self.convert(a, "bool", "uint32"), self.convert(b, "bool", "uint32")
            dt = "uint32"
        if is_float(dt):
            name = _FLOAT_CMP[e.op]
        else:
            name = _INT_CMP[e.op][0 if is_unsigned(dt) else 1]
        return self.op(name, self.mb.t_bool(), a, b)

    def ev_call(self, e: Call) -> int:
        emit = _CALLS.get(e.name)
        if emit is None:
            raise CompileError(f"spirv: math call {e.name!r} has no Vulkan translation (SPIR-V backend "
                               f"supports {', '.join(sorted(_CALLS))})")
        if is_float(e.dtype) and bits(e.dtype) == 64 and e.name not in _F64_CALLS:
            raise CompileError(f"spirv: math call {e.name!r} on float64 has no Vulkan translation "
                               "(GLSL.std.450 takes 16/32-bit floats there)")
        args = [self.ev(a) for a in e.args]
        if e.dtype == "float16" and self.fp16:
            # computed in float32 and rounded to half once, as the CPU computes float16 math
            wide = [self.op("FConvert", self.float_type(32), a) for a in args]
            return self.op("FConvert", self.ty("float16"), emit(self, "float32", wide))
        return emit(self, e.dtype, args)

    # ---- integer division with floor semantics (codegen/expr.py int_division) ----------------------------
    def int_division(self, op: str, dt: str, t: int, a: int, b: int) -> int:
        if is_unsigned(dt):
            return self.op("UMod" if op == "floormod" else "UDiv", t, a, b)
        q = self.op("SDiv", t, a, b)       # rounds toward zero
        r = self.op("SRem", t, a, b)       # sign of a
        zero = self.const(dt, 0)
        boolean = self.mb.t_bool()
        adjust = self.op("LogicalAnd", boolean, self.op("INotEqual", boolean, r, zero),
                         self.op("SLessThan", boolean, self.op("BitwiseXor", t, r, b), zero))
        if op == "floormod":
            return self.op("IAdd", t, r, self.op("Select", t, adjust, b, zero))
        return self.op("ISub", t, q, self.op("Select", t, adjust, self.const(dt, 1), zero))

    # ---- float helpers -----------------------------------------------------------------------------------
    def fc(self, dt: str, value: float) -> int:
        return self.const("float32" if dt == "float16" else dt, value)

    def fsel(self, cond: int, t: int, a: int, b: int) -> int:
        return self.op("Select", t, cond, a, b)

    def fcmp(self, name: str, a: int, b: int) -> int:
        return self.op(name, self.mb.t_bool(), a, b)

    def horner(self, dt: str, t: int, x: int, coeffs: Sequence[float]) -> int:
        acc = self.fc(dt, coeffs[0])
        for c in coeffs[1:]:
            acc = self.ext("Fma", t, acc, x, self.fc(dt, c))
        return acc

    def copysign(self, dt: str, t: int, mag: int, sgn: int) -> int:
        width = 64 if dt == "float64" else 32
        it = self.int_type(width, False)
        sign = self.mb.const_int(1 << (width - 1), width, False)
        rest = self.mb.const_int((1 << (width - 1)) - 1, width, False)
        m = self.op("BitwiseAnd", it, self.op("Bitcast", it, mag), rest)
        s = self.op("BitwiseAnd", it, self.op("Bitcast", it, sgn), sign)
        return self.op("Bitcast", t, self.op("BitwiseOr", it, m, s))


def _may_fault(e: Expr) -> bool:
    """Whether evaluating ``e`` where it is not selected could read out of bounds or divide by zero."""
    for n in walk(e):
        if isinstance(n, Load):
            return True
        if isinstance(n, Binary) and n.op in ("floordiv", "floormod", "div") and not is_float(n.dtype):
            return True
    return False


# ---- operator tables: (emitter, dtype of operands, result type id, a, b) -> id --------------------------------
def _simple(name: str) -> Callable:
    return lambda em, dt, t, a, b: em.op(name, t, a, b)


def _select_by(cmp_name: str) -> Callable:
    return lambda em, dt, t, a, b: em.op("Select", t, em.op(cmp_name, em.mb.t_bool(), a, b), a, b)


def _int_minmax(less: bool) -> Callable:
    def emit(em, dt, t, a, b):
        name = ("ULessThan" if less else "UGreaterThan") if is_unsigned(dt) else (
            "SLessThan" if less else "SGreaterThan")
        return em.op("Select", t, em.op(name, em.mb.t_bool(), a, b), a, b)
    return emit


def _int_div(op: str) -> Callable:
    return lambda em, dt, t, a, b: em.int_division(op, dt, t, a, b)


_FLOAT_BINARY: Dict[str, Callable] = {
    "add": _simple("FAdd"), "sub": _simple("FSub"), "mul": _simple("FMul"), "div": _simple("FDiv"),
    # the CPU's select(a < b, a, b) (ordered compare): a NaN operand yields b, so FMin/FMax (either NaN) won't do
    "min": _select_by("FOrdLessThan"), "max": _select_by("FOrdGreaterThan"),
}
_INT_BINARY: Dict[str, Callable] = {
    "add": _simple("IAdd"), "sub": _simple("ISub"), "mul": _simple("IMul"),
    "min": _int_minmax(True), "max": _int_minmax(False),
    "bitand": _simple("BitwiseAnd"), "bitor": _simple("BitwiseOr"), "bitxor": _simple("BitwiseXor"),
    "shl": _simple("ShiftLeftLogical"),
    "shr": lambda em, dt, t, a, b: em.op("ShiftRightLogical" if is_unsigned(dt) else "ShiftRightArithmetic",
                                         t, a, b),
    "floordiv": _int_div("floordiv"), "floormod": _int_div("floormod"), "div": _int_div("floordiv"),
}
_BOOL_BINARY: Dict[str, Callable] = {
    "and": _simple("LogicalAnd"), "or": _simple("LogicalOr"), "bitand": _simple("LogicalAnd"),
    "bitor": _simple("LogicalOr"), "bitxor": _simple("LogicalNotEqual"),
    "min": _simple("LogicalAnd"), "max": _simple("LogicalOr"),
}
# float compares are ordered (false on NaN) except "ne", which is true on NaN, like the CPU's fcmp
_FLOAT_CMP = {"lt": "FOrdLessThan", "le": "FOrdLessThanEqual", "gt": "FOrdGreaterThan",
              "ge": "FOrdGreaterThanEqual", "eq": "FOrdEqual", "ne": "FUnordNotEqual"}
# (unsigned, signed)
_INT_CMP = {"lt": ("ULessThan", "SLessThan"), "le": ("ULessThanEqual", "SLessThanEqual"),
            "gt": ("UGreaterThan", "SGreaterThan"), "ge": ("UGreaterThanEqual", "SGreaterThanEqual"),
            "eq": ("IEqual", "IEqual"), "ne": ("INotEqual", "INotEqual")}


# ---- math calls: (emitter, dtype, [argument ids]) -> id --------------------------------------------------------
def _glsl(name: str) -> Callable:
    return lambda em, dt, args: em.ext(name, em.ty(dt), *args)


def _nan_below_zero(em: _KernelEmitter, dt: str, x: int, value: int) -> int:
    """NaN where x < 0 (or x is NaN), else ``value``: what the CPU gives and GLSL leaves undefined."""
    t = em.ty(dt)
    return em.fsel(em.fcmp("FUnordLessThan", x, em.fc(dt, 0.0)), t, em.fc(dt, math.nan), value)


def _sqrt(em, dt, args):
    (x,) = args
    return _nan_below_zero(em, dt, x, em.ext("Sqrt", em.ty(dt), x))


def _rsqrt(em, dt, args):
    return em.op("FDiv", em.ty(dt), em.fc(dt, 1.0), _sqrt(em, dt, args))


def _log(em, dt, args):
    """codegen/mathlib.py's float32 log: exponent from the bits, log1p of the mantissa in [sqrt(2)/2, sqrt(2)) as
    an odd series. Why not GLSL Log: its precision is absolute near 1 (lavapipe's is off by 2e-3 relative at
    log(1.001)), where the CPU's keeps 1e-7 relative."""
    (x,) = args
    t = em.ty(dt)
    i32 = em.int_type(32, True)
    boolean = em.mb.t_bool()

    def ic(v):
        return em.const("int32", v)

    tiny = em.fcmp("FOrdLessThan", x, em.fc(dt, 2.0 ** -126))    # subnormal (or <= 0): rescale first
    xs = em.fsel(tiny, t, em.op("FMul", t, x, em.fc(dt, 2.0 ** 24)), x)
    bias = em.op("Select", i32, tiny, ic(127 + 24), ic(127))
    xb = em.op("Bitcast", i32, xs)
    expo = em.op("ISub", i32, em.op("ShiftRightLogical", i32, em.op("BitwiseAnd", i32, xb, ic(0x7FFFFFFF)), ic(23)),
                 bias)
    m = em.op("Bitcast", t, em.op("BitwiseOr", i32, em.op("BitwiseAnd", i32, xb, ic((1 << 23) - 1)), ic(127 << 23)))
    big = em.op("FOrdGreaterThan", boolean, m, em.fc(dt, math.sqrt(2.0)))
    m = em.fsel(big, t, em.op("FMul", t, m, em.fc(dt, 0.5)), m)
    expo = em.op("IAdd", i32, expo, em.op("Select", i32, big, ic(1), ic(0)))
    ef = em.op("ConvertSToF", t, expo)
    g = em.op("FSub", t, m, em.fc(dt, 1.0))
    sr = em.op("FDiv", t, g, em.op("FAdd", t, em.fc(dt, 2.0), g))
    z = em.op("FMul", t, sr, sr)
    rr = em.op("FMul", t, z, em.horner(dt, t, z, [2.0 / (2 * k + 1) for k in range(5, 0, -1)]))
    log1p = em.op("FSub", t, g, em.op("FMul", t, sr, em.op("FSub", t, g, rr)))
    res = em.op("FAdd", t, em.op("FMul", t, ef, em.fc(dt, 0.693359375)),
                em.op("FAdd", t, log1p, em.op("FMul", t, ef, em.fc(dt, -2.12194440e-4))))
    res = em.fsel(em.fcmp("FOrdEqual", x, em.fc(dt, math.inf)), t, em.fc(dt, math.inf), res)
    res = em.fsel(em.fcmp("FOrdEqual", x, em.fc(dt, 0.0)), t, em.fc(dt, -math.inf), res)
    return _nan_below_zero(em, dt, x, res)


def _abs(em, dt, args):
    (x,) = args
    t = em.ty(dt)
    if is_float(dt):
        return em.ext("FAbs", t, x)
    if is_unsigned(dt):
        return x
    zero = em.const(dt, 0)
    return em.op("Select", t, em.op("SLessThan", em.mb.t_bool(), x, zero), em.op("ISub", t, zero, x), x)


def _tanh(em, dt, args):
    """codegen/mathlib.py's float32 tanh: an odd polynomial below 0.625, 1 - 2/(exp(2|x|)+1) above."""
    (x,) = args
    t = em.ty(dt)
    ax = em.ext("FAbs", t, x)
    z = em.op("FMul", t, x, x)
    p = em.horner(dt, t, z, [-5.70498872745e-3, 2.06390887954e-2, -5.37397155531e-2, 1.33314422036e-1,
                             -3.33332819422e-1])
    small = em.op("FAdd", t, ax, em.op("FMul", t, em.op("FMul", t, ax, z), p))
    ex = em.ext("Exp", t, em.op("FAdd", t, ax, ax))
    large = em.op("FSub", t, em.fc(dt, 1.0),
                  em.op("FDiv", t, em.fc(dt, 2.0), em.op("FAdd", t, ex, em.fc(dt, 1.0))))
    return em.copysign(dt, t, em.fsel(em.fcmp("FOrdLessThan", ax, em.fc(dt, 0.625)), t, small, large), x)


def _sigmoid(em, dt, args):
    """codegen/mathlib.py's sigmoid: exp(-|x|) never overflows; e/(1+e) keeps tiny results for x << 0."""
    (x,) = args
    t = em.ty(dt)
    ex = em.ext("Exp", t, em.op("FSub", t, em.fc(dt, 0.0), em.ext("FAbs", t, x)))
    inv = em.op("FDiv", t, em.fc(dt, 1.0), em.op("FAdd", t, em.fc(dt, 1.0), ex))
    return em.fsel(em.fcmp("FOrdLessThan", x, em.fc(dt, 0.0)), t, em.op("FMul", t, ex, inv), inv)


def _erf(em, dt, args):
    """codegen/mathlib.py's float32 erf: Taylor series below 1, erfc(x)*exp(x*x) fitted on [1, 4], 1 past 4."""
    (x,) = args
    t = em.ty(dt)
    ax = em.ext("FAbs", t, x)
    z = em.op("FMul", t, ax, ax)
    series = [(-1) ** n / (math.factorial(n) * (2 * n + 1)) for n in range(10, -1, -1)]
    small = em.op("FMul", t, em.op("FMul", t, ax, em.fc(dt, 2.0 / math.sqrt(math.pi))), em.horner(dt, t, z, series))
    mid, inv, coeffs = _ERFC_F32
    u = em.op("FMul", t, em.op("FSub", t, em.op("FDiv", t, em.fc(dt, 1.0), ax), em.fc(dt, mid)), em.fc(dt, inv))
    erfc = em.op("FMul", t, em.ext("Exp", t, em.op("FSub", t, em.fc(dt, 0.0), z)), em.horner(dt, t, u, coeffs))
    large = em.op("FSub", t, em.fc(dt, 1.0), erfc)
    res = em.fsel(em.fcmp("FOrdLessThan", ax, em.fc(dt, 1.0)), t, small, large)
    res = em.fsel(em.fcmp("FOrdGreaterThanEqual", ax, em.fc(dt, 4.0)), t, em.fc(dt, 1.0), res)
    return em.copysign(dt, t, res, x)


def _pow(em, dt, args):
    """GLSL Pow on |x| (defined there for x > 0 only) with the CPU's special cases around it: a negative base
    with an odd integer exponent flips the sign, with a non-integer one is NaN; x**0 = 1**y = (-1)**inf = 1."""
    x, y = args
    t = em.ty(dt)
    boolean = em.mb.t_bool()
    ax = em.ext("FAbs", t, x)
    base = em.ext("Pow", t, ax, y)
    # 0 ** y: GLSL leaves it undefined; exp(y * log(0)) on the CPU: inf for y < 0, 0 for y > 0
    zero_base = em.fsel(em.fcmp("FOrdLessThan", y, em.fc(dt, 0.0)), t, em.fc(dt, math.inf), em.fc(dt, 0.0))
    base = em.fsel(em.fcmp("FOrdEqual", ax, em.fc(dt, 0.0)), t, zero_base, base)
    fy = em.ext("Floor", t, y)
    yint = em.fcmp("FOrdEqual", fy, y)
    half = em.op("FMul", t, y, em.fc(dt, 0.5))
    yodd = em.op("LogicalAnd", boolean, yint, em.fcmp("FUnordNotEqual", em.ext("Floor", t, half), half))
    negative_sign = em.op("SLessThan", boolean, em.op("Bitcast", em.int_type(32, True), x), em.const("int32", 0))
    res = em.fsel(em.op("LogicalAnd", boolean, negative_sign, yodd), t, em.op("FSub", t, em.fc(dt, 0.0), base), base)
    neg_frac = em.op("LogicalAnd", boolean, em.fcmp("FOrdLessThan", x, em.fc(dt, 0.0)),
                     em.op("LogicalNot", boolean, yint))
    res = em.fsel(neg_frac, t, em.fc(dt, math.nan), res)
    res = em.fsel(em.fcmp("FOrdEqual", y, em.fc(dt, 0.0)), t, em.fc(dt, 1.0), res)
    one_inf = em.op("LogicalAnd", boolean, em.fcmp("FOrdEqual", ax, em.fc(dt, 1.0)),
                    em.fcmp("FOrdEqual", em.ext("FAbs", t, y), em.fc(dt, math.inf)))
    res = em.fsel(one_inf, t, em.fc(dt, 1.0), res)
    return em.fsel(em.fcmp("FOrdEqual", x, em.fc(dt, 1.0)), t, em.fc(dt, 1.0), res)


def _asin_core(em, dt, t, v):
    z = em.op("FMul", t, v, v)
    return em.op("FAdd", t, v, em.op("FMul", t, em.op("FMul", t, v, z), em.horner(dt, t, z, _ASIN_Q)))


def _asin_acos(em, dt, x):
    """(asin |x| near 0, 2 asin(sqrt((1 - |x|) / 2)), |x| <= 1/2): codegen/mathlib.py's reduction. Why not
    GLSL Asin/Acos: lavapipe's are off by 4e-4 relative."""
    t = em.ty(dt)
    ax = em.ext("FAbs", t, x)
    w = em.op("FMul", t, em.op("FSub", t, em.fc(dt, 1.0), ax), em.fc(dt, 0.5))     # exact for |x| >= 1/2
    half_angle = em.op("FMul", t, em.fc(dt, 2.0), _asin_core(em, dt, t, _sqrt(em, dt, [w])))
    near = em.fcmp("FUnordLessThanEqual", ax, em.fc(dt, 0.5))
    return _asin_core(em, dt, t, ax), half_angle, near


def _asin(em, dt, args):
    (x,) = args
    t = em.ty(dt)
    small, half_angle, near = _asin_acos(em, dt, x)
    large = em.op("FSub", t, em.fc(dt, math.pi / 2), half_angle)
    return em.copysign(dt, t, em.fsel(near, t, small, large), x)


def _acos(em, dt, args):
    (x,) = args
    t = em.ty(dt)
    small, half_angle, near = _asin_acos(em, dt, x)
    large = em.fsel(em.fcmp("FOrdLessThan", x, em.fc(dt, 0.0)), t,
                    em.op("FSub", t, em.fc(dt, math.pi), half_angle), half_angle)
    return em.fsel(near, t, em.op("FSub", t, em.fc(dt, math.pi / 2), em.copysign(dt, t, small, x)), large)


def _dot4(kind: str) -> Callable:
    """tir's dot4 (tether/tir/int8.py): the sum of the four byte products of two int32s, the bytes read as
    ``kind`` ("u8s8": a unsigned, b signed). Portable int32 shifts and multiplies: exact, and valid on every
    device (no integer dot-product extension needed)."""
    def emit(em, dt, args):
        i32 = em.int_type(32, True)

        def byte(x, t, signed):
            if signed:      # move byte t to the top, shift it back down with its sign
                top = em.op("ShiftLeftLogical", i32, x, em.const("int32", 24 - 8 * t))
                return em.op("ShiftRightArithmetic", i32, top, em.const("int32", 24))
            return em.op("BitwiseAnd", i32, em.op("ShiftRightLogical", i32, x, em.const("int32", 8 * t)),
                         em.const("int32", 0xFF))

        a, b = args
        total = None
        for t in range(4):
            p = em.op("IMul", i32, byte(a, t, kind[0] == "s"), byte(b, t, kind[2] == "s"))
            total = p if total is None else em.op("IAdd", i32, total, p)
        return total
    return emit


_CALLS: Dict[str, Callable] = {
    "exp": _glsl("Exp"), "log": _log, "sqrt": _sqrt, "rsqrt": _rsqrt, "tanh": _tanh, "sigmoid": _sigmoid,
    "erf": _erf, "pow": _pow, "floor": _glsl("Floor"), "ceil": _glsl("Ceil"), "round_even": _glsl("RoundEven"),
    "abs": _abs, "fabs": _abs, "sin": _glsl("Sin"), "cos": _glsl("Cos"), "tan": _glsl("Tan"),
    "asin": _asin, "acos": _acos, "atan": _glsl("Atan"),
    **{"dot4_" + kind: _dot4(kind) for kind in DOT4_KINDS},
}
# GLSL.std.450 instructions that take 64-bit floats (the rest are 16/32-bit only)
_F64_CALLS = frozenset({"sqrt", "rsqrt", "floor", "ceil", "round_even", "abs", "fabs"})

_EXPR_EMITTERS: Dict[type, Callable] = {
    Const: _KernelEmitter.ev_const, Var: _KernelEmitter.ev_var, Load: _KernelEmitter.ev_load,
    Binary: _KernelEmitter.ev_binary, Compare: _KernelEmitter.ev_compare, Not: _KernelEmitter.ev_not,
    Select: _KernelEmitter.ev_select, Cast: _KernelEmitter.ev_cast, Call: _KernelEmitter.ev_call,
}
_STMT_EMITTERS: Dict[type, Callable] = {
    SeqStmt: _KernelEmitter.seq, For: _KernelEmitter.loop, IfThenElse: _KernelEmitter.if_then_else,
    Allocate: _KernelEmitter.allocate, Store: _KernelEmitter.store, Barrier: _KernelEmitter.barrier,
    Prefetch: lambda emitter, s: None,    # (a CPU cache hint)
}
