"""Builds on a real local Ray cluster (two 1-CPU nodes on loopback, started once for the module): tuning with
--ray measures the same configs with the same artifacts as forked builds, no build runs twice (within a run, on
the cluster, on this machine), a node killed mid-run loses no build, and `tether build-many --ray` writes what
`tether compile` writes."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
import uuid

import pytest
from fixtures.prereq import require_module
from fixtures.ray_cluster import LocalRayCluster
from fixtures.saved_model import save_and_import
from test_tune import FAST, _no_duplicates, _results, _tiny_model

from tether.tune.measure import Candidate
from tether.tune.search import Tuner, TuneOptions
from tether.tune.space import config_key
from tether.tune.tasks import extract_tasks

WAIT = 300.0      # bound on any wait for builds (a loaded 2-core box; never asserted as a timing)


@pytest.fixture(scope="module")
def cluster():
    require_module("ray", "pip install 'tether[ray]'")
    c = LocalRayCluster(cpus=1)
    try:
        c.second = c.add_node(cpus=1)
        yield c
    finally:
        import ray

        ray.shutdown()
        c.stop()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return save_and_import(_tiny_model(), tmp_path_factory.mktemp("ray-model"), "tiny.onnx")


@pytest.fixture
def local_cache(tmp_path, monkeypatch):
    """This process's object cache in a fresh folder (the artifacts the Ray builds leave here)."""
    monkeypatch.setenv("TETHER_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("TETHER_OBJECT_CACHE", raising=False)
    return tmp_path / "cache"


def _build_all(builder, cands):
    """Submit every candidate; wait (bounded) for all of them; {seq: (path bytes or None, error)}."""
    done = threading.Event()
    out = {}
    lock = threading.Lock()

    def finished(cand, error):
        data = None
        if cand.path:
            with open(cand.path, "rb") as fh:
                data = fh.read()
        with lock:
            out[cand.seq] = (data, error)
            if len(out) == len(cands):
                done.set()

    for cand in cands:
        builder.submit(cand, finished)
    assert done.wait(WAIT), "only %d of %d builds came back" % (len(out), len(cands))
    return out


def _local_so(task, config, tmp_path):
    """The candidate built in this process, under the file name (its soname) the Ray builds use."""
    from tether.tune.ray_build import CANDIDATE_FILE

    folder = tmp_path / uuid.uuid4().hex
    folder.mkdir()
    path = str(folder / CANDIDATE_FILE)
    task.build(config).export_library(path)
    with open(path, "rb") as fh:
        return fh.read()


def test_tune_on_ray_measures_what_forked_builds_measure(tiny, cluster, tracker_lab, local_cache, tmp_path):
    _, graph, params = tiny
    tasks = extract_tasks(graph, params, "host")
    tracker = tracker_lab.tracker()
    tracker_lab.device(tracker, "tunebox")
    runs = {}
    for name, ray_address in (("forked", None), ("ray", cluster.address)):
        path = str(tmp_path / ("%s.jsonl" % name))
        tuner = Tuner(tasks, path, "127.0.0.1:%d" % tracker.port, "tunebox",
                      options=TuneOptions(trials=6, build_jobs=1, seed=7, measure=FAST, ray=ray_address))
        tuner.run()
        results = _results(path)
        _no_duplicates(results)
        runs[name] = ({(r["task"], config_key(r["config"])): r["status"] for r in results}, tuner)
    # the same seed draws the same configs of every task, whoever builds them, with the same outcome
    assert runs["ray"][0] == runs["forked"][0]
    assert all(status == "ok" for status in runs["ray"][0].values())
    assert len(runs["ray"][0]) == sum(min(6, t.space.size) for t in tasks)
    stats = runs["ray"][1].builder.stats
    assert stats["built"] == len(runs["ray"][0]) and stats["errors"] == 0
    # and the .so the cluster built is byte for byte the one this machine builds
    from tether.tune.ray_build import _local_load, artifact_key

    conv = next(t for t in tasks if t.name == "conv2d+relu")
    for task_key, cfg_key in sorted(runs["ray"][0])[:4]:
        task = next(t for t in tasks if t.key == task_key)
        cfg = next(c for c in task.space.all_configs(1 << 20) if config_key(c) == cfg_key)
        hit = _local_load(artifact_key(task, cfg))
        assert hit is not None and hit["error"] is None
        assert hit["blob"] == _local_so(task, cfg, tmp_path)
    assert any(k[0] == conv.key for k in runs["ray"][0])


def test_no_build_runs_twice(tiny, cluster, local_cache, tmp_path, monkeypatch):
    from tether.tune.ray_build import RayBuilder

    _, graph, params = tiny
    tasks = extract_tasks(graph, params, "host")
    pool = next(t for t in tasks if t.name == "max_pool")
    configs = pool.space.all_configs(1 << 20)[:3]
    bad = dict(configs[0], window_unroll=-1)          # refused by the schedules: an error, cached like an artifact
    index = tasks.index(pool)
    store = "test-store-%s" % uuid.uuid4().hex

    def cands():
        # every config twice in one run: the second request shares the first's build
        return [Candidate(index, dict(c), seq=k) for k, c in enumerate(configs + [bad] + configs + [bad])]

    first = RayBuilder(tasks, str(tmp_path), cluster.address, store=store)
    got = _build_all(first, cands())
    n = len(configs) + 1
    assert first.stats == {"built": n, "cluster_hits": 0, "run_hits": n, "local_hits": 0, "errors": 0}
    for k, cfg in enumerate(configs):
        assert got[k][1] is None and got[k][0] == got[k + n][0] == _local_so(pool, cfg, tmp_path)
    assert got[n - 1][0] is None and "window_unroll" in got[n - 1][1] and got[2 * n - 1] == got[n - 1]
    # another machine (an empty local cache) asking the same cluster: the cluster's store answers
    monkeypatch.setenv("TETHER_CACHE_DIR", str(tmp_path / "other-machine"))
    second = RayBuilder(tasks, str(tmp_path), cluster.address, store=store)
    again = _build_all(second, cands()[:n])
    assert second.stats["built"] == 0 and second.stats["cluster_hits"] == n
    assert {k: v for k, v in again.items()} == {k: got[k] for k in range(n)}
    # and this machine again: its local cache answers without asking the cluster
    third = RayBuilder(tasks, str(tmp_path), cluster.address, store=store)
    assert _build_all(third, cands()[:n]) == again
    assert third.stats["local_hits"] == n and third.stats["built"] == third.stats["cluster_hits"] == 0


def test_build_many_on_ray_writes_what_compile_writes(tiny, cluster, local_cache, tmp_path):
    model = tiny[0]
    env = dict(os.environ, PYTHONPATH=cluster.env["PYTHONPATH"])

    def tether(*args):
        done = subprocess.run([sys.executable, "-m", "tether.cli.main", *args], capture_output=True, text=True,
                              timeout=WAIT, env=env)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    tether("compile", model, "-o", str(tmp_path / "compiled"))
    out = tether("build-many", model, "--ray", cluster.address, "-o", str(tmp_path / "many"))
    assert "(built)" in out or "(cluster)" in out, out
    for name in ("deploy.so", "deploy.json", "deploy.params"):
        with open(tmp_path / "compiled" / name, "rb") as a, open(tmp_path / "many" / "tiny" / name, "rb") as b:
            assert a.read() == b.read(), name
    # the same model again: this machine's cache has it, nothing goes to the cluster
    assert "(local)" in tether("build-many", model, "--ray", cluster.address, "-o", str(tmp_path / "again"))


def test_ray_missing_is_one_line(tiny, tmp_path):
    # an interpreter where `import ray` fails, as on a machine without the extra
    code = ("import sys; sys.modules['ray'] = None; from tether.cli.main import cli; "
            "cli(['tune', %r, '--tracker', '127.0.0.1:9', '--key', 'k', '--log', %r, '--ray', '127.0.0.1:1'])"
            % (tiny[0], str(tmp_path / "t.jsonl")))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert lines == ["Error: --ray needs Ray, which is not installed: pip install 'tether[ray]'"], done.stderr


def test_unreachable_head_is_one_line(tiny, tmp_path):
    require_module("ray", "pip install 'tether[ray]'")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]          # nothing listens there once it is closed
    done = subprocess.run([sys.executable, "-m", "tether.cli.main", "tune", tiny[0], "--tracker", "127.0.0.1:9",
                           "--key", "k", "--log", str(tmp_path / "t.jsonl"), "--ray", "127.0.0.1:%d" % port],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "Error: cannot reach the Ray cluster's head at 127.0.0.1:%d: [Errno 111] Connection refused (start it with "
        "`ray start --head`)" % port], done.stderr


def test_node_killed_mid_run_loses_no_build(tiny, cluster, local_cache, tmp_path):
    """Last in the module: it leaves the cluster with one node."""
    import ray

    from tether.tune.ray_build import RayBuilder

    _, graph, params = tiny
    tasks = extract_tasks(graph, params, "host")
    conv = next(t for t in tasks if t.name == "conv2d+relu")
    configs = conv.space.all_configs(1 << 20)[:10]
    index = tasks.index(conv)
    victim = cluster.second
    seen = []
    state = {"victim": None, "killed_at": None, "running": None}
    first_on_victim = threading.Event()

    def on_built(cand, node):
        # runs in Ray's callback thread: never block it (the killer below waits on the cluster instead)
        seen.append(node)
        if node == state["victim"]:
            first_on_victim.set()

    def killer():
        if not first_on_victim.wait(WAIT):
            return
        node = state["victim"]
        # once the node is running its next build (started, not finished): kill it
        for _ in range(3000):
            act = builder.cluster.activity()
            if act["started"].get(node, 0) > act["finished"].get(node, 0):
                break
            time.sleep(0.01)
        state["running"] = act["started"].get(node, 0) - act["finished"].get(node, 0)
        state["killed_at"] = len(seen)
        cluster.kill_node(victim)

    builder = RayBuilder(tasks, str(tmp_path), cluster.address, on_built=on_built,
                         store="test-store-%s" % uuid.uuid4().hex)
    assert builder.jobs == 2
    state["victim"] = next(n["NodeID"] for n in ray.nodes() if victim.temp_dir in n["RayletSocketName"])
    kill_thread = threading.Thread(target=killer, daemon=True)
    kill_thread.start()
    got = _build_all(builder, [Candidate(index, dict(c), seq=k) for k, c in enumerate(configs)])
    kill_thread.join(WAIT)
    assert state["killed_at"] is not None, "no build ran on the second node"
    # every build came back, built (on the surviving node after the kill), and is what this machine builds
    assert builder.stats["errors"] == 0 and builder.stats["built"] == len(configs)
    assert all(node != state["victim"] for node in seen[state["killed_at"]:])
    # the build the dead node was running started again on the other node
    assert state["running"] == 1
    act = builder.cluster.activity()
    assert sum(act["started"].values()) == len(configs) + 1
    assert act["finished"].get(state["victim"], 0) == act["started"][state["victim"]] - 1
    for k, cfg in enumerate(configs):
        assert got[k][1] is None, got[k][1]
        assert got[k][0] == _local_so(conv, cfg, tmp_path)
