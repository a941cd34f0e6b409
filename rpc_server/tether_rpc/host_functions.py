"""Host functions: Python callables registered by name, called by compiled modules at run time (TVM's
call_packed, docs/abi.md "Host callbacks") and offered to RPC clients (``remote.get_function(name)``).

``register_func("name")`` (a decorator) or ``register_func("name", fn)`` adds a callable to this process's
registry. A module whose metadata lists ``"host_functions"`` gets, at load, the *host caller* below installed
through its ``tether_set_host_caller``; a name missing from the registry fails the load with ModuleLoadError.
The caller converts the packed scalar arguments (int64, float64, str, bytes, None) to Python values, calls the
function and packs an int or float result; an exception is kept (per thread) and reported by the PackedFunc
that was running, with the function's name and message.

``rpc-server --functions FILE.py`` runs FILE.py in the server process before any session (``load_file``), so
the functions it registers are in every forked session worker. This runs the file's code on the device: only
load files you trust. Clients call them with ``remote.get_function(name)``; they run inside the session worker,
with the same crash isolation as kernels.
"""
from __future__ import annotations

import ctypes
import logging
import os
import runpy
import threading
from typing import Any, Callable, Dict, List, Optional

from .dlpack import TETHER_BYTES, TETHER_FLOAT64, TETHER_INT64, TETHER_NULL, TETHER_STR, TetherBytes, TetherValue
from .errors import ModuleLoadError

log = logging.getLogger(__name__)

SETTER = "tether_set_host_caller"
ERR_HOST_CALL = 9

_registry: Dict[str, Callable[..., Any]] = {}
_lock = threading.Lock()
# the latest failure, process-wide: a failing call may run on a pool worker thread, not the caller's
_last_error: Dict[str, Optional[str]] = {"name": None, "value": None}

HOST_CALLER_TYPE = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_char_p, ctypes.POINTER(TetherValue),
                                    ctypes.POINTER(ctypes.c_int32), ctypes.c_int32, ctypes.POINTER(TetherValue),
                                    ctypes.POINTER(ctypes.c_int32))


def register_func(name: str, func: Optional[Callable[..., Any]] = None, override: bool = False) -> Any:
    """Register ``func`` as host function ``name`` (or use as ``@register_func("name")``). Re-registering a name
    needs ``override=True``."""
    if not isinstance(name, str) or not name:
        raise ValueError("register_func needs a non-empty name, got %r" % (name,))

    def add(f: Callable[..., Any]) -> Callable[..., Any]:
        if not callable(f):
            raise TypeError("register_func(%r): %r is not callable" % (name, f))
        with _lock:
            if name in _registry and not override and _registry[name] is not f:
                raise ValueError("host function %r is already registered (pass override=True to replace it)" % name)
            _registry[name] = f
        return f

    return add if func is None else add(func)


def get_func(name: str) -> Optional[Callable[..., Any]]:
    return _registry.get(name)


def list_funcs() -> List[str]:
    return sorted(_registry)


def remove_func(name: str) -> None:
    with _lock:
        _registry.pop(name, None)


def load_file(path: str) -> List[str]:
    """Run a Python file whose top level registers host functions; returns the names it added."""
    before = set(_registry)
    path = os.path.abspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError("host functions file %s does not exist" % path)
    runpy.run_path(path, run_name="tether_host_functions")
    added = sorted(set(_registry) - before)
    log.info("loaded host functions from %s: %s", path, ", ".join(added) or "(none)")
    return added


def _unpack(v: TetherValue, code: int) -> Any:
    if code == TETHER_INT64:
        return v.v_int64
    if code == TETHER_FLOAT64:
        return v.v_float64
    if code == TETHER_STR:
        return ctypes.string_at(v.v_str).decode("utf-8") if v.v_str else ""
    if code == TETHER_BYTES:
        desc = ctypes.cast(v.v_handle, ctypes.POINTER(TetherBytes)).contents
        return ctypes.string_at(desc.data, desc.size) if desc.size else b""
    if code == TETHER_NULL:
        return None
    raise TypeError("host function argument with unsupported type code %d" % code)


def _host_caller(name_p, values, codes, n, ret, ret_code) -> int:
    name = name_p.decode("utf-8", "replace") if name_p else "?"
    try:
        func = _registry.get(name)
        if func is None:
            raise LookupError("host function %r is not registered" % name)
        result = func(*[_unpack(values[i], codes[i]) for i in range(n)])
        if isinstance(result, bool) or isinstance(result, int):
            ret[0].v_int64 = int(result)
            ret_code[0] = TETHER_INT64
        elif isinstance(result, float) or hasattr(result, "__float__"):
            ret[0].v_float64 = float(result)
            ret_code[0] = TETHER_FLOAT64
        elif result is None:
            ret[0].v_int64 = 0
            ret_code[0] = TETHER_NULL
        else:
            raise TypeError("host function %r returned %s; kernels take int or float" % (name, type(result).__name__))
        return 0
    except BaseException as exc:  # never let an exception cross into native code
        _last_error.update(name=name, value="%s: %s" % (type(exc).__name__, exc))
        return 1


_CALLER = HOST_CALLER_TYPE(_host_caller)  # one callback for the whole process, never freed


def install(lib: ctypes.CDLL, names: Any, label: str) -> None:
    """Check that every name is registered, then install the host caller into ``lib``."""
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ModuleLoadError("%s: metadata 'host_functions' must be a list of names" % label)
    missing = [n for n in names if n not in _registry]
    if missing:
        raise ModuleLoadError("%s needs host function%s %s, not registered in this process: register %s with "
                              "tether.register_func (on a device server: rpc-server --functions FILE.py)"
                              % (label, "s" if len(missing) > 1 else "", ", ".join(repr(m) for m in missing),
                                 "them" if len(missing) > 1 else "it"))
    try:
        setter = getattr(lib, SETTER)
    except AttributeError:
        raise ModuleLoadError("%s lists host functions but does not export %s" % (label, SETTER)) from None
    setter.argtypes, setter.restype = [ctypes.c_void_p], None
    setter(ctypes.cast(_CALLER, ctypes.c_void_p))


def pending_error() -> bool:
    return _last_error["value"] is not None


def take_error(names: List[str], index: int) -> str:
    """The message for return code ``9 << 24 | index``: the kept exception, if any (then forgotten)."""
    msg, name = _last_error["value"], _last_error["name"]
    _last_error.update(name=None, value=None)
    if name is None:
        name = names[index] if 0 <= index < len(names) else "#%d" % index
    return "host function %r failed: %s" % (name, msg or "no host caller installed or it returned an error")


# -- RPC built-ins: functions a client calls by name (tether_rpc.session extension) -----------------------------
def _get_function(session: Any, ctx: Any, name: Any) -> Dict[str, Any]:
    func = _registry.get(name) if isinstance(name, str) else None
    if func is None:
        raise KeyError("the device offers no function %r (have: %s); start rpc-server with --functions FILE.py"
                       % (name, ", ".join(list_funcs()) or "none"))
    return {"handle": session._put("function", func), "name": name}


def _list(session: Any, ctx: Any) -> List[str]:
    return list_funcs()


def register_builtins(session: Any) -> None:
    session._builtins["tether.get_function"] = lambda ctx, *args: _get_function(session, ctx, *args)
    session._builtins["tether.host_functions"] = lambda ctx: _list(session, ctx)
