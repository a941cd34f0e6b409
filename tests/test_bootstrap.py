"""`tether bootstrap` / tether.ssh against a REAL OpenSSH sshd on loopback (fixture ``sshd``): this machine is the
"device". Host-key checks, the device check, the SFTP upload, the detached server, the direct-tcpip tunnel
(through which a compiled vadd runs and is compared with numpy), idempotent re-runs and --stop by PID."""
from __future__ import annotations

import os
import pathlib
import platform
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from click.testing import CliRunner

import tether
import tether.bundle
from fixtures.children import stop_process
from fixtures.schedules import elementwise
from tether import rpc, ssh
from tether.cli.main import cli
from tether.errors import AuthenticationError, TetherTimeout


def _alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie, exited but not yet reaped by init, counts as gone)."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def _wait_gone(pid: int, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not _alive(pid)


def _ssh_args(sshd, **overrides):
    args = dict(port=sshd.port, identity=sshd.identity, known_hosts=sshd.known_hosts, timeout=10.0)
    args.update(overrides)
    return args


def _cli_args(sshd, *extra, known_hosts=None):
    return ["bootstrap", "%s@%s" % (sshd.user, sshd.host), "--port", str(sshd.port), "--identity", sshd.identity,
            "--known-hosts", known_hosts or sshd.known_hosts, "--timeout", "10", *extra]


@pytest.fixture
def device_dir(tmp_path):
    """The bootstrap folder on the "device"; a server still running there after the test is stopped by PID."""
    path = tmp_path / "device"
    yield path
    pidfile = path / ssh.PID_NAME
    if not pidfile.exists():
        return
    pid = int(pidfile.read_text())
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            ours = str(path / ssh.BUNDLE_NAME).encode() in f.read()
    except FileNotFoundError:
        ours = False
    if ours and _alive(pid):
        os.kill(pid, signal.SIGTERM)
        if not _wait_gone(pid, 5):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def vadd_so(tmp_path_factory) -> pathlib.Path:
    s, args = elementwise(1024, lambda a, b: a + b, factor=8)
    path = tmp_path_factory.mktemp("vadd") / "vadd.so"
    tether.build(s, args, target="host", name="vadd").export_library(str(path))
    return path


@pytest.fixture(scope="module")
def python_without_numpy(tmp_path_factory) -> str:
    """A venv of this interpreter without site packages: Python 3.11, no numpy, no msgpack."""
    venv = tmp_path_factory.mktemp("venv") / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    python = str(venv / "bin" / "python")
    probe = subprocess.run([python, "-c", "import numpy"], capture_output=True, timeout=30)
    assert probe.returncode != 0, "the bare venv unexpectedly imports numpy"
    return python


# ---------------------------------------------------------------------------------------------------------------
# host keys

def test_unknown_host_key_is_refused_unless_accepted_then_remembered(sshd, tmp_path):
    known = tmp_path / "ssh" / "known_hosts"
    with pytest.raises(ssh.HostKeyError, match="accept-new-host-key"):
        ssh.connect(sshd.host, sshd.user, **_ssh_args(sshd, known_hosts=str(known)))
    assert not known.exists()

    with ssh.connect(sshd.host, sshd.user, **_ssh_args(sshd, known_hosts=str(known), accept_new_host_key=True)) as c:
        assert c.run("echo hello")[:2] == (0, "hello\n")
    # saved in OpenSSH's format for a non-22 port, with exactly the server's key
    assert known.read_text().split() == ["[127.0.0.1]:%d" % sshd.port] + sshd.host_key_line.split()

    with ssh.connect(sshd.host, sshd.user, **_ssh_args(sshd, known_hosts=str(known))) as c:   # now known
        assert c.run("echo again")[1] == "again\n"


def test_changed_host_key_is_refused_even_with_accept_new(sshd, tmp_path):
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True, timeout=30)
    known = tmp_path / "known_hosts"
    line = "[127.0.0.1]:%d %s\n" % (sshd.port, " ".join(pathlib.Path(str(other) + ".pub").read_text().split()[:2]))
    known.write_text(line)
    for accept in (False, True):
        with pytest.raises(ssh.HostKeyError, match="CHANGED"):
            ssh.connect(sshd.host, sshd.user, **_ssh_args(sshd, known_hosts=str(known), accept_new_host_key=accept))
    assert known.read_text() == line

    result = CliRunner().invoke(cli, _cli_args(sshd, "--check-only", known_hosts=str(known)))
    assert result.exit_code == 1 and "CHANGED" in result.output


# ---------------------------------------------------------------------------------------------------------------
# the device check

def test_check_only_reports_a_missing_numpy_and_what_to_install(sshd, tmp_path, python_without_numpy):
    result = CliRunner().invoke(cli, _cli_args(sshd, "--check-only", "--python", python_without_numpy))
    assert result.exit_code == 1, result.output
    assert "numpy is missing" in result.output and "msgpack is missing" in result.output
    assert "sudo apt-get install python3-numpy python3-msgpack" in result.output
    assert "device: %s" % platform.machine() in result.output

    remote_dir = tmp_path / "device"
    with pytest.raises(ssh.DeviceNotReady) as info:
        ssh.bootstrap(sshd.host, sshd.user, **_ssh_args(sshd), python=python_without_numpy,
                      remote_dir=str(remote_dir), remote_port=0)
    check = info.value.check
    assert not check.ok and check.numpy is None and check.msgpack is None
    assert check.python_version == "%d.%d.%d" % sys.version_info[:3]
    assert check.machine == platform.machine() and check.arch == "x86_64" and check.suggested_target == "x86_64"
    assert not remote_dir.exists()   # nothing uploaded, nothing started

    ok = CliRunner().invoke(cli, _cli_args(sshd, "--check-only", "--python", sys.executable))
    assert ok.exit_code == 0 and "device ready" in ok.output and "numpy: %s" % np.__version__ in ok.output


# ---------------------------------------------------------------------------------------------------------------
# upload, start, tunnel, re-run, stop

def test_bootstrap_tunnels_to_a_real_server_that_runs_vadd(sshd, device_dir, vadd_so):
    remote_dir = device_dir
    bundle = remote_dir / ssh.BUNDLE_NAME
    # one zipapp for every run below: the device package may be edited while the test runs
    zipapp = tether.bundle.bundle_bytes()
    opts = dict(_ssh_args(sshd), python=sys.executable, remote_dir=str(remote_dir), remote_port=0, bundle=zipapp)
    with ssh.bootstrap(sshd.host, sshd.user, **opts) as boot:
        assert boot.uploaded and not boot.reused
        assert bundle.read_bytes() == zipapp
        assert int((remote_dir / ssh.PID_NAME).read_text()) == boot.pid and _alive(boot.pid)
        assert boot.remote_host == "127.0.0.1"                        # loopback only on the device
        assert "listening on 127.0.0.1:%d" % boot.remote_port in (remote_dir / ssh.LOG_NAME).read_text()
        assert not [p for p in remote_dir.iterdir() if p.name.endswith(".tmp")]
        local = boot.forward()
        with rpc.connect("127.0.0.1", local, timeout=10) as remote:
            assert remote.get_function("tether.echo")(7, "seven", [1.5]) == [7, "seven", [1.5]]
            info = remote.device_info()
            assert info["arch"] == "x86_64" and info["suggested_target"] == boot.check.suggested_target
            remote.upload(str(vadd_so))
            f = remote.load_module("vadd.so")["vadd"]
            rng = np.random.default_rng(0)
            a_np, b_np = rng.random(1024, dtype=np.float32), rng.random(1024, dtype=np.float32)
            a, b, c = remote.array(a_np), remote.array(b_np), remote.empty((1024,), "float32")
            f(a, b, c)
            np.testing.assert_array_equal(c.numpy(), a_np + b_np)
            big = rng.random(1 << 19, dtype=np.float32)                # 2 MiB each way through the pump
            np.testing.assert_array_equal(remote.array(big).numpy(), big)
        first_pid, first_port = boot.pid, boot.remote_port
    boot.close()   # idempotent
    assert _alive(first_pid)   # closing the SSH side leaves the server running

    mtime = bundle.stat().st_mtime_ns
    with ssh.bootstrap(sshd.host, sshd.user, **opts) as again:     # same zipapp, same settings: reused
        assert not again.uploaded and again.reused
        assert (again.pid, again.remote_port) == (first_pid, first_port)
        assert bundle.stat().st_mtime_ns == mtime
        with rpc.connect("127.0.0.1", again.forward(), timeout=10) as remote:
            assert remote.get_function("tether.echo")("still", "here") == ["still", "here"]

    bundle.write_bytes(b"an older zipapp")                         # a different hash: upload and restart
    with ssh.bootstrap(sshd.host, sshd.user, **opts) as third:
        assert third.uploaded and not third.reused and third.pid != first_pid
        assert bundle.read_bytes() == zipapp
        assert _wait_gone(first_pid), "the old server was not stopped"
        with rpc.connect("127.0.0.1", third.forward(), timeout=10) as remote:
            assert remote.get_function("tether.echo")(3, 4) == [3, 4]
        assert third.stop() == "stopped %d" % third.pid
        assert _wait_gone(third.pid)
        assert not (remote_dir / ssh.PID_NAME).exists()
        assert third.stop() == "none"


def test_cli_keeps_a_tunnel_until_terminated_and_stop_ends_the_server(sshd, device_dir):
    remote_dir = device_dir
    argv = _cli_args(sshd, "--python", sys.executable, "--remote-dir", str(remote_dir), "--remote-port", "0",
                     "--forward", "0")
    env = dict(os.environ, TETHER_TOKEN="s3cret-for-bootstrap")     # --token's environment variable
    proc = subprocess.Popen([sys.executable, "-c", "from tether.cli.main import cli; cli()", *argv],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    lines: "queue.Queue[str]" = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()
    try:
        output, port, deadline = [], None, time.monotonic() + 30
        while port is None and time.monotonic() < deadline and proc.poll() is None:
            try:
                output.append(lines.get(timeout=0.5))
            except queue.Empty:
                continue
            m = re.search(r'rpc\.connect\("127\.0\.0\.1", (\d+)[,)]', output[-1])
            port = int(m.group(1)) if m else None
        assert port is not None, "no connect line from `tether bootstrap`:\n" + "".join(output)
        assert "zipapp uploaded; device server started" in "".join(output)
        with pytest.raises(AuthenticationError):
            rpc.connect("127.0.0.1", port, timeout=10, token="wrong")
        with rpc.connect("127.0.0.1", port, timeout=10, token="s3cret-for-bootstrap") as remote:
            assert remote.get_function("tether.echo")("through", "the CLI tunnel") == ["through", "the CLI tunnel"]
        pid = int((remote_dir / ssh.PID_NAME).read_text())
        # the token reached the server through its environment, never through a command line or a file
        assert b"s3cret" not in pathlib.Path("/proc/%d/cmdline" % pid).read_bytes()
        assert b"TETHER_TOKEN=s3cret-for-bootstrap" in pathlib.Path("/proc/%d/environ" % pid).read_bytes()
        assert not [p for p in remote_dir.iterdir() if b"s3cret" in p.read_bytes()]
    finally:
        stop_process(proc, timeout=10)
    assert proc.returncode == 0
    assert _alive(pid)                          # the tunnel ended, the server did not

    result = CliRunner().invoke(cli, _cli_args(sshd, "--stop", "--remote-dir", str(remote_dir)))
    assert result.exit_code == 0 and "stopped %d" % pid in result.output, result.output
    assert _wait_gone(pid)
    result = CliRunner().invoke(cli, _cli_args(sshd, "--stop", "--remote-dir", str(remote_dir)))
    assert result.exit_code == 0 and ": none" in result.output


def test_a_server_that_cannot_start_is_reported_with_its_log(sshd, device_dir):
    busy = device_dir
    # a token-less server asked to listen beyond loopback refuses to start: bootstrap must say so, not hang
    with pytest.raises(ssh.BootstrapError, match="needs a token"):
        ssh.bootstrap(sshd.host, sshd.user, **_ssh_args(sshd), python=sys.executable, remote_dir=str(busy),
                      bind="0.0.0.0")
    with pytest.raises(ssh.BootstrapError, match="exited during start-up") as info:
        ssh.bootstrap(sshd.host, sshd.user, **_ssh_args(sshd), python=sys.executable, remote_dir=str(busy),
                      remote_port=0, extra_args=["--session-timeout", "not-a-number"])
    assert "session-timeout" in str(info.value)


def test_with_a_tracker_the_device_dials_out_and_serves_through_it(sshd, device_dir, tracker_lab):
    from fixtures.polling import wait_until

    tracker = tracker_lab.tracker()
    remote_dir = device_dir
    result = CliRunner().invoke(cli, _cli_args(sshd, "--python", sys.executable, "--remote-dir", str(remote_dir),
                                               "--remote-port", "0", "--tracker", "127.0.0.1:%d" % tracker.port,
                                               "--key", "ssh-board"))
    assert result.exit_code == 0, result.output
    assert "registered with tracker" in result.output and "rpc.connect" not in result.output   # no tunnel
    pid = int((remote_dir / ssh.PID_NAME).read_text())
    try:
        wait_until(lambda: tracker.count("ssh-board") == 1, 15, "the bootstrapped device to register")
        device = [d for d in tracker.summary()["devices"] if d["key"] == "ssh-board"][0]
        assert device["reverse"]                     # a loopback-bound server dials out to the tracker
        with tracker.client() as t, t.request("ssh-board", wait_timeout=10) as remote:
            assert remote.get_function("tether.echo")("via", "tracker") == ["via", "tracker"]
    finally:
        stopped = CliRunner().invoke(cli, _cli_args(sshd, "--stop", "--remote-dir", str(remote_dir)))
    assert "stopped %d" % pid in stopped.output and _wait_gone(pid)


def test_a_wrong_key_and_a_silent_port_fail_clearly_and_in_bounded_time(sshd):
    with pytest.raises(ssh.BootstrapError, match="authentication failed"):
        ssh.connect(sshd.host, sshd.user, **_ssh_args(sshd, identity=str(sshd.dir / "host_key")))
    with socket.socket() as silent:                # accepts TCP (backlog) but never says a word
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)
        with pytest.raises(TetherTimeout, match="no SSH server answered"):   # the 1 s timeout fired
            ssh.connect("127.0.0.1", sshd.user, **_ssh_args(sshd, port=silent.getsockname()[1], timeout=1.0))


def test_check_only_without_a_python_says_to_install_one(sshd, tmp_path):
    result = CliRunner().invoke(cli, _cli_args(sshd, "--check-only", "--python", str(tmp_path / "no-python3")))
    assert result.exit_code == 1
    assert "no usable python" in result.output and "no-python3" in result.output
    assert "sudo apt-get install python3 python3-numpy python3-msgpack" in result.output


def test_device_check_verdicts_for_an_old_pi_and_a_termux_phone():
    # probe answers as a Raspberry Pi 4 on Debian buster and a Termux phone would send them
    pi4 = {"python": "3.7.3", "numpy": "1.16.2", "msgpack": "0.5.6", "machine": "aarch64", "bits": 64,
           "android": False, "cpuinfo": "processor\t: 0\nCPU implementer\t: 0x41\nCPU part\t: 0xd08"}
    check = ssh._evaluate("aarch64", "python3", pi4, "")
    assert (check.arch, check.suggested_target) == ("aarch64", "rasp4b")
    assert [p.split()[0] for p in check.problems] == ["python", "numpy", "msgpack"]
    assert "python 3.7.3 is too old" in check.problems[0] and check.install_hint.startswith(
        "sudo apt-get install python3 python3-numpy python3-msgpack")
    armhf = dict(pi4, machine="armv7l", bits=32, python="3.9.2", numpy="1.19.5", msgpack="1.0.0")
    check = ssh._evaluate("aarch64", "python3", armhf, "")   # 32-bit userland on a 64-bit kernel
    assert check.ok and check.arch == "armv7"
    phone = dict(pi4, python="3.12.1", numpy=None, numpy_error="ModuleNotFoundError: No module named 'numpy'",
                 msgpack="1.0.8", android=True)
    check = ssh._evaluate("aarch64", "python", phone, "")
    assert check.suggested_target == "android-arm64" and check.problems == [
        "numpy is missing on the device (ModuleNotFoundError: No module named 'numpy'); >= 1.19 is needed"]
    assert check.install_hint == "pkg install python python-numpy && pip install msgpack"
