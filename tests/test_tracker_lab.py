"""The lab scenario of scripts/bench_tracker.py at a small scale: a real `rpc-tracker` process, simulated devices and
clients on real loopback sockets speaking the real protocol, clients dying while queued, holding or just granted.

Correctness only: every live client's request ends in a GRANT or the tracker's timeout error, and once everyone has
left every device is registered and free. How fast is the benchmark's business (`--devices 1000 --clients 200`).
"""
from __future__ import annotations

import asyncio

from fixtures.scripts import load_script

bench = load_script("bench_tracker")


def test_lab_loses_no_request_and_leaks_no_device(tracker_lab):
    tracker = tracker_lab.tracker()
    # 5 scarce keys with one device each take half the requests: queues form there, so clients die while queued
    cfg = bench.LabConfig(devices=100, clients=20, keys=10, duration=5.0, scarce_keys=5, scarce_per_key=1,
                          scarce_share=0.5, pattern_share=0.1, hold=(0.02, 0.2), wait=(0.5, 3.0), die_waiting=0.1,
                          cancel_waiting=0.05, die_holding=0.1, die_granted=0.05, device_drops_per_s=2.0, seed=3)
    r = asyncio.run(bench.run_lab(tracker.port, cfg, tracker.proc.pid))
    assert not r["problems"], r["problems"]
    assert r["lost"] == 0, r["outcomes"]
    assert r["leaked"] == [] and r["pending_at_end"] == 0, r["leaked"]
    assert r["devices_in_summary"] == 100
    # the scenario really exercised what it claims to (else the checks above prove nothing)
    events, outcomes = r["events"], r["outcomes"]
    assert outcomes.get("granted", 0) > 100 and outcomes.get("timeout", 0) > 0, outcomes
    assert events["die_waiting"] > 0 and events["cancel_waiting"] > 0, events
    assert events["die_holding"] > 0 and events["die_granted"] > 0 and events["device_drops"] > 0, events
