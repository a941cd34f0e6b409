"""The C runtime for model folders (``libtether_runtime``), built for any tether target with ``tether.cc``.

The sources ship inside the package (``tether/runtime_c/``): C11, libc + libdl + pthreads only, so the same pip
install that compiles a model also builds the library that runs it from a C or C++ program, for the host or
cross-compiled for a board (``tether runtime --target rasp4b -o DIR``)::

    build_runtime("rasp4b", "rt/")   # rt/lib/libtether_runtime.so, rt/lib/libtether_runtime.a, rt/include/*.h(pp)

The library is built small (``-Os``, unused sections dropped, symbols stripped) with only the ``tether_rt_*`` API
exported. docs/deploy.md describes the API and how to link it.
"""
from __future__ import annotations

import os
import pathlib
import shutil
from typing import Any, Dict, List

from tether.cc import compile_c
from tether.target import as_target

SOURCE_DIR = pathlib.Path(__file__).resolve().parent / "runtime_c"
MODULE_HEADER = pathlib.Path(__file__).resolve().parent / "include" / "tether_module.h"
#: what a user's program includes: the API, its C++ wrapper and the packed-function ABI header they use
HEADERS = ("tether_runtime.h", "tether_runtime.hpp")
LIB_NAME = "tether_runtime"
# -Os and section GC keep the library small; hidden visibility leaves only the tether_rt_* API exported
CFLAGS = ("-std=c11", "-Wall", "-ffunction-sections", "-fdata-sections", "-fvisibility=hidden")
SHARED_LDFLAGS = ("-Wl,--gc-sections", "-s", "-ldl", "-lpthread")
#: what a program linking the static archive adds (glibc before 2.34 keeps dlopen and pthreads in libdl/libpthread)
LINK_LIBS = ("-ldl", "-lpthread")


def sources() -> List[str]:
    """The runtime's C files, in a fixed order (a build is reproducible)."""
    return sorted(str(p) for p in SOURCE_DIR.glob("*.c"))


def build_runtime(target: Any, out_dir: str, libc: str = "gnu") -> Dict[str, Any]:
    """Build ``lib/libtether_runtime.so`` and ``lib/libtether_runtime.a`` for `target` under `out_dir` and copy
    the headers to ``include/``. Returns ``{"target", "shared", "static", "include", "shared_bytes",
    "static_bytes"}``. The runtime dlopens modules, so `libc` is ``gnu`` (glibc) unless you know better."""
    tgt = as_target(target)
    out = pathlib.Path(out_dir)
    lib, inc = out / "lib", out / "include"
    lib.mkdir(parents=True, exist_ok=True)
    inc.mkdir(parents=True, exist_ok=True)
    include_dirs = [str(SOURCE_DIR), str(MODULE_HEADER.parent)]
    shared = compile_c(sources(), str(lib / ("lib%s.so" % LIB_NAME)), tgt, kind="shared", include_dirs=include_dirs,
                       flags=list(CFLAGS) + list(SHARED_LDFLAGS), libc=libc, opt="-Os")
    static = str(lib / ("lib%s.a" % LIB_NAME))
    if os.path.exists(static):   # `zig ar rcs` adds to an existing archive: a rebuild starts from nothing
        os.unlink(static)
    compile_c(sources(), static, tgt, kind="static", include_dirs=include_dirs, flags=list(CFLAGS), libc=libc,
              opt="-Os")
    for name in HEADERS:
        shutil.copyfile(SOURCE_DIR / name, inc / name)
    shutil.copyfile(MODULE_HEADER, inc / MODULE_HEADER.name)
    return {"target": str(tgt.preset or tgt.triple), "shared": shared, "static": static, "include": str(inc),
            "shared_bytes": os.path.getsize(shared), "static_bytes": os.path.getsize(static)}
