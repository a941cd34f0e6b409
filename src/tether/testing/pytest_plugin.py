"""A pytest plugin that runs tests on devices from a tether tracker (labgrid-style fixture ladder).

Enable it with ``-p tether.testing.pytest_plugin`` (or ``pytest_plugins = ["tether.testing.pytest_plugin"]`` in
a root conftest), then::

    pytest --tether-tracker lab:9190 --tether-key rasp4b

    def test_vadd(tether_session):                  # a fresh RemoteSession on a granted device, per test
        f = tether_session.load_module(...)

    @pytest.mark.tether_device("arch=aarch64")      # a different key or tags for one test
    def test_on_any_arm64(tether_session): ...

Ladder: ``tether_tracker`` (session scope: one tracker connection) -> ``tether_device`` (session scope: the key,
checked against the tracker's summary; tests skip with the reason when no device has it) -> ``tether_session``
(function scope: a session opened through the tracker and closed after the test, so a device is held only
while a test runs). Without ``--tether-tracker`` every test using these fixtures is skipped, saying why.
"""
from __future__ import annotations

import os
from typing import Any, Dict, Iterator, Optional

import pytest

_OPTIONS = pytest.StashKey[Dict[str, Any]]()


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


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "tether_device(key): run this test on a device matching key or tags")
    config.stash[_OPTIONS] = {
        "tracker": config.getoption("--tether-tracker"), "key": config.getoption("--tether-key"),
        "token": config.getoption("--tether-token") or os.environ.get("TETHER_TRACKER_TOKEN") or None,
        "wait": config.getoption("--tether-wait"), "session_timeout": config.getoption("--tether-session-timeout"),
        "priority": config.getoption("--tether-priority")}


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
