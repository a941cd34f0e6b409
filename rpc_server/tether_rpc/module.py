"""Loading tether modules and calling their packed functions (docs/abi.md).

``load_module`` vets the file before any of its code runs: ELF header (architecture, word size, byte order,
ARM float ABI), then the JSON metadata in section ``.tether_meta`` (ABI version, target, the functions and
their arguments); only then ``dlopen`` (ctypes.CDLL) and the parallel launcher installation.

Packed-function arguments (one ``TetherValue`` + type code each):

=====================  ==================  ================================================================
Python value           type code           value
=====================  ==================  ================================================================
NDArray                TETHER_DLTENSOR     pointer to its cached DLTensor
numpy array (C-order)  TETHER_DLTENSOR     pointer to a DLTensor over the array's own memory (zero-copy)
int / numpy integer    TETHER_INT64        v_int64
float / numpy float    TETHER_FLOAT64      v_float64
str                    TETHER_STR          v_str: NUL-terminated UTF-8
bytes / bytearray      TETHER_BYTES        v_handle: ``{const void* data; uint64_t size;}``
None                   TETHER_NULL         0
=====================  ==================  ================================================================
"""
from __future__ import annotations

import ctypes
import itertools
import json
import logging
import os
import shutil
import sys
import tempfile
import threading
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from . import cpu_features, device_info, host_functions, parallel
from .dlpack import (DTYPE_TO_DL, TETHER_BYTES, TETHER_DLTENSOR, TETHER_FLOAT64, TETHER_INT64, TETHER_NULL,
                     TETHER_STR, TetherBytes, TetherValue, make_dltensor)
from .dtypes import name_of, numpy_dtype
from .elf import ARCH_MACHINE, ElfFile, host_arch
from .errors import ArchMismatch, KernelError, ModuleLoadError
from .gpu import module as gpu_module
from .ndarray import NDArray

logger = logging.getLogger(__name__)

ABI_VERSION = 1
META_SECTION = ".tether_meta"
_ARCH_BITS = {"x86_64": 64, "aarch64": 64, "armv7": 32}
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
# A function called with arguments that are ctypes objects already (arrays, c_int32, byref), passed as they are:
# with declared argtypes ctypes converts every argument on every call, a third of a bound call's cost (a call of
# three arguments counted 4.0 k instructions on the emulated A72 that way, 2.6 k this way). For PackedFunc.bind
# and Module.sequence, which convert once.
_PREPACKED_CALL = ctypes.CFUNCTYPE(ctypes.c_int32)
# metadata "call_list": the version of tether_run_calls this runtime drives (docs/abi.md "Call lists")
CALL_LIST_VERSION = 1


class TetherCall(ctypes.Structure):
    """One record of a call list: a packed function and its converted arguments (docs/abi.md "Call lists")."""
    _fields_ = [("fn", ctypes.c_void_p), ("values", ctypes.c_void_p), ("codes", ctypes.c_void_p),
                ("num_args", ctypes.c_int32)]

_host_float_abi_cache: List[Optional[str]] = []


# Native-byte-order numpy dtypes -> tether dtype name (a dict lookup on the dtype object is ~50x cheaper than
# dtype.name, and byte-swapped dtypes simply miss).
# A tagged uint16 (bfloat16 bit patterns) compares equal to uint16, so the tag is read after the lookup.
_NUMPY_DTYPES = {np.dtype(name): name for name in DTYPE_TO_DL if numpy_dtype(name).metadata is None}
# DLTensors for numpy arguments, keyed by everything they contain (data pointer, shape, dtype): a cached entry
# is identical to a freshly built one, so reuse is always safe, and calling a kernel repeatedly on the same
# arrays costs no DLTensor construction.
_DLTENSOR_CACHE: Dict[Tuple[int, Tuple[int, ...], str], Tuple[Any, Any]] = {}
_DLTENSOR_CACHE_MAX = 512
_char_from_buffer = ctypes.c_char.from_buffer


def _numpy_dltensor(a: np.ndarray, dtype: str):
    try:
        ptr = ctypes.addressof(_char_from_buffer(a))  # fast path: writable, non-empty buffers
    except (TypeError, ValueError):
        ptr = a.ctypes.data                           # read-only or empty arrays
    key = (ptr, a.shape, dtype)
    entry = _DLTENSOR_CACHE.get(key)
    if entry is None:
        if len(_DLTENSOR_CACHE) >= _DLTENSOR_CACHE_MAX:
            _DLTENSOR_CACHE.clear()
        entry = _DLTENSOR_CACHE[key] = make_dltensor(ptr, a.shape, dtype)
    return entry


def _host_float_abi() -> Optional[str]:
    """The float ABI of this interpreter's own binary (what the dynamic loader will demand), if ARM."""
    if not _host_float_abi_cache:
        abi = None
        try:
            with ElfFile(os.path.realpath(sys.executable)) as exe:
                abi = exe.arm_float_abi
        except Exception:  # an unreadable interpreter only costs us the early check
            abi = None
        _host_float_abi_cache.append(abi)
    return _host_float_abi_cache[0]


def _check_elf(elf: ElfFile, label: str) -> None:
    here = host_arch()
    built = elf.machine_name
    expected_bits = _ARCH_BITS.get(elf.arch or "", elf.bits)
    if elf.bits != expected_bits:
        built += " (%d-bit ELF)" % elf.bits
    if elf.endian != sys.byteorder:
        built += " (%s-endian)" % elf.endian
    if built != here:
        raise ArchMismatch("%s was built for %s but this device is %s: rebuild it with the target for this device"
                           " (e.g. `tether query` suggests one)" % (label, built, here))
    if not elf.is_shared_object:
        raise ModuleLoadError("%s is not a shared library (ELF type %d); export modules with export_library"
                              % (label, elf.type))
    if elf.arch == "armv7":
        mine, theirs = _host_float_abi(), elf.arm_float_abi
        if mine and theirs and mine != theirs:
            raise ArchMismatch("%s uses the %s-float ARM ABI but this device's Python is %s-float: rebuild for a "
                               "%s-float target" % (label, theirs, mine, mine))


def _check_cpu(meta: Dict[str, Any], label: str) -> None:
    """Refuse a module whose code needs an ISA level or CPU features this device lacks (metadata "requires";
    modules built before it existed have none and load as before)."""
    requires = meta.get("requires")
    if not isinstance(requires, dict):
        return
    caps = device_info.cpu_capabilities()
    lacking = cpu_features.missing(requires, caps)
    if not lacking:
        return
    preset = caps.get("suggested_target")
    target = (meta.get("target") or {}) if isinstance(meta.get("target"), dict) else {}
    built = target.get("preset") or target.get("cpu") or "another CPU"
    hint = ("rebuild it with target=%r" % preset) if preset else "rebuild it for this device's CPU"
    raise ArchMismatch("%s was built for %s and needs %s, which this device's CPU (%s) lacks: %s"
                       % (label, built, ", ".join(lacking), caps.get("isa"), hint))


def _read_metadata(elf: ElfFile, label: str) -> Dict[str, Any]:
    sec = elf.section(META_SECTION)
    if sec is None:
        raise ModuleLoadError("%s has no %s section: it is not a tether module (build it with tether.build and "
                              "Module.export_library)" % (label, META_SECTION))
    raw = elf.section_data(sec)
    end = raw.find(b"\0")
    if end < 0:
        raise ModuleLoadError("%s: metadata in %s is not NUL-terminated (corrupt module)" % (label, META_SECTION))
    try:
        meta = json.loads(raw[:end].decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise ModuleLoadError("%s: metadata in %s is not valid JSON: %s" % (label, META_SECTION, exc)) from exc
    if not isinstance(meta, dict):
        raise ModuleLoadError("%s: metadata must be a JSON object, got %s" % (label, type(meta).__name__))
    version = meta.get("abi_version")
    if version != ABI_VERSION:
        raise ModuleLoadError("%s uses tether ABI version %r but this runtime speaks version %d: update the device "
                              "runtime or rebuild the module with a matching tether" % (label, version, ABI_VERSION))
    target = meta.get("target") or {}
    meta_arch = target.get("arch") if isinstance(target, dict) else None
    if meta_arch is not None and ARCH_MACHINE.get(meta_arch) != elf.machine:
        raise ModuleLoadError("%s: metadata says arch %r but the ELF header says %s (corrupt or mislabelled module)"
                              % (label, meta_arch, elf.machine_name))
    funcs = meta.get("functions")
    if not isinstance(funcs, list) or not all(isinstance(f, dict) and isinstance(f.get("name"), str)
                                              for f in funcs):
        raise ModuleLoadError("%s: metadata 'functions' must be a list of objects with a 'name'" % label)
    return meta


def _describe(value: Any) -> Tuple[str, Optional[Tuple[int, ...]], Optional[str]]:
    """(kind, shape, dtype) of an actual argument, for error messages."""
    if isinstance(value, (NDArray, np.ndarray)):
        return "array", tuple(value.shape), (value.dtype if isinstance(value, NDArray) else value.dtype.name)
    return type(value).__name__, None, None


def _fmt_shape(shape: Sequence[int]) -> str:
    shape = tuple(shape)
    return "(%s,)" % shape[0] if len(shape) == 1 else str(shape)


class PackedFunc:
    """A callable packed function of a loaded module."""

    def __init__(self, module: "Module", name: str, cfunc, info: Dict[str, Any]):
        self.module = module
        self.name = name
        self.info = info
        self._cfunc = cfunc
        self.arg_info: List[Dict[str, Any]] = [a for a in info.get("args", []) if isinstance(a, dict)]

    def __repr__(self) -> str:
        return "PackedFunc(%s(%s))" % (self.name, ", ".join(str(a.get("name", "?")) for a in self.arg_info))

    # -- argument conversion ---------------------------------------------------------------------------------
    def _pack(self, args: Sequence[Any]):
        n = len(args)
        values = (TetherValue * max(n, 1))()
        codes = (ctypes.c_int32 * max(n, 1))()
        keep: List[Any] = []
        for i, a in enumerate(args):
            if isinstance(a, NDArray):
                values[i].v_handle = a.dltensor_address
                codes[i] = TETHER_DLTENSOR
                keep.append(a)
            elif isinstance(a, np.ndarray):
                dt = _NUMPY_DTYPES.get(a.dtype)
                if dt is None or a.dtype.metadata is not None:   # bfloat16: tagged uint16 or ml_dtypes'
                    dt = name_of(a.dtype)
                    dt = dt if dt in DTYPE_TO_DL else None
                if dt is None:
                    raise KernelError("%s: argument %d%s is a %s array; tether kernels take %s"
                                      % (self.name, i, self._argname(i), a.dtype, ", ".join(DTYPE_TO_DL)))
                if not a.flags.c_contiguous:
                    raise KernelError("%s: argument %d%s is not C-contiguous; pass np.ascontiguousarray(x) (and copy "
                                      "results back) or an NDArray" % (self.name, i, self._argname(i)))
                t = _numpy_dltensor(a, dt)
                keep.append(a)
                keep.append(t)
                values[i].v_handle = ctypes.addressof(t[0])
                codes[i] = TETHER_DLTENSOR
            elif isinstance(a, (bool, int, np.integer)):
                v = int(a)
                if not _INT64_MIN <= v <= _INT64_MAX:
                    raise KernelError("%s: argument %d%s = %d does not fit in int64"
                                      % (self.name, i, self._argname(i), v))
                values[i].v_int64 = v
                codes[i] = TETHER_INT64
            elif isinstance(a, (float, np.floating)):
                values[i].v_float64 = float(a)
                codes[i] = TETHER_FLOAT64
            elif isinstance(a, str):
                buf = ctypes.create_string_buffer(a.encode("utf-8"))
                keep.append(buf)
                values[i].v_str = ctypes.addressof(buf)
                codes[i] = TETHER_STR
            elif isinstance(a, (bytes, bytearray, memoryview)):
                buf = ctypes.create_string_buffer(bytes(a), len(a) or 1)
                desc = TetherBytes(ctypes.addressof(buf), len(a))
                keep.extend((buf, desc))
                values[i].v_handle = ctypes.addressof(desc)
                codes[i] = TETHER_BYTES
            elif a is None:
                values[i].v_handle = None
                codes[i] = TETHER_NULL
            else:
                raise KernelError("%s: argument %d%s has unsupported type %s (pass NDArray, numpy arrays, int, float, "
                                  "str, bytes or None)" % (self.name, i, self._argname(i), type(a).__name__))
        return values, codes, n, keep

    def _argname(self, i: int) -> str:
        if 0 <= i < len(self.arg_info) and "name" in self.arg_info[i]:
            return " '%s'" % self.arg_info[i]["name"]
        return ""

    # -- calling ---------------------------------------------------------------------------------------------
    def __call__(self, *args: Any) -> None:
        if self.module._lib is None:
            raise self.module.closed_error(self.name)
        values, codes, n, keep = self._pack(args)
        rc = self._cfunc(values, codes, n)
        if rc:
            raise self.decode_error(rc, args)

    def bind(self, *args: Any) -> Callable[[], None]:
        """Convert ``args`` once and return a zero-argument callable that runs the function on them.

        Used by timing loops: a call then costs one ctypes call and a return-code check. The arrays must stay
        as they are (same objects, same shapes) while the bound callable is in use."""
        if self.module._lib is None:
            raise self.module.closed_error(self.name)
        values, codes, n, keep = self._pack(args)
        # The packed arrays passed as they are, through a prototype without argtypes: ctypes then neither checks
        # nor converts them (0.61 us -> 0.37 us a call on x86_64 with POINTER checks skipped, less again without
        # conversions).
        address = ctypes.cast(self._cfunc, ctypes.c_void_p).value
        cfunc = _PREPACKED_CALL(address)
        count = ctypes.c_int32(n)
        decode = self.decode_error
        module = self.module

        def call() -> None:
            if module._lib is None:
                raise module.closed_error(self.name)
            rc = cfunc(values, codes, count)
            if rc:
                raise decode(rc, args)

        # the DLTensors the values point to must outlive every call
        call.keepalive = keep  # type: ignore[attr-defined]
        # what Module.sequence puts in a call list, and how a failure there reads
        call.record = (address, ctypes.addressof(values), ctypes.addressof(codes), n)  # type: ignore[attr-defined]
        call.error = lambda rc: decode(rc, args)  # type: ignore[attr-defined]
        return call

    def decode_error(self, rc: int, args: Sequence[Any] = ()) -> KernelError:
        """Turn a nonzero return code (docs/abi.md "Return codes") into a readable KernelError."""
        rc &= 0xFFFFFFFF
        kind, i, d, low24 = rc >> 24, (rc >> 8) & 0xFFFF, rc & 0xFF, rc & 0xFFFFFF
        name = self.name
        expected = self.arg_info[i] if i < len(self.arg_info) else {}
        ename = " '%s'" % expected["name"] if "name" in expected else ""
        actual_kind, actual_shape, actual_dtype = _describe(args[i]) if i < len(args) else ("?", None, None)
        exp_shape = tuple(expected.get("shape", ())) if "shape" in expected else None
        if kind == 1:
            names = ", ".join(str(a.get("name", "?")) for a in self.arg_info)
            msg = "%s: expected %d arguments (%s), got %d" % (name, len(self.arg_info), names, low24)
        elif kind == 2:
            msg = "%s: argument %d%s must be an array, got %s" % (name, i, ename, actual_kind)
        elif kind == 3:
            msg = "%s: argument %d%s has %s dimensions%s, expected %s%s" % (
                name, i, ename, len(actual_shape) if actual_shape is not None else "the wrong number of",
                " (shape %s)" % _fmt_shape(actual_shape) if actual_shape is not None else "",
                len(exp_shape) if exp_shape is not None else "another number",
                " (shape %s)" % _fmt_shape(exp_shape) if exp_shape is not None else "")
        elif kind == 4:
            msg = "%s: argument %d%s has dtype %s, expected %s" % (
                name, i, ename, actual_dtype or "?", expected.get("dtype", "another dtype"))
        elif kind == 5:
            msg = "%s: argument %d%s has shape %s, expected %s (dimension %d differs)" % (
                name, i, ename, _fmt_shape(actual_shape) if actual_shape is not None else "?",
                _fmt_shape(exp_shape) if exp_shape is not None else "?", d)
        elif kind == 6:
            msg = "%s: argument %d%s is not a compact row-major array (dimension %d)" % (name, i, ename, d)
        elif kind == 7:
            msg = "%s: argument %d%s has a NULL data pointer" % (name, i, ename)
        elif kind == host_functions.ERR_HOST_CALL:
            msg = "%s: %s" % (name, host_functions.take_error(self.module.metadata.get("host_functions") or [], low24))
        elif kind == 8 and host_functions.pending_error():  # a host call failed inside a parallel task
            msg = "%s: in a parallel task: %s" % (name, host_functions.take_error([], -1))
        elif kind == 8:
            if low24 == parallel.LAUNCHER_INTERNAL_ERROR:
                msg = "%s: the parallel launcher failed (see the device log)" % name
            else:
                msg = "%s: a parallel task failed with code %d" % (name, low24)
        else:
            msg = "%s: failed with return code %d (0x%08x)" % (name, rc, rc)
        err = KernelError(msg)
        err.code = rc  # type: ignore[attr-defined]
        return err


class Module:
    """A loaded tether module. ``m["name"]`` gives a :class:`PackedFunc`; ``close()`` is idempotent.

    Unloading (dlclose): ``close()`` drops the module's own reference, :meth:`acquire`/:meth:`release` count
    other holders (the session's function handles); when none is left the library is unloaded, unless another
    open Module object shares it or its native pool cannot stop. A PackedFunc of an unloaded module raises
    ModuleLoadError instead of calling into unmapped code."""

    def __init__(self, path: str, lib: ctypes.CDLL, metadata: Dict[str, Any], has_launcher: bool,
                 gpu: Optional[gpu_module.GpuProgram] = None):
        self.path = path
        self.metadata = metadata
        self.has_parallel_launcher = has_launcher
        self._lib: Optional[ctypes.CDLL] = lib
        self._infos = {f["name"]: f for f in metadata["functions"]}
        # a GPU module's functions run on its device (docs/gpu.md "GPU modules")
        self.gpu = gpu
        if gpu is not None:
            self._infos.update(gpu.functions)
        self._funcs: Dict[str, PackedFunc] = {}
        self._refs = 1          # this object's own; acquire() adds holders
        self._closed = False
        self.unloaded = False   # dlclose happened

    def acquire(self) -> None:
        """Another holder (e.g. a function handle) keeps the library loaded until its :meth:`release`."""
        self._refs += 1

    def release(self) -> None:
        if self._refs > 0:
            self._refs -= 1
            if self._refs == 0:
                self._unload()

    def closed_error(self, fn: str) -> ModuleLoadError:
        return ModuleLoadError("%s: module %s was closed and unloaded; load it again"
                               % (fn, os.path.basename(self.path)))

    @property
    def function_names(self) -> List[str]:
        return list(self._infos)

    @property
    def target(self) -> Dict[str, Any]:
        return self.metadata.get("target") or {}

    def __contains__(self, name: str) -> bool:
        return name in self._infos

    def __getitem__(self, name: str) -> PackedFunc:
        f = self._funcs.get(name)
        if f is not None:
            return f
        if self._lib is None:
            raise ModuleLoadError("module %s is closed" % os.path.basename(self.path))
        if name not in self._infos:
            raise KeyError("%s has no function %r; it has: %s" % (
                os.path.basename(self.path), name, ", ".join(self._infos) or "(none)"))
        if self.gpu is not None and name in self.gpu.functions:
            return self.gpu.function(self, name)   # (a GpuFunction: same calling convention, arrays on the device)
        cfunc = getattr(self._lib, name)
        cfunc.argtypes = [ctypes.POINTER(TetherValue), ctypes.POINTER(ctypes.c_int32), ctypes.c_int32]
        cfunc.restype = ctypes.c_int32
        f = self._funcs[name] = PackedFunc(self, name, cfunc, self._infos[name])
        return f

    get_function = __getitem__

    def sequence(self, calls: Sequence[Callable[[], None]]) -> Callable[[], None]:
        """One callable that makes ``calls`` (from :meth:`PackedFunc.bind` of this module's functions) in order,
        stopping at the first error, which it raises as that call would. Through the module's
        ``tether_run_calls`` (docs/abi.md "Call lists") that is one native call; a module without the export
        (hand-written C, older builds) gets a Python loop doing the same."""
        calls = list(calls)
        run = None
        if (self._lib is not None and self.metadata.get("call_list") == CALL_LIST_VERSION and len(calls) > 1
                and all(getattr(c, "record", None) is not None for c in calls)):
            export = getattr(self._lib, "tether_run_calls", None)
            run = None if export is None else _PREPACKED_CALL(ctypes.cast(export, ctypes.c_void_p).value)
        if run is None:
            if len(calls) == 1:
                return calls[0]

            def each() -> None:
                for call in calls:
                    call()
            return each
        records = (TetherCall * len(calls))(*(TetherCall(*c.record) for c in calls))  # type: ignore[attr-defined]
        failed = ctypes.c_int32(0)
        count, failed_ref = ctypes.c_int32(len(calls)), ctypes.byref(failed)
        module = self

        def run_all() -> None:
            if module._lib is None:
                raise module.closed_error("tether_run_calls")
            rc = run(records, count, failed_ref)
            if rc:
                raise calls[failed.value].error(rc)  # type: ignore[attr-defined]

        return run_all

    def close(self) -> None:
        """Drop this object's reference (idempotent); the library is unloaded when no holder is left."""
        if not self._closed:
            self._closed = True
            self.release()

    def _unload(self) -> None:
        lib, self._lib = self._lib, None
        self._funcs = {}
        if self.gpu is not None:
            self.gpu.release()
        if lib is not None:
            self.unloaded = _unload_library(self.path, lib)

    def __enter__(self) -> "Module":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return "Module(%s, functions=%s)" % (os.path.basename(self.path), self.function_names)


def read_metadata(path: str) -> Dict[str, Any]:
    """The metadata of a module built for any architecture (no arch check, nothing loaded): for host tools."""
    label = os.path.basename(path)
    with ElfFile(path, name=label) as elf:
        return _read_metadata(elf, label)


def inspect_module(path: str) -> Dict[str, Any]:
    """Vet ``path`` without loading it: returns its metadata or raises ArchMismatch / ModuleLoadError."""
    label = os.path.basename(path)
    with ElfFile(path, name=label) as elf:
        _check_elf(elf, label)
        meta = _read_metadata(elf, label)
        _check_cpu(meta, label)
        gpu_module.check_device(meta, label)   # a GPU module on a device without its API: refused like a CPU's
        exported = set(elf.exported_symbols)
        missing = [f["name"] for f in meta["functions"] if f["name"] not in exported]
        if missing:
            raise ModuleLoadError("%s: metadata lists %s but the library does not export %s"
                                  % (label, ", ".join(missing), "it" if len(missing) == 1 else "them"))
        if elf.needed or elf.undefined_symbols:
            # Not fatal (libc may provide them) but not a self-contained tether module: say so if dlopen fails.
            meta = dict(meta, _needs={"needed": elf.needed, "undefined": elf.undefined_symbols[:20]})
    return meta


# dlopen returns the already-loaded library when it is asked for a path it has loaded before, even if the file
# was replaced since (a re-uploaded kernel of the same name). We remember what each path held when it was
# dlopened and load a changed file through a fresh alias, so the code that runs is always the file we vetted.
_loaded_files: Dict[str, Tuple[Tuple[int, int, int, int], ctypes.CDLL]] = {}
_load_lock = threading.Lock()
_alias_counter = itertools.count()


def _file_signature(path: str) -> Tuple[int, int, int, int]:
    st = os.stat(path)
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _make_alias(path: str, label: str) -> str:
    name = ".%s.tether-%d-%d.so" % (label, os.getpid(), next(_alias_counter))
    for folder in (os.path.dirname(path), tempfile.gettempdir()):  # the module's folder may be read-only
        alias = os.path.join(folder, name)
        try:
            shutil.copyfile(path, alias)
            return alias
        except OSError:
            continue
    raise ModuleLoadError("cannot reload %s: no writable folder for a fresh copy (tried %s and %s)"
                          % (label, os.path.dirname(path), tempfile.gettempdir()))


# dlopen handle -> open Module objects using it (a path loaded twice unchanged shares one handle)
_users: Dict[int, int] = {}


def _unload_library(path: str, lib: ctypes.CDLL) -> bool:
    """dlclose ``lib`` once no open Module uses it and its native pool (if it provides one) has stopped."""
    with _load_lock:
        handle = lib._handle
        _users[handle] = _users.get(handle, 1) - 1
        if _users[handle] > 0:
            return False
        if not parallel.uninstall(lib):
            logger.warning("%s stays loaded: a thread of its pool is still running a task", os.path.basename(path))
            return False
        del _users[handle]
        seen = _loaded_files.get(path)
        if seen is not None and seen[1] is lib:
            del _loaded_files[path]
        try:
            import _ctypes
            _ctypes.dlclose(handle)
        except (ImportError, AttributeError, OSError) as exc:
            logger.warning("cannot unload %s: %s", os.path.basename(path), exc)
            return False
    logger.debug("unloaded %s", os.path.basename(path))
    return True


def _dlopen(path: str, label: str, needs: Optional[Dict[str, Any]]) -> ctypes.CDLL:
    mode = os.RTLD_LOCAL | os.RTLD_NOW
    try:
        with _load_lock:
            sig = _file_signature(path)
            seen = _loaded_files.get(path)
            if seen is not None and seen[0] == sig:
                _users[seen[1]._handle] = _users.get(seen[1]._handle, 0) + 1
                return seen[1]
            if seen is None:
                lib = ctypes.CDLL(path, mode=mode)
            else:
                alias = _make_alias(path, label)
                try:
                    logger.debug("%s changed since it was loaded: loading it as %s", label, alias)
                    lib = ctypes.CDLL(alias, mode=mode)
                finally:
                    os.remove(alias)  # the mapping outlives the name
            _loaded_files[path] = (sig, lib)
            _users[lib._handle] = _users.get(lib._handle, 0) + 1
            return lib
    except OSError as exc:
        hint = ""
        text = str(exc).lower()
        if "permission" in text or "map segment" in text or "not permitted" in text:
            hint = " (is its folder on a filesystem mounted noexec? load modules from an executable location)"
        if needs:
            hint = " (the library needs %s and leaves %s undefined; tether modules must be self-contained)" % (
                ", ".join(needs["needed"]) or "no libraries", ", ".join(needs["undefined"]) or "nothing")
        raise ModuleLoadError("dlopen failed for %s: %s%s" % (label, exc, hint)) from exc


def load_module(path: str, parallel_launcher: bool = True, device: Any = None) -> Module:
    """Vet and load a tether module. Raises ArchMismatch / ModuleLoadError without running foreign code on a
    module for another architecture or without tether metadata. ``parallel_launcher=False`` leaves the module's
    parallel loops serial (the ABI's fallback). A GPU module's code is loaded on ``device`` (a DeviceAPI, an
    "api:index" spec or an index; default: device 0 of its API), or refused (GpuUnavailable...) in one line."""
    path = os.path.abspath(os.fspath(path))  # dlopen searches the library path for names without a slash
    label = os.path.basename(path)
    meta = inspect_module(path)
    gpu = None
    if meta.get("device") is not None:   # loaded before dlopen: a device that refuses it leaves nothing behind
        with ElfFile(path, name=label) as elf:
            gpu = gpu_module.load_device_code(elf, meta, label, device)
    needs = meta.pop("_needs", None)
    if needs:
        logger.warning("%s is not self-contained: needs libraries %s, undefined symbols %s",
                       label, needs["needed"], needs["undefined"])
    host = meta.get("host_functions")
    if host:  # checked before dlopen too: a missing host function is a load error, not a run-time one
        missing = [n for n in host if not isinstance(n, str) or host_functions.get_func(n) is None]
        if missing:
            host_functions.install(None, host, label)  # raises the ModuleLoadError naming them
    lib = _dlopen(path, label, needs)
    # kernels compiled twice pick their version from the features this CPU reports (metadata "cpu_dispatch")
    cpu_features.set_dispatch_word(lib, meta.get("cpu_dispatch"), device_info.cpu_capabilities(), label)
    if host:
        host_functions.install(lib, host, label)
    chunked = meta.get("parallel_tasks") == "chunked"  # tasks accept any num_tasks (docs/abi.md)
    # "thread_pool": the module carries the native pool (codegen/threadpool.py); the first one becomes the provider
    has_launcher = (parallel.install(lib, chunked=chunked, thread_pool=meta.get("thread_pool"))
                    if parallel_launcher else False)
    logger.debug("loaded %s: functions %s, parallel launcher %s", label,
                 [f["name"] for f in meta["functions"]], has_launcher)
    return Module(path, lib, meta, has_launcher, gpu)
