"""PTX for CUDA: DeviceKernels (tether.tir.device) -> LLVM IR for ``nvptx64-nvidia-cuda`` -> PTX text, through
llvmlite's NVPTX backend. The CUDA driver JIT-compiles the text for the GPU it runs on (tether_rpc/gpu/cuda.py).

The kernel bodies are emitted by the CPU backend's own emitters (codegen/function.py, codegen/expr.py), a few
rows of their tables changed: so every expression means on the GPU exactly what it means on the CPU (floor
division, casts, selects that evaluate a faulting arm only where it is chosen, float16 storage) without a second
emitter to keep in step. What differs for a GPU:

- a kernel is ``void @NAME(ptr addrspace(1) p0, ..., i32 s0, ...)``: the ``params`` buffers as global pointers,
  then the int32 ``scalars`` (the launch order of tether.tir.device), marked a kernel in ``!nvvm.annotations``
  with ``reqntid`` = its block (the launch always uses exactly that block, and ptxas may plan registers for it);
- thread indices are reads of ``%ctaid``/``%tid`` (llvm.nvvm.read.ptx.sreg.*), known to lie in [0, extent), which
  lets the index arithmetic use unsigned division as it does for loop variables on the CPU;
- "shared" buffers are addrspace(3) globals (PTX ``.shared``), "local" ones allocas (registers or local memory),
  a Barrier is ``llvm.nvvm.barrier0`` (``bar.sync 0``);
- vectorized loops are unrolled (each GPU thread is already one lane), parallel loops run serially, a thread
  loop left in a body is refused;
- math comes from codegen/mathlib.py, which is branch-free IR with no library calls, so nothing needs libdevice
  (NVPTX has no libm); floor/ceil/round_even and sqrt are single instructions (cvt.rmi/rpi/rni, sqrt.rn).
  Host callbacks (PackedCall) and the int8 dot product are refused.

Only the LLVM the installed llvmlite carries is needed; ``ptxas`` (pip ``nvidia-cuda-nvcc-cu12``) assembles the
result in tests/test_gpu_ptx.py, and no NVIDIA GPU is needed to build.
"""
from __future__ import annotations

import re
from typing import Any, List, Sequence

from llvmlite import ir

from tether.codegen import mathlib
from tether.codegen.expr import ExprEmitter
from tether.codegen.function import FunctionEmitter, check_index_range
from tether.codegen.types import I32, elem_bytes, mem_type
from tether.errors import CompileError, UnsupportedOpError
from tether.tir import Allocate, Call, PackedCall, dot4_kind
from tether.tir.device import THREAD_TAGS, Barrier, DeviceKernel, tag_dim

TRIPLE = "nvptx64-nvidia-cuda"
GLOBAL, SHARED = 1, 3    # NVPTX address spaces
GLOBAL_PTR, SHARED_PTR = ir.PointerType(addrspace=GLOBAL), ir.PointerType(addrspace=SHARED)
_ARCH = re.compile(r"^sm_([1-9][0-9]+)[af]?$")
_C_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SREG = {"blockIdx": "ctaid", "threadIdx": "tid"}
# CUDA's limits on one launch (every GPU since compute capability 2.0)
MAX_THREADS_PER_BLOCK = 1024
MAX_BLOCK = (1024, 1024, 64)
MAX_GRID = (2 ** 31 - 1, 65535, 65535)
MAX_STATIC_SHARED = 48 * 1024   # more needs dynamic shared memory and an opt-in per kernel


class _MathTarget:
    """What codegen/mathlib.py asks of a target: NVPTX rounds natively (cvt.rmi, cvt.rpi, cvt.rni)."""

    native_rounding = True


class _KernelContext:
    """The ``ctx`` the CPU emitters use, for one PTX module: no thread pool (a GPU thread runs no parallel loop),
    no fast math (the CPU's default rounding), math from mathlib."""

    target = _MathTarget()
    fast_math = False
    parallel_launch_slot = None

    def __init__(self, module: ir.Module) -> None:
        self.module = module
        self.kernel = "?"

    def math(self, name: str, ty: ir.Type) -> ir.Function:
        try:
            return mathlib.get(self.module, name, ty, target=self.target)
        except UnsupportedOpError as exc:
            raise UnsupportedOpError("ptx: kernel %r: %s" % (self.kernel, exc)) from None


class KernelEmitter(FunctionEmitter):
    """FunctionEmitter for the body of one GPU kernel (the rows of its tables that differ are below)."""

    def device_allocate(self, s: Allocate) -> None:
        buf = s.buffer
        check_index_range(self.name, buf)
        ety = mem_type(buf.dtype)
        if buf.scope == "shared":
            ty = ir.ArrayType(ety, buf.size)
            name = "%s_%s_%d" % (self.name, _ident(buf.name), self.counter[0])
            self.counter[0] += 1
            gv = ir.GlobalVariable(self.ctx.module, ty, name, addrspace=SHARED)
            gv.linkage = "internal"
            gv.initializer = ir.Constant(ty, ir.Undefined)   # .shared memory cannot be initialised
            gv.align = max(elem_bytes(buf.dtype), 16)
            gv.type = SHARED_PTR   # an opaque pointer like the others (llvmlite types globals as typed pointers)
            ptr: ir.Value = gv
        elif buf.scope == "local":
            ptr = self.alloca(ety, buf.size, buf.name, max(elem_bytes(buf.dtype), 4))
        else:
            raise CompileError("ptx: kernel %r allocates buffer %r in scope %r; expected \"shared\" or \"local\""
                               % (self.name, buf.name, buf.scope))
        self.bufs[buf] = ptr
        self.stmt(s.body)
        del self.bufs[buf]

    def barrier(self, s: Barrier) -> None:
        module = self.ctx.module
        fn = module.globals.get("llvm.nvvm.barrier0")
        if fn is None:
            fn = ir.Function(module, ir.FunctionType(ir.VoidType(), []), "llvm.nvvm.barrier0")
        self.b.call(fn, [])

    def thread_loop(self, s: Any) -> bool:
        raise CompileError("ptx: kernel %r still has the thread loop over %r (%s): a DeviceKernel's thread loops "
                           "become its thread indices" % (self.name, s.var.name, getattr(s, "thread_tag", "?")))

    def device_call(self, e: Call) -> ir.Value:
        if dot4_kind(e) is not None:
            raise UnsupportedOpError("ptx: kernel %r: the int8 dot product %s has no PTX lowering yet"
                                     % (self.name, e.name))
        return ExprEmitter.call(self, e)

    def packed_call(self, e: PackedCall) -> ir.Value:
        raise UnsupportedOpError("ptx: kernel %r calls the host function %r; a GPU kernel cannot call the host"
                                 % (self.name, e.name))


KernelEmitter.stmt_emitters = dict(FunctionEmitter.stmt_emitters)
KernelEmitter.stmt_emitters.update({Allocate: KernelEmitter.device_allocate, Barrier: KernelEmitter.barrier})
# "parallel" is absent: a serial loop. Why unrolled for "vectorized": the CPU's vector code gathers through
# vectors of generic pointers, which address spaces do not allow; a GPU thread is already one lane.
KernelEmitter.loop_emitters = {"vectorized": FunctionEmitter.unrolled_loop, "unrolled": FunctionEmitter.unrolled_loop,
                               "thread": KernelEmitter.thread_loop}
KernelEmitter.expr_emitters = dict(ExprEmitter.expr_emitters)
KernelEmitter.expr_emitters.update({Call: KernelEmitter.device_call, PackedCall: KernelEmitter.packed_call})


def _ident(name: str) -> str:
    return "".join(ch if ch.isalnum() else "_" for ch in name)


def _check_launch(k: DeviceKernel) -> None:
    dims = [("block", k.block, MAX_BLOCK), ("grid", k.grid, MAX_GRID)]
    for what, got, limit in dims:
        if len(got) != 3 or any(not 1 <= g <= m for g, m in zip(got, limit)):
            raise CompileError("ptx: kernel %r: %s %s is outside CUDA's limits; expected 3 sizes, each from 1 to %s"
                               % (k.name, what, tuple(got), tuple(limit)))
    if k.threads_per_block > MAX_THREADS_PER_BLOCK:
        raise CompileError("ptx: kernel %r: block %s has %d threads; CUDA allows at most %d"
                           % (k.name, k.block, k.threads_per_block, MAX_THREADS_PER_BLOCK))
    if k.shared_bytes() > MAX_STATIC_SHARED:
        raise CompileError("ptx: kernel %r allocates %d bytes of shared memory; a kernel's static .shared memory "
                           "is at most 48 KiB" % (k.name, k.shared_bytes()))


def _sreg(module: ir.Module, tag: str) -> ir.Function:
    kind, _, dim = tag.partition(".")
    name = "llvm.nvvm.read.ptx.sreg.%s.%s" % (_SREG[kind], dim)
    fn = module.globals.get(name)
    if fn is None:
        fn = ir.Function(module, ir.FunctionType(I32, []), name)
    return fn


def _emit_kernel(ctx: _KernelContext, k: DeviceKernel) -> ir.Function:
    if not _C_IDENT.match(k.name) or k.name.startswith("llvm"):
        raise CompileError("ptx: kernel name %r is not usable as a PTX entry name; expected a C identifier"
                           % (k.name,))
    _check_launch(k)
    for buf in k.params:
        check_index_range(k.name, buf)
    for v in k.scalars:
        if v.dtype != "int32":
            raise CompileError("ptx: kernel %r: scalar %r is %s; launch scalars are int32" % (k.name, v.name, v.dtype))
    module = ctx.module
    ctx.kernel = k.name
    fnty = ir.FunctionType(ir.VoidType(), [GLOBAL_PTR] * len(k.params) + [I32] * len(k.scalars))
    fn = ir.Function(module, fnty, k.name)
    fn.attributes.add("nounwind")
    em = KernelEmitter(ctx, fn, k.name, [0])
    em.bind_buffers(fn.args[:len(k.params)], k.params)
    for arg, var in zip(fn.args[len(k.params):], k.scalars):
        arg.name = "s_" + _ident(var.name)
        em.env[var] = arg
    for var, tag in k.thread_of.items():
        if tag not in THREAD_TAGS:
            raise CompileError("ptx: kernel %r: %r is bound to %r; expected one of %s"
                               % (k.name, var.name, tag, ", ".join(THREAD_TAGS)))
        em.env[var] = em.b.call(_sreg(module, tag), [], name=_ident(tag))
        extent = (k.grid if tag.startswith("blockIdx") else k.block)[tag_dim(tag)]
        em.ranges[var] = (0, extent - 1)   # proves indices non-negative and loads in bounds, as loop ranges do
    em.stmt(k.body)
    em.b.ret_void()
    em.seal()
    # Marked through !nvvm.annotations, which every LLVM since NVPTX began reads (newer ones turn it into the
    # ptx_kernel calling convention and "nvvm.reqntid" attributes when they parse the module).
    for key, value in [("kernel", 1)] + [("reqntid" + "xyz"[d], k.block[d]) for d in range(3)]:
        module.add_named_metadata("nvvm.annotations", [fn, ir.MetaDataString(module, key), ir.Constant(I32, value)])
    return fn


def _check_arch(arch: str) -> None:
    m = _ARCH.match(arch) if isinstance(arch, str) else None
    if m is None:
        raise CompileError("ptx: arch %r is not a CUDA architecture; expected sm_XX, e.g. sm_80" % (arch,))
    if int(m.group(1)) < 50:
        raise CompileError("ptx: arch %r predates sm_50, the oldest architecture CUDA 12 builds for" % (arch,))


_LLVM_READY = False


def _target_machine(arch: str, opt: int) -> Any:
    global _LLVM_READY
    import llvmlite.binding as llvm

    if not _LLVM_READY:
        llvm.initialize_all_targets()
        llvm.initialize_all_asmprinters()
        _LLVM_READY = True
    return llvm.Target.from_triple(TRIPLE).create_target_machine(cpu=arch, opt=opt)


def kernel_ir(kernels: Sequence[DeviceKernel], arch: str = "sm_80") -> str:
    """The LLVM IR (text, unoptimised) of ``kernels`` for NVPTX: one module, one entry function per kernel."""
    _check_arch(arch)
    if not kernels:
        raise CompileError("ptx: no kernels to compile")
    names = [k.name for k in kernels]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise CompileError("ptx: kernel names must be unique in a module; repeated: %s" % ", ".join(dup))
    module = ir.Module(name="tether_ptx")
    module.triple = TRIPLE
    module.data_layout = str(_target_machine(arch, 3).target_data)
    ctx = _KernelContext(module)
    for k in kernels:
        _emit_kernel(ctx, k)
    return str(module)


def ptx_module(kernels: List[DeviceKernel], arch: str = "sm_80", opt: int = 3) -> str:
    """PTX text of ``kernels`` for CUDA architecture ``arch`` (``.target arch``, the PTX ISA version LLVM picks
    for it); entry names are the kernels' names, parameters in their launch order."""
    import llvmlite.binding as llvm

    text = kernel_ir(kernels, arch)
    tm = _target_machine(arch, opt)
    try:
        mod = llvm.parse_assembly(text)
        mod.verify()
    except RuntimeError as exc:
        raise CompileError("ptx: LLVM rejected the generated IR: %s" % str(exc).strip()) from None
    if opt > 0:
        pto = llvm.create_pipeline_tuning_options(speed_level=min(int(opt), 3))
        pb = llvm.create_pass_builder(tm, pto)
        try:
            pb.getModulePassManager().run(mod, pb)
        finally:
            pb.close()
    try:
        ptx = tm.emit_assembly(mod)
    except RuntimeError as exc:
        raise CompileError("ptx: LLVM's NVPTX backend failed: %s" % str(exc).strip()) from None
    if re.search(r"^\.version 3\.2$", ptx, re.M):
        # For a processor name it does not know LLVM only warns, and writes PTX ISA 3.2, which no architecture
        # from sm_50 on gets
        raise CompileError("ptx: LLVM's NVPTX backend does not know the architecture %r" % (arch,))
    return ptx


__all__ = ["TRIPLE", "KernelEmitter", "kernel_ir", "ptx_module"]
