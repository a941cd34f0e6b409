"""tether tune with a real tracker and real device servers on loopback: task extraction, tuning logs
used by build_graph, wrong results and build errors recorded, a device killed mid-measurement, kill + --resume."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass

import numpy as np
import pytest
from fixtures.polling import wait_until
from fixtures.saved_model import save_and_import

import tether
from tether import te
from tether.errors import TetherError
from tether.tune import log as tlog
from tether.tune.measure import MeasureOptions
from tether.tune.search import Tuner, TuneOptions
from tether.tune.space import NEVER_PARALLEL, ConfigSpace, config_key
from tether.tune.tasks import Task, extract_tasks

FAST = MeasureOptions(repeat=2, min_repeat_ms=1.0, timeout=20.0)


def _tiny_model():
    """x -> conv3x3 -> relu -> conv3x3 -> relu (the same kernel twice) -> conv3x3 -> relu -> + x -> maxpool."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((8, 8, 3, 3)).astype(np.float32) * 0.3, "w%d" % i)
             for i in (1, 2, 3)]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c2"], ["r2"]),
             helper.make_node("Conv", ["r2", "w3"], ["c3"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c3"], ["r3"]),
             helper.make_node("Add", ["r3", "x"], ["s"]),
             helper.make_node("MaxPool", ["s"], ["y"], kernel_shape=[2, 2], strides=[2, 2])]
    graph = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, 8, 12, 12))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, (1, 8, 6, 6))], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.checker.check_model(model)
    return model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return save_and_import(_tiny_model(), tmp_path_factory.mktemp("tune-model"), "tiny.onnx")


def _results(path):
    return tlog.results(tlog.read_log(path))


def _no_duplicates(results):
    keys = [(r["task"], config_key(r["config"])) for r in results]
    assert len(keys) == len(set(keys)), "a config was measured twice"


def test_tasks_are_the_build_kernels_deduplicated_and_weighted(tiny):
    _, graph, params = tiny
    tasks = extract_tasks(graph, params, "host")
    factory = tether.build_graph(graph, params, target="host")
    # one task per distinct kernel of the build, weighted by the nodes that run it
    assert len(tasks) == factory.kernel_count
    assert sum(t.weight for t in tasks) == len(factory.graph_json["nodes"])
    conv = [t for t in tasks if t.name == "conv2d+relu"]
    assert len(conv) == 1 and conv[0].weight == 2 and conv[0].space.kind == "conv2d_pixels"
    assert len({t.key for t in tasks}) == len(tasks)
    assert tasks == sorted(tasks, key=lambda t: -t.weight)
    # the key depends on the target: a log for one target never applies to another
    assert {t.key for t in extract_tasks(graph, params, "rasp4b")}.isdisjoint({t.key for t in tasks})


def test_build_graph_takes_the_best_config_of_the_log(tiny, tmp_path):
    _, graph, params = tiny
    tasks = extract_tasks(graph, params, "host")
    conv = next(t for t in tasks if t.name == "conv2d+relu")
    fast = dict(conv.space.default(), conv_pixels=1, conv_order="panels")
    slow = dict(conv.space.default(), conv_pixels=2)
    path = str(tmp_path / "tune.jsonl")
    with tlog.TuningLog(path) as out:
        out.write(conv.record())
        for cfg, lat in ((slow, 2e-3), (fast, 1e-3), (conv.space.default(), 3e-3)):
            out.write({"task": conv.key, "target": tlog.target_id("host"), "config": cfg, "status": "ok",
                       "latency_s": lat})
        out.write({"task": conv.key, "target": tlog.target_id("host"), "config": dict(fast, conv_pixels=3),
                   "status": "wrong_result", "latency_s": None, "error": "differs"})
    assert tlog.best_configs(path, "host") == {conv.key: fast}
    assert tlog.best_configs(path, "rasp4b") == {}
    # a verification that finds the default faster overrules the search's single measurement
    verify_path = str(tmp_path / "verified.jsonl")
    with open(path) as src, open(verify_path, "w") as dst:
        dst.write(src.read())
    with tlog.TuningLog(verify_path) as out:
        for cfg, lats in ((fast, (2.1e-3, 1.9e-3, 2.0e-3)), (conv.space.default(), (1.5e-3, 1.6e-3, 9e-3))):
            for lat in lats:
                out.write({"kind": "verify", "task": conv.key, "target": tlog.target_id("host"), "config": cfg,
                           "status": "ok", "latency_s": lat})
    assert tlog.best_configs(verify_path, "host") == {conv.key: conv.space.default()}
    default = tether.build_graph(graph, params, target="host")
    tuned = tether.build_graph(graph, params, target="host", tuning_log=path)
    assert tuned.lib.get_source("ll") != default.lib.get_source("ll")
    # the tuned build computes what the graph's numpy reference computes
    x = np.random.default_rng(1).standard_normal((1, 8, 12, 12)).astype(np.float32)
    out_dir = tmp_path / "tuned"
    tuned.export(str(out_dir))
    from tether import graph_executor

    gm = graph_executor.load(str(out_dir))
    gm.set_input("x", x)
    gm.run()
    got = gm.get_output(0)
    import onnxruntime as ort

    sess = ort.InferenceSession(_tiny_model().SerializeToString(), providers=["CPUExecutionProvider"])
    ref = sess.run(None, {"x": x})[0]
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
    with pytest.raises(FileNotFoundError, match="tether tune"):
        tether.build_graph(graph, params, target="host", tuning_log=str(tmp_path / "missing.jsonl"))
    # and `tether compile --tuning-log`
    from click.testing import CliRunner

    from tether.cli.main import cli

    out = CliRunner().invoke(cli, ["compile", tiny[0], "--tuning-log", path, "-o", str(tmp_path / "cli")])
    assert out.exit_code == 0, out.output
    with open(tmp_path / "cli" / "deploy.so", "rb") as fh, open(out_dir / "deploy.so", "rb") as tuned_so:
        assert fh.read() == tuned_so.read()


@dataclass(eq=False)
class _Misbehaving(Task):
    """A task whose kernel is real but wrong (out + 1) with parallel_min=NEVER_PARALLEL, and hangs (billions of
    dependent float adds per element) with window_unroll=3: what a broken schedule could do on a device."""

    def build(self, config):
        if config.get("parallel_min") != NEVER_PARALLEL and config.get("window_unroll") != 3:
            return super().build(config)
        from tether import driver, ops
        from tether.tune.tasks import KERNEL_NAME

        placeholders, out = self.lower()
        if config.get("window_unroll") == 3:
            x = placeholders[0]
            k = te.reduce_axis((0, 1 << 24), name="k")
            slow = te.compute(out.shape, lambda *i: te.sum(x[0, 0, (k + i[-1]) % 12, k % 12], axis=k), name="slow")
            bad = te.compute(out.shape, lambda *i: out(*i) + slow(*i), name="hang")
        else:
            bad = te.compute(out.shape, lambda *i: out(*i) + 1.0, name="wrong")
        sch = ops.schedule([bad], self.target, config=config)
        return driver.build(sch, placeholders + [bad], target=self.target, name=KERNEL_NAME, jobs=1)


def test_failures_are_recorded_with_their_reason(tiny, tracker_lab, tmp_path):
    _, graph, params = tiny
    pool = next(t for t in extract_tasks(graph, params, "host") if t.name == "max_pool")
    fam_default = pool.space.default()["parallel_min"]
    fields = {f: getattr(pool, f) for f in Task.__dataclass_fields__}
    fields["space"] = ConfigSpace("pool", (("parallel_min", (fam_default, NEVER_PARALLEL)),
                                           ("window_unroll", (7, 0, 3))))     # 0 is not a valid knob value
    task = _Misbehaving(**fields)
    tracker = tracker_lab.tracker()
    tracker_lab.device(tracker, "tunebox")
    path = str(tmp_path / "tune.jsonl")
    tuner = Tuner([task], path, "127.0.0.1:%d" % tracker.port, "tunebox",
                  options=TuneOptions(trials=6, build_jobs=1, measure=MeasureOptions(
                      repeat=2, min_repeat_ms=1.0, timeout=1.0, max_attempts=2)))
    summary = tuner.run()
    by_cfg = {config_key(r["config"]): r for r in _results(path)}
    assert len(by_cfg) == 6

    def rec(pm, wu):
        return by_cfg[config_key({"parallel_min": pm, "window_unroll": wu})]
    ok = rec(fam_default, 7)
    assert ok["status"] == "ok" and ok["latency_s"] > 0
    wrong = rec(NEVER_PARALLEL, 7)
    assert wrong["status"] == "wrong_result" and "differ" in wrong["error"]
    for pm in (fam_default, NEVER_PARALLEL):
        bad = rec(pm, 0)
        assert bad["status"] == "build_error" and "window_unroll" in bad["error"]
        hung = rec(pm, 3)
        assert hung["status"] == "timeout", hung
        assert [a["status"] for a in hung["attempts"]] == ["timeout", "timeout"]
    assert summary["tasks"][0]["failures"] == {"wrong_result": 1, "build_error": 2, "timeout": 2}


def _listening_pid(port: int, candidates) -> int:
    """The PID among `candidates` that owns the socket listening on 127.0.0.1:`port` (from /proc)."""
    inode = None
    with open("/proc/net/tcp") as fh:
        for line in fh.readlines()[1:]:
            f = line.split()
            if int(f[1].split(":")[1], 16) == port and f[3] == "0A":
                inode = f[9]
    assert inode is not None, "nothing listens on port %d" % port
    for pid in candidates:
        for fd in os.listdir("/proc/%d/fd" % pid):
            try:
                if os.readlink("/proc/%d/fd/%s" % (pid, fd)) == "socket:[%s]" % inode:
                    return pid
            except OSError:
                continue
    raise AssertionError("no device process listens on port %d" % port)


def _kill_tree(pid: int) -> None:
    """SIGKILL a device server and its forked session workers: the device dies as a power cut would kill it."""
    try:
        with open("/proc/%d/task/%d/children" % (pid, pid)) as fh:
            children = [int(x) for x in fh.read().split()]
    except OSError:
        children = []
    for p in [pid] + children:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_device_killed_mid_measurement_is_retried_on_another(tiny, tracker_lab, tmp_path):
    _, graph, params = tiny
    tasks = extract_tasks(graph, params, "host")
    tracker = tracker_lab.tracker(dead_after=2.0)
    devices = [tracker_lab.device(tracker, "tunebox") for _ in range(2)]
    state = {"starts": 0, "killed": None, "new": None}

    def on_start(cand, grant):
        state["starts"] += 1
        if state["starts"] == 4 and state["killed"] is None:
            pid = _listening_pid(grant["port"], [d.proc.pid for d in devices])
            state["killed"] = "%s#%s" % (grant["key"], grant["device"])
            _kill_tree(pid)
            next(d for d in devices if d.proc.pid == pid).proc.wait(5)
            # the same box comes back: a new server registers under the key
            tracker_lab.device(tracker, "tunebox")
            state["new"] = max(d["id"] for d in tracker.summary()["devices"])

    path = str(tmp_path / "tune.jsonl")
    tuner = Tuner(tasks, path, "127.0.0.1:%d" % tracker.port, "tunebox", on_start=on_start,
                  options=TuneOptions(trials=6, build_jobs=1, measure=FAST))
    tuner.run()
    results = _results(path)
    _no_duplicates(results)
    retried = [r for r in results if r["attempts"]]
    assert len(retried) == 1, retried
    (r,) = retried
    assert r["attempts"][0]["device"] == state["killed"] and r["attempts"][0]["status"] == "crash"
    assert r["status"] == "ok" and r["device"] != state["killed"]
    # the end of the run measured each improved task's best and default again, in turns
    verify = [r for r in tlog.read_log(path) if r.get("kind") == "verify"]
    best = {k: config_key(r["config"]) for k, r in tlog.best_results(
        [r for r in tlog.read_log(path) if r.get("kind") == "result"]).items()}
    defaults = {t.key: config_key(t.space.default()) for t in tasks}
    # only a task whose best beat its default is verified: with 6 trials on a tiny model none may have
    improved = {t for t, k in best.items() if k != defaults[t]}
    assert verify or not improved, "improved tasks %s were not verified" % sorted(improved)
    assert all(config_key(r["config"]) in (best[r["task"]], defaults[r["task"]]) for r in verify)
    used = {x["device"] for x in results}
    assert "tunebox#%s" % state["new"] in used, "the re-registered device was never used: %s" % used
    assert all(x["status"] == "ok" for x in results)


def test_measurement_timeout_starts_when_the_device_is_granted(tiny, tracker_lab, tmp_path):
    """A tuner whose only device is held by someone else for several times its --timeout waits in the tracker's
    queue without a single timeout, and measures once the device is free."""
    import threading

    from tether.rpc.tracker_client import connect_tracker

    _, graph, params = tiny
    task = [t for t in extract_tasks(graph, params, "host") if t.name == "max_pool"]
    tracker = tracker_lab.tracker()
    tracker_lab.device(tracker, "tunebox")
    holder = connect_tracker("127.0.0.1", tracker.port)
    held = holder.request("tunebox", wait_timeout=30)
    state = {"released": False, "starts_while_held": 0}
    release = threading.Timer(6.0, lambda: (state.update(released=True), held.close(), holder.close()))

    def on_start(cand, grant):
        if not state["released"]:
            state["starts_while_held"] += 1

    path = str(tmp_path / "tune.jsonl")
    tuner = Tuner(task, path, "127.0.0.1:%d" % tracker.port, "tunebox", on_start=on_start,
                  options=TuneOptions(trials=3, build_jobs=1, measure=MeasureOptions(
                      repeat=2, min_repeat_ms=1.0, timeout=1.0, wait_timeout=1.0)))
    release.start()
    try:
        tuner.run()
    finally:
        release.cancel()
        if not state["released"]:
            held.close()
            holder.close()
    results = _results(path)
    # the device was held for six times the timeout, yet nothing timed out: the wait was not measured
    assert state["starts_while_held"] == 0
    assert len(results) == min(3, task[0].space.size)
    assert all(r["status"] == "ok" and not r["attempts"] for r in results), results


def _processes_mentioning(text):
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as fh:
                if text.encode() in fh.read():
                    pids.append(int(pid))
        except OSError:
            continue
    return pids


def _tune_cmd(model, tracker_port, log_path, *extra):
    return [sys.executable, "-m", "tether.cli.main", "tune", model, "--tracker", "127.0.0.1:%d" % tracker_port,
            "--key", "tunebox", "--log", log_path, "--build-jobs", "1", "--repeat", "2", "--min-repeat-ms", "1",
            "--no-progress", "--only", "max_pool", *extra]


def test_kill_then_resume_measures_nothing_twice(tiny, tracker_lab, tmp_path):
    model = tiny[0]
    tracker = tracker_lab.tracker()
    tracker_lab.device(tracker, "tunebox")
    path = str(tmp_path / "tune.jsonl")
    first = subprocess.Popen(_tune_cmd(model, tracker.port, path, "--trials", "40"), stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: os.path.exists(path) and len(_results(path)) >= 4 or first.poll() is not None, 60,
                   "the first run to log 4 results")
    finally:
        first.kill()
        first.wait(10)
    before = _results(path)
    assert len(before) >= 4
    # its forked build workers leave with it
    wait_until(lambda: not _processes_mentioning(path), 10, "the killed run's build workers to exit")
    # without --resume the log is not silently measured again
    _, graph, params = tiny
    task = [t for t in extract_tasks(graph, params, "host") if t.name == "max_pool"]
    with pytest.raises(TetherError, match="--resume"):
        Tuner(task, path, "127.0.0.1:%d" % tracker.port, "tunebox").run()
    done = subprocess.run(_tune_cmd(model, tracker.port, path, "--trials", "10", "--resume"), capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    after = _results(path)
    _no_duplicates(after)
    assert after[:len(before)] == before
    per_task = {}
    for r in after:
        per_task[r["task"]] = per_task.get(r["task"], 0) + 1
    tasks = [r for r in tlog.read_log(path) if r.get("kind") == "task"]
    assert len(tasks) == len({t["task"] for t in tasks})       # task lines are written once
    for t in tasks:
        size = int(np.prod([len(v) for v in t["space"].values()]))
        assert per_task.get(t["task"], 0) >= min(10, size), t["name"]
    # --report draws one curve per task from the same log
    html_path = str(tmp_path / "tune.html")
    rep = subprocess.run([sys.executable, "-m", "tether.cli.main", "tune", "--log", path, "--report", html_path],
                         capture_output=True, text=True, timeout=60)
    assert rep.returncode == 0, rep.stderr
    text = open(html_path, encoding="utf-8").read()
    assert text.count('data-plot="tuning-curve"') == len(tasks) and "<script" not in text


def test_time_evaluator_flushes_between_samples():
    from tether_rpc import timing

    calls = []
    res = timing.time_evaluator(lambda: calls.append(1), number=1, repeat=3, warmup=0, flush_bytes=1 << 20)
    assert len(res["samples"]) == 3 and len(calls) == 3
    with pytest.raises(ValueError, match="flush_bytes"):
        timing.time_evaluator(lambda: None, flush_bytes=timing.MAX_FLUSH_BYTES + 1)


def test_tune_cli_reaches_a_tracker_and_devices_that_hold_tokens(tiny, tracker_lab, tmp_path):
    """A lab's tracker listens beyond loopback and so has a token: `tether tune` passes it (and the devices' own
    token) on, and without it stops in one line naming the refusal."""
    from click.testing import CliRunner

    from tether.cli.main import cli

    tracker = tracker_lab.tracker(token="lab-secret")
    tracker_lab.device(tracker, "tunebox")
    path = str(tmp_path / "tune.jsonl")
    args = ["tune", tiny[0], "--tracker", "127.0.0.1:%d" % tracker.port, "--key", "tunebox", "--log", path,
            "--trials", "2", "--build-jobs", "1", "--repeat", "2", "--min-repeat-ms", "1", "--no-progress"]
    refused = CliRunner().invoke(cli, args, env={"TETHER_TRACKER_TOKEN": None})
    assert refused.exit_code != 0
    last = refused.output.strip().splitlines()[-1]
    assert "Error:" in last and "token" in last.lower() and "Traceback" not in refused.output, refused.output
    out = CliRunner().invoke(cli, args + ["--tracker-token", "lab-secret"], env={"TETHER_TRACKER_TOKEN": None})
    assert out.exit_code == 0, out.output
    assert [r for r in tlog.results(tlog.read_log(path)) if r["status"] == "ok"]
