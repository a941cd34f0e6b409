"""The LLVM module around generated kernels: ``ModuleBuilder`` collects impl functions (codegen/function.py),
wraps each in the packed ABI (codegen/packed.py), adds the runtime IR (codegen/runtime.py) and returns the text.
"""
from __future__ import annotations

import functools
import json
import logging
import re
from typing import Any, Dict, List, Optional, Sequence

from llvmlite import ir

from tether.codegen import call_list, cpu_dispatch, hostcall, mathlib, threadpool
from tether.codegen.packed import ARG_CHECKER, ARG_CHECKER_IR, WrapperWriter
from tether.codegen.runtime import (ARM_RUNTIME_FUNCTIONS, DEVICE_CODE_SYMBOL, EXPORTED_RUNTIME_SYMBOLS,
                                    MEMORY_FUNCTIONS, add_device_code_blob, add_launcher_slot, add_metadata_blob,
                                    arm_runtime_ir, memory_functions_ir)
from tether.codegen.types import I32, PTR, dtype_word
from tether.errors import CompileError
from tether.target import Target, as_target
from tether.version import __version__

log = logging.getLogger(__name__)

# metadata "abi_version": the packed ABI of docs/abi.md
ABI_VERSION = 1

_C_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_RESERVED = set(EXPORTED_RUNTIME_SYMBOLS) | set(MEMORY_FUNCTIONS)


@functools.lru_cache(maxsize=2)
def _declarations(armv7: bool) -> "re.Pattern[str]":
    """The declarations _finish_text replaces with definitions: memory functions, the ARM runtime's (armv7),
    the argument checker."""
    names = MEMORY_FUNCTIONS + (ARM_RUNTIME_FUNCTIONS if armv7 else ()) + (ARG_CHECKER,)
    return re.compile(r'^declare [^\n]*@"?(%s)"?\([^\n]*\n' % "|".join(re.escape(n) for n in names), flags=re.M)


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
        self._device: Optional[Dict[str, Any]] = None     # a GPU module's metadata "device" (add_device)

        # wasm32 modules are single-threaded: parallel loops run serially in the impl, with no launcher to call
        # (docs/web.md "The module")
        self.parallel_launch_slot = None if self.target.is_wasm else add_launcher_slot(self.module, self.target,
                                                                                        part)
        # the CPU-features word of kernels chosen at load time (codegen/cpu_dispatch.py), None for most targets
        self.cpu_dispatch_word = cpu_dispatch.add_word(self.module, self.target, part)

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
        WrapperWriter(fn).write(args_meta, impl_fn)
        # (a wasm32 module runs every loop in the calling thread)
        parallel = False if self.target.is_wasm else getattr(primfunc, "parallel", None)
        self._functions.append({"name": name, "args": args_meta, "parallel": parallel})
        self._impls[name] = impl_fn
        return fn

    def add_metadata(self, entries: Sequence[Dict[str, Any]]) -> None:
        """A runtime part lists the functions its kernels parts define (their ``function_entries()``)."""
        if self.part != "runtime":
            raise CompileError("add_metadata is for the runtime part of a module built in parts")
        self._functions.extend(dict(e) for e in entries)

    def add_device(self, device: Dict[str, Any], code: bytes) -> None:
        """Make this a GPU module (tether.gpu_build): ``device`` becomes metadata "device" and ``code`` the
        exported read-only ``__tether_device_code`` in its own section (docs/abi.md "GPU modules"). A GPU module
        may have no CPU functions."""
        if self.part != "whole" or self._device is not None or self.target.is_wasm:
            raise CompileError("module %r: device code goes once into a whole ELF module" % self.name)
        self._device = dict(device)
        add_device_code_blob(self.module, bytes(code))

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
        if not self._functions and self._device is None:
            raise CompileError("module %r has no functions; call add_packed() first" % self.name)

        self.function_entries()
        if self.part == "kernels":
            return self._finish_text(set(self.function_names), runtime=False)
        # "parallel_tasks": "chunked": every task function (codegen/parallel.py _make_task) runs chunk task_id of
        # num_tasks balanced chunks of its loop for ANY num_tasks >= 1, so the runtime may run a whole loop as one
        # task (docs/abi.md "Parallel loops", docs/parallel.md). "thread_pool": the version of the native pool
        # protocol this module exports (codegen/threadpool.py). "call_list": the version of tether_run_calls
        # (codegen/call_list.py).
        self.metadata = {"abi_version": ABI_VERSION, "tether_version": __version__,
                         "target": self.target.to_dict(),
                         "requires": self.target.requirements(), "functions": self._functions}
        if not self.target.is_wasm:   # (wasm32: no launcher, no pool)
            self.metadata.update({"parallel_tasks": "chunked", "thread_pool": threadpool.POOL_VERSION,
                                  "call_list": call_list.CALL_LIST_VERSION})
        if self.cpu_dispatch_word is not None:   # the word's bits, set by the runtime at load
            self.metadata["cpu_dispatch"] = list(cpu_dispatch.features(self.target))
        if self._device is not None:
            self.metadata["device"] = self._device
        host = hostcall.host_functions(self)  # names resolved by the runtime at load (docs/abi.md "Host callbacks")
        if host:
            self.metadata["host_functions"] = list(host)
        own = set() if self.part == "runtime" else set(self.function_names)
        if self.target.is_wasm:
            # The metadata goes into the custom section "tether_meta" when the module is linked (link.link_wasm),
            # not into linear memory; the exports are the packed functions (and the linker's memory, __heap_base).
            return self._finish_text(own, runtime=False)
        blob = json.dumps(self.metadata, separators=(",", ":"), sort_keys=False).encode("utf-8") + b"\0"
        add_metadata_blob(self.module, blob)
        exported = own | set(EXPORTED_RUNTIME_SYMBOLS) | ({hostcall.HOST_CALLER_SETTER} if host else set())
        if self.cpu_dispatch_word is not None:
            exported.add(cpu_dispatch.WORD)
        if self._device is not None:
            exported.add(DEVICE_CODE_SYMBOL)
        return self._finish_text(exported, runtime=True)

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
        # (One pass over the text for all the names: a part's text is megabytes.)
        dropped: set = set()

        def drop(m: "re.Match[str]") -> str:
            dropped.add(m.group(1))
            return ""
        text = _declarations(self.target.arch == "armv7").sub(drop, text)
        has_checker = ARG_CHECKER in dropped
        self._text = text + memory_functions_ir(self.target) + (ARG_CHECKER_IR if has_checker else "")
        if runtime:
            self._text += threadpool.thread_pool_ir(self.target) + call_list.call_list_ir(self.target)
        if self.target.arch == "armv7":
            self._text += arm_runtime_ir()
        return self._text

    def _uses_launcher(self, name: str) -> bool:
        """Whether the impl (or a function it reaches) loads the parallel launcher slot."""
        if self.parallel_launch_slot is None:
            return False
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
