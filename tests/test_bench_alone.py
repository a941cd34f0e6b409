"""scripts/_alone.py: each runtime in a worker process of its own (real processes: tether's device runtime and
onnxruntime on a small conv + relu), the errors of a worker that cannot load, dies or hangs, the rule that stops
the rounds (on given samples, no processes), and scripts/bench_models.py and bench_threads.py on it end to end."""
import os
import pathlib
import re
import signal
import sys

import numpy as np
import pytest

from fixtures.scripts import SCRIPTS, run_bench_script

sys.path.insert(0, str(SCRIPTS))
import _alone  # noqa: E402
from _alone import Worker, WorkerError, compare_alone, finished, settled  # noqa: E402

ROW_KEYS = {"model", "compile_s", "kernels", "max_abs_err", "rounds", "tether_speedup_2t", "ort_speedup_2t"} | {
    "%s_%dt" % (k, t) for k in ("tether_ms", "ort_ms", "ratio", "spread", "stable") for t in (1, 2)}


@pytest.fixture(scope="module")
def conv_relu(tmp_path_factory):
    """(tether build folder, .onnx path, inputs .npz) of a 3x3 conv + relu on a 1x3x16x16 input."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    import tether
    from tether.frontend import from_onnx

    folder = tmp_path_factory.mktemp("alone")
    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["y"])],
        "conv_relu", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, 3, 16, 16))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, (1, 8, 16, 16))],
        [numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "w"),
         numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    onnx_path = str(folder / "conv_relu.onnx")
    onnx.save(model, onnx_path)
    g, params = from_onnx(model)
    build = str(folder / "tether")
    tether.build_graph(g, params, target="host", opt_level=3).export(build)
    x = rng.uniform(0, 1, (1, 3, 16, 16)).astype(np.float32)
    inputs = _alone.write_arrays(str(folder / "inputs.npz"), {"x": x})
    return build, onnx_path, inputs


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_each_runtime_alone_agrees_and_is_compared_at_both_thread_counts(conv_relu):
    build, onnx_path, inputs = conv_relu
    with Worker("tether", build, inputs) as tw, Worker("onnxruntime", onnx_path, inputs) as ow:
        pids = [tw.pid, ow.pid]
        assert os.getpid() not in pids and not any(gone(p) for p in pids)
        got, ref = tw.outputs(), ow.outputs()
        report = compare_alone({"tether": tw, "onnxruntime": ow}, "onnxruntime", number=3, min_rounds=2,
                               max_rounds=3)
        nodes = {t: tw.profile(t, 3) for t in (1, 2)}
        with pytest.raises(WorkerError, match=r"^onnxruntime worker \(pid \d+\): profile failed: .*no per-node"):
            ow.profile(1)
    assert len(got) == len(ref) == 1
    np.testing.assert_allclose(got[0], ref[0], rtol=1e-5, atol=1e-5)
    assert sorted(report) == [1, 2]
    for rep in report.values():
        assert set(rep["ms"]) == {"tether", "onnxruntime"} and all(ms > 0 for ms in rep["ms"].values())
        assert set(rep["ratio"]) == set(rep["spread"]) == {"tether"}
        assert rep["ratio"]["tether"] > 0 and rep["spread"]["tether"] >= 0
        assert set(rep["speedup"]) == {"tether", "onnxruntime"} and all(s > 0 for s in rep["speedup"].values())
        assert 2 <= rep["rounds"] <= 3
        assert isinstance(rep["stable"], bool)
    assert report[1]["speedup"] == {"tether": 1.0, "onnxruntime": 1.0}
    for prof in nodes.values():
        assert prof and all(set(n) >= {"name", "func", "ops", "seconds"} for n in prof)
        assert sum(n["seconds"] for n in prof) > 0
    assert all(gone(p) for p in pids), "a worker outlived its with block"


def test_a_worker_that_cannot_load_fails_in_one_line_naming_its_runtime(conv_relu, tmp_path):
    _, _, inputs = conv_relu
    with pytest.raises(WorkerError) as info:
        Worker("tether", str(tmp_path / "missing"), inputs)
    msg = str(info.value)
    assert msg.startswith("tether worker (pid ") and "\n" not in msg
    assert "cannot load" in msg and "deploy.json" in msg
    assert gone(int(re.search(r"pid (\d+)", msg).group(1)))


def test_a_worker_that_dies_or_hangs_fails_in_one_line(conv_relu):
    build, onnx_path, inputs = conv_relu
    with Worker("onnxruntime", onnx_path, inputs) as ow:
        os.kill(ow.pid, signal.SIGKILL)
        with pytest.raises(WorkerError, match=r"^onnxruntime worker \(pid \d+\): exited \(status -9\)"):
            ow.sample(1, 3)
    with Worker("tether", build, inputs, timeout_s=1) as tw:
        os.kill(tw.pid, signal.SIGSTOP)
        try:
            with pytest.raises(WorkerError, match=r"^tether worker \(pid \d+\): no answer in 1 s$"):
                tw.sample(1, 3)
        finally:
            os.kill(tw.pid, signal.SIGCONT)
    assert gone(ow.pid) and gone(tw.pid)


def replay(sample, min_rounds=5, max_rounds=25, tolerance=0.02):
    """The rounds compare_alone would take on the samples ``sample(round index)`` gives."""
    rounds = []
    while not finished(rounds, "ref", min_rounds, max_rounds, tolerance):
        rounds.append(sample(len(rounds)))
    return rounds


def test_the_rounds_stop_once_two_more_no_longer_move_the_ratio():
    steady = replay(lambda i: {1: {"a": 2.0, "ref": 1.0}, 2: {"a": 0.5, "ref": 1.0}})
    assert len(steady) == 5 and settled(steady, "ref", 0.02)
    # ---- below three rounds nothing is left to compare the median of all rounds with
    assert len(replay(lambda i: {1: {"a": 2.0, "ref": 1.0}}, min_rounds=1)) == 3
    # ---- noise that leaves the median in place settles too
    noisy = replay(lambda i: {1: {"a": (1.0, 1.5, 0.5)[i % 3], "ref": 1.0}})
    assert len(noisy) < 25 and settled(noisy, "ref", 0.02)


def test_the_rounds_run_to_the_limit_while_the_ratio_keeps_moving():
    drifting = replay(lambda i: {1: {"a": 1.1 ** i, "ref": 1.0}, 2: {"a": 1.0, "ref": 1.0}})
    assert len(drifting) == 25 and not settled(drifting, "ref", 0.02)
    # ---- one thread count settled is not enough; its own flag says so
    assert settled(drifting, "ref", 0.02, threads=[2]) and not settled(drifting, "ref", 0.02, threads=[1])
    # ---- the base drifting moves the ratio as much
    assert len(replay(lambda i: {1: {"a": 1.0, "ref": 0.9 ** i}}, max_rounds=12)) == 12


def test_bench_models_times_each_runtime_alone(tmp_path: pathlib.Path):
    proc, rows = run_bench_script("bench_models", tmp_path, "--models", "digits", "--min-rounds", "2",
                                  "--max-rounds", "2", timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert [r["model"] for r in rows] == ["digits"]
    (row,) = rows
    assert ROW_KEYS <= set(row), ROW_KEYS - set(row)
    assert row["rounds"] == 2 and row["stable_1t"] is False and row["stable_2t"] is False  # 2 rounds never settle
    assert all(row[k] > 0 for k in ROW_KEYS if k.startswith(("tether_ms", "ort_ms", "ratio")))
    assert row["max_abs_err"] < 1e-4
    assert re.search(r"^digits .*\*.* 2$", proc.stdout, re.M) and _alone.UNSTABLE_NOTE in proc.stdout


def test_bench_threads_gives_each_runtimes_speedup_alone(tmp_path: pathlib.Path):
    proc, rows = run_bench_script("bench_threads", tmp_path, "--models", "digits", "--min-rounds", "2",
                                  "--max-rounds", "2", "--profile", "2", timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("load average at start: ") and lines[-1].startswith("load average at end: ")
    assert lines[1].split() == ["model", "compile", "kern", "tether", "1t", "ort", "1t", "ratio", "tether", "2t",
                                "ort", "2t", "ratio", "max", "err", "rounds", "tth", "1/2", "ort", "1/2"]
    assert re.match(r"digits .*\*.* 2 +\d+\.\d\dx +\d+\.\d\dx$", lines[2]), lines[2]
    assert lines[3].startswith("  kernels alone: sum ") and all(ln.startswith("    deploy_") for ln in lines[4:6])
    assert lines[6].startswith("geometric mean ratio at 1 thread(s)") and _alone.UNSTABLE_NOTE in lines
    (row,) = rows
    assert ROW_KEYS <= set(row), ROW_KEYS - set(row)
    assert row["rounds"] == 2 and row["max_abs_err"] < 1e-4
    assert row["profile"] and all(p["seconds_1t"] > 0 and p["seconds_2t"] > 0 for p in row["profile"])
