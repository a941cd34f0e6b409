"""Which int8 instructions each target may use: target.int8_instructions and `tether targets`."""
from click.testing import CliRunner

from tether.target import PRESET_NAMES, Target, int8_instructions


def _names(target):
    return [insns for insns, _ in int8_instructions(target)]


def test_arm_presets():
    assert _names("rasp5")[0] == "sdot/udot (dotprod)"             # Cortex-A76: Armv8.2 dot product
    assert not any("sdot" in n for n in _names("rasp4b"))         # Cortex-A72: Armv8.0, widening multiplies
    assert _names("rasp4b")[0].startswith("smlal by element (NEON")   # the widened convs (ops/qconv.py)
    assert "smull/umull+saddlp/uaddlp" in _names("android-arm64")[1]    # its base version: no widened weights
    assert _names("armv7-a7")[0] == "vmull+vpaddl (NEON)"


def test_a_preset_covering_cpus_with_and_without_dotprod_chooses_at_load_time():
    (first, when), = int8_instructions("android-arm64")[:1]
    assert first == "sdot/udot (dotprod)" and when == "if the device reports asimddp"
    assert all(w == "always" for _, w in int8_instructions("rasp5"))


def test_x86_features():
    assert _names("x86_64") == ["pmaddwd (SSE2)"]
    assert _names("x86_64-linux-gnu -mcpu=x86-64-v3")[0] == "vpmaddwd (AVX2)"
    vnni = Target("x86_64-linux-gnu", cpu="x86-64-v4", features="+avx512vnni")
    assert _names(vnni)[0] == "vpdpbusd (AVX512-VNNI)"


def test_targets_command_shows_the_int8_column():
    from tether.cli.main import cli

    result = CliRunner().invoke(cli, ["targets", "--plain"])
    assert result.exit_code == 0, result.output
    rows = {r.split("\t")[0]: r.split("\t") for r in result.output.strip().splitlines()}
    assert set(rows) == set(PRESET_NAMES)
    assert rows["rasp5"][4].startswith("sdot/udot (dotprod)")
    assert "[if the device reports asimddp]" in rows["android-arm64"][4]
