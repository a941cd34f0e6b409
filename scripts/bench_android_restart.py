#!/usr/bin/env python
"""How long the app's device process takes from process start to a device a client can use, on a desktop JVM.

    python scripts/bench_android_restart.py [--repeat N]

After a crash the watchdog starts the ":device" process again; what the client then waits for is the process's
start plus DeviceSupervisor starting the device server. This runs that same code (SupervisorRunner: Settings ->
DeviceSupervisor -> DeviceServer, listen-only on loopback) as a fresh JVM each round and prints medians of

  - baseline: a JVM that starts and exits at once (the process start alone),
  - start -> "listening" on the status line,
  - start -> the first tether.echo answered to a real tether.rpc client,

with the ratios to the baseline. A desktop JVM is not ART (a phone's process comes forked from the zygote, which
skips most of the JVM start); the figure bounds the device server's own share of the 2 s budget, not the phone's.
"""
from __future__ import annotations

import argparse
import pathlib
import platform
import queue
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Optional

ROOT = pathlib.Path(__file__).resolve().parent.parent
APP = ROOT / "android_app"
sys.path.insert(0, str(ROOT / "src"))

from tether import rpc  # noqa: E402

PURE = ("Settings", "Backoff", "DeviceState", "RestartPolicy", "DeviceSupervisor")
WAIT_S = 60.0


def compile_classes(out: pathlib.Path) -> None:
    sources = [str(s) for d in ("protocol/src", "device/src") for s in (APP / d).rglob("*.java")]
    sources += [str(APP / "app" / "src" / "dev" / "tether" / "app" / (c + ".java")) for c in PURE]
    sources += [str(s) for s in (APP / "app" / "tests").rglob("*.java")]
    (out / "Nothing.java").write_text("public final class Nothing { public static void main(String[] a) { } }\n")
    sources.append(str(out / "Nothing.java"))
    subprocess.run(["javac", "--release", "8", "-nowarn", "-Xlint:-options", "-encoding", "UTF-8", "-d", str(out),
                    *sources], check=True, timeout=300)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pump(stream, lines: "queue.Queue[Optional[str]]") -> None:
    """Every line of ``stream`` into ``lines``, then None at its end (so a wait on ``lines`` can time out)."""
    for line in stream:
        lines.put(line)
    lines.put(None)


def one_round(classes: pathlib.Path, libdir: pathlib.Path, work: pathlib.Path):
    port = free_port()
    t0 = time.perf_counter()
    proc = subprocess.Popen(["java", "-cp", str(classes), "dev.tether.app.SupervisorRunner", str(libdir), str(work),
                             "tracker=none", "port=%d" % port], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    try:
        want = "publish false listening on 127.0.0.1:%d" % port
        lines: "queue.Queue[Optional[str]]" = queue.Queue()
        threading.Thread(target=_pump, args=(proc.stdout, lines), daemon=True).start()
        deadline = time.monotonic() + WAIT_S
        while True:
            try:
                line = lines.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                raise RuntimeError("the device server did not listen within %.0f s" % WAIT_S) from None
            if line is None:
                raise RuntimeError("SupervisorRunner ended before listening (exit %s)" % proc.wait(timeout=10))
            if line.startswith(want):
                break
        listening = time.perf_counter() - t0
        with rpc.connect("127.0.0.1", port, timeout=WAIT_S) as remote:
            remote.get_function("tether.echo")(1)
        served = time.perf_counter() - t0
        proc.stdin.write("stop\n")
        proc.stdin.flush()
        proc.wait(timeout=WAIT_S)
        return listening, served
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    abi = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "aarch64", "arm64": "aarch64"}[platform.machine().lower()]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        (tmp / "classes").mkdir()
        (tmp / "work").mkdir()
        compile_classes(tmp / "classes")
        subprocess.run(["bash", str(APP / "bridge" / "build.sh"), "--out", str(tmp / "bridge"), abi], check=True,
                       stdout=subprocess.DEVNULL, timeout=300)
        base, listen, served = [], [], []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            subprocess.run(["java", "-cp", str(tmp / "classes"), "Nothing"], check=True, timeout=WAIT_S)
            base.append(time.perf_counter() - t0)
            a, b = one_round(tmp / "classes", tmp / "bridge" / abi, tmp / "work")
            listen.append(a)
            served.append(b)
    b = statistics.median(base)
    print("device process restart on a desktop JVM, median of %d rounds" % args.repeat)
    print("  baseline: JVM start and exit          %7.0f ms" % (b * 1e3))
    for name, xs in (("start -> listening", listen), ("start -> first echo answered", served)):
        m = statistics.median(xs)
        print("  %-37s %7.0f ms  (%.2fx baseline)" % (name, m * 1e3, m / b))
    return 0


if __name__ == "__main__":
    sys.exit(main())
