#!/usr/bin/env python3
"""Where a model's compile time goes: per model kind, the wall time of from_onnx + build_graph with the object
cache off (cold) and on after one build (warm), and, with ``--phases``, the CPU time of each phase summed over the
kernels (compiled one by one in this process) and the most expensive kernels.

    python scripts/bench_compile.py [--kinds yolov8_detector,...] [--phases] [--top 8]

Phases: lower (schedule -> loop IR), irgen (loop IR -> LLVM IR text, Python), parse (llvmlite parse + verify),
opt (the -O3 pass pipeline), codegen (instruction selection .. object emission). A build spreads the kernels over
worker processes, so its wall time is about (sum of phases) / workers on an idle machine; say the load average
(printed) with any figure, and compare CPU seconds (the "cpu" columns, build workers included) on a shared one.
"""
from __future__ import annotations

import argparse
import collections
import os
import resource
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "src"))
sys.path.insert(0, os.path.join(HERE, "..", "rpc_server"))

PHASES = ("lower", "irgen", "parse", "opt", "codegen")


def _cpu() -> float:
    """CPU seconds of this process and its reaped children (the build workers)."""
    ch = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + ch.ru_utime + ch.ru_stime


def compile_wall(model) -> float:
    return compile_times(model)[0]


def compile_times(model) -> tuple:
    """(wall, CPU) seconds of from_onnx + build_graph; the CPU figure counts the build workers too and, unlike
    the wall time, hardly depends on the load of a shared machine."""
    import tether
    from tether.frontend import from_onnx

    t0, c0 = time.perf_counter(), _cpu()
    graph, params = from_onnx(model)
    tether.build_graph(graph, params, target="host", opt_level=3)
    return time.perf_counter() - t0, _cpu() - c0


def kernel_items(model) -> list:
    """The (schedule, args, name) items build_graph hands to tether.build, caught on the way."""
    import tether
    from tether import driver
    from tether.frontend import from_onnx

    caught = []

    class Caught(Exception):
        pass

    def catch(items, *args, **kwargs):
        caught.extend(items)
        raise Caught()
    real, driver.build = driver.build, catch
    try:
        graph, params = from_onnx(model)
        tether.build_graph(graph, params, target="host", opt_level=3)
    except Caught:
        pass
    finally:
        driver.build = real
    return caught


def phases(items) -> list:
    from tether import driver
    from tether.codegen import emit
    from tether.codegen.function import emit_function
    from tether.codegen.module import ModuleBuilder
    from tether.target import as_target

    tgt = as_target("host")
    tm = tgt.target_machine(3)
    rows = []
    for item in items:
        t = [time.process_time()]
        pf = driver._lowered(item)
        t.append(time.process_time())
        mb = ModuleBuilder(tgt, "profile", part="kernels")
        mb.add_packed(pf, emit_function(mb, pf))
        ir_text = mb.finish()
        t.append(time.process_time())
        mod = emit._parse(ir_text, tgt)
        mod.triple, mod.data_layout = tgt.triple, str(tm.target_data)
        t.append(time.process_time())
        emit.optimize(mod, tgt, 3)
        t.append(time.process_time())
        tm.emit_object(mod)
        t.append(time.process_time())
        row = {p: t[k + 1] - t[k] for k, p in enumerate(PHASES)}
        row.update(name=pf.name, ir_lines=ir_text.count("\n"))
        rows.append(row)
    return rows


def _models(kinds: str, zoo: str):
    """(name, onnx model) pairs: the model kinds named, then the zoo models."""
    from tether.testing.model_kinds import KINDS

    for name in [k.strip() for k in kinds.split(",") if k.strip()]:
        if name not in KINDS:
            raise SystemExit("unknown kind %r (choose from %s)" % (name, ", ".join(KINDS)))
        yield name, KINDS[name]("bench")[0]
    if zoo:
        sys.path.insert(0, HERE)
        import bench_models

        # (digits, an 8x8 toy with a symbolic input, compiles in well under a second: left out of "all")
        names = [m for m in bench_models.ALL if m != "digits"] if zoo == "all" else \
            [m.strip() for m in zoo.split(",") if m.strip()]
        for name in names:
            yield name, bench_models.load_model(name)


def main() -> int:
    from tether.testing.model_kinds import KINDS

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kinds", default=",".join(KINDS), help="comma-separated, from: " + ", ".join(KINDS))
    ap.add_argument("--models", default="", help="comma-separated zoo models (bench_models.py's names) to time "
                    "after the kinds; 'all' for every one")
    ap.add_argument("--phases", action="store_true", help="also the CPU time per phase, kernel by kernel")
    ap.add_argument("--top", type=int, default=5, help="with --phases: the N most expensive kernels")
    args = ap.parse_args()
    print("load average %.2f %.2f %.2f" % os.getloadavg())
    print("%-20s %8s %8s %8s %8s" % ("kind", "cold", "cold cpu", "warm", "warm cpu"))
    with tempfile.TemporaryDirectory(prefix="tether-bench-compile-") as cache:
        os.environ["TETHER_CACHE_DIR"] = cache     # a private cache: cold means cold
        for name, model in _models(args.kinds, args.models):
            os.environ["TETHER_OBJECT_CACHE"] = "0"
            cold = compile_times(model)
            os.environ["TETHER_OBJECT_CACHE"] = "1"
            compile_times(model)
            warm = compile_times(model)
            print("%-20s %7.2fs %7.2fs %7.2fs %7.2fs" % (name, cold[0], cold[1], warm[0], warm[1]), flush=True)
            if args.phases:
                os.environ["TETHER_OBJECT_CACHE"] = "0"
                rows = phases(kernel_items(model))
                total = collections.Counter()
                for r in rows:
                    total.update({p: r[p] for p in PHASES})
                print("    %d kernels, CPU s: %s, sum %.2f" % (len(rows), ", ".join(
                    "%s %.2f" % (p, total[p]) for p in PHASES), sum(total.values())))
                for r in sorted(rows, key=lambda r: -sum(r[p] for p in PHASES))[:args.top]:
                    print("    %-44s %6d lines  %s" % (r["name"][:44], r["ir_lines"],
                                                      "  ".join("%s %.2f" % (p, r[p]) for p in PHASES)))
    print("load average %.2f %.2f %.2f" % os.getloadavg())
    return 0


if __name__ == "__main__":
    sys.exit(main())
