"""The persistent object cache (codegen/objcache.py): a rebuilt module is read back instead of compiled, and the
cached object computes what numpy does; a corrupt entry is a miss, never an error; the cache can be turned off;
the directory stays within its size bound."""
from __future__ import annotations

import glob
import os

import numpy as np
import pytest

import tether
from tether import ops, te
from tether.codegen import emit, objcache


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TETHER_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("TETHER_OBJECT_CACHE", raising=False)
    monkeypatch.delenv("TETHER_OBJECT_CACHE_MB", raising=False)
    return tmp_path / "cache" / "objects"


def _entries(root) -> list:
    return sorted(glob.glob(os.path.join(str(root), "*", "*.obj")))


def _kernel(n: int = 1000, name: str = "sig"):
    a = te.placeholder((n,), "float32", name="a")
    b = ops.sigmoid(a)
    return ops.schedule([b], "host"), [a, b], name


def _check_sigmoid(mod, n: int = 1000) -> None:
    x = np.random.default_rng(n).standard_normal(n).astype(np.float32) * 4
    y = np.zeros_like(x)
    mod.load()[mod.metadata["functions"][0]["name"]](x, y)
    np.testing.assert_allclose(y, 1 / (1 + np.exp(-x)), rtol=1e-5, atol=1e-6)



def test_miss_then_hit_gives_the_same_object_and_results(cache, monkeypatch):
    first = tether.build(*_kernel()[:2], name="sig", jobs=1)
    assert len(_entries(cache)) == 1
    _check_sigmoid(first)

    # the second build must not reach LLVM at all
    def no_llvm(*args, **kwargs):
        raise AssertionError("LLVM ran although the module was cached")
    monkeypatch.setattr(emit, "optimize", no_llvm)
    monkeypatch.setattr(emit, "_parse", no_llvm)
    second = tether.build(*_kernel()[:2], name="sig", jobs=1)
    assert second.compiled.object_bytes == first.compiled.object_bytes
    assert second.get_source("ll-opt") == first.get_source("ll-opt")
    _check_sigmoid(second)


def test_key_depends_on_ir_target_and_opt():
    k = objcache.key("ir", "x86_64-unknown-linux-gnu", 3)
    assert k == objcache.key("ir", "x86_64-unknown-linux-gnu", 3)
    assert len({k, objcache.key("ir2", "x86_64-unknown-linux-gnu", 3),
                objcache.key("ir", "aarch64-unknown-linux-gnu", 3), objcache.key("ir", "x86_64-unknown-linux-gnu", 2)
                }) == 4


@pytest.mark.parametrize("damage", ["truncate", "flip", "garbage", "empty"])
def test_a_corrupt_entry_is_a_miss_and_is_replaced(cache, damage):
    first = tether.build(*_kernel()[:2], name="sig", jobs=1)
    (path,) = _entries(cache)
    blob = open(path, "rb").read()
    if damage == "truncate":
        blob = blob[: len(blob) // 2]
    elif damage == "flip":
        blob = blob[:-10] + bytes([blob[-10] ^ 0xFF]) + blob[-9:]
    elif damage == "garbage":
        blob = b"\x93" * 4096
    else:
        blob = b""
    with open(path, "wb") as f:
        f.write(blob)
    assert objcache.load(os.path.basename(os.path.dirname(path)) + os.path.basename(path)[:-4]) is None
    assert not os.path.exists(path), "a corrupt entry should be removed"
    again = tether.build(*_kernel()[:2], name="sig", jobs=1)
    assert again.compiled.object_bytes == first.compiled.object_bytes
    assert len(_entries(cache)) == 1
    _check_sigmoid(again)


def test_disabled_by_env_var_reads_and_writes_nothing(cache, monkeypatch):
    monkeypatch.setenv("TETHER_OBJECT_CACHE", "0")
    mod = tether.build(*_kernel()[:2], name="sig", jobs=1)
    assert not os.path.exists(str(cache))
    _check_sigmoid(mod)
    # an entry written while enabled is ignored while disabled
    monkeypatch.setenv("TETHER_OBJECT_CACHE", "1")
    tether.build(*_kernel()[:2], name="sig", jobs=1)
    (path,) = _entries(cache)
    monkeypatch.setenv("TETHER_OBJECT_CACHE", "0")
    key = os.path.basename(os.path.dirname(path)) + os.path.basename(path)[:-4]
    assert objcache.load(key) is None


def test_parts_build_hits_on_rebuild(cache):
    kernels = [_kernel(100 + 64 * i, "k%d" % i) for i in range(6)]
    first = tether.build(kernels, name="m", jobs=2)
    n = len(_entries(cache))
    assert n == 3, "two kernel parts and a runtime part"
    second = tether.build([_kernel(100 + 64 * i, "k%d" % i) for i in range(6)], name="m", jobs=2)
    assert len(_entries(cache)) == n
    assert second.compiled.object_bytes == first.compiled.object_bytes
    lib = second.load()
    for i in range(6):
        x = np.random.default_rng(i).standard_normal(100 + 64 * i).astype(np.float32)
        y = np.zeros_like(x)
        lib["k%d" % i](x, y)
        np.testing.assert_allclose(y, 1 / (1 + np.exp(-x)), rtol=1e-5, atol=1e-6)


def test_size_bound_drops_least_recently_used(cache, monkeypatch):
    for n in (300, 400, 500):
        tether.build(*_kernel(n)[:2], name="sig", jobs=1)
    entries = _entries(cache)
    assert len(entries) == 3
    sizes = {p: os.path.getsize(p) for p in entries}
    # make the n=300 entry the oldest, then trim to just under everything: it must be the one to go
    oldest = min(entries, key=os.path.getmtime)
    os.utime(oldest, (1, 1))
    objcache.trim(sum(sizes.values()) - 1)
    left = _entries(cache)
    assert oldest not in left and left
    assert sum(os.path.getsize(p) for p in left) <= (sum(sizes.values()) - 1) * 3 // 4


def test_unwritable_cache_only_logs(tmp_path, monkeypatch, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("TETHER_CACHE_DIR", str(blocker))
    monkeypatch.delenv("TETHER_OBJECT_CACHE", raising=False)
    mod = tether.build(*_kernel()[:2], name="sig", jobs=1)
    _check_sigmoid(mod)
    assert "could not write the object cache" in caplog.text
