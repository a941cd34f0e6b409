"""Host callbacks (docs/abi.md "Host callbacks"): a compiled kernel calls functions registered by name, in the
Python runtime (tether.register_func), on a device server (rpc-server --functions FILE.py, also offered to
clients as remote.get_function(name)) and in the Go runtime (RegisterFunc, tests/test_go_runtime.py drives it
here with a Go closure). Results are checked against numpy."""
from __future__ import annotations

import textwrap

import numpy as np
import pytest

import tether
from fixtures.golang import GoCases, run_go_test
from fixtures.rpc import start_server
from tether import errors, rpc, te
from tether_rpc import host_functions, module
from tether_rpc.errors import KernelError, ModuleLoadError

N = 4096


def _affine_kernel(name: str, func: str, parallel: bool = False):
    A = te.placeholder((N,), "float32", name="A")
    C = te.compute((N,), lambda i: te.call_packed(func, A[i], i, dtype="float32"), name="C")
    s = te.create_schedule(C.op)
    if parallel:
        xo, _ = s[C].split(C.op.axis[0], factor=256)
        s[C].parallel(xo)
    return tether.build(s, [A, C], target="host", name=name)


def _affine(x, i):
    return x * 2.0 + i  # float64 arithmetic, rounded to float32 by the kernel


def _expected(a):
    return (a.astype("float64") * 2.0 + np.arange(N)).astype("float32")


@pytest.fixture
def registry():
    names = []

    def register(name, fn):
        tether.register_func(name, fn)
        names.append(name)
    yield register
    for n in names:
        host_functions.remove_func(n)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    d = tmp_path_factory.mktemp("hostcall")
    out = {}
    for name, func, par in (("affine", "test.affine", False), ("affine_par", "test.affine", True),
                            ("go_affine", "go.affine", False)):
        lib = _affine_kernel(name, func, par)
        assert lib.metadata["host_functions"] == [func]
        out[name] = lib.export_library(str(d / (name + ".so")))
    return d, out


def test_kernel_calls_a_python_callable(built, registry):
    _, libs = built
    seen = []
    registry("test.affine", lambda x, i: seen.append(i) or _affine(x, i))
    a = np.random.default_rng(0).standard_normal(N).astype("float32")
    for name in ("affine", "affine_par"):  # the parallel one calls back from the pool's worker threads
        seen.clear()
        c = np.zeros(N, "float32")
        module.load_module(libs[name])[name](a, c)
        np.testing.assert_array_equal(c, _expected(a))
        assert sorted(seen) == list(range(N))


def test_missing_host_function_fails_at_load(built):
    _, libs = built
    host_functions.remove_func("test.affine")
    with pytest.raises(ModuleLoadError, match="needs host function 'test.affine', not registered"):
        module.load_module(libs["affine"])


def test_host_function_errors_name_the_function(built, registry):
    _, libs = built
    registry("test.affine", lambda x, i: 1 / 0 if i == 77 else x)
    m = module.load_module(libs["affine"])
    a = np.ones(N, "float32")
    with pytest.raises(KernelError, match=r"affine: host function 'test.affine' failed: ZeroDivisionError"):
        m["affine"](a, np.zeros(N, "float32"))
    with pytest.raises(KernelError, match="in a parallel task: host function 'test.affine' failed"):
        module.load_module(libs["affine_par"])["affine_par"](a, np.zeros(N, "float32"))
    c = np.zeros(N, "float32")
    registry("test.ok", lambda: 0)
    host_functions.register_func("test.affine", lambda x, i: x, override=True)
    m["affine"](a, c)  # the module keeps working once the function does
    np.testing.assert_array_equal(c, a)
    with pytest.raises(ValueError, match="already registered"):
        tether.register_func("test.ok", lambda: 1)


FUNCTIONS_FILE = textwrap.dedent('''
    import os
    from tether_rpc.host_functions import register_func

    @register_func("test.affine")
    def affine(x, i):
        return x * 2.0 + i

    @register_func("device.greet")
    def greet(name, times):
        return len(name) * times + 0.5

    @register_func("device.crash")
    def crash():
        os.abort()
''')


def test_device_server_offers_functions_from_a_file(built, tmp_path):
    _, libs = built
    path = tmp_path / "funcs.py"
    path.write_text(FUNCTIONS_FILE)
    server = start_server(tmp_path, "--functions", str(path))
    try:
        with rpc.connect(server.host, server.port, timeout=30) as remote:
            assert remote.get_function("device.greet")("héllo", 3) == 15.5
            with pytest.raises(errors.RemoteError, match="offers no function 'nope'"):
                remote.get_function("nope")
            # a kernel uploaded to the device calls the function the file registered there
            remote.upload(libs["affine"])
            f = remote.load_module("affine.so")["affine"]
            a = np.random.default_rng(1).standard_normal(N).astype("float32")
            ra, rc = remote.array(a), remote.empty((N,), "float32")
            f(ra, rc)
            np.testing.assert_array_equal(rc.numpy(), _expected(a))
        with rpc.connect(server.host, server.port, timeout=30) as remote:
            with pytest.raises(errors.SessionCrashed):  # same isolation as a crashing kernel
                remote.get_function("device.crash")()
        with rpc.connect(server.host, server.port, timeout=30) as remote:
            assert remote.get_function("device.greet")("ab", 2) == 4.5  # the server survived
    finally:
        server.stop()


def test_go_kernel_calls_a_go_closure(built, registry):
    d, libs = built
    registry("go.affine", _affine)  # the Python runtime's result, for Go to match bit for bit
    a = np.random.default_rng(2).standard_normal(N).astype("float32")
    c = np.zeros(N, "float32")
    module.load_module(libs["go_affine"])["go_affine"](a, c)
    np.testing.assert_array_equal(c, _expected(a))
    cases = GoCases(d / "go-cases")
    cases.add("go_affine", libs["go_affine"], "go_affine", [a, np.zeros(N, "float32")], {1: c})
    out = run_go_test(["."], cases.write(), run="^TestHostFunc")
    assert "--- PASS: TestHostFuncCalledFromKernel" in out, out


def test_call_packed_prints_and_refuses_vector_loops():
    A = te.placeholder((64,), "float32", name="A")
    C = te.compute((64,), lambda i: te.call_packed("f", A[i], dtype="float32"), name="C")
    s = te.create_schedule(C.op)
    assert "call_packed('f', A[" in str(tether.lower(s, [A, C], name="v"))
    _, xi = s[C].split(C.op.axis[0], factor=8)
    s[C].vectorize(xi)
    with pytest.raises(NotImplementedError, match=r"call_packed\('f'\) inside a vectorized loop \(dtype float32\)"):
        tether.build(s, [A, C], target="host", name="v")
    with pytest.raises(ValueError, match="needs a function name"):
        te.call_packed("", A[0])
