"""The pass pipeline of each opt level (graph/passes/__init__.py: PIPELINES) is what `optimize` runs and what
`tether compile --print-passes` prints."""
import logging
import os

import pytest
from click.testing import CliRunner

from fixtures.digits import DIGITS
from tether.cli.main import cli
from tether.frontend import from_onnx
from tether.graph.passes import PIPELINES, SUMMARIES, optimize, pipeline

LEVELS = (0, 1, 2, 3)


def _ran(caplog, level):
    """The names of the passes `optimize` ran on the digits CNN at ``level``, in order (its debug log)."""
    graph, params = from_onnx(DIGITS, shape={"input": (4, 1, 8, 8)})
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="tether.graph.passes"):
        optimize(graph, params, opt_level=level)
    return [r.getMessage().split(":")[0][len("after "):] for r in caplog.records
            if r.name == "tether.graph.passes" and r.getMessage().startswith("after ")]


@pytest.mark.parametrize("level", LEVELS)
def test_optimize_runs_the_pipeline_of_its_level(caplog, level):
    assert _ran(caplog, level) == [p.__name__ for p in PIPELINES[level]]


def test_levels_outside_0_to_3_clamp():
    assert pipeline(-1) is PIPELINES[0] and pipeline(7) is PIPELINES[3]


def test_each_level_keeps_the_passes_of_the_level_below_in_order():
    for level in LEVELS[1:]:
        higher = iter(PIPELINES[level])
        assert all(any(p is q for q in higher) for p in PIPELINES[level - 1]), level
    assert len(PIPELINES[3]) == 16


def test_every_pass_has_a_one_line_summary():
    names = {p.__name__ for passes in PIPELINES.values() for p in passes} | {"half_precision"}
    assert names == set(SUMMARIES)
    assert all(s and "\n" not in s for s in SUMMARIES.values())


@pytest.mark.parametrize("level", LEVELS)
def test_print_passes_prints_the_pipeline_without_a_model(tmp_path, level):
    runner = CliRunner()
    with runner.isolated_filesystem(temp_dir=tmp_path) as cwd:
        res = runner.invoke(cli, ["compile", "--print-passes", "--opt-level", str(level)])
        assert res.exit_code == 0, res.output
        assert os.listdir(cwd) == []        # compiles nothing, writes nothing
    lines = res.output.splitlines()
    assert [line.split()[0] for line in lines] == [p.__name__ for p in pipeline(level)]
    assert all(line.split(None, 1)[1] == SUMMARIES[line.split()[0]] for line in lines)


def test_print_passes_defaults_to_level_3_and_compile_still_needs_a_model():
    res = CliRunner().invoke(cli, ["compile", "--print-passes"])
    assert res.exit_code == 0 and len(res.output.splitlines()) == len(PIPELINES[3])
    res = CliRunner().invoke(cli, ["compile"])
    assert res.exit_code == 2 and "Missing argument 'MODEL'" in res.output


@pytest.mark.parametrize("level", LEVELS)
def test_fp16_adds_half_precision_after_the_last_dce_before_fusion(level):
    from tether.graph.passes import dce, half_precision

    base, half = pipeline(level), pipeline(level, "fp16")
    assert [p for p in half if p is not half_precision] == list(base)
    at = half.index(half_precision)
    assert half[at - 1] is dce and dce not in half[at + 1:]
