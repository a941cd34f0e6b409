"""A crashing kernel in a session run in the Java server's own process (`--isolation thread`, what the Android
app runs): the bridge's signal handler writes ERROR SessionCrashed (request id 0, the signal named, as rpc-server
sends for a crashed worker) to the client before the process dies by the signal; the JVM's own uses of SIGSEGV
(implicit null checks, stack banging) still reach HotSpot's handler. Real JVMs, real sockets, a gcc-built kernel
that writes to an unmapped address.
"""
from __future__ import annotations

import signal
import subprocess
import textwrap

import numpy as np
import pytest

from fixtures.java_device import start_java_device
from tether import rpc
from tether_rpc import errors


def test_a_segfaulting_kernel_in_process_gives_session_crashed(java_device_build, tmp_path, rpc_kernels):
    server = start_java_device(java_device_build, tmp_path, "--isolation", "thread")
    try:
        assert "sessions in this process" in server.log_text()
        a = np.arange(1024, dtype=np.float32)
        with rpc.connect(server.host, server.port, timeout=20) as remote:
            remote.upload(rpc_kernels["vadd"])
            remote.upload(rpc_kernels["misc"])
            vadd = remote.load_module("vadd.so")["vadd"]
            for i in range(50):   # many ordinary calls and remote errors first: Java code paths run as usual
                c = np.zeros(1024, np.float32)
                vadd(a, a + i, c)
                np.testing.assert_array_equal(c, a + a + i)
                with pytest.raises(errors.RemoteError, match="shape"):   # a bad argument: KernelError
                    vadd(a[:256], a[:256], c[:256])
                assert remote.get_function("tether.echo")({"i": [i, None]}) == {"i": [i, None]}
            crash = remote.load_module("misc.so")["crash"]
            with pytest.raises(errors.SessionCrashed, match=r"SIGSEGV \(11\)"):
                crash()
            assert remote.closed
        # the session ran in the server's process: it died by the signal (on Android a watchdog restarts it)
        assert server.proc.wait(10) == -signal.SIGSEGV
    finally:
        server.stop()


PROBE = textwrap.dedent("""
    import dev.tether.device.NativeBridge;

    public class CrashProbe {
        static final class Box { int v; }
        static int depth;

        static int read(Box b) { return b.v; }

        static void recurse() { depth++; recurse(); }

        public static void main(String[] args) {
            NativeBridge.load(args[0]);
            if (!NativeBridge.installCrashHandler()) throw new AssertionError("no handler");
            Box box = new Box();
            long sum = 0;
            for (int i = 0; i < 200000; i++) sum += read(box);   // compiled with an implicit null check
            int npes = 0;
            for (int i = 0; i < 1000; i++) {
                try { sum += read(i % 2 == 0 ? null : box); } catch (NullPointerException e) { npes++; }
            }
            int overflows = 0;
            for (int i = 0; i < 3; i++) {
                depth = 0;
                try { recurse(); } catch (StackOverflowError e) { overflows++; }
            }
            System.out.println("npes=" + npes + " overflows=" + overflows + " chained="
                    + NativeBridge.chainedSignals() + " sum=" + sum);
        }
    }
""")


def test_the_jvms_own_sigsegv_still_reaches_hotspot(java_device_build, tmp_path):
    # the server's first start builds the classes and the bridge into java_device_build
    start_java_device(java_device_build, tmp_path, "--isolation", "thread").stop()
    classes = java_device_build / "device-classes"
    bridge = java_device_build / "bridge" / "x86_64"
    (tmp_path / "CrashProbe.java").write_text(PROBE)
    subprocess.run(["javac", "-cp", str(classes), "-d", str(tmp_path), str(tmp_path / "CrashProbe.java")],
                   check=True, timeout=120)
    out = subprocess.run(["java", "-Xss512k", "-cp", "%s:%s" % (classes, tmp_path), "CrashProbe", str(bridge)],
                         capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    fields = dict(kv.split("=") for kv in out.stdout.split())
    assert int(fields["npes"]) == 500 and int(fields["overflows"]) == 3
    assert int(fields["sum"]) == 0
    # HotSpot took SIGSEGV for those (implicit null checks in compiled code, the stack's guard pages), and each
    # one went through the bridge's handler on to HotSpot's
    assert int(fields["chained"]) >= 3, out.stdout   # at least the stack overflows (guard pages always fault)


def test_a_segfaulting_aarch64_kernel_in_process_under_qemu(emulated_devices, java_device_build, tmp_path):
    # the aarch64 bridge in an aarch64 JVM (qemu-user delivers the guest's SIGSEGV to the guest's handlers)
    from test_java_emulated import aarch64_misc_kernels, start_aarch64_java_device

    misc = aarch64_misc_kernels(tmp_path)
    server = start_aarch64_java_device(emulated_devices, java_device_build, tmp_path, "--isolation", "thread")
    try:
        with rpc.connect(server.host, server.port, timeout=120) as remote:
            assert remote.get_function("tether.echo")("before") == "before"
            remote.upload(misc)
            crash = remote.load_module("misc.so")["crash"]
            with pytest.raises(errors.SessionCrashed, match=r"SIGSEGV \(11\)"):
                crash()
        assert server.proc.wait(60) != 0
    finally:
        server.stop()


# A module with a native pool whose worker faults once told to: the fault happens on a pool thread the bridge
# started, never on the session's thread (a real tether pool claims tasks dynamically, so which thread ran the
# faulting task would be chance). The packed function waits for the worker, up to 10 s.
POOL_MODULE = r"""
#include "tether_abi.h"
TETHER_META("{\"abi_version\": 1, \"tether_version\": \"0.1.0\", \"thread_pool\": 1, "
            "\"target\": {\"arch\": \"" TETHER_ARCH "\", \"preset\": \"test\"}, \"functions\": ["
            "{\"name\": \"fault_in_pool\", \"args\": [], \"parallel\": false}]}");

static volatile int armed, stop;

TETHER_EXPORT int32_t tether_pool_launch(void *task, void *closure, int32_t n) { return -1; }
TETHER_EXPORT void tether_pool_shutdown(void) { stop = 1; }
/* No libc (-nostdlib), so no sleep: the worker spins until armed, bounded by minutes (the server is stopped by
   PID after the test). A bound of a few seconds ran out on a loaded CI machine before the call armed it, and
   the call then returned 0 with no fault. */
TETHER_EXPORT void tether_pool_worker(void) {
  for (volatile long i = 0; !stop && i < 300000000000L; ++i) {
    if (armed) {
      volatile uintptr_t addr = 16;  /* unmapped */
      *(volatile int32_t *)addr = 42;
    }
  }
}
TETHER_EXPORT int32_t fault_in_pool(const TetherValue *args, const int32_t *codes, int32_t n) {
  armed = 1;
  for (volatile long i = 0; i < 10000000000L; ++i) {   /* the worker faults meanwhile; ~10 s bounds it */
  }
  return 0;
}
"""


def test_a_fault_on_a_native_pool_thread(java_device_build, tmp_path):
    import shutil

    from kernels import GCC_FLAGS, KERNEL_DIR

    (tmp_path / "pool.c").write_text(POOL_MODULE)
    subprocess.run([shutil.which("gcc"), *GCC_FLAGS, "-I", str(KERNEL_DIR), str(tmp_path / "pool.c"), "-o",
                    str(tmp_path / "pool.so"), "-Wl,--no-undefined"], check=True, timeout=60)
    server = start_java_device(java_device_build, tmp_path, "--isolation", "thread",
                               env_extra={"TETHER_NUM_THREADS": "2"})
    try:
        with rpc.connect(server.host, server.port, timeout=20) as remote:
            remote.upload(tmp_path / "pool.so")
            mod = remote.load_module("pool.so")
            assert remote.get_function("tether.device_info")()["parallel_threads"] == 2
            with pytest.raises(errors.SessionCrashed, match=r"SIGSEGV \(11\)"):
                mod["fault_in_pool"]()
        assert server.proc.wait(10) == -signal.SIGSEGV
    finally:
        server.stop()
