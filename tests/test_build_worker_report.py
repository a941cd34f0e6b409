"""A build worker that cannot write its report (a full temporary directory) fails the build with an error that
says so, instead of a bare wait status."""
from __future__ import annotations

import errno

import pytest

import tether
from tether import driver, ops, te
from tether.errors import CompileError


def _kernels():
    out = []
    for i in range(6):
        a = te.placeholder((40 + 8 * i,), "float32", name="a")
        b = ops.relu(a)
        out.append((ops.schedule([b], "host"), [a, b], "k%d" % i))
    return out


def test_a_worker_that_cannot_write_its_report_is_named(monkeypatch):
    def disk_full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")
    # the forked workers inherit the patch; the parent never packs a report
    monkeypatch.setattr(driver.msgpack, "packb", disk_full)
    monkeypatch.setenv("TETHER_OBJECT_CACHE", "0")
    with pytest.raises(CompileError, match="could not write its report"):
        tether.build(_kernels(), name="m", jobs=2)
