"""Fuzz targets: every parser that reads bytes from an untrusted peer or file, and what each may raise.

A target is ``fn(data: bytes) -> None``. It passes if it returns or raises one of its documented exceptions
(``Target.allowed``); any other exception is a bug, and so is a hang or a Python allocation above
``Target.memory(len(data))`` (traced with tracemalloc, see :func:`check_one`). The fuzzers (atheris under
``tests/fuzz/run_atheris.py``, the Java batch in ``tests/test_fuzz.py``) and the regression test over the
checked-in corpus (``tests/fuzz/corpus/<target>/``) all go through :func:`check_one`.

Targets: ``frames`` (the frame decoder, both its paths, bulk sizes and the watchdog's CLOSE scan),
``handshake`` (the server's HELLO/AUTH checks and the client's side, under the handshake limits), ``tracker``
(the tracker's payload checks under its limits), ``params`` (deploy.params), ``graph`` (deploy.json, read by the
graph executor against a real gcc-built module) and ``elf`` (the ELF reader and the module metadata check).
"""
from __future__ import annotations

import pathlib
import sys
import tracemalloc
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Tuple, Type

from tether_rpc import elf as elf_reader, handshake, params, protocol as p, tracker_protocol as tp
from tether_rpc.errors import AuthenticationError, ModuleLoadError, ProtocolError, RemoteError, TetherError
from tether_rpc.watchdog import queued_close

CORPUS = pathlib.Path(__file__).resolve().parent / "corpus"
MAX_INPUT = 1 << 16  # what the fuzzers feed (bigger inputs only repeat what small ones find)
MiB = 1 << 20


class FuzzFailure(AssertionError):
    """A target misbehaved on an input: an undocumented exception, or too much memory."""


@dataclass(frozen=True)
class Target:
    name: str
    run: Callable[[bytes], None]
    allowed: Tuple[Type[BaseException], ...]
    #: the most a run may allocate (Python + numpy), from the input's size
    memory: Callable[[int], int] = lambda n: 8 * MiB + 16 * n


def _frames_from(data: bytes, limits: p.Limits):
    """Frames decoded by FrameBuffer from ``data`` fed in two pieces (split where the first byte says)."""
    buf = p.FrameBuffer(limits, size=4096)
    cut = data[0] % (len(data) + 1) if data else 0
    for piece in (data[:cut], data[cut:]):
        buf.feed(piece)
        while True:
            frame = buf.next_frame()
            if frame is None:
                break
            yield frame
            if "nbytes" in frame[2]:
                n = p.bulk_size(frame[2], limits)
                while n and buf.buffered:
                    n -= len(buf.pop_bytes(n))


def fuzz_frames(data: bytes) -> None:
    queued_close(data)  # returns a bool for any input
    for _ in _frames_from(data, p.DEFAULT_LIMITS):
        pass
    plain = p.FrameBuffer(p.DEFAULT_LIMITS, size=MAX_INPUT + 16)

    def recv_into(view: memoryview) -> int:
        view[:len(data)] = data
        return len(data)
    if plain.read_plain(recv_into) is None:
        while plain.next_frame() is not None:
            pass


def fuzz_handshake(data: bytes) -> None:
    """Frames a client sends (starting with HELLO or AUTH) go through the server's checks, as the server's parent
    runs them; any other frames through the client's side (frames from a server). Both under the handshake
    limits."""
    nonce = bytes(32)
    client = handshake.ClientHandshake(handshake.CORE_HANDSHAKE, handshake.hello_payload(), "t0ken", "server",
                                       "pass token=")
    server_side = None
    for i, (msg_type, _, payload) in enumerate(_frames_from(data, p.HANDSHAKE_LIMITS)):
        if server_side is None:
            server_side = msg_type in (p.MsgType.HELLO, p.MsgType.AUTH)
        if not server_side:
            client.on_frame(msg_type, payload)  # (its AUTH reply, if any, goes nowhere)
        elif i == 0:
            handshake.check_hello(payload)
        else:
            handshake.check_auth("t0ken", nonce, payload)


def fuzz_tracker(data: bytes) -> None:
    checks = (tp.check_hello, tp.check_register, tp.check_request, tp.check_match)
    for _, _, payload in _frames_from(data, tp.TRACKER_LIMITS):
        for check in checks:
            try:
                check(payload)
            except ProtocolError:
                pass
        key = payload.get("key")
        if isinstance(key, str):
            pattern = tp.parse_pattern(key)
            tags = payload.get("tags")
            if isinstance(tags, dict) and all(isinstance(v, str) for v in tags.values()):
                tp.pattern_matches(pattern, key, tp.device_tags(key, tags, payload.get("info")
                                                                if isinstance(payload.get("info"), dict) else None))


def fuzz_params(data: bytes) -> None:
    params.load_params(data)


_MODULE: Dict[str, Any] = {}


def graph_module() -> Any:
    """The real module graph inputs are checked against: tests/kernels/vadd.c built by gcc, loaded once."""
    if "module" not in _MODULE:
        import tempfile

        sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
        from kernels import build_kernel
        from tether_rpc.module import load_module

        with tempfile.TemporaryDirectory(prefix="tether-fuzz-") as out:   # loaded (mapped): the file can go
            _MODULE["module"] = load_module(str(build_kernel("vadd", out)))
    return _MODULE["module"]


GRAPH_MAX_BYTES = 64 * MiB  # the fuzz run's storage limit (the runtime's default is larger)


def fuzz_graph(data: bytes) -> None:
    from tether_rpc.graph_executor import GraphExecutor

    GraphExecutor(data, graph_module(), max_bytes=GRAPH_MAX_BYTES)


def fuzz_elf(data: bytes) -> None:
    from tether_rpc.module import _check_elf, _read_metadata

    with elf_reader.read_elf(data) as f:
        f.arch, f.machine_name, f.is_shared_object, f.arm_float_abi
        for name in (".dynamic", ".tether_meta", ".ARM.attributes", ".dynsym"):
            f.section_data(name) if f.section(name) is not None else None
        f.needed, f.soname, f.exported_symbols, f.undefined_symbols, f.weak_undefined_symbols, f.dynamic_symbols()
        f.arm_attributes()
        try:
            _check_elf(f, "fuzz.so")
        except ModuleLoadError:
            pass
        _read_metadata(f, "fuzz.so")


TARGETS: Dict[str, Target] = {t.name: t for t in (
    Target("frames", fuzz_frames, (ProtocolError,)),
    # a server's ERROR during the handshake is raised as the error it carries: any TetherError
    Target("handshake", fuzz_handshake, (ProtocolError, AuthenticationError, RemoteError, TetherError)),
    Target("tracker", fuzz_tracker, (ProtocolError,)),
    Target("params", fuzz_params, (params.ParamsFormatError,)),
    Target("graph", fuzz_graph, (ValueError,), memory=lambda n: GRAPH_MAX_BYTES + 8 * MiB + 64 * n),
    Target("elf", fuzz_elf, (ModuleLoadError,)),
)}


def check_one(target: Target, data: bytes) -> Optional[BaseException]:
    """Run ``target`` on ``data``; returns the documented exception it raised (or None), raises FuzzFailure
    for anything else. Memory is traced only if tracemalloc is already on (the caller starts it once)."""
    tracing = tracemalloc.is_tracing()
    if tracing:
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
    outcome: Optional[BaseException] = None
    try:
        target.run(data)
    except target.allowed as exc:
        outcome = exc
    except Exception as exc:
        raise FuzzFailure("%s: %s: %s on input %r" % (target.name, type(exc).__name__, exc, data[:200])) from exc
    if tracing:
        peak = tracemalloc.get_traced_memory()[1] - before
        limit = target.memory(len(data))
        if peak > limit:
            raise FuzzFailure("%s: allocated %d bytes (limit %d) on an input of %d bytes: %r"
                              % (target.name, peak, limit, len(data), data[:200]))
    return outcome


def corpus(name: str):
    """The checked-in corpus of a target: [(file name, bytes)]."""
    folder = CORPUS / name
    return sorted((f.name, f.read_bytes()) for f in folder.iterdir() if f.is_file()) if folder.is_dir() else []


