"""The compiled Module artifact that tether.build returns: export it as a shared library, object, archive, header.

    lib = tether.build(s, [A, B, C], target="rasp4b", name="vadd")
    lib.export_library("vadd.so")       # self-contained ELF shared object for the target
    lib.get_source("asm")               # or "ll" (as generated), "ll-opt" (after -O3)
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from typing import Any, Dict, List, Optional

from tether import link
from tether.codegen.emit import CompiledObject
from tether.codegen.runtime import EXPORTED_RUNTIME_SYMBOLS, MEMORY_FUNCTIONS
from tether.errors import TetherError
from tether.target import Target

log = logging.getLogger(__name__)

HEADER_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "include", "tether_module.h")


def abi_header() -> str:
    """The generic ABI header (tether_module.h) as text."""
    with open(HEADER_PATH, encoding="utf-8") as f:
        return f.read()


class Module:
    """One compiled module: its IR, object code, metadata and target."""

    def __init__(self, name: str, target: Target, ir_text: str, compiled: CompiledObject,
                 metadata: Dict[str, Any]) -> None:
        self.name = name
        self.target = target
        self.ir_text = ir_text
        self.compiled = compiled
        self.metadata = metadata

    @property
    def function_names(self) -> List[str]:
        return [f["name"] for f in self.metadata["functions"]]

    @property
    def object_bytes(self) -> bytes:
        return self.compiled.object_bytes

    @property
    def compile_seconds(self) -> float:
        return self.compiled.seconds

    def __repr__(self) -> str:
        return "<tether.Module %r for %s: %s>" % (self.name, self.target.preset or self.target.triple,
                                                 ", ".join(self.function_names))

    # ---- sources --------------------------------------------------------------------------------------------
    def get_source(self, fmt: str = "ll") -> str:
        """"ll": LLVM IR as generated; "ll-opt": after the O3 pipeline; "asm": target assembly;
        "meta"/"json": the metadata JSON."""
        sources = {"ll": lambda: self.ir_text, "ll-opt": lambda: self.compiled.optimized_ir,
                   "asm": lambda: self.compiled.asm, "s": lambda: self.compiled.asm,
                   "meta": lambda: json.dumps(self.metadata, indent=2),
                   "json": lambda: json.dumps(self.metadata, indent=2)}
        if fmt not in sources:
            raise ValueError("unknown source format %r; use one of %s" % (fmt, ", ".join(sources)))
        return sources[fmt]()

    # ---- exports --------------------------------------------------------------------------------------------
    def export_library(self, path: str, soname: Optional[str] = None) -> str:
        """Write a self-contained shared object (no DT_NEEDED, no undefined symbols) to ``path``; for wasm32 a
        WebAssembly module with no imports and its metadata in the custom section "tether_meta" (docs/web.md)."""
        if self.target.is_wasm:
            meta = json.dumps(self.metadata, separators=(",", ":")).encode("utf-8")
            out = link.link_wasm([self.object_bytes], self.target, os.fspath(path), self.function_names, meta)
            log.info("wrote %s (%s, %d bytes)", out, self.target.preset or self.target.triple, os.path.getsize(out))
            return out
        out = link.link_shared([self.object_bytes], self.target, os.fspath(path), soname=soname)
        log.info("wrote %s (%s, %d bytes)", out, self.target.preset or self.target.triple, os.path.getsize(out))
        return out

    def export_object(self, path: str) -> str:
        """Write the relocatable object file (PIC), for linking into C programs."""
        return link.write_object(self.object_bytes, os.fspath(path))

    @property
    def defined_symbols(self) -> List[str]:
        """Global symbols the object defines (exported ones plus the hidden weak memory functions)."""
        return self.function_names + list(EXPORTED_RUNTIME_SYMBOLS) + list(MEMORY_FUNCTIONS)

    def export_static(self, path: str) -> str:
        """Write a static archive (.a) holding the object, with a symbol index."""
        member = (self.name if self.name.isidentifier() else "module")[:13] + ".o"
        return link.write_archive([(member, self.object_bytes, self.defined_symbols)], os.fspath(path))

    def export_header(self, path: str) -> str:
        """Write a C header: the ABI (tether_module.h) plus this module's prototypes and argument shapes."""
        guard = "TETHER_MODULE_%s_H_" % "".join(c if c.isalnum() else "_" for c in self.name.upper())
        lines = [abi_header(), "", "/* Module %r for %s (%s). */" % (self.name, self.target, self.target.preset),
                 "#ifndef %s" % guard, "#define %s" % guard, "#ifdef __cplusplus", 'extern "C" {', "#endif"]
        for fn in self.metadata["functions"]:
            args = ", ".join("%s %s%s" % (a["name"], a["dtype"], list(a["shape"])) for a in fn["args"])
            lines.append("/* %s(%s) */" % (fn["name"], args))
            lines.append("int32_t %s(const TetherValue* args, const int32_t* type_codes, int32_t num_args);"
                         % fn["name"])
        lines += ["#ifdef __cplusplus", "}", "#endif", "#endif /* %s */" % guard, ""]
        path = os.fspath(path)
        with open(path, "w", encoding="utf-8") as f:
            f.write("\n".join(lines))
        return path

    # ---- host convenience -----------------------------------------------------------------------------------
    def load(self) -> Any:
        """Link for this machine and load through the device runtime (host-target modules only)."""
        from tether_rpc import elf

        if self.target.is_wasm:
            raise TetherError("module %r is built for wasm32: run it with the JS runtime (bindings/js), not the "
                              "Python runtime" % self.name)
        if self.target.arch != elf.host_arch():
            raise TetherError("module %r is built for %s and cannot run on this %s host; export_library() it and "
                              "load it on the device" % (self.name, self.target.arch, elf.host_arch()))
        from tether import runtime

        tmp = tempfile.mkdtemp(prefix="tether-load-")
        try:
            path = self.export_library(os.path.join(tmp, "%s.so" % self.name))
            return runtime.load_module(path)
        finally:
            # The mapping survives unlinking the file; nothing stays behind in /tmp.
            shutil.rmtree(tmp, ignore_errors=True)
