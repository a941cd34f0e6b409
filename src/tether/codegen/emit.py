"""LLVM IR text -> optimised object code and assembly for a Target, via llvmlite's new pass manager."""
from __future__ import annotations

import dataclasses
import logging
import re
import time
from typing import Any, Optional, Tuple

from tether.codegen import objcache
from tether.errors import CompileError
from tether.target import Target, as_target

log = logging.getLogger(__name__)


@dataclasses.dataclass
class CompiledObject:
    """One compiled module: the object file, the optimised IR, and the assembly (rendered on first use)."""

    object_bytes: bytes
    optimized_ir: str
    target: Target
    opt: int
    seconds: float
    _asm: Optional[str] = None
    # a module compiled in parts (driver.build): one object merged from these, each with its own IR and assembly
    parts: Tuple["CompiledObject", ...] = ()

    @property
    def asm(self) -> str:
        if self._asm is None:
            if self.parts:
                self._asm = "\n".join(p.asm for p in self.parts)
            else:
                self._asm = _emit_asm(self.optimized_ir, self.target, self.opt)
        return self._asm


def _ir_context(ir_text: str, message: str, radius: int = 3) -> str:
    """The lines of IR around the first "<line>:<col>" an LLVM message mentions."""
    m = re.search(r":(\d+):(\d+):", message)
    if not m:
        return ""
    line = int(m.group(1))
    lines = ir_text.splitlines()
    lo, hi = max(1, line - radius), min(len(lines), line + radius)
    return "\n".join("%s%5d | %s" % (">" if k == line else " ", k, lines[k - 1]) for k in range(lo, hi + 1))


def _parse(ir_text: str, target: Target) -> Any:
    import llvmlite.binding as llvm

    try:
        mod = llvm.parse_assembly(ir_text)
        mod.verify()
    except RuntimeError as exc:
        msg = str(exc).strip()
        ctx = _ir_context(ir_text, msg)
        raise CompileError("LLVM rejected the generated IR for %s: %s%s" % (target, msg, "\n" + ctx if ctx else ""))\
            from None
    return mod


def _emit_asm(ir_text: str, target: Target, opt: int) -> str:
    mod = _parse(ir_text, target)
    return target.target_machine(opt).emit_assembly(mod)


# How many memory defs dead-store elimination walks past per store (LLVM's default: 90). A kernel's unrolled
# write-back is hundreds of stores to distinct addresses, none dead, and the default walk spent up to 0.4 s of
# -O3 per kernel proving so; at 20 every kernel of mobilevit_xs, wav2vec2 and efficientnet_b0 optimises to the
# same IR, 10% sooner.
DSE_WALK_LIMIT = 20
_llvm_options_set = False


def _set_llvm_options() -> None:
    """LLVM's command-line options are per process (build workers included): set once, before the first pass."""
    global _llvm_options_set
    if not _llvm_options_set:
        import llvmlite.binding as llvm

        llvm.set_option("tether", "-dse-memoryssa-walklimit=%d" % DSE_WALK_LIMIT)
        _llvm_options_set = True


def optimize(mod: Any, target: Target, opt: int = 3) -> None:
    """Run the standard -O<opt> pipeline (with loop and SLP vectorisation) on a parsed module, in place."""
    import llvmlite.binding as llvm

    if opt <= 0:
        return
    _set_llvm_options()
    tm = target.target_machine(opt)
    pto = llvm.create_pipeline_tuning_options(speed_level=min(int(opt), 3))
    pto.loop_vectorization = True
    pto.slp_vectorization = True
    pto.loop_unrolling = True
    pb = llvm.create_pass_builder(tm, pto)
    try:
        mpm = pb.getModulePassManager()
        mpm.run(mod, pb)
    finally:
        pb.close()


def compile_module(ir_text: str, target: Any, opt: int = 3) -> CompiledObject:
    """Parse, verify, optimise and emit an object file; the assembly is produced only if someone asks."""
    target = as_target(target)
    t0 = time.perf_counter()
    # ---- the persistent object cache (codegen/objcache.py): an identical module is compiled once per machine
    # (wasm32: the always-on features are not in the target's string, so they are named here)
    cache_key = objcache.key(ir_text, str(target) + (" " + target.llvm_features if target.is_wasm else ""), opt)
    cached = objcache.load(cache_key)
    if cached is not None:
        dt = time.perf_counter() - t0
        log.debug("object cache hit for %d bytes of IR for %s (%.3fs)", len(ir_text), target, dt)
        return CompiledObject(object_bytes=cached[0], optimized_ir=cached[1], target=target, opt=opt, seconds=dt)
    mod = _parse(ir_text, target)
    tm = target.target_machine(opt)
    mod.triple = target.triple
    mod.data_layout = str(tm.target_data)
    try:
        optimize(mod, target, opt)
        optimized = str(mod)
        obj = tm.emit_object(mod)
    except RuntimeError as exc:
        raise CompileError("LLVM failed to compile module for %s: %s" % (target, exc)) from None
    objcache.store(cache_key, bytes(obj), optimized)
    dt = time.perf_counter() - t0
    log.debug("compiled %d bytes of IR for %s in %.3fs", len(ir_text), target, dt)
    return CompiledObject(object_bytes=bytes(obj), optimized_ir=optimized, target=target, opt=opt, seconds=dt)


def compile_ir(ir_text: str, target: Any, opt: int = 3) -> Tuple[bytes, str]:
    """The design.md contract: IR text -> (object bytes, assembly text)."""
    compiled = compile_module(ir_text, target, opt)
    return compiled.object_bytes, compiled.asm
