#!/usr/bin/env python3
"""Run every node case of the installed onnx through tether and onnxruntime and compare.

    python scripts/onnx_conformance.py --jobs 2 --json conformance.json
    python scripts/onnx_conformance.py --include 'test_(div|mod)_' --list-wrong

Each case runs in a forked worker with a timeout (tether.testing.onnx_cases.run_forked). Prints a per-op table
(cases, onnxruntime passes, tether passes, refusals, wrong results, crashes), the totals and the headline
"tether passes X of onnxruntime's Y (Z%), W wrong results". A wrong result (it ran and disagreed with the
expected outputs) is the one outcome that must stay at zero: a refusal is honest, a wrong answer is not.
``--list-bound`` lists the passes that needed integer inputs bound as constants: shape arguments are static in
tether by design, while an index a model computes (a scatter's, a Trilu's k) must work at run time.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "src"))
sys.path.insert(0, os.path.join(HERE, "..", "rpc_server"))

from tether.testing import onnx_cases as oc  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--include", metavar="REGEX", help="only cases whose name matches (re.search)")
    ap.add_argument("--jobs", "-j", type=int, default=1, help="cases run at once, each in a forked worker")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per case before it counts as a crash")
    ap.add_argument("--json", metavar="PATH", help="write every case's result here")
    ap.add_argument("--list-wrong", action="store_true", help="list each wrong result and crash with its message")
    ap.add_argument("--list-refused", action="store_true", help="list each refusal with its message")
    ap.add_argument("--list-bound", action="store_true",
                    help="list each pass that needed integer inputs bound as constants (and the inputs)")
    ap.add_argument("--no-ort", action="store_true", help="skip onnxruntime")
    ap.add_argument("--quiet", "-q", action="store_true", help="no per-case progress on stderr")
    args = ap.parse_args(argv)

    os.environ.setdefault("ONNX_HOME", os.path.join(tempfile.gettempdir(), "tether-onnx-home"))
    cases = oc.collect(args.include)
    if not cases:
        print("no case matches %r" % args.include, file=sys.stderr)
        return 2
    ops = oc.op_types(oc.collect() if args.include else cases)
    t0 = time.time()
    done = [0]

    def progress(r: oc.CaseResult) -> None:
        done[0] += 1
        if not args.quiet:
            print("[%d/%d] %-60s ort=%-5s tether=%s" % (done[0], len(cases), r.name, r.ort, r.tether),
                  file=sys.stderr, flush=True)

    results = oc.run_forked(cases, ops, jobs=args.jobs, timeout=args.timeout, ort=not args.no_ort,
                            on_result=progress)
    table = oc.summarize(results)
    cols = ("cases", "ort", oc.PASS, oc.REFUSED, oc.WRONG, oc.CRASH)
    print("%-28s %6s %6s %7s %8s %6s %6s" % ("op type", "cases", "ort", "tether", "refused", "wrong", "crash"))
    for op in sorted(table):
        row = table[op]
        print("%-28s %6d %6d %7d %8d %6d %6d" % ((op,) + tuple(row.get(c, 0) for c in cols)))
    tot = {c: sum(r.get(c, 0) for r in table.values()) for c in cols}
    print("%-28s %6d %6d %7d %8d %6d %6d" % (("TOTAL",) + tuple(tot[c] for c in cols)))
    ort_pass = [r for r in results if r.ort == "pass"]
    both = sum(r.tether == oc.PASS for r in ort_pass)
    wrong = [r for r in results if r.tether == oc.WRONG]
    crash = [r for r in results if r.tether == oc.CRASH]
    if args.list_refused:
        print("\nrefused:")
        for r in results:
            if r.tether == oc.REFUSED:
                print("  %s [%s]: %s" % (r.name, r.op_type, r.tether_message))
    bound = [r for r in results if r.tether == oc.PASS and r.tether_message.startswith(oc.BOUND_PREFIX)]
    if args.list_bound:
        print("\npasses with inputs bound as constants (shape arguments, by design; anything else is a gap):")
        for r in bound:
            print("  %s [%s]: %s" % (r.name, r.op_type, r.tether_message[len(oc.BOUND_PREFIX):]))
    if args.list_wrong:
        print("\nwrong results and crashes:")
        for r in wrong + crash:
            print("  %s %s [%s]: %s" % (r.tether.upper(), r.name, r.op_type, r.tether_message.replace("\n", " ")[:600]))
    headline = ("tether passes %d of onnxruntime's %d (%.1f%%), %d wrong results"
                % (both, len(ort_pass), 100.0 * both / max(len(ort_pass), 1), len(wrong)))
    print("\n%s; %d crashes; tether passes %d of all %d cases (%d with integer inputs bound as constants); %.0fs"
          % (headline, len(crash), tot[oc.PASS], len(results), len(bound), time.time() - t0))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"headline": headline, "totals": tot, "ops": table,
                       "cases": [r.to_json() for r in results]}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
