#!/usr/bin/env python3
"""Start-up and round-trip cost of the emulated ARM devices, against the native device server in the same run.

    python scripts/bench_emulated.py [--repeat 3]

Prints, per board (rasp4b = aarch64/cortex-a72, rasp3b = armv7/max, armv7-a7 = armv7/cortex-a7) and for the
native server: start-up until "listening" (zipapp shipped and run), session open, and small-call round trip
(medians), with ratios to native. The userlands must be built already (scripts/setup_emulated_device.sh).
Emulated figures say how long tests wait, not how fast a board is.
"""
from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import sys
import tempfile
import time

from _timing import echo_round_trip
from tether import bundle, emulate, rpc


def _native_command(self, args, *, cpu=None):
    """Userland.command for the baseline: the same zipapp and flags, run by the host python without qemu."""
    return [sys.executable, *args]


def measure(make, repeat: int, calls: int = 50) -> dict:
    starts, opens, rtts = [], [], []
    for _ in range(repeat):
        with make() as dev:
            starts.append(dev.startup_seconds)
            t0 = time.perf_counter()
            with rpc.connect(*dev.address, timeout=120) as remote:
                opens.append(time.perf_counter() - t0)
                rtts.append(echo_round_trip(remote, calls))
    return {"start": statistics.median(starts), "open": statistics.median(opens), "rtt": statistics.median(rtts)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        zipapp = bundle.write_bundle(pathlib.Path(tmp) / bundle.DEFAULT_NAME)
        native_userland = emulate.Userland(emulate.ARCHES["aarch64"], pathlib.Path(tmp), {})
        native_userland.command = _native_command.__get__(native_userland)   # host python instead of qemu
        rows = {"native": measure(lambda: emulate.EmulatedDevice(native_userland, bundle=zipapp, preset="native"),
                                  args.repeat)}
        for preset in ("rasp4b", "rasp3b", "armv7-a7"):
            arch, cpu = emulate.preset_device(preset)
            userland = emulate.cached_userland(arch)
            if userland is None:
                print("%s: no cached %s userland; run scripts/setup_emulated_device.sh" % (preset, arch))
                continue
            rows[preset] = measure(lambda: emulate.EmulatedDevice(userland, cpu=cpu, bundle=zipapp), args.repeat)
    base = rows["native"]
    print("load average %.1f; medians of %d runs" % (os.getloadavg()[0], args.repeat))
    print("%-10s %12s %8s %12s %8s %12s %8s" % ("device", "start-up", "ratio", "session open", "ratio", "call RTT",
                                               "ratio"))
    for name, r in rows.items():
        print("%-10s %10.0f ms %7.1fx %10.1f ms %7.1fx %9.0f us %7.1fx"
              % (name, r["start"] * 1e3, r["start"] / base["start"], r["open"] * 1e3, r["open"] / base["open"],
                 r["rtt"] * 1e6, r["rtt"] / base["rtt"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
