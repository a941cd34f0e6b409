"""A browser tab as a tether device: headless Chromium opens the device page that `rpc-tracker --web` serves, the
tab registers with that real tracker (through the WebSocket relay, in reverse mode) and a Python client requests
it by key, runs a wasm32 kernel and a wasm32 model in it, and gets timings measured in the tab.

The tracker, Chromium and the web_lab fixture are in tests/fixtures/web_device.py.
"""
from __future__ import annotations

import http.client
import os
import subprocess
import sys
import time

import numpy as np
import pytest
from fixtures.web_device import START_TIMEOUT, TOKEN, wait_registered
from fixtures.js_device import check_model_on
from fixtures.polling import wait_until
from fixtures.prereq import require_module


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
