"""Runtime IR every module carries, since a tether module links against nothing (no libc, no compiler-rt):
the parallel launcher slot and its setter, the metadata blob, memcpy/memmove/memset, and on armv7 the run-time
ABI helpers (``__aeabi_*``) LLVM calls for integer division and 64-bit int <-> float conversions.

Codegen never emulates those operations itself: it emits plain ``sdiv``/``sitofp``/... and LLVM's armv7 backend
turns them into calls of the helpers here (the one place 64-bit integer arithmetic is written for 32-bit ARM).
"""
from __future__ import annotations

from llvmlite import ir

from tether.codegen import call_list, threadpool
from tether.codegen.types import I8, PTR
from tether.target import Target

# The native thread pool (codegen/threadpool.py) is exported too: the runtime installs one module's
# tether_pool_launch as every module's launcher (docs/parallel.md "The native pool"). So is the call list
# (codegen/call_list.py), through which a graph executor runs its kernels in one native call.
EXPORTED_RUNTIME_SYMBOLS = (("tether_set_parallel_launcher", "__tether_metadata") + threadpool.EXPORTED_SYMBOLS
                            + call_list.EXPORTED_SYMBOLS)
MEMORY_FUNCTIONS = ("memcpy", "memmove", "memset")
# What LLVM calls on armv7 for integer division (without hardware divide) and 64-bit int <-> float conversions.
ARM_RUNTIME_FUNCTIONS = ("__aeabi_uidiv", "__aeabi_idiv", "__aeabi_uidivmod", "__aeabi_idivmod", "__aeabi_uldivmod",
                         "__aeabi_ldivmod", "__aeabi_l2d", "__aeabi_ul2d", "__aeabi_l2f", "__aeabi_ul2f",
                         "__aeabi_d2lz", "__aeabi_d2ulz", "__aeabi_f2lz", "__aeabi_f2ulz")
LAUNCHER_SLOT = "__tether_parallel_launcher"


def add_launcher_slot(module: ir.Module, target: Target, part: str) -> ir.GlobalVariable:
    """The launcher the runtime installs (docs/parallel.md); NULL means "run tasks serially". Across the parts of
    a module built in parts it is one hidden symbol, defined (with its setter) by the runtime part."""
    slot = ir.GlobalVariable(module, PTR, LAUNCHER_SLOT)
    slot.align = target.pointer_bytes
    if part == "kernels":
        # (llvmlite cannot print a hidden declaration; the hidden definition keeps it out of the exports)
        slot.linkage = "external"
        return slot
    slot.linkage = "internal" if part == "whole" else "hidden"
    slot.initializer = ir.Constant(PTR, None)
    setter = ir.Function(module, ir.FunctionType(ir.VoidType(), [PTR]), "tether_set_parallel_launcher")
    b = ir.IRBuilder(setter.append_basic_block("entry"))
    b.store(setter.args[0], slot, align=target.pointer_bytes)
    b.ret_void()
    return slot


def add_metadata_blob(module: ir.Module, blob: bytes) -> None:
    """``__tether_metadata``: the NUL-terminated metadata JSON in its own section (docs/abi.md)."""
    meta_ty = ir.ArrayType(I8, len(blob))
    meta = ir.GlobalVariable(module, meta_ty, "__tether_metadata")
    meta.initializer = ir.Constant(meta_ty, bytearray(blob))
    meta.global_constant = True
    meta.section = ".tether_meta"
    meta.align = 1


# A GPU module's device code (OpenCL C, SPIR-V, PTX): read by the runtime from this section of the file, never run
# on the CPU (docs/abi.md "GPU modules"). Exported, so --gc-sections keeps it and C users can find it.
DEVICE_CODE_SYMBOL = "__tether_device_code"
DEVICE_CODE_SECTION = ".tether_device"


def add_device_code_blob(module: ir.Module, code: bytes) -> None:
    """``__tether_device_code``: the device code bytes, read-only, in section ``.tether_device``."""
    ty = ir.ArrayType(I8, len(code))
    blob = ir.GlobalVariable(module, ty, DEVICE_CODE_SYMBOL)
    blob.initializer = ir.Constant(ty, bytearray(code))
    blob.global_constant = True
    blob.section = DEVICE_CODE_SECTION
    blob.align = 16     # (SPIR-V is a stream of 32-bit words)


def _forward_copy_ir(label: str, pred: str, sz: str) -> str:
    """The byte loop copying %n bytes from %s to %d upwards (memcpy, and memmove when %d <= %s)."""
    return """{label}:
  %i = phi {sz} [ 0, %{pred} ], [ %i1, %{label} ]
  %sp = getelementptr inbounds i8, ptr %s, {sz} %i
  %v = load i8, ptr %sp, align 1
  %dp = getelementptr inbounds i8, ptr %d, {sz} %i
  store i8 %v, ptr %dp, align 1
  %i1 = add nuw {sz} %i, 1
  %c = icmp ult {sz} %i1, %n
  br i1 %c, label %{label}, label %done
""".format(label=label, pred=pred, sz=sz)


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
{copy_loop}done:
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
{copy_floop}bloop:
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
""".format(sz=sz, attrs=attrs, copy_loop=_forward_copy_ir("loop", "entry", sz),
           copy_floop=_forward_copy_ir("floop", "pick", sz))


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


_U64_TO_F64 = """define internal double @tether.aeabi.u64_to_f64(i64 %x) nounwind "no-builtins" {
  %h = lshr i64 %x, 32
  %h32 = trunc i64 %h to i32
  %l32 = trunc i64 %x to i32
  %hd = uitofp i32 %h32 to double
  %ld = uitofp i32 %l32 to double
  %hs = fmul double %hd, 4294967296.0
  %r = fadd double %hs, %ld
  ret double %r
}"""

_U64_TO_F32 = """; u64 -> float with one correct rounding: above 2**53 the bits a double would drop are folded
; into a sticky bit (bit 11) first, so the double is exact and only the final float rounding happens.
define internal float @tether.aeabi.u64_to_f32(i64 %x) nounwind "no-builtins" {
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
}"""

_F64_TO_U64 = """; |d| -> u64 by truncation, for |d| < 2**64
; (larger values and NaN are undefined in C, as in compiler-rt).
define internal i64 @tether.aeabi.f64_to_u64(double %a) nounwind "no-builtins" {
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
}"""

# i64 -> float type: the unsigned helper on |x|, negated back for negative x.
_SIGNED_TO_FLOAT = """define weak hidden arm_aapcscc {fty} @__aeabi_l2{s}(i64 %x) {attrs} {{
  %neg = icmp slt i64 %x, 0
  %nx = sub i64 0, %x
  %ax = select i1 %neg, i64 %nx, i64 %x
  %{s} = call {fty} @tether.aeabi.u64_to_{helper}(i64 %ax)
  %n{s} = fneg {fty} %{s}
  %r = select i1 %neg, {fty} %n{s}, {fty} %{s}
  ret {fty} %r
}}"""
_UNSIGNED_TO_FLOAT = """define weak hidden arm_aapcscc {fty} @__aeabi_ul2{s}(i64 %x) {attrs} {{
  %r = call {fty} @tether.aeabi.u64_to_{helper}(i64 %x)
  ret {fty} %r
}}"""
_DOUBLE_TO_INT = """define weak hidden arm_aapcscc i64 @__aeabi_d2ulz(double %d) {attrs} {{
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
}}"""
# float -> i64: widened to double first (exact), then the double helper.
_FLOAT_TO_INT = """define weak hidden arm_aapcscc i64 @__aeabi_f2{kind}lz(float %f) {attrs} {{
  %d = fpext float %f to double
  %r = call arm_aapcscc i64 @__aeabi_d2{kind}lz(double %d)
  ret i64 %r
}}"""


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
    conversions = []
    for helper_ir, fty, s, helper in ((_U64_TO_F64, "double", "d", "f64"), (_U64_TO_F32, "float", "f", "f32")):
        conversions.append(helper_ir)
        for template in (_UNSIGNED_TO_FLOAT, _SIGNED_TO_FLOAT):
            conversions.append(template.format(fty=fty, s=s, helper=helper, attrs=attrs))
    conversions += [_F64_TO_U64, _DOUBLE_TO_INT.format(attrs=attrs)]
    conversions += [_FLOAT_TO_INT.format(kind=kind, attrs=attrs) for kind in ("u", "")]
    fns.append("\n" + "\n\n".join(conversions) + "\n")
    return "\n".join(fns) + "\n"
