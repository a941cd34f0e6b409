"""tether.cc: C compiled and linked with zig cc for the host and cross-compiled for the ARM targets, then run
(the ARM builds as static musl executables under qemu-user, which needs no userland)."""
from __future__ import annotations

import shutil
import subprocess

import pytest

from tether.cc import compile_c
from tether.errors import CompileError

PROGRAM = r"""
#include <stdio.h>
#include <stdint.h>
int main(void) { printf("%d %d\n", (int)sizeof(void *), (int)(sizeof(long) * 8)); return 3; }
"""


@pytest.mark.parametrize("target,qemu,expect", [("host", None, "8 64"), ("rasp4b", "qemu-aarch64", "8 64"),
                                                ("armv7-a7", "qemu-arm", "4 32")])
def test_program_runs_on_its_target(tmp_path, target, qemu, expect):
    src = tmp_path / "p.c"
    src.write_text(PROGRAM)
    exe = compile_c([str(src)], str(tmp_path / "p"), target, libc="musl" if qemu else "gnu")
    argv = [exe] if qemu is None else [shutil.which(qemu) or pytest.fail("%s is not installed" % qemu), exe]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert (proc.returncode, proc.stdout.strip()) == (3, expect)


def test_shared_and_static_libraries(tmp_path):
    src = tmp_path / "f.c"
    src.write_text("int twice(int x) { return 2 * x; }\n")
    so = compile_c([str(src)], str(tmp_path / "libf.so"), "rasp4b", kind="shared")
    a = compile_c([str(src)], str(tmp_path / "libf.a"), "rasp4b", kind="static")
    assert open(so, "rb").read(4) == b"\x7fELF" and open(a, "rb").read(8) == b"!<arch>\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.c", "libf.a", "libf.so"]   # no objects left behind


def test_errors_name_the_problem(tmp_path):
    bad = tmp_path / "bad.c"
    bad.write_text("int f( {\n")
    with pytest.raises(CompileError, match="bad"):
        compile_c([str(bad)], str(tmp_path / "bad"), "host")
    with pytest.raises(CompileError, match="Android"):
        compile_c([str(bad)], str(tmp_path / "bad"), "android-arm64")
