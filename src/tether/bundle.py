"""The device package as one file: a zipapp holding ``tether_rpc`` alone plus a ``__main__``.

A device needs only Python 3 + numpy + msgpack and this file; nothing of the host package (compiler, click,
llvmlite) goes in, so ``python3 tether-rpc.pyz --port 9090`` is all a board, an emulated userland or Termux runs.
"""
from __future__ import annotations

import io
import logging
import os
import pathlib
import zipfile
from typing import Union

import tether_rpc

log = logging.getLogger(__name__)

DEFAULT_NAME = "tether-rpc.pyz"
SHEBANG = b"#!/usr/bin/env python3\n"

# run_module (not an import of a named main()) keeps the zipapp entry identical to `python -m tether_rpc`.
_MAIN = '''"""tether-rpc zipapp entry: runs the device server of the tether_rpc package inside this archive."""
import runpy

runpy.run_module("tether_rpc", run_name="__main__", alter_sys=True)
'''

# A fixed timestamp makes the archive byte-identical for identical sources, so it can be cached and compared.
_EPOCH = (1980, 1, 1, 0, 0, 0)


def package_files() -> list[tuple[str, pathlib.Path]]:
    """(archive name, source path) for every file of the device package, without caches."""
    root = pathlib.Path(tether_rpc.__file__).resolve().parent
    files = []
    for path in sorted(root.rglob("*")):
        if not path.is_file() or "__pycache__" in path.parts or path.suffix in (".pyc", ".pyo"):
            continue
        files.append(("tether_rpc/" + path.relative_to(root).as_posix(), path))
    return files


def bundle_bytes() -> bytes:
    """The zipapp as bytes (shebang + zip)."""
    buf = io.BytesIO()
    buf.write(SHEBANG)
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr(zipfile.ZipInfo("__main__.py", _EPOCH), _MAIN, compress_type=zipfile.ZIP_DEFLATED)
        for arcname, path in package_files():
            info = zipfile.ZipInfo(arcname, _EPOCH)
            info.external_attr = 0o644 << 16
            zf.writestr(info, path.read_bytes(), compress_type=zipfile.ZIP_DEFLATED)
    return buf.getvalue()


def write_bundle(out_path: Union[str, os.PathLike] = DEFAULT_NAME) -> pathlib.Path:
    """Write the device zipapp to ``out_path`` (executable) and return its path.

    Written to a sibling temporary file and renamed, so a reader never sees half an archive.
    """
    out = pathlib.Path(out_path)
    if out.is_dir():
        out = out / DEFAULT_NAME
    data = bundle_bytes()
    tmp = out.with_name(".%s.%d.tmp" % (out.name, os.getpid()))
    try:
        tmp.write_bytes(data)
        os.chmod(tmp, 0o755)
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            tmp.unlink()
    log.info("wrote %s (%d bytes, %d files)", out, len(data), len(package_files()) + 1)
    return out
