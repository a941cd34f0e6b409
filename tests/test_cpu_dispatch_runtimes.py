"""The CPU-features word (docs/abi.md "CPU dispatch") in the Go runtime and the Java device server, with the rules
of the Python runtime (tether_rpc.cpu_features.dispatch_word: bit i set when the CPU reports the metadata's
``cpu_dispatch[i]``; the first 32 entries; non-strings name nothing; 0 when the CPU's features are unknown).

Two kinds of evidence, both compared with what the Python runtime computes:
- tables: the word for several name lists on the CPUs qemu emulates (their auxiliary vectors) and on x86, computed
  by Go's and Java's own functions;
- probe modules (tests/kernels/dispatch_probe.c): a module with a word and a kernel that reads it back, loaded by
  each runtime, on this x86_64 host and, for the Java server, in an aarch64 JVM under qemu on cortex-a76 (which
  has the Armv8.2 dot product) and cortex-a72 (which has not), next to an android-arm64 dot4 module whose
  dispatched kernels must match numpy there.
"""
from __future__ import annotations

import json
import subprocess
import textwrap
import types

import numpy as np
import pytest

import tether
from fixtures.arch_modules import QEMU_AUXV, absent_x86_feature
from kernels import build_kernel, build_kernel_for
from tether_rpc import cpu_features, device_info, module

# name lists whose words the runtimes compare: one bit, several bits with a gap and a non-string, bits beyond 32,
# and metadata that names nothing
NAME_LISTS = [["asimddp"], ["i8mm", "asimddp", "neon", 3, "avx2", "asimd"], ["sse2"] * 33 + ["asimd"] * 3,
              [], "asimddp", None, {"asimddp": 0}]


def _defines(names) -> list:
    return ["CPU_DISPATCH=" + json.dumps(json.dumps(names))]


def _host_names(caps) -> list:
    """Bits this host has (sse2: every x86_64), one it lacks, a non-string, and one past the 32nd (never set)."""
    names = ["sse2", "no_such_feature", 7, absent_x86_feature(caps["features"]), "avx2"]
    return names + ["sse2"] * (32 - len(names)) + ["sse2"]


def _host_probe(tmp_path):
    """(probe module for this host, the word the Python runtime sets in it)."""
    caps = device_info.cpu_capabilities()
    assert caps["isa"] == "x86_64" and caps["source"] == "cpuinfo", caps
    names = _host_names(caps)
    path = build_kernel("dispatch_probe", tmp_path, defines=_defines(names))
    want = cpu_features.dispatch_word(names, caps)
    assert want & 1 and not want & 0b1110 and want < (1 << 32), hex(want)
    assert (want >> 31) & 1 and bool(want & 16) == ("avx2" in caps["features"])
    out = np.zeros(1, np.int64)
    module.load_module(str(path))["read_word"](out)
    assert int(out[0]) == want       # the Python runtime wrote it, the module reads it
    return path, want


def _tables():
    """The word of every NAME_LISTS entry on qemu's ARM CPUs, an x86 CPU and a CPU with unknown features."""
    rows = []
    for name, (arch, auxv) in QEMU_AUXV.items():
        rows.append((name, cpu_features.capabilities(arch, {}, auxv=auxv)))
    rows.append(("x86", cpu_features.capabilities("x86_64", {"features": ["sse2", "avx2"]})))
    rows.append(("unknown", {"isa": "armv8", "features": ["asimddp"], "source": None}))
    out = [{"name": "%s/%d" % (n, i), "names": names, "caps": caps, "word": cpu_features.dispatch_word(names, caps)}
           for n, caps in rows for i, names in enumerate(NAME_LISTS)]
    words = {r["name"]: r["word"] for r in out}
    assert words["cortex-a76/0"] == 1 and words["cortex-a72/0"] == 0   # qemu: a76 has the dot product, a72 not
    # (an aarch64 CPU says "asimd", never "neon")
    assert words["cortex-a76/1"] == 0b100010 and words["unknown/0"] == 0
    return out


# ---- Go -----------------------------------------------------------------------------------------------------------
def test_go_runtime_sets_the_word_as_python_does(tmp_path):
    from fixtures.golang import run_go_test
    path, want = _host_probe(tmp_path)
    fixtures = {"tables": _tables(), "probes": [{"module": path.name, "word": want}]}
    (tmp_path / "dispatch.json").write_text(json.dumps(fixtures))
    out = run_go_test(["."], tmp_path, run="^TestCPUDispatchWordMatchesPython$")
    assert "--- PASS: TestCPUDispatchWordMatchesPython" in out, out


# ---- Java ---------------------------------------------------------------------------------------------------------
JAVA_TABLES = textwrap.dedent("""
    package dev.tether.device;

    import java.nio.file.Files;
    import java.nio.file.Paths;
    import dev.tether.rpc.Json;
    import java.util.List;
    import java.util.Map;

    public class DispatchTables {
        @SuppressWarnings("unchecked")
        public static void main(String[] args) throws Exception {
            String text = new String(Files.readAllBytes(Paths.get(args[0])), "UTF-8");
            for (Object row : (List<Object>) Json.parse(text)) {
                Map<String, Object> r = (Map<String, Object>) row;
                int word = CpuFeatures.dispatchWord(r.get("names"), (Map<String, Object>) r.get("caps"));
                System.out.println(r.get("name") + " " + (word & 0xffffffffL));
            }
        }
    }
""")


def test_java_word_tables_match_python(tmp_path):
    from fixtures.java_device import require_java_device_tools
    from test_java_bridge import ROOT
    require_java_device_tools()
    tables = _tables()
    (tmp_path / "tables.json").write_text(json.dumps(tables))
    src = tmp_path / "DispatchTables.java"
    src.write_text(JAVA_TABLES)
    sources = [str(p) for d in ("protocol", "device") for p in (ROOT / "android_app" / d / "src").rglob("*.java")]
    subprocess.run(["javac", "--release", "8", "-nowarn", "-d", str(tmp_path / "classes"), str(src), *sources],
                   check=True, timeout=300, capture_output=True)
    proc = subprocess.run(["java", "-cp", str(tmp_path / "classes"), "dev.tether.device.DispatchTables",
                           str(tmp_path / "tables.json")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    got = dict(line.split() for line in proc.stdout.splitlines())
    assert {r["name"]: str(r["word"]) for r in tables} == got


def _read_word(remote, path) -> int:
    remote.upload(str(path))
    out = remote.empty((1,), "int64")
    remote.load_module(path.name)["read_word"](out)
    return int(out.numpy()[0])


def test_java_device_sets_the_word_on_this_host(java_device, tmp_path):
    from tether import rpc
    path, want = _host_probe(tmp_path)
    with rpc.connect(java_device.host, java_device.port, timeout=60) as remote:
        assert _read_word(remote, path) == want


# android-arm64 dot4 kernels whose dispatched versions differ (sdot/udot against smull/saddlp), a few of each
_DOT4_CASES = ("red_s8s8_v16", "red_u8u8_v8", "red_s8s8_parallel", "ew_u8u8_acc_left_v16", "ew_s8s8_plain_v4",
               "red_u8s8_v16")


def _dot4_module(tmp_path):
    from test_int8_dot import cases
    built = [c for c in cases(seed=3) if c[0] in _DOT4_CASES]
    assert len(built) == len(_DOT4_CASES)
    lib = tether.build([tether.lower(s, args, name=name) for name, s, args, _, _ in built], target="android-arm64",
                       name="dot4_dispatch", jobs=1)
    path = tmp_path / "dot4_dispatch.so"
    lib.export_library(str(path))
    return built, path


@pytest.mark.emulated
@pytest.mark.parametrize("cpu,word", [("cortex-a72", 0), ("cortex-a76", 1)])
def test_java_device_under_qemu_sets_the_word_from_the_cpu(emulated_devices, java_device_build, cpu, word,
                                                           tmp_path):
    """On cortex-a76 the Java server's word selects the sdot/udot versions, on cortex-a72 the base ones (forcing
    the word there dies of SIGILL: tests/test_int8_dot.py), and both give numpy's results."""
    from test_int8_dot import _run_on_device
    from test_java_emulated import start_aarch64_java_device
    from tether import rpc

    built, dot4 = _dot4_module(tmp_path)
    names = tether.runtime.read_metadata(str(dot4))["cpu_dispatch"]
    assert names == ["asimddp"]
    (tmp_path / "one").mkdir()
    (tmp_path / "many").mkdir()
    probe = build_kernel_for("dispatch_probe", "aarch64", tmp_path / "one", defines=_defines(names))
    many = build_kernel_for("dispatch_probe", "aarch64", tmp_path / "many", defines=_defines(NAME_LISTS[1]))
    server = start_aarch64_java_device(emulated_devices, java_device_build, tmp_path, "--cpu", cpu)
    try:
        with rpc.connect(server.host, server.port, timeout=120) as remote:
            caps = remote.get_function("tether.device_info")()["cpu_capabilities"]
            assert caps["source"] == "auxv" and ("asimddp" in caps["features"]) == (word == 1), caps
            assert _read_word(remote, probe) == word == cpu_features.dispatch_word(names, caps)
            assert _read_word(remote, many) == cpu_features.dispatch_word(NAME_LISTS[1], caps)
        device = types.SimpleNamespace(address=(server.host, server.port))
        _run_on_device(device, dot4, built, "java/android-arm64/" + cpu)
    finally:
        server.stop()
