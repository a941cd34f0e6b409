"""One session's state and its built-in functions, independent of any transport.

:class:`SessionHandler` owns the object table (device arrays, loaded modules, packed functions: each named by a
64-bit handle id) and the session folder, and implements every built-in (``tether.echo``, ``tether.array.*``,
``tether.upload``, ``tether.module.load``, ``tether.time_evaluator``, ...). The forked server worker drives it
from frames on a socket; ``tether.rpc.LocalSession`` drives it in-process. Both therefore behave identically.

Bulk bytes are transport-neutral: a call may receive a :class:`BulkIn` (read straight into its destination,
e.g. an NDArray's memory) and may answer with a :class:`Reply` that carries a buffer or a file to stream back.
"""
from __future__ import annotations

import importlib
import logging
import os
import tempfile
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from .errors import ProtocolError
from .files import SessionFolder
from .limits import Budget, SessionLimits, folder_bytes
from .protocol import RemoteHandle
from .transport import byte_view

log = logging.getLogger(__name__)

# emit(kind, fields, defer): ``defer`` lets the transport send the event together with the frame that follows
# at once (saving the peer a wake-up); it must still be delivered before that frame.
EmitFn = Callable[..., None]

CHUNK = 1 << 20  # upload pieces without splice: few syscalls, bounded memory, and still in the caches
GPU_STAGING = 16 << 20  # host bytes a GPU array's copy_in goes through at a time


class BulkIn:
    """Raw bytes arriving with a call, consumed in order by ``readinto``; unread bytes are drained afterwards."""

    def __init__(self, nbytes: int, readinto: Callable[[memoryview], None],
                 skip: Optional[Callable[[int], None]] = None,
                 into_fd: Optional[Callable[[int, int], None]] = None):
        self.nbytes = nbytes
        self.consumed = 0
        self._readinto = readinto
        self._skip = skip
        self._into_fd = into_fd

    @classmethod
    def from_buffer(cls, buffer: Any) -> "BulkIn":
        src = byte_view(buffer)
        state = {"pos": 0}

        def readinto(view: memoryview) -> None:
            pos = state["pos"]
            view[:] = src[pos:pos + len(view)]
            state["pos"] = pos + len(view)

        return cls(len(src), readinto)

    @property
    def remaining(self) -> int:
        return self.nbytes - self.consumed

    def readinto(self, view: memoryview) -> None:
        view = byte_view(view)
        if len(view) > self.remaining:
            raise ProtocolError("asked for %d bulk bytes, only %d remain" % (len(view), self.remaining))
        self._readinto(view)
        self.consumed += len(view)

    def readinto_fd(self, fd: int, n: int) -> None:
        """Write the next ``n`` bytes to a file descriptor: straight from the transport when it can (splice),
        else through a bounded scratch buffer."""
        if n > self.remaining:
            raise ProtocolError("asked for %d bulk bytes, only %d remain" % (n, self.remaining))
        if self._into_fd is not None:
            self._into_fd(fd, n)
            self.consumed += n
            return
        scratch = memoryview(bytearray(min(n, CHUNK)))
        while n:
            piece = scratch[:min(n, len(scratch))]
            self.readinto(piece)
            view = piece
            while len(view):
                view = view[os.write(fd, view):]
            n -= len(piece)

    def drain(self) -> None:
        """Discard what the call did not read, so the byte stream stays in step with the frames."""
        n = self.remaining
        if n and self._skip is not None:
            self._skip(n)
        elif n:
            scratch = memoryview(bytearray(min(n, CHUNK)))
            while self.remaining:
                self.readinto(scratch[:min(self.remaining, len(scratch))])
        self.consumed = self.nbytes


class Reply:
    """A call's answer: a msgpack value plus optional tensors and optional bulk bytes (a buffer or a file)."""

    __slots__ = ("value", "tensors", "buffer", "file", "size")

    def __init__(self, value: Any = None, tensors: Optional[List[np.ndarray]] = None, buffer: Any = None,
                 file: Any = None, size: int = 0):
        self.value = value
        self.tensors = tensors
        self.buffer = buffer
        self.file = file
        self.size = byte_view(buffer).nbytes if buffer is not None else size

    @property
    def has_bulk(self) -> bool:
        return self.buffer is not None or self.file is not None

    def payload(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {"value": self.value}
        if self.tensors is not None:
            out["tensors"] = self.tensors
        if self.has_bulk:
            out["nbytes"] = self.size
        return out


class CallContext:
    """What a built-in may use besides its arguments: incoming bulk bytes and the event stream."""

    __slots__ = ("bulk", "_emit")

    def __init__(self, bulk: Optional[BulkIn], emit: Optional[EmitFn]):
        self.bulk = bulk
        self._emit = emit

    def emit(self, kind: str, _defer: bool = False, **fields: Any) -> None:
        """Stream an EVENT to the caller; ``_defer=True`` when the call's reply follows immediately."""
        if self._emit is not None:
            event = {"kind": kind}  # kind first, like every EVENT on the wire (tests/vectors/frames.json)
            event.update(fields)
            if _defer:
                self._emit(kind, event, True)
            else:
                self._emit(kind, event)

    def require_bulk(self, what: str) -> BulkIn:
        if self.bulk is None:
            raise ValueError("%s needs bulk bytes after the CALL (payload 'nbytes')" % what)
        return self.bulk


# Built-in name -> SessionHandler method name. One row per built-in; docs/protocol.md lists the same table.
BUILTINS = {
    "tether.echo": "_echo",
    "tether.functions": "_functions",
    "tether.device_info": "_device_info",
    "tether.array.empty": "_array_empty",
    "tether.array.from_tensor": "_array_from_tensor",
    "tether.array.copy_in": "_array_copy_in",
    "tether.array.copy_out": "_array_copy_out",
    "tether.array.copy_to": "_array_copy_to",
    "tether.array.free": "_free",
    "tether.free": "_free",
    "tether.upload": "_upload",
    "tether.download": "_download",
    "tether.listdir": "_listdir",
    "tether.remove": "_remove",
    "tether.module.load": "_module_load",
    "tether.module.get_function": "_module_get_function",
    "tether.time_evaluator": "_time_evaluator",
}

# Device modules that add their own built-ins: each provides ``register_builtins(handler)`` (a module missing
# from a trimmed device install is skipped).
EXTENSIONS = ("graph_executor", "device_state", "host_functions")

_BOUND_MAX = 256  # cached kernel calls per session (cleared when full)

_KIND_ARRAY = "array"
_KIND_MODULE = "module"
_KIND_FUNCTION = "function"
_KIND_GRAPH = "graph"       # (graph_executor.KIND_GRAPH: a graph executor)


def _release(kind: str, obj: Any) -> None:
    """What freeing a handle does besides forgetting it: a GPU array's device memory goes back at once (a host
    array's with its last reference); a graph executor's device memory and module go at once too; a module's own
    reference and each function handle's hold on its module go, and the library is unloaded when none is left
    (tether_rpc.module.Module)."""
    if kind == _KIND_ARRAY:
        free = getattr(obj, "free", None)
        if free is not None:
            free()
    elif kind == _KIND_MODULE:
        obj.close()
    elif kind == _KIND_GRAPH:
        # a GPU model's device buffers go back now, before the session closes the device they live on
        obj.close()
    elif kind == _KIND_FUNCTION:
        module = getattr(obj, "module", None)
        if module is not None and hasattr(module, "release"):
            module.release()


class SessionHandler:
    """Object table + built-ins for one session, rooted in one session folder."""

    def __init__(self, folder: str, limits: Optional[SessionLimits] = None):
        self.folder = SessionFolder(folder)
        self.limits = limits if limits is not None else SessionLimits(handles=None, disk=None, call_timeout=None)
        self.budget = Budget(self.limits)
        self._objects: Dict[int, Tuple[str, Any]] = {}
        self._bound: Dict[Tuple[int, ...], Callable[[], Any]] = {}  # (function id, array ids...): see call_plain
        self._next_id = 1
        self._devices: Any = None  # tether_rpc.gpu.session_devices.SessionDevices, made on the first GPU array
        self._builtins = {name: getattr(self, meth) for name, meth in BUILTINS.items()}
        for name in EXTENSIONS:
            try:
                ext = importlib.import_module("." + name, __package__)
            except ImportError as exc:
                log.debug("session extension %s unavailable: %s", name, exc)
                continue
            ext.register_builtins(self)

    # -- dispatch ----------------------------------------------------------------------------------------------
    def call(self, fn: Any, args: List[Any], bulk: Optional[BulkIn] = None, emit: Optional[EmitFn] = None) -> Reply:
        """Run one call; exceptions propagate to the transport, which reports them. Unread bulk is drained."""
        ctx = CallContext(bulk, emit)
        try:
            if not isinstance(args, list):
                raise ProtocolError("CALL args must be a list, got %s" % type(args).__name__)
            if isinstance(fn, str):
                builtin = self._builtins.get(fn)
                if builtin is None:
                    raise KeyError("no built-in function %r (have: %s)" % (fn, ", ".join(sorted(self._builtins))))
                result = builtin(ctx, *args)
            elif isinstance(fn, RemoteHandle):
                result = self._call_packed(self._get(fn, _KIND_FUNCTION), args)
            else:
                raise ProtocolError("CALL fn must be a built-in name or a function handle, got %s"
                                    % type(fn).__name__)
        finally:
            if bulk is not None:
                bulk.drain()
        return result if isinstance(result, Reply) else Reply(result)

    def call_plain(self, fn: Any, args: List[Any], emit: Optional[EmitFn] = None) -> Any:
        """:meth:`call` for the small-call fast path: no bulk bytes, and ``args`` a list of plain values and
        handles only (no tensors: the transport checked). Returns the bare value, or a :class:`Reply` when the
        built-in made one; raises exactly what :meth:`call` raises."""
        if type(fn) is str:
            builtin = self._builtins.get(fn)
            if builtin is None:
                raise KeyError("no built-in function %r (have: %s)" % (fn, ", ".join(sorted(self._builtins))))
            return builtin(CallContext(None, emit), *args)
        if type(fn) is not RemoteHandle:
            raise ProtocolError("CALL fn must be a built-in name or a function handle, got %s" % type(fn).__name__)
        objects = self._objects
        entry = objects.get(fn.id)
        if entry is None or entry[0] != _KIND_FUNCTION:
            self._get(fn, _KIND_FUNCTION)  # raises the error that names the problem
        # The common kernel call: device arrays only. Their ctypes arguments are built once per (function,
        # arrays) and reused (PackedFunc.bind), until an object is freed. Scalars are not cached: 1, 1.0 and
        # True compare equal but travel differently.
        ids: Optional[List[int]] = [fn.id]
        for a in args:
            if type(a) is not RemoteHandle:
                ids = None
                break
            ids.append(a.id)  # type: ignore[union-attr]
        if ids is not None:
            key = tuple(ids)
            bound = self._bound.get(key)
            if bound is None:
                bound = self._bind(entry[1], args, key)
            if bound is not None:
                return bound()
        kargs = args
        for i, a in enumerate(args):
            if type(a) is RemoteHandle:
                if kargs is args:
                    kargs = list(args)
                arr = objects.get(a.id)
                kargs[i] = arr[1] if arr is not None and arr[0] == _KIND_ARRAY else self._get(a, _KIND_ARRAY)
        return entry[1](*kargs)

    def _bind(self, func: Any, args: List[Any], key: Tuple[int, ...]) -> Optional[Callable[[], Any]]:
        bind = getattr(func, "bind", None)
        if bind is None:
            return None
        bound = bind(*[self._get(a, _KIND_ARRAY) for a in args])
        if len(self._bound) >= _BOUND_MAX:
            self._bound.clear()
        self._bound[key] = bound
        return bound

    def close(self) -> None:
        """Drop every object: arrays are freed, modules unloaded (dlclose) once none of their functions is held,
        and then the GPU devices the session opened are closed."""
        self._bound.clear()
        objects, self._objects = self._objects, {}
        for kind, obj in objects.values():
            try:
                _release(kind, obj)
            except Exception:  # one object's failure must not keep the others (or the session) alive
                log.exception("releasing a %s at the end of the session failed", kind)
        devices, self._devices = self._devices, None
        if devices is not None:
            devices.close()

    # -- GPU devices -------------------------------------------------------------------------------------------
    def device(self, spec: Any) -> Any:
        """The session's DeviceAPI for ``"opencl:0"`` (opened on first use, closed with the session);
        GpuUnavailable naming the device when this one has no such GPU."""
        if self._devices is None:
            from .gpu.session_devices import SessionDevices

            self._devices = SessionDevices()
        return self._devices.get(spec)

    @staticmethod
    def _gpu_spec(device: Any) -> Optional[str]:
        """None for host memory (no device, "cpu"), else the canonical "API:INDEX"."""
        if device is None:
            return None
        from .gpu.array import canonical_spec

        return canonical_spec(device)

    # -- object table ------------------------------------------------------------------------------------------
    def _put(self, kind: str, obj: Any) -> RemoteHandle:
        self.budget.check_handles(len(self._objects))
        handle = RemoteHandle(self._next_id)
        self._next_id += 1
        self._objects[handle.id] = (kind, obj)
        return handle

    def _get(self, handle: Any, kind: str) -> Any:
        if not isinstance(handle, RemoteHandle):
            raise TypeError("expected a %s handle, got %s" % (kind, type(handle).__name__))
        entry = self._objects.get(handle.id)
        if entry is None:
            raise KeyError("handle %d does not exist in this session (freed already?)" % handle.id)
        if entry[0] != kind:
            raise TypeError("handle %d is a %s, expected a %s" % (handle.id, entry[0], kind))
        return entry[1]

    def _kernel_args(self, args: List[Any]) -> Tuple[List[Any], List[Any]]:
        """Handles -> device arrays; tensors -> fresh writable device copies (returned so results travel back)."""
        out: List[Any] = []
        copies: List[Any] = []
        for a in args:
            if isinstance(a, RemoteHandle):
                out.append(self._get(a, _KIND_ARRAY))
            elif isinstance(a, np.ndarray):
                from . import ndarray

                copy = ndarray.from_numpy(a)
                copies.append(copy)
                out.append(copy)
            else:
                out.append(a)
        return out, copies

    def _call_packed(self, func: Any, args: List[Any]) -> Reply:
        kargs, copies = self._kernel_args(args)
        value = func(*kargs)
        return Reply(value, tensors=[c.array for c in copies] if copies else None)

    # -- built-ins ---------------------------------------------------------------------------------------------
    def _echo(self, ctx: CallContext, *args: Any) -> Any:
        return args[0] if len(args) == 1 else list(args)

    def _functions(self, ctx: CallContext) -> List[str]:
        return sorted(self._builtins)

    def _device_info(self, ctx: CallContext) -> Dict[str, Any]:
        from . import device_info

        info = device_info.device_info()
        info["session_limits"] = self.limits.describe()
        return info

    @staticmethod
    def _array_info(handle: RemoteHandle, arr: Any) -> Dict[str, Any]:
        info = {"handle": handle, "shape": list(arr.shape), "dtype": arr.dtype}
        spec = getattr(arr, "device_spec", None)
        if spec is not None:    # host arrays leave it out: older clients compare their replies as they were
            info["device"] = spec
        return info

    def _array_empty(self, ctx: CallContext, shape: Any, dtype: str = "float32", device: Any = None
                     ) -> Dict[str, Any]:
        from . import ndarray

        nbytes = ndarray.nbytes_of(shape, dtype)
        spec = self._gpu_spec(device)
        if spec is None:
            self.budget.reserve_memory(nbytes, "an array of shape %s %s" % (shape, dtype))
            return self._keep_array(ndarray.empty, (shape, dtype), nbytes)
        from .gpu import array as gpu_array

        api = self.device(spec)  # a missing GPU is named before any memory is charged
        self.budget.reserve_memory(nbytes, "an array of shape %s %s on %s" % (shape, dtype, spec))
        return self._keep_array(gpu_array.empty, (api, shape, dtype), nbytes)

    def _array_from_tensor(self, ctx: CallContext, tensor: Any, device: Any = None) -> Dict[str, Any]:
        from . import ndarray

        if not isinstance(tensor, np.ndarray):
            raise TypeError("tether.array.from_tensor takes a tensor, got %s" % type(tensor).__name__)
        spec = self._gpu_spec(device)
        if spec is None:
            self.budget.reserve_memory(int(tensor.nbytes), "an array of shape %s %s" % (tensor.shape, tensor.dtype))
            return self._keep_array(ndarray.from_numpy, (tensor,), int(tensor.nbytes))
        from .gpu import array as gpu_array

        api = self.device(spec)
        self.budget.reserve_memory(int(tensor.nbytes), "an array of shape %s %s on %s"
                                   % (tensor.shape, tensor.dtype, spec))
        return self._keep_array(gpu_array.from_numpy, (api, tensor), int(tensor.nbytes))

    def _keep_array(self, make: Callable[..., Any], args: Tuple[Any, ...], nbytes: int) -> Dict[str, Any]:
        """Make an array whose ``nbytes`` are already reserved and put it in the table (or give them back)."""
        arr = None
        try:
            arr = make(*args)
            handle = self._put(_KIND_ARRAY, arr)
        except BaseException:
            self.budget.release_memory(nbytes)
            if arr is not None:
                _release(_KIND_ARRAY, arr)
            raise
        return self._array_info(handle, arr)

    def _array_copy_in(self, ctx: CallContext, handle: Any) -> None:
        arr = self._get(handle, _KIND_ARRAY)
        bulk = ctx.require_bulk("tether.array.copy_in")
        if bulk.nbytes != arr.nbytes:
            raise ValueError("copy_in: %d bytes sent, the array %s %s holds %d"
                             % (bulk.nbytes, arr.dtype, tuple(arr.shape), arr.nbytes))
        view = getattr(arr, "view", None)
        if view is not None:
            bulk.readinto(view)
            return
        # a GPU array: the bytes land in host memory first (drivers copy from host pointers), in bounded pieces so
        # a big array needs no second copy of itself in host memory
        staging = np.empty(min(arr.nbytes, GPU_STAGING), np.uint8)
        for offset in range(0, arr.nbytes, GPU_STAGING):
            piece = staging[:min(GPU_STAGING, arr.nbytes - offset)]
            bulk.readinto(memoryview(piece))
            arr.device.upload(arr.buffer, piece, offset)

    def _array_copy_out(self, ctx: CallContext, handle: Any) -> Reply:
        arr = self._get(handle, _KIND_ARRAY)
        view = getattr(arr, "view", None)
        if view is not None:
            return Reply(None, buffer=view)
        staging = np.empty(arr.nbytes, np.uint8)
        arr.download_into(staging)
        return Reply(None, buffer=staging)

    def _array_copy_to(self, ctx: CallContext, src: Any, dst: Any) -> None:
        """Every element of array ``src`` into array ``dst`` (any devices of this session, same shape and dtype)."""
        from .gpu.array import copy_array

        copy_array(self._get(dst, _KIND_ARRAY), self._get(src, _KIND_ARRAY))

    def _free(self, ctx: CallContext, handle: Any) -> None:
        self._bound.clear()  # bound calls keep their arrays' memory alive
        entry = self._objects.pop(handle.id, None) if isinstance(handle, RemoteHandle) else None
        if entry is None:
            raise KeyError("cannot free %r: no such handle in this session" % (handle,))
        if entry[0] == _KIND_ARRAY:
            self.budget.release_memory(int(entry[1].nbytes))
        _release(*entry)

    def _upload(self, ctx: CallContext, name: Any) -> Dict[str, Any]:
        bulk = ctx.require_bulk("tether.upload")
        path = self.folder.path_for(name)  # refuses unsafe names before anything is written
        if self.limits.disk is not None:   # (a file of the same name is replaced: its bytes do not count)
            replaced = os.path.getsize(path) if os.path.isfile(path) else 0
            self.budget.check_disk(folder_bytes(self.folder.path) - replaced, bulk.nbytes, str(name))
        # Write beside it and rename over it: rewriting a library that is still mapped (loaded earlier in
        # this session) in place would change code under a running process and can crash it.
        # Memory stays flat however big the upload: the bytes move in bounded pieces (splice(2) where there is
        # one, else a scratch buffer). Receiving straight into an mmap of the file was measured slower: page
        # faults cost more than the copy they save.
        fd, part = tempfile.mkstemp(prefix=".upload-", dir=os.path.dirname(path))
        try:
            try:
                if bulk.nbytes:
                    bulk.readinto_fd(fd, bulk.nbytes)
            finally:
                os.close(fd)
            os.replace(part, path)
        except BaseException:
            try:
                os.remove(part)
            except OSError:
                pass
            raise
        return {"name": name, "size": bulk.nbytes}

    def _download(self, ctx: CallContext, name: Any) -> Reply:
        size = self.folder.size(name)
        return Reply({"name": name, "size": size}, file=self.folder.open_read(name), size=size)

    def _listdir(self, ctx: CallContext) -> List[str]:
        return self.folder.listdir()

    def _remove(self, ctx: CallContext, name: Any) -> None:
        self.folder.remove(name)

    def _module_load(self, ctx: CallContext, name: Any) -> Dict[str, Any]:
        from . import module

        # a GPU module runs on the session's device "API:0", the one its device arrays live on
        mod = module.load_module(self.folder.existing(name), device=lambda api: self.device(api + ":0"))
        try:
            handle = self._put(_KIND_MODULE, mod)
        except BaseException:   # (over --session-handles) the library is not kept loaded for nothing
            mod.close()
            raise
        return {"handle": handle, "functions": list(mod.function_names), "metadata": mod.metadata}

    def _module_get_function(self, ctx: CallContext, handle: Any, name: Any) -> Dict[str, Any]:
        mod = self._get(handle, _KIND_MODULE)
        if not isinstance(name, str) or name not in mod.function_names:
            raise KeyError("module has no function %r (it has: %s)" % (name, ", ".join(mod.function_names)))
        func = mod[name]
        handle = self._put(_KIND_FUNCTION, func)
        mod.acquire()   # the library stays loaded while this handle exists, even if the module's is freed
        return {"handle": handle, "name": name}

    def _time_evaluator(self, ctx: CallContext, func_handle: Any, args: Any, options: Any = None) -> Dict[str, Any]:
        from . import timing

        func = self._get(func_handle, _KIND_FUNCTION)
        if not isinstance(args, list):
            raise TypeError("time_evaluator args must be a list")
        opts = dict(options or {})
        allowed = {"number", "repeat", "min_repeat_ms", "warmup", "cooldown_ms", "flush_bytes"}
        unknown = set(opts) - allowed
        if unknown:
            raise TypeError("unknown time_evaluator options: %s (allowed: %s)"
                            % (", ".join(sorted(unknown)), ", ".join(sorted(allowed))))
        kargs, _ = self._kernel_args(args)

        last = int(opts.get("repeat", 3)) - 1

        def on_sample(index: int, seconds: float, *_: Any) -> None:
            # the last sample leaves together with the RETURN that follows it
            ctx.emit("sample", _defer=int(index) == last, index=int(index), seconds=float(seconds))

        result = timing.time_evaluator(func, kargs, on_sample=on_sample, **opts)
        return {"samples": [float(s) for s in result["samples"]], "number": int(result["number"]),
                "clock": result.get("clock", "host")}

