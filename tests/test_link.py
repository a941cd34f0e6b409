"""Finding ld.lld, linking self-contained libraries, and LLVM error reporting."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
from fixtures.prereq import require_module

from tether import link
from tether.codegen.emit import compile_ir
from tether.errors import CompileError, LinkerNotFound
from tether.target import Target

UNDEFINED_IR = """
declare float @expf(float)
define float @f(float %x) {
  %y = call float @expf(float %x)
  ret float %y
}
"""


@pytest.fixture(scope="module")
def python_without_ziglang(tmp_path_factory):
    """A real Python interpreter that cannot import ziglang: a fresh venv without site-packages."""
    d = tmp_path_factory.mktemp("venv")
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--without-pip", str(d / "env")], check=True, timeout=120,
                   capture_output=True)
    py = str(d / "env" / "bin" / "python")
    probe = subprocess.run([py, "-c", "import ziglang"], capture_output=True, timeout=60)
    assert probe.returncode != 0, "the fresh venv unexpectedly has ziglang"
    return py


def test_default_linker_is_lld(host_linker):
    out = subprocess.run(host_linker + ["--version"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "LLD" in out.stdout


def test_ziglang_wheel_is_preferred(host_linker):
    require_module("ziglang")
    cmd = link.find_linker(python=sys.executable, path="")
    assert cmd[-1] == "ld.lld" and os.path.basename(cmd[0]).startswith("zig")


def test_linker_not_found_says_what_to_install(python_without_ziglang, tmp_path):
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    with pytest.raises(LinkerNotFound) as info:
        link.find_linker(python=python_without_ziglang, path=str(empty))
    msg = str(info.value)
    assert "pip install ziglang" in msg and "ld.lld" in msg and python_without_ziglang in msg


def test_no_wheel_lookup_and_empty_path(tmp_path):
    with pytest.raises(LinkerNotFound, match="pip install ziglang"):
        link.find_linker(python=None, path=str(tmp_path))


def test_unrunnable_linker_override(monkeypatch, tmp_path):
    monkeypatch.setenv("TETHER_LD", str(tmp_path / "no-such-ld.lld"))
    obj, _ = compile_ir("define i32 @g() {\n  ret i32 7\n}\n", "rasp4b")
    with pytest.raises(LinkerNotFound, match="cannot run the linker"):
        link.link_shared([obj], "rasp4b", str(tmp_path / "g.so"))


@pytest.mark.parametrize("preset", ["rasp4b", "rasp3b", "x86_64"])
def test_no_undefined_symbols_allowed(host_linker, tmp_path, preset):
    obj, asm = compile_ir(UNDEFINED_IR, preset)
    assert "expf" in asm
    with pytest.raises(CompileError, match="undefined symbol: expf") as info:
        link.link_shared([obj], preset, str(tmp_path / "bad.so"))
    assert "must not call expf" in str(info.value)
    assert not (tmp_path / "bad.so").exists()


def test_compile_error_shows_ir_context():
    bad = "define i32 @h() {\n  %x = add i32 1, 2\n  ret i64 %x\n}\n"
    with pytest.raises(CompileError) as info:
        compile_ir(bad, Target("x86_64"))
    msg = str(info.value)
    assert "ret i64 %x" in msg and ">" in msg


def test_archive_member_names_are_checked(tmp_path):
    with pytest.raises(ValueError, match="at most 15"):
        link.write_archive([("a_very_long_member_name.o", b"x", [])], str(tmp_path / "x.a"))
