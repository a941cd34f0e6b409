"""Target presets, target strings, device_info mapping and `tether targets`."""
from __future__ import annotations

import pytest
from click.testing import CliRunner

from tether.target import PRESET_NAMES, Target, UnknownTargetError

EXPECTED = {
    "x86_64": ("x86_64-unknown-linux-gnu", "x86-64", "x86_64", 64),
    "rasp4b": ("aarch64-unknown-linux-gnu", "cortex-a72", "aarch64", 64),
    "rasp5": ("aarch64-unknown-linux-gnu", "cortex-a76", "aarch64", 64),
    "rasp3b": ("armv7a-unknown-linux-gnueabihf", "cortex-a53", "armv7", 32),
    "armv7-a7": ("armv7a-unknown-linux-gnueabihf", "cortex-a7", "armv7", 32),
    "jetson-nano": ("aarch64-unknown-linux-gnu", "cortex-a57", "aarch64", 64),
    "android-arm64": ("aarch64-unknown-linux-android24", "generic", "aarch64", 64),
}


@pytest.mark.parametrize("preset", sorted(EXPECTED))
def test_presets(preset):
    t = Target(preset)
    triple, cpu, arch, bits = EXPECTED[preset]
    assert (t.triple, t.cpu, t.arch, t.bits, t.preset) == (triple, cpu, arch, bits, preset)
    assert t.to_dict() == {"triple": triple, "cpu": cpu, "features": t.features, "arch": arch, "preset": preset}
    assert ("p:32:32" in t.data_layout) == (bits == 32)
    assert t.vector_bits == 128
    if arch != "x86_64":
        assert t.has_feature("neon")
    if arch == "armv7":
        assert t.float_abi == "hard" and t.has_feature("vfp4") and not t.native_rounding
    assert Target(t) == t and hash(Target(preset)) == hash(t)


def test_host_is_detected():
    import llvmlite.binding as llvm

    t = Target("host")
    assert t.cpu == llvm.get_host_cpu_name() and t.preset == "host"
    assert t.triple.split("-")[0] == llvm.get_process_triple().split("-")[0]
    assert Target() == t


def test_target_strings():
    t = Target("aarch64-linux-gnu -mcpu=cortex-a72 -mattr=+neon")
    assert (t.triple, t.cpu, t.features, t.preset) == ("aarch64-unknown-linux-gnu", "cortex-a72", "+neon", None)
    assert str(t) == "aarch64-unknown-linux-gnu -mcpu=cortex-a72 -mattr=+neon"
    assert Target(str(t)) == t
    t = Target("armv7a-linux-gnueabihf -mcpu=cortex-a9 -mattr=+neon,+vfp3")
    assert t.arch == "armv7" and t.float_abi == "hard" and t.has_feature("vfp3")
    assert Target("armv7a-linux-gnueabi").float_abi == "soft"
    assert Target("aarch64-linux-android24").is_android


def test_bad_targets_name_the_presets():
    with pytest.raises(UnknownTargetError) as info:
        Target("raspberry")
    for name in PRESET_NAMES:
        assert name in str(info.value)
    with pytest.raises(UnknownTargetError, match="-mcpu"):
        Target("aarch64-linux-gnu --fast")
    with pytest.raises(UnknownTargetError, match="riscv64"):
        Target("riscv64-linux-gnu")
    with pytest.raises(ValueError):  # UnknownTargetError is also a ValueError
        Target("")


def test_from_device_info_of_this_machine():
    from tether_rpc.device_info import device_info
    from tether_rpc.elf import host_arch

    t = Target.from_device_info(device_info())
    assert t.arch == host_arch()


@pytest.mark.parametrize("info, expected", [
    ({"arch": "aarch64", "suggested_target": "rasp4b", "cpu_cores": ["cortex-a72"]}, Target("rasp4b")),
    ({"arch": "armv7l", "suggested_target": "rasp3b", "cpu_cores": ["cortex-a53"]}, Target("rasp3b")),
    ({"arch": "aarch64", "suggested_target": "aarch64", "cpu_cores": ["cortex-a55", "cortex-a78"],
      "os": {"android": False}}, Target("aarch64-unknown-linux-gnu -mcpu=cortex-a78 -mattr=+neon")),
    ({"arch": "aarch64", "suggested_target": "aarch64", "cpu_cores": [], "os": {"android": True}},
     Target("aarch64-unknown-linux-android24 -mattr=+neon")),
    ({"arch": "armv7l", "suggested_target": "armv7", "cpu_cores": ["unknown-0x41-0xc09"]},
     Target("armv7a-unknown-linux-gnueabihf -mattr=+neon")),
])
def test_from_device_info_mapping(info, expected):
    assert Target.from_device_info(info) == expected


def test_from_device_info_unknown_arch():
    with pytest.raises(UnknownTargetError, match="mips"):
        Target.from_device_info({"arch": "mips", "suggested_target": "mips"})


def test_targets_command_lists_presets():
    from tether.cli.main import cli

    result = CliRunner().invoke(cli, ["targets", "--plain"])
    assert result.exit_code == 0, result.output
    rows = [line.split("\t") for line in result.output.strip().splitlines()]
    assert [r[0] for r in rows] == list(PRESET_NAMES)
    assert rows[PRESET_NAMES.index("rasp3b")][1:4] == ["armv7a-unknown-linux-gnueabihf", "cortex-a53", "+neon,+vfp4"]
    result = CliRunner().invoke(cli, ["targets"])
    assert result.exit_code == 0 and "rasp4b" in result.output


@pytest.mark.parametrize("columns", [60, 80, 200])
def test_targets_command_fits_the_terminal(columns):
    """Every field whole at any width: at 80 columns a six-column table would cut its cells to a letter or two."""
    from tether.cli.main import cli

    result = CliRunner().invoke(cli, ["targets"], env={"COLUMNS": str(columns)})
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert max(len(line) for line in lines) <= columns, result.output
    assert "\u2026" not in result.output, result.output   # rich's ellipsis: a cell cut short
    words = set(result.output.replace("\u2502", " ").replace("\u2503", " ").split())
    plain = CliRunner().invoke(cli, ["targets", "--plain"]).output
    for row in (line.split("\t") for line in plain.strip().splitlines()):
        assert {row[0], row[1], row[2]} <= words, (row, result.output)
        # the long fields may wrap, but every word of them is there (a "[...]" in one is text, not markup)
        assert set(" ".join(row[3:]).split()) <= words, (row, result.output)


def test_to_dict_round_trip():
    for name in PRESET_NAMES:
        t = Target(name)
        assert Target.from_dict(t.to_dict()) == t
