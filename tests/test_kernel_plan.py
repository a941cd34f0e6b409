"""The kernel plan (graph/plan.py) is the one place that decides which node becomes which kernel: `tether tune`
measures its tasks and build_graph compiles them, so the two cannot disagree; the op table refuses a second
definition or strategy of an op."""
from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner
from fixtures.saved_model import save_and_import
from onnx import TensorProto, helper, numpy_helper

import tether
from tether.cli.main import cli
from tether.frontend import from_onnx
from tether.graph import numpy_nodes
from tether.graph.plan import plan_kernels
from tether.kernels import core, core_te
from tether.kernels.registry import DeviceNumpy, OpDef, OpTable, TeLowering
from tether.kernels.table import OPS
from tether.tune import log as tlog
from tether.tune.tasks import extract_tasks


def _nonzero_model():
    """x -> conv3x3 -> relu -> softmax (a loop-IR kernel) and relu -> NonZero (numpy on the device)."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Softmax", ["r"], ["s"], axis=-1),
             helper.make_node("NonZero", ["r"], ["nz"])]
    graph = helper.make_graph(nodes, "nonzero", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, 3, 8, 8))],
                              [helper.make_tensor_value_info("s", TensorProto.FLOAT, (1, 4, 8, 8)),
                               helper.make_tensor_value_info("nz", TensorProto.INT64, None)], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


@pytest.fixture(scope="module")
def nonzero(tmp_path_factory):
    return save_and_import(_nonzero_model(), tmp_path_factory.mktemp("plan-model"), "nonzero.onnx")


def test_the_plan_gives_each_node_its_strategy(nonzero):
    _, graph, params = nonzero
    plan = plan_kernels(graph, params, "host")
    by_name = {t.name: t for t in plan.tasks}
    conv, softmax = by_name["conv2d+relu"].strategy, by_name["softmax"].strategy
    assert conv.lowering == "te" and conv.tunable
    assert softmax.lowering == "loop_ir" and not softmax.tunable
    numpy_rows = [k for k, n in enumerate(plan.graph.nodes) if numpy_nodes.is_numpy(n)]
    assert numpy_rows and all(plan.task_of_node[k] is None for k in numpy_rows)
    for index, task in enumerate(plan.tasks):
        assert task.weight == len(task.nodes) >= 1
        assert all(plan.task_of_node[k] == index for k in task.nodes)


def test_tune_works_on_a_model_with_a_numpy_node(nonzero, tracker_lab, tmp_path):
    """NonZero runs as numpy on the device: no kernel, so no tuning task (extraction used to lower it to te and
    fail); the conv is a task, and a short real tuning run measures it."""
    model, graph, params = nonzero
    tasks = extract_tasks(graph, params, "host")
    assert [t.name for t in tasks] == ["conv2d+relu"]
    tracker = tracker_lab.tracker()
    tracker_lab.device(tracker, "tunebox")
    path = str(tmp_path / "tune.jsonl")
    out = CliRunner().invoke(cli, ["tune", model, "--tracker", "127.0.0.1:%d" % tracker.port, "--key", "tunebox",
                                   "--log", path, "--trials", "3", "--build-jobs", "1", "--repeat", "2",
                                   "--min-repeat-ms", "1", "--no-progress"])
    assert out.exit_code == 0, out.output
    ok = [r for r in tlog.results(tlog.read_log(path)) if r["status"] == "ok"]
    assert ok and {r["task"] for r in ok} == {tasks[0].key}


def test_a_tuned_build_compiles_every_tuned_task(tmp_path):
    """Build from a tuning log: every task key of the log is a task of the plan the build compiled, and the
    build's kernels are exactly the plan's tasks."""
    rng = np.random.default_rng(1)
    inits = [numpy_helper.from_array(rng.standard_normal((16, 16, 3, 3)).astype(np.float32) * 0.2, "w%d" % i)
             for i in (1, 2)]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c2"], ["r2"]),
             helper.make_node("Softmax", ["r2"], ["y"], axis=-1)]
    g = helper.make_graph(nodes, "tuned", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, 16, 10, 10))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, (1, 16, 10, 10))], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    graph, params = from_onnx(model)
    tasks = extract_tasks(graph, params, "host")
    path = str(tmp_path / "tune.jsonl")
    with tlog.TuningLog(path) as out:
        for task in tasks:
            out.write(task.record())
            config = task.space.default()
            if "conv_panel" in config:    # a tuned panel width repacks the weights too
                config = dict(config, conv_panel=dict(task.space.knobs)["conv_panel"][-1])
            out.write({"task": task.key, "target": tlog.target_id("host"), "config": config, "status": "ok",
                       "latency_s": 1e-3})
    tuned = tlog.best_configs(path, "host")
    assert set(tuned) == {t.key for t in tasks}
    plan = plan_kernels(graph, params, "host")
    factory = tether.build_graph(graph, params, target="host", tuning_log=path)
    assert set(tuned) <= {t.key for t in plan.tasks}
    assert factory.kernel_count == len(plan.tasks)
    # every node that runs a kernel calls the function of its plan task
    funcs = [n["func"] for n in factory.graph_json["nodes"]]
    assert len(funcs) == sum(t.weight for t in plan.tasks)
    assert sorted(set(funcs)) == sorted(factory.lib.function_names)
    # and the tuned build computes what the numpy reference does
    from tether import graph_executor
    from tether.graph import reference

    factory.export(str(tmp_path / "out"))
    gm = graph_executor.load(str(tmp_path / "out"))
    x = rng.standard_normal((1, 16, 10, 10)).astype(np.float32)
    gm.set_input("x", x)
    gm.run()
    np.testing.assert_allclose(gm.get_output(0), reference.run(graph, params, {"x": x})[0], rtol=1e-4, atol=1e-5)


def test_the_table_refuses_a_second_definition_or_strategy():
    table = OpTable()
    relu = core.DEFINITIONS["relu"]
    table.define(relu)
    with pytest.raises(ValueError, match="'relu' is defined twice"):
        table.define(OpDef("relu", "elemwise", relu.infer, relu.ref))
    table.add_strategy("cpu", "relu", TeLowering(core_te.LOWERINGS["relu"]))
    with pytest.raises(ValueError, match="'relu' has a second cpu strategy"):
        table.add_strategy("cpu", "relu", DeviceNumpy())
    with pytest.raises(ValueError, match="unknown target kind 'gpu'"):
        table.add_strategy("gpu", "relu", DeviceNumpy())
    with pytest.raises(ValueError, match="'sigmoid', which has no definition"):
        table.add_strategy("cpu", "sigmoid", TeLowering(core_te.LOWERINGS["sigmoid"]))
    # the assembled table: a second registration of an op it holds raises too
    with pytest.raises(ValueError, match="defined twice"):
        OPS.define(core.DEFINITIONS["conv2d"])
    with pytest.raises(ValueError, match="second cpu strategy"):
        OPS.add_strategy("cpu", "conv2d", TeLowering(core_te.LOWERINGS["conv2d"]))


def test_every_op_has_a_cpu_strategy_unless_it_is_a_view():
    missing = [op for op in OPS if OPS.strategy(op, "cpu") is None and OPS.pattern(op) != "alias"]
    assert not missing, missing
    numpy_ops = sorted(op for op in OPS if OPS.pattern(op) == "numpy")
    assert numpy_ops and all(isinstance(OPS.strategy(op, "cpu"), DeviceNumpy) for op in numpy_ops)
