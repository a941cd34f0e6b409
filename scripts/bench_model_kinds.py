#!/usr/bin/env python3
"""The model kinds real users bring (tether.testing.model_kinds): tether's compile time, its latency against
onnxruntime at 1 and 2 threads, each runtime timed alone in a process of its own, and its max relative error
against onnxruntime.

    python scripts/bench_model_kinds.py [--kinds db_detector,vad,...] [--size bench|test] [--min-rounds 5]
                                        [--max-rounds 25] [--tolerance 0.02] [--number N] [--profile N]
                                        [--json out.json]

Each kind is built with onnx.helper at the input size the shipped model runs on (``--size test``: the small inputs
of tests/test_model_kinds.py), compiled at opt_level 3 (compile time = from_onnx + build_graph), with the object
cache off unless TETHER_OBJECT_CACHE is set (scripts/bench_compile.py compares cold and warm builds). The exported
build and the .onnx then run in two worker processes (``_alone.Worker``, through bench_models.time_alone), which
get the same inputs; their outputs are checked first (max relative error = max |tether - ort| / max |ort|, over
every output). Timing goes in rounds (``_alone.compare_alone``): in each, every runtime gives one sample per
thread count, alone (the other worker waits idle), after a pause and a warm-up call; a sample is the mean of
``--number`` calls (default: as many as last ~50 ms). The rounds go on until the ratio tether / onnxruntime (lower
is better; the goal is at most 1.3; the median of the per-round ratios) is stable, at least ``--min-rounds``, at
most ``--max-rounds``; a ratio still moving then is marked ``*``. Times are medians over the rounds; on a loaded
machine the ratio means something, absolute times do not.
``--profile N`` also prints the N slowest kernels of each model at 1 thread (tether's per-node profile, taken in
its worker after the rounds).
"""
from __future__ import annotations

import os
import time
from typing import Any, Dict, List

from _alone import Worker, comparison_parser, parse_comparison, table_header, table_row
from _rows import write_rows
from bench_models import run_table, time_alone


def bench(name: str, size: str, folder: str, target: str, compare: dict, profile: int) -> dict:
    """One kind's row (:func:`measure`)."""
    from tether.testing.model_kinds import KINDS

    if name not in KINDS:
        raise SystemExit("unknown kind %r (choose from %s)" % (name, ", ".join(KINDS)))
    model, feeds = KINDS[name](size)
    return measure({"kind": name, "size": size}, name, model, feeds, folder, target, compare, profile)


def measure(row: Dict[str, Any], name: str, model, feeds: Dict[str, Any], folder: str, target: str, compare: dict,
            profile: int) -> dict:
    """``row`` completed for the ONNX ``model`` on ``feeds``: compile time and kernels here, the max relative error
    and the figures of bench_models.time_alone (its files named after ``name`` in ``folder``), and with
    ``profile`` its slowest kernels at 1 thread."""
    import tether
    from tether.frontend import from_onnx
    from tether.testing.model_kinds import relative_error

    t0 = time.perf_counter()
    graph, params = from_onnx(model)
    factory = tether.build_graph(graph, params, target=target, opt_level=3)
    row = dict(row, compile_s=time.perf_counter() - t0, kernels=factory.kernel_count)

    def slowest(tw: Worker) -> List[Dict[str, Any]]:
        nodes = sorted(tw.profile(1), key=lambda r: -r["seconds"])[:profile]
        return [{"func": r["func"], "ops": r["ops"], "ms": r["seconds"] * 1e3} for r in nodes]

    got, ref, figures = time_alone(os.path.join(folder, name), factory, model, feeds, compare,
                                   slowest if profile else None)
    row["max_rel_err"] = max(relative_error(g, r) for g, r in zip(got, ref))
    row.update(figures)
    return row


def main() -> None:
    from tether.testing.model_kinds import KINDS

    ap = comparison_parser(__doc__.split("\n")[0], list(KINDS), option="--kinds")
    ap.add_argument("--size", default="bench", choices=["bench", "test"])
    ap.add_argument("--profile", type=int, default=0, help="print the N slowest kernels at 1 thread")
    args, compare = parse_comparison(ap)
    # ---- compile time is the cold figure (what a user's first build costs) unless the caller asks for the object cache
    os.environ.setdefault("TETHER_OBJECT_CACHE", "0")

    def show(name: str, row: Dict[str, Any]) -> None:
        print(table_row(20, name, row, "ort", "max_rel_err"))
        for p in row.get("profile", []):
            print("    %8.3fms  %-40s %s" % (p["ms"], p["func"][:40], p["ops"][:80]))

    rows = run_table(args.kinds, table_header(20, "ort", first="kind"),
                     lambda name, folder: bench(name, args.size, folder, args.target, compare, args.profile), show)
    write_rows(args.json, rows)


if __name__ == "__main__":
    main()
