"""What an x86 ``-mcpu`` implies (tether.target.x86_features): a target spelled ``-mcpu=icelake-server`` has
AVX512-VNNI without saying ``-mattr=+avx512vnni``, so its int8 kernels use vpdpbusd and its modules require it.

The table of CPUs is checked against LLVM's own: the CPU list zig prints (``zig targets``, generated from LLVM's
X86.td; ziglang is a tether dependency), the macros zig's clang defines for each CPU, and llvmlite's LLVM (the
compiler tether uses) emitting vpdpbusd for every CPU the table says has VNNI.
"""
from __future__ import annotations

import re
import subprocess
import sys
import textwrap

import numpy as np

import tether
from tether import runtime
from tether.target import _X86_CPUS, Target, int8_dot_native, int8_instructions, x86_features

VNNI = ("avx512vnni", "avxvnni")
_MACROS = {"avx512vnni": "__AVX512VNNI__", "avxvnni": "__AVXVNNI__"}


def _zig_x86_cpus() -> dict:
    """{LLVM CPU name: the features zig's table lists for it} for x86_64 (``zig targets``, ZON text)."""
    out = subprocess.run([sys.executable, "-m", "ziglang", "targets"], capture_output=True, text=True, timeout=120,
                         check=True).stdout
    lines = out.splitlines()
    start = lines.index("        .x86_64 = .{")
    cpus: dict = {}
    name = None
    for line in lines[start + 1:]:
        if line.startswith("        }"):
            break
        m = re.match(r'^ {12}\.(?:@"([^"]+)"|(\w+)) = \.\{', line)
        if m:
            name = (m.group(1) or m.group(2)).replace("_", "-")
            cpus[name] = set()
            continue
        m = re.match(r'^ {16}"([^"]+)",', line)
        if m and name is not None:
            cpus[name].add(m.group(1))
    assert len(cpus) > 50 and "icelake-server" in cpus, sorted(cpus)
    return cpus


def test_every_cpu_llvm_gives_vnni_is_in_the_table():
    cpus = _zig_x86_cpus()
    llvm = {c: f & set(VNNI) for c, f in cpus.items() if f & set(VNNI)}
    ours = {c: set(VNNI) & set(f) for c, f in _X86_CPUS.items() if set(VNNI) & set(f)}
    assert ours == llvm
    assert set(_X86_CPUS) <= set(cpus)       # every name is one LLVM knows


def test_the_features_the_table_implies_are_llvms():
    """Every feature the table gives a CPU (VNNI and what int8 code asks for with it) is one LLVM's clang
    defines for ``-mcpu=CPU`` (a table may claim less than LLVM, never more)."""
    macro = {"avx512f": "__AVX512F__", "avx512bw": "__AVX512BW__", "avx512vl": "__AVX512VL__", "avx2": "__AVX2__",
             "fma": "__FMA__", "sse4.1": "__SSE4_1__", **_MACROS}
    for cpu, feats in _X86_CPUS.items():
        proc = subprocess.run([sys.executable, "-m", "ziglang", "cc", "-target", "x86_64-linux-gnu",
                               "-mcpu=" + cpu.replace("-", "_"), "-dM", "-E", "-x", "c", "/dev/null"],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, (cpu, proc.stderr)
        for f in feats:
            if f in macro:
                assert macro[f] in proc.stdout, (cpu, f)


def test_cpu_implied_features_count_unless_turned_off():
    assert "avx512vnni" in x86_features("icelake-server", ())
    icx = Target("x86_64-linux-gnu -mcpu=icelake-server")
    assert icx.has_feature("avx512vnni") and icx.has_feature("avx512vl") and not icx.has_feature("avxvnni")
    assert int8_dot_native(icx) == ("u8s8",) and "avx512_vnni" in icx.requirements()["features"]
    assert int8_instructions(icx)[0] == ("vpdpbusd (AVX512-VNNI)", "always")
    assert int8_dot_native("x86_64-linux-gnu -mcpu=alderlake") == ("u8s8",)
    assert "avx_vnni" in Target("x86_64-linux-gnu -mcpu=alderlake").requirements()["features"]
    assert int8_dot_native("x86_64-linux-gnu -mcpu=skylake-avx512") == ()
    # -mattr turns features off with everything that needs them, in the order given
    no_512 = Target("x86_64-linux-gnu -mcpu=icelake-server -mattr=-avx512f")
    assert not no_512.has_feature("avx512vnni") and int8_dot_native(no_512) == ()
    assert "avx512_vnni" not in no_512.requirements()["features"] and no_512.has_feature("avx2")
    assert int8_dot_native("x86_64-linux-gnu -mcpu=sapphirerapids -mattr=-avx512vnni,-avxvnni") == ()
    assert int8_dot_native("x86_64-linux-gnu -mcpu=x86-64 -mattr=+avxvnni,-avxvnni") == ()
    assert int8_dot_native("x86_64-linux-gnu -mcpu=x86-64 -mattr=-avxvnni,+avxvnni") == ("u8s8",)
    # and the vector width and rounding instructions the schedules and codegen assume
    assert icx.vector_bits == 512 and no_512.vector_bits == 256 and icx.native_rounding
    assert Target("x86_64").vector_bits == 128 and not Target("x86_64").native_rounding
    # +X brings what X needs (LLVM does the same): the module requires it
    assert {"avx2", "avx", "avx_vnni"} <= set(Target("x86_64-linux-gnu -mcpu=x86-64 -mattr=+avxvnni")
                                              .requirements()["features"])


_BUILD_EACH = textwrap.dedent("""
    import sys
    sys.path.insert(0, sys.argv[1])
    import tether
    from test_int8_dot import _reduction
    for cpu in sys.argv[2:]:
        for factor in (16, 8, 4):
            asm = tether.build(*_reduction("u8s8", 32, 9, factor), target="x86_64-linux-gnu -mcpu=" + cpu,
                               name="red", jobs=1).get_source("asm")
            print(cpu, factor, "vpdpbusd" in asm, flush=True)
""")


def test_llvmlite_emits_vpdpbusd_for_every_vnni_cpu_of_the_table():
    """In a child process: an x86 CPU the table credits with VNNI that llvmlite's LLVM does not know would end
    the process in LLVM's instruction selection (the test then names the CPU it died on)."""
    import pathlib
    cpus = sorted(c for c, f in _X86_CPUS.items() if set(VNNI) & set(f))
    tests_dir = str(pathlib.Path(__file__).resolve().parent)
    proc = subprocess.run([sys.executable, "-c", _BUILD_EACH, tests_dir, *cpus], capture_output=True, text=True,
                          timeout=900)
    done = [line.split() for line in proc.stdout.splitlines()]
    assert proc.returncode == 0, (done[-1:], proc.stderr[-3000:])
    assert [(c, f) for c, f, _ in done] == [(c, str(f)) for c in cpus for f in (16, 8, 4)]
    assert all(v == "True" for _, _, v in done), [d for d in done if d[2] != "True"]


def test_an_icelake_server_build_uses_vpdpbusd_and_matches_numpy_here(tmp_path):
    """Run here when this CPU has what the module requires; refused before dlopen otherwise."""
    from fixtures.host_cpu import load_if_supported
    from test_int8_dot import _check, _reduction_case
    target = "x86_64-linux-gnu -mcpu=icelake-server"
    rng = np.random.default_rng(5)
    s, args, inputs, want = _reduction_case("u8s8", 48, 37, 16, rng)
    lib = tether.build(s, args, target=target, name="red_icx", jobs=1)
    assert re.search(r"\bvpdpbusd\s[^\n]*%zmm", lib.get_source("asm"))   # the 512-bit form
    path = tmp_path / "red_icx.so"
    lib.export_library(str(path))
    assert "avx512_vnni" in runtime.read_metadata(str(path))["requires"]["features"]
    mod = load_if_supported(path)
    if mod is not None:
        out = np.zeros(want.shape, np.int32)
        mod["red_icx"](*inputs, out)
        _check("red_icx", out, want)
