"""The Go runtime (bindings/go, package tether): loads real modules, calls them with tensors and scalars, runs
parallel kernels on the module's native pool with goroutine-owned OS threads, and reports the module's errors;
every result is compared bit for bit with what the Python runtime (tether_rpc.module) computes here."""
from __future__ import annotations

import json
import shutil
import struct

import numpy as np
import pytest

import tether
from fixtures.arch_modules import QEMU_AUXV, absent_x86_feature, module_with_requires
from fixtures.golang import GoCases, run_go_test
from fixtures.schedules import elementwise
from kernels import build_kernel
from tether_rpc import device_info, module
from tether_rpc.errors import ArchMismatch, KernelError

N = 1024
N_EW = 1 << 18


def _expect_error(f, *args) -> str:
    with pytest.raises(KernelError) as info:
        f(*args)
    return str(info.value)


@pytest.fixture(scope="module")
def go_cases(tmp_path_factory):
    d = tmp_path_factory.mktemp("go-runtime")
    for name in ("vadd", "nometa", "par"):
        build_kernel(name, d)
    s, args = elementwise(N_EW, lambda a, b: a * b + a * 0.5, factor=4096, lanes=8)
    tether.build(s, args, target="host", name="ew").export_library(str(d / "ew.so"))
    # a copy of vadd.so that claims to be an aarch64 ELF (e_machine at byte 18): refused before dlopen
    shutil.copy(d / "vadd.so", d / "vadd_aarch64.so")
    with open(d / "vadd_aarch64.so", "r+b") as fh:
        fh.seek(18)
        fh.write(struct.pack("<H", 183))

    cases = GoCases(d)
    rng = np.random.default_rng(7)
    vadd = module.load_module(str(d / "vadd.so"))
    a, b = rng.standard_normal(N).astype("float32"), rng.standard_normal(N).astype("float32")
    c = np.zeros(N, "float32")
    vadd["vadd"](a, b, c)
    cases.add("vadd", "vadd.so", "vadd", [a, b, np.zeros(N, "float32")], {2: c})
    for i, f, s_, by in ((-(1 << 40), 2.25, "héllo", b"\x01\x02\x00\xff"), (7, 0.5, "", b"")):
        out = np.zeros(4, "int64")
        vadd["probe"](out, i, f, s_, by)
        cases.add("probe", "vadd.so", "probe", [np.zeros(4, "int64"), i, f, s_, by], {0: out})
    ew = module.load_module(str(d / "ew.so"))
    x, y = rng.standard_normal(N_EW).astype("float32"), rng.standard_normal(N_EW).astype("float32")
    z = np.zeros(N_EW, "float32")
    ew["ew"](x, y, z)
    for threads in (1, 2, 4):
        cases.add("ew-%dt" % threads, "ew.so", "ew", [x, y, np.zeros(N_EW, "float32")], {2: z}, threads=threads)
    # the Python runtime's messages for the same bad calls: Go must give the same text
    errors = {
        "shape": _expect_error(vadd["vadd"], a, b[:1000], c),
        "dtype": _expect_error(vadd["vadd"], a, b, c.astype("float64")),
        "nargs": _expect_error(vadd["vadd"], a, b),
        "not_array": _expect_error(vadd["vadd"], a, 3, c),
        "task_failed": _expect_error(module.load_module(str(d / "par.so"))["fail"], np.zeros(64, "int32")),
    }
    caps = device_info.cpu_capabilities()
    if caps["isa"] == "x86_64" and caps["source"] is not None:
        # metadata "requires" naming a feature this CPU lacks: refused before dlopen, with Python's ArchMismatch
        # text; one naming only what it has loads (and so does every module above, built for the host)
        wrong = module_with_requires(d, {"isa": "x86_64", "features": ["sse2", absent_x86_feature(caps["features"])]},
                                     name="needs_absent.so")
        right = module_with_requires(d, {"isa": "x86_64", "features": ["sse2"]}, name="needs_sse2.so")
        with pytest.raises(ArchMismatch) as info:
            module.load_module(str(wrong))
        errors["arch_features"] = str(info.value)
        module.load_module(str(right))["nop"]()
    return cases.write(errors=errors, cpu_tables=_cpu_tables())


# /proc/cpuinfo as an x86 host shows it (also to a qemu-user ARM guest) and as a 32-bit kernel on a Pi 3 does
X86_CPUINFO = "processor\t: 0\nmodel name\t: Some CPU\nflags\t\t: fpu SSE2 avx2 fma\n"
PI3_ARMV7_CPUINFO = ("processor\t: 0\nmodel name\t: ARMv7 Processor rev 4 (v7l)\nFeatures\t: half thumb fastmult vfp "
                     "edsp neon vfpv3 tls vfpv4 idiva idivt vfpd32 lpae evtstrm\nCPU implementer\t: 0x41\n"
                     "CPU architecture: 7\nCPU part\t: 0xd03\n")
A7_CPUINFO = ("processor\t: 0\nFeatures\t: half thumb fastmult vfp edsp neon vfpv3 tls vfpv4 idiva idivt\n"
              "CPU implementer\t: 0x41\nCPU architecture: 7\nCPU part\t: 0xc07\n")


def _cpu_tables():
    """What tether_rpc.cpu_features makes of these CPUs (qemu's auxiliary vectors, cpuinfo texts without one),
    and what each preset's requirements lack there: the Go runtime's mirror must agree on every one."""
    from tether.target import Target
    from tether_rpc import cpu_features
    presets = ("x86_64", "armv7-a7", "rasp3b", "rasp4b", "rasp5", "android-arm64")
    requires = [Target(p).requirements() for p in presets] + [
        {"isa": "armv8", "features": ["neon", 3]}, {"isa": "armv9"}, {"features": None}, "armv8"]
    cpus = [(name, arch, X86_CPUINFO, auxv) for name, (arch, auxv) in QEMU_AUXV.items()] + [
        ("pi3-armv7-cpuinfo", "armv7", PI3_ARMV7_CPUINFO, {}), ("a7-cpuinfo", "armv7", A7_CPUINFO, {}),
        ("crc32-cpuinfo", "armv7", "Features\t: neon vfpv4 idiva crc32\n", {}),
        ("arm-under-qemu-no-auxv", "armv7", X86_CPUINFO, {}), ("aarch64-nothing", "aarch64", "", {}),
        ("x86_64", "x86_64", X86_CPUINFO, {}), ("x86_64-nothing", "x86_64", "", {}), ("riscv", "riscv64", "", {})]
    out = []
    for name, arch, text, auxv in cpus:
        info = device_info.parse_cpuinfo(text)
        caps = cpu_features.capabilities(arch, info, auxv=auxv)
        out.append({"name": name, "arch": arch, "cpuinfo": text, "hwcap": auxv.get(16, 0), "hwcap2": auxv.get(26, 0),
                    "platform": auxv.get(15, ""), "caps": caps, "requires": requires,
                    "missing": [cpu_features.missing(r, caps) for r in requires],
                    "preset": cpu_features.suggest_preset(arch, caps) or "",
                    "target": device_info.suggest_target(arch, info["cores"], False)})
    return out


def _cases_errors(d) -> dict:
    return json.loads((d / "cases.json").read_text()).get("errors") or {}


def test_go_runtime_matches_python_runtime(go_cases):
    out = run_go_test(["."], go_cases, run="^Test(Load|Inspect|Cases|Errors|Pool|Tensor|CPUFeatures)")
    for name in ("TestCasesMatchPython", "TestErrorsMatchPython", "TestPoolRunsOnTwoOSThreads",
                 "TestInspectRefusesForeignModules", "TestLoadRefusesMissingCPUFeatures",
                 "TestCPUFeaturesMatchPython"):
        if name == "TestLoadRefusesMissingCPUFeatures" and "arch_features" not in _cases_errors(go_cases):
            continue   # the fixture makes those modules on x86_64 hosts only
        assert "--- PASS: " + name in out, out
    # alone, in a fresh process: the C module is loaded before the pool's provider
    out = run_go_test(["."], go_cases, run="^TestPoolProviderAfterCModule$")
    assert "--- PASS: TestPoolProviderAfterCModule" in out, out


def test_go_packed_call_benchmark_runs(go_cases):
    """The benchmark scripts/bench_go_calls.py reads: both sub-benchmarks run and report a cost per call."""
    import re
    import subprocess

    from fixtures.golang import GO_DIR, go_env
    from fixtures.prereq import require_tool

    go = require_tool("go", "apt-get install golang-go")
    env = go_env(None, {"TETHER_GO_BENCH_MODULE": str(go_cases / "vadd.so"), "TETHER_GO_BENCH_FUNC": "vadd"})
    proc = subprocess.run([go, "test", "-run", "^$", "-bench", "BenchmarkPackedCall", "-benchtime", "2000x", "."],
                          cwd=GO_DIR, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    costs = dict(re.findall(r"^BenchmarkPackedCall/(\w+)\S*\s+2000\s+([\d.]+) ns/op", proc.stdout, re.M))
    assert set(costs) == {"Call", "Bound"} and all(float(v) > 0 for v in costs.values()), proc.stdout


def test_go_readme_example_compiles(tmp_path):
    """bindings/go/README.md's complete example builds against the current API (in a copy of the bindings, so
    nothing is written into the source tree)."""
    import re
    import shutil
    import subprocess

    from fixtures.golang import GO_DIR, go_env
    from fixtures.prereq import require_tool

    go = require_tool("go", "apt-get install golang-go")
    blocks = re.findall(r"```go\n(.*?)```", (GO_DIR / "README.md").read_text(), re.S)
    assert len(blocks) == 1 and "func main()" in blocks[0]
    copy = tmp_path / "bindings" / "go"
    shutil.copytree(GO_DIR, copy)
    shutil.copytree(GO_DIR.parents[1] / "src" / "tether" / "include", tmp_path / "src" / "tether" / "include")
    (copy / "internal" / "readmeexample").mkdir(parents=True)
    (copy / "internal" / "readmeexample" / "main.go").write_text(blocks[0])
    proc = subprocess.run([go, "build", "-o", str(tmp_path / "example"), "./internal/readmeexample"], cwd=copy,
                          env=go_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "example").exists()
