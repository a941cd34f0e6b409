#!/usr/bin/env python3
"""Rewrite tests/data/insn_counts.json, the CI table of instructions per inference on emulated ARM CPUs.

    python scripts/update_insn_counts.py            # measure, print the changes against the table, rewrite it
    python scripts/update_insn_counts.py --check    # measure and compare only (what tests/test_insn_counts.py does)

Run it when tests/test_insn_counts.py says a count fell (an improvement: the table must say so) or rose on purpose
(a change that costs instructions and is worth it: say why in the commit). Needs the emulated userlands
(docs/emulation.md), onnx and onnxruntime. Takes about a minute and a half on a 2-core machine.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "src"))
sys.path.insert(0, os.path.join(HERE, "..", "rpc_server"))

from tether.testing import insn_count_models as table  # noqa: E402

TABLE_PATH = os.path.join(HERE, "..", "tests", "data", "insn_counts.json")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare with the table, do not rewrite it")
    ap.add_argument("--table", default=TABLE_PATH, help="the table file (default: %(default)s)")
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    new = table.measure(log=lambda s: print(s, flush=True))
    print("measured in %.0f s" % (time.monotonic() - t0))
    if os.path.exists(args.table):
        with open(args.table, encoding="utf-8") as fh:
            base = json.load(fh)
        rises, falls, text = table.compare(base, new)
        print(text)
        for line in rises:
            print("ROSE  " + line)
        for line in falls:
            print("FELL  " + line)
        if args.check:
            return 1 if rises or falls else 0
    elif args.check:
        print("no table at %s" % args.table)
        return 1
    with open(args.table, "w", encoding="utf-8") as fh:
        json.dump(new, fh, indent=1, sort_keys=False)
        fh.write("\n")
    print("wrote %s" % os.path.normpath(args.table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
