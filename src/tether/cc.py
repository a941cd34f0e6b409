"""C compilation for every tether target with ``zig cc``, the C compiler the ``ziglang`` wheel already brings.

tether's kernels need no C compiler (they are LLVM IR linked with ld.lld). C code that links against a libc does:
the C runtime for model folders, ahead-of-time model modules and the examples a user copies. ``zig cc`` carries
the headers and libc stubs of glibc and musl for every architecture, so the same pip install cross-compiles C for
a Pi or a phone's Linux userland without a system cross toolchain.

    compile_c(["main.c"], "main", target="rasp4b", kind="exe")
"""
from __future__ import annotations

import os
import subprocess
import sys
from typing import Any, List, Optional, Sequence

from tether.errors import CompileError, LinkerNotFound
from tether.link import zig_from_python
from tether.target import as_target

CC_TIMEOUT_S = 300.0
KINDS = ("exe", "shared", "static", "object")


def find_zig() -> str:
    """Path of the zig binary of this interpreter's ziglang wheel; LinkerNotFound naming the fix if it has none."""
    zig = zig_from_python(sys.executable)
    if zig is None:
        raise LinkerNotFound("no zig found for C compilation: install the ziglang wheel (pip install ziglang) into "
                             "%s" % sys.executable)
    return zig


def zig_target(target: Any, libc: str = "gnu") -> List[str]:
    """The ``-target`` (and ``-mcpu``) arguments of zig cc for a tether target; `libc` is ``gnu`` (glibc: what a
    Pi's or a Jetson's Linux runs, and what dlopen needs) or ``musl`` (static executables that run anywhere)."""
    tgt = as_target(target)
    if tgt.is_android:
        raise CompileError("zig cc has no libc for Android (%s): build C for Android with the NDK's clang" % tgt)
    if libc not in ("gnu", "musl"):
        raise ValueError("libc must be 'gnu' or 'musl', got %r" % libc)
    if tgt.arch == "x86_64":
        return ["-target", "x86_64-linux-" + libc]
    if tgt.arch == "aarch64":
        return ["-target", "aarch64-linux-" + libc]
    # armv7: the float ABI of the target's triple; the baseline every armv7 board has (VFPv3, NEON is optional)
    env = ("gnueabihf" if tgt.float_abi == "hard" else "gnueabi") if libc == "gnu" else (
        "musleabihf" if tgt.float_abi == "hard" else "musleabi")
    return ["-target", "arm-linux-" + env, "-mcpu=generic+v7a+vfp3d16"]


def compile_c(sources: Sequence[str], output: str, target: Any = "host", kind: str = "exe",
              include_dirs: Sequence[str] = (), flags: Sequence[str] = (), libc: str = "gnu",
              opt: str = "-O2", cxx: bool = False) -> str:
    """Compile (and link) C or C++ `sources` into `output` for `target`: an executable, a shared library, a static
    archive or one object file (`kind`). Returns `output`; CompileError with the compiler's message on failure."""
    if kind not in KINDS:
        raise ValueError("kind must be one of %s, got %r" % (", ".join(KINDS), kind))
    zig = find_zig()
    argv = [zig, "c++" if cxx else "cc"] + zig_target(target, libc) + [opt, "-fno-sanitize=undefined"]
    argv += ["-I" + d for d in include_dirs] + list(flags)
    if kind == "static":
        objects = []
        for k, src in enumerate(sources):
            obj = "%s.%d.o" % (output, k)
            compile_c([src], obj, target, "object", include_dirs, flags, libc, opt, cxx)
            objects.append(obj)
        try:
            _run([zig, "ar", "rcs", output] + objects, output)
        finally:
            for obj in objects:
                if os.path.exists(obj):
                    os.unlink(obj)
        return output
    if kind == "shared":
        argv += ["-shared", "-fPIC"]
    elif kind == "object":
        argv += ["-c", "-fPIC"]
    elif libc == "musl":
        argv += ["-static"]
    _run(argv + list(sources) + ["-o", output], output)
    return output


def _run(argv: List[str], what: str) -> None:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=CC_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise CompileError("zig did not finish %s within %.0fs" % (what, CC_TIMEOUT_S)) from None
    if proc.returncode != 0:
        raise CompileError("building %s failed: %s\n%s" % (what, " ".join(argv), (proc.stderr or proc.stdout)
                                                            .strip()))


def compiler_command(target: Any = "host", libc: str = "gnu", cxx: bool = False) -> Optional[List[str]]:
    """The compiler argv prefix a user's build script can take (``zig cc -target ...``), e.g. for the docs."""
    return [find_zig(), "c++" if cxx else "cc"] + zig_target(target, libc)
