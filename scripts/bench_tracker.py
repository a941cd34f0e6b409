#!/usr/bin/env python
"""Benchmark the tracker on loopback, with baselines measured in the same run. Prints medians and ratios.

    python scripts/bench_tracker.py [--quick] [--json]

1. session open through the tracker (request -> usable RemoteSession) vs a direct rpc.connect to a device
   that is not registered anywhere, and vs one tracker round trip (summary of an empty-ish tracker);
2. handoff gap: client A closes its session, client B (already queued) gets its session: time between the two;
3. reverse-mode relay vs direct: small-call RTT and a 64 MB float32 copy each way (plus raw socket echo RTT);
4. scale: 1,000 simulated devices and 10,000 queued requests against one tracker process: summary latency
   and grant throughput (grant -> device acknowledges -> session start -> re-register -> next grant).

Everything runs as real processes on 127.0.0.1 (tracker: `python -m tether.cli.tracker`; devices:
`python -m tether_rpc`); the simulated devices of part 4 speak the real tracker protocol over real sockets.
"""
from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import pathlib
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Dict, List, Optional

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from fixtures import polling  # noqa: E402
from tether import rpc  # noqa: E402
from tether.rpc.tracker_client import connect_tracker  # noqa: E402
from tether_rpc import protocol as p  # noqa: E402
from tether_rpc.tracker_protocol import TrackerMsg, hello_payload  # noqa: E402

# Poll fast: a slow poll would add its step to the setup between timed rounds.
wait_until = functools.partial(polling.wait_until, step=0.002)


class Procs:
    def __init__(self, workdir: str):
        self.workdir = workdir
        self.procs: List[subprocess.Popen] = []

    def start(self, args: List[str], log: str) -> subprocess.Popen:
        f = open(os.path.join(self.workdir, log), "wb")
        proc = subprocess.Popen([sys.executable] + args, stdout=f, stderr=subprocess.STDOUT)
        self.procs.append(proc)
        return proc

    def tracker(self) -> int:
        ready = os.path.join(self.workdir, "tracker-%d.port" % time.monotonic_ns())
        self.start(["-m", "tether.cli.tracker", "--port", "0", "--ready-file", ready], os.path.basename(ready) + ".log")
        wait_until(lambda: os.path.exists(ready), 15, "the tracker")
        with open(ready) as f:
            return int(f.read())

    def device(self, tracker_port: Optional[int], key: str = "", reverse: bool = False) -> int:
        """Start a device server; returns its listening port (parsed from its log)."""
        log = "device-%d.log" % len(self.procs)
        args = ["-m", "tether_rpc", "--port", "0", "--workdir", self.workdir]
        if tracker_port:
            args += ["--tracker", "127.0.0.1:%d" % tracker_port, "--key", key]
        if reverse:
            args.append("--reverse")
        self.start(args, log)
        path = os.path.join(self.workdir, log)

        def port() -> Optional[int]:
            with open(path, "rb") as f:
                text = f.read().decode(errors="replace")
            marker = "listening on 127.0.0.1:"
            if marker in text:
                return int(text.split(marker, 1)[1].split()[0])
            return None

        return wait_until(port, 15, "device " + key)

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


def median_ms(xs: List[float]) -> float:
    return 1000 * statistics.median(xs)


def device_state(tracker: Any, key: str) -> str:
    return next((d["state"] for d in tracker.summary()["devices"] if d["key"] == key), "")


# ---------------------------------------------------------------------------------------------------- 1 and 2

def bench_open(tport: int, direct_port: int, n: int) -> Dict[str, float]:
    opens, directs, rtts = [], [], []
    with connect_tracker("127.0.0.1", tport) as t:
        for _ in range(n):
            t0 = time.perf_counter()
            t.summary()
            rtts.append(time.perf_counter() - t0)
        for _ in range(n):
            wait_until(lambda: device_state(t, "bench") == "free", 5, "bench device free")
            time.sleep(0.06)      # same idle pause as the direct opens below: both measure an idle device
            t0 = time.perf_counter()
            s = t.request("bench", wait_timeout=10)
            opens.append(time.perf_counter() - t0)
            s.close()
    for _ in range(n):
        t0 = time.perf_counter()
        s = rpc.connect("127.0.0.1", direct_port)
        directs.append(time.perf_counter() - t0)
        s.close()
        time.sleep(0.06)      # let the unregistered server reap its worker (its loop tick) before the next open
    return {"tracker_rtt_ms": median_ms(rtts), "open_via_tracker_ms": median_ms(opens),
            "open_direct_ms": median_ms(directs)}


def bench_handoff(tport: int, n: int) -> Dict[str, float]:
    gaps = []
    with connect_tracker("127.0.0.1", tport) as a, connect_tracker("127.0.0.1", tport) as b:
        for _ in range(n):
            wait_until(lambda: device_state(a, "bench") == "free", 5, "bench device free")
            held = a.request("bench", wait_timeout=10)
            got: Dict[str, float] = {}
            queued = threading.Event()

            def waiter() -> None:
                s = b.request("bench", wait_timeout=10, on_queued=lambda info: queued.set())
                got["t"] = time.perf_counter()
                s.close()

            th = threading.Thread(target=waiter)
            th.start()
            queued.wait(5)
            t0 = time.perf_counter()
            held.close()
            th.join(10)
            gaps.append(got["t"] - t0)
    return {"handoff_ms": median_ms(gaps), "handoff_max_ms": 1000 * max(gaps)}


def bench_startup(procs: "Procs", tport: int, n: int) -> Dict[str, float]:
    """Device server process start -> visible in the tracker's summary (python start-up and imports included)."""
    xs = []
    with connect_tracker("127.0.0.1", tport) as t:
        for i in range(n):
            key = "startup%d" % i
            t0 = time.perf_counter()
            procs.start(["-m", "tether_rpc", "--port", "0", "--tracker", "127.0.0.1:%d" % tport, "--key", key],
                        key + ".log")
            wait_until(lambda: any(d["key"] == key for d in t.summary()["devices"]), 15, key)
            xs.append(time.perf_counter() - t0)
    return {"start_to_registered_ms": median_ms(xs)}


# ---------------------------------------------------------------------------------------------------- 3

def raw_echo_rtt(n: int) -> float:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)

    def serve() -> None:
        c, _ = srv.accept()
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        while True:
            d = c.recv(64)
            if not d:
                break
            c.sendall(d)
        c.close()

    th = threading.Thread(target=serve, daemon=True)
    th.start()
    c = socket.create_connection(srv.getsockname())
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    xs = []
    for _ in range(n):
        t0 = time.perf_counter()
        c.sendall(b"12345678")
        c.recv(64)
        xs.append(time.perf_counter() - t0)
    c.close()
    th.join(2)
    srv.close()
    return statistics.median(xs)


def session_figures(s: Any, calls: int, mb: int, reps: int) -> Dict[str, float]:
    echo = s.get_function("tether.echo")
    for _ in range(50):
        echo(1)
    xs = []
    for _ in range(calls):
        t0 = time.perf_counter()
        echo(1)
        xs.append(time.perf_counter() - t0)
    a = np.random.default_rng(0).standard_normal(mb * (1 << 20) // 4).astype(np.float32)
    r = s.empty(a.shape, "float32")
    ups, downs = [], []
    out = np.empty_like(a)
    for _ in range(reps):
        t0 = time.perf_counter()
        r.copyfrom(a)
        ups.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        r.copyto(out)
        downs.append(time.perf_counter() - t0)
    assert np.array_equal(out, a), "copy through the session corrupted data"
    nbytes = a.nbytes
    return {"rtt_us": 1e6 * statistics.median(xs), "up_MBps": nbytes / statistics.median(ups) / 1e6,
            "down_MBps": nbytes / statistics.median(downs) / 1e6}


def bench_relay(tport: int, calls: int, mb: int, reps: int) -> Dict[str, Any]:
    out: Dict[str, Any] = {"raw_socket_echo_us": 1e6 * raw_echo_rtt(calls)}
    with connect_tracker("127.0.0.1", tport) as t:
        for name, key in (("direct", "bench"), ("relay", "bench-rev")):
            wait_until(lambda: device_state(t, key) == "free", 10, key + " free")
            with t.request(key, wait_timeout=10) as s:
                out[name] = session_figures(s, calls, mb, reps)
    d, r = out["direct"], out["relay"]
    out["relay_over_direct"] = {"rtt": r["rtt_us"] / d["rtt_us"], "up": r["up_MBps"] / d["up_MBps"],
                                "down": r["down_MBps"] / d["down_MBps"]}
    return out


# ---------------------------------------------------------------------------------------------------- 4

class Frames:
    """Minimal asyncio framing for the simulated peers (same encode_frame / decode_body as everyone)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader, self.writer = reader, writer

    async def read(self) -> Any:
        hdr = await self.reader.readexactly(4)
        body = await self.reader.readexactly(p.HEADER.unpack(hdr)[0])
        return p.decode_body(body)

    def send(self, t: int, rid: int = 0, payload: Optional[dict] = None) -> None:
        if not self.writer.is_closing():
            self.writer.write(p.encode_frame(t, rid, payload))


async def _open(port: int, role: str, name: str) -> Frames:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    f = Frames(reader, writer)
    f.send(TrackerMsg.HELLO, 0, hello_payload(role, name))
    t, _, _ = await f.read()
    if t != TrackerMsg.WELCOME:
        raise RuntimeError("tracker refused a simulated peer: %d" % t)
    return f


async def _sim_device(port: int, i: int, release: asyncio.Event, stop: asyncio.Event) -> None:
    f = await _open(port, "device", "sim%d" % i)
    reg = {"key": "sim", "port": 20000 + i, "host": "127.0.0.%d" % (1 + i // 250), "tags": {"rack": str(i % 10)},
           "info": {"arch": "aarch64"}, "reverse": False, "state": "free"}
    f.send(TrackerMsg.REGISTER, 0, reg)

    async def beat() -> None:
        while not stop.is_set() and not f.writer.is_closing():
            await asyncio.sleep(1.0)
            f.send(TrackerMsg.HEARTBEAT)

    hb = asyncio.ensure_future(beat())
    try:
        while not stop.is_set():
            t, _, payload = await f.read()
            if t == TrackerMsg.EXPECT:
                f.send(TrackerMsg.EXPECTED, 0, {"match": payload["match"]})
                f.send(TrackerMsg.SESSION, 0, {"state": "started", "match": payload["match"]})
                if not release.is_set():
                    await release.wait()
                f.send(TrackerMsg.REGISTER, 0, reg)      # session over: re-register
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        hb.cancel()
        f.writer.close()


async def _sim_client(port: int, i: int, n: int, granted: List[int], queued: List[int]) -> Frames:
    f = await _open(port, "client", "simclient%d" % i)
    for k in range(n):
        f.send(TrackerMsg.REQUEST, k + 1, {"key": "sim", "priority": k % 3, "wait_timeout": 600,
                                           "session_timeout": 60})
    return f


async def _client_reader(f: Frames, counts: Dict[str, int], done: asyncio.Event, target: int) -> None:
    try:
        while True:
            t, _, _ = await f.read()
            if t == TrackerMsg.GRANT:
                counts["granted"] += 1
                if counts["granted"] >= target:
                    done.set()
            elif t == TrackerMsg.QUEUED:
                counts["queued"] += 1
    except (asyncio.IncompleteReadError, ConnectionError):
        pass


async def _scale(port: int, n_dev: int, n_req: int) -> Dict[str, float]:
    release, stop = asyncio.Event(), asyncio.Event()
    t0 = time.perf_counter()
    devs = [asyncio.ensure_future(_sim_device(port, i, release, stop)) for i in range(n_dev)]
    probe = await _open(port, "client", "probe")

    async def summary() -> dict:
        probe.send(TrackerMsg.SUMMARY, 1)
        while True:
            t, _, payload = await probe.read()
            if t == TrackerMsg.SUMMARY_REPLY:
                return payload

    while len((await summary())["devices"]) < n_dev:
        await asyncio.sleep(0.01)
    register_s = time.perf_counter() - t0
    counts = {"granted": 0, "queued": 0}
    # phase 1: occupy every device
    busy_done = asyncio.Event()
    occupier = await _sim_client(port, 0, n_dev, [], [])
    r1 = asyncio.ensure_future(_client_reader(occupier, counts, busy_done, n_dev))
    await asyncio.wait_for(busy_done.wait(), 60)
    # phase 2: queue n_req requests over 50 connections
    counts2 = {"granted": 0, "queued": 0}
    all_done = asyncio.Event()
    clients = [await _sim_client(port, 1 + c, n_req // 50, [], []) for c in range(50)]
    readers = [asyncio.ensure_future(_client_reader(c, counts2, all_done, n_req)) for c in clients]
    while counts2["queued"] < n_req:
        await asyncio.sleep(0.01)
    lat = []
    for _ in range(10):
        t1 = time.perf_counter()
        s = await summary()
        lat.append(time.perf_counter() - t1)
    pending = s["queues"]["sim"]["pending"]
    # phase 3: release; every device cycles through the queue
    t2 = time.perf_counter()
    release.set()
    await asyncio.wait_for(all_done.wait(), 300)
    grant_s = time.perf_counter() - t2
    stop.set()
    for f in clients + [occupier, probe]:
        f.writer.close()
    for task in readers + [r1] + devs:
        task.cancel()
    await asyncio.gather(*readers, r1, *devs, return_exceptions=True)
    return {"devices": n_dev, "queued": pending, "register_all_s": register_s,
            "summary_ms_median": median_ms(lat), "summary_devices": len(s["devices"]),
            "grants": n_req, "grant_throughput_per_s": n_req / grant_s}


def bench_scale(port: int, n_dev: int, n_req: int) -> Dict[str, float]:
    return asyncio.run(_scale(port, n_dev, n_req))


# ---------------------------------------------------------------------------------------------------- main

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer repetitions, 8 MB copies, 200 devices / 2000 requests")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    n = 10 if args.quick else 30
    mb = 8 if args.quick else 64
    results: Dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="tether-bench-tracker-") as workdir:
        procs = Procs(workdir)
        try:
            tport = procs.tracker()
            procs.device(tport, "bench")
            procs.device(tport, "bench-rev", reverse=True)
            direct_port = procs.device(None)
            with connect_tracker("127.0.0.1", tport) as t:
                wait_until(lambda: len(t.summary()["devices"]) == 2, 15, "two registered devices")
            results["open"] = bench_open(tport, direct_port, n)
            results["handoff"] = bench_handoff(tport, n)
            results["relay"] = bench_relay(tport, 500 if args.quick else 2000, mb, 3 if args.quick else 5)
            results["startup"] = bench_startup(procs, tport, 3 if args.quick else 5)
        finally:
            procs.close()
        # a fresh tracker process for the scale test, so the figures do not include the devices above
        procs = Procs(workdir)
        try:
            sport = procs.tracker()
            results["scale"] = bench_scale(sport, 200 if args.quick else 1000, 2000 if args.quick else 10000)
        finally:
            procs.close()
    if args.json:
        print(json.dumps(results, indent=2))
        return
    o, h, r, s = results["open"], results["handoff"], results["relay"], results["scale"]
    print("tracker round trip (summary)       %8.3f ms" % o["tracker_rtt_ms"])
    print("session open, direct rpc.connect   %8.3f ms" % o["open_direct_ms"])
    print("session open through the tracker   %8.3f ms   (%.2fx direct; goal <= 10 ms, TVM 92 ms)"
          % (o["open_via_tracker_ms"], o["open_via_tracker_ms"] / o["open_direct_ms"]))
    print("handoff gap between sessions       %8.3f ms   (max %.1f ms; goal <= 20 ms, TVM 60-150 ms)"
          % (h["handoff_ms"], h["handoff_max_ms"]))
    print("device start -> registered         %8.1f ms   (goal <= 500 ms, TVM 2.3 s)"
          % results["startup"]["start_to_registered_ms"])
    print("raw socket echo RTT                %8.1f us" % r["raw_socket_echo_us"])
    for name in ("direct", "relay"):
        x = r[name]
        print("%-6s call RTT %8.1f us   %d MB up %7.0f MB/s   down %7.0f MB/s"
              % (name, x["rtt_us"], mb, x["up_MBps"], x["down_MBps"]))
    q = r["relay_over_direct"]
    print("relay / direct: RTT %.2fx, upload %.2fx, download %.2fx of direct throughput"
          % (q["rtt"], q["up"], q["down"]))
    print("scale: %d devices registered in %.2f s; %d queued requests; summary %.1f ms (%d devices); "
          "%.0f grants/s" % (s["devices"], s["register_all_s"], s["queued"], s["summary_ms_median"],
                             s["summary_devices"], s["grant_throughput_per_s"]))


if __name__ == "__main__":
    main()
