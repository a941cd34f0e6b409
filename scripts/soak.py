#!/usr/bin/env python3
"""Soak test: random clients work a tracker with two device servers for a while; nothing may grow or leak.

    scripts/soak.py [--minutes 10] [--clients 3] [--seed 1] [--json report.json]

Everything runs on loopback, as child processes of this script (stopped by PID at the end). Each client thread
loops over random actions, every session requested through the tracker:

* ``call``: upload vadd.so, load it, call it on random arrays and compare with numpy;
* ``stream``: time vadd with time_evaluator, checking the streamed samples against the RETURN;
* ``crash``: call a kernel that segfaults (the client must get SessionCrashed);
* ``close_mid_call`` / ``drop_mid_call``: start a kernel that spins for minutes, then send CLOSE (or drop the
  connection) while it runs; the device must be free again within a second;
* ``hold``: keep a session for up to a second of small calls.

After a warm-up round of every action the script records a baseline (each fd count the lowest of a second of
reads, so a connection closing at that moment does not count); at the end (clients stopped, the tracker
idle again) it checks that open fds and child processes are back to the baseline, that every session folder is
gone, that the tracker's summary is idle (both devices free, nobody waiting), and that each server's RSS is
within 10% of its baseline. It prints the figures and exits 1 on a leak or on any unexpected error.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import random
import socket
import sys
import tempfile
import threading
import time
from typing import Any, Callable, Dict, List, Optional

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "rpc_server"))
sys.path.insert(0, str(ROOT / "tests"))

from fixtures.polling import wait_until  # noqa: E402
from fixtures.rpc import EXTRA_KERNELS  # noqa: E402  (the crash/spin/nop kernels the RPC tests use)
from kernels import GCC_FLAGS, KERNEL_DIR, build_kernel  # noqa: E402
from tether.launch import start_rpc_server, start_tracker  # noqa: E402
from tether.rpc import connect_tracker  # noqa: E402
from tether_rpc import protocol as p  # noqa: E402
from tether_rpc.errors import ConnectionClosed, SessionCrashed  # noqa: E402

KEY = "soak"
N = 1024  # vadd's array length
RSS_SLACK = 0.10
SETTLE_S = 10.0  # how long fds may take to return to the baseline once the lab is idle
BASELINE_SAMPLES = 10  # fd counts read 0.1 s apart for the baseline, the lowest kept


# -- process figures (Linux /proc) ------------------------------------------------------------------------------
def fd_count(pid: int) -> int:
    return len(os.listdir("/proc/%d/fd" % pid))


def rss_kib(pid: int) -> int:
    with open("/proc/%d/status" % pid) as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def children(pid: int) -> List[int]:
    try:
        with open("/proc/%d/task/%d/children" % (pid, pid)) as fh:
            return [int(x) for x in fh.read().split()]
    except OSError:
        return []


# -- the lab --------------------------------------------------------------------------------------------------
class Lab:
    """A tracker and two device servers registered under KEY, with the kernels built."""

    def __init__(self, folder: pathlib.Path):
        self.folder = folder
        self.vadd = build_kernel("vadd", folder)
        self.misc = self._build_misc()
        self.tracker = start_tracker("--host", "127.0.0.1", "--port", "0", log_path=folder / "tracker.log")
        self.servers = []
        self.workdirs = []
        for i in range(2):
            workdir = folder / ("sessions-%d" % i)
            workdir.mkdir()
            self.workdirs.append(workdir)
            self.servers.append(start_rpc_server("--host", "127.0.0.1", "--port", "0", "--workdir", str(workdir),
                                                 "--tracker", self.tracker.address, "--key", KEY,
                                                 log_path=folder / ("server-%d.log" % i)))
        host, port = self.tracker.address.rsplit(":", 1)
        self.tracker_host, self.tracker_port = host, int(port)
        with self.client() as t:
            wait_until(lambda: t.summary()["queues"].get(KEY, {}).get("free") == 2, 30, "both servers to register")

    def _build_misc(self) -> pathlib.Path:
        import shutil
        import subprocess

        src = self.folder / "misc.c"
        src.write_text(EXTRA_KERNELS)
        out = self.folder / "misc.so"
        cmd = [shutil.which("gcc") or "gcc", *GCC_FLAGS, "-I", str(KERNEL_DIR), str(src), "-o", str(out),
               "-Wl,-soname,misc.so", "-Wl,--hash-style=both", "-Wl,--no-undefined"]
        subprocess.run(cmd, check=True, capture_output=True, timeout=60)
        return out

    def client(self):
        return connect_tracker(self.tracker_host, self.tracker_port, timeout=30)

    def pids(self) -> Dict[str, int]:
        out = {"tracker": self.tracker.proc.pid}
        out.update({"server%d" % i: s.proc.pid for i, s in enumerate(self.servers)})
        return out

    def idle(self) -> bool:
        with self.client() as t:
            summary = t.summary()
        queue = summary["queues"].get(KEY, {})
        return (queue == {"total": 2, "free": 2, "pending": 0}
                and not any(children(s.proc.pid) for s in self.servers)
                and not any(os.listdir(w) for w in self.workdirs))

    def figures(self) -> Dict[str, Any]:
        pids = self.pids()
        return {"fds": {name: fd_count(pid) for name, pid in pids.items()},
                "rss_kib": {name: rss_kib(pid) for name, pid in pids.items()},
                "children": {name: len(children(pid)) for name, pid in pids.items()},
                "session_folders": sum(len(os.listdir(w)) for w in self.workdirs),
                "own_fds": fd_count(os.getpid())}

    def settled_figures(self) -> Dict[str, Any]:
        """figures() with every fd count at its lowest of BASELINE_SAMPLES reads: a connection still closing (the
        idle check's own tracker connection, a client's just dropped one) adds fds for a moment, never removes one,
        so a baseline read in such a moment would be too high and hide a leak, or fail an exact comparison."""
        out = self.figures()
        for _ in range(BASELINE_SAMPLES - 1):
            time.sleep(0.1)
            again = self.figures()
            out["fds"] = {name: min(n, again["fds"][name]) for name, n in out["fds"].items()}
            out["own_fds"] = min(out["own_fds"], again["own_fds"])
        return out

    def close(self) -> None:
        for s in self.servers:
            s.stop()
        self.tracker.stop()


# -- the actions ----------------------------------------------------------------------------------------------
def _session(lab: Lab, tracker: Any, **options: Any):
    return tracker.request(KEY, wait_timeout=60, session_timeout=120, **options)


def act_call(lab: Lab, tracker: Any, rng: random.Random) -> None:
    with _session(lab, tracker) as remote:
        remote.upload(lab.vadd)
        f = remote.load_module("vadd.so")["vadd"]
        a = np.asarray([rng.random() for _ in range(N)], "float32")
        b = np.asarray([rng.random() for _ in range(N)], "float32")
        A, B, C = remote.array(a), remote.array(b), remote.empty((N,), "float32")
        f(A, B, C)
        if not np.array_equal(C.numpy(), a + b):
            raise AssertionError("vadd on the device disagrees with numpy")


def act_stream(lab: Lab, tracker: Any, rng: random.Random) -> None:
    samples: List[float] = []
    with _session(lab, tracker, on_sample=lambda i, s: samples.append(s)) as remote:
        remote.upload(lab.vadd)
        f = remote.load_module("vadd.so")["vadd"]
        A, B, C = (remote.empty((N,), "float32") for _ in range(3))
        repeat = rng.randint(2, 6)
        res = f.time_evaluator(number=rng.randint(1, 50), repeat=repeat)(A, B, C)
        if list(res.samples) != samples or len(samples) != repeat:
            raise AssertionError("streamed samples %s differ from the RETURN's %s" % (samples, res.samples))


def act_crash(lab: Lab, tracker: Any, rng: random.Random) -> None:
    with _session(lab, tracker) as remote:
        remote.upload(lab.misc)
        crash = remote.load_module("misc.so")["crash"]
        try:
            crash()
        except SessionCrashed:
            return
        raise AssertionError("a segfaulting kernel did not end its session with SessionCrashed")


def _mid_call(lab: Lab, tracker: Any, rng: random.Random, send_close: bool) -> None:
    remote = _session(lab, tracker)
    try:
        remote.upload(lab.misc)
        spin = remote.load_module("misc.so")["spin"]
        outcome: Dict[str, BaseException] = {}

        def run() -> None:
            try:
                spin(1 << 40)  # minutes of work
            except BaseException as exc:  # the outcome is checked below
                outcome["exc"] = exc
        caller = threading.Thread(target=run, daemon=True)
        caller.start()
        time.sleep(rng.uniform(0.05, 0.3))
        t0 = time.monotonic()
        if send_close:
            remote.sock.sendall(p.encode_frame(p.MsgType.CLOSE, 0, {"reason": "soak"}))
        else:
            remote.sock.shutdown(socket.SHUT_RDWR)
        caller.join(10)
        if caller.is_alive() or not isinstance(outcome.get("exc"), ConnectionClosed):
            raise AssertionError("the call did not end with ConnectionClosed after %s: %r"
                                 % ("CLOSE" if send_close else "the drop", outcome.get("exc")))
        if time.monotonic() - t0 > 2:
            raise AssertionError("the device took %.1f s to end the session" % (time.monotonic() - t0))
    finally:
        remote.close()


def act_close_mid_call(lab: Lab, tracker: Any, rng: random.Random) -> None:
    _mid_call(lab, tracker, rng, send_close=True)


def act_drop_mid_call(lab: Lab, tracker: Any, rng: random.Random) -> None:
    _mid_call(lab, tracker, rng, send_close=False)


def act_hold(lab: Lab, tracker: Any, rng: random.Random) -> None:
    with _session(lab, tracker) as remote:
        echo = remote.get_function("tether.echo")
        until = time.monotonic() + rng.uniform(0.1, 1.0)
        i = 0
        while time.monotonic() < until and i < 10000:
            if echo(i) != i:
                raise AssertionError("echo returned another value")
            i += 1


ACTIONS: Dict[str, Callable[[Lab, Any, random.Random], None]] = {
    "call": act_call, "stream": act_stream, "crash": act_crash, "close_mid_call": act_close_mid_call,
    "drop_mid_call": act_drop_mid_call, "hold": act_hold}


# -- the run --------------------------------------------------------------------------------------------------
def client_loop(lab: Lab, seed: int, until: float, counts: Dict[str, int], errors: List[str],
                lock: threading.Lock) -> None:
    rng = random.Random(seed)
    names = sorted(ACTIONS)
    with lab.client() as tracker:
        while time.monotonic() < until:
            name = rng.choice(names)
            try:
                ACTIONS[name](lab, tracker, rng)
            except Exception as exc:  # recorded: any unexpected error fails the soak
                with lock:
                    errors.append("%s: %s: %s" % (name, type(exc).__name__, exc))
            else:
                with lock:
                    counts[name] = counts.get(name, 0) + 1


def soak(minutes: float, clients: int, seed: int) -> Dict[str, Any]:
    folder = pathlib.Path(tempfile.mkdtemp(prefix="tether-soak-"))
    lab = Lab(folder)
    report: Dict[str, Any] = {"minutes": minutes, "clients": clients, "seed": seed, "folder": str(folder)}
    try:
        rng = random.Random(seed)
        with lab.client() as tracker:  # warm-up: every action once, so imports and caches settle
            for name in sorted(ACTIONS):
                ACTIONS[name](lab, tracker, rng)
        wait_until(lab.idle, 15, "the lab to be idle after the warm-up")
        baseline = lab.settled_figures()
        counts: Dict[str, int] = {}
        errors: List[str] = []
        lock = threading.Lock()
        t0 = time.monotonic()
        until = t0 + minutes * 60
        threads = [threading.Thread(target=client_loop, args=(lab, seed * 1000 + i, until, counts, errors, lock),
                                    name="soak-client-%d" % i) for i in range(clients)]
        for th in threads:
            th.start()
        rss_max = dict(baseline["rss_kib"])
        while any(th.is_alive() for th in threads):
            for name, pid in lab.pids().items():
                rss_max[name] = max(rss_max[name], rss_kib(pid))
            for th in threads:
                th.join(timeout=1.0)
            if time.monotonic() > until + 300:
                errors.append("client threads still running 5 minutes after the end")
                break
        elapsed = time.monotonic() - t0
        idle = True
        try:
            wait_until(lab.idle, 15, "the lab to be idle after the run")
        except AssertionError as exc:  # (what wait_until raises when time runs out)
            idle = False
            errors.append(str(exc))
        # A connection a client dropped a moment ago may still be closing on the other side: give every process
        # a few seconds to get back to its baseline, so that what is left over is a leak, not a close in flight.
        settle_until = time.monotonic() + SETTLE_S
        final = lab.figures()
        while time.monotonic() < settle_until and any(
                n > baseline["fds"][name] for name, n in final["fds"].items()):
            time.sleep(0.2)
            final = lab.figures()
        leaks = []
        for name, n in final["fds"].items():
            if n > baseline["fds"][name]:
                leaks.append("%s has %d open fds, %d at the baseline" % (name, n, baseline["fds"][name]))
        if final["own_fds"] > baseline["own_fds"]:
            leaks.append("the soak process has %d open fds, %d at the baseline" % (final["own_fds"],
                                                                                baseline["own_fds"]))
        for name, n in final["children"].items():
            if n:
                leaks.append("%s still has %d child processes" % (name, n))
        if final["session_folders"]:
            leaks.append("%d session folders left" % final["session_folders"])
        for name, kib in final["rss_kib"].items():
            if name.startswith("server") and kib > baseline["rss_kib"][name] * (1 + RSS_SLACK):
                leaks.append("%s RSS grew from %d to %d KiB" % (name, baseline["rss_kib"][name], kib))
        report.update(baseline=baseline, final=final, rss_max_kib=rss_max, actions=counts,
                      sessions=sum(counts.values()), seconds=round(elapsed, 1), idle=idle, errors=errors,
                      leaks=leaks, ok=not errors and not leaks and idle)
    finally:
        lab.close()
    if report.get("ok"):
        import shutil
        shutil.rmtree(folder, ignore_errors=True)
    return report


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--clients", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", type=pathlib.Path, help="write the report here")
    args = parser.parse_args(argv)
    if not 0 < args.minutes <= 24 * 60 or not 1 <= args.clients <= 16:
        parser.error("--minutes must lie in (0, 1440] and --clients in [1, 16]")
    report = soak(args.minutes, args.clients, args.seed)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    print("soak: %d sessions in %.0f s (%s)" % (report["sessions"], report["seconds"],
                                                ", ".join("%s %d" % kv for kv in sorted(report["actions"].items()))))
    for what in ("fds", "rss_kib", "children"):
        print("  %-9s baseline %s -> final %s" % (what, report["baseline"][what], report["final"][what]))
    print("  rss max   %s; session folders left %d; tracker idle: %s"
          % (report["rss_max_kib"], report["final"]["session_folders"], report["idle"]))
    for line in report["errors"] + report["leaks"]:
        print("  FAIL " + line)
    print("soak: %s" % ("OK" if report["ok"] else "FAILED (logs in %s)" % report["folder"]))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
