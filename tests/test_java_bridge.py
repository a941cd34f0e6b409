"""The JNI bridge (android_app/bridge): built offline by build.sh with Debian's clang + ld.lld for the two Android
ABIs (bionic) and two glibc Linux ones, then linted (tests/fixtures/bridge_lint.py): the right ELF class and
machine, NEEDED only libc/libdl(/liblog; +libpthread on glibc), 16 KB-aligned segments, no text relocations,
no executable stack, every JNI function of NativeBridge.java exported and nothing else, no undefined symbols
beyond the libc functions it declares. A broken build must be caught too: the lint is checked on bad inputs.
"""
from __future__ import annotations

import pathlib
import shutil
import subprocess

import pytest

from fixtures.bridge_lint import ABIS, lint, native_methods, program_headers, PT_LOAD
from fixtures.java_device import require_java_device_tools

ROOT = pathlib.Path(__file__).resolve().parent.parent
BUILD = ROOT / "android_app" / "bridge" / "build.sh"
NATIVE_BRIDGE = ROOT / "android_app" / "device" / "src" / "dev" / "tether" / "device" / "NativeBridge.java"


@pytest.fixture(scope="module")
def bridges(tmp_path_factory):
    require_java_device_tools()
    out = tmp_path_factory.mktemp("bridge")
    proc = subprocess.run([str(BUILD), "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return {abi: out / abi / "libtether_bridge.so" for abi in ABIS}


def test_natives_are_read_from_the_java_source():
    natives = native_methods(NATIVE_BRIDGE)
    assert "Java_dev_tether_device_NativeBridge_callPacked" in natives and len(natives) >= 12


@pytest.mark.parametrize("abi", sorted(ABIS))
def test_every_build_passes_the_lint(bridges, abi):
    assert lint(bridges[abi], abi, native_methods(NATIVE_BRIDGE)) == []


def test_the_build_is_cached_and_rebuilt_when_the_source_changes(bridges, tmp_path):
    out = bridges["x86_64"].parent.parent
    before = bridges["x86_64"].stat().st_mtime_ns
    proc = subprocess.run([str(BUILD), "--out", str(out), "x86_64"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "(cached)" in proc.stdout
    assert bridges["x86_64"].stat().st_mtime_ns == before


def test_the_lint_catches_what_it_claims_to(bridges, tmp_path):
    natives = native_methods(NATIVE_BRIDGE)
    # the wrong ABI, a missing JNI function, an extra NEEDED, 4 KB pages and a text relocation
    assert any("e_machine" in p for p in lint(bridges["x86_64"], "arm64-v8a", natives))
    assert any("not exported" in p for p in lint(bridges["arm64-v8a"], "arm64-v8a", natives + ["Java_x_y_z"]))
    assert any("NEEDED" in p for p in lint(bridges["x86_64"], "aarch64", natives) + lint(
        bridges["aarch64"], "arm64-v8a", natives))
    clang = shutil.which("clang")
    src = tmp_path / "bad.c"
    # a pointer stored in .text needs a dynamic relocation there: a text relocation
    src.write_text("extern int g;\n__attribute__((section(\".text\"))) int *const q = &g;\n"
                   "__attribute__((visibility(\"default\"))) int Java_x(void) { return *q; }\n")
    bad = tmp_path / "libbad.so"
    proc = subprocess.run([clang, "--target=aarch64-linux-android21", "-ffreestanding", "-nostdlib", "-shared",
                           "-fPIC", "-fuse-ld=lld", "-Wl,-z,notext", "-Wl,-z,max-page-size=4096",
                           "-Wl,-soname,libbad.so", str(src), "-o", str(bad)], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    problems = lint(bad, "arm64-v8a", natives)
    assert any("16 KB" in p for p in problems), problems
    assert any("text relocations" in p for p in problems), problems
    assert any("SONAME" in p for p in problems) and any("undefined" in p for p in problems)
    assert all(h[4] == 4096 for h in program_headers(bad) if h[0] == PT_LOAD)


def _android_jars(tmp_path: pathlib.Path):
    """(android-23.jar, [dx jars]): installed, left by build_apk.sh, or unpacked here from the two Debian 11
    packages (TETHER_ANDROID_DEBS, or ../shared/android-toolchain beside the checkout, as scripts/test.sh sets)."""
    import os

    from fixtures.prereq import unavailable

    for d in (pathlib.Path("/usr/share/java"), ROOT / "android_app" / ".toolchain" / "usr" / "share" / "java"):
        if (d / "com.android.android-23.jar").exists() and list(d.glob("com.android.dx*.jar")):
            return d / "com.android.android-23.jar", sorted(d.glob("*.jar"))
    for place in (os.environ.get("TETHER_ANDROID_DEBS"), ROOT.parent / "shared" / "android-toolchain"):
        debs = sorted(pathlib.Path(place).glob("*.deb")) if place else []
        if any(d.name.startswith("dalvik-exchange") for d in debs) and shutil.which("dpkg"):
            out = tmp_path / "debs"
            for deb in debs:
                subprocess.run(["dpkg", "-x", str(deb), str(out)], check=True, timeout=120)
            d = out / "usr" / "share" / "java"
            return d / "com.android.android-23.jar", sorted(d.glob("*.jar"))
    unavailable("android-23.jar and dx", "run android_app/build_apk.sh once, or set TETHER_ANDROID_DEBS")


def test_device_classes_compile_for_android_5_and_dex(tmp_path):
    # what the APK ships: the device server and the protocol library against android-23.jar (nothing newer than
    # the app's API level), dexed by dx (no lambdas, Java 8 bytecode)
    require_java_device_tools()
    android_jar, jars = _android_jars(tmp_path)
    classes = tmp_path / "classes"
    sources = sorted(str(p) for p in (ROOT / "android_app").glob("*/src/dev/tether/[dr]*/**/*.java"))
    assert any("/device/" in s for s in sources) and any("/rpc/" in s for s in sources)
    proc = subprocess.run(["javac", "-source", "8", "-target", "8", "-bootclasspath", str(android_jar),
                           "-Xlint:-options", "-encoding", "UTF-8", "-d", str(classes), *sources],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    dex = tmp_path / "classes.dex"
    proc = subprocess.run(["java", "-cp", ":".join(str(j) for j in jars), "com.android.dx.command.Main", "--dex",
                           "--min-sdk-version=21", "--output=" + str(dex), str(classes)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert b"Ldev/tether/device/DeviceServer;" in dex.read_bytes()
    assert b"Ldev/tether/device/NativeBridge;" in dex.read_bytes()
