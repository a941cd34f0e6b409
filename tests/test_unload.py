"""Modules are unloaded (dlclose) when freed and when a session ends: the library leaves this process's memory
map, a function of an unloaded module refuses to run (instead of jumping into unmapped code), and a parallel
module providing the native thread pool hands it to another loaded module first."""
from __future__ import annotations

import numpy as np
import pytest

import tether
from tether import te
from tether.errors import ModuleLoadError
from tether.rpc.local import LocalSession
from tether_rpc import parallel
from tether_rpc.module import load_module

N = 1 << 14


def _mapped(path) -> bool:
    with open("/proc/self/maps") as fh:
        return str(path) in fh.read()


def _build(tmp_path, name: str, scale: float):
    A = te.placeholder((N,), "float32", name="A")
    B = te.compute((N,), lambda i: A[i] * scale + 1.0, name="B")
    s = te.create_schedule(B.op)
    xo, xi = s[B].split(B.op.axis[0], factor=256)
    xio, xii = s[B].split(xi, factor=8)
    s[B].parallel(xo)
    s[B].vectorize(xii)
    path = tmp_path / (name + ".so")
    tether.build(s, [A, B], target="host", name=name).export_library(str(path))
    return path


def _run(f, scale: float) -> None:
    x = np.random.default_rng(int(scale)).standard_normal(N).astype("float32")
    out = np.empty_like(x)
    f(x, out)
    np.testing.assert_allclose(out, x.astype(np.float64) * scale + 1.0, rtol=1e-6, atol=1e-6)  # (FMA: one rounding)


def test_closing_the_pool_provider_hands_the_pool_on(tmp_path):
    parallel.set_num_threads(2)
    try:
        pa, pb = _build(tmp_path, "scale_a", 2.0), _build(tmp_path, "scale_b", 3.0)
        a, b = load_module(str(pa)), load_module(str(pb))
        fa, fb = a["scale_a"], b["scale_b"]
        _run(fa, 2.0)
        _run(fb, 3.0)
        provider_was_a = parallel.native_pool() is not None and parallel.native_pool().lib is a._lib
        a.close()
        assert a.unloaded and not _mapped(pa)
        with pytest.raises(ModuleLoadError, match="closed and unloaded"):
            fa(np.zeros(N, "float32"), np.zeros(N, "float32"))
        _run(fb, 3.0)                                     # still right, on the handed-on pool
        if provider_was_a:
            assert parallel.native_pool() is not None and parallel.native_pool().lib is b._lib
        b.close()
        assert b.unloaded and not _mapped(pb)
        again = load_module(str(pa))                      # loads afresh after an unload
        _run(again["scale_a"], 2.0)
        again.close()
        assert not _mapped(pa)
    finally:
        parallel.set_num_threads(parallel.default_num_threads())


def test_a_session_unloads_when_the_last_handle_goes_and_when_it_ends(tmp_path):
    path = _build(tmp_path, "scale_c", 4.0)
    with LocalSession() as s:
        s.upload(str(path))
        mod = s.load_module(path.name)
        f = mod["scale_c"]
        where = s.folder + "/" + path.name
        assert _mapped(where)
        free = s.get_function("tether.free")
        free(mod.handle)                                  # the function handle still holds the library
        assert _mapped(where)
        x = np.arange(N, dtype="float32")
        out = s.empty((N,), "float32")
        f(s.array(x), out)
        np.testing.assert_allclose(out.numpy(), x * 4 + 1)
        free(f.fn)                                        # the last holder: unloaded
        assert not _mapped(where)
        mod2 = s.load_module(path.name)
        g = mod2["scale_c"]
        assert _mapped(where)
        g(s.array(x), out)
    assert not _mapped(where)                             # the session's end unloads what it held
