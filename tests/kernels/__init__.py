"""C sources of ABI-conforming test kernels (docs/abi.md) and the gcc recipe that builds them.

The runtime tests need real modules before (and independently of) the compiler: these are compiled and linked
by gcc at test time into self-contained shared objects (no libc, hidden everything but the packed functions,
metadata in ``.tether_meta``), exactly what the runtime must accept from the compiler.
"""
from __future__ import annotations

import pathlib
import shutil
import subprocess
import sys
from typing import Sequence

KERNEL_DIR = pathlib.Path(__file__).resolve().parent

# zig cc (from the ziglang wheel, a tether dependency) cross-compiles the same sources for the emulated devices.
ZIG_TARGETS = {"aarch64": ("-target", "aarch64-linux-musl", "-mcpu=cortex_a72"),
               "armv7": ("-target", "arm-linux-musleabihf", "-mcpu=cortex_a7")}

# -nostdlib: no libc, like the compiler's output. The -fno-* flags keep gcc from emitting calls into libc
# (memset/memcpy idioms, stack protector) that would leave undefined symbols; no FP contraction, so results
# are the exact IEEE float32 sequence numpy computes, on every architecture.
GCC_FLAGS = ("-O2", "-shared", "-fPIC", "-nostdlib", "-fvisibility=hidden", "-fno-stack-protector",
             "-fno-tree-loop-distribute-patterns", "-fno-builtin", "-ffp-contract=off", "-Wall", "-Werror")
ZIG_FLAGS = ("-O2", "-shared", "-fPIC", "-nostdlib", "-fvisibility=hidden", "-fno-stack-protector", "-fno-builtin",
             "-fno-unwind-tables", "-fno-asynchronous-unwind-tables", "-ffp-contract=off", "-Wall", "-Werror")


def build_kernel(name: str, out_dir, defines: Sequence[str] = (), link_flags: Sequence[str] = ("-Wl,--no-undefined",),
                 timeout: float = 60.0) -> pathlib.Path:
    """Compile tests/kernels/<name>.c into ``out_dir/<name>.so`` and return its path. Fails loudly (never
    skips) if gcc is missing: these tests are about real shared objects."""
    gcc = shutil.which("gcc")
    if gcc is None:
        raise RuntimeError("gcc is required to build the runtime test kernels (apt install gcc)")
    out = pathlib.Path(out_dir) / (name + ".so")
    cmd = [gcc, *GCC_FLAGS, *("-D" + d for d in defines), "-I", str(KERNEL_DIR), str(KERNEL_DIR / (name + ".c")),
           "-o", str(out), "-Wl,-soname," + out.name, "-Wl,--hash-style=both", *link_flags]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError("building %s failed:\n%s\n%s" % (name, " ".join(cmd), proc.stderr))
    return out


def build_kernel_for(name: str, arch: str, out_dir, timeout: float = 180.0,
                     defines: Sequence[str] = ()) -> pathlib.Path:
    """Cross-compile tests/kernels/<name>.c for ``arch`` (aarch64 / armv7) with zig cc into
    ``out_dir/<name>_<arch>.so``."""
    out = pathlib.Path(out_dir) / ("%s_%s.so" % (name, arch))
    cmd = [sys.executable, "-m", "ziglang", "cc", *ZIG_TARGETS[arch], *ZIG_FLAGS, *("-D" + d for d in defines),
           "-I", str(KERNEL_DIR),
           str(KERNEL_DIR / (name + ".c")), "-o", str(out), "-Wl,-soname," + name + ".so", "-Wl,--no-undefined"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError("cross-building %s for %s failed:\n%s\n%s" % (name, arch, " ".join(cmd), proc.stderr))
    return out
