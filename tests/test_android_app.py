"""The Android app as a tether device (android_app/app): its Android-free logic on a desktop JVM, and the APK.

* ``AppLogicRunner`` (android_app/app/tests) checks ``Settings`` (stored form, the adb intent extras, the device
  server configuration through ``DeviceConfig.fromArgs`` itself), ``Backoff`` and ``DeviceState`` (the status
  line and the wake-lock decision) and ``RestartPolicy`` (the watchdog: at once after a
  session crash, backoff only in a start-up crash loop), compiled with ``javac --release 8`` together with the
  real protocol and device-server sources: no Android classes are needed, so none are stubbed.
* ``SupervisorRunner`` hosts ``DeviceSupervisor`` (the service's start-retry loop) with the real device server on a
  desktop JVM: a listen port held by another socket gives "retrying" with growing delays, freeing it brings
  the server up, a real tether client's session turns the wake-lock decision on and off and shows its last call
  in the status line, and "stop" ends it all.
* ``tools/align_apk.py`` is checked on zips built here: stored native libraries land on 16 KiB, contents and
  compression are kept, and the checker names what is misaligned.
* The APK is built offline by ``build_apk.sh`` and taken apart: the manifest (``aapt2 dump xmltree``) has the
  device service in the ":device" process with its foreground-service type, the watchdog in the UI process, the
  permissions and extracted native libraries; the dex holds the app, the device server and the protocol; both
  ABIs' ``libtether_bridge.so`` are ELF files of the right machine, 16 KiB-aligned in the zip and in their
  segments; the signature verifies.

What cannot run here (no phone, no emulator): the UI, the service's start, wake lock, notification, the crash
restart within 2 s. docs/android.md says what was verified only by building and inspection.
"""
from __future__ import annotations

import pathlib
import platform
import queue
import re
import socket
import struct
import subprocess
import sys
import threading
import time
import zipfile

import pytest
from fixtures.android_build import android_toolchain_missing, build_apk
from fixtures.prereq import require_tool, unavailable

from tether import rpc

ROOT = pathlib.Path(__file__).resolve().parent.parent
APP = ROOT / "android_app"
ALIGN = APP / "tools" / "align_apk.py"
SUMMARY_RE = re.compile(r"^(\d+) passed, (\d+) failed$", re.M)
TIMEOUT = 300
# the app classes without Android types (Backoff is one too, in device/src)
PURE_APP_CLASSES = ("Settings", "DeviceState", "RestartPolicy", "DeviceSupervisor")


# ------------------------------------------------------------------------------------------------------------
# the app's logic on a desktop JVM

@pytest.fixture(scope="module")
def app_logic_classes(tmp_path_factory):
    hint = "apt-get install default-jdk-headless"
    javac, java = require_tool("javac", hint), require_tool("java", hint)
    out = tmp_path_factory.mktemp("app-classes")
    sources = sorted(str(s) for d in ("protocol/src", "device/src") for s in (APP / d).rglob("*.java"))
    sources += [str(APP / "app" / "src" / "dev" / "tether" / "app" / (c + ".java")) for c in PURE_APP_CLASSES]
    sources += [str(s) for s in (APP / "app" / "tests").rglob("*.java")]
    proc = subprocess.run([javac, "--release", "8", "-Xlint:all,-options", "-encoding", "UTF-8", "-d", str(out),
                           *sources], capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 0, "javac failed:\n%s" % proc.stderr
    return java, out


def test_app_logic_on_a_desktop_jvm(app_logic_classes):
    java, classes = app_logic_classes
    proc = subprocess.run([java, "-cp", str(classes), "dev.tether.app.AppLogicRunner"], capture_output=True,
                          text=True, timeout=TIMEOUT)
    m = SUMMARY_RE.search(proc.stdout)
    assert m, proc.stdout + proc.stderr
    passed, failed = int(m.group(1)), int(m.group(2))
    assert proc.returncode == 0 and failed == 0, proc.stdout + proc.stderr
    # the runner's checks, counted: a check dropped by accident shows up here
    assert passed >= 100, proc.stdout


def test_pure_app_classes_use_no_android_types():
    """They are what the desktop test covers: an android.* import would make them untestable there."""
    for c in PURE_APP_CLASSES:
        text = (APP / "app" / "src" / "dev" / "tether" / "app" / (c + ".java")).read_text()
        assert not re.search(r"^import android\.", text, re.M), c


# ------------------------------------------------------------------------------------------------------------
# the service's start-retry loop with a real device server on a desktop JVM

class Lines:
    """The runner's stdout, read in a thread; ``wait(pred)`` returns the first new line that matches."""

    def __init__(self, proc):
        self.proc = proc
        self.seen = []
        self._q = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self):
        for line in self.proc.stdout:
            self._q.put(line.rstrip("\n"))
        self._q.put(None)

    def wait(self, pred, timeout=30.0):
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            try:
                line = self._q.get(timeout=max(0.01, left))
            except queue.Empty:
                line = None if left <= 0 else ""
            if line is None:
                raise AssertionError("no matching line in time; output so far:\n" + "\n".join(self.seen))
            if line:
                self.seen.append(line)
                if pred(line):
                    return line


def _native_abi():
    machine = platform.machine().lower()
    abi = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "aarch64", "arm64": "aarch64"}.get(machine)
    if abi is None:
        pytest.fail("the JNI bridge has no desktop build for %s (x86_64 and aarch64 only)" % machine)
    return abi


def test_supervisor_retries_and_reports_a_real_session(app_logic_classes, tmp_path):
    require_tool("clang", "apt-get install clang lld")
    require_tool("ld.lld", "apt-get install clang lld")
    abi = _native_abi()
    built = subprocess.run(["bash", str(APP / "bridge" / "build.sh"), "--out", str(tmp_path / "bridge"), abi],
                           capture_output=True, text=True, timeout=TIMEOUT)
    assert built.returncode == 0, built.stderr
    java, classes = app_logic_classes
    blocker = socket.socket()
    blocker.bind(("127.0.0.1", 0))
    blocker.listen(1)
    port = blocker.getsockname()[1]
    (tmp_path / "work").mkdir()
    proc = subprocess.Popen([java, "-cp", str(classes), "dev.tether.app.SupervisorRunner",
                             str(tmp_path / "bridge" / abi), str(tmp_path / "work"), "tracker=", "port=%d" % port],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        out = Lines(proc)
        # the port is taken: the loop retries with growing delays, and says so
        out.wait(lambda l: l.startswith("publish true retrying in 0.2 s (attempt 1); error: "))
        out.wait(lambda l: l.startswith("publish true retrying in 0.4 s (attempt 2)"))
        blocker.close()
        out.wait(lambda l: l == "publish false listening on 127.0.0.1:%d; no session" % port)
        with rpc.connect("127.0.0.1", port, timeout=30) as remote:
            out.wait(lambda l: l == "session true")
            assert remote.get_function("tether.echo")(41) == 41
            out.wait(lambda l: "session active; last call tether.echo (" in l)
        out.wait(lambda l: l == "session false")
        out.wait(lambda l: "no session; last call tether.echo (" in l)
        assert not any(l.startswith("publish") and "error" in l for l in out.seen[-3:]), out.seen
        proc.stdin.write("stop\n")
        proc.stdin.flush()
        out.wait(lambda l: l == "stopped true")
        assert proc.wait(timeout=30) == 0
        # the server is gone with the supervisor: nothing listens on its port (SO_REUSEADDR: a TIME_WAIT left by
        # the session's connection does not count, a listener still would)
        again = socket.socket()
        again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        again.bind(("127.0.0.1", port))
        again.listen(1)
        again.close()
    finally:
        blocker.close()
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


# ------------------------------------------------------------------------------------------------------------
# 16 KiB alignment of native libraries

def _run_align(*args):
    return subprocess.run([sys.executable, str(ALIGN), *map(str, args)], capture_output=True, text=True, timeout=60)


def _data_offsets(path):
    """name -> offset of the entry's data, from the local headers (what a device mmaps)."""
    offsets = {}
    with zipfile.ZipFile(path) as z, open(path, "rb") as f:
        for info in z.infolist():
            f.seek(info.header_offset)
            header = f.read(30)
            assert header[:4] == b"PK\x03\x04"
            name_len, extra_len = struct.unpack("<HH", header[26:30])
            offsets[info.filename] = info.header_offset + 30 + name_len + extra_len
    return offsets


def test_align_apk_puts_libraries_on_16k(tmp_path):
    src = tmp_path / "in.apk"
    payload = {"AndroidManifest.xml": b"<m/>" * 50, "resources.arsc": b"\x02\x00" * 33,
               "lib/arm64-v8a/libx.so": bytes(range(256)) * 9 + b"\x7f", "classes.dex": b"dex\n035\0" + b"d" * 777,
               "lib/armeabi-v7a/libx.so": b"\x01" * 5001, "assets/odd.bin": b"o" * 3}
    stored = {"resources.arsc", "lib/arm64-v8a/libx.so", "lib/armeabi-v7a/libx.so", "assets/odd.bin"}
    with zipfile.ZipFile(src, "w") as z:
        for name, data in payload.items():
            z.writestr(name, data, zipfile.ZIP_STORED if name in stored else zipfile.ZIP_DEFLATED)
    before = _data_offsets(src)
    assert any(before[n] % 16384 for n in stored if n.endswith(".so")), "the input must start misaligned"
    check = _run_align("--check", src)
    assert check.returncode == 1 and "libx.so" in check.stderr, check.stderr

    out = tmp_path / "out.apk"
    assert _run_align(src, out).returncode == 0
    after = _data_offsets(out)
    for name in stored:
        assert after[name] % (16384 if name.endswith(".so") else 4) == 0, (name, after[name])
    with zipfile.ZipFile(out) as z:
        assert [i.filename for i in z.infolist()] == list(payload)
        for info in z.infolist():
            assert z.read(info) == payload[info.filename]
            assert info.compress_type == (zipfile.ZIP_STORED if info.filename in stored else zipfile.ZIP_DEFLATED)
    assert _run_align("--check", out).returncode == 0
    # aligning again changes nothing (the old padding is replaced, not stacked)
    again = tmp_path / "again.apk"
    assert _run_align(out, again).returncode == 0
    assert again.read_bytes() == out.read_bytes()


# ------------------------------------------------------------------------------------------------------------
# the APK

@pytest.fixture(scope="module")
def apk(tmp_path_factory):
    missing = android_toolchain_missing()
    if missing:
        unavailable("the Android build tools", missing)
    tmp = tmp_path_factory.mktemp("apk")
    out = tmp / "tether.apk"
    proc = build_apk(tmp / "build", out, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out


def _manifest(apk_path):
    proc = subprocess.run(["aapt2", "dump", "xmltree", "--file", "AndroidManifest.xml", str(apk_path)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _element(tree, kind, name):
    """The attribute lines of the first ``E: kind`` element whose android:name is ``name``."""
    blocks = re.split(r"\n\s*E: ", tree)
    for b in blocks:
        if b.startswith(kind + " ") and ('android:name(0x01010003)="%s"' % name) in b:
            return b
    raise AssertionError("no <%s android:name=%s> in the manifest:\n%s" % (kind, name, tree))


def test_manifest_declares_the_device_service(apk):
    tree = _manifest(apk)
    service = _element(tree, "service", ".DeviceService")
    assert 'android:process(0x01010011)=":device"' in service
    # android.R.attr.foregroundServiceType, specialUse (ServiceInfo.FOREGROUND_SERVICE_TYPE_SPECIAL_USE)
    assert "android:foregroundServiceType(0x01010599)=0x40000000" in service
    assert "android:exported(0x01010010)=false" in service
    watchdog = _element(tree, "service", ".WatchdogService")
    assert "android:process" not in watchdog, "the watchdog must live in the UI process, apart from :device"
    activity = _element(tree, "activity", ".MainActivity")
    assert "android:launchMode(0x0101001d)=1" in activity  # singleTop: the adb intent reaches onNewIntent
    assert "android:extractNativeLibs(0x010104ea)=true" in tree
    for lib in ("libOpenCL.so", "libOpenCL-pixel.so"):   # Android 12+ hides vendor libraries not asked for
        native = _element(tree, "uses-native-library", lib)
        assert "android:required(0x0101028e)=false" in native, native
    for perm in ("INTERNET", "FOREGROUND_SERVICE", "FOREGROUND_SERVICE_SPECIAL_USE", "WAKE_LOCK",
                 "POST_NOTIFICATIONS"):
        assert '"android.permission.%s"' % perm in tree, perm
    badging = subprocess.run(["aapt", "dump", "badging", str(apk)], capture_output=True, text=True,
                             timeout=60).stdout
    assert "native-code: 'arm64-v8a' 'armeabi-v7a'" in badging
    assert "targetSdkVersion:'24'" in badging  # Android 15 refuses to install a lower target
    assert "launchable-activity: name='dev.tether.app.MainActivity'" in badging


def test_dex_holds_app_device_server_and_protocol(apk):
    with zipfile.ZipFile(apk) as z:
        dex = z.read("classes.dex")
    assert dex.startswith(b"dex\n035")
    for cls in ("dev/tether/app/MainActivity", "dev/tether/app/DeviceService", "dev/tether/app/WatchdogService",
                "dev/tether/app/Settings", "dev/tether/device/Backoff", "dev/tether/app/DeviceState",
                "dev/tether/device/DeviceServer", "dev/tether/device/DeviceConfig", "dev/tether/device/NativeBridge",
                "dev/tether/device/Status", "dev/tether/rpc/TetherClient", "dev/tether/rpc/FrameDecoder"):
        assert ("L%s;" % cls).encode() in dex, cls


ELF_MACHINE = {"arm64-v8a": (2, 183), "armeabi-v7a": (1, 40)}  # (ELFCLASS64/32, EM_AARCH64 / EM_ARM)


def _load_alignments(elf: bytes):
    """p_align of every PT_LOAD segment."""
    is64 = elf[4] == 2
    if is64:
        phoff, = struct.unpack_from("<Q", elf, 0x20)
        phentsize, phnum = struct.unpack_from("<HH", elf, 0x36)
    else:
        phoff, = struct.unpack_from("<I", elf, 0x1C)
        phentsize, phnum = struct.unpack_from("<HH", elf, 0x2A)
    out = []
    for i in range(phnum):
        at = phoff + i * phentsize
        p_type, = struct.unpack_from("<I", elf, at)
        if p_type == 1:
            out.append(struct.unpack_from("<Q", elf, at + 48)[0] if is64 else struct.unpack_from("<I", elf, at + 28)[0])
    return out


def test_native_bridge_for_both_abis_16k_aligned(apk):
    offsets = _data_offsets(apk)
    with zipfile.ZipFile(apk) as z:
        libs = sorted(n for n in z.namelist() if n.startswith("lib/"))
        assert libs == ["lib/arm64-v8a/libtether_bridge.so", "lib/armeabi-v7a/libtether_bridge.so"]
        for name in libs:
            info = z.getinfo(name)
            assert info.compress_type == zipfile.ZIP_STORED, name
            assert offsets[name] % 16384 == 0, (name, offsets[name])
            elf = z.read(name)
            assert elf[:4] == b"\x7fELF", name
            cls, machine = ELF_MACHINE[name.split("/")[1]]
            assert elf[4] == cls and struct.unpack_from("<H", elf, 18)[0] == machine, name
            aligns = _load_alignments(elf)
            assert aligns and all(a >= 16384 for a in aligns), (name, aligns)
    assert _run_align("--check", apk).returncode == 0
    assert subprocess.run(["zipalign", "-c", "-p", "4", str(apk)], capture_output=True, timeout=60).returncode == 0
    verify = subprocess.run(["apksigner", "verify", str(apk)], capture_output=True, text=True, timeout=60)
    assert verify.returncode == 0, verify.stderr
