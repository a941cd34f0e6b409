"""A small ELF reader: enough to vet a shared library *before* dlopen runs any of its code.

It reads the header (class, byte order, machine), the section table, the dynamic section (DT_NEEDED, DT_SONAME),
the dynamic symbol table and, for 32-bit ARM, the float ABI. Every read is bounds-checked against the file
size, so a truncated or garbage file gives a :class:`ModuleLoadError` naming the file and the broken part,
never an ``IndexError`` or ``struct.error``. Files are read piecewise (header, tables, the sections asked
for), so vetting a large model library does not read it whole.
"""
from __future__ import annotations

import io
import os
import platform
import struct
from typing import BinaryIO, Dict, List, NamedTuple, Optional, Union

from .errors import ArchMismatch, ModuleLoadError

# e_machine -> tether arch name; the inverse is used by tests that patch headers.
MACHINE_ARCH: Dict[int, str] = {62: "x86_64", 183: "aarch64", 40: "armv7"}
ARCH_MACHINE: Dict[str, int] = {v: k for k, v in MACHINE_ARCH.items()}
# Names for the e_machine values someone is likely to feed us by mistake, for readable errors.
_OTHER_MACHINES: Dict[int, str] = {3: "x86 (i386)", 8: "mips", 20: "powerpc", 21: "powerpc64", 22: "s390",
                                   243: "riscv", 258: "loongarch"}

ET_DYN = 3
WASM_MAGIC = b"\0asm"   # a wasm32 module (docs/web.md): refused with its own message
SHT_DYNSYM = 11
SHT_NOBITS = 8
SHN_UNDEF = 0
DT_NULL, DT_NEEDED, DT_STRTAB, DT_SONAME = 0, 1, 5, 14
EF_ARM_ABI_FLOAT_SOFT = 0x200
EF_ARM_ABI_FLOAT_HARD = 0x400
TAG_ABI_VFP_ARGS = 28

# Sanity caps so garbage headers cannot make us allocate or loop without bound.
_MAX_SECTIONS = 65535
_MAX_STRING = 1 << 16


class Section(NamedTuple):
    name: str
    type: int
    flags: int
    addr: int
    offset: int
    size: int
    link: int
    info: int
    entsize: int


class Symbol(NamedTuple):
    name: str
    defined: bool
    binding: int      # 0 local, 1 global, 2 weak
    visibility: int   # 0 default, 1 internal, 2 hidden, 3 protected
    type: int         # 0 notype, 1 object, 2 func, ...


def host_arch() -> str:
    """This interpreter's architecture in tether's names (``x86_64``, ``aarch64``, ``armv7``).

    The pointer size decides between aarch64 and armv7: a 32-bit userland on a 64-bit ARM kernel reports
    ``aarch64`` from uname but can only load 32-bit ARM libraries.
    """
    machine = platform.machine().lower()
    bits = struct.calcsize("P") * 8
    if machine in ("x86_64", "amd64", "x64"):
        return "x86_64" if bits == 64 else "x86"
    if machine in ("aarch64", "arm64", "armv8l", "armv8b", "aarch64_be"):
        return "aarch64" if bits == 64 else "armv7"
    if machine.startswith("arm"):  # armv7l, armv6l, arm
        return "armv7"
    return machine or "unknown"


class _Reader:
    """Bounds-checked random access over bytes or an open file."""

    def __init__(self, name: str, data: Optional[bytes] = None, fh: Optional[BinaryIO] = None):
        self.name = name
        self._data = data
        self._fh = fh
        if data is not None:
            self.size = len(data)
        else:
            assert fh is not None
            fh.seek(0, io.SEEK_END)
            self.size = fh.tell()

    def read(self, offset: int, size: int, what: str) -> bytes:
        if offset < 0 or size < 0 or offset + size > self.size:
            raise ModuleLoadError("%s: truncated or corrupt ELF file: %s (bytes %d..%d) lies outside the %d-byte file"
                                  % (self.name, what, offset, offset + size, self.size))
        if self._data is not None:
            return self._data[offset:offset + size]
        assert self._fh is not None
        self._fh.seek(offset)
        chunk = self._fh.read(size)
        if len(chunk) != size:
            raise ModuleLoadError("%s: short read of %s (file changed while reading?)" % (self.name, what))
        return chunk


def _cstring(table: bytes, offset: int, what: str, name: str) -> str:
    if offset < 0 or offset >= len(table):
        if offset == 0 and not table:
            return ""
        raise ModuleLoadError("%s: corrupt ELF file: %s name offset %d outside its string table (%d bytes)"
                              % (name, what, offset, len(table)))
    end = table.find(b"\0", offset, offset + _MAX_STRING)
    if end < 0:
        raise ModuleLoadError("%s: corrupt ELF file: unterminated %s name" % (name, what))
    return table[offset:end].decode("utf-8", "replace")


class ElfFile:
    """A parsed ELF file. Use as a context manager when opened from a path; ``close()`` is idempotent.

    ``ElfFile(path_or_bytes)`` parses the header and the section table at once (so a broken file fails
    immediately); dynamic entries, symbols and section contents are read on demand.
    """

    def __init__(self, source: Union[str, os.PathLike, bytes, bytearray, memoryview], name: Optional[str] = None):
        self._fh: Optional[BinaryIO] = None
        if isinstance(source, (bytes, bytearray, memoryview)):
            self.name = name or "<bytes>"
            self._r = _Reader(self.name, data=bytes(source))
        else:
            path = os.fspath(source)
            self.name = name or os.path.basename(path)
            try:
                self._fh = open(path, "rb")
            except OSError as exc:
                raise ModuleLoadError("cannot open %s: %s" % (path, exc.strerror or exc)) from exc
            self._r = _Reader(self.name, fh=self._fh)
        try:
            self._parse_header()
            self._parse_sections()
        except BaseException:
            self.close()
            raise
        self._dynamic: Optional[List[tuple]] = None
        self._symbols: Optional[List[Symbol]] = None

    # -- context manager -------------------------------------------------------------------------------------
    def close(self) -> None:
        fh, self._fh = self._fh, None
        if fh is not None:
            fh.close()

    def __enter__(self) -> "ElfFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- header ----------------------------------------------------------------------------------------------
    def _parse_header(self) -> None:
        ident = self._r.read(0, 16, "ELF identification") if self._r.size >= 16 else b""
        if ident[:4] == WASM_MAGIC:
            raise ArchMismatch("%s is a WebAssembly module (wasm32), built for a JS runtime (bindings/js); this "
                               "Python runtime loads ELF shared libraries: rebuild it with the target for this "
                               "device" % self.name)
        if ident[:4] != b"\x7fELF":
            raise ModuleLoadError("%s is not an ELF file (bad magic %r); expected a shared library (.so)"
                                  % (self.name, bytes(ident[:4]) if ident else b""))
        ei_class, ei_data = ident[4], ident[5]
        if ei_class not in (1, 2):
            raise ModuleLoadError("%s: corrupt ELF header: unknown class %d" % (self.name, ei_class))
        if ei_data not in (1, 2):
            raise ModuleLoadError("%s: corrupt ELF header: unknown byte order %d" % (self.name, ei_data))
        self.bits = 32 if ei_class == 1 else 64
        self.endian = "little" if ei_data == 1 else "big"
        self._e = "<" if ei_data == 1 else ">"
        fmt = self._e + ("HHIIIIIHHHHHH" if self.bits == 32 else "HHIQQQIHHHHHH")
        raw = self._r.read(16, struct.calcsize(fmt), "ELF header")
        (self.type, self.machine, _version, _entry, _phoff, self._shoff, self.flags, _ehsize, _phentsize,
         _phnum, self._shentsize, self._shnum, self._shstrndx) = struct.unpack(fmt, raw)

    @property
    def arch(self) -> Optional[str]:
        """tether's name for ``e_machine`` (``x86_64``, ``aarch64``, ``armv7``), None if tether has none."""
        return MACHINE_ARCH.get(self.machine)

    @property
    def machine_name(self) -> str:
        """A readable name for ``e_machine`` even when tether does not support it."""
        return MACHINE_ARCH.get(self.machine) or _OTHER_MACHINES.get(self.machine) or "e_machine %d" % self.machine

    @property
    def is_shared_object(self) -> bool:
        return self.type == ET_DYN

    @property
    def arm_float_abi(self) -> Optional[str]:
        """For 32-bit ARM: ``"hard"`` or ``"soft"`` as the dynamic loader sees it (``e_flags``, falling back to
        ``Tag_ABI_VFP_args`` in ``.ARM.attributes``); None when not ARM or not stated."""
        if self.machine != 40:
            return None
        if self.flags & EF_ARM_ABI_FLOAT_HARD:
            return "hard"
        if self.flags & EF_ARM_ABI_FLOAT_SOFT:
            return "soft"
        vfp = self.arm_attributes().get(TAG_ABI_VFP_ARGS)
        if vfp is None:
            return None
        return "hard" if vfp == 1 else "soft"

    # -- sections --------------------------------------------------------------------------------------------
    def _parse_sections(self) -> None:
        self.sections: List[Section] = []
        self._by_name: Dict[str, Section] = {}
        if self._shoff == 0 or self._shnum == 0:
            return  # legal (stripped of section headers); nothing to look up by name
        want = 40 if self.bits == 32 else 64
        if self._shentsize < want:
            raise ModuleLoadError("%s: corrupt ELF header: section header size %d (expected %d)"
                                  % (self.name, self._shentsize, want))
        if self._shnum > _MAX_SECTIONS:
            raise ModuleLoadError("%s: corrupt ELF header: %d sections" % (self.name, self._shnum))
        table = self._r.read(self._shoff, self._shnum * self._shentsize, "section header table")
        fmt = self._e + ("IIIIIIIIII" if self.bits == 32 else "IIQQQQIIQQ")
        raw_sections = []
        for i in range(self._shnum):
            fields = struct.unpack_from(fmt, table, i * self._shentsize)
            raw_sections.append(fields)
        if self._shstrndx >= self._shnum:
            raise ModuleLoadError("%s: corrupt ELF header: section name table index %d of %d"
                                  % (self.name, self._shstrndx, self._shnum))
        s = raw_sections[self._shstrndx]
        names = self._r.read(s[4], s[5], "section name table") if s[1] != SHT_NOBITS else b""
        for (sh_name, sh_type, sh_flags, sh_addr, sh_offset, sh_size, sh_link, sh_info, _align,
             sh_entsize) in raw_sections:
            sec = Section(_cstring(names, sh_name, "section", self.name), sh_type, sh_flags, sh_addr, sh_offset,
                          sh_size, sh_link, sh_info, sh_entsize)
            self.sections.append(sec)
            self._by_name.setdefault(sec.name, sec)

    def section(self, name: str) -> Optional[Section]:
        return self._by_name.get(name)

    def section_data(self, name_or_section: Union[str, Section]) -> bytes:
        sec = self._by_name.get(name_or_section) if isinstance(name_or_section, str) else name_or_section
        if sec is None:
            raise ModuleLoadError("%s has no section %s" % (self.name, name_or_section))
        if sec.type == SHT_NOBITS:
            return b""
        return self._r.read(sec.offset, sec.size, "section %s" % (sec.name or "#?"))

    def _linked_strtab(self, sec: Section) -> bytes:
        if sec.link >= len(self.sections):
            raise ModuleLoadError("%s: corrupt ELF file: section %s links to section %d of %d"
                                  % (self.name, sec.name, sec.link, len(self.sections)))
        return self.section_data(self.sections[sec.link])

    # -- dynamic section -------------------------------------------------------------------------------------
    def dynamic_entries(self) -> List[tuple]:
        """``[(tag, value_or_string)]`` of ``.dynamic``; DT_NEEDED / DT_SONAME values are resolved to strings."""
        if self._dynamic is None:
            entries: List[tuple] = []
            sec = self.section(".dynamic")
            if sec is not None and sec.type != SHT_NOBITS:
                data = self.section_data(sec)
                strtab = self._linked_strtab(sec)
                fmt = self._e + ("iI" if self.bits == 32 else "qQ")
                step = struct.calcsize(fmt)
                for off in range(0, len(data) - step + 1, step):
                    tag, val = struct.unpack_from(fmt, data, off)
                    if tag == DT_NULL:
                        break
                    if tag in (DT_NEEDED, DT_SONAME):
                        val = _cstring(strtab, val, "dynamic entry", self.name)
                    entries.append((tag, val))
            self._dynamic = entries
        return self._dynamic

    @property
    def needed(self) -> List[str]:
        """The DT_NEEDED libraries (a tether module has none)."""
        return [v for t, v in self.dynamic_entries() if t == DT_NEEDED]

    @property
    def soname(self) -> Optional[str]:
        for t, v in self.dynamic_entries():
            if t == DT_SONAME:
                return v
        return None

    # -- dynamic symbols -------------------------------------------------------------------------------------
    def dynamic_symbols(self) -> List[Symbol]:
        if self._symbols is None:
            syms: List[Symbol] = []
            sec = self.section(".dynsym")
            if sec is None:
                sec = next((s for s in self.sections if s.type == SHT_DYNSYM), None)
            if sec is not None:
                data = self.section_data(sec)
                strtab = self._linked_strtab(sec)
                step = 16 if self.bits == 32 else 24
                for off in range(step, len(data) - step + 1, step):  # entry 0 is the reserved null symbol
                    if self.bits == 32:
                        st_name, _value, _size, info, other, shndx = struct.unpack_from(self._e + "IIIBBH", data, off)
                    else:
                        st_name, info, other, shndx, _value, _size = struct.unpack_from(self._e + "IBBHQQ", data, off)
                    name = _cstring(strtab, st_name, "symbol", self.name)
                    if name:
                        syms.append(Symbol(name, shndx != SHN_UNDEF, info >> 4, other & 3, info & 0xF))
            self._symbols = syms
        return self._symbols

    @property
    def exported_symbols(self) -> List[str]:
        """Defined global/weak symbols with default or protected visibility: what dlsym can find."""
        return [s.name for s in self.dynamic_symbols()
                if s.defined and s.binding in (1, 2) and s.visibility in (0, 3)]

    @property
    def undefined_symbols(self) -> List[str]:
        """Non-weak symbols the library needs someone else to provide, so dlopen fails without them (a tether
        module has none). Weak undefined references (e.g. ARM unwinder personality routines) resolve to NULL."""
        return [s.name for s in self.dynamic_symbols() if not s.defined and s.binding != 2]

    @property
    def weak_undefined_symbols(self) -> List[str]:
        return [s.name for s in self.dynamic_symbols() if not s.defined and s.binding == 2]

    # -- ARM build attributes --------------------------------------------------------------------------------
    def arm_attributes(self) -> Dict[int, Union[int, str]]:
        """File-scope ``aeabi`` attributes of ``.ARM.attributes`` as ``{tag: value}`` (empty if absent)."""
        sec = self.section(".ARM.attributes")
        if sec is None:
            return {}
        return _parse_arm_attributes(self.section_data(sec), self._e, self.name)


def _uleb128(data: bytes, pos: int, end: int, name: str) -> tuple:
    result = shift = 0
    while True:
        if pos >= end:
            raise ModuleLoadError("%s: corrupt .ARM.attributes (truncated number)" % name)
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return result, pos
        if shift > 63:
            raise ModuleLoadError("%s: corrupt .ARM.attributes (number too long)" % name)


def _ntbs(data: bytes, pos: int, end: int, name: str) -> tuple:
    stop = data.find(b"\0", pos, end)
    if stop < 0:
        raise ModuleLoadError("%s: corrupt .ARM.attributes (unterminated string)" % name)
    return data[pos:stop].decode("utf-8", "replace"), stop + 1


def _parse_arm_attributes(data: bytes, e: str, name: str) -> Dict[int, Union[int, str]]:
    # Layout (ARM IHI 0045): 'A', then subsections [u32 len][vendor\0][tag u8, u32 size, attributes...]...
    attrs: Dict[int, Union[int, str]] = {}
    if not data or data[0:1] != b"A":
        return attrs
    pos = 1
    while pos + 4 <= len(data):
        (sub_len,) = struct.unpack_from(e + "I", data, pos)
        sub_end = pos + sub_len
        if sub_len < 5 or sub_end > len(data):
            raise ModuleLoadError("%s: corrupt .ARM.attributes (subsection length %d)" % (name, sub_len))
        vendor, p = _ntbs(data, pos + 4, sub_end, name)
        if vendor == "aeabi":
            while p + 5 <= sub_end:
                tag = data[p]
                (size,) = struct.unpack_from(e + "I", data, p + 1)
                blk_end = p + size
                if size < 5 or blk_end > sub_end:
                    raise ModuleLoadError("%s: corrupt .ARM.attributes (block size %d)" % (name, size))
                if tag == 1:  # Tag_File: attributes for the whole file; section/symbol scopes are skipped
                    q = p + 5
                    while q < blk_end:
                        atag, q = _uleb128(data, q, blk_end, name)
                        if atag in (4, 5, 67) or (atag > 32 and atag % 2 == 1):  # string-valued tags
                            value, q = _ntbs(data, q, blk_end, name)
                        elif atag == 32:  # Tag_compatibility: flag then vendor string
                            value, q = _uleb128(data, q, blk_end, name)
                            _, q = _ntbs(data, q, blk_end, name)
                        else:
                            value, q = _uleb128(data, q, blk_end, name)
                        attrs[atag] = value
                p = blk_end
        pos = sub_end
    return attrs


def read_elf(source: Union[str, os.PathLike, bytes], name: Optional[str] = None) -> ElfFile:
    """Parse ``source`` (a path or the file's bytes); the caller closes the result (or uses ``with``)."""
    return ElfFile(source, name=name)
