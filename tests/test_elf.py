"""The ELF reader on real files (gcc-built modules, /bin/ls, the interpreter) and on broken input."""
from __future__ import annotations

import shutil
import struct
import sys

import pytest

from kernels import build_kernel
from tether_rpc import elf
from tether_rpc.errors import ModuleLoadError


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    d = tmp_path_factory.mktemp("elf")
    return {"vadd": build_kernel("vadd", d), "extern": build_kernel("needs_extern", d, link_flags=())}


def test_header_of_gcc_module_matches_host(built):
    with elf.ElfFile(built["vadd"]) as e:
        assert e.bits == struct.calcsize("P") * 8
        assert e.endian == sys.byteorder
        assert e.arch == elf.host_arch()
        assert e.is_shared_object
        assert e.soname == "vadd.so"
        assert e.needed == []
        assert e.undefined_symbols == []
        # visibility=hidden: exactly the packed functions, the launcher setter and the metadata are exported
        assert sorted(e.exported_symbols) == sorted(["vadd", "probe", "tether_set_parallel_launcher",
                                                     "__tether_metadata"])
        meta = e.section_data(".tether_meta")
        assert meta.startswith(b'{"abi_version": 1') and b"\0" in meta


def test_same_answers_from_bytes_and_path(built):
    data = built["vadd"].read_bytes()
    with elf.ElfFile(built["vadd"]) as a:
        b = elf.ElfFile(data)
        assert (a.machine, a.bits, a.exported_symbols, [s.name for s in a.sections]) == \
            (b.machine, b.bits, b.exported_symbols, [s.name for s in b.sections])
        assert a.section_data(".tether_meta") == b.section_data(".tether_meta")


def test_undefined_symbol_is_reported(built):
    with elf.ElfFile(built["extern"]) as e:
        assert e.undefined_symbols == ["tether_no_such_symbol"]
        assert "f" in e.exported_symbols


def test_system_binary_needs_libc():
    ls = shutil.which("ls")
    with elf.ElfFile(ls) as e:
        assert e.arch == elf.host_arch()
        assert any(n.startswith("libc.so") or n.startswith("ld-") for n in e.needed), e.needed
        assert len(e.undefined_symbols) > 5  # ls imports its libc functions
        assert e.section(".text") is not None


@pytest.mark.parametrize("data", [b"", b"\x7fEL", b"hello world, not an ELF file at all" * 3,
                                  b"\x7fELF\x09\x01\x01" + b"\0" * 60,   # bad class
                                  b"\x7fELF\x02\x01\x01" + b"\0" * 9])   # header cut short
def test_garbage_gives_module_load_error(data):
    with pytest.raises(ModuleLoadError):
        elf.ElfFile(data, name="junk.so")


def test_every_truncation_gives_module_load_error(built):
    data = built["vadd"].read_bytes()
    # Cut at many points (header, mid tables, before the section headers at the end): always a clear error or
    # a consistent parse, never IndexError/struct.error.
    cuts = sorted(set(list(range(0, 80, 7)) + [len(data) * k // 23 for k in range(1, 23)] + [len(data) - 1]))
    errors = 0
    for n in cuts:
        try:
            with elf.ElfFile(data[:n], name="cut.so") as e:
                e.dynamic_entries()
                e.dynamic_symbols()
                e.section_data(".tether_meta")
        except ModuleLoadError as exc:
            assert "cut.so" in str(exc)
            errors += 1
    assert errors == len(cuts)  # the section table sits at the end: every cut loses it


def test_corrupt_section_table_offsets(built):
    data = bytearray(built["vadd"].read_bytes())
    # e_shoff (64-bit header, offset 0x28) pointing past the end of the file
    struct.pack_into("<Q", data, 0x28, len(data) + 4096)
    with pytest.raises(ModuleLoadError, match="section header table"):
        elf.ElfFile(bytes(data), name="bad.so")
    data = bytearray(built["vadd"].read_bytes())
    struct.pack_into("<H", data, 0x3E, 0xFFF0)  # e_shstrndx out of range
    with pytest.raises(ModuleLoadError, match="section name table"):
        elf.ElfFile(bytes(data), name="bad.so")


def test_missing_file_is_module_load_error(tmp_path):
    with pytest.raises(ModuleLoadError, match="cannot open"):
        elf.ElfFile(tmp_path / "nope.so")


def test_host_arch_names(monkeypatch):
    cases = [("x86_64", 8, "x86_64"), ("AMD64", 8, "x86_64"), ("aarch64", 8, "aarch64"), ("arm64", 8, "aarch64"),
             ("aarch64", 4, "armv7"), ("armv7l", 4, "armv7"), ("armv8l", 4, "armv7"), ("armv6l", 4, "armv7")]
    real_calcsize = struct.calcsize
    for machine, ptr, expected in cases:
        monkeypatch.setattr(elf.platform, "machine", lambda m=machine: m)
        monkeypatch.setattr(elf.struct, "calcsize", lambda f, p=ptr: p if f == "P" else real_calcsize(f))
        assert elf.host_arch() == expected, machine


def _attributes_section(vfp_args: int) -> bytes:
    # aeabi subsection holding a Tag_File block: Tag_CPU_name "7-A", Tag_CPU_arch 10, Tag_ABI_VFP_args
    attrs = bytes([5]) + b"7-A\0" + bytes([6, 10, 28, vfp_args])
    block = bytes([1]) + struct.pack("<I", 5 + len(attrs)) + attrs
    sub = b"aeabi\0" + block
    return b"A" + struct.pack("<I", 4 + len(sub)) + sub


def test_arm_attributes_parser():
    assert elf._parse_arm_attributes(_attributes_section(1), "<", "x")[28] == 1
    parsed = elf._parse_arm_attributes(_attributes_section(0), "<", "x")
    assert parsed[28] == 0 and parsed[5] == "7-A" and parsed[6] == 10
    with pytest.raises(ModuleLoadError):
        elf._parse_arm_attributes(_attributes_section(1)[:-3] + b"\xff\xff\xff", "<", "x")


def test_interpreter_is_readable():
    with elf.ElfFile(sys.executable) as e:
        assert e.arch == elf.host_arch()
        assert e.arm_float_abi is None or e.arm_float_abi in ("hard", "soft")
