"""A browser tab as a tether device: headless Chromium opens the device page that `rpc-tracker --web` serves, the
tab registers with that real tracker (through the WebSocket relay, in reverse mode) and a Python client requests
it by key, runs a wasm32 kernel and a wasm32 model in it, and gets timings measured in the tab.

Tabs are opened and closed through Chromium's DevTools HTTP endpoints (/json/new, /json/close), so closing one
is a real tab close: its WebSockets end, the relay closes its tracker connections and the device leaves the pool.
"""
from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse
from typing import Optional

import numpy as np
import pytest
from fixtures.children import stop_process
from fixtures.js_device import check_model_on
from fixtures.polling import wait_until
from fixtures.prereq import require_module, require_tool

from tether.rpc.tracker_client import connect_tracker

START_TIMEOUT = 30.0
TOKEN = "web-tök€n"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0"]


class WebTracker:
    """`rpc-tracker --web 0` (the tracker and its web relay in one process), stopped by its PID."""

    def __init__(self, workdir: str, token: Optional[str]):
        require_module("websockets")
        self.token = token
        stamp = time.monotonic_ns()
        self.port_file = os.path.join(workdir, "tracker-%d.port" % stamp)
        self.web_file = os.path.join(workdir, "web-%d.port" % stamp)
        self.log_path = os.path.join(workdir, "tracker-%d.log" % stamp)
        env = dict(os.environ)
        env.pop("TETHER_TRACKER_TOKEN", None)
        if token:
            env["TETHER_TRACKER_TOKEN"] = token
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "tether.cli.tracker", "--port", "0", "--ready-file",
                                      self.port_file, "--web", "0", "--web-ready-file", self.web_file, "-v"],
                                     stdout=self._log, stderr=subprocess.STDOUT, env=env)
        try:
            wait_until(lambda: os.path.exists(self.web_file) or self.proc.poll() is not None, START_TIMEOUT,
                       "rpc-tracker --web to listen")
            assert self.proc.poll() is None, "rpc-tracker --web exited:\n" + self.log()
        except BaseException:
            self.stop()
            raise
        self.port = int(open(self.port_file).read())
        self.web_port = int(open(self.web_file).read())

    def log(self) -> str:
        with open(self.log_path, "rb") as f:
            return f.read().decode(errors="replace")

    def client(self):
        return connect_tracker("127.0.0.1", self.port, token=self.token)

    def count(self, key: str, state: Optional[str] = None) -> int:
        with self.client() as c:
            return sum(1 for d in c.summary()["devices"] if d["key"] == key and (state is None or d["state"] == state))

    def page(self, key: str, token: Optional[str]) -> str:
        fragment = urllib.parse.urlencode([("key", key)] + ([("token", token)] if token else []))
        return "http://127.0.0.1:%d/js/web/device.html#%s" % (self.web_port, fragment)

    def stop(self) -> None:
        stop_process(self.proc)
        self._log.close()


class Chromium:
    """Headless Chromium with its DevTools HTTP endpoint on loopback; tabs opened and closed through it. It runs
    in a session of its own, so stopping it ends its helper processes (and only those) too."""

    def __init__(self, workdir: str):
        self.profile = tempfile.mkdtemp(prefix="chromium-", dir=workdir)
        self.log_path = os.path.join(workdir, "chromium-%d.log" % time.monotonic_ns())
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen([require_tool("chromium", "apt-get install chromium")] + CHROMIUM_FLAGS +
                                     ["--user-data-dir=" + self.profile, "about:blank"],
                                     stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        active = os.path.join(self.profile, "DevToolsActivePort")
        try:
            wait_until(lambda: os.path.exists(active) and open(active).read().strip() or self.proc.poll() is not None,
                       START_TIMEOUT, "Chromium's DevTools port")
            assert self.proc.poll() is None, "chromium exited:\n" + open(self.log_path, errors="replace").read()[-3000:]
        except BaseException:
            self.stop()
            raise
        self.port = int(open(active).read().split()[0])

    def _request(self, method: str, path: str) -> bytes:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            conn.request(method, path)
            resp = conn.getresponse()
            body = resp.read()
            assert resp.status == 200, (method, path, resp.status, body[:200])
            return body
        finally:
            conn.close()

    def open_tab(self, url: str) -> str:
        return json.loads(self._request("PUT", "/json/new?" + urllib.parse.quote(url, safe="")))["id"]

    def evaluate(self, tab: str, expression: str):
        """The value of a JavaScript expression in a tab (DevTools protocol, Runtime.evaluate)."""
        from websockets.sync.client import connect as ws_connect

        with ws_connect("ws://127.0.0.1:%d/devtools/page/%s" % (self.port, tab), open_timeout=10) as ws:
            ws.send(json.dumps({"id": 1, "method": "Runtime.evaluate",
                                "params": {"expression": expression, "returnByValue": True}}))
            for _ in range(100):
                reply = json.loads(ws.recv(timeout=10))
                if reply.get("id") == 1:
                    return reply["result"]["result"].get("value")
        raise AssertionError("no answer to Runtime.evaluate")

    def close_tab(self, tab: str) -> None:
        self._request("GET", "/json/close/" + tab)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)     # the group this test created for it (its own session)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(10)
        self._log.close()


@pytest.fixture
def web_lab():
    with tempfile.TemporaryDirectory(prefix="tether-browser-") as workdir:
        tracker = WebTracker(workdir, TOKEN)
        browser = None
        try:
            browser = Chromium(workdir)
            yield tracker, browser
        finally:
            if browser is not None:
                browser.stop()
            tracker.stop()


def wait_registered(tracker: WebTracker, key: str, n: int) -> None:
    try:
        wait_until(lambda: tracker.count(key) == n, START_TIMEOUT, "%d tab(s) registered as %r" % (n, key), step=0.1)
    except AssertionError:
        raise AssertionError("the pool did not reach %d %r device(s); tracker log:\n%s"
                             % (n, key, tracker.log()[-4000:]))


def test_a_tab_serves_kernels_and_a_model_and_a_second_tab_takes_over(web_lab, vadd_wasm, wasm_model):
    tracker, browser = web_lab
    first = browser.open_tab(tracker.page("browser", TOKEN))
    wait_registered(tracker, "browser", 1)
    # the page shows its state, and has taken the token out of its address
    assert browser.evaluate(first, "document.getElementById('state').textContent") == "registered"
    assert browser.evaluate(first, "location.hash") == "#key=browser"
    with tracker.client() as client:
        (dev,) = [d for d in client.summary()["devices"] if d["key"] == "browser"]
        assert dev["reverse"] and dev["tags"]["arch"] == "wasm32" and dev["tags"]["os"] == "browser"
        samples = []
        with client.request("browser", wait_timeout=60, on_sample=lambda i, s: samples.append((i, s))) as remote:
            info = remote.device_info()
            assert info["runtime"] == "browser" and "Chrome" in info["user_agent"]
            # the relay serves the page cross-origin isolated, so the tab's clock is fine-grained
            assert info["cross_origin_isolated"] is True and 0 < info["timer_resolution_s"] <= 2e-5
            assert remote._call("tether.echo", [2.0])["value"] == 2.0
            assert type(remote._call("tether.echo", [2.0])["value"]) is float
            remote.upload(str(vadd_wasm), "vadd.wasm")
            f = remote.load_module("vadd.wasm").get_function("vadd")
            rng = np.random.default_rng(1)
            a, b = rng.standard_normal(1024).astype(np.float32), rng.standard_normal(1024).astype(np.float32)
            A, B, C = remote.array(a), remote.array(b), remote.empty(1024, "float32")
            f(A, B, C)
            np.testing.assert_allclose(C.numpy(), a + b, rtol=1e-6)
            res = f.time_evaluator(number=50, repeat=3, min_repeat_ms=2)(A, B, C)
            assert [i for i, _ in samples] == [0, 1, 2] and [s for _, s in samples] == list(res.samples)
            assert all(s > 0 for s in res.samples)
            check_model_on(remote, wasm_model)
        wait_until(lambda: tracker.count("browser", "free") == 1, START_TIMEOUT, "the tab to be free again")
        wait_until(lambda: browser.evaluate(first, "[window.tetherDevice.state, window.tetherDevice.sessions]")
                   == ["registered", 1], START_TIMEOUT, "the page to show the session served")

        # closing the tab takes the device out of the pool; a second tab takes the next request
        browser.close_tab(first)
        wait_registered(tracker, "browser", 0)
        browser.open_tab(tracker.page("browser", TOKEN))
        wait_registered(tracker, "browser", 1)
        with client.request("browser", wait_timeout=60) as remote:
            assert remote._call("tether.echo", ["second tab"])["value"] == "second tab"


def test_a_tab_with_the_wrong_token_never_registers(web_lab):
    tracker, browser = web_lab
    browser.open_tab(tracker.page("intruder", "wrong"))
    good = browser.open_tab(tracker.page("good", TOKEN))
    wait_registered(tracker, "good", 1)           # by then the wrong one has had its answer too
    wait_until(lambda: "AuthenticationError" in tracker.log() or "authentic" in tracker.log().lower(),
               START_TIMEOUT, "the tracker to refuse the wrong token")
    assert tracker.count("intruder") == 0
    browser.close_tab(good)


def test_relay_refuses_foreign_origins_and_serves_only_the_page(web_lab):
    tracker, _ = web_lab

    def get(path: str, headers: dict) -> int:
        conn = http.client.HTTPConnection("127.0.0.1", tracker.web_port, timeout=10)
        try:
            conn.request("GET", path, headers=headers)
            return conn.getresponse().status
        finally:
            conn.close()

    upgrade = {"Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Version": "13",
               "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="}
    assert get("/tracker", dict(upgrade, Origin="http://evil.example")) == 403
    assert get("/tracker", dict(upgrade, Origin="http://127.0.0.1:%d" % tracker.web_port)) == 101
    assert get("/js/web/device.html", {}) == 200
    assert get("/js/src/session.js", {}) == 200
    for path in ("/js/src/..%2f..%2fserver.js", "/js/test/vectors.mjs", "/etc/passwd", "/js/src/.hidden.js"):
        assert get(path, {}) == 404, path


def test_web_relay_beyond_loopback_needs_a_token():
    out = subprocess.run([sys.executable, "-m", "tether.cli.tracker", "--port", "0", "--web", "0", "--web-host",
                          "0.0.0.0"], capture_output=True, text=True, timeout=60,
                         env={k: v for k, v in os.environ.items() if k != "TETHER_TRACKER_TOKEN"})
    assert out.returncode != 0 and "without --token" in out.stderr and "Traceback" not in out.stderr


def test_relay_message_bytes_pass_through_unchanged(web_lab):
    """The bridge is byte-transparent: a tracker HELLO split across WebSocket messages gets the tracker's answer."""
    websockets = require_module("websockets")
    from websockets.sync.client import connect as ws_connect

    from tether_rpc import protocol as p
    from tether_rpc.tracker_protocol import TrackerMsg, hello_payload
    tracker, _ = web_lab
    frame = p.encode_frame(TrackerMsg.HELLO, 0, hello_payload("client", "split"))
    with ws_connect("ws://127.0.0.1:%d/tracker" % tracker.web_port, open_timeout=10) as ws:
        ws.send(frame[:3])
        ws.send(frame[3:])
        buf = p.FrameBuffer()
        deadline = time.monotonic() + 10
        got = None
        while got is None and time.monotonic() < deadline:
            buf.feed(ws.recv(timeout=10))
            got = buf.next_frame()
        assert got is not None and got[0] == TrackerMsg.CHALLENGE       # the tracker has a token: it challenges
        ws.send("text is refused")
        with pytest.raises(websockets.exceptions.ConnectionClosed):
            for _ in range(10):
                ws.recv(timeout=10)
