"""The client API: :func:`connect` -> :class:`RemoteSession` (and, in ``local.py``, the in-process twin).

Both sessions share :class:`SessionAPI`, which implements the whole surface (arrays, modules, functions,
time_evaluator, files, device info) on one primitive, ``_call(fn, args, bulk, into)``. A remote session
implements it with frames on a socket; a local one calls the same ``SessionHandler`` the device server uses.

Events streamed before a reply (timing samples, remote stdout/stderr lines, progress, queue position) reach
the callbacks ``on_event(payload)``, ``on_log(stream, line)`` and ``on_sample(index, seconds)``.
"""
from __future__ import annotations

import logging
import os
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import ml_dtypes  # noqa: F401 - loaded, so bfloat16 tensors and arrays come back as ml_dtypes.bfloat16
import numpy as np

from tether_rpc import protocol as p, tls as tether_tls, transport
from tether_rpc.dtypes import for_host, name_of, numpy_dtype, storage_of
from tether_rpc.error_mapping import SOCKET_ERRORS, error_from_payload, socket_error
from tether_rpc.errors import ConnectionClosed, ProtocolError, RemoteError, SessionCrashed, TetherError, TetherTimeout
from tether_rpc.gpu.array import canonical_spec
from tether_rpc.handshake import CORE_HANDSHAKE, ClientHandshake, hello_payload

from .timeout import DEFAULT, Timeout, UseDefault

log = logging.getLogger(__name__)

PathLike = Union[str, "os.PathLike[str]"]
Progress = Callable[[int, int], None]

#: Argument types sent as they are (checked by type identity: the per-call fast path).
_PLAIN_TYPES = frozenset((int, float, str, bytes, bool, type(None), p.RemoteHandle))
#: numpy arguments up to this many bytes in total travel inside the CALL frame; bigger ones via device arrays.
INLINE_TENSOR_LIMIT = 4 << 20
_CHUNK = 4 << 20
#: How long a client polls for a reply before it sleeps (seconds; see connect()).
DEFAULT_SPIN = 100e-6
# Message types as plain ints for the per-call hot path (an IntEnum member costs an attribute lookup).
_CALL = int(p.MsgType.CALL)
_RETURN = int(p.MsgType.RETURN)
#: An ERROR for request 0 of these types ends the whole session (the server's verdict, not a remote exception).
_SESSION_ENDED = frozenset([p.ErrorType.TIMEOUT])


# ---------------------------------------------------------------------------------------------------------------
# value objects

class _Statistic:
    """A read-only TimingResult attribute: one numpy reduction of its samples, as a float (seconds)."""

    def __init__(self, reduce: Callable[[Any], Any]):
        self.reduce = reduce

    def __get__(self, result: Optional["TimingResult"], owner: Optional[type] = None) -> Any:
        return self if result is None else float(self.reduce(result.samples))


@dataclass(frozen=True)
class TimingResult:
    """Per-call times in seconds, one sample per repeat (each the mean over ``number`` calls)."""

    samples: Tuple[float, ...]
    number: int
    clock: str = "host"      # "device": a GPU function's kernels timed by the device's events; "host": perf_counter

    median = _Statistic(np.median)
    mean = _Statistic(np.mean)
    std = _Statistic(np.std)
    min = _Statistic(np.min)
    max = _Statistic(np.max)

    def __repr__(self) -> str:
        return ("TimingResult(median=%.3g s, mean=%.3g s, std=%.3g s, min=%.3g s, max=%.3g s, repeat=%d, number=%d, "
                "clock=%s)" % (self.median, self.mean, self.std, self.min, self.max, len(self.samples), self.number,
                               self.clock))


# ---------------------------------------------------------------------------------------------------------------
# remote objects

def _contiguous(source: Any) -> np.ndarray:
    """C-contiguous without np.ascontiguousarray's habit of turning 0-d arrays into 1-d ones."""
    src = np.asarray(source)
    return src if src.flags.c_contiguous else np.ascontiguousarray(src).reshape(src.shape)


class RemoteArray:
    """An array living in a session: in the device's host memory (``device == "cpu"``) or in one of its GPUs
    (``"opencl:0"``). ``numpy()`` copies out, ``copyfrom`` copies in, ``copyto`` copies out or to another array."""

    def __init__(self, session: "SessionAPI", handle: p.RemoteHandle, shape: Sequence[int], dtype: str,
                 device: Optional[str] = None):
        self.session = session
        self.handle = handle
        self.shape = tuple(int(d) for d in shape)
        self.dtype = name_of(dtype)
        self.device = device or "cpu"
        self._freed = False

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * numpy_dtype(self.dtype).itemsize

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    def numpy(self) -> np.ndarray:
        out = np.empty(self.shape, numpy_dtype(self.dtype))
        self.session._call("tether.array.copy_out", [self.handle], into=transport.byte_view(out))
        return for_host(out)

    asnumpy = numpy

    def copyto(self, target: Any) -> Any:
        """Copy into ``target``: a RemoteArray of the same session (any of its devices; the copy stays on the
        device), or a C-contiguous numpy array. Shapes and dtypes must match. Returns ``target``."""
        if isinstance(target, RemoteArray):
            if target.shape != self.shape or target.dtype != self.dtype:
                raise ValueError("copyto: %r and %r differ in shape or dtype" % (self, target))
            self.session._call("tether.array.copy_to", [self.session._own(self), self.session._own(target)])
            return target
        if target.shape != self.shape or name_of(target.dtype) != self.dtype or not target.flags.c_contiguous:
            raise ValueError("copyto: target must be a C-contiguous %s array of shape %s" % (self.dtype, self.shape))
        self.session._call("tether.array.copy_out", [self.handle], into=transport.byte_view(storage_of(target)))
        return target

    def copyfrom(self, source: Any) -> "RemoteArray":
        if isinstance(source, RemoteArray):
            source.copyto(self)
            return self
        src = storage_of(np.asarray(source))
        if src.shape != self.shape:
            raise ValueError("copyfrom: shape %s does not match the remote array's %s" % (src.shape, self.shape))
        if name_of(src.dtype) != self.dtype and not (self.dtype == "bfloat16" and src.dtype == np.uint16):
            raise ValueError("copyfrom: dtype %s does not match the remote array's %s (convert with .astype(%r))"
                             % (name_of(src.dtype), self.dtype, self.dtype))
        src = _contiguous(src)
        self.session._call("tether.array.copy_in", [self.handle], bulk=transport.byte_view(src))
        return self

    def free(self) -> None:
        """Release the device memory now (otherwise it lives until the session ends). Idempotent."""
        if not self._freed and not self.session.closed:
            self.session._call("tether.array.free", [self.handle])
        self._freed = True

    def __enter__(self) -> "RemoteArray":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.free()

    def __repr__(self) -> str:
        where = "" if self.device == "cpu" else ", device=%s" % self.device
        return "RemoteArray(shape=%s, dtype=%s%s, handle=%d)" % (self.shape, self.dtype, where, self.handle.id)


class RemoteFunction:
    """A callable in a session: a packed function of a loaded module, or a built-in by name."""

    def __init__(self, session: "SessionAPI", fn: Union[str, p.RemoteHandle], name: str):
        self.session = session
        self.fn = fn
        self.name = name

    def __call__(self, *args: Any) -> Any:
        session = self.session
        # The hot path: scalars, device arrays and handles travel as they are, one small frame each way. Built-ins
        # take numpy arrays as tensors too; a kernel given numpy arrays copies them in and back (_call_arrays).
        wire = []
        for a in args:
            if type(a) in _PLAIN_TYPES:
                wire.append(a)
            elif type(a) is RemoteArray:
                wire.append(session._own(a))
            elif type(self.fn) is not str and isinstance(a, np.ndarray):
                return self._call_arrays(args)
            else:
                wire.append(session._plain_arg(a))
        return session._call(self.fn, wire)["value"]

    def _call_arrays(self, args: Sequence[Any]) -> Any:
        session = self.session
        wire, restore = session._kernel_args(args)
        try:
            reply = session._call(self.fn, wire)
            restore(reply.get("tensors"))
        finally:
            restore(None, cleanup_only=True)
        return reply["value"]

    def time_evaluator(self, number: int = 10, repeat: int = 3, min_repeat_ms: float = 0, warmup: int = 1,
                       cooldown_ms: float = 0, flush_bytes: int = 0) -> Callable[..., TimingResult]:
        """A callable that times this function on the device: ``repeat`` samples of ``number`` calls each.

        ``number`` grows until one repeat takes at least ``min_repeat_ms``. Samples stream to ``on_sample`` as
        they are measured.
        """
        if isinstance(self.fn, str):
            raise TypeError("time_evaluator needs a module function, not the built-in %r" % self.fn)
        options = {"number": int(number), "repeat": int(repeat), "min_repeat_ms": min_repeat_ms,
                   "warmup": int(warmup), "cooldown_ms": cooldown_ms}
        if flush_bytes:     # sent only when asked for: servers before it refuse the key
            options["flush_bytes"] = int(flush_bytes)

        def evaluate(*args: Any) -> TimingResult:
            wire, restore = self.session._kernel_args(args)
            try:
                value = self.session._call("tether.time_evaluator", [self.fn, wire, options])["value"]
            finally:
                restore(None, cleanup_only=True)
            return TimingResult(tuple(float(s) for s in value["samples"]), int(value["number"]),
                                str(value.get("clock", "host")))

        return evaluate

    def __repr__(self) -> str:
        return "RemoteFunction(%r)" % self.name


class RemoteModule:
    """A shared library loaded in a session; ``mod["name"]`` gives its packed functions."""

    def __init__(self, session: "SessionAPI", handle: p.RemoteHandle, name: str, functions: List[str],
                 metadata: Dict[str, Any]):
        self.session = session
        self.handle = handle
        self.name = name
        self.function_names = list(functions)
        self.metadata = metadata
        self._functions: Dict[str, RemoteFunction] = {}

    def get_function(self, name: str) -> RemoteFunction:
        if name not in self._functions:
            if name not in self.function_names:
                raise KeyError("module %r has no function %r (it has: %s)"
                               % (self.name, name, ", ".join(self.function_names)))
            value = self.session._call("tether.module.get_function", [self.handle, name])["value"]
            self._functions[name] = RemoteFunction(self.session, value["handle"], name)
        return self._functions[name]

    __getitem__ = get_function

    def __contains__(self, name: object) -> bool:
        return name in self.function_names

    def __repr__(self) -> str:
        return "RemoteModule(%r, functions=%s)" % (self.name, self.function_names)


# ---------------------------------------------------------------------------------------------------------------
# the shared session surface

class FileSource:
    """Upload from a file without reading it into memory."""

    def __init__(self, path: str):
        self.path = path
        self.size = os.path.getsize(path)


class SessionAPI:
    """Everything a session offers, over the ``_call`` primitive its subclass provides."""

    closed: bool

    def __init__(self, on_event: Optional[Callable[[Dict[str, Any]], None]] = None,
                 on_log: Optional[Callable[[str, str], None]] = None,
                 on_sample: Optional[Callable[[int, float], None]] = None):
        self.on_event = on_event
        self.on_log = on_log
        self.on_sample = on_sample
        self.closed = False

    # -- subclass contract -------------------------------------------------------------------------------------
    def _call(self, fn: Any, args: List[Any], bulk: Any = None, into: Optional[memoryview] = None,
              progress: Optional[Progress] = None) -> Dict[str, Any]:
        """Run one call; returns the RETURN payload (``value``, maybe ``tensors``; bulk bytes as ``data``)."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> "SessionAPI":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- events ------------------------------------------------------------------------------------------------
    def _dispatch_event(self, payload: Dict[str, Any]) -> None:
        kind = payload.get("kind")
        if self.on_event is not None:
            self.on_event(payload)
        if kind == "log":
            if self.on_log is not None:
                self.on_log(str(payload.get("stream", "stdout")), str(payload.get("line", "")))
            else:
                log.info("remote %s: %s", payload.get("stream", "stdout"), payload.get("line", ""))
        elif kind == "sample" and self.on_sample is not None:
            self.on_sample(int(payload.get("index", 0)), float(payload.get("seconds", 0.0)))

    # -- argument helpers --------------------------------------------------------------------------------------
    def _own(self, arr: RemoteArray) -> p.RemoteHandle:
        if arr.session is not self:
            raise ValueError("%r belongs to another session" % (arr,))
        if arr._freed:
            raise ValueError("%r was freed" % (arr,))
        return arr.handle

    def _plain_arg(self, a: Any) -> Any:
        if isinstance(a, RemoteArray):
            return self._own(a)
        if isinstance(a, RemoteFunction):
            return a.fn
        return a

    def _kernel_args(self, args: Sequence[Any]) -> Tuple[List[Any], Callable[..., None]]:
        """Arguments for a packed function; numpy arrays are copied in, and copied back out after the call.

        Small numpy arrays travel inside the CALL (the device returns them after the call); big ones go through
        temporary device arrays. Returns the wire arguments and ``restore(tensors, cleanup_only=False)``.
        """
        numpy_args = [a for a in args if isinstance(a, np.ndarray)]
        inline = sum(a.nbytes for a in numpy_args) <= INLINE_TENSOR_LIMIT
        temps: List[Tuple[np.ndarray, RemoteArray]] = []
        wire: List[Any] = []
        try:
            for a in args:
                if isinstance(a, np.ndarray) and not inline:
                    tmp = self.array(a)
                    temps.append((a, tmp))
                    wire.append(tmp.handle)
                else:
                    wire.append(self._plain_arg(a))
        except BaseException:
            for _, tmp in temps:
                tmp.free()
            raise

        def restore(tensors: Optional[List[np.ndarray]], cleanup_only: bool = False) -> None:
            if cleanup_only:
                for _, tmp in temps:
                    if not self.closed:
                        tmp.free()
                temps.clear()
                return
            if tensors is not None:
                for orig, new in zip(numpy_args, tensors):
                    if orig.flags.writeable:    # bit for bit: a bfloat16 tensor may come back as ml_dtypes'
                        np.copyto(storage_of(orig), storage_of(new).reshape(orig.shape))
            for orig, tmp in temps:
                if orig.flags.writeable:
                    if orig.flags.c_contiguous:
                        tmp.copyto(orig)
                    else:
                        np.copyto(storage_of(orig), storage_of(tmp.numpy()))

        return wire, restore

    # -- the public surface ------------------------------------------------------------------------------------
    def get_function(self, name: str) -> RemoteFunction:
        """A built-in function by name, e.g. ``get_function("tether.echo")(1) == 1``, or a host function the
        device registered (``rpc-server --functions FILE.py``), which runs in the session worker."""
        if name.startswith("tether."):
            return RemoteFunction(self, name, name)
        value = self._call("tether.get_function", [name])["value"]
        return RemoteFunction(self, value["handle"], name)

    def device_info(self) -> Dict[str, Any]:
        return self._call("tether.device_info", [])["value"]

    def empty(self, shape: Union[int, Sequence[int]], dtype: str = "float32",
              device: Optional[str] = None) -> RemoteArray:
        """An uninitialised array in the session: in host memory, or on ``device`` ("opencl:0", "vulkan:0",
        "cuda:0"; "cpu" or None is host memory)."""
        shape_t = (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(int(d) for d in shape)
        args: List[Any] = [list(shape_t), name_of(dtype)]
        spec = canonical_spec(device)
        if spec is not None:    # sent only for a GPU: a host array's CALL stays what every server knows
            args.append(spec)
        value = self._call("tether.array.empty", args)["value"]
        return RemoteArray(self, value["handle"], value["shape"], value["dtype"], value.get("device"))

    def array(self, source: Any, device: Optional[str] = None) -> RemoteArray:
        """A device array holding a copy of ``source`` (numpy array or anything np.asarray takes), in host memory
        or on ``device`` ("opencl:0", ...), like ``tvm.nd.array(x, dev)``."""
        src = _contiguous(source)
        arr = self.empty(src.shape, name_of(src.dtype), device=device)
        try:
            arr.copyfrom(src)
        except BaseException:
            arr.free()
            raise
        return arr

    def upload(self, source: Union[PathLike, bytes, bytearray, memoryview], name: Optional[str] = None,
               progress: Optional[Progress] = None) -> str:
        """Put a file into the session folder; ``source`` is a path or bytes. Returns the remote name."""
        if isinstance(source, (bytes, bytearray, memoryview)):
            if name is None:
                raise ValueError("upload of bytes needs a name=")
            bulk: Any = transport.byte_view(source)
        else:
            path = os.fspath(source)
            if name is None:
                name = os.path.basename(path)
            bulk = FileSource(path)
        self._call("tether.upload", [name], bulk=bulk, progress=progress)
        return name

    def download(self, name: str, path: Optional[PathLike] = None, progress: Optional[Progress] = None) -> Any:
        """A file from the session folder, as bytes (or written to ``path``, which is returned)."""
        reply = self._call("tether.download", [name], progress=progress)
        data = reply["data"]
        if path is None:
            return bytes(data)
        with open(path, "wb") as fh:
            fh.write(data)
        return path

    def listdir(self) -> List[str]:
        return self._call("tether.listdir", [])["value"]

    def remove(self, name: str) -> None:
        self._call("tether.remove", [name])

    def load_module(self, name: str) -> RemoteModule:
        """Load an uploaded module: a shared library (refused before dlopen if built for another architecture),
        or a .wasm on a JS device server; the device decides what it can load."""
        value = self._call("tether.module.load", [name])["value"]
        return RemoteModule(self, value["handle"], name, value["functions"], value["metadata"])

    def functions(self) -> List[str]:
        return self._call("tether.functions", [])["value"]

    def graph_executor(self, folder: Optional[PathLike] = None, **kwargs: Any) -> Any:
        """A graph executor for a compiled model on this session (see ``tether.rpc.graph_client``)."""
        from .graph_client import graph_executor

        return graph_executor(self, folder, **kwargs)


# ---------------------------------------------------------------------------------------------------------------
# the remote session

class RemoteSession(SessionAPI):
    """A session on a device server. Create with :func:`connect`; close with ``close()`` or ``with``."""

    def __init__(self, host: str, port: int, *, timeout: Union[Timeout, float, None, UseDefault] = DEFAULT,
                 token: Optional[str] = None, wait: bool = True, match: Optional[str] = None,
                 on_event: Optional[Callable[[Dict[str, Any]], None]] = None,
                 on_log: Optional[Callable[[str, str], None]] = None,
                 on_sample: Optional[Callable[[int, float], None]] = None,
                 on_queued: Optional[Callable[[int], None]] = None,
                 limits: p.Limits = p.DEFAULT_LIMITS, spin: float = DEFAULT_SPIN,
                 tls: Any = None, ca: Optional[str] = None):
        super().__init__(on_event=on_event, on_log=on_log, on_sample=on_sample)
        self.host, self.port = host, port
        self.timeout = Timeout.coerce(timeout)
        self._lock = threading.Lock()
        self._next_id = 1
        self._pack = p.new_packer().pack  # used under self._lock only
        self._pack_header = p.HEADER.pack
        self.session_id = 0
        self.server = ""
        try:
            sock = socket.create_connection((host, port), timeout=self.timeout.connect)
        except OSError as exc:
            raise socket_error(exc, "could not connect to %s:%d within %s s" % (host, port, self.timeout.connect),
                               "could not connect to tether rpc-server at %s:%d" % (host, port)) from exc
        context = tether_tls.client_context(tls, ca)
        if context is not None:
            sock = tether_tls.wrap_client(sock, context, host, "the server at %s:%d" % (host, port))
        self.sock = sock
        try:
            transport.configure_socket(sock)
            self._reader = transport.FrameReader(sock, limits)
            try:
                self._handshake(token, wait, match, on_queued)
            except SOCKET_ERRORS as exc:
                raise socket_error(exc, "handshake with %s:%d timed out" % (host, port),
                                   "handshake with %s:%d failed" % (host, port)) from exc
            sock.settimeout(None)
            if not transport.set_kernel_timeouts(sock, self.timeout.read, self.timeout.write):
                sock.settimeout(self.timeout.read)
            self._reader.spin = spin if spin > 0 else 0.0
        except BaseException:
            self.closed = True
            sock.close()
            raise

    def _handshake(self, token: Optional[str], wait: bool, match: Optional[str],
                   on_queued: Optional[Callable[[int], None]]) -> None:
        where = "%s:%d" % (self.host, self.port)
        handshake = ClientHandshake(CORE_HANDSHAKE, hello_payload(match=match, wait=wait), token,
                                    peer="the server at " + where, token_hint="connect(..., token=...)")
        limit = self.timeout.connect
        deadline = None if limit is None else time.monotonic() + limit
        sock = self.sock

        def read_frame() -> Tuple[int, int, Dict[str, Any]]:
            if deadline is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TetherTimeout("no session from %s: handshake/queue wait ran out" % where)
                sock.settimeout(remaining)
            else:
                sock.settimeout(None)
            try:
                return self._reader.read_frame()
            except TetherTimeout as exc:
                raise TetherTimeout("no session from %s within %s s (handshake or queue wait)"
                                    % (where, limit)) from exc

        def queued(msg_type: int, payload: Dict[str, Any]) -> bool:
            nonlocal deadline
            if msg_type != p.MsgType.EVENT or payload.get("kind") != "queued":
                return False
            # Queued: from now on the session phase bounds the wait.
            if deadline is not None:
                session = self.timeout.session
                deadline = None if session is None else max(deadline, time.monotonic() + session)
            position = int(payload.get("position", 0))
            log.info("waiting for the device at %s: position %d in its queue", where, position)
            if on_queued is not None:
                on_queued(position)
            self._dispatch_event(payload)
            return True

        welcome = handshake.run(sock, read_frame, queued)
        self.session_id = int(welcome.get("session", 0))
        self.server = str(welcome.get("server", ""))

    # -- the primitive -----------------------------------------------------------------------------------------
    def _call(self, fn: Any, args: List[Any], bulk: Any = None, into: Optional[memoryview] = None,
              progress: Optional[Progress] = None) -> Dict[str, Any]:
        if self.closed:
            raise ConnectionClosed("the session to %s:%d is closed" % (self.host, self.port))
        with self._lock:
            rid = self._next_id
            self._next_id = rid + 1
            try:
                frame = None
                if bulk is None:  # the hot path: one small frame out, one small frame back
                    body = self._pack([_CALL, rid, {"fn": fn, "args": args}])
                    self.sock.sendall(self._pack_header(len(body)) + body)
                    frame = self._reader.read_plain_frame()
                    if frame is not None and frame[0] == _RETURN and frame[1] == rid and "nbytes" not in frame[2]:
                        return frame[2]  # RETURN without bulk bytes
                else:
                    self._send_call(rid, fn, args, bulk, progress)
                return self._receive_reply(rid, into, progress, frame)
            except BlockingIOError as exc:  # SO_SNDTIMEO ran out
                self._abort()
                raise TetherTimeout("timed out sending to %s:%d" % (self.host, self.port)) from exc
            except RemoteError as exc:
                if isinstance(exc, SessionCrashed) or exc.remote_type in ("ProtocolError", "FrameTooLarge"):
                    self._abort()  # the worker is gone or closed the connection
                raise
            except (TetherError, OSError):
                # The byte stream is no longer trustworthy (or gone): the session is over.
                self._abort()
                raise

    def _send_call(self, rid: int, fn: Any, args: List[Any], bulk: Any, progress: Optional[Progress]) -> None:
        payload = {"fn": fn, "args": args}
        if bulk is None:
            transport.send_buffers(self.sock, [p.encode_frame(p.MsgType.CALL, rid, payload)])
            return
        if isinstance(bulk, FileSource):
            payload["nbytes"] = bulk.size
            transport.send_buffers(self.sock, [p.encode_frame(p.MsgType.CALL, rid, payload)])
            with open(bulk.path, "rb") as fh:
                sent = 0
                while sent < bulk.size:
                    step = min(_CHUNK if progress else bulk.size - sent, bulk.size - sent)
                    n = self.sock.sendfile(fh, sent, step)
                    if n == 0:
                        raise ConnectionClosed("file %s shrank while uploading" % bulk.path)
                    sent += n
                    if progress is not None:
                        progress(sent, bulk.size)
            return
        view = transport.byte_view(bulk)
        payload["nbytes"] = len(view)
        if progress is None:
            transport.send_buffers(self.sock, [p.encode_frame(p.MsgType.CALL, rid, payload), view])
            return
        transport.send_buffers(self.sock, [p.encode_frame(p.MsgType.CALL, rid, payload)])
        for start in range(0, len(view), _CHUNK):
            transport.send_buffers(self.sock, [view[start:start + _CHUNK]])
            progress(min(start + _CHUNK, len(view)), len(view))

    def _receive_reply(self, rid: int, into: Optional[memoryview], progress: Optional[Progress],
                       frame: Optional[Tuple[int, int, Dict[str, Any]]] = None) -> Dict[str, Any]:
        """Frames up to the call's RETURN (EVENTs dispatched, ERROR raised); ``frame``: one read already."""
        reader = self._reader
        while True:
            msg_type, reply_id, payload = frame if frame is not None else reader.read_frame()
            frame = None
            if msg_type == _RETURN and reply_id == rid and "nbytes" not in payload:  # RETURN without bulk
                return payload
            if msg_type == p.MsgType.EVENT:
                self._dispatch_event(payload)
                continue
            if msg_type == p.MsgType.ERROR:
                if reply_id not in (0, rid):
                    raise ProtocolError("ERROR for request %d while waiting for request %d" % (reply_id, rid))
                raise error_from_payload(payload, _SESSION_ENDED if reply_id == 0 else frozenset())
            if msg_type != p.MsgType.RETURN or reply_id != rid:
                raise ProtocolError("expected RETURN for request %d, got type %d for request %d"
                                    % (rid, msg_type, reply_id))
            nbytes = p.bulk_size(payload, reader.limits)
            if nbytes or "nbytes" in payload:
                if into is not None:
                    if nbytes != len(into):
                        reader.skip(nbytes)
                        raise ProtocolError("the device sent %d bytes, the destination holds %d" % (nbytes, len(into)))
                    reader.read_into(into)
                    payload["data"] = into
                elif progress is not None and nbytes:
                    out = bytearray(nbytes)
                    view = memoryview(out)
                    for start in range(0, nbytes, _CHUNK):
                        reader.read_into(view[start:start + _CHUNK])
                        progress(min(start + _CHUNK, nbytes), nbytes)
                    payload["data"] = out
                else:
                    payload["data"] = reader.read_bulk(nbytes)
            return payload

    # -- lifetime ----------------------------------------------------------------------------------------------
    def _abort(self) -> None:
        self.closed = True
        transport.close_quietly(self.sock)

    def close(self) -> None:
        """End the session (the device is free at once). Idempotent."""
        if self.closed:
            return
        self.closed = True
        try:
            self.sock.sendall(p.encode_frame(p.MsgType.CLOSE, 0, {}))
        except OSError:
            pass
        transport.close_quietly(self.sock)

    def __repr__(self) -> str:
        return "RemoteSession(%s:%d, session=%d%s)" % (self.host, self.port, self.session_id,
                                                       ", closed" if self.closed else "")


def connect(host: str = "127.0.0.1", port: int = 9090, *,
            timeout: Union[Timeout, float, None, UseDefault] = DEFAULT,
            token: Optional[str] = None, wait: bool = True, match: Optional[str] = None,
            on_event: Optional[Callable[[Dict[str, Any]], None]] = None,
            on_log: Optional[Callable[[str, str], None]] = None,
            on_sample: Optional[Callable[[int, float], None]] = None,
            on_queued: Optional[Callable[[int], None]] = None, spin: float = DEFAULT_SPIN,
            tls: Any = None, ca: Optional[str] = None) -> RemoteSession:
    """Open a session on a device server (waits in its queue if busy, unless ``wait=False``).

    ``timeout`` is a :class:`Timeout` (a phase set to None waits without limit) or a number of seconds for every
    phase. ``token`` must match the server's
    ``--token`` (defaults to the TETHER_TOKEN environment variable). ``spin``: seconds to poll for a reply before
    sleeping, while replies keep coming that fast (adaptive; 0 = always sleep): it saves a wake-up per small call.
    ``tls``: True (check the server's certificate against the system's CAs), an ``ssl.SSLContext``, or None/False
    for plain TCP; ``ca``: a PEM file of the CA (or self-signed certificate) to trust, which implies TLS
    (docs/tls.md). The token handshake runs inside TLS unchanged.
    """
    if token is None:
        token = os.environ.get("TETHER_TOKEN") or None
    return RemoteSession(host, port, timeout=timeout, token=token, wait=wait, match=match, on_event=on_event,
                         on_log=on_log, on_sample=on_sample, on_queued=on_queued, spin=spin, tls=tls, ca=ca)
