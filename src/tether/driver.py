"""tether.build / tether.lower: schedule -> loop IR -> LLVM -> object code, wrapped in a Module artifact.

    tether.lower(s, [A, B, C])                                   # tir.PrimFunc, prints readable loop IR
    lib = tether.build(s, [A, B, C], target="rasp4b", name="vadd")
    lib = tether.build([(s1, [A, B], "f"), (s2, [X, Y], "g")], target="rasp4b", name="both")
"""
from __future__ import annotations

import logging
import time
from typing import Any, List, Optional, Sequence, Union

from tether.artifact import Module
from tether.codegen.emit import compile_module
from tether.codegen.module import ModuleBuilder
from tether.errors import CompileError
from tether.target import Target, as_target

log = logging.getLogger(__name__)


def lower(sch: Any, args: Sequence[Any], name: str = "default") -> Any:
    """Lower a schedule to a ``tether.tir.PrimFunc`` (``print()`` it to read the loop IR)."""
    from tether.lowering import lower as _lower

    return _lower(sch, list(args), name)


def _is_primfunc(obj: Any) -> bool:
    return hasattr(obj, "params") and hasattr(obj, "name") and not isinstance(obj, (tuple, list))


def _primfuncs(sch_or_funcs: Any, args: Optional[Sequence[Any]], name: str) -> List[Any]:
    """Normalise build's first two arguments into a list of PrimFuncs."""
    if _is_primfunc(sch_or_funcs):
        return [sch_or_funcs]
    if isinstance(sch_or_funcs, (list, tuple)) and sch_or_funcs and args is None:
        out = []
        for item in sch_or_funcs:
            if _is_primfunc(item):
                out.append(item)
            elif isinstance(item, (list, tuple)) and len(item) == 3:
                s, a, n = item
                out.append(lower(s, a, n))
            else:
                raise CompileError("build() takes a schedule and its args, a PrimFunc, or a list of PrimFuncs / "
                                   "(schedule, args, name) triples; got an item %r" % (item,))
        return out
    if args is None:
        raise CompileError("build(schedule, args, ...): the tensors to pass (inputs then outputs) are missing")
    return [lower(sch_or_funcs, args, name)]


def build(sch_or_funcs: Any, args: Optional[Sequence[Any]] = None, target: Union[str, Target] = "host",
          name: str = "default", fast_math: bool = False, opt: int = 3) -> Module:
    """Compile a schedule (or PrimFuncs) for ``target`` into a Module artifact; see ``Module.export_library``."""
    from tether.codegen.llvm import emit_function

    tgt = as_target(target)
    t0 = time.perf_counter()
    funcs = _primfuncs(sch_or_funcs, args, name)
    t_lower = time.perf_counter() - t0
    mb = ModuleBuilder(tgt, name, fast_math=fast_math)
    for pf in funcs:
        impl = emit_function(mb, pf)
        mb.add_packed(pf, impl)
    ir_text = mb.finish()
    t_codegen = time.perf_counter() - t0 - t_lower
    compiled = compile_module(ir_text, tgt, opt=opt)
    log.info("built %s for %s: lower %.3fs, codegen %.3fs, llvm %.3fs", [f.name for f in funcs],
             tgt.preset or tgt.triple, t_lower, t_codegen, compiled.seconds)
    assert mb.metadata is not None
    return Module(name, tgt, ir_text, compiled, mb.metadata)


def build_ir(ir_builder: ModuleBuilder, opt: int = 3) -> Module:
    """Compile a ModuleBuilder whose impl functions were written by hand (tests, custom kernels)."""
    ir_text = ir_builder.finish()
    compiled = compile_module(ir_text, ir_builder.target, opt=opt)
    assert ir_builder.metadata is not None
    return Module(ir_builder.name, ir_builder.target, ir_text, compiled, ir_builder.metadata)
