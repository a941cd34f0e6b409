#!/usr/bin/env python3
"""Thread scaling of whole models: tether vs onnxruntime at 1 and 2 threads, each runtime timed alone in a process
of its own, plus per-kernel scaling.

    python scripts/bench_threads.py [--models mobilenet_v2,squeezenet] [--min-rounds 5] [--max-rounds 25]
                                    [--tolerance 0.02] [--number N] [--profile 12] [--json out.json]

The models and their compilation are scripts/bench_models.py's, and so is the timing (``_alone.compare_alone``):
the exported build and the .onnx run in two worker processes, their outputs are checked first (max abs error), then
in each round every runtime gives one sample at 1 thread and one at 2, alone (the other worker waits idle), after
a pause and a warm-up call; a sample is the mean of ``--number`` calls (default: as many as last ~50 ms). The
rounds go on until the ratios tether / onnxruntime are stable (at least ``--min-rounds``, at most
``--max-rounds``; a ratio still moving is marked ``*``). Printed are medians over the rounds, the ratios, and each
runtime's speed-up from 1 to 2 threads ("tth 1/2", "ort 1/2": the median of the per-round speed-ups; they have no
say in when the rounds stop). ``--profile N`` also times every kernel alone at 1 and 2 threads in tether's worker
(the executor's per-node profile, after the rounds) and lists the N kernels that gain least from the second
thread, weighted by the time they lose. Absolute times on a loaded box mean little; the ratios do.
"""
from __future__ import annotations

import os
from typing import Any, Dict, List

from _alone import Worker, comparison_parser, parse_comparison, table_header, table_row
from _rows import write_rows
from bench_models import ALL, bench, run_table

SPEEDUPS = " %7s %7s"


def kernel_scaling(tw: Worker) -> List[Dict[str, Any]]:
    """Every kernel of tether's worker timed alone at 1 and at 2 threads."""
    one, two = (tw.profile(t, number=20, repeat=3) for t in (1, 2))
    return [{"name": a["name"], "func": a["func"], "seconds_1t": a["seconds"], "seconds_2t": b["seconds"]}
            for a, b in zip(one, two)]


def print_kernel_scaling(prof: List[Dict[str, Any]], worst: int) -> None:
    t1 = sum(p["seconds_1t"] for p in prof)
    t2 = sum(p["seconds_2t"] for p in prof)
    print("  kernels alone: sum %.2f ms at 1t, %.2f ms at 2t (%.2fx); worst scaling (lost = t2 - t1/2):"
          % (t1 * 1e3, t2 * 1e3, t1 / t2))
    for p in sorted(prof, key=lambda p: -(p["seconds_2t"] - p["seconds_1t"] / 2))[:worst]:
        s1, s2 = p["seconds_1t"], p["seconds_2t"]
        print("    %-40s %8.1fus %8.1fus %5.2fx lost %6.1fus"
              % (p["func"][:40], s1 * 1e6, s2 * 1e6, s1 / max(s2, 1e-9), (s2 - s1 / 2) * 1e6))


def main() -> None:
    ap = comparison_parser(__doc__.split("\n")[0], ALL)
    ap.set_defaults(models="mobilenet_v2,squeezenet")
    ap.add_argument("--profile", type=int, default=0, help="list the N kernels that scale worst")
    args, compare = parse_comparison(ap)
    profile = kernel_scaling if args.profile else None

    def show(name: str, row: Dict[str, Any]) -> None:
        print(table_row(13, name, row, "ort", "max_abs_err")
              + SPEEDUPS % ("%.2fx" % row["tether_speedup_2t"], "%.2fx" % row["ort_speedup_2t"]))
        if args.profile:
            print_kernel_scaling(row["profile"], args.profile)

    print("load average at start: %s" % " ".join("%.2f" % v for v in os.getloadavg()))
    rows = run_table(args.models, table_header(13, "ort") + SPEEDUPS % ("tth 1/2", "ort 1/2"),
                     lambda name, folder: bench(name, folder, args.target, compare, profile), show)
    write_rows(args.json, rows)
    print("load average at end: %s" % " ".join("%.2f" % v for v in os.getloadavg()))


if __name__ == "__main__":
    main()
