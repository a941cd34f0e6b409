"""tether.build with several worker processes: the kernels are compiled in forked workers as "kernels" parts,
a "runtime" part is added, and the objects are merged into one (ld.lld -r). The result must be the same module
as a one-process build: the same functions and metadata, the same results, one self-contained .so."""
from __future__ import annotations

import numpy as np
import pytest

import tether
from tether import ops, te
from tether.codegen import call_list, threadpool
from tether.errors import CompileError, ScheduleError
from tether_rpc import elf


def _kernels(target: str = "host"):
    """Eight different kernels: elementwise with math (exp), a parallel one, and a matmul."""
    out = []
    for i in range(6):
        a = te.placeholder((37 + 64 * i,), "float32", name="a")
        b = ops.exp(a) if i % 2 else ops.relu(a)
        out.append((ops.schedule([b], target), [a, b], "k%d" % i))
    x = te.placeholder((96, 64), "float32", name="x")
    w = te.placeholder((64, 80), "float32", name="w")
    y = ops.matmul(x, w)
    out.append((ops.schedule([y], target), [x, w, y], "mm"))
    big = te.placeholder((1 << 16,), "float32", name="big")
    z = ops.sigmoid(big)
    out.append((ops.schedule([z], target), [big, z], "par"))
    return out


def test_parts_build_matches_a_one_process_build(tmp_path):
    whole = tether.build(_kernels(), name="m", jobs=1)
    parts = tether.build(_kernels(), name="m", jobs=2)
    assert parts.compiled.parts, "jobs=2 should have built in parts"
    assert not whole.compiled.parts
    assert parts.metadata["functions"] == whole.metadata["functions"]
    assert {k: v for k, v in parts.metadata.items() if k != "functions"} == \
        {k: v for k, v in whole.metadata.items() if k != "functions"}
    assert any(f["parallel"] for f in parts.metadata["functions"])

    path = parts.export_library(str(tmp_path / "m.so"))
    with elf.read_elf(path) as f:
        assert f.needed == [] and f.undefined_symbols == []
        assert set(f.exported_symbols) == {"k%d" % i for i in range(6)} | {"mm", "par", "__tether_metadata",
                                                                         "tether_set_parallel_launcher"} | set(
            threadpool.EXPORTED_SYMBOLS) | set(call_list.EXPORTED_SYMBOLS)
    assert "k3__impl" in parts.get_source("asm") and "define" in parts.get_source("ll-opt")

    rng = np.random.default_rng(0)
    m1, m2 = whole.load(), parts.load()
    for i in range(6):
        a = rng.standard_normal(37 + 64 * i).astype(np.float32)
        r1, r2 = np.zeros_like(a), np.zeros_like(a)
        m1["k%d" % i](a, r1)
        m2["k%d" % i](a, r2)
        np.testing.assert_array_equal(r1, r2)
        np.testing.assert_allclose(r2, np.exp(a) if i % 2 else np.maximum(a, 0), rtol=1e-5, atol=1e-6)
    x, w = rng.standard_normal((96, 64)).astype(np.float32), rng.standard_normal((64, 80)).astype(np.float32)
    y = np.zeros((96, 80), np.float32)
    m2["mm"](x, w, y)
    np.testing.assert_allclose(y, x @ w, rtol=1e-4, atol=1e-4)
    big = rng.standard_normal(1 << 16).astype(np.float32)
    z = np.zeros_like(big)
    m2["par"](big, z)
    np.testing.assert_allclose(z, 1 / (1 + np.exp(-big)), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("target", ["rasp4b", "rasp3b"])
def test_parts_link_for_arm(tmp_path, target):
    lib = tether.build(_kernels(target), target=target, name="m", jobs=2)
    with elf.read_elf(lib.export_library(str(tmp_path / "m.so"))) as f:
        assert f.arch == lib.target.arch and f.needed == [] and f.undefined_symbols == []


def test_a_worker_error_keeps_its_type_and_message():
    items = _kernels()
    a = te.placeholder((8,), "float32", name="a")
    b = te.compute((8,), lambda i: a[i] + 1.0, name="b")
    s = te.create_schedule(b.op)
    s[b].compute_inline()        # an output cannot be inlined: lowering fails inside the worker
    items.append((s, [a, b], "bad"))
    with pytest.raises(ScheduleError, match="'b' is a kernel argument"):
        tether.build(items, name="m", jobs=2)


def test_duplicate_function_names_are_refused_before_forking():
    items = _kernels() + _kernels()[:1]
    with pytest.raises(CompileError, match="more than one function named k0"):
        tether.build(items, name="m", jobs=2)


def test_a_worker_blocked_on_a_lock_copied_by_fork_is_replaced(monkeypatch, caplog):
    """fork() copies only the calling thread: a lock another thread holds at that moment stays taken forever in
    the child (seen with onnxruntime's pool beside a build). The stalled worker is killed and its kernels are
    built in the parent, with the same result as a one-process build."""
    import os
    import threading
    import time

    from tether import driver

    parent = os.getpid()
    held, release = threading.Lock(), threading.Event()
    real_part = driver._build_kernels_part

    def part_taking_the_lock(*args, **kwargs):
        if os.getpid() != parent:
            held.acquire()            # never released in the child: the thread that holds it was not copied
        return real_part(*args, **kwargs)

    def holder():
        with held:
            release.wait()

    t = threading.Thread(target=holder, daemon=True)
    t.start()
    try:
        while not held.locked():
            time.sleep(0.001)
        monkeypatch.setattr(driver, "_build_kernels_part", part_taking_the_lock)
        monkeypatch.setattr(driver, "STALL_S", 1.0)
        with caplog.at_level("WARNING", logger="tether.driver"):
            parts = tether.build(_kernels(), name="m", jobs=2)
        assert held.locked(), "the build waited for the lock to be released instead of replacing its workers"
    finally:
        release.set()
        t.join(10)
    assert sum("used no CPU" in r.getMessage() for r in caplog.records) == 2
    whole = tether.build(_kernels(), name="m", jobs=1)
    assert parts.metadata == whole.metadata
    rng = np.random.default_rng(1)
    x, w = rng.standard_normal((96, 64)).astype(np.float32), rng.standard_normal((64, 80)).astype(np.float32)
    y = np.zeros((96, 80), np.float32)
    parts.load()["mm"](x, w, y)
    np.testing.assert_allclose(y, x @ w, rtol=1e-4, atol=1e-4)
