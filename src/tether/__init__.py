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
from typing import Any, Dict, Mapping, Optional

from tether.version import __version__  # noqa: F401

# Attributes resolved on first use: name -> (module, attribute or None for the module itself).
_LAZY = {
    "build": ("tether.driver", "build"),
    "register_func": ("tether.runtime", "register_func"),
    "lower": ("tether.driver", "lower"),
    "Target": ("tether.target", "Target"),
}
_LAZY_SUBMODULES = ("te", "tir", "ops", "runtime", "target", "errors", "codegen", "artifact", "link", "frontend",
                    "graph", "rpc", "tracker", "emulate")


def build_graph(graph: Any, params: Dict[str, Any], target: Any = "host", opt_level: int = 3, fast_math: bool = False,
                name: str = "deploy", tuning_log: Optional[str] = None,
                configs: Optional[Mapping[str, Dict[str, Any]]] = None, executor: str = "graph",
                aot_params: str = "embedded", aot_workspace: str = "static", precision: str = "fp32") -> Any:
    """Compile an imported graph into one library + graph JSON + params (``tether.graph.build.build_graph``).
    ``tuning_log``: a `tether tune` log; each kernel it has results for (on this target) gets its best config, the
    others their default schedule (``configs``, task key -> config, given directly, takes precedence).
    ``executor="aot"``: an ahead-of-time module instead, ``<name>.h`` + ``lib<name>.so`` + ``lib<name>.a`` whose
    ``<name>_run`` runs the whole model (docs/deploy.md; ``aot_params``: "embedded" or "external",
    ``aot_workspace``: "static" or "caller"). ``precision="fp16"``: float32 math computed in half on targets with
    half arithmetic (rasp5-fp16, android-arm64-fp16; docs/targets in docs/bench.md "fp16")."""
    import logging

    from tether.graph.build import build_graph as build
    from tether.tune.log import best_configs

    resolved: Dict[str, Dict[str, Any]] = {}
    if tuning_log:
        resolved = best_configs(tuning_log, target)
        logging.getLogger("tether.graph.build").info("tuning log %s: best configs for %d kernels on this target",
                                                     tuning_log, len(resolved))
    resolved.update(configs or {})
    return build(graph, params, target=target, opt_level=opt_level, fast_math=fast_math, name=name,
                 configs=resolved, executor=executor, aot_params=aot_params, aot_workspace=aot_workspace,
                 precision=precision)


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
