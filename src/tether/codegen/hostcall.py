"""Host callbacks (TVM's call_packed): a kernel calls a function the runtime registered by name.

The module stays self-contained: it never links against the runtime. It holds one hidden slot, the *host
caller*, which the runtime installs through the exported ``tether_set_host_caller`` when it loads the module,
after resolving every name in the metadata's ``"host_functions"`` (a missing name fails the load). A call site
passes the name, packed scalar arguments and receives a packed result (docs/abi.md "Host callbacks"):

    int32_t caller(const char* name, const TetherValue* args, const int32_t* codes, int32_t n,
                   TetherValue* ret, int32_t* ret_code);

A nonzero result, or no caller installed, makes the enclosing function return ``9 << 24 | k`` (``k`` = the
name's index in ``"host_functions"``), which the runtime reports with the host function's own error.
"""
from __future__ import annotations

from typing import Any, List

from llvmlite import ir

from tether.codegen.types import F64, I8, I32, I64, PTR
from tether.errors import CompileError
from tether.tir import PackedCall, is_float

HOST_CALLER_SLOT = "__tether_host_caller"
HOST_CALLER_SETTER = "tether_set_host_caller"
ERR_HOST_CALL = 9
TETHER_INT64, TETHER_FLOAT64 = 0, 1
CALLER_TYPE = ir.FunctionType(I32, [PTR, PTR, PTR, I32, PTR, PTR])


class _FnPointer:
    """A loaded function pointer with the function type llvmlite's call needs (opaque pointers carry none)."""

    def __init__(self, value: ir.Value, fnty: ir.FunctionType):
        self.value, self.function_type, self.type = value, fnty, value.type

    def get_reference(self) -> str:
        return self.value.get_reference()


def _alloca(b: ir.IRBuilder, ty: ir.Type, count: int) -> ir.Value:
    a = b.alloca(ir.ArrayType(ty, count))
    a.align = 8
    a.type = PTR  # llvmlite types allocas as typed pointers; the module uses opaque pointers throughout
    return a


def host_functions(ctx: Any) -> List[str]:
    """The host functions module ``ctx`` (a ModuleBuilder) calls, in first-use order (its metadata list)."""
    return getattr(ctx, "host_functions", [])


def _slot(ctx: Any) -> ir.GlobalVariable:
    slot = getattr(ctx, "_host_caller_slot", None)
    if slot is not None:
        return slot
    if getattr(ctx, "part", "whole") != "whole":
        raise CompileError("call_packed in a module built in parts is not supported: build it in one process "
                           "(tether.build(..., jobs=1) or TETHER_BUILD_JOBS=1)")
    module, target = ctx.module, ctx.target
    slot = ir.GlobalVariable(module, PTR, HOST_CALLER_SLOT)
    slot.linkage = "internal"
    slot.initializer = ir.Constant(PTR, None)
    slot.align = target.pointer_bytes
    setter = ir.Function(module, ir.FunctionType(ir.VoidType(), [PTR]), HOST_CALLER_SETTER)
    b = ir.IRBuilder(setter.append_basic_block("entry"))
    b.store(setter.args[0], slot, align=target.pointer_bytes)
    b.ret_void()
    ctx._host_caller_slot = slot
    ctx.host_functions = []
    return slot


def _name_constant(ctx: Any, name: str) -> ir.GlobalVariable:
    data = bytearray(name.encode("utf-8") + b"\0")
    ty = ir.ArrayType(I8, len(data))
    gv = ir.GlobalVariable(ctx.module, ty, ctx.module.get_unique_name("host_fn_name"))
    gv.linkage = "private"
    gv.global_constant = True
    gv.initializer = ir.Constant(ty, data)
    return gv


def emit_packed_call(em: Any, e: PackedCall) -> ir.Value:
    """Emit ``e`` with ExprEmitter ``em``: pack the arguments, call the host caller, unpack the result."""
    if em.ctx.target.is_wasm:
        # a wasm32 module has no imports and no host caller slot (docs/web.md "The module")
        raise CompileError("call_packed(%r): host functions are not supported for %s: a wasm32 module calls "
                           "nothing outside itself; compute the value in the kernel or build for an ELF target"
                           % (e.name, em.ctx.target.preset or em.ctx.target.triple))
    if em.vec is not None:
        raise NotImplementedError("call_packed(%r) inside a vectorized loop (dtype %s): keep the loop scalar"
                                  % (e.name, e.dtype))
    ctx, b = em.ctx, em.b
    slot = _slot(ctx)
    names = ctx.host_functions
    if e.name not in names:
        names.append(e.name)
    index = names.index(e.name)
    n = len(e.args)
    # stack slots in the entry block, so a call inside a loop does not grow the stack each iteration
    fn = b.function
    entry = ir.IRBuilder(fn.entry_basic_block)
    entry.position_at_start(fn.entry_basic_block)
    values, codes, ret, ret_code = (_alloca(entry, I64, max(n, 1)), _alloca(entry, I32, max(n, 1)),
                                    _alloca(entry, I64, 1), _alloca(entry, I32, 1))
    for i, a in enumerate(e.args):
        v = em.ev(a)
        if is_float(a.dtype):
            word, code = b.bitcast(em.cast(v, a.dtype, "float64"), I64), TETHER_FLOAT64
        else:
            word, code = em.cast(v, a.dtype, "int64"), TETHER_INT64
        b.store(word, b.gep(values, [ir.Constant(I32, i)], inbounds=True, source_etype=I64))
        b.store(ir.Constant(I32, code), b.gep(codes, [ir.Constant(I32, i)], inbounds=True, source_etype=I32))
    b.store(ir.Constant(I64, 0), ret)
    b.store(ir.Constant(I32, TETHER_INT64), ret_code)
    caller = b.load(slot, typ=PTR, align=ctx.target.pointer_bytes)
    name = _name_constant(ctx, e.name)
    missing = b.icmp_unsigned("==", caller, ir.Constant(PTR, None))
    fail = fn.append_basic_block("host_call_fail")
    call_bb = fn.append_basic_block("host_call")
    done = fn.append_basic_block("host_call_done")
    b.cbranch(missing, fail, call_bb)
    b.position_at_end(call_bb)
    rc = b.call(_FnPointer(caller, CALLER_TYPE), [name, values, codes, ir.Constant(I32, n), ret, ret_code])
    b.cbranch(b.icmp_signed("!=", rc, ir.Constant(I32, 0)), fail, done)
    b.position_at_end(fail)
    b.ret(ir.Constant(fn.function_type.return_type, (ERR_HOST_CALL << 24) | index))
    b.position_at_end(done)
    word = b.load(ret, typ=I64)
    as_float = em.cast(b.bitcast(word, F64), "float64", e.dtype)
    as_int = em.cast(word, "int64", e.dtype)
    is_f = b.icmp_signed("==", b.load(ret_code, typ=I32), ir.Constant(I32, TETHER_FLOAT64))
    return b.select(is_f, as_float, as_int)
