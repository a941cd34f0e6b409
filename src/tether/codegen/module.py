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

from tether.codegen import mathlib
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

EXPORTED_RUNTIME_SYMBOLS = ("tether_set_parallel_launcher", "__tether_metadata")
MEMORY_FUNCTIONS = ("memcpy", "memmove", "memset")
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

    def __init__(self, target: Any, name: str = "default", fast_math: bool = False) -> None:
        self.target: Target = as_target(target)
        self.name = name
        self.fast_math = bool(fast_math)
        self.module = ir.Module(name=name)
        self.module.triple = self.target.triple
        self.module.data_layout = self.target.data_layout
        self._functions: List[Dict[str, Any]] = []
        self._impls: Dict[str, ir.Function] = {}
        self._text: Optional[str] = None
        self.metadata: Optional[Dict[str, Any]] = None

        # The launcher the runtime installs (docs/parallel.md); NULL means "run tasks serially".
        self.parallel_launch_slot = ir.GlobalVariable(self.module, PTR, "__tether_parallel_launcher")
        self.parallel_launch_slot.linkage = "internal"
        self.parallel_launch_slot.initializer = ir.Constant(PTR, None)
        self.parallel_launch_slot.align = self.target.pointer_bytes
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

    # ---- finishing --------------------------------------------------------------------------------------------
    def finish(self) -> str:
        """Add metadata and memory functions, hide internals, and return the module's LLVM IR text."""
        if self._text is not None:
            return self._text
        if not self._functions:
            raise CompileError("module %r has no functions; call add_packed() first" % self.name)
        from tether import __version__

        for entry in self._functions:
            if entry["parallel"] is None:
                entry["parallel"] = self._uses_launcher(entry["name"])
            entry["parallel"] = bool(entry["parallel"])
        self.metadata = {"abi_version": ABI_VERSION, "tether_version": __version__,
                         "target": self.target.to_dict(), "functions": self._functions}
        blob = json.dumps(self.metadata, separators=(",", ":"), sort_keys=False).encode("utf-8") + b"\0"
        meta_ty = ir.ArrayType(I8, len(blob))
        meta = ir.GlobalVariable(self.module, meta_ty, "__tether_metadata")
        meta.initializer = ir.Constant(meta_ty, bytearray(blob))
        meta.global_constant = True
        meta.section = ".tether_meta"
        meta.align = 1

        exported = set(self.function_names) | set(EXPORTED_RUNTIME_SYMBOLS)
        undefined = []
        for gv in self.module.global_values:
            if gv.name in exported:
                continue
            if isinstance(gv, ir.Function) and gv.is_declaration:
                if not gv.name.startswith("llvm.") and gv.name not in MEMORY_FUNCTIONS:
                    undefined.append(gv.name)
                continue
            linkage = gv.linkage or ""
            if linkage in ("internal", "private") or "hidden" in linkage:
                continue
            gv.linkage = (linkage + " hidden").strip()
        if undefined:
            raise CompileError("module %r calls external functions %s; a self-contained module cannot (use "
                               "ctx.math(...) for math, llvm.* intrinsics otherwise)"
                               % (self.name, ", ".join(sorted(undefined))))
        text = str(self.module)
        # A module that declares memcpy itself (instead of using llvm.memcpy) gets the definition in its place.
        for fname in MEMORY_FUNCTIONS:
            text = re.sub(r"^declare [^\n]*@\"?%s\"?\([^\n]*\n" % fname, "", text, flags=re.M)
        self._text = text + memory_functions_ir(self.target)
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
    """Emits the argument checks of one packed wrapper, one early-return block per failure kind."""

    def __init__(self, fn: ir.Function, target: Target) -> None:
        self.fn = fn
        self.target = target
        self.b = ir.IRBuilder(fn.append_basic_block("entry"))

    def _fail_unless(self, ok: ir.Value, code: Any, label: str) -> None:
        good = self.fn.append_basic_block(label + ".ok")
        bad = self.fn.append_basic_block(label + ".fail")
        self.b.cbranch(ok, good, bad)
        self.b.position_at_end(bad)
        self.b.ret(code if isinstance(code, ir.Value) else ir.Constant(I32, code))
        self.b.position_at_end(good)

    def _field(self, handle: ir.Value, index: int, ty: ir.Type, name: str) -> ir.Value:
        addr = self.b.gep(handle, [ir.Constant(I32, 0), ir.Constant(I32, index)], inbounds=True,
                          source_etype=DLTENSOR)
        return self.b.load(addr, name=name, typ=ty)

    def write(self, args_meta: Sequence[Dict[str, Any]], impl_fn: ir.Function) -> None:
        b = self.b
        args, codes, num = self.fn.args
        n = len(args_meta)
        bad_count = b.or_(ir.Constant(I32, ERR_NUM_ARGS << 24), b.and_(num, ir.Constant(I32, 0xFFFFFF)))
        self._fail_unless(b.icmp_signed("==", num, ir.Constant(I32, n)), bad_count, "nargs")
        data_ptrs = []
        for i, meta in enumerate(args_meta):
            code_i = b.load(b.gep(codes, [ir.Constant(I32, i)], inbounds=True, source_etype=I32), typ=I32)
            self._fail_unless(b.icmp_signed("==", code_i, ir.Constant(I32, TETHER_DLTENSOR)),
                              error_code(ERR_TYPE_CODE, i), "a%d.code" % i)
            # TetherValue is an 8-byte union; v_handle sits at offset 0 on little-endian targets.
            slot = b.gep(args, [ir.Constant(I32, 8 * i)], inbounds=True, source_etype=I8)
            h = b.load(slot, typ=PTR, name="h%d" % i)
            self._fail_unless(b.icmp_unsigned("!=", h, ir.Constant(PTR, None)), error_code(ERR_NULL_DATA, i),
                              "a%d.handle" % i)
            shape = meta["shape"]
            ndim = self._field(h, _F_NDIM, I32, "ndim%d" % i)
            self._fail_unless(b.icmp_signed("==", ndim, ir.Constant(I32, len(shape))), error_code(ERR_NDIM, i),
                              "a%d.ndim" % i)
            dtype_addr = b.gep(h, [ir.Constant(I32, 0), ir.Constant(I32, _F_DTYPE)], inbounds=True,
                               source_etype=DLTENSOR)
            dt = b.load(dtype_addr, typ=I32, name="dtype%d" % i)
            self._fail_unless(b.icmp_unsigned("==", dt, ir.Constant(I32, dtype_word(meta["dtype"]))),
                              error_code(ERR_DTYPE, i), "a%d.dtype" % i)
            if shape:
                shp = self._field(h, _F_SHAPE, PTR, "shape%d" % i)
                for d, extent in enumerate(shape):
                    e = b.load(b.gep(shp, [ir.Constant(I32, d)], inbounds=True, source_etype=I64), typ=I64)
                    self._fail_unless(b.icmp_signed("==", e, ir.Constant(I64, extent)),
                                      error_code(ERR_SHAPE, i, d), "a%d.d%d" % (i, d))
                self._check_strides(h, i, shape)
            numel = 1
            for extent in shape:
                numel *= extent
            data = self._field(h, _F_DATA, PTR, "data%d" % i)
            if numel:
                self._fail_unless(b.icmp_unsigned("!=", data, ir.Constant(PTR, None)),
                                  error_code(ERR_NULL_DATA, i), "a%d.data" % i)
            offset = self._field(h, _F_OFFSET, I64, "offset%d" % i)
            if self.target.bits == 32:
                offset = b.trunc(offset, I32)
            data_ptrs.append(b.gep(data, [offset], inbounds=True, source_etype=I8, name="p%d" % i))
        rc = b.call(impl_fn, data_ptrs, name="rc")
        # The impl returns 0 or a launcher failure; make sure a bare task code still reads as "parallel task failed".
        is_plain = b.icmp_unsigned("<", rc, ir.Constant(I32, 1 << 24))
        is_err = b.icmp_unsigned("!=", rc, ir.Constant(I32, 0))
        wrapped = b.or_(b.and_(rc, ir.Constant(I32, 0xFFFFFF)), ir.Constant(I32, ERR_PARALLEL << 24))
        b.ret(b.select(b.and_(is_plain, is_err), wrapped, rc))

    def _check_strides(self, h: ir.Value, i: int, shape: Sequence[int]) -> None:
        """Strides must be NULL or compact row-major; unit dimensions may carry any stride (numpy does that)."""
        b = self.b
        strides = self._field(h, _F_STRIDES, PTR, "strides%d" % i)
        check = self.fn.append_basic_block("a%d.strides" % i)
        done = self.fn.append_basic_block("a%d.strides.done" % i)
        b.cbranch(b.icmp_unsigned("==", strides, ir.Constant(PTR, None)), done, check)
        b.position_at_end(check)
        expected = 1
        for d in reversed(range(len(shape))):
            if shape[d] != 1:
                s = b.load(b.gep(strides, [ir.Constant(I32, d)], inbounds=True, source_etype=I64), typ=I64)
                self._fail_unless(b.icmp_signed("==", s, ir.Constant(I64, expected)),
                                  error_code(ERR_STRIDES, i, d), "a%d.s%d" % (i, d))
            expected *= shape[d]
        b.branch(done)
        b.position_at_end(done)


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
