"""Per-session limits (docs/limits.md): each test crosses one limit on a real forked server over loopback, checks
the clear error, and then uses the session (or, for the call timeout, a new one) to show the server goes on."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from tether import rpc
from tether.errors import LimitExceeded, OutOfMemory, TetherTimeout
from tether_rpc.config import ServerConfigError, config_from_options
from tether_rpc.limits import default_memory, parse_size

TIMEOUT = 30.0


def connect(server):
    return rpc.connect(server.host, server.port, timeout=TIMEOUT)


def test_sizes_take_units():
    assert parse_size("512MB") == 512 * 10 ** 6
    assert parse_size("2GiB") == 2 << 30
    assert parse_size("1.5k") == 1500
    assert parse_size("4096") == 4096
    with pytest.raises(ValueError, match="12 parsecs"):
        parse_size("12 parsecs")
    with pytest.raises(ServerConfigError, match="--session-memory"):
        config_from_options(session_memory="lots")
    with pytest.raises(ServerConfigError, match="--session-handles"):
        config_from_options(session_handles=-3)


def test_defaults_are_finite_and_shown_in_device_info(rpc_server):
    with connect(rpc_server) as remote:
        limits = remote.device_info()["session_limits"]
        assert remote.get_function("tether.echo")(1) == 1
    assert limits == {"memory_bytes": default_memory(), "disk_bytes": 4 << 30, "handles": 65536,
                      "call_timeout_s": 1800.0}


def test_array_memory(make_rpc_server):
    server = make_rpc_server("--session-memory", "64MB")
    n = 10 * 1000 * 1000 // 4          # 10 MB float32 arrays
    with connect(server) as remote:
        assert remote.device_info()["session_limits"]["memory_bytes"] == 64 * 10 ** 6
        held = [remote.empty((n,), "float32") for _ in range(6)]       # 60 MB
        with pytest.raises(OutOfMemory) as info:
            remote.empty((n,), "float32")
        assert isinstance(info.value, MemoryError)
        assert "--session-memory" in str(info.value) and "61.0 MiB" in str(info.value), str(info.value)
        with pytest.raises(OutOfMemory):                                 # a tensor sent with the call, too
            remote.array(np.ones(2 * n, "float32"))
        held.pop().free()
        x = np.random.default_rng(0).standard_normal(n).astype("float32")
        a = remote.array(x)                                              # fits again after a free
        np.testing.assert_array_equal(a.numpy(), x)


def test_upload_bytes(make_rpc_server, tmp_path):
    server = make_rpc_server("--session-disk", "1MB")
    blob = tmp_path / "blob.bin"
    blob.write_bytes(np.random.default_rng(1).bytes(600 * 1000))
    with connect(server) as remote:
        remote.upload(str(blob), "one.bin")
        remote.upload(str(blob), "one.bin")          # replacing a file: its old bytes do not count
        with pytest.raises(LimitExceeded, match="--session-disk") as info:
            remote.upload(str(blob), "two.bin")
        assert "two.bin" in str(info.value)
        assert sorted(remote.listdir()) == ["one.bin"]   # the refused upload left nothing behind
        remote.remove("one.bin")
        remote.upload(str(blob), "two.bin")
        assert remote.download("two.bin") == blob.read_bytes()


def test_open_handles(make_rpc_server):
    server = make_rpc_server("--session-handles", "8")
    with connect(server) as remote:
        arrays = [remote.empty((4,), "float32") for _ in range(8)]
        with pytest.raises(LimitExceeded, match="8 handles.*--session-handles"):
            remote.empty((4,), "float32")
        arrays[0].free()
        b = remote.array(np.arange(4, dtype="float32"))
        np.testing.assert_array_equal(b.numpy(), np.arange(4, dtype="float32"))


# A packed function that spins until its process is stopped (volatile load: LLVM keeps the loop).
SPIN_IR = textwrap.dedent('''\
    @__tether_metadata = constant [{n} x i8] c"{meta}", section ".tether_meta", align 1
    @llvm.used = appending global [1 x ptr] [ptr @__tether_metadata], section "llvm.metadata"
    @cell = global float 2.5
    define i32 @spin(ptr %args, ptr %codes, i32 %num_args) {{
      br label %loop
    loop:
      %v = load volatile float, ptr @cell
      %c = fcmp une float %v, 1.0
      br i1 %c, label %loop, label %done
    done:
      ret i32 0
    }}
    ''')


def _spin_module(path, t=None):
    from tether.codegen.emit import compile_ir
    from tether.link import link_shared
    from tether.target import Target
    t = t or Target("x86_64")
    meta = json.dumps({"abi_version": 1, "tether_version": "0.1.0", "target": t.to_dict(),
                       "requires": t.requirements(),
                       "functions": [{"name": "spin", "args": [], "parallel": False}]}).encode() + b"\0"
    obj, _ = compile_ir(SPIN_IR.format(n=len(meta), meta="".join("\\%02X" % b for b in meta)), t, opt=2)
    link_shared([obj], t, str(path))
    return path


def test_call_timeout_aborts_a_stuck_kernel(make_rpc_server, tmp_path):
    server = make_rpc_server("--call-timeout", "1")
    path = _spin_module(tmp_path / "spin.so")
    with connect(server) as remote:
        remote.upload(str(path))
        spin = remote.load_module("spin.so")["spin"]
        t0 = time.monotonic()
        with pytest.raises(TetherTimeout, match="call timeout of 1.0 s.*--call-timeout") as info:
            spin()
        took = time.monotonic() - t0
    assert 0.9 < took, took     # not before the limit (the message above shows it was the server's timer)
    assert "session has ended" in str(info.value)
    assert server.alive
    with connect(server) as remote:        # a new session works, and calls within the limit are untouched
        x = np.arange(8, dtype="float32")
        np.testing.assert_array_equal(remote.array(x).numpy(), x)
        assert remote.get_function("tether.echo")("after") == "after"
    assert server.alive


_BACKSTOP = textwrap.dedent('''\
    import numpy as np
    from tether_rpc import limits, ndarray
    from tether_rpc.errors import OutOfMemory
    cap = limits.apply_memory_backstop(limits.SessionLimits(memory=64 << 20))
    small = ndarray.empty((1 << 20,), "float32")      # within the budget: fine
    try:
        ndarray.empty((1 << 30,), "float32")          # 4 GiB, far past budget + slack
    except OutOfMemory as exc:
        print("refused", cap > 0, "cannot allocate" in str(exc))
    ''')


def test_memory_nobody_accounted_fails_in_the_worker_not_by_the_oom_killer():
    """The RLIMIT_DATA backstop a session worker sets: memory past the budget (+ slack) is a MemoryError
    (OutOfMemory) in that process."""
    out = subprocess.run([sys.executable, "-c", _BACKSTOP], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["refused", "True", "True"], out.stdout + out.stderr


@pytest.mark.emulated
def test_limits_on_an_emulated_arm_device(emulated_devices, emulated_bundle, tmp_path):
    """The same call timeout (SIGALRM from setitimer, as qemu-user delivers it to the guest) and handle limit on
    the device server running under qemu-aarch64 from the zipapp."""
    from tether import emulate
    from tether.target import Target
    userland = emulated_devices.userland("aarch64")
    path = tmp_path / "spin_a64.so"
    _spin_module(path, Target("rasp4b"))
    with emulate.EmulatedDevice(userland, bundle=emulated_bundle, startup_timeout=120.0,
                                extra_args=["--call-timeout", "3", "--session-handles", "4"]) as device:
        pid = device.pid
        with rpc.connect(*device.address, timeout=120) as remote:
            assert remote.device_info()["session_limits"]["handles"] == 4
            remote.upload(str(path))
            spin = remote.load_module(path.name)["spin"]                 # 2 handles: module, function
            keep = [remote.empty((4,), "float32") for _ in range(2)]
            with pytest.raises(LimitExceeded, match="--session-handles"):
                remote.empty((4,), "float32")
            keep[0].free()
            with pytest.raises(TetherTimeout, match="call timeout of 3.0 s"):
                spin()
        with rpc.connect(*device.address, timeout=120) as remote:
            assert remote.get_function("tether.echo")("next") == "next"
        assert device.alive() and device.pid == pid
