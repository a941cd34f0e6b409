"""A persistent on-disk cache of compiled objects: (IR text, target, opt, LLVM) -> (object bytes, optimised IR).

LLVM is nearly all of a model's compile time (0.3-0.8 s of CPU per conv kernel), and the same modules are compiled
again and again: a model rebuilt after an edit elsewhere, a test suite building the same kernels in every run, a
benchmark compiling before it measures. The object code is a pure function of the IR text, the target machine
(triple, cpu, features, opt level) and the LLVM that llvmlite bundles, so those are the key (a SHA-256 over all of
them); anything else that shapes the output is already in the IR text.

Layout: ``$TETHER_CACHE_DIR/objects/<2 hex>/<62 hex>.obj`` (default ``$XDG_CACHE_HOME/tether`` or
``~/.cache/tether``). An entry is ``MAGIC | sha256(payload) | payload``, payload a msgpack map with the object and
the zlib-compressed optimised IR. Entries are written to a temporary file and renamed into place, so a reader
sees a whole entry or none; a truncated, corrupt or foreign file is a miss (and is removed), never an error.
The directory is bounded: past ``TETHER_OBJECT_CACHE_MB`` (default 256) the least recently used entries (by
mtime, touched on every hit) are deleted until it is 3/4 full.

``TETHER_OBJECT_CACHE=0`` turns the cache off (reads and writes).
"""
from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import zlib
from typing import Optional, Tuple

import msgpack

log = logging.getLogger(__name__)

MAGIC = b"TETHEROBJ1\n"
DEFAULT_MAX_MB = 256
_DIGEST = hashlib.sha256().digest_size


def enabled() -> bool:
    return os.environ.get("TETHER_OBJECT_CACHE", "1").strip().lower() not in ("0", "off", "no", "false")


def cache_dir() -> str:
    """Where objects are cached: $TETHER_CACHE_DIR/objects, else $XDG_CACHE_HOME/tether/objects, else ~/.cache/..."""
    base = os.environ.get("TETHER_CACHE_DIR")
    if not base:
        xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        base = os.path.join(xdg, "tether")
    return os.path.join(base, "objects")


def max_bytes() -> int:
    env = os.environ.get("TETHER_OBJECT_CACHE_MB", "").strip()
    try:
        return max(1, int(env)) << 20 if env else DEFAULT_MAX_MB << 20
    except ValueError:
        log.warning("ignoring TETHER_OBJECT_CACHE_MB=%r: expected a positive integer (MB)", env)
        return DEFAULT_MAX_MB << 20


def key(ir_text: str, target_desc: str, opt: int) -> str:
    """The cache key of a module: everything that decides its object code."""
    import llvmlite
    import llvmlite.binding as llvm

    h = hashlib.sha256()
    for part in (MAGIC.decode(), llvmlite.__version__, ".".join(map(str, llvm.llvm_version_info)), target_desc,
                 str(int(opt))):
        h.update(part.encode())
        h.update(b"\0")
    h.update(ir_text.encode())
    return h.hexdigest()


def _path(k: str) -> str:
    return os.path.join(cache_dir(), k[:2], k[2:] + ".obj")


def load(k: str) -> Optional[Tuple[bytes, str]]:
    """(object bytes, optimised IR) for key ``k``, or None on a miss (absent, unreadable or corrupt entry)."""
    if not enabled():
        return None
    path = _path(k)
    try:
        with open(path, "rb") as f:
            blob = f.read()
    except OSError:
        return None
    try:
        if not blob.startswith(MAGIC):
            raise ValueError("bad magic")
        digest, payload = blob[len(MAGIC):len(MAGIC) + _DIGEST], blob[len(MAGIC) + _DIGEST:]
        if hashlib.sha256(payload).digest() != digest:
            raise ValueError("checksum mismatch")
        entry = msgpack.unpackb(payload, raw=False, max_bin_len=len(payload), max_str_len=len(payload))
        obj, opt_ir = bytes(entry["obj"]), zlib.decompress(entry["opt_ir"]).decode()
    except (ValueError, KeyError, TypeError, zlib.error, UnicodeDecodeError, msgpack.UnpackException) as exc:
        log.warning("object cache entry %s is unusable (%s): removed, compiling instead", path, exc)
        _remove(path)
        return None
    try:
        os.utime(path)   # recently used: kept longest when the cache is trimmed
    except OSError:
        pass
    return obj, opt_ir


def store(k: str, obj: bytes, opt_ir: str) -> None:
    """Save an entry (atomically); a cache that cannot be written only logs, the build goes on."""
    if not enabled():
        return
    path = _path(k)
    payload = msgpack.packb({"obj": obj, "opt_ir": zlib.compress(opt_ir.encode(), 1)}, use_bin_type=True)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=os.path.dirname(path))
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(MAGIC + hashlib.sha256(payload).digest() + payload)
            os.replace(tmp, path)
        except BaseException:
            _remove(tmp)
            raise
    except OSError as exc:
        log.warning("could not write the object cache at %s: %s", path, exc)
        return
    trim(max_bytes())


def trim(limit: int) -> None:
    """Delete the least recently used entries while the cache holds more than ``limit`` bytes (down to 3/4)."""
    root = cache_dir()
    entries = []
    try:
        for sub in os.scandir(root):
            if not sub.is_dir():
                continue
            for e in os.scandir(sub.path):
                if e.name.endswith(".obj"):
                    try:
                        st = e.stat()
                    except OSError:
                        continue
                    entries.append((st.st_mtime, st.st_size, e.path))
    except OSError:
        return
    total = sum(e[1] for e in entries)
    if total <= limit:
        return
    for _, size, path in sorted(entries):
        if total <= limit * 3 // 4:
            break
        _remove(path)
        total -= size


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass
