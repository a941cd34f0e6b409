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

__version__ = "0.1.0"

# Attributes resolved on first use: name -> (module, attribute or None for the module itself).
_LAZY = {
    "build_graph": ("tether.graph_build", "build_graph"),
    "Target": ("tether.target", "Target"),
}
_LAZY_SUBMODULES = ("te", "tir", "ops", "runtime", "target", "errors", "codegen", "artifact", "link", "frontend",
                    "graph", "rpc", "tracker", "emulate")
# tether.build and tether.lower are both sub-modules (build.py, lower.py) and the functions users call. The
# import system binds a sub-module to the package attribute of the same name, so instead of fighting it we make
# those module objects callable: tether.build(...) calls tether.build.build, tether.lower(...) tether.build.lower.
_CALLABLE_SUBMODULES = {"build": ("tether.build", "build"), "lower": ("tether.build", "lower")}


class _CallableModule(types.ModuleType):
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        mod, attr = _CALLABLE_SUBMODULES[self.__name__.rpartition(".")[2]]
        return getattr(importlib.import_module(mod), attr)(*args, **kwargs)


class _Package(types.ModuleType):
    def __setattr__(self, name: str, value: Any) -> None:
        if name in _CALLABLE_SUBMODULES and isinstance(value, types.ModuleType) and \
                type(value) is types.ModuleType:
            value.__class__ = _CallableModule
        super().__setattr__(name, value)

    def __getattr__(self, name: str) -> Any:
        if name in _CALLABLE_SUBMODULES:
            importlib.import_module("tether." + name)  # binds the (now callable) module via __setattr__
            return self.__dict__[name]
        if name in _LAZY:
            mod, attr = _LAZY[name]
            value = getattr(importlib.import_module(mod), attr)
            self.__dict__[name] = value
            return value
        if name in _LAZY_SUBMODULES:
            return importlib.import_module("tether." + name)
        raise AttributeError("module 'tether' has no attribute %r" % name)

    def __dir__(self) -> Any:
        return sorted(set(super().__dir__()) | set(_LAZY) | set(_CALLABLE_SUBMODULES) | set(_LAZY_SUBMODULES))


sys.modules[__name__].__class__ = _Package
