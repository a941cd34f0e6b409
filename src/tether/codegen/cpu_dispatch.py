"""Kernels compiled twice and chosen when the module loads, from the CPU features the device reports.

A preset that covers CPUs with and without an extension (android-arm64: phones with and without the Armv8.2 dot
product, ``target.int8_load_time_features``) cannot assume it at build time. A kernel that would use the
extension (one with ``dot4`` of a kind it computes) is emitted twice, as ``NAME__base`` (the preset's own
instructions) and ``NAME__asimddp`` (its functions compiled with the extension: LLVM's "target-features"
attribute), and ``NAME__impl`` calls one of them on a bit of the module's CPU-features word:

- the word is ``tether_cpu_features`` (an exported i32, 0 at load: every kernel takes its base version);
- metadata ``"cpu_dispatch": ["asimddp", ...]`` names its bits, lowest first;
- the device runtime (tether_rpc.module.load_module, with tether_rpc.cpu_features.dispatch_word) sets bit i when
  the CPU reports feature i, after dlopen and before any call (docs/abi.md "CPU dispatch").

A runtime that does not know the word leaves it 0, which is always safe.
"""
from __future__ import annotations

from typing import Any, Callable, ContextManager, Optional, Tuple

from llvmlite import ir

from tether.codegen.types import I32
from tether.scoped import attribute_set
from tether.target import Target, int8_load_time_features
from tether.tir import PrimFunc, Store, dot4_kind, walk

WORD = "tether_cpu_features"
# feature -> the dot4 kinds its version computes natively
_KINDS = {"asimddp": ("s8s8", "u8u8")}
_LLVM_ATTR = {"asimddp": "+dotprod"}   # feature -> what the version's functions are compiled with


def features(target: Target) -> Tuple[str, ...]:
    """The bits of the CPU-features word of a module for ``target`` (empty: no dispatch, no word)."""
    return int8_load_time_features(target)


def add_word(module: ir.Module, target: Target, part: str) -> Optional[ir.GlobalVariable]:
    """The CPU-features word, for a target with load-time features: defined (exported) by a whole module or the
    runtime part of a module built in parts, declared by a kernels part."""
    if not features(target):
        return None
    word = ir.GlobalVariable(module, I32, WORD)
    word.align = 4
    if part == "kernels":
        word.linkage = "external"
        return word
    word.initializer = ir.Constant(I32, 0)
    return word


def _wanted(target: Target, primfunc: PrimFunc) -> Tuple[str, ...]:
    # (walk yields statements only; a dot4 is an expression a Store computes)
    kinds = {dot4_kind(e) for st in walk(primfunc.body) if isinstance(st, Store) for e in walk(st.value)} - {None}
    return tuple(f for f in features(target) if kinds & set(_KINDS.get(f, ())))


def variant(ctx: Any, feature: Optional[str]) -> ContextManager[None]:
    """While emitting the version of a kernel for ``feature`` (codegen/int8dot.py reads ``ctx.cpu_variant``)."""
    return attribute_set(ctx, "cpu_variant", feature)


def emit(ctx: Any, primfunc: PrimFunc, emit_one: Callable[[Any, PrimFunc], ir.Function]) -> Optional[ir.Function]:
    """``NAME__impl`` dispatching between the versions of ``primfunc``, or None when it needs no dispatch."""
    wanted = _wanted(ctx.target, primfunc)
    if not wanted:
        return None
    bits = features(ctx.target)
    feature = wanted[0]

    def version(suffix: str, feat: Optional[str]) -> ir.Function:
        pf = PrimFunc("%s__%s" % (primfunc.name, suffix), primfunc.params, primfunc.param_buffers, primfunc.body)
        with variant(ctx, feat):
            fn = emit_one(ctx, pf)
        if feat is not None:
            # the version's functions (impl, parallel tasks) compile for the target plus the feature; LLVM
            # inlines nothing of them into code without it
            attr = '"target-features"="%s"' % ",".join(x for x in (ctx.target.features, _LLVM_ATTR[feat]) if x)
            for f in ctx.module.functions:
                if not f.is_declaration and (f is fn or f.name.startswith(pf.name + "__")):
                    set.add(f.attributes, attr)   # (llvmlite's add() knows only the keyword attributes)
        return fn

    base = version("base", None)
    fast = version(feature, feature)
    fn = ir.Function(ctx.module, base.function_type, "%s__impl" % primfunc.name)
    fn.attributes.add("nounwind")
    fn.attributes.add("noinline")
    for a in fn.args:
        a.add_attribute("noalias")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    word = b.load(ctx.module.get_global(WORD), align=4)
    on = b.icmp_unsigned("!=", b.and_(word, ir.Constant(I32, 1 << bits.index(feature))), ir.Constant(I32, 0))
    fast_bb, base_bb = fn.append_basic_block("fast"), fn.append_basic_block("base")
    b.cbranch(on, fast_bb, base_bb)
    for bb, callee in ((fast_bb, fast), (base_bb, base)):
        b.position_at_end(bb)
        b.ret(b.call(callee, list(fn.args)))
    return fn

