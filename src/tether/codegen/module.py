"""The LLVM module around generated kernels: packed wrappers, metadata, memcpy/memset and the launcher slot.

The front half of the compiler (codegen/llvm.py) writes one ``<name>__impl`` function per PrimFunc that takes raw
data pointers. This module wraps each in the packed ABI of docs/abi.md, which validates every argument once at
the call boundary, so the generated loops never need bounds checks.
"""
from __future__ import annotations

import json
import logging
import re
from typing import Any, Dict, List, Optional, Sequence, Tuple

from llvmlite import ir

from tether.codegen import mathlib, threadpool
from tether.errors import CompileError
from tether.target import Target, as_target

log = logging.getLogger(__name__)

ABI_VERSION = 1

# abi.md type codes and return-code kinds.
TETHER_DLTENSOR = 3
ERR_NUM_ARGS, ERR_TYPE_CODE, ERR_NDIM, ERR_DTYPE, ERR_SHAPE, ERR_STRIDES, ERR_NULL_DATA, ERR_PARALLEL = range(1, 9)

# DLPack type codes: (code, bits) per tether dtype name.
DTYPES: Dict[str, Tuple[int, int]] = {
    "int8": (0, 8), "int16": (0, 16), "int32": (0, 32), "int64": (0, 64),
    "uint8": (1, 8), "uint16": (1, 16), "uint32": (1, 32), "uint64": (1, 64),
    "float16": (2, 16), "float32": (2, 32), "float64": (2, 64),
    "bool": (6, 8),
}

# The native thread pool (codegen/threadpool.py) is exported too: the runtime installs one module's
# tether_pool_launch as every module's launcher (docs/parallel.md "The native pool").
EXPORTED_RUNTIME_SYMBOLS = ("tether_set_parallel_launcher", "__tether_metadata") + threadpool.EXPORTED_SYMBOLS
MEMORY_FUNCTIONS = ("memcpy", "memmove", "memset")
# What LLVM calls on armv7 for integer division (without hardware divide) and 64-bit int <-> float conversions.
ARM_RUNTIME_FUNCTIONS = ("__aeabi_uidiv", "__aeabi_idiv", "__aeabi_uidivmod", "__aeabi_idivmod", "__aeabi_uldivmod",
                         "__aeabi_ldivmod", "__aeabi_l2d", "__aeabi_ul2d", "__aeabi_l2f", "__aeabi_ul2f",
                         "__aeabi_d2lz", "__aeabi_d2ulz", "__aeabi_f2lz", "__aeabi_f2ulz")
_C_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_RESERVED = set(EXPORTED_RUNTIME_SYMBOLS) | set(MEMORY_FUNCTIONS)

I8, I32, I64 = ir.IntType(8), ir.IntType(32), ir.IntType(64)
PTR = ir.PointerType()
# DLTensor (DLPack 0.x): data, device{type,id}, ndim, dtype{code,bits,lanes}, shape, strides, byte_offset.
DLTENSOR = ir.LiteralStructType([PTR, ir.LiteralStructType([I32, I32]), I32,
                                 ir.LiteralStructType([I8, I8, ir.IntType(16)]), PTR, PTR, I64])
_F_DATA, _F_NDIM, _F_DTYPE, _F_SHAPE, _F_STRIDES, _F_OFFSET = 0, 2, 3, 4, 5, 6


def error_code(kind: int, arg: int = 0, dim: int = 0) -> int:
    """The abi.md return code for an argument error."""
    return (kind << 24) | ((arg & 0xFFFF) << 8) | (dim & 0xFF)


def dtype_word(dtype: str) -> int:
    """DLDataType {code, bits, lanes=1} as the little-endian 32-bit word the wrapper compares against."""
    try:
        code, bits = DTYPES[str(dtype)]
    except KeyError:
        raise CompileError("dtype %r has no DLPack code; supported: %s" % (dtype, ", ".join(DTYPES))) from None
    return code | (bits << 8) | (1 << 16)


class ModuleBuilder:
    """Owns one llvmlite ``ir.Module`` for a target and turns it into IR text with everything the ABI needs.

    Contract (docs/design.md): ``.module``, ``.target``, ``.fast_math``, ``.math(name, ty)``,
    ``.parallel_launch_slot``, ``add_packed(primfunc, impl_fn)``, ``finish() -> str``.
    """

    def __init__(self, target: Any, name: str = "default", fast_math: bool = False, part: str = "whole") -> None:
        """``part``: "whole" (a complete module), or one piece of a module compiled in parts and merged into one
        object (driver.build): "kernels" (packed functions only; the launcher slot is the runtime part's) or
        "runtime" (launcher slot and setter, metadata, native pool; the functions come from add_metadata)."""
        if part not in ("whole", "kernels", "runtime"):
            raise CompileError("ModuleBuilder part must be whole, kernels or runtime, not %r" % (part,))
        self.target: Target = as_target(target)
        self.name = name
        self.part = part
        self.fast_math = bool(fast_math)
        self.module = ir.Module(name=name)
        self.module.triple = self.target.triple
        self.module.data_layout = self.target.data_layout
        self._functions: List[Dict[str, Any]] = []
        self._impls: Dict[str, ir.Function] = {}
        self._text: Optional[str] = None
        self.metadata: Optional[Dict[str, Any]] = None

        # The launcher the runtime installs (docs/parallel.md); NULL means "run tasks serially". Across the parts of
        # a module it is one hidden symbol, defined by the runtime part.
        self.parallel_launch_slot = ir.GlobalVariable(self.module, PTR, "__tether_parallel_launcher")
        self.parallel_launch_slot.align = self.target.pointer_bytes
        if part == "kernels":
            # (llvmlite cannot print a hidden declaration; the hidden definition keeps it out of the exports)
            self.parallel_launch_slot.linkage = "external"
            return
        self.parallel_launch_slot.linkage = "internal" if part == "whole" else "hidden"
        self.parallel_launch_slot.initializer = ir.Constant(PTR, None)
        setter = ir.Function(self.module, ir.FunctionType(ir.VoidType(), [PTR]), "tether_set_parallel_launcher")
        b = ir.IRBuilder(setter.append_basic_block("entry"))
        b.store(setter.args[0], self.parallel_launch_slot, align=self.target.pointer_bytes)
        b.ret_void()

    # ---- services for codegen -----------------------------------------------------------------------------
    def math(self, name: str, ty: ir.Type) -> ir.Function:
        """A self-contained math function (exp, log, tanh, ...) for scalar or vector float ``ty``."""
        return mathlib.get(self.module, name, ty, target=self.target)

    @property
    def function_names(self) -> List[str]:
        return [f["name"] for f in self._functions]

    # ---- packed wrappers ----------------------------------------------------------------------------------
    def add_packed(self, primfunc: Any, impl_fn: ir.Function) -> ir.Function:
        """Write the exported ``i32 NAME(ptr args, ptr type_codes, i32 num_args)`` around ``impl_fn``."""
        if self._text is not None:
            raise CompileError("module %r is already finished; add functions before finish()" % self.name)
        name = str(primfunc.name)
        if not _C_IDENT.match(name) or name in _RESERVED or name.startswith("llvm."):
            raise CompileError("function name %r is not usable as an exported C symbol (reserved: %s)"
                               % (name, ", ".join(sorted(_RESERVED))))
        if name in self.function_names:
            raise CompileError("module %r already has a function named %r" % (self.name, name))
        params = list(primfunc.params)
        if len(params) > 0xFFFF:
            raise CompileError("%s: too many parameters (%d)" % (name, len(params)))
        if len(impl_fn.args) != len(params):
            raise CompileError("%s: impl function %s takes %d arguments but the PrimFunc has %d parameters"
                               % (name, impl_fn.name, len(impl_fn.args), len(params)))
        args_meta = []
        for p in params:
            shape = [int(x) for x in p.shape]
            if len(shape) > 255:
                raise CompileError("%s: parameter %r has %d dimensions (max 255)" % (name, p.name, len(shape)))
            dtype_word(p.dtype)
            args_meta.append({"name": str(p.name), "shape": shape, "dtype": str(p.dtype)})

        fn = ir.Function(self.module, ir.FunctionType(I32, [PTR, PTR, I32]), name)
        fn.args[0].name, fn.args[1].name, fn.args[2].name = "args", "type_codes", "num_args"
        _WrapperWriter(fn, self.target).write(args_meta, impl_fn)
        parallel = getattr(primfunc, "parallel", None)
        self._functions.append({"name": name, "args": args_meta, "parallel": parallel})
        self._impls[name] = impl_fn
        return fn

    def add_metadata(self, entries: Sequence[Dict[str, Any]]) -> None:
        """A runtime part lists the functions its kernels parts define (their ``function_entries()``)."""
        if self.part != "runtime":
            raise CompileError("add_metadata is for the runtime part of a module built in parts")
        self._functions.extend(dict(e) for e in entries)

    def function_entries(self) -> List[Dict[str, Any]]:
        """The metadata entries of this builder's functions (name, args, parallel), resolved."""
        for entry in self._functions:
            if entry["parallel"] is None:
                entry["parallel"] = self._uses_launcher(entry["name"])
            entry["parallel"] = bool(entry["parallel"])
        return [dict(e) for e in self._functions]

    # ---- finishing --------------------------------------------------------------------------------------------
    def finish(self) -> str:
        """Add metadata and memory functions, hide internals, and return the module's LLVM IR text."""
        if self._text is not None:
            return self._text
        if not self._functions:
            raise CompileError("module %r has no functions; call add_packed() first" % self.name)
        from tether import __version__

        self.function_entries()
        if self.part == "kernels":
            return self._finish_text(set(self.function_names), runtime=False)
        # "parallel_tasks": "chunked": every task function (codegen/llvm.py make_task) runs chunk task_id of
        # num_tasks equal chunks of its loop for ANY num_tasks >= 1, so the runtime may run a whole loop as one
        # task (docs/abi.md "Parallel loops", docs/parallel.md). "thread_pool": the version of the native pool
        # protocol this module exports (codegen/threadpool.py).
        self.metadata = {"abi_version": ABI_VERSION, "tether_version": __version__,
                         "target": self.target.to_dict(), "functions": self._functions,
                         "parallel_tasks": "chunked", "thread_pool": threadpool.POOL_VERSION}
        blob = json.dumps(self.metadata, separators=(",", ":"), sort_keys=False).encode("utf-8") + b"\0"
        meta_ty = ir.ArrayType(I8, len(blob))
        meta = ir.GlobalVariable(self.module, meta_ty, "__tether_metadata")
        meta.initializer = ir.Constant(meta_ty, bytearray(blob))
        meta.global_constant = True
        meta.section = ".tether_meta"
        meta.align = 1
        own = set() if self.part == "runtime" else set(self.function_names)
        return self._finish_text(own | set(EXPORTED_RUNTIME_SYMBOLS), runtime=True)

    def _finish_text(self, exported: set, runtime: bool) -> str:
        undefined = []
        for gv in self.module.global_values:
            if gv.name in exported:
                continue
            if isinstance(gv, ir.Function) and gv.is_declaration:
                if not gv.name.startswith("llvm.") and gv.name not in MEMORY_FUNCTIONS + ARM_RUNTIME_FUNCTIONS + (
                        ARG_CHECKER,):
                    undefined.append(gv.name)
                continue
            linkage = gv.linkage or ""
            if linkage in ("internal", "private", "external") or "hidden" in linkage:
                continue    # ("external": the launcher slot a kernels part declares)
            gv.linkage = (linkage + " hidden").strip()
        if undefined:
            raise CompileError("module %r calls external functions %s; a self-contained module cannot (use "
                               "ctx.math(...) for math, llvm.* intrinsics otherwise)"
                               % (self.name, ", ".join(sorted(undefined))))
        text = str(self.module)
        # A module that declares memcpy itself (instead of using llvm.memcpy) gets the definition in its place.
        for fname in MEMORY_FUNCTIONS + (ARM_RUNTIME_FUNCTIONS if self.target.arch == "armv7" else ()):
            text = re.sub(r"^declare [^\n]*@\"?%s\"?\([^\n]*\n" % fname, "", text, flags=re.M)
        checker = re.compile(r"^declare [^\n]*@\"?%s\"?\([^\n]*\n" % re.escape(ARG_CHECKER), flags=re.M)
        text, has_checker = checker.subn("", text)
        self._text = text + memory_functions_ir(self.target) + (ARG_CHECKER_IR if has_checker else "")
        if runtime:
            self._text += threadpool.thread_pool_ir(self.target)
        if self.target.arch == "armv7":
            self._text += arm_runtime_ir()
        return self._text

    def _uses_launcher(self, name: str) -> bool:
        """Whether the impl (or a function it reaches) loads the parallel launcher slot."""
        slot = self.parallel_launch_slot.get_reference()
        seen, todo = set(), [self._impls[name]]
        funcs = {f.name: f for f in self.module.functions}
        while todo:
            f = todo.pop()
            if f.name in seen or f.is_declaration:
                continue
            seen.add(f.name)
            body = str(f)
            if slot in body:
                return True
            for callee in re.findall(r"@\"?([A-Za-z0-9_.$]+)\"?\(", body):
                if callee in funcs and callee not in seen:
                    todo.append(funcs[callee])
        return False


class _WrapperWriter:
    """Emits one packed wrapper: a constant table describing the expected arguments, one call of the module's
    shared checker (ARG_CHECKER_IR) that validates them and fills in the data pointers, then the impl call.

    Why a table and a shared checker rather than inline checks: the inline form was ~250 lines of IR per kernel
    (a block per argument, dimension and stride), which cost about 40% of LLVM's time on elementwise kernels."""

    def __init__(self, fn: ir.Function, target: Target) -> None:
        self.fn = fn
        self.target = target
        self.b = ir.IRBuilder(fn.append_basic_block("entry"))

    def write(self, args_meta: Sequence[Dict[str, Any]], impl_fn: ir.Function) -> None:
        b = self.b
        module = self.fn.module
        args, codes, num = self.fn.args
        n = len(args_meta)
        words = [n]
        for meta in args_meta:
            shape = [int(x) for x in meta["shape"]]
            numel = 1
            for extent in shape:
                numel *= extent
            words += [len(shape), dtype_word(meta["dtype"]), 1 if numel else 0] + shape
        table_ty = ir.ArrayType(I64, len(words))
        table = ir.GlobalVariable(module, table_ty, "%s.argtable" % self.fn.name)
        table.linkage = "internal"
        table.global_constant = True
        table.initializer = ir.Constant(table_ty, words)
        checker = _arg_checker(module)
        ptrs_ty = ir.ArrayType(PTR, max(n, 1))
        ptrs = b.alloca(ptrs_ty, name="ptrs")
        ptrs.type = PTR     # opaque pointers (LLVM 17+): llvmlite would print a typed pointer
        rc0 = b.call(checker, [args, codes, num, table, ptrs], name="check")
        ok = self.fn.append_basic_block("args.ok")
        bad = self.fn.append_basic_block("args.bad")
        b.cbranch(b.icmp_signed("==", rc0, ir.Constant(I32, 0)), ok, bad)
        b.position_at_end(bad)
        b.ret(rc0)
        b.position_at_end(ok)
        data_ptrs = [b.load(b.gep(ptrs, [ir.Constant(I32, 0), ir.Constant(I32, i)], inbounds=True,
                                  source_etype=ptrs_ty), typ=PTR, name="p%d" % i) for i in range(n)]
        rc = b.call(impl_fn, data_ptrs, name="rc")
        # The impl returns 0 or a launcher failure; make sure a bare task code still reads as "parallel task failed".
        is_plain = b.icmp_unsigned("<", rc, ir.Constant(I32, 1 << 24))
        is_err = b.icmp_unsigned("!=", rc, ir.Constant(I32, 0))
        wrapped = b.or_(b.and_(rc, ir.Constant(I32, 0xFFFFFF)), ir.Constant(I32, ERR_PARALLEL << 24))
        b.ret(b.select(b.and_(is_plain, is_err), wrapped, rc))


ARG_CHECKER = "tether.check_args"


def _arg_checker(module: ir.Module) -> ir.Function:
    """The declaration of the module's argument checker; finish() appends its definition (ARG_CHECKER_IR)."""
    try:
        return module.get_global(ARG_CHECKER)
    except KeyError:
        return ir.Function(module, ir.FunctionType(I32, [PTR, PTR, I32, PTR, PTR]), ARG_CHECKER)


# i32 check(ptr args, ptr type_codes, i32 num_args, ptr table, ptr out_data_ptrs): 0, or the abi.md code of the first
# argument error, in the order the ABI documents (count, then per argument: type code, handle, ndim, dtype, each
# extent, strides, data). table (i64): num_args, then per argument ndim, dtype word, numel != 0, extents...
ARG_CHECKER_IR = r"""
define internal i32 @"tether.check_args"(ptr %args, ptr %codes, i32 %num, ptr %table, ptr %out) nounwind noinline {
entry:
  %n64 = load i64, ptr %table, align 8
  %n = trunc i64 %n64 to i32
  %countok = icmp eq i32 %num, %n
  br i1 %countok, label %arg.head, label %bad.count
bad.count:
  %nm = and i32 %num, 16777215
  %rcn = or i32 %nm, 16777216
  ret i32 %rcn
arg.head:
  %i = phi i32 [ 0, %entry ], [ %i1, %arg.next ]
  %pos = phi i64 [ 1, %entry ], [ %posn, %arg.next ]
  %more = icmp slt i32 %i, %n
  br i1 %more, label %arg.body, label %done
done:
  ret i32 0
arg.body:
  %argbits = shl i32 %i, 8
  %tp = getelementptr inbounds i64, ptr %table, i64 %pos
  %ndim_e64 = load i64, ptr %tp, align 8
  %ndim_e = trunc i64 %ndim_e64 to i32
  %pos1 = add i64 %pos, 1
  %dtp = getelementptr inbounds i64, ptr %table, i64 %pos1
  %dt_e64 = load i64, ptr %dtp, align 8
  %dt_e = trunc i64 %dt_e64 to i32
  %pos2 = add i64 %pos, 2
  %nep = getelementptr inbounds i64, ptr %table, i64 %pos2
  %nonempty = load i64, ptr %nep, align 8
  %ext0 = add i64 %pos, 3
  %i64i = zext i32 %i to i64
  %cp = getelementptr inbounds i32, ptr %codes, i64 %i64i
  %code = load i32, ptr %cp, align 4
  %codeok = icmp eq i32 %code, 3
  br i1 %codeok, label %chk.handle, label %bad.code
bad.code:
  %rc_code = or i32 %argbits, 33554432
  ret i32 %rc_code
chk.handle:
  %off8 = mul i64 %i64i, 8
  %slot = getelementptr inbounds i8, ptr %args, i64 %off8
  %h = load ptr, ptr %slot, align 4
  %hnull = icmp eq ptr %h, null
  br i1 %hnull, label %bad.null, label %chk.ndim
bad.null:
  %rc_null = or i32 %argbits, 117440512
  ret i32 %rc_null
chk.ndim:
  %ndp = getelementptr inbounds { ptr, { i32, i32 }, i32, { i8, i8, i16 }, ptr, ptr, i64 }, ptr %h, i32 0, i32 2
  %ndim = load i32, ptr %ndp, align 4
  %ndok = icmp eq i32 %ndim, %ndim_e
  br i1 %ndok, label %chk.dtype, label %bad.ndim
bad.ndim:
  %rc_nd = or i32 %argbits, 50331648
  ret i32 %rc_nd
chk.dtype:
  %dp = getelementptr inbounds { ptr, { i32, i32 }, i32, { i8, i8, i16 }, ptr, ptr, i64 }, ptr %h, i32 0, i32 3
  %dt = load i32, ptr %dp, align 4
  %dtok = icmp eq i32 %dt, %dt_e
  br i1 %dtok, label %chk.rank, label %bad.dtype
bad.dtype:
  %rc_dt = or i32 %argbits, 67108864
  ret i32 %rc_dt
chk.rank:
  %scalar = icmp eq i32 %ndim_e, 0
  br i1 %scalar, label %chk.data, label %shape.pre
shape.pre:
  %shpp = getelementptr inbounds { ptr, { i32, i32 }, i32, { i8, i8, i16 }, ptr, ptr, i64 }, ptr %h, i32 0, i32 4
  %shp = load ptr, ptr %shpp, align 4
  br label %shape.head
shape.head:
  %d = phi i32 [ 0, %shape.pre ], [ %d1, %shape.ok ]
  %dmore = icmp slt i32 %d, %ndim_e
  br i1 %dmore, label %shape.body, label %strides.pre
shape.body:
  %d64 = zext i32 %d to i64
  %sp = getelementptr inbounds i64, ptr %shp, i64 %d64
  %e = load i64, ptr %sp, align 4
  %tpos = add i64 %ext0, %d64
  %tep = getelementptr inbounds i64, ptr %table, i64 %tpos
  %e_exp = load i64, ptr %tep, align 8
  %eok = icmp eq i64 %e, %e_exp
  br i1 %eok, label %shape.ok, label %bad.shape
shape.ok:
  %d1 = add i32 %d, 1
  br label %shape.head
bad.shape:
  %dbits = and i32 %d, 255
  %rc_s0 = or i32 %argbits, %dbits
  %rc_s = or i32 %rc_s0, 83886080
  ret i32 %rc_s
strides.pre:
  %stpp = getelementptr inbounds { ptr, { i32, i32 }, i32, { i8, i8, i16 }, ptr, ptr, i64 }, ptr %h, i32 0, i32 5
  %stp = load ptr, ptr %stpp, align 4
  %stnull = icmp eq ptr %stp, null
  br i1 %stnull, label %chk.data, label %strides.first
strides.first:
  %dlast = sub i32 %ndim_e, 1
  br label %strides.head
strides.head:
  %sd = phi i32 [ %dlast, %strides.first ], [ %sd1, %strides.next ]
  %expect = phi i64 [ 1, %strides.first ], [ %expect1, %strides.next ]
  %sdmore = icmp sge i32 %sd, 0
  br i1 %sdmore, label %strides.body, label %chk.data
strides.body:
  %sd64 = zext i32 %sd to i64
  %stpos = add i64 %ext0, %sd64
  %step = getelementptr inbounds i64, ptr %table, i64 %stpos
  %sext = load i64, ptr %step, align 8
  %unit = icmp eq i64 %sext, 1
  br i1 %unit, label %strides.next, label %strides.cmp
strides.cmp:
  %stq = getelementptr inbounds i64, ptr %stp, i64 %sd64
  %stride = load i64, ptr %stq, align 4
  %stok = icmp eq i64 %stride, %expect
  br i1 %stok, label %strides.next, label %bad.stride
bad.stride:
  %sdbits = and i32 %sd, 255
  %rc_t0 = or i32 %argbits, %sdbits
  %rc_t = or i32 %rc_t0, 100663296
  ret i32 %rc_t
strides.next:
  %expect1 = mul i64 %expect, %sext
  %sd1 = sub i32 %sd, 1
  br label %strides.head
chk.data:
  %datap = getelementptr inbounds { ptr, { i32, i32 }, i32, { i8, i8, i16 }, ptr, ptr, i64 }, ptr %h, i32 0, i32 0
  %data = load ptr, ptr %datap, align 4
  %dnull = icmp eq ptr %data, null
  %needdata = icmp ne i64 %nonempty, 0
  %baddata = and i1 %dnull, %needdata
  br i1 %baddata, label %bad.null, label %store
store:
  %offp = getelementptr inbounds { ptr, { i32, i32 }, i32, { i8, i8, i16 }, ptr, ptr, i64 }, ptr %h, i32 0, i32 6
  %off = load i64, ptr %offp, align 4
  %pdata = getelementptr inbounds i8, ptr %data, i64 %off
  %outp = getelementptr inbounds ptr, ptr %out, i64 %i64i
  store ptr %pdata, ptr %outp, align 4
  br label %arg.next
arg.next:
  %i1 = add i32 %i, 1
  %ndim_e64b = zext i32 %ndim_e to i64
  %posn = add i64 %ext0, %ndim_e64b
  br label %arg.head
}
"""


def memory_functions_ir(target: Target) -> str:
    """Hidden memcpy/memmove/memset for modules without libc.

    "no-builtins" stops LLVM from recognising these loops as memcpy/memset idioms and calling themselves; weak
    linkage lets several tether objects (or a C program with its own libc) be linked together."""
    sz = "i%d" % target.bits
    attrs = 'nounwind "no-builtins"'
    return """
define weak hidden ptr @memcpy(ptr noalias %d, ptr noalias %s, {sz} %n) {attrs} {{
entry:
  %z = icmp eq {sz} %n, 0
  br i1 %z, label %done, label %loop
loop:
  %i = phi {sz} [ 0, %entry ], [ %i1, %loop ]
  %sp = getelementptr inbounds i8, ptr %s, {sz} %i
  %v = load i8, ptr %sp, align 1
  %dp = getelementptr inbounds i8, ptr %d, {sz} %i
  store i8 %v, ptr %dp, align 1
  %i1 = add nuw {sz} %i, 1
  %c = icmp ult {sz} %i1, %n
  br i1 %c, label %loop, label %done
done:
  ret ptr %d
}}

define weak hidden ptr @memset(ptr %d, i32 %c, {sz} %n) {attrs} {{
entry:
  %b = trunc i32 %c to i8
  %z = icmp eq {sz} %n, 0
  br i1 %z, label %done, label %loop
loop:
  %i = phi {sz} [ 0, %entry ], [ %i1, %loop ]
  %dp = getelementptr inbounds i8, ptr %d, {sz} %i
  store i8 %b, ptr %dp, align 1
  %i1 = add nuw {sz} %i, 1
  %k = icmp ult {sz} %i1, %n
  br i1 %k, label %loop, label %done
done:
  ret ptr %d
}}

define weak hidden ptr @memmove(ptr %d, ptr %s, {sz} %n) {attrs} {{
entry:
  %z = icmp eq {sz} %n, 0
  br i1 %z, label %done, label %pick
pick:
  %di = ptrtoint ptr %d to {sz}
  %si = ptrtoint ptr %s to {sz}
  %fwd = icmp ule {sz} %di, %si
  br i1 %fwd, label %floop, label %bloop
floop:
  %i = phi {sz} [ 0, %pick ], [ %i1, %floop ]
  %sp = getelementptr inbounds i8, ptr %s, {sz} %i
  %v = load i8, ptr %sp, align 1
  %dp = getelementptr inbounds i8, ptr %d, {sz} %i
  store i8 %v, ptr %dp, align 1
  %i1 = add nuw {sz} %i, 1
  %c = icmp ult {sz} %i1, %n
  br i1 %c, label %floop, label %done
bloop:
  %j = phi {sz} [ %n, %pick ], [ %j1, %bloop ]
  %j1 = sub nuw {sz} %j, 1
  %sq = getelementptr inbounds i8, ptr %s, {sz} %j1
  %w = load i8, ptr %sq, align 1
  %dq = getelementptr inbounds i8, ptr %d, {sz} %j1
  store i8 %w, ptr %dq, align 1
  %e = icmp ne {sz} %j1, 0
  br i1 %e, label %bloop, label %done
done:
  ret ptr %d
}}
""".format(sz=sz, attrs=attrs)


def _udivmod_ir(bits: int) -> str:
    """Shift-subtract unsigned division (no division instruction, so it can never call itself)."""
    t = "i%d" % bits
    return """
define internal {{{t}, {t}}} @tether.aeabi.udivmod{b}({t} %n, {t} %d) nounwind "no-builtins" {{
entry:
  br label %loop
loop:
  %i = phi {t} [ {top}, %entry ], [ %i1, %loop ]
  %q = phi {t} [ 0, %entry ], [ %q2, %loop ]
  %r = phi {t} [ 0, %entry ], [ %r2, %loop ]
  %bit = lshr {t} %n, %i
  %b1 = and {t} %bit, 1
  %rtop = lshr {t} %r, {top}
  %over = icmp ne {t} %rtop, 0
  %rs = shl {t} %r, 1
  %r1 = or {t} %rs, %b1
  %ge0 = icmp uge {t} %r1, %d
  %ge = or i1 %ge0, %over
  %rsub = sub {t} %r1, %d
  %r2 = select i1 %ge, {t} %rsub, {t} %r1
  %qb = zext i1 %ge to {t}
  %qbs = shl {t} %qb, %i
  %q2 = or {t} %q, %qbs
  %i1 = sub {t} %i, 1
  %done = icmp slt {t} %i1, 0
  br i1 %done, label %exit, label %loop
exit:
  %v0 = insertvalue {{{t}, {t}}} undef, {t} %q2, 0
  %v1 = insertvalue {{{t}, {t}}} %v0, {t} %r2, 1
  ret {{{t}, {t}}} %v1
}}

define internal {{{t}, {t}}} @tether.aeabi.sdivmod{b}({t} %a, {t} %b) nounwind "no-builtins" {{
entry:
  %sa = icmp slt {t} %a, 0
  %sb = icmp slt {t} %b, 0
  %na = sub {t} 0, %a
  %nb = sub {t} 0, %b
  %ua = select i1 %sa, {t} %na, {t} %a
  %ub = select i1 %sb, {t} %nb, {t} %b
  %qr = call {{{t}, {t}}} @tether.aeabi.udivmod{b}({t} %ua, {t} %ub)
  %q = extractvalue {{{t}, {t}}} %qr, 0
  %r = extractvalue {{{t}, {t}}} %qr, 1
  %sq = xor i1 %sa, %sb
  %nq = sub {t} 0, %q
  %nr = sub {t} 0, %r
  %q1 = select i1 %sq, {t} %nq, {t} %q
  %r1 = select i1 %sa, {t} %nr, {t} %r
  %v0 = insertvalue {{{t}, {t}}} undef, {t} %q1, 0
  %v1 = insertvalue {{{t}, {t}}} %v0, {t} %r1, 1
  ret {{{t}, {t}}} %v1
}}
""".format(t=t, b=bits, top=bits - 1)


def arm_runtime_ir() -> str:
    """The armv7 run-time ABI helpers (RTABI __aeabi_*) LLVM may call, as hidden weak definitions.

    They use the base AAPCS (arm_aapcscc: values in core registers even on hard-float targets) as the RTABI
    requires. Conversions use only 32-bit int <-> float instructions, which VFP has."""
    attrs = 'nounwind "no-builtins"'
    fns = [_udivmod_ir(32), _udivmod_ir(64)]
    for name, kind, t in (("__aeabi_uidivmod", "u", "i32"), ("__aeabi_idivmod", "s", "i32"),
                          ("__aeabi_uldivmod", "u", "i64"), ("__aeabi_ldivmod", "s", "i64")):
        fns.append("""
define weak hidden arm_aapcscc {{{t}, {t}}} @{name}({t} %a, {t} %b) {attrs} {{
  %r = call {{{t}, {t}}} @tether.aeabi.{kind}divmod{bits}({t} %a, {t} %b)
  ret {{{t}, {t}}} %r
}}""".format(name=name, t=t, kind=kind, bits=t[1:], attrs=attrs))
    for name, kind in (("__aeabi_uidiv", "u"), ("__aeabi_idiv", "s")):
        fns.append("""
define weak hidden arm_aapcscc i32 @{name}(i32 %a, i32 %b) {attrs} {{
  %r = call {{i32, i32}} @tether.aeabi.{kind}divmod32(i32 %a, i32 %b)
  %q = extractvalue {{i32, i32}} %r, 0
  ret i32 %q
}}""".format(name=name, kind=kind, attrs=attrs))
    fns.append("""
define internal double @tether.aeabi.u64_to_f64(i64 %x) nounwind "no-builtins" {{
  %h = lshr i64 %x, 32
  %h32 = trunc i64 %h to i32
  %l32 = trunc i64 %x to i32
  %hd = uitofp i32 %h32 to double
  %ld = uitofp i32 %l32 to double
  %hs = fmul double %hd, 4294967296.0
  %r = fadd double %hs, %ld
  ret double %r
}}

define weak hidden arm_aapcscc double @__aeabi_ul2d(i64 %x) {attrs} {{
  %r = call double @tether.aeabi.u64_to_f64(i64 %x)
  ret double %r
}}

define weak hidden arm_aapcscc double @__aeabi_l2d(i64 %x) {attrs} {{
  %neg = icmp slt i64 %x, 0
  %nx = sub i64 0, %x
  %ax = select i1 %neg, i64 %nx, i64 %x
  %d = call double @tether.aeabi.u64_to_f64(i64 %ax)
  %nd = fneg double %d
  %r = select i1 %neg, double %nd, double %d
  ret double %r
}}

; u64 -> float with one correct rounding: above 2**53 the bits a double would drop are folded into a sticky bit
; (bit 11) first, so the double is exact and only the final float rounding happens.
define internal float @tether.aeabi.u64_to_f32(i64 %x) nounwind "no-builtins" {{
  %big = icmp uge i64 %x, 9007199254740992
  %low = and i64 %x, 2047
  %has = icmp ne i64 %low, 0
  %hi = and i64 %x, -2048
  %st = select i1 %has, i64 2048, i64 0
  %sticky = or i64 %hi, %st
  %y = select i1 %big, i64 %sticky, i64 %x
  %d = call double @tether.aeabi.u64_to_f64(i64 %y)
  %f = fptrunc double %d to float
  ret float %f
}}

define weak hidden arm_aapcscc float @__aeabi_ul2f(i64 %x) {attrs} {{
  %r = call float @tether.aeabi.u64_to_f32(i64 %x)
  ret float %r
}}

define weak hidden arm_aapcscc float @__aeabi_l2f(i64 %x) {attrs} {{
  %neg = icmp slt i64 %x, 0
  %nx = sub i64 0, %x
  %ax = select i1 %neg, i64 %nx, i64 %x
  %f = call float @tether.aeabi.u64_to_f32(i64 %ax)
  %nf = fneg float %f
  %r = select i1 %neg, float %nf, float %f
  ret float %r
}}

; |d| -> u64 by truncation, for |d| < 2**64 (larger values and NaN are undefined in C, as in compiler-rt).
define internal i64 @tether.aeabi.f64_to_u64(double %a) nounwind "no-builtins" {{
  %s = fmul double %a, 0x3DF0000000000000
  %h32 = fptoui double %s to i32
  %hd = uitofp i32 %h32 to double
  %hs = fmul double %hd, 4294967296.0
  %rest = fsub double %a, %hs
  %l32 = fptoui double %rest to i32
  %h = zext i32 %h32 to i64
  %hh = shl i64 %h, 32
  %l = zext i32 %l32 to i64
  %r = or i64 %hh, %l
  ret i64 %r
}}

define weak hidden arm_aapcscc i64 @__aeabi_d2ulz(double %d) {attrs} {{
  %pos = fcmp ogt double %d, 0.0
  %a = select i1 %pos, double %d, double 0.0
  %r = call i64 @tether.aeabi.f64_to_u64(double %a)
  ret i64 %r
}}

define weak hidden arm_aapcscc i64 @__aeabi_d2lz(double %d) {attrs} {{
  %neg = fcmp olt double %d, 0.0
  %nd = fneg double %d
  %a = select i1 %neg, double %nd, double %d
  %u = call i64 @tether.aeabi.f64_to_u64(double %a)
  %nu = sub i64 0, %u
  %r = select i1 %neg, i64 %nu, i64 %u
  ret i64 %r
}}

define weak hidden arm_aapcscc i64 @__aeabi_f2ulz(float %f) {attrs} {{
  %d = fpext float %f to double
  %r = call arm_aapcscc i64 @__aeabi_d2ulz(double %d)
  ret i64 %r
}}

define weak hidden arm_aapcscc i64 @__aeabi_f2lz(float %f) {attrs} {{
  %d = fpext float %f to double
  %r = call arm_aapcscc i64 @__aeabi_d2lz(double %d)
  ret i64 %r
}}
""".format(attrs=attrs))
    return "\n".join(fns) + "\n"
