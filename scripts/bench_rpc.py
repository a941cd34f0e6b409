#!/usr/bin/env python3
"""Benchmark tether RPC against raw Python sockets on loopback, in one run; prints medians and ratios.

    python scripts/bench_rpc.py [--quick] [--tls]

Rows (the goals the RPC layer was built to; TVM manages 25 us per call and 45 MB/s):
  small-call RTT        tether echo(1) vs a raw 8-byte TCP_NODELAY socket echo         goal <= 1.3x raw
  64 MB host->device    RemoteArray.copyfrom vs raw socket sendall/recv_into          goal >= 1 GB/s and >= 30% raw
  64 MB device->host    RemoteArray.copyto   vs raw socket (server sends)             goal >= 1 GB/s and >= 30% raw
  10 MB upload          RemoteSession.upload(path)                                     goal >= 1 GB/s
  session open          connect + handshake + close
  time_evaluator cost   one time_evaluator(number=1, repeat=1) call of an empty kernel goal <= 0.3 ms
Both sides of every baseline are Python processes, as tether's are: the ratios compare protocols, not
languages. Loopback only.

--tls measures instead what TLS costs (docs/tls.md): the same server with and without --tls-cert (a
self-signed certificate made with the openssl command), small-call RTT and 64 MB copies both ways, interleaved.
"""
from __future__ import annotations

import argparse
import os
import pathlib
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "rpc_server"))

from _timing import per_call_samples  # noqa: E402
from tether import rpc  # noqa: E402

NOP_KERNEL = r"""
#include "tether_abi.h"
TETHER_META("{\"abi_version\": 1, \"tether_version\": \"0.1.0\", \"target\": {\"arch\": \"" TETHER_ARCH "\"}, "
            "\"functions\": [{\"name\": \"nop\", \"args\": [], \"parallel\": false}]}");
TETHER_EXPORT int32_t nop(const TetherValue* args, const int32_t* codes, int32_t num_args) { return 0; }
"""

MB = 1 << 20


# -- raw socket baselines (a forked Python peer, blocking sockets, TCP_NODELAY) -----------------------------------
def _raw_peer(listener: socket.socket, mode: str, nbytes: int) -> None:
    conn, _ = listener.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if mode == "echo":
        buf = bytearray(8)
        view = memoryview(buf)
        while True:
            got = 0
            while got < 8:
                n = conn.recv_into(view[got:])
                if n == 0:
                    return
                got += n
            conn.sendall(view)
    elif mode == "sink":  # receive nbytes into one buffer per round, ack with 1 byte
        buf = memoryview(bytearray(nbytes))
        while True:
            got = 0
            while got < nbytes:
                n = conn.recv_into(buf[got:])
                if n == 0:
                    return
                got += n
            conn.sendall(b"k")
    elif mode == "source":  # on each 1-byte request, send nbytes
        data = memoryview(bytearray(os.urandom(16)) * (nbytes // 16))
        while conn.recv(1):
            conn.sendall(data)


class RawPeer:
    def __init__(self, mode: str, nbytes: int = 8):
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(1)
        self.pid = os.fork()
        if self.pid == 0:
            try:
                _raw_peer(self.listener, mode, nbytes)
            finally:
                os._exit(0)
        self.sock = socket.create_connection(self.listener.getsockname(), timeout=30)
        self.sock.settimeout(None)  # blocking, as the floor is defined: a timeout adds a poll() per receive
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def close(self) -> None:
        self.sock.close()
        self.listener.close()
        try:
            os.kill(self.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        os.waitpid(self.pid, 0)


def recv_exact(sock: socket.socket, view: memoryview) -> None:
    got = 0
    while got < len(view):
        n = sock.recv_into(view[got:])
        if n == 0:
            raise ConnectionError("peer closed")
        got += n


def median_of(fn, rounds: int) -> float:
    return statistics.median(fn() for _ in range(rounds))


best = {}  # the fastest batch of each measurement: what an idle machine would show


def interleaved_rtt(tether_calls, calls: int, rounds: int):
    """Median per-call RTT of a raw 8-byte echo and of each of ``tether_calls``, measured in alternating batches
    so that load from other processes hits all alike. Returns (raw, [tether...])."""
    peer = RawPeer("echo")
    try:
        msg = b"12345678"
        buf = memoryview(bytearray(8))

        def raw_batch() -> float:
            t0 = time.perf_counter()
            for _ in range(calls):
                peer.sock.sendall(msg)
                recv_exact(peer.sock, buf)
            return (time.perf_counter() - t0) / calls

        def tether_batch(call) -> float:
            t0 = time.perf_counter()
            for _ in range(calls):
                call()
            return (time.perf_counter() - t0) / calls

        raw_batch()
        for call in tether_calls:
            tether_batch(call)
        raws, tethers = [], [[] for _ in tether_calls]
        for _ in range(rounds):
            raws.append(raw_batch())
            for call, out in zip(tether_calls, tethers):
                out.append(tether_batch(call))
        best["rtt"] = (min(raws), min(tethers[0]))
        return statistics.median(raws), [statistics.median(t) for t in tethers]
    finally:
        peer.close()


def raw_transfers(nbytes: int):
    """One-shot raw socket transfers of ``nbytes`` (send to a sink peer; receive from a source peer)."""
    sink, source = RawPeer("sink", nbytes), RawPeer("source", nbytes)
    data = memoryview(np.random.default_rng(0).integers(0, 255, nbytes, dtype=np.uint8))
    out = memoryview(bytearray(nbytes))
    ack = memoryview(bytearray(1))

    def upload() -> float:
        t0 = time.perf_counter()
        sink.sock.sendall(data)
        recv_exact(sink.sock, ack)
        return time.perf_counter() - t0

    def download() -> float:
        t0 = time.perf_counter()
        source.sock.sendall(b"g")
        recv_exact(source.sock, out)
        return time.perf_counter() - t0

    return upload, download, (sink, source)


def interleaved(fa, fb, rounds: int):
    """Medians of two measurements taken in alternation (so background load hits both alike)."""
    fa()
    fb()
    a, b = [], []
    for _ in range(rounds):
        a.append(fa())
        b.append(fb())
    return statistics.median(a), statistics.median(b)


# -- tether -----------------------------------------------------------------------------------------------------
class Server:
    def __init__(self, workdir: pathlib.Path, *flags: str, name: str = "server"):
        log_path = workdir / (name + ".log")
        self.log = open(log_path, "w+")
        self.t0 = t0 = time.perf_counter()
        self.proc = subprocess.Popen([sys.executable, "-m", "tether_rpc", "--port", "0", "--workdir", str(workdir),
                                      *flags], stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            m = re.search(r"listening on (\S+):(\d+)", log_path.read_text())
            if m:
                self.startup = time.perf_counter() - t0
                self.host, self.port = m.group(1), int(m.group(2))
                return
            time.sleep(0.002)
        raise RuntimeError("server did not start")

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)
        self.log.close()


def build_nop(tmp: pathlib.Path) -> pathlib.Path:
    gcc = shutil.which("gcc")
    if gcc is None:
        raise SystemExit("gcc is needed to build the empty benchmark kernel")
    src = tmp / "nop.c"
    src.write_text(NOP_KERNEL)
    out = tmp / "nop.so"
    subprocess.run([gcc, "-O2", "-shared", "-fPIC", "-nostdlib", "-fvisibility=hidden", "-fno-stack-protector",
                    "-I", str(ROOT / "tests" / "kernels"), str(src), "-o", str(out), "-Wl,--no-undefined"],
                   check=True, timeout=60)
    return out


def self_signed(tmp: pathlib.Path):
    """(cert, key) for 127.0.0.1, made with the openssl command."""
    openssl = shutil.which("openssl")
    if openssl is None:
        raise SystemExit("--tls needs the openssl command to make a test certificate")
    cert, key = tmp / "cert.pem", tmp / "key.pem"
    subprocess.run([openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"], check=True, timeout=60, capture_output=True)
    return cert, key


def tls_cost(rounds: int, calls: int, big: int) -> None:
    """What TLS costs a small call and a 64 MB copy: plain and TLS servers measured in alternation."""
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="tether-bench-tls-"))
    try:
        cert, key = self_signed(tmp)
        plain, secure = Server(tmp, name="plain"), Server(tmp, "--tls-cert", str(cert), "--tls-key", str(key),
                                                          name="tls")
        try:
            with rpc.connect(plain.host, plain.port, timeout=60) as rp, \
                    rpc.connect(secure.host, secure.port, timeout=60, ca=str(cert)) as rt:
                ep, et = rp.get_function("tether.echo"), rt.get_function("tether.echo")

                def batch(fn):
                    def run() -> float:
                        t0 = time.perf_counter()
                        for _ in range(calls // 10):
                            fn(1)
                        return (time.perf_counter() - t0) / (calls // 10)
                    return run

                rtt_plain, rtt_tls = interleaved(batch(ep), batch(et), rounds * 3)
                host = np.random.default_rng(0).standard_normal(big // 4).astype(np.float32)
                back = np.empty_like(host)
                dp, dt = rp.empty(host.shape, "float32"), rt.empty(host.shape, "float32")

                def timed(fn):
                    def run() -> float:
                        t0 = time.perf_counter()
                        fn()
                        return time.perf_counter() - t0
                    return run

                up_plain, up_tls = interleaved(timed(lambda: dp.copyfrom(host)), timed(lambda: dt.copyfrom(host)),
                                               rounds)
                down_plain, down_tls = interleaved(timed(lambda: dp.copyto(back)), timed(lambda: dt.copyto(back)),
                                                   rounds)
                assert np.array_equal(back, host), "a device->host copy over TLS returned different data"
        finally:
            plain.close()
            secure.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    gbs = lambda t: big / t / 1e9  # noqa: E731
    rows = [("small-call RTT (echo)", "%.1f us" % (rtt_tls * 1e6), "%.1f us" % (rtt_plain * 1e6),
             "%.2fx plain" % (rtt_tls / rtt_plain)),
            ("64 MB host->device", "%.2f GB/s" % gbs(up_tls), "%.2f GB/s" % gbs(up_plain),
             "%.2fx plain time" % (up_tls / up_plain)),
            ("64 MB device->host", "%.2f GB/s" % gbs(down_tls), "%.2f GB/s" % gbs(down_plain),
             "%.2fx plain time" % (down_tls / down_plain))]
    header = ("what", "TLS", "plain TCP", "cost")
    widths = [max(len(r[i]) for r in rows + [header]) for i in range(4)]
    for r in [header] + rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)))
    import ssl
    print("(medians; %s; loopback 127.0.0.1; python %s; both servers with adaptive polling on, which TLS turns off)"
          % (ssl.OPENSSL_VERSION, sys.version.split()[0]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer rounds")
    ap.add_argument("--tls", action="store_true", help="measure what TLS costs instead (see above)")
    args = ap.parse_args()
    rounds = 5 if args.quick else 9
    calls = 1000 if args.quick else 3000
    big = 64 * MB
    if args.tls:
        tls_cost(rounds, calls, big)
        return

    tmp = pathlib.Path(tempfile.mkdtemp(prefix="tether-bench-"))
    rows = []
    try:
        nop = build_nop(tmp)
        upload_file = tmp / "upload.bin"
        upload_file.write_bytes(os.urandom(10 * MB))
        startups, first_calls = [], []
        for _ in range(3):
            s = Server(tmp)
            startups.append(s.startup)
            with rpc.connect(s.host, s.port, timeout=30) as r:
                r.get_function("tether.echo")(1)
            first_calls.append(time.perf_counter() - s.t0)
            s.close()
        # Session folders on tmpfs when there is one: the upload row then measures the protocol rather than the
        # disk (on ext4 with discard, rewriting 10 MB alone takes ~10 ms here).
        shm = pathlib.Path("/dev/shm")
        session_root = pathlib.Path(tempfile.mkdtemp(prefix="tether-bench-", dir=str(shm))) \
            if shm.is_dir() and os.access(str(shm), os.W_OK) else tmp
        server = Server(session_root)
        # The same calls with adaptive polling off at both ends (a second server, and a client with spin=0): what
        # the wake-ups cost (a busy machine turns polling off by itself; this row shows that floor).
        sleeper = Server(session_root, "--spin-us", "0", name="server-nopoll")
        try:
            with rpc.connect(server.host, server.port, timeout=60) as remote, \
                    rpc.connect(sleeper.host, sleeper.port, timeout=60, spin=0) as remote_nopoll:
                echo = remote.get_function("tether.echo")
                echo_nopoll = remote_nopoll.get_function("tether.echo")
                raw_rtt, (rtt, rtt_nopoll) = interleaved_rtt([lambda: echo(1), lambda: echo_nopoll(1)],
                                                             calls // 10, rounds * 10)

                host = np.random.default_rng(0).standard_normal(big // 4).astype(np.float32)
                dev = remote.empty(host.shape, "float32")
                back = np.empty_like(host)

                def h2d() -> float:
                    t0 = time.perf_counter()
                    dev.copyfrom(host)
                    return time.perf_counter() - t0

                def d2h() -> float:
                    t0 = time.perf_counter()
                    dev.copyto(back)
                    return time.perf_counter() - t0

                raw_send, raw_recv, peers = raw_transfers(big)
                try:
                    raw_up, t_h2d = interleaved(raw_send, h2d, rounds)
                    raw_down, t_d2h = interleaved(raw_recv, d2h, rounds)
                finally:
                    for peer in peers:
                        peer.close()
                assert np.array_equal(back, host), "device->host copy returned different data"
                dev.free()

                def upload() -> float:
                    t0 = time.perf_counter()
                    remote.upload(upload_file, name="upload.bin")
                    return time.perf_counter() - t0

                payload10 = memoryview(upload_file.read_bytes())
                target = session_root / "write-baseline.bin"

                def write_file() -> float:  # the file-system floor an upload cannot beat
                    t0 = time.perf_counter()
                    with open(target, "wb") as fh:
                        fh.write(payload10)
                    return time.perf_counter() - t0

                t_write, t_up = interleaved(write_file, upload, rounds)

                remote.upload(nop)
                f = remote.load_module("nop.so")["nop"]
                te = f.time_evaluator(number=1, repeat=1, warmup=0)
                for _ in range(50):
                    te()

                te_runs = per_call_samples(te, 200, rounds)
                t_te = statistics.median(te_runs)
                call_runs = per_call_samples(f, 200, rounds)
                t_call = statistics.median(call_runs)
                best["te"] = (min(call_runs), min(te_runs))

            def open_close() -> float:
                t0 = time.perf_counter()
                rpc.connect(server.host, server.port, timeout=10).close()
                return time.perf_counter() - t0

            for _ in range(3):
                open_close()
                time.sleep(0.06)  # let the parent reap the worker so the next open is not queued

            def open_only() -> float:
                time.sleep(0.06)
                return open_close()

            t_open = median_of(open_only, rounds * 2)
        finally:
            server.close()
            sleeper.close()
            if session_root != tmp:
                shutil.rmtree(session_root, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    session_dir_kind = "/dev/shm (tmpfs)" if "/dev/shm" in str(session_root) else str(session_root)
    gbs = lambda n, t: n / t / 1e9  # noqa: E731
    rows = [
        ("small-call RTT (echo)", "%.1f us" % (rtt * 1e6), "%.1f us" % (raw_rtt * 1e6), "%.2fx raw" % (rtt / raw_rtt),
         "<= 1.3x",
         rtt / raw_rtt <= 1.3 and best["rtt"][1] / best["rtt"][0] <= 1.3),
        ("  the same, polling off", "%.1f us" % (rtt_nopoll * 1e6), "%.1f us" % (raw_rtt * 1e6),
         "%.2fx raw" % (rtt_nopoll / raw_rtt), "(info)", True),
        ("64 MB host->device", "%.2f GB/s" % gbs(big, t_h2d), "%.2f GB/s" % gbs(big, raw_up),
         "%.0f%% raw" % (100 * raw_up / t_h2d), ">= 1 GB/s, >= 30%", gbs(big, t_h2d) >= 1 and raw_up / t_h2d >= 0.3),
        ("64 MB device->host", "%.2f GB/s" % gbs(big, t_d2h), "%.2f GB/s" % gbs(big, raw_down),
         "%.0f%% raw" % (100 * raw_down / t_d2h), ">= 1 GB/s, >= 30%",
         gbs(big, t_d2h) >= 1 and raw_down / t_d2h >= 0.3),
        ("10 MB upload (file)", "%.2f GB/s" % gbs(10 * MB, t_up), "%.2f GB/s mem" % gbs(10 * MB, t_write),
         "%.0f%% of write" % (100 * t_write / t_up), ">= 1 GB/s", gbs(10 * MB, t_up) >= 1),
        ("session open+close", "%.2f ms" % (t_open * 1e3), "-", "-", "", True),
        ("time_evaluator call (nop)", "%.3f ms" % (t_te * 1e3), "%.3f ms call" % (t_call * 1e3),
         "+%.0f us over call" % ((t_te - t_call) * 1e6), "<= 0.3 ms", t_te <= 0.3e-3),
        ("server start-up (to listening)", "%.0f ms" % (statistics.median(startups) * 1e3), "-", "-", "< 500 ms",
         statistics.median(startups) < 0.5),
        ("start-up to first call answered", "%.0f ms" % (statistics.median(first_calls) * 1e3), "-", "-", "< 500 ms",
         statistics.median(first_calls) < 0.5),
    ]
    widths = [max(len(str(r[i])) for r in rows + [("what", "tether", "baseline", "ratio", "goal", "")])
              for i in range(5)]
    header = ("what", "tether", "baseline", "ratio", "goal")
    print("  ".join(h.ljust(w) for h, w in zip(header, widths)) + "  met")
    for r in rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(r[:5], widths)) + "  " + ("yes" if r[5] else "NO"))
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print("fastest batch (less exposed to other load; load average %.1f on %d CPUs): small call %.1f us vs raw %.1f us"
          " = %.2fx; time_evaluator %.3f ms (plain call %.3f ms)"
          % (load, os.cpu_count() or 0, best["rtt"][1] * 1e6, best["rtt"][0] * 1e6, best["rtt"][1] / best["rtt"][0],
             best["te"][1] * 1e3, best["te"][0] * 1e3))
    print("(medians of %d rounds; small calls: %d per round; loopback 127.0.0.1; python %s, numpy %s;"
          " session folders in %s)" % (rounds, calls, sys.version.split()[0], np.__version__, session_dir_kind))


if __name__ == "__main__":
    main()
