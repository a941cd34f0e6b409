"""tether: cross-compile kernels and models for ARM devices; test and benchmark them over RPC.

    import tether
    lib = tether.build(s, [A, B, C], target="rasp4b", name="vadd")
    print(tether.lower(s, [A, B, C]))

Everything is imported lazily: ``import tether`` does not load llvmlite, numpy or any sub-package.
"""
from __future__ import annotations

import importlib
import sys
import types
from typing import Any

from tether.version import __version__  # noqa: F401

# Attributes resolved on first use: name -> (module, attribute or None for the module itself).
_LAZY = {
    "build": ("tether.driver", "build"),
    "register_func": ("tether.runtime", "register_func"),
    "lower": ("tether.driver", "lower"),
    "build_graph": ("tether.graph.build", "build_graph"),
    "Target": ("tether.target", "Target"),
}
_LAZY_SUBMODULES = ("te", "tir", "ops", "runtime", "target", "errors", "codegen", "artifact", "link", "frontend",
                    "graph", "rpc", "tracker", "emulate")


class _Package(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name in _LAZY:
            mod, attr = _LAZY[name]
            value = getattr(importlib.import_module(mod), attr)
            self.__dict__[name] = value
            return value
        if name in _LAZY_SUBMODULES:
            return importlib.import_module("tether." + name)
        raise AttributeError("module 'tether' has no attribute %r" % name)

    def __dir__(self) -> Any:
        return sorted(set(super().__dir__()) | set(_LAZY) | set(_LAZY_SUBMODULES))


sys.modules[__name__].__class__ = _Package
