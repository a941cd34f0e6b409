"""The tether wire protocol's frames: message types, limits, the msgpack codec with its tensor/handle ext types,
and :class:`FrameBuffer`, the sans-IO frame decoder.

Sending and receiving frames over a socket is :mod:`tether_rpc.transport`; the HELLO/CHALLENGE/AUTH/WELCOME
exchange (payloads, token MACs, the client's side of it) is :mod:`tether_rpc.handshake`.

Wire format (``docs/protocol.md`` is the language-neutral reference; a test keeps the two in step)::

    frame   = length:u32 big-endian  body:length bytes
    body    = msgpack array [msg_type:int, request_id:int, payload:map]   (map keys are strings)
    bulk    = if payload has "nbytes": K, exactly K raw bytes follow the frame on the wire

* A frame is written with one send call (header and body concatenated, or one ``sendmsg``), never two.
* ``request_id`` is chosen by the caller of a CALL and echoed on every EVENT, RETURN and ERROR for it;
  0 means "the session itself" (handshake frames, a crashed or timed-out session).
* Message types 1-63 are the RPC core (:class:`MsgType`); 64-127 are reserved for the tracker, which defines
  its own enum on top of the generic :func:`encode_frame` / :class:`FrameBuffer` below.
* msgpack ext type 1 is a tensor, ext type 2 a remote handle; any other ext type is a protocol error.

  tensor ext data = dtype_len:u8  dtype:ascii  ndim:u8  shape:ndim x u64 big-endian  raw element bytes
                    (dtype is a tether dtype name such as "float32", or "bfloat16" carried as its uint16 bit
                    patterns; elements are little-endian, C order)
  handle ext data = id:u64 big-endian

Everything a peer sends is checked against :class:`Limits` before anything is allocated for it.
"""
from __future__ import annotations

import enum
import struct
import sys
import threading
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Tuple

import msgpack

# numpy is imported on first use (tensors only): the server then listens before the slow numpy import.
from .dtypes import WIRE_DTYPES, for_host, name_of, numpy_dtype, storage_of
from .errors import FrameTooLarge, ProtocolError

PROTOCOL_MAGIC = "tether-rpc"
PROTOCOL_VERSION = 1
#: Capabilities this implementation offers; a peer ignores names it does not know.
CAPABILITIES = ("bulk", "events", "tensor-ext", "handle-ext", "auth-hmac-sha256")

HEADER = struct.Struct(">I")
HEADER_SIZE = HEADER.size

EXT_TENSOR = 1
EXT_HANDLE = 2

#: Message types 64..127 belong to the tracker (see the tracker's own module).
TRACKER_TYPE_MIN = 64
TRACKER_TYPE_MAX = 127


class MsgType(enum.IntEnum):
    """Core message types. Values are part of the wire format: never renumber."""

    HELLO = 1       # client -> server  {magic, version, caps, match?, wait?, client?}
    CHALLENGE = 2   # server -> client  {algo, nonce}
    AUTH = 3        # client -> server  {nonce, mac}
    WELCOME = 4     # server -> client  {version, caps, server, session, proof?}
    CALL = 5        # client -> server  {fn, args, nbytes?}
    RETURN = 6      # server -> client  {value, nbytes?}
    ERROR = 7       # server -> client  {type, message, traceback} (a client's ERROR is a ProtocolError)
    EVENT = 8       # server -> client  {kind, ...}
    CLOSE = 9       # client -> server  {reason?}


class ErrorType:
    """Well-known ERROR ``type`` strings (a remote Python exception uses its class name)."""

    VERSION_MISMATCH = "VersionMismatch"
    AUTHENTICATION = "AuthenticationError"
    PROTOCOL = "ProtocolError"
    FRAME_TOO_LARGE = "FrameTooLarge"
    DEVICE_BUSY = "DeviceBusy"
    SESSION_CRASHED = "SessionCrashed"
    TIMEOUT = "TetherTimeout"


@dataclass(frozen=True)
class Limits:
    """Upper bounds on what a peer may make us allocate. Checked before allocation."""

    max_frame: int = 16 << 20          # one msgpack body; larger data travels as bulk bytes
    max_bulk: int = 4 << 30            # bytes following one frame
    max_str: int = 1 << 20
    max_bin: int = 16 << 20
    max_array: int = 1 << 16
    max_map: int = 1 << 12
    max_ext: int = 16 << 20
    max_depth: int = 32
    max_ndim: int = 32

    def unpack_options(self) -> dict:
        return dict(max_str_len=self.max_str, max_bin_len=self.max_bin, max_array_len=self.max_array,
                    max_map_len=self.max_map, max_ext_len=self.max_ext)


DEFAULT_LIMITS = Limits()
#: Tight limits for frames from a peer that has not finished its handshake (the server's parent process).
HANDSHAKE_LIMITS = Limits(max_frame=64 << 10, max_bulk=0, max_str=4096, max_bin=4096, max_array=64, max_map=32,
                          max_ext=0, max_depth=4)


# ---------------------------------------------------------------------------------------------------------------
# ext types

class RemoteHandle:
    """An object (array, module, function) living in a remote session, named by its 64-bit id."""

    __slots__ = ("id", "_ext")

    def __init__(self, id: int):
        if not isinstance(id, int) or not 0 <= id < 1 << 64:
            raise ProtocolError("a remote handle id must be an unsigned 64-bit int, got %r" % (id,))
        self.id = id
        self._ext: Optional[msgpack.ExtType] = None  # its wire form, made on first send (handles are resent often)

    @classmethod
    def _decoded(cls, data: bytes) -> "RemoteHandle":
        # from the 8 bytes of an ext-2 payload: any u64 is valid, so no checks (ext_hook runs once per handle)
        handle = cls.__new__(cls)
        handle.id = _U64.unpack(data)[0]
        handle._ext = None
        return handle

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RemoteHandle) and other.id == self.id

    def __hash__(self) -> int:
        return hash(("RemoteHandle", self.id))

    def __repr__(self) -> str:
        return "RemoteHandle(%d)" % self.id


_U64 = struct.Struct(">Q")


def tensor_header(dtype: str, shape: Tuple[int, ...]) -> bytes:
    """The ext-1 prefix for a tensor; the raw element bytes follow it."""
    name = name_of(dtype)
    if name not in WIRE_DTYPES:
        raise ProtocolError("dtype %r cannot travel as a tensor (allowed: %s)"
                            % (name, ", ".join(sorted(WIRE_DTYPES))))
    encoded = name.encode("ascii")
    return (bytes((len(encoded),)) + encoded + bytes((len(shape),))
            + b"".join(_U64.pack(int(d)) for d in shape))


def encode_tensor(array: Any) -> msgpack.ExtType:
    import numpy as np

    # ascontiguousarray turns 0-d arrays into 1-d ones, hence the reshape
    arr = np.ascontiguousarray(array).reshape(np.shape(array))
    name = name_of(arr.dtype)
    arr = storage_of(arr)           # bfloat16 (tagged or ml_dtypes) travels as its uint16 bit patterns
    if arr.dtype.byteorder == ">":
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    return msgpack.ExtType(EXT_TENSOR, tensor_header(name, arr.shape) + arr.tobytes())


def decode_tensor(data: bytes, limits: Limits = DEFAULT_LIMITS) -> Any:
    """Decode ext-1 data zero-copy (the array is a read-only numpy view of ``data``). A bfloat16 tensor is its
    tagged uint16 bit patterns, or ml_dtypes' bfloat16 where this process has loaded ml_dtypes (the host)."""
    import numpy as np

    try:
        n = data[0]
        name = bytes(data[1:1 + n]).decode("ascii")
        pos = 1 + n
        ndim = data[pos]
        pos += 1
    except (IndexError, UnicodeDecodeError) as exc:
        raise ProtocolError("malformed tensor ext: truncated or non-ascii dtype") from exc
    if name not in WIRE_DTYPES:
        raise ProtocolError("tensor ext names dtype %r, which is not accepted" % name)
    if ndim > limits.max_ndim:
        raise ProtocolError("tensor ext has %d dimensions (limit %d)" % (ndim, limits.max_ndim))
    if len(data) < pos + 8 * ndim:
        raise ProtocolError("malformed tensor ext: shape truncated")
    shape = tuple(_U64.unpack_from(data, pos + 8 * i)[0] for i in range(ndim))
    pos += 8 * ndim
    dtype = numpy_dtype(name)
    if dtype.itemsize > 1 and sys.byteorder != "little":   # (a little-endian dtype as it is: its tag stays)
        dtype = dtype.newbyteorder("<")
    count = 1
    for d in shape:
        count *= d
    if count * dtype.itemsize != len(data) - pos:
        raise ProtocolError("tensor ext of shape %s %s needs %d bytes, carries %d"
                            % (shape, name, count * dtype.itemsize, len(data) - pos))
    if count == 0:  # old numpy refuses frombuffer at the very end of a buffer
        return for_host(np.empty(shape, dtype.newbyteorder("=")))
    arr = np.frombuffer(data, dtype=dtype, count=count, offset=pos).reshape(shape)
    return for_host(arr if arr.dtype.isnative else arr.astype(arr.dtype.newbyteorder("=")))


def _default(obj: Any) -> Any:
    if type(obj) is RemoteHandle:
        ext = obj._ext
        if ext is None:
            ext = obj._ext = msgpack.ExtType(EXT_HANDLE, _U64.pack(obj.id))
        return ext
    if isinstance(obj, RemoteHandle):
        return msgpack.ExtType(EXT_HANDLE, _U64.pack(obj.id))
    np = sys.modules.get("numpy")  # no numpy loaded -> obj cannot be a numpy object
    if np is not None:
        if isinstance(obj, np.ndarray):
            return encode_tensor(obj)
        if isinstance(obj, np.generic):
            return obj.item()
    if isinstance(obj, tuple):
        return list(obj)
    raise TypeError("cannot send %s over tether rpc (use numbers, str, bytes, lists, dicts, numpy arrays)"
                    % type(obj).__name__)


def _make_ext_hook(limits: Limits):
    decoded_handle = RemoteHandle._decoded

    def ext_hook(code: int, data: bytes) -> Any:
        if code == EXT_TENSOR:
            return decode_tensor(data, limits)
        if code == EXT_HANDLE:
            if len(data) != 8:
                raise ProtocolError("handle ext must carry 8 bytes, got %d" % len(data))
            return decoded_handle(data)
        raise ProtocolError("unknown msgpack ext type %d" % code)
    return ext_hook


def _check_depth(obj: Any, max_depth: int) -> None:
    """Level-by-level walk (no recursion) refusing nesting deeper than ``max_depth``."""
    level = [obj]
    depth = 1
    while level:
        if depth > max_depth:
            raise ProtocolError("frame nests deeper than %d levels" % max_depth)
        nxt = []
        for item in level:
            children = item.values() if type(item) is dict else item
            for x in children:
                if type(x) is list or type(x) is dict:
                    nxt.append(x)
        level = nxt
        depth += 1


_Timestamp = msgpack.Timestamp


def _checked_map(d: dict) -> dict:
    # strict_map_key still admits bin keys, and msgpack decodes ext -1 (timestamp) itself without asking
    # ext_hook: both are outside the wire format, so refuse them here (docs/protocol.md).
    for k, v in d.items():
        if type(k) is not str:
            raise ProtocolError("map keys must be strings, got %s %.40r" % (type(k).__name__, k))
        if type(v) is _Timestamp:
            raise ProtocolError("unknown msgpack ext type -1 (timestamp) in map value %r" % k)
    return d


def _checked_list(items: list) -> list:
    for v in items:
        if type(v) is _Timestamp:
            raise ProtocolError("unknown msgpack ext type -1 (timestamp) in an array")
    return items


_UNPACK_OPTIONS: Dict[Tuple[Limits, bool], dict] = {}


def _unpack_options(limits: Limits, hooks: bool = True) -> dict:
    opts = _UNPACK_OPTIONS.get((limits, hooks))
    if opts is None:
        opts = dict(raw=False, strict_map_key=True, ext_hook=_make_ext_hook(limits), **limits.unpack_options())
        if hooks:
            opts.update(object_hook=_checked_map, list_hook=_checked_list)
        _UNPACK_OPTIONS[(limits, hooks)] = opts
    return opts


#: What a "plain" frame's payload values may be (directly, or as items of a list): scalars and handles. A frame
#: made only of these cannot hide what the per-container hooks look for (timestamps, non-string keys, deep
#: nesting), so the hook-free decoder plus one shallow type check accepts exactly what the checked decoder does.
PLAIN_TYPES = frozenset((int, float, str, bytes, bool, type(None), RemoteHandle))
#: Bodies up to this size are tried as plain frames first (small calls and their replies).
PLAIN_FRAME_MAX = 4096


# ---------------------------------------------------------------------------------------------------------------
# frames

_local = threading.local()


def new_packer() -> msgpack.Packer:
    """A Packer for tether values (handles, tensors, numpy scalars). Reusing one is ~2x faster than
    msgpack.packb, which builds one per call; it is not thread-safe."""
    return msgpack.Packer(default=_default, use_bin_type=True)


def _packer() -> msgpack.Packer:
    # one Packer per thread
    packer = getattr(_local, "packer", None)
    if packer is None:
        packer = _local.packer = new_packer()
    return packer


def encode_frame(msg_type: int, request_id: int, payload: Optional[dict] = None,
                 _pack_header: Any = HEADER.pack) -> bytes:
    """Header + body as one bytes object, ready for a single send call."""
    packer = getattr(_local, "packer", None) or _packer()
    body = packer.pack([msg_type, request_id, {} if payload is None else payload])
    return _pack_header(len(body)) + body


def decode_body(body: Any, limits: Limits = DEFAULT_LIMITS) -> Tuple[int, int, dict]:
    """Decode one frame body (bytes-like) into ``(msg_type, request_id, payload)``."""
    try:
        obj = msgpack.unpackb(body, **_unpack_options(limits))
    except ProtocolError:
        raise
    except Exception as exc:  # msgpack raises ValueError/FormatError/StackError/ExtraData/TypeError
        raise ProtocolError("undecodable frame body: %s: %s" % (type(exc).__name__, exc)) from exc
    return _check_frame(obj, len(body), limits)


def _check_frame(obj: Any, size: int, limits: Limits) -> Tuple[int, int, dict]:
    try:
        msg_type, request_id, payload = obj
    except (TypeError, ValueError):
        msg_type = request_id = payload = None
    if type(msg_type) is not int or type(request_id) is not int or type(payload) is not dict or type(obj) is not list:
        raise ProtocolError("a frame body must be [msg_type:int, request_id:int, payload:map], got %.80r" % (obj,))
    if not 0 < msg_type < 256 or request_id < 0:
        raise ProtocolError("bad msg_type %d or request_id %d" % (msg_type, request_id))
    # Each level of nesting costs at least one byte, so short bodies need no walk (the hot path: small calls).
    if size > limits.max_depth:
        _check_depth(payload, limits.max_depth)
    return msg_type, request_id, payload


def bulk_size(payload: dict, limits: Limits = DEFAULT_LIMITS) -> int:
    """How many raw bytes follow the frame carrying ``payload`` (checked against the limit)."""
    n = payload.get("nbytes", 0)
    if type(n) is not int or n < 0:
        raise ProtocolError("nbytes must be a non-negative int, got %r" % (n,))
    if n > limits.max_bulk:
        raise FrameTooLarge("bulk payload of %d bytes exceeds the limit of %d" % (n, limits.max_bulk))
    return n


class FrameBuffer:
    """Sans-IO frame decoder over one reusable buffer: fill it (``recv_into`` :meth:`free_space`, then
    :meth:`wrote`), then pop frames (:meth:`next_frame`) and bulk bytes (:meth:`take`, :meth:`pop_bytes`).
    The small-call fast path receives into an empty buffer and pops a plain frame from exactly what arrived
    (:meth:`read_plain`).

    Small frames are decoded straight out of the buffer, so one ``recv_into`` usually yields whole frames.
    The header's length is checked against ``limits.max_frame`` before any buffer grows for it.
    """

    def __init__(self, limits: Limits = DEFAULT_LIMITS, size: int = 256 << 10):
        self._buf = bytearray(size)
        self._view = memoryview(self._buf)  # the buffer is replaced, never resized, so this view stays valid
        self._start = 0
        self._end = 0
        self.limits = limits

    @property
    def limits(self) -> Limits:
        return self._limits

    @limits.setter
    def limits(self, limits: Limits) -> None:
        self._limits = limits
        self._unpacker = self._new_unpacker()
        self._plain = self._new_unpacker(hooks=False)
        self._plain_pos = 0
        self.plain_max = min(PLAIN_FRAME_MAX, limits.max_frame)

    def _new_unpacker(self, hooks: bool = True) -> msgpack.Unpacker:
        # A persistent Unpacker per connection decodes small frames ~1.6x faster than msgpack.unpackb.
        return msgpack.Unpacker(max_buffer_size=max(self._limits.max_frame, 1),
                                **_unpack_options(self._limits, hooks))

    def decode_plain(self, body: memoryview) -> Optional[Tuple[int, int, dict]]:
        """Decode a small body without the per-container hooks (about twice as fast); None unless the frame is
        well formed and plain (see PLAIN_TYPES). On None the caller decodes the same body with every check, which
        also produces the error for a bad one."""
        unpacker = self._plain
        try:
            unpacker.feed(body)
            obj = unpacker.unpack()
        except Exception:
            self._plain = self._new_unpacker(hooks=False)
            self._plain_pos = 0
            return None
        pos = self._plain_pos + len(body)
        if unpacker.tell() != pos:  # bytes after the object: not a valid frame
            self._plain = self._new_unpacker(hooks=False)
            self._plain_pos = 0
            return None
        self._plain_pos = pos
        if type(obj) is not list or len(obj) != 3:
            return None
        msg_type, request_id, payload = obj
        if (type(msg_type) is not int or type(request_id) is not int or type(payload) is not dict
                or not 0 < msg_type < 256 or request_id < 0):
            return None
        plain = PLAIN_TYPES
        for key, value in payload.items():
            if type(key) is not str:
                return None
            if type(value) not in plain:
                if type(value) is not list:
                    return None
                for item in value:
                    if type(item) not in plain:
                        return None
        return msg_type, request_id, payload

    def _decode(self, body: memoryview) -> Tuple[int, int, dict]:
        unpacker = self._unpacker
        before = unpacker.tell()
        try:
            unpacker.feed(body)
            obj = unpacker.unpack()
        except ProtocolError:
            self._unpacker = self._new_unpacker()
            raise
        except Exception as exc:  # OutOfData (truncated), FormatError, StackError, ValueError, ...
            self._unpacker = self._new_unpacker()
            raise ProtocolError("undecodable frame body: %s: %s" % (type(exc).__name__, exc)) from exc
        if unpacker.tell() - before != len(body):
            self._unpacker = self._new_unpacker()
            raise ProtocolError("frame body has %d bytes after its msgpack object"
                                % (len(body) - (unpacker.tell() - before)))
        return _check_frame(obj, len(body), self._limits)

    @property
    def buffered(self) -> int:
        return self._end - self._start

    def pending(self) -> bytes:
        """A copy of the buffered bytes not yet popped (the session watchdog looks in them for a CLOSE)."""
        return bytes(self._view[self._start:self._end])

    def free_space(self, need: int = 1) -> memoryview:
        """A writable view after the buffered bytes, compacting/growing so that at least ``need`` bytes fit."""
        if self._start == self._end:
            self._start = self._end = 0
        if len(self._buf) - self._end < need:
            used = self._end - self._start
            if used + need > len(self._buf):
                new = bytearray(max(used + need, len(self._buf)))
                new[:used] = self._view[self._start:self._end]
                self._buf = new
                self._view = memoryview(new)
            else:
                self._buf[:used] = self._buf[self._start:self._end]
            self._start, self._end = 0, used
        return self._view[self._end:]

    def wrote(self, n: int) -> None:
        self._end += n

    def feed(self, data: bytes) -> None:
        view = self.free_space(len(data))
        view[:len(data)] = data
        self._end += len(data)

    def missing(self) -> int:
        """Bytes still needed for the next complete frame (header included); 0 if one is ready."""
        avail = self._end - self._start
        if avail < HEADER_SIZE:
            return HEADER_SIZE - avail
        (n,) = HEADER.unpack_from(self._buf, self._start)
        if n > self.limits.max_frame:
            raise FrameTooLarge("frame of %d bytes exceeds the limit of %d" % (n, self.limits.max_frame))
        return max(0, HEADER_SIZE + n - avail)

    def next_frame(self) -> Optional[Tuple[int, int, dict]]:
        """Pop one decoded frame, or None if not all of it has arrived."""
        start = self._start
        avail = self._end - start
        if avail < HEADER_SIZE:
            return None
        (n,) = HEADER.unpack_from(self._buf, start)
        if n > self._limits.max_frame:
            raise FrameTooLarge("frame of %d bytes exceeds the limit of %d" % (n, self._limits.max_frame))
        if avail < HEADER_SIZE + n:
            return None
        begin = start + HEADER_SIZE
        self._start = begin + n
        return self._decode(self._view[begin:begin + n])

    def take(self, dest: memoryview) -> int:
        """Move already-buffered bytes (the start of a bulk payload) into ``dest``; returns how many."""
        n = min(len(dest), self._end - self._start)
        if n:
            dest[:n] = self._view[self._start:self._start + n]
            self._start += n
        return n

    def pop_bytes(self, n: int) -> memoryview:
        """Up to ``n`` already-buffered bytes (the start of a bulk payload), consumed; valid until the next fill."""
        start = self._start
        k = min(n, self._end - start)
        self._start = start + k
        return self._view[start:start + k]

    def read_plain(self, recv_into: Callable[[memoryview], int]) -> Optional[Tuple[int, int, dict]]:
        """The small-call fast path: if nothing is buffered, ``recv_into`` the whole buffer once, and if exactly one
        small plain frame arrived, pop it decoded. Otherwise (or if bytes were buffered already) return None and
        keep what arrived for :meth:`next_frame`, which decodes it with every check."""
        if self._start != self._end:
            return None
        self._start = 0
        n = self._end = recv_into(self._view)
        if n > HEADER_SIZE:
            (size,) = HEADER.unpack_from(self._buf, 0)
            if size + HEADER_SIZE == n and size <= self.plain_max:
                frame = self.decode_plain(self._view[HEADER_SIZE:n])
                if frame is not None:
                    self._start = n
                    return frame
        return None
