"""The soak test's short CI run (scripts/soak.py, 30 s): a tracker with two real device servers, three random
clients calling, streaming, crashing kernels and leaving mid-call; afterwards nothing may have grown or leaked."""
from __future__ import annotations

import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_short_soak_leaks_nothing(tmp_path):
    report_path = tmp_path / "soak.json"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "soak.py"), "--minutes", "0.5", "--clients", "3",
                           "--json", str(report_path)], capture_output=True, text=True, timeout=300)
    assert report_path.exists(), proc.stdout + proc.stderr
    report = json.loads(report_path.read_text())
    assert proc.returncode == 0 and report["ok"], proc.stdout + proc.stderr[-4000:]
    assert report["errors"] == [] and report["leaks"] == [] and report["idle"]
    # every kind of client behaviour happened, and often enough to show a leak
    assert set(report["actions"]) == {"call", "stream", "crash", "close_mid_call", "drop_mid_call", "hold"}
    assert report["sessions"] >= 30 and min(report["actions"].values()) >= 2
    # A leak grows with the sessions (30 and more here): any fd count above its baseline is one. A count below it is
    # not (a connection that was closing while the baseline was read), so counts are not compared for equality.
    base, final = report["baseline"], report["final"]
    assert all(final["fds"][name] <= n for name, n in base["fds"].items()), (base["fds"], final["fds"])
    assert final["own_fds"] <= base["own_fds"]
    assert final["children"] == {name: 0 for name in base["children"]} and final["session_folders"] == 0
    for name in ("server0", "server1"):
        assert final["rss_kib"][name] <= base["rss_kib"][name] * 1.10
