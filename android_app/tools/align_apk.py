#!/usr/bin/env python3
"""Align an APK's stored entries for mmap: native libraries (``lib/**.so``) at 16 KiB, everything else at 4 bytes.

    align_apk.py IN.apk OUT.apk      write an aligned copy (stored entries stay stored, deflated stay deflated)
    align_apk.py --check APK         exit 1 naming every stored entry that is not aligned

Debian's zipalign knows only ``-p`` (4 KiB for .so); Android 15+ devices with 16 KiB pages need 16 KiB (the
``zipalign -P 16`` of newer build-tools). Padding goes in an extra field of id 0xD935, the one apksigner and
zipalign write (2 bytes: the alignment, then zeros), so apksigner recognises it and keeps the offsets.
Standard library only.
"""
from __future__ import annotations

import struct
import sys
import zipfile

SO_ALIGN = 16384
DEFAULT_ALIGN = 4
ALIGNMENT_EXTRA_ID = 0xD935
LOCAL_HEADER = struct.Struct("<4sHHHHHIIIHH")  # signature ... name length, extra length: 30 bytes


def wanted_alignment(name: str) -> int:
    return SO_ALIGN if name.startswith("lib/") and name.endswith(".so") else DEFAULT_ALIGN


def _strip_alignment_extra(extra: bytes) -> bytes:
    """The extra field without a previous alignment record (ids 0xD935, and zipalign's zero padding)."""
    out = b""
    i = 0
    while i + 4 <= len(extra):
        eid, size = struct.unpack_from("<HH", extra, i)
        if eid == 0 and size == 0:  # zipalign's bare zero padding runs to the end
            break
        if eid != ALIGNMENT_EXTRA_ID:
            out += extra[i:i + 4 + size]
        i += 4 + size
    return out


def align(src: str, dst: str) -> None:
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for info in zin.infolist():
            data = zin.read(info)
            out = zipfile.ZipInfo(info.filename, date_time=info.date_time)
            out.compress_type = info.compress_type
            out.external_attr = info.external_attr
            out.create_system = info.create_system
            extra = _strip_alignment_extra(info.extra)
            if info.compress_type == zipfile.ZIP_STORED:
                alignment = wanted_alignment(info.filename)
                offset = zout.fp.tell()
                data_at = offset + LOCAL_HEADER.size + len(info.filename.encode("utf-8")) + len(extra) + 6
                pad = (-data_at) % alignment
                extra += struct.pack("<HHH", ALIGNMENT_EXTRA_ID, 2 + pad, alignment) + b"\0" * pad
            out.extra = extra
            zout.writestr(out, data)


def misaligned(path: str) -> list:
    """(name, data offset, wanted alignment) of every stored entry whose data is not aligned."""
    bad = []
    with zipfile.ZipFile(path) as z, open(path, "rb") as f:
        for info in z.infolist():
            if info.compress_type != zipfile.ZIP_STORED:
                continue
            f.seek(info.header_offset)
            header = LOCAL_HEADER.unpack(f.read(LOCAL_HEADER.size))
            data_at = info.header_offset + LOCAL_HEADER.size + header[-2] + header[-1]
            alignment = wanted_alignment(info.filename)
            if data_at % alignment:
                bad.append((info.filename, data_at, alignment))
    return bad


def main(argv: list) -> int:
    if len(argv) == 2 and argv[0] == "--check":
        bad = misaligned(argv[1])
        for name, at, alignment in bad:
            sys.stderr.write("align_apk.py: %s: %s starts at %d, not a multiple of %d\n"
                             % (argv[1], name, at, alignment))
        return 1 if bad else 0
    if len(argv) == 2:
        align(argv[0], argv[1])
        return 0
    sys.stderr.write(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
