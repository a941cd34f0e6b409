"""A pytest plugin that runs tests on devices from a tether tracker (labgrid-style fixture ladder).

It is registered through the ``pytest11`` entry point, so installing tether enables it (``-p
tether.testing.pytest_plugin`` still works for a checkout that is not installed), then::

    pytest --tether-tracker lab:9190 --tether-key rasp4b

    def test_vadd(tether_session):                  # a fresh RemoteSession on a granted device, per test
        f = tether_session.load_module(...)

    @pytest.mark.tether_device("arch=aarch64")      # a different key or tags for one test
    def test_on_any_arm64(tether_session): ...

    def test_vadd_speed(tether_session, remote_benchmark):   # measured on the granted device (docs/bench.md)
        f = ...; a, b, c = ...
        result = remote_benchmark(f, a, b, c, samples=30)   # the same result record as `tether bench --json`
        assert result["stats"]["median"] < 1e-3

``--tether-bench-json FILE`` writes every remote_benchmark result of the run as one `tether bench` document.

Ladder: ``tether_tracker`` (session scope: one tracker connection) -> ``tether_device`` (session scope: what the
run asks for: the key of --tether-key and the queue options) -> ``tether_session`` (function scope: the key, or the
test's ``tether_device`` mark, is checked against the tracker's summary, and the test skips with the reason when
no device has it; then a session is opened through the tracker and closed after the test, so a device is held
only while a test runs). Without ``--tether-tracker`` every test using these fixtures is skipped, saying why.
"""
from __future__ import annotations

import os
from typing import Any, Dict, Iterator, Optional

import pytest

_OPTIONS = pytest.StashKey[Dict[str, Any]]()
_BENCH = pytest.StashKey[Dict[str, Any]]()  # {"devices": {id: record}, "results": [...]} of remote_benchmark


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("tether", "tether devices through a tracker")
    group.addoption("--tether-tracker", metavar="HOST:PORT", default=os.environ.get("TETHER_TRACKER"),
                    help="tracker to take devices from (env TETHER_TRACKER)")
    group.addoption("--tether-key", default=os.environ.get("TETHER_KEY"),
                    help="device key, glob or tags to request, e.g. rasp4b, rasp*, arch=aarch64 (env TETHER_KEY)")
    group.addoption("--tether-token", default=None, help="the tracker's token (default: env TETHER_TRACKER_TOKEN)")
    group.addoption("--tether-wait", type=float, default=300.0,
                    help="seconds a test may wait in the tracker's queue for a device (default 300)")
    group.addoption("--tether-session-timeout", type=float, default=600.0,
                    help="seconds one test may hold its device (default 600)")
    group.addoption("--tether-priority", type=float, default=1.0, help="queue priority of this test run")
    group.addoption("--tether-bench-json", metavar="FILE", default=None,
                    help="write the remote_benchmark results as one `tether bench` JSON document")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "tether_device(key): run this test on a device matching key or tags")
    config.stash[_OPTIONS] = {
        "tracker": config.getoption("--tether-tracker"), "key": config.getoption("--tether-key"),
        "token": config.getoption("--tether-token") or os.environ.get("TETHER_TRACKER_TOKEN") or None,
        "wait": config.getoption("--tether-wait"), "session_timeout": config.getoption("--tether-session-timeout"),
        "priority": config.getoption("--tether-priority")}
    config.stash[_BENCH] = {"devices": {}, "results": []}


def pytest_sessionfinish(session: pytest.Session) -> None:
    path = session.config.getoption("--tether-bench-json", None)
    bench = session.config.stash.get(_BENCH, None)
    if not path or bench is None:
        return
    from tether.bench import io, runner

    doc = runner.run_document(list(bench["devices"].values()), bench["results"], runner.BenchOptions(),
                              ["pytest"] + list(session.config.invocation_params.args))
    io.write_json(doc, path)


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    bench = config.stash.get(_BENCH, None)
    if not bench or not bench["results"]:
        return
    terminalreporter.section("tether remote benchmarks")
    for r in bench["results"]:
        s = r["stats"]
        terminalreporter.write_line("%-50s %-24s median %10.3f us  95%% CI %.3f-%.3f us  CV %4.1f%%  n=%d"
                                    % (r["target"][:50], r["device"][:24], s["median"] * 1e6,
                                       s["ci95_median"][0] * 1e6, s["ci95_median"][1] * 1e6, 100 * s["cv"], s["n"]))


@pytest.fixture(scope="session")
def tether_tracker(pytestconfig: pytest.Config) -> Iterator[Any]:
    """The tracker connection (a :class:`tether.rpc.tracker_client.TrackerClient`)."""
    from tether.rpc.tracker_client import connect_tracker
    from tether_rpc.config import parse_hostport

    opts = pytestconfig.stash[_OPTIONS]
    if not opts["tracker"]:
        pytest.skip("no tether tracker: pass --tether-tracker HOST:PORT (or set TETHER_TRACKER)")
    try:
        host, port = parse_hostport(str(opts["tracker"]), default_host="127.0.0.1")
    except ValueError:
        raise pytest.UsageError("--tether-tracker must be HOST:PORT, got %r" % opts["tracker"]) from None
    client = connect_tracker(host, port, token=opts["token"], name="pytest")
    try:
        yield client
    finally:
        client.close()


def _available(tracker: Any, key: str) -> bool:
    from tether_rpc.tracker_protocol import parse_pattern, pattern_matches

    pattern = parse_pattern(key)
    return any(pattern_matches(pattern, d["key"], d.get("tags", {})) for d in tracker.summary()["devices"])


@pytest.fixture(scope="session")
def tether_device(tether_tracker: Any, pytestconfig: pytest.Config) -> Dict[str, Any]:
    """What the run asks for: ``{"key", "priority", "wait", "session_timeout"}`` (key from --tether-key)."""
    opts = pytestconfig.stash[_OPTIONS]
    return {"key": opts["key"], "priority": opts["priority"], "wait": opts["wait"],
            "session_timeout": opts["session_timeout"]}


@pytest.fixture
def tether_session(request: pytest.FixtureRequest, tether_tracker: Any, tether_device: Dict[str, Any]) -> Iterator[Any]:
    """A RemoteSession on a granted device, closed (and the device released) after the test."""
    marker = request.node.get_closest_marker("tether_device")
    key: Optional[str] = marker.args[0] if marker is not None and marker.args else tether_device["key"]
    if not key:
        pytest.skip("no device key: pass --tether-key KEY or mark the test with @pytest.mark.tether_device(KEY)")
    if not _available(tether_tracker, key):
        pytest.skip("the tracker has no device matching %r (see `tether query --tracker ...`)" % key)
    session = tether_tracker.request(key, priority=tether_device["priority"], wait_timeout=tether_device["wait"],
                                     session_timeout=tether_device["session_timeout"])
    try:
        yield session
    finally:
        session.close()


class RemoteBenchmark:
    """``remote_benchmark(obj, *args, **options)``: measure on the test's device, like pytest-benchmark's
    ``benchmark`` but with the timing loop on the device (tether.bench.run).

    ``obj`` is a function of a module loaded on ``tether_session`` (called on ``args``: RemoteArrays, numbers),
    a ``RemoteGraphExecutor`` (inputs as set), or a `tether bench` TARGET as a string or path (``"lib.so:func"``,
    a model folder, an ONNX file; ``shapes=``/``dtypes=``/``input_shapes=`` as on the command line), which is
    uploaded and given random inputs. Options are those of :class:`tether.bench.runner.BenchOptions`
    (``samples``, ``min_sample_ms``, ``max_warmup``, ``pin``, ...). Returns the result record (``stats``,
    ``samples``, ...) and keeps it for ``--tether-bench-json``.
    """

    def __init__(self, session: Any, node_id: str, store: Dict[str, Any]):
        self.session = session
        self.node_id = node_id
        self._store = store
        self.results: list = []

    def __call__(self, obj: Any, *args: Any, name: Optional[str] = None, **options: Any) -> Dict[str, Any]:
        from tether.bench import runner

        spec_args = {k: options.pop(k) for k in ("shapes", "dtypes", "input_shapes") if k in options}
        opts = runner.BenchOptions(**options)
        device_id = "%s:%s" % (getattr(self.session, "host", "local"), getattr(self.session, "port", ""))
        if device_id not in self._store["devices"]:
            device = runner.describe_device(self.session, device_id, {"mode": "pytest"})
            self._store["devices"][device_id] = {k: v for k, v in device.items() if k != "info"}
        label = name or (self.node_id if not self.results else "%s#%d" % (self.node_id, len(self.results)))
        if isinstance(obj, (str, os.PathLike)):
            target = runner.parse_target(os.fspath(obj), spec_args.get("shapes"), spec_args.get("dtypes"),
                                         spec_args.get("input_shapes"))
            with runner.temp_workdir() as work:
                result = runner.bench_target(self.session, target, opts, device_id, onnx_cache=runner.OnnxCache(work))
            if name:
                result["target"] = name
        else:
            result = runner.bench_remote_object(self.session, obj, args, opts, label, device_id)
        result["test"] = self.node_id
        self.results.append(result)
        self._store["results"].append(result)
        return result


@pytest.fixture
def remote_benchmark(request: pytest.FixtureRequest, tether_session: Any) -> RemoteBenchmark:
    """Benchmark on the device granted to this test (see :class:`RemoteBenchmark`)."""
    return RemoteBenchmark(tether_session, request.node.nodeid, request.config.stash[_BENCH])
