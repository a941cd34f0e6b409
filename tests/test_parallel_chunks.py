"""How a tether-built parallel loop splits into tasks (codegen/parallel.py, docs/abi.md "Parallel loops").

A launcher installed by the test runs chosen task ids of a real kernel (built, linked and loaded) and reads back
which iterations each one wrote: the module asks for min(extent, cap) tasks (cap: 16, or two per core in a host
build), every task count splits the loop into
contiguous chunks whose sizes differ by at most one iteration, and a task id past the count writes nothing."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest

from fixtures.schedules import elementwise
from tether.codegen.parallel import max_parallel_tasks
from tether.target import Target
from tether_rpc import module, parallel

FACTOR = 4  # elements per iteration of the parallel loop


@pytest.fixture(scope="module")
def build_loop(tmp_path_factory, host_linker):
    import tether

    built = {}

    def get(extent: int):
        if extent not in built:
            s, args = elementwise(extent * FACTOR, lambda a: a * 2.0 + 1.0, inputs=1, factor=FACTOR,
                                  vectorize=False)
            lib = tether.build(s, args, target="host", name="affine")
            path = lib.export_library(str(tmp_path_factory.mktemp("chunks") / ("affine%d.so" % extent)))
            built[extent] = module.load_module(path, parallel_launcher=False)
        return built[extent]
    return get


class _Recorder:
    """A launcher that runs the tasks it is told to, with the task count it is told to (the chunked contract
    lets it pick any), and remembers the count the module asked for."""

    def __init__(self, lib: ctypes.CDLL):
        self.asked = []
        self.plan = None  # (num_tasks, [task ids]); None: every task the module asked for
        self.cb = parallel.LAUNCHER_TYPE(self._launch)
        setter = lib.tether_set_parallel_launcher
        setter.argtypes, setter.restype = [ctypes.c_void_p], None
        setter(ctypes.cast(self.cb, ctypes.c_void_p).value)
        self._setter = setter

    def _launch(self, task_ptr, closure, num_tasks):
        self.asked.append(num_tasks)
        task = parallel.TASK_TYPE(task_ptr)
        n, ids = self.plan if self.plan is not None else (num_tasks, range(num_tasks))
        for tid in ids:
            rc = task(tid, n, closure)
            if rc:
                return rc
        return 0

    def close(self) -> None:
        self._setter(None)


def _chunk(mod, rec: _Recorder, extent: int, n: int, tid: int) -> np.ndarray:
    """The loop iterations task ``tid`` of ``n`` wrote (checked to hold the kernel's values)."""
    x = np.arange(extent * FACTOR, dtype=np.float32)
    y = np.full(extent * FACTOR, np.nan, dtype=np.float32)
    rec.plan = (n, [tid])
    mod["affine"](x, y)
    written = ~np.isnan(y)
    np.testing.assert_array_equal(y[written], x[written] * 2 + 1)
    per_iter = written.reshape(extent, FACTOR)
    assert (per_iter.all(axis=1) | ~per_iter.any(axis=1)).all(), "a task wrote part of an iteration"
    return np.flatnonzero(per_iter.all(axis=1))


@pytest.mark.parametrize("extent", [2, 13, 16, 17, 50, 1000])
def test_tasks_are_balanced_contiguous_chunks(build_loop, extent):
    mod = build_loop(extent)
    rec = _Recorder(mod._lib)
    try:
        rec.plan = None
        x = np.arange(extent * FACTOR, dtype=np.float32)
        y = np.zeros_like(x)
        mod["affine"](x, y)
        np.testing.assert_array_equal(y, x * 2 + 1)
        # a host build asks for two tasks per core of this machine (device presets: 16; test_codegen_llvm)
        assert rec.asked == [min(extent, max_parallel_tasks(Target("host")))]
        for n in sorted({1, 2, 3, 7, 16, extent, extent + 3}):
            chunks = [_chunk(mod, rec, extent, n, tid) for tid in range(n)]
            sizes = [len(c) for c in chunks]
            assert sum(sizes) == extent and max(sizes) - min(sizes) <= 1, (n, sizes)
            covered = np.concatenate(chunks)
            np.testing.assert_array_equal(covered, np.arange(extent))  # in order, disjoint, complete
            for c in chunks:
                if len(c):
                    assert c[-1] - c[0] == len(c) - 1  # contiguous
            # a task id past the count (a misbehaving launcher) runs nothing
            assert len(_chunk(mod, rec, extent, n, n)) == 0
            assert len(_chunk(mod, rec, extent, n, n + 5)) == 0
    finally:
        rec.close()
