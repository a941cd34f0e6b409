"""Guest instruction counts on emulated ARM CPUs (tether.bench.insn_count, docs/bench.md "Instruction counts"):
the qemu plugin builds and Debian's qemu loads it, its classes agree with qemu's own disassembler, the counts
repeat exactly (also with the machine loaded), `tether bench --count-instructions` reports them, and the CI table
(tests/data/insn_counts.json): a count that rises by more than 2% fails, one that falls by more than 2% fails
asking for `python scripts/update_insn_counts.py`."""
import collections
import json
import os
import pathlib
import re
import signal
import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner

pytestmark = [pytest.mark.emulated]

TABLE_PATH = pathlib.Path(__file__).parent / "data" / "insn_counts.json"


@pytest.fixture(scope="module")
def conv_net_builds(tmp_path_factory):
    """The table's conv net compiled for rasp4b and armv7-a7: {preset: (folder, inputs)}."""
    from tether.testing import insn_count_models as table

    out = tmp_path_factory.mktemp("insn_models")
    built = {}
    for preset in ("rasp4b", "armv7-a7"):
        folder, inputs, _ = table.compile_for("conv_net", preset, str(out / preset))
        built[preset] = (folder, inputs)
    return built


def test_the_plugin_builds_and_debians_qemu_loads_it(emulated_devices, tmp_path):
    from tether.bench import insn_count
    from tether.emulate import find_qemu
    from tether_rpc import elf

    userland = emulated_devices.userland("aarch64")
    plugin = insn_count.plugin_path()
    assert plugin == insn_count.plugin_path()          # cached: the second call builds nothing
    with elf.read_elf(str(plugin)) as f:
        exported = set(f.exported_symbols)
    assert {"qemu_plugin_version", "qemu_plugin_install"} <= exported
    out = tmp_path / "counts.json"
    qemu = find_qemu(userland.spec)
    proc = subprocess.run([qemu, "-cpu", "cortex-a72", "-plugin", "%s,out=%s" % (plugin, out), "-L",
                           str(userland.rootfs), str(userland.python), "-c", "pass"],
                          env=insn_count.guest_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    counts = json.loads(out.read_text())
    assert counts["arch"] == "aarch64" and counts["classes"] == list(insn_count.CLASSES)
    assert sum(counts["total"].values()) > 1_000_000          # Python's start-up is millions of instructions
    assert counts["total"]["branch"] > 0 and counts["total"]["load"] > 0
    # a wrong argument is refused by the plugin, and qemu says it could not install it
    bad = subprocess.run([qemu, "-cpu", "cortex-a72", "-plugin", "%s,bogus=1" % plugin, "-L", str(userland.rootfs),
                          str(userland.python), "-c", "pass"], env=insn_count.guest_env(), capture_output=True,
                         text=True, timeout=300)
    assert bad.returncode != 0 and "unknown argument" in bad.stderr + bad.stdout


def test_a_plugin_that_does_not_compile_is_one_clear_error(tmp_path, monkeypatch):
    from tether.bench import insn_count

    broken = tmp_path / "broken.c"
    broken.write_text("this is not C\n")
    monkeypatch.setenv("TETHER_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(insn_count, "PLUGIN_SOURCE", broken)
    with pytest.raises(insn_count.InsnCountError, match=r"building the qemu instruction-count plugin from .*broken\.c"
                                                        r" with `zig cc` failed"):
        insn_count.plugin_path()


COND = "(eq|ne|cs|hs|cc|lo|mi|pl|vs|vc|hi|ls|ge|lt|gt|le|al)?"


def _expected(mode: str, text: str):
    """The class an instruction must have, read from qemu's disassembly (capstone); None when the mnemonic alone
    does not say (the rest of the SIMD&FP and integer instructions)."""
    mnemonic, _, ops = text.partition(" ")
    mnemonic = mnemonic.lower()
    first = ops.split(",")[0].strip().lower()
    if mode == "a64":
        if mnemonic in ("sdot", "udot", "usdot", "sudot"):
            return "dot"
        if mnemonic in ("fmla", "fmls"):
            return "vfma" if first.startswith("v") else "simd"
        if mnemonic in ("b", "bl", "br", "blr", "ret", "cbz", "cbnz", "tbz", "tbnz") or mnemonic.startswith("b."):
            return "branch"
        if re.match(r"^(ld[1-4]r?|st[1-4])$", mnemonic):
            return "vload" if mnemonic.startswith("ld") else "vstore"
        if re.match(r"^(ldr|ldur|ldp|ldnp|str|stur|stp|stnp)$", mnemonic) and re.match(r"^[qdshb]\d", first):
            return "vload" if mnemonic.startswith("ld") else "vstore"
        if re.match(r"^(ld(r|ur|p|np|xr|axr|ar|xp|axp|tr|apr)[bhw]?|ldrs[bhw]|ldurs[bhw]|ldpsw|prfu?m)$", mnemonic):
            return "load"
        if re.match(r"^(st(r|ur|p|np|xr|lxr|lr|xp|lxp|tr)[bhw]?)$", mnemonic):
            return "store"
        return None
    base = mnemonic.split(".")[0]
    if base in ("vsdot", "vudot"):
        return "dot"
    if base in ("vfma", "vfms", "vmla", "vmls") and re.search(r"\.f(32|16)", mnemonic) and re.match(r"^[qd]\d", first):
        return "vfma"
    if re.match(r"^(vld[1-4]|vldr|vldmia|vldmdb|vpop)$", base):
        return "vload"
    if re.match(r"^(vst[1-4]|vstr|vstmia|vstmdb|vpush)$", base):
        return "vstore"
    if re.match(r"^(b|bl|blx|bx)" + COND + "$", base) or base in ("cbz", "cbnz", "tbb", "tbh"):
        return "branch"
    if re.match(r"^(pop" + COND + "|ldm(ia|ib|da|db)?" + COND + "|ldr(b|h|sb|sh|d|ex|exb|exh|exd|t|bt|ht)?" + COND
                + "|pld|pldw|pli)$", base):
        return "load"
    if re.match(r"^(push" + COND + "|stm(ia|ib|da|db)?" + COND + "|str(b|h|d|t|bt|ht|ex|exb|exh|exd)?" + COND
                + ")$", base):
        return "store"
    return None


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["rasp4b", "armv7-a7"])
def test_the_classes_agree_with_qemus_disassembler(preset, conv_net_builds, emulated_devices, tmp_path):
    """Every instruction the guest translated (Python, numpy, glibc in T32 on armv7, the model's A64/A32 NEON
    kernels), classified by the plugin, against the class its mnemonic in qemu's disassembly says."""
    from tether import bundle, emulate
    from tether.bench import insn_count

    arch, cpu = emulate.preset_device(preset)
    userland = emulated_devices.userland(arch)
    folder, inputs = conv_net_builds[preset]
    bundle.write_bundle(tmp_path / "tether-rpc.pyz")
    (tmp_path / "in").mkdir()
    np.save(tmp_path / "in" / "0.npy", inputs[0])
    listing = tmp_path / "disas.txt"
    insn_count.run_guest(userland, cpu, folder, str(tmp_path / "in"), 1, str(tmp_path), disas=str(listing))
    seen = collections.Counter()
    wrong = collections.Counter()
    checked = 0
    for line in listing.read_text().splitlines():
        cls, mode, _word, text = line.split("\t", 3)
        seen[cls] += 1
        want = _expected(mode, text)
        if want is not None:
            checked += 1
            if want != cls:
                wrong[(mode, cls, want, text.split()[0])] += 1
    print("classes translated: %s; %d checked against the mnemonic, mismatches: %s"
          % (dict(seen), checked, wrong.most_common(12)))
    assert checked > 50_000
    assert seen["vfma"] > 0 or preset == "armv7-a7"          # armv7 without fast-math: vmul + vadd, no vmla
    assert seen["vload"] > 0 and seen["vstore"] > 0
    if arch == "aarch64":
        assert not wrong, wrong
    else:
        # A TB's instruction set (A32 or T32) is inferred (the plugin API does not say it): a lone 4-byte instruction
        # at a page end can be taken in the wrong one. Rare, and never a NEON or VFP instruction of a kernel.
        assert sum(wrong.values()) <= checked // 2000, wrong
        assert not [k for k in wrong if "vfma" in k[1:3] or "dot" in k[1:3]], wrong


def _busy_loop() -> subprocess.Popen:
    """A host process that keeps a CPU busy (stopped by PID by the caller), to count on a loaded machine."""
    return subprocess.Popen([sys.executable, "-c", "import time\nend = time.monotonic() + 600\n"
                             "while time.monotonic() < end: pass"])


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["rasp4b", "armv7-a7"])
def test_counts_repeat_exactly_also_on_a_loaded_machine(preset, conv_net_builds, emulated_devices, tmp_path):
    import tempfile

    from tether import emulate
    from tether.bench import insn_count

    userland = emulated_devices.userland(emulate.preset_device(preset)[0])
    folder, inputs = conv_net_builds[preset]
    first = insn_count.count_model(folder, preset, inputs, userland=userland)
    burners = [_busy_loop() for _ in range(2)]
    old_tmp = tempfile.tempdir
    try:
        tempfile.tempdir = str(tmp_path)      # (count_model keeps its work folder under /tmp all the same)
        second = insn_count.count_model(folder, preset, inputs, userland=userland)
    finally:
        tempfile.tempdir = old_tmp
        for b in burners:
            b.send_signal(signal.SIGKILL)
            b.wait(timeout=30)
    third = insn_count.count_model(folder, preset, inputs, userland=userland)
    print(preset, first["per_inference"], "outside kernels", first["outside_kernels"])
    # the model's code: the same count in every run, on a loaded machine too
    for key in ("in_kernels", "kernels"):
        assert first[key] == second[key] == third[key], (key, first[key], second[key], third[key])
    # the whole inference (the executor's Python too) is reported, not compared: CPython's own count moves a little
    # with what its allocator met before, so the table gates only the kernels' counts
    assert first["per_inference"]["total"] > first["outside_kernels"] > 0
    assert set(first["kernels"]) >= {"deploy_k0_conv2d_add_relu"} or len(first["kernels"]) >= 3


@pytest.mark.slow
def test_bench_count_instructions_on_an_emulated_rasp4b(conv_net_builds, emulated_devices, tmp_path):
    import jsonschema

    from tether.bench import insn_count, io, runner
    from tether.cli.main import cli

    device = emulated_devices.for_preset("rasp4b")
    folder, inputs = conv_net_builds["rasp4b"]
    out = tmp_path / "run.json"
    res = CliRunner().invoke(cli, ["bench", folder, "--host", device.host, "--port", str(device.port),
                                   "--samples", "3", "--min-sample-ms", "1", "--max-warmup", "2", "-q",
                                   "--timeout", "120", "--count-instructions", "--json", str(out)])
    assert res.exit_code == 0, res.output
    assert "instructions per inference" in res.output and "cortex-a72 (rasp4b)" in res.output
    doc = json.loads(out.read_text())
    jsonschema.validate(doc, io.schema())
    assert doc["schema"] == runner.SCHEMA_ID and doc["options"]["count_instructions"] is True
    (result,) = doc["results"]
    counts = result["instruction_counts"]
    assert counts["cpu"] == "cortex-a72" and counts["preset"] == "rasp4b"
    # the bench's random inputs (seed 0) are not the table's, but kernels have no data-dependent paths: the same
    # kernel counts as a direct count of the table's inputs
    direct = insn_count.count_model(folder, "rasp4b", inputs)
    assert counts["kernels"] == direct["kernels"]
    total = counts["per_inference"]["total"]
    assert ("%d" % total if float(total).is_integer() else "%.1f" % total) in res.output


@pytest.mark.slow
def test_the_table_of_counts(emulated_devices):
    """The CI table: every (model, preset) of tether.testing.insn_count_models.TABLE counted and compared with
    tests/data/insn_counts.json. Kernel counts are gated; whole-inference counts (with the executor's Python) are
    printed beside them."""
    from tether.testing import insn_count_models as table

    for arch in ("aarch64", "armv7"):
        emulated_devices.userland(arch)
    base = json.loads(TABLE_PATH.read_text())
    new = table.measure(log=print)
    rises, falls, text = table.compare(base, new)
    print(text)
    assert not rises, ("instruction counts rose by more than %.0f%%:\n  %s\n(if the rise is intended, rewrite the "
                       "table with `python scripts/update_insn_counts.py` and say why in the commit)"
                       % (table.TOLERANCE_PCT, "\n  ".join(rises)))
    assert not falls, ("instruction counts fell by more than %.0f%% (good!): rewrite the table with `python "
                       "scripts/update_insn_counts.py` so it stays the truth:\n  %s"
                       % (table.TOLERANCE_PCT, "\n  ".join(falls)))
    assert set(new["counts"]) == set(base["counts"]), "the table's models differ from TABLE: rewrite the table"


def test_the_table_gate_fails_on_a_rise_and_a_fall():
    """The comparison itself, on the checked-in table with one count raised and one lowered by 3%."""
    from tether.testing import insn_count_models as table

    base = json.loads(TABLE_PATH.read_text())
    new = json.loads(json.dumps(base))
    new["counts"]["conv_net"]["rasp4b"]["in_kernels"]["total"] *= 1.03
    new["counts"]["transformer"]["armv7-a7"]["in_kernels"]["vload"] *= 0.97
    rises, falls, text = table.compare(base, new)
    assert len(rises) == 1 and "conv_net on rasp4b: kernels total" in rises[0]
    assert len(falls) == 1 and "transformer on armv7-a7: kernels vload" in falls[0]
    assert table.compare(base, base)[:2] == ([], [])
    # a 1% change is within the tolerance
    small = json.loads(json.dumps(base))
    small["counts"]["conv_net"]["rasp4b"]["in_kernels"]["total"] *= 1.01
    assert table.compare(base, small)[:2] == ([], [])
    # whole-inference counts (the executor's Python) are shown, never gated
    other = json.loads(json.dumps(base))
    other["counts"]["conv_net"]["rasp4b"]["per_inference"]["total"] *= 1.10
    assert table.compare(base, other)[:2] == ([], [])
    assert "not gated" in table.compare(base, other)[2]
    assert os.path.basename(str(TABLE_PATH)) == "insn_counts.json"
