"""Linking: self-contained shared objects with ld.lld, plus object files and static archives for C users.

ld.lld comes from the ``ziglang`` wheel (a pip dependency, so no cross toolchain is needed); a system ``ld.lld``
is the fallback. Set ``TETHER_LD`` to a linker command to override both.
"""
from __future__ import annotations

import importlib.util
import logging
import os
import re
import shlex
import shutil
import struct
import subprocess
import sys
import tempfile
from typing import Iterable, List, Optional, Sequence, Tuple, Union

from tether.errors import CompileError, LinkerNotFound
from tether.target import Target, as_target

log = logging.getLogger(__name__)

LINK_TIMEOUT_S = 120.0
_DEFAULT = object()
_cache: dict = {}


def zig_from_python(python: str) -> Optional[str]:
    """Path of the zig binary shipped by the ziglang wheel of ``python`` (None if it has none)."""
    # Compare paths without resolving symlinks: a venv's python is a symlink to another interpreter's binary.
    if os.path.abspath(python) == os.path.abspath(sys.executable):
        spec = importlib.util.find_spec("ziglang")
        if spec is None or not spec.submodule_search_locations:
            return None
        pkg_dir = list(spec.submodule_search_locations)[0]
    else:
        try:
            out = subprocess.run([python, "-c", "import os, ziglang; print(os.path.dirname(ziglang.__file__))"],
                                 capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return None
        if out.returncode != 0:
            return None
        pkg_dir = out.stdout.strip()
    for exe in ("zig", "zig.exe"):
        cand = os.path.join(pkg_dir, exe)
        if os.path.isfile(cand) and os.access(cand, os.X_OK):
            return cand
    return None


def find_linker(python: Union[str, None, object] = _DEFAULT, path: Union[str, None, object] = _DEFAULT) -> List[str]:
    """The ld.lld command as an argv prefix.

    Search order: $TETHER_LD; the ziglang wheel of ``python`` (default: this interpreter); ``ld.lld`` on ``path``
    (default: $PATH). Pass ``python=None`` to skip the wheel. Raises LinkerNotFound naming what to install."""
    default = python is _DEFAULT and path is _DEFAULT
    if default:
        override = os.environ.get("TETHER_LD")
        if override:
            return shlex.split(override)
        if "default" in _cache:
            return list(_cache["default"])
    py = sys.executable if python is _DEFAULT else python
    search_path = os.environ.get("PATH", "") if path is _DEFAULT else (path or "")
    cmd: Optional[List[str]] = None
    if py:
        zig = zig_from_python(str(py))
        if zig:
            cmd = [zig, "ld.lld"]
    if cmd is None:
        for name in ("ld.lld", "ld.lld-18", "ld.lld-17", "ld.lld-16", "ld.lld-15", "ld.lld-14"):
            found = shutil.which(name, path=search_path)
            if found:
                cmd = [found]
                break
    if cmd is None:
        raise LinkerNotFound("no ld.lld linker found: install the ziglang wheel (pip install ziglang), which ships "
                             "ld.lld for every target, or put a system ld.lld on PATH (e.g. apt install lld); "
                             "searched the ziglang package of %s and PATH=%r" % (py or "(none)", search_path))
    if default:
        _cache["default"] = list(cmd)
    log.debug("linker: %s", " ".join(cmd))
    return cmd


def find_wasm_linker() -> List[str]:
    """The WebAssembly linker as an argv prefix: $TETHER_WASM_LD, else the ziglang wheel's ``zig wasm-ld``, else
    ``wasm-ld`` on PATH. Raises LinkerNotFound naming what to install."""
    override = os.environ.get("TETHER_WASM_LD")
    if override:
        return shlex.split(override)
    if "wasm" in _cache:
        return list(_cache["wasm"])
    zig = zig_from_python(sys.executable)
    cmd = [zig, "wasm-ld"] if zig else None
    if cmd is None:
        found = shutil.which("wasm-ld")
        cmd = [found] if found else None
    if cmd is None:
        raise LinkerNotFound("no WebAssembly linker found: install the ziglang wheel (pip install ziglang), which "
                             "ships wasm-ld, or put a system wasm-ld on PATH (e.g. apt install lld)")
    _cache["wasm"] = list(cmd)
    return cmd


def _linker_for(target: Target) -> List[str]:
    return find_wasm_linker() if target.is_wasm else find_linker()


def _write_objects(objects: Sequence[bytes], folder: str) -> List[str]:
    paths = []
    for k, obj in enumerate(objects):
        p = os.path.join(folder, "obj%d.o" % k)
        with open(p, "wb") as f:
            f.write(obj)
        paths.append(p)
    return paths


def _run_linker(argv: List[str], what: str, target: Target) -> None:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=LINK_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise CompileError("ld.lld did not finish within %.0fs: %s" % (LINK_TIMEOUT_S, " ".join(argv))) from None
    except OSError as exc:
        raise LinkerNotFound("cannot run the linker %r: %s (pip install ziglang)" % (argv[0], exc)) from None
    if proc.returncode != 0:
        detail = (proc.stderr or proc.stdout).strip()
        missing = sorted(set(re.findall(r"undefined symbol: (\S+)", detail)))
        hint = ""
        if missing and target.is_wasm:
            hint = ("\nhint: a wasm32 module imports nothing, so its code must not call %s (LLVM turns some "
                    "intrinsics into such calls); use ModuleBuilder.math(...) or compare/select code instead."
                    % ", ".join(missing))
        elif missing:
            hint = ("\nhint: tether modules link without libc/libm, so the code must not call %s. LLVM turns some "
                    "intrinsics into such calls on this target (e.g. llvm.maxnum/round/trunc on armv7); use "
                    "ModuleBuilder.math(...) or compare/select code instead." % ", ".join(missing))
        raise CompileError("linking %s for %s failed:\n%s%s" % (what, target, detail, hint))


def link_shared(objects: Sequence[bytes], target: Union[str, Target], out_path: str,
                soname: Optional[str] = None, linker: Optional[Sequence[str]] = None,
                flags: Sequence[str] = ()) -> str:
    """Link object files (bytes) into a self-contained shared object at ``out_path``: no libc, no DT_NEEDED,
    no undefined symbols. ``flags``: more linker arguments (e.g. a version script)."""
    target = as_target(target)
    if target.is_wasm:
        raise CompileError("%s is a WebAssembly target: link it with link_wasm (Module.export_library does)"
                           % target)
    cmd = list(linker) if linker else find_linker()
    out_path = os.path.abspath(os.fspath(out_path))
    soname = soname or os.path.basename(out_path)
    with tempfile.TemporaryDirectory(prefix="tether-link-") as tmp:
        paths = _write_objects(objects, tmp)
        tmp_out = os.path.join(tmp, "out.so")
        _run_linker(cmd + list(target.link_flags) + list(flags) + ["-soname", soname, "-o", tmp_out] + paths, soname,
                    target)
        os.makedirs(os.path.dirname(out_path) or ".", exist_ok=True)
        shutil.move(tmp_out, out_path)
    return out_path


WASM_META_SECTION = "tether_meta"


def _leb128(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def wasm_custom_section(name: str, payload: bytes) -> bytes:
    """A WebAssembly custom section (id 0): its size, the name as a length-prefixed UTF-8 string, the payload."""
    raw = name.encode("utf-8")
    body = _leb128(len(raw)) + raw + bytes(payload)
    return b"\0" + _leb128(len(body)) + body


def link_wasm(objects: Sequence[bytes], target: Union[str, Target], out_path: str, exports: Sequence[str],
              metadata: bytes, linker: Optional[Sequence[str]] = None) -> str:
    """Link wasm32 object files (bytes) into a self-contained WebAssembly module at ``out_path`` (docs/web.md "The
    module"): no imports, the functions ``exports`` plus ``memory`` and ``__heap_base`` exported, and ``metadata``
    (the JSON) appended as the custom section "tether_meta"."""
    target = as_target(target)
    cmd = list(linker) if linker else find_wasm_linker()
    out_path = os.path.abspath(os.fspath(out_path))
    with tempfile.TemporaryDirectory(prefix="tether-link-") as tmp:
        paths = _write_objects(objects, tmp)
        tmp_out = os.path.join(tmp, "out.wasm")
        _run_linker(cmd + list(target.link_flags) + ["--export=%s" % name for name in exports] + ["-o", tmp_out]
                    + paths, os.path.basename(out_path), target)
        with open(tmp_out, "rb") as f:
            binary = f.read()
        if binary[:4] != b"\0asm":
            raise CompileError("the WebAssembly linker wrote %s without the \\0asm magic" % tmp_out)
        with open(tmp_out, "wb") as f:
            f.write(binary + wasm_custom_section(WASM_META_SECTION, metadata))
        os.makedirs(os.path.dirname(out_path) or ".", exist_ok=True)
        shutil.move(tmp_out, out_path)
    return out_path


def link_relocatable(objects: Sequence[bytes], target: Union[str, Target],
                     linker: Optional[Sequence[str]] = None) -> bytes:
    """Merge object files into one relocatable object (``ld.lld -r``): a module compiled in parts stays one
    object for export_object/export_static and for the final shared link."""
    target = as_target(target)
    if len(objects) == 1:
        return bytes(objects[0])
    cmd = list(linker) if linker else _linker_for(target)
    with tempfile.TemporaryDirectory(prefix="tether-link-") as tmp:
        paths = _write_objects(objects, tmp)
        out = os.path.join(tmp, "merged.o")
        _run_linker(cmd + ["-r", "-o", out] + paths, "a merged object", target)
        with open(out, "rb") as f:
            return f.read()


def write_object(obj: bytes, out_path: str) -> str:
    out_path = os.fspath(out_path)
    with open(out_path, "wb") as f:
        f.write(obj)
    return out_path


def _ar_header(name: str, size: int) -> bytes:
    hdr = "%-16s%-12d%-6d%-6d%-8s%-10d`\n" % (name, 0, 0, 0, "644", size)
    assert len(hdr) == 60
    return hdr.encode("ascii")


def write_archive(members: Sequence[Tuple[str, bytes, Iterable[str]]], out_path: str) -> str:
    """Write a GNU ``ar`` static archive with a symbol index (so ld needs no ranlib).

    ``members``: (file name <= 15 chars, object bytes, global symbols the object defines)."""
    entries = []
    for name, data, syms in members:
        if len(name) > 15 or "/" in name:
            raise ValueError("archive member name %r must be at most 15 characters without '/'" % name)
        entries.append((name + "/", bytes(data), [s for s in syms]))
    symbols = [(s, k) for k, (_, _, syms) in enumerate(entries) for s in syms]
    names = b"".join(s.encode("ascii") + b"\0" for s, _ in symbols)
    index_size = 4 + 4 * len(symbols) + len(names)
    index_padded = index_size + (index_size & 1)
    offsets, pos = [], 8 + 60 + index_padded
    for _, data, _ in entries:
        offsets.append(pos)
        pos += 60 + len(data) + (len(data) & 1)
    out = [b"!<arch>\n", _ar_header("/", index_size), struct.pack(">I", len(symbols))]
    out += [struct.pack(">I", offsets[k]) for _, k in symbols]
    out.append(names + b"\n" * (index_size & 1))
    for name, data, _ in entries:
        out += [_ar_header(name, len(data)), data, b"\n" * (len(data) & 1)]
    out_path = os.fspath(out_path)
    with open(out_path, "wb") as f:
        f.write(b"".join(out))
    return out_path


def rename_symbols(obj: bytes, keep: Iterable[str], prefix: str) -> Tuple[bytes, List[str]]:
    """Rename every defined global or weak symbol of the relocatable object ``obj`` except ``keep`` to
    ``prefix + name``; returns the new object and the undefined symbols it still references.

    Two objects that both define ``tether_pool_launch`` (two models' kernels) then link into one program. The
    names are appended to a new string table at the end of the file (the section header of the symbol table's
    string table is pointed at it), so no other byte of the object moves."""
    keep = set(keep)
    data = bytearray(obj)
    if data[:4] != b"\x7fELF" or data[5] != 1:
        raise CompileError("rename_symbols: not a little-endian ELF object")
    is64 = data[4] == 2
    if is64:
        shoff, = struct.unpack_from("<Q", data, 0x28)
        shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
        sh_fmt, sym_fmt = "<IIQQQQIIQQ", "<IBBHQQ"
    else:
        shoff, = struct.unpack_from("<I", data, 0x20)
        shentsize, shnum = struct.unpack_from("<HH", data, 0x2E)
        sh_fmt, sym_fmt = "<IIIIIIIIII", "<IIIBBH"
    sections = [list(struct.unpack_from(sh_fmt, data, shoff + k * shentsize)) for k in range(shnum)]
    symtabs = [k for k, s in enumerate(sections) if s[1] == 2]           # SHT_SYMTAB
    if len(symtabs) != 1:
        raise CompileError("rename_symbols: expected one symbol table, found %d" % len(symtabs))
    sym = sections[symtabs[0]]
    str_index = sym[6]
    strtab = sections[str_index]
    old = bytes(data[strtab[4]:strtab[4] + strtab[5]])
    new = bytearray(old)
    entsize = 24 if is64 else 16
    undefined: List[str] = []
    for k in range(1, sym[5] // entsize):
        at = sym[4] + k * entsize
        fields = list(struct.unpack_from(sym_fmt, data, at))
        st_name = fields[0]
        info, shndx = (fields[1], fields[3]) if is64 else (fields[3], fields[5])
        bind = info >> 4
        if bind not in (1, 2):                                           # GLOBAL, WEAK
            continue
        name = old[st_name:old.index(b"\0", st_name)].decode("utf-8")
        if shndx == 0:                                                   # SHN_UNDEF
            undefined.append(name)
            continue
        if name in keep:
            continue
        fields[0] = len(new)
        new += (prefix + name).encode("utf-8") + b"\0"
        struct.pack_into(sym_fmt, data, at, *fields)
    pad = (-len(data)) % 8
    data += b"\0" * pad
    strtab[4], strtab[5] = len(data), len(new)
    data += new
    struct.pack_into(sh_fmt, data, shoff + str_index * shentsize, *strtab)
    return bytes(data), undefined
