#!/usr/bin/env python3
"""Tuning with builds on a Ray cluster: candidates built per minute over one 1-CPU node and over two, side by side
in one run, with the same seed, on a local cluster on loopback; prints both rates and their ratio, and whether
the runs (and a run with forked builds here) measured the same configs and found the same best ones.

    python scripts/bench_ray.py [--rounds 3] [--trials 6] [--no-forked] [--json out.json]

One cluster of two 1-CPU nodes serves both: a "1 node" run pins its builds to the head node (a node-affinity
strategy in the build tasks' Ray options), a "2 nodes" run lets Ray place them. The runs alternate, 1 node then
2 nodes, `--rounds` times, and the medians are compared, so a change of the machine's load during the benchmark
moves both.

The model: a chain of convolutions of different shapes (each a task with its own LLVM-heavy kernel), so the
builds are CPU-bound. Each run starts from empty caches: a fresh local object cache, a fresh artifact store on
the cluster, and nodes that compile without the object cache. Measurement runs on `--devices` `rpc-server`s on
loopback (through a tracker) with light options (2 repeats, no cache flush): its CPU is taken from the same cores the
builds use, so it is kept small. A 2-core box: one node is one CPU, two nodes are both.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import uuid

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
from _tune_lab import device_pool  # noqa: E402
from fixtures.ray_cluster import LocalRayCluster  # noqa: E402

# (out channels, stride) of each conv after the 16-channel input: every shape a different kernel (task)
CONVS = [(16, 1), (24, 1), (24, 2), (32, 1), (32, 2), (40, 1), (48, 1), (48, 2), (56, 1), (64, 1), (64, 2),
         (72, 1)]


def conv_chain():
    """An ONNX model: 3x3 conv + relu layers of different shapes on a 1x16x32x32 input."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes, inits, prev, cin, size = [], [], "x", 16, 32
    for k, (cout, stride) in enumerate(CONVS):
        w = "w%d" % k
        inits.append(numpy_helper.from_array((rng.standard_normal((cout, cin, 3, 3)) * 0.1).astype(np.float32), w))
        nodes.append(helper.make_node("Conv", [prev, w], ["c%d" % k], pads=[1, 1, 1, 1], strides=[stride, stride]))
        nodes.append(helper.make_node("Relu", ["c%d" % k], ["r%d" % k]))
        prev, cin, size = "r%d" % k, cout, (size + 2 - 3) // stride + 1
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, 16, 32, 32))],
                              [helper.make_tensor_value_info(prev, TensorProto.FLOAT, (1, cin, size, size))], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.checker.check_model(model)
    return model


def cpu_seconds(cluster):
    """CPU seconds used so far by: Ray's worker processes (the builds), Ray's other processes, this process and
    its children (the tuner, the measurement client, the tracker and device servers)."""
    tick = os.sysconf("SC_CLK_TCK")

    def used(pid):
        try:
            with open("/proc/%d/stat" % pid) as fh:
                f = fh.read().rsplit(")", 1)[1].split()
            return (int(f[11]) + int(f[12])) / tick
        except OSError:
            return 0.0

    def worker(pid):
        # a Ray worker names itself after its task (ray::IDLE between tasks); the agents and the store are not
        try:
            with open("/proc/%d/comm" % pid) as fh:
                comm = fh.read().strip()
        except OSError:
            return False
        return comm.startswith("ray::") and not comm.startswith(("ray::Dashboard", "ray::RuntimeEnv",
                                                                 "ray::ArtifactSt"))

    with open("/proc/stat") as fh:
        cpu = [int(x) for x in fh.readline().split()[1:]]

    ray_pids = [p for node in cluster.nodes for p in node.pids()] if cluster is not None else []
    me = os.times()
    return {"builds": sum(used(p) for p in ray_pids if worker(p)),
            "ray": sum(used(p) for p in ray_pids if not worker(p)),
            "driver": me.user + me.system + me.children_user + me.children_system,
            "machine": (sum(cpu[:8]) - cpu[3] - cpu[4]) / tick}


def tune_once(tasks, tracker, trials, seed, ray_address, cache_dir, task_options=None, cluster=None):
    from tether.tune import log as tlog
    from tether.tune.measure import MeasureOptions
    from tether.tune.search import Tuner, TuneOptions
    from tether.tune.space import config_key

    os.environ["TETHER_CACHE_DIR"] = cache_dir
    with tempfile.TemporaryDirectory(prefix="bench-ray-") as tmp:
        path = os.path.join(tmp, "tune.jsonl")
        store = "bench-%s" % uuid.uuid4().hex      # an empty cluster cache for this run
        opts = TuneOptions(trials=trials, build_jobs=1, seed=seed, ray=ray_address, ray_store=store,
                           ray_task_options=task_options,
                           verify_rounds=0, measure=MeasureOptions(repeat=2, min_repeat_ms=0.5, flush_bytes=0))
        tuner = Tuner(tasks, path, tracker, "host", options=opts)
        before = cpu_seconds(cluster)
        summary = tuner.run()
        after = cpu_seconds(cluster)
        results = tlog.results(tlog.read_log(path))
    stats = getattr(tuner.builder, "stats", None)
    built = stats["built"] if stats else len(results)
    if stats and (stats["cluster_hits"] or stats["local_hits"]):
        raise SystemExit("a cache answered in a run meant to build everything: %s (store %s)"
                         % (stats, store))
    return {"built": built, "seconds": summary["elapsed_s"], "per_min": 60.0 * built / summary["elapsed_s"],
            "build_s_median": statistics.median(r["build_s"] for r in results),
            "measure_s_median": statistics.median(r["measure_s"] for r in results),
            "cpu_s": {k: round(after[k] - before[k], 1) for k in after},
            "configs": sorted((r["task"], config_key(r["config"]), r["status"]) for r in results),
            "best": {row["task"]: config_key(row["best_config"]) for row in summary["tasks"] if row["best_config"]}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3, help="1-node and 2-node runs, alternating, this many each")
    ap.add_argument("--trials", type=int, default=6, help="configs per task (up to 6: all drawn from the seed)")
    ap.add_argument("--devices", type=int, default=4,
                    help="rpc-servers measuring (enough that measurement never waits on builds' behalf)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--no-forked", action="store_true", help="skip the run with forked builds on this machine")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    from tether.frontend import from_onnx
    from tether.tune.tasks import extract_tasks

    graph, params = from_onnx(conv_chain())
    tasks = extract_tasks(graph, params, "host", only=["conv2d"])
    print("%d tasks, %d trials each (seed %d)" % (len(tasks), args.trials, args.seed), flush=True)
    runs = {}
    with tempfile.TemporaryDirectory(prefix="bench-ray-cache-") as caches, device_pool(args.devices) as tracker:
        t0 = time.monotonic()
        cluster = LocalRayCluster(cpus=1)
        try:
            print("Ray head node up in %.1f s" % (time.monotonic() - t0), flush=True)
            t0 = time.monotonic()
            cluster.add_node(cpus=1)
            print("second node joined in %.1f s" % (time.monotonic() - t0), flush=True)
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            from tether.tune.ray_build import connect

            ray = connect(cluster.address)
            head = next(n["NodeID"] for n in ray.nodes() if cluster.nodes[0].temp_dir in n["RayletSocketName"])
            on_head = {"scheduling_strategy": NodeAffinitySchedulingStrategy(head, soft=False)}
            for k in range(args.rounds):
                for name, options in (("ray, 1 node", on_head), ("ray, 2 nodes", None)):
                    r = tune_once(tasks, tracker, args.trials, args.seed, cluster.address,
                                  os.path.join(caches, "%s-%d" % (name[5], k)), options, cluster)
                    runs.setdefault(name, []).append(r)
                    print("round %d, %-13s %3d candidates built in %5.1f s: %6.1f candidates/min (median build "
                          "%.0f ms, measurement %.0f ms)" % (k + 1, name + ":", r["built"], r["seconds"],
                                                              r["per_min"], r["build_s_median"] * 1e3,
                                                              r["measure_s_median"] * 1e3), flush=True)
                    print("         CPU seconds: builds %(builds).1f, other Ray processes %(ray).1f, this process "
                          "%(driver).1f; the whole machine %(machine).1f" % r["cpu_s"], flush=True)
        finally:
            import ray

            ray.shutdown()
            cluster.stop()
        if not args.no_forked:
            r = tune_once(tasks, tracker, args.trials, args.seed, None, os.path.join(caches, "forked"))
            runs["forked, 1 job"] = [r]
            print("forked, 1 job:  %3d candidates built in %5.1f s: %6.1f candidates/min" % (
                r["built"], r["seconds"], r["per_min"]), flush=True)
    print()
    medians = {name: statistics.median(r["per_min"] for r in rs) for name, rs in runs.items()}
    for name, rate in medians.items():
        print("%-14s median %6.1f candidates/min over %d run(s)" % (name, rate, len(runs[name])))
    ratio = medians["ray, 2 nodes"] / medians["ray, 1 node"]
    print("ratio, 2 nodes / 1 node: %.2fx (target >= 1.7x)" % ratio)
    every = [r for rs in runs.values() for r in rs]
    first = runs["ray, 1 node"][0]
    same_configs = all(r["configs"] == first["configs"] for r in every)
    agree = sum(1 for r in every[1:] for t, b in first["best"].items() if r["best"].get(t) == b)
    print("same configs measured, with the same outcome, in all %d runs: %s" % (len(every),
                                                                             "yes" if same_configs else "NO"))
    print("best config per task equal to the first run's: %d of %d (task, run) pairs; a best picked among configs "
          "within each other's noise may differ" % (agree, len(first["best"]) * (len(every) - 1)))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"runs": runs, "medians": medians, "ratio": ratio, "same_configs": same_configs,
                       "best_agree": agree}, fh, indent=1)


if __name__ == "__main__":
    main()
