"""The README's main job, `tether quickstart`, run as a user runs it: a real CLI process that starts a real tracker
and device server, compiles, runs remotely and checks against numpy."""
import os
import subprocess
import sys


def test_quickstart_runs_end_to_end_and_checks_against_numpy():
    proc = subprocess.run([sys.executable, "-m", "tether.cli.main", "quickstart", "--size", "4099",
                           "--matmul-size", "67"], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, COLUMNS="160"))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "ok fused_relu_fma matches numpy" in out and "ok matmul matches numpy" in out, out
    assert "tracker listening on 127.0.0.1:" in out and "device server on 127.0.0.1:" in out, out
    assert "numpy / tether" in out, out
