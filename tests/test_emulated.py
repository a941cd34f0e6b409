"""End to end on emulated ARM devices: cross-compile on the host, ship to a Debian userland under qemu-user, run
there, compare with numpy on the host. Boards: rasp4b = aarch64 on cortex-a72; rasp3b = armv7 on qemu-arm's
ARMv8 AArch32 "max" CPU (a Pi 3 runs its Cortex-A53 in 32-bit mode; rasp3b code uses ARMv8 A32 instructions);
armv7-a7 = armv7 on cortex-a7.

The device servers come from tests/fixtures/emulated.py: one per board per session, started from the zipapp.
Emulated timings are not performance figures; only their presence and shape are checked.
"""
from __future__ import annotations

import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import textwrap
import time
import zipfile

import numpy as np
import pytest

from fixtures.polling import HANG_S
from fixtures.schedules import elementwise
from tether import emulate
from tether.errors import ArchMismatch, ConnectionClosed, DeviceBusy, SessionCrashed

pytestmark = [pytest.mark.emulated]

SESSION_TIMEOUT = 120.0   # emulation is 6-80x slower than native; every wait is still bounded


def connect(device):
    from tether import rpc
    return rpc.connect(*device.address, timeout=SESSION_TIMEOUT)


# ---------------------------------------------------------------------------------------------------------------
# kernels: (build(target) -> (schedule, args), inputs(rng) -> list of arrays, reference(inputs) -> expected output)

def _vadd(target):
    return elementwise(4096, lambda a, b: a + b, factor=512, lanes=4)


def _with_default_schedule(make):
    def build(target):
        from tether import ops
        ins, out = make()
        return ops.schedule([out], target=target), [*ins, out]
    return build


def _matmul():
    from tether import ops, te
    X = te.placeholder((24, 40), "float32", name="X")
    W = te.placeholder((40, 36), "float32", name="W")
    return [X, W], ops.matmul(X, W)


def _conv2d():
    from tether import ops, te
    x = te.placeholder((1, 3, 12, 12), "float32", name="x")
    w = te.placeholder((8, 3, 3, 3), "float32", name="w")
    return [x, w], ops.conv2d(x, w, padding=1)


def _softmax():
    from tether import ops, te
    x = te.placeholder((6, 37), "float32", name="x")
    return [x], ops.softmax(x, axis=-1)


def _row_sum():
    from tether import ops, te
    x = te.placeholder((7, 129), "float32", name="x")
    return [x], ops.sum(x, axis=1)


def _conv2d_ref(x, w):
    n, c, h, wd = x.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    out = np.zeros((n, w.shape[0], h, wd))
    for ky in range(3):
        for kx in range(3):
            out += np.einsum("nchw,oc->nohw", xp[:, :, ky:ky + h, kx:kx + wd], w[:, :, ky, kx])
    return out


def _softmax_ref(x):
    e = np.exp(x.astype(np.float64) - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


KERNELS = {
    "vadd": (_vadd, lambda r: [r.standard_normal(4096), r.standard_normal(4096)], lambda a, b: a + b),
    "matmul": (_with_default_schedule(_matmul), lambda r: [r.standard_normal((24, 40)), r.standard_normal((40, 36))],
               lambda x, w: x.astype(np.float64) @ w),
    "conv2d": (_with_default_schedule(_conv2d),
               lambda r: [r.standard_normal((1, 3, 12, 12)), r.standard_normal((8, 3, 3, 3))], _conv2d_ref),
    "softmax": (_with_default_schedule(_softmax), lambda r: [4 * r.standard_normal((6, 37))], _softmax_ref),
    "row_sum": (_with_default_schedule(_row_sum), lambda r: [r.standard_normal((7, 129))],
                lambda x: x.astype(np.float64).sum(axis=1)),
}


class KernelCache:
    """Cross-compiled libraries, each built once per test module (per kernel and target)."""

    def __init__(self, folder: pathlib.Path):
        self.folder = folder
        self._built: dict = {}

    def get(self, kernel: str, target: str):
        key = (kernel, target)
        if key not in self._built:
            import tether
            build, _, _ = KERNELS[kernel]
            s, args = build(target)
            lib = tether.build(s, args, target=target, name=kernel)
            path = self.folder / ("%s_%s.so" % (kernel, target))
            lib.export_library(str(path))
            self._built[key] = (path, lib, args)
        return self._built[key]


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    return KernelCache(tmp_path_factory.mktemp("emulated-kernels"))


def _arch_of(device) -> str:
    return device.userland.spec.name


# Instructions of ARMv8-A AArch32 that ARMv7-A (Cortex-A7) lacks.
# (lda*/stl*: the ARMv8 acquire/release loads and stores LLVM uses for the native pool's atomics on rasp3b)
ARMV8_ONLY = re.compile(r"\t(vsel\w+|vrint\w\.\w+|vmaxnm\.\w+|vminnm\.\w+|vcvt[anpm]\.\w+|crc32\w*|aes\w+|sha\w+"
                        r"|lda\w*|stl\w*)\b")


# ---------------------------------------------------------------------------------------------------------------
# raw modules for crash tests: a packed function written directly in LLVM IR, with tether metadata, linked by
# tether's linker into the same kind of self-contained .so tether.build makes.

def raw_module(path: pathlib.Path, target: str, name: str, body: str, decls: str = "") -> str:
    """Compile and link a one-function tether module from an LLVM IR body; returns the assembly."""
    from tether.codegen.emit import compile_ir
    from tether.link import link_shared
    from tether.target import Target
    t = Target(target)
    meta = json.dumps({"abi_version": 1, "tether_version": "0.1.0", "target": t.to_dict(),
                       "functions": [{"name": name, "args": [], "parallel": False}]}).encode() + b"\0"
    ir = textwrap.dedent('''\
        @__tether_metadata = constant [{n} x i8] c"{meta}", section ".tether_meta", align 1
        @llvm.used = appending global [1 x ptr] [ptr @__tether_metadata], section "llvm.metadata"
        @cell = global float 2.5
        {decls}
        define i32 @{name}(ptr %args, ptr %codes, i32 %num_args) {{
        {body}
        }}
        ''').format(n=len(meta), meta="".join("\\%02X" % b for b in meta), decls=decls, name=name, body=body)
    obj, asm = compile_ir(ir, t, opt=2)
    link_shared([obj], t, str(path))
    return asm


# A write to address 8: under qemu-user null *reads* may not fault, writes do.
SEGFAULT_BODY = "  %p = inttoptr {int} 8 to ptr\n  store volatile i32 1, ptr %p\n  ret i32 0"
# Spins until the session is killed (volatile load: the loop has a side effect, so LLVM keeps it).
SPIN_BODY = ("  br label %loop\nloop:\n  %v = load volatile float, ptr @cell\n"
             "  %c = fcmp une float %v, 1.0\n  br i1 %c, label %loop, label %done\ndone:\n  ret i32 0")
# llvm.floor is one vrintm.f32 on ARMv8 (FP-ARMv8); Cortex-A7 (ARMv7 VFPv4) has no such instruction.
FLOOR_BODY = ("  %x = load volatile float, ptr @cell\n  %y = call float @llvm.floor.f32(float %x)\n"
              "  store volatile float %y, ptr @cell\n  ret i32 0")
FLOOR_DECL = "declare float @llvm.floor.f32(float)"


def _readline(stream, deadline: float) -> str:
    """One line from a child's pipe, or "" if none arrives before ``deadline`` (or the pipe closes)."""
    import select
    remaining = deadline - time.monotonic()
    if remaining <= 0 or not select.select([stream], [], [], remaining)[0]:
        return ""
    return stream.readline()


def _server_alive_and_serving(device, pid_before: int) -> None:
    assert device.alive(), "the emulated server died:\n" + device.output[-2000:]
    assert device.pid == pid_before, "the emulated server was restarted"
    with connect(device) as remote:
        assert remote.get_function("tether.echo")(41, "next") == [41, "next"]


def _crash_ends_only_its_session(device, path, fn: str, signal_name: str) -> None:
    """Calling ``fn`` of the module at ``path`` kills the session with ``signal_name``; the server lives on."""
    pid = device.pid
    with connect(device) as remote:
        remote.upload(str(path))
        f = remote.load_module(path.name)[fn]
        with pytest.raises(SessionCrashed) as info:
            f()
    assert signal_name in str(info.value)
    _server_alive_and_serving(device, pid)


# ---------------------------------------------------------------------------------------------------------------
# the userland and the device package


def _without_extras(stamp: dict) -> dict:
    return {k: v for k, v in stamp.items() if k != "extras"}


def test_userland_is_cached_and_fixed_up(emulated_devices):
    for arch in ("aarch64", "armv7"):
        userland = emulated_devices.userland(arch)
        again = emulate.ensure_userland(arch)
        # Extras (e.g. the JRE another test adds) extend the stamp of a cached userland; they never rebuild it,
        # so the build record must be unchanged and extras only ever added, whatever ran before this test.
        assert _without_extras(again.stamp) == _without_extras(userland.stamp), \
            "a second ensure_userland rebuilt the userland"
        assert set(userland.stamp.get("extras") or {}) <= set(again.stamp.get("extras") or {}), \
            "a second ensure_userland dropped an extra"
        stamp = userland.stamp
        assert stamp["machine"] == userland.spec.uname_machine
        assert stamp["python_version"].startswith("3.") and stamp["numpy_version"]
        libdir = userland.rootfs / "usr" / "lib" / userland.spec.multiarch
        for lib in ("libblas.so.3", "liblapack.so.3"):
            link = libdir / lib
            assert link.exists(), "%s is missing or dangling" % link
            assert not os.readlink(link).startswith("/"), "an absolute link would resolve on the host under -L"
        assert not (userland.rootfs / "tmp").exists(), "the rootfs /tmp must be gone so the guest uses the host's"
        version = os.readlink(userland.python).rsplit("python", 1)[-1]
        pycache = userland.rootfs / "usr" / "lib" / ("python" + version) / "__pycache__"
        assert any(pycache.glob("os.cpython-*.pyc")), "the stdlib was not byte-compiled"
        assert any((userland.rootfs / "usr/lib/python3/dist-packages/numpy/__pycache__").glob("*.pyc"))


def test_missing_tools_give_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))   # no qemu, no mmdebstrap on this PATH
    with pytest.raises(emulate.EmulatorUnavailable) as info:
        emulate.ensure_userland("armv7", cache=tmp_path / "cache")
    msg = str(info.value)
    assert "qemu-arm" in msg and "mmdebstrap" in msg and "apt-get install" in msg and "qemu-user" in msg
    assert not (tmp_path / "cache" / "armv7" / "rootfs").exists()


def test_bundle_holds_the_device_package_alone(emulated_bundle, emulated_devices):
    with zipfile.ZipFile(emulated_bundle) as zf:
        names = zf.namelist()
    assert "__main__.py" in names and "tether_rpc/__init__.py" in names
    assert all(n == "__main__.py" or n.startswith("tether_rpc/") for n in names), names
    assert emulated_bundle.read_bytes().startswith(b"#!/usr/bin/env python3\n")
    # Debian's python3 in the userland runs it with its own numpy/msgpack, and has no host package at all.
    userland = emulated_devices.userland("armv7")
    code = ("import sys; sys.path.insert(0, %r); import tether_rpc, numpy, msgpack\n"
            "try:\n    import tether\nexcept ImportError:\n    print('no-host-package')\n"
            "print(tether_rpc.__file__)") % str(emulated_bundle)
    out = userland.run_python(["-E", "-s", "-c", code], timeout=SESSION_TIMEOUT).stdout
    assert "no-host-package" in out and str(emulated_bundle) in out


def test_cli_list_and_bundle(tmp_path):
    from click.testing import CliRunner
    from tether.cli.main import cli
    runner = CliRunner()
    listed = runner.invoke(cli, ["emulate", "--list"])
    assert listed.exit_code == 0, listed.output
    assert "aarch64" in listed.output and "armv7" in listed.output
    out = tmp_path / "dev.pyz"
    made = runner.invoke(cli, ["bundle", "-o", str(out)])
    assert made.exit_code == 0, made.output
    with zipfile.ZipFile(out) as zf:
        assert "tether_rpc/server.py" in zf.namelist()


def test_cli_emulate_runs_in_the_foreground(emulated_devices):
    """`tether emulate` prints where it listens, serves, and stops its server on SIGTERM."""
    emulated_devices.userland("aarch64")   # built (or skipped/failed) by the fixture, not by the CLI
    from tether import rpc
    argv = [sys.executable, "-c", "from tether.cli.main import cli; cli()", "emulate", "--arch", "aarch64",
            "--port", "0"]
    proc = subprocess.Popen(argv,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + SESSION_TIMEOUT
        line = ""
        while "listening on" not in line:
            line = _readline(proc.stdout, deadline)
            if not line:
                break
        assert "listening on 127.0.0.1:" in line, "no listening line; exit code %s" % proc.poll()
        port = int(line.split("listening on 127.0.0.1:")[1].split()[0])
        with rpc.connect("127.0.0.1", port, timeout=SESSION_TIMEOUT) as remote:
            assert remote.device_info()["arch"] == "aarch64"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        with pytest.raises(ConnectionClosed, match="127.0.0.1:%d" % port):  # refused: nothing listens any more
            rpc.connect("127.0.0.1", port, timeout=2).close()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        proc.stdout.close()


# ---------------------------------------------------------------------------------------------------------------
# the emulated devices


def test_device_info_reports_the_arch(emulated_device):
    arch = _arch_of(emulated_device)
    with connect(emulated_device) as remote:
        info = remote.device_info()
    assert info["arch"] == arch
    assert info["machine"] == emulated_device.userland.spec.uname_machine
    assert info["pointer_bits"] == (64 if arch == "aarch64" else 32)
    assert info["numpy"] == emulated_device.userland.stamp["numpy_version"]   # Debian's numpy, not the host's


@pytest.mark.parametrize("kernel", sorted(KERNELS))
def test_cross_compiled_kernel_matches_numpy(emulated_target_device, kernels, kernel):
    device = emulated_target_device
    arch = _arch_of(device)
    path, lib, args = kernels.get(kernel, device.preset)
    _, make_inputs, reference = KERNELS[kernel]
    rng = np.random.default_rng(sorted(KERNELS).index(kernel))
    inputs = [np.ascontiguousarray(a, dtype="float32") for a in make_inputs(rng)]
    out_t = args[-1]
    expected = reference(*inputs)
    with connect(device) as remote:
        remote.upload(str(path))
        mod = remote.load_module(path.name)
        assert mod.metadata["target"]["arch"] == arch
        f = mod[kernel]
        dev_in = [remote.array(a) for a in inputs]
        dev_out = remote.empty(tuple(int(d) for d in out_t.shape), str(out_t.dtype))
        f(*dev_in, dev_out)
        got = dev_out.numpy()
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=2e-5, atol=2e-5 if kernel != "conv2d" else 1e-4)


@pytest.mark.parametrize("preset", ["rasp4b", "rasp3b", "armv7-a7"])
def test_vadd_is_vectorized_and_parallel(kernels, preset):
    from tether_rpc.elf import read_elf
    path, lib, _ = kernels.get("vadd", preset)
    with read_elf(str(path)) as elf:
        raw = elf.section_data(elf.section(".tether_meta"))
    meta = json.loads(raw[:raw.index(b"\0")])
    (fn,) = meta["functions"]
    assert fn["parallel"] is True and meta["target"]["preset"] == preset
    asm = lib.get_source("asm")
    vector_add = "fadd\tv" if meta["target"]["arch"] == "aarch64" else "vadd.f32\tq"
    assert vector_add in asm, "no NEON float32x4 add in the %s assembly" % preset


def test_time_evaluator_returns_samples(emulated_device, kernels):
    path, _, _ = kernels.get("vadd", emulated_device.preset)
    with connect(emulated_device) as remote:
        remote.upload(str(path))
        f = remote.load_module(path.name)["vadd"]
        a, b = remote.array(np.ones(4096, "float32")), remote.array(np.full(4096, 2, "float32"))
        c = remote.empty((4096,), "float32")
        res = f.time_evaluator(number=4, repeat=3, min_repeat_ms=0)(a, b, c)
        assert np.array_equal(c.numpy(), np.full(4096, 3, "float32"))
    assert len(res.samples) == 3
    assert all(np.isfinite(s) and s > 0 for s in res.samples)
    assert res.min <= res.median <= res.max


def test_wrong_arch_module_is_refused(emulated_device, kernels):
    arch = _arch_of(emulated_device)
    other, other_preset = ("armv7", "rasp3b") if arch == "aarch64" else ("aarch64", "rasp4b")
    path, _, _ = kernels.get("vadd", other_preset)
    with connect(emulated_device) as remote:
        remote.upload(str(path))
        with pytest.raises(ArchMismatch) as info:
            remote.load_module(path.name)
        assert remote.get_function("tether.echo")("still here") == "still here"
    msg = str(info.value)
    assert other in msg and arch in msg, msg


def test_segfaulting_kernel_ends_only_its_session(emulated_device, tmp_path):
    arch = _arch_of(emulated_device)
    path = tmp_path / ("segv_%s.so" % arch)
    raw_module(path, emulated_device.preset, "segv", SEGFAULT_BODY.format(int="i64" if arch == "aarch64" else "i32"))
    _crash_ends_only_its_session(emulated_device, path, "segv", "SIGSEGV")


_KILLED_CLIENT = textwrap.dedent('''\
    import sys
    from tether import rpc
    remote = rpc.connect("127.0.0.1", int(sys.argv[1]), timeout=600)
    remote.upload(sys.argv[2])
    f = remote.load_module(sys.argv[2].rsplit("/", 1)[-1])["spin"]
    print("calling", flush=True)
    f()
    ''')


def test_client_killed_mid_call_frees_the_device(emulated_device, tmp_path):
    arch = _arch_of(emulated_device)
    path = tmp_path / ("spin_%s.so" % arch)
    raw_module(path, emulated_device.preset, "spin", SPIN_BODY)
    pid = emulated_device.pid
    client = subprocess.Popen([sys.executable, "-c", _KILLED_CLIENT, str(emulated_device.port), str(path)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = _readline(client.stdout, time.monotonic() + SESSION_TIMEOUT)
        assert line.strip() == "calling", client.stderr.read() if client.poll() is not None else line
        time.sleep(0.5)                     # the kernel is spinning on the device now
        assert client.poll() is None, "the spinning call returned"
    finally:
        client.kill()
        client.wait(timeout=10)
        client.stdout.close()
        client.stderr.close()
    from tether import rpc
    # wait=False: a device still busy with the dead client's session refuses instead of queueing us. The kernel
    # spins until its session is killed, so a free device at all means the server ended the dead client's session.
    deadline = time.monotonic() + HANG_S
    while True:
        try:
            remote = rpc.connect(*emulated_device.address, timeout=SESSION_TIMEOUT, wait=False)
            break
        except DeviceBusy:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    with remote:
        assert remote.get_function("tether.echo")(1, 2) == [1, 2]
    _server_alive_and_serving(emulated_device, pid)


def test_armv8_32bit_module_dies_with_sigill_on_cortex_a7(emulated_cortex_a7, tmp_path):
    """Code for a Cortex-A53 in 32-bit mode (ARMv8-A AArch32) may use instructions a Cortex-A7 lacks: a module
    without metadata "requires" (as built before it existed) loads, the kernel dies with SIGILL, the session ends
    with a clear error, and the device server lives on."""
    device = emulated_cortex_a7
    assert device.cpu == "cortex-a7"
    path = tmp_path / "floor_a53.so"
    asm = raw_module(path, "armv7a-linux-gnueabihf -mcpu=cortex-a53", "floor_v8", FLOOR_BODY, FLOOR_DECL)
    assert "vrintm.f32" in asm, "expected an ARMv8-only rounding instruction in:\n" + asm
    _crash_ends_only_its_session(device, path, "floor_v8", "SIGILL")


def test_target_choice_matters_on_cortex_a7(emulated_cortex_a7, kernels):
    """The same softmax, built for rasp3b (Cortex-A53, ARMv8 AArch32) and for armv7-a7 (Cortex-A7), on a
    Cortex-A7: the armv7-a7 build is right; the rasp3b build, whose code may use ARMv8-only instructions, is
    refused at load with ArchMismatch (before the change it died with SIGILL)."""
    device = emulated_cortex_a7
    x = np.random.default_rng(7).standard_normal((6, 37)).astype("float32") * 4
    expected = _softmax_ref(x)
    pid = device.pid
    for preset in ("armv7-a7", "rasp3b"):
        path, lib, _ = kernels.get("softmax", preset)
        v8 = sorted(set(ARMV8_ONLY.findall(lib.get_source("asm"))))
        if preset == "armv7-a7":
            assert not v8, "armv7-a7 code must be plain ARMv7-A, found %s" % v8
        with connect(device) as remote:
            remote.upload(str(path))
            if preset == "rasp3b":
                # refused at load (metadata "requires": ARMv8), before any ARMv8-only instruction can run
                with pytest.raises(ArchMismatch, match="ARMv8"):
                    remote.load_module(path.name)
                assert remote.get_function("tether.echo")("on") == "on"
                continue
            f = remote.load_module(path.name)["softmax"]
            out = remote.empty((6, 37), "float32")
            f(remote.array(x), out)
            np.testing.assert_allclose(out.numpy(), expected, rtol=2e-5, atol=2e-6)
    _server_alive_and_serving(device, pid)


# qemu-user 7.2 (Debian bookworm) aborts a forked child of a multi-threaded process as soon as the child starts a
# thread (plugins/core.c:221 / cpu-exec.c:954 assertions, exit 127): this test guards that the device server's
# tracker link (tether_rpc.registrar) keeps the forking parent single-threaded.
def test_emulated_device_registers_with_a_tracker(emulated_devices, tracker_lab):
    """`tether emulate --tracker HOST:PORT --key KEY`: the emulated board joins a tracker's pool like a real one."""
    from fixtures.polling import wait_until
    userland = emulated_devices.userland("aarch64")
    tracker = tracker_lab.tracker()
    key = "rasp4b-emulated"
    with emulate.EmulatedDevice(userland, tracker="127.0.0.1:%d" % tracker.port, key=key,
                                bundle=emulated_devices.bundle_path) as device:
        wait_until(lambda: tracker.count(key) > 0 or not device.alive(), SESSION_TIMEOUT, "the emulated device to "
                   "register")
        assert device.alive(), device.output
        with tracker.client() as client, client.request(key, wait_timeout=SESSION_TIMEOUT) as remote:
            assert remote.device_info()["arch"] == "aarch64"


# ---------------------------------------------------------------------------------------------------------------
# the native thread pool (codegen/threadpool.py) on emulated ARM: futex and sched_yield through the module's own
# system-call stub, worker threads started by the guest Python

NATIVE_POOL_GUEST = """
import sys
sys.path.insert(0, sys.argv[1])
import numpy as np
from tether_rpc import module, parallel
folder, preset, arch = sys.argv[2], sys.argv[3], sys.argv[4]
parallel.set_num_threads(2)
m = module.load_module("%s/pool_%s.so" % (folder, preset))
pool = parallel.native_pool()
assert pool is not None and pool.num_workers == 1, "the tether module must provide the native pool"
a = np.load(folder + "/a.npy"); b = np.load(folder + "/b.npy"); c = np.zeros_like(a)
for spin in (0, 10000):           # every launch through the futex wake-up, then through the spinning worker
    parallel.set_pool_spin(spin)
    for _ in range(25):
        c[:] = 0
        m["pool_ew"](a, b, c)
np.save(folder + "/c_%s.npy" % preset, c)
# a hand-written module (no pool of its own) gets the provider's launcher: task 0 waits until another thread
# has finished a task, so this only returns if the native pool runs a second thread
p = module.load_module("%s/par_%s.so" % (folder, arch))
counts = np.zeros(64, "int32"); tids = np.zeros(64, "int64")
p["mark"](counts, tids, 1)
assert (counts == 1).all(), counts
assert len(set(tids.tolist())) == 2, tids
assert not parallel._task_cache, "the Python launcher must not have run"
parallel.set_num_threads(1)
assert pool.num_workers == 0
print("NATIVE-POOL-OK")
"""


@pytest.mark.parametrize("preset", ["rasp4b", "armv7-a7"])
def test_native_pool_runs_a_parallel_kernel_on_two_threads(emulated_devices, tmp_path, preset):
    """aarch64 and armv7: a tether kernel through the native pool at 2 threads matches numpy, under qemu-user."""
    import tether
    from kernels import build_kernel_for
    from tether_rpc import module as runtime_module
    arch, cpu = emulate.preset_device(preset)
    userland = emulated_devices.userland(arch)
    n = 1 << 16
    s, args = elementwise(n, lambda a, b: a * b + a * 0.5, factor=1024, lanes=4)
    lib = tether.build(s, args, target=preset, name="pool_ew")
    assert lib.metadata["thread_pool"] == 1
    lib.export_library(str(tmp_path / ("pool_%s.so" % preset)))
    build_kernel_for("par", arch, tmp_path)
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal(n).astype("float32"), rng.standard_normal(n).astype("float32")
    np.save(tmp_path / "a.npy", a)
    np.save(tmp_path / "b.npy", b)
    script = tmp_path / "native_pool_guest.py"
    script.write_text(NATIVE_POOL_GUEST)
    rpc_server = pathlib.Path(runtime_module.__file__).resolve().parent.parent
    proc = userland.run_python([str(script), str(rpc_server), str(tmp_path), preset, arch], cpu=cpu, timeout=300,
                               check=False)
    assert proc.returncode == 0 and "NATIVE-POOL-OK" in proc.stdout, proc.stderr[-3000:]
    np.testing.assert_allclose(np.load(tmp_path / ("c_%s.npy" % preset)), a * b + a * np.float32(0.5),
                               rtol=1e-6, atol=1e-6)
