#!/usr/bin/env python3
"""Fuzz one parser for longer than CI does (docs/security.md, "Fuzzing").

    scripts/fuzz.py TARGET --seconds N [--save]
    scripts/fuzz.py --list

TARGET is one of tests/fuzz/targets.py's targets (frames, handshake, tracker, params, graph, elf), run under
atheris starting from tests/fuzz/corpus/TARGET, or ``java``: the Java frame decoder on mutated frame batches, one
JVM run per batch of 20000, until the time is up. New inputs go to a temporary folder (printed), or with --save
into the corpus itself (commit the few that matter). On a failure the failing input is printed with its path: add
it to the corpus as ``bug-<what>`` once fixed.
"""
from __future__ import annotations

import argparse
import pathlib
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from fuzz import mutate  # noqa: E402
from fuzz.targets import TARGETS, corpus  # noqa: E402


def fuzz_python(target: str, seconds: int, out: pathlib.Path, save: bool) -> int:
    corpus_dir = ROOT / "tests" / "fuzz" / "corpus" / target
    dirs = [str(corpus_dir)] if save else [str(out), str(corpus_dir)]
    cmd = [sys.executable, str(ROOT / "tests" / "fuzz" / "run_atheris.py"), target, str(seconds), *dirs]
    return subprocess.run(cmd, timeout=seconds + 300).returncode


def fuzz_java(seconds: int, out: pathlib.Path) -> int:
    java_root = ROOT / "android_app" / "protocol"
    classes = out / "classes"
    sources = sorted(str(s) for s in java_root.rglob("*.java"))
    subprocess.run(["javac", "--release", "8", "-nowarn", "-encoding", "UTF-8", "-d", str(classes), *sources],
                   check=True, timeout=300)
    seeds = [data for _, data in corpus("frames")]
    deadline = time.monotonic() + seconds
    batch_no = 0
    while time.monotonic() < deadline:
        path = out / ("batch-%d.bin" % batch_no)
        mutate.write_batch(mutate.batch(seeds, 20000, seed=batch_no), path)
        proc = subprocess.run(["java", "-Xmx256m", "-Xss512k", "-cp", str(classes),
                               "dev.tether.rpc.tools.FuzzRunner", str(path)], capture_output=True, text=True,
                              timeout=600)
        print("batch %d: %s" % (batch_no, proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else "?"))
        if proc.returncode != 0:
            print(proc.stdout[-4000:] + proc.stderr[-4000:])
            print("inputs of the failing batch: %s (mutate.batch(seeds, 20000, seed=%d))" % (path, batch_no))
            return 1
        path.unlink()
        batch_no += 1
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("target", nargs="?", choices=sorted(TARGETS) + ["java"])
    parser.add_argument("--seconds", type=int, default=60)
    parser.add_argument("--save", action="store_true", help="add new inputs to tests/fuzz/corpus/TARGET")
    parser.add_argument("--list", action="store_true", help="list the targets")
    args = parser.parse_args()
    if args.list or not args.target:
        print("\n".join(sorted(TARGETS) + ["java"]))
        return 0
    out = pathlib.Path(tempfile.mkdtemp(prefix="tether-fuzz-%s-" % args.target))
    print("new inputs and failures go to %s" % out)
    if args.target == "java":
        return fuzz_java(args.seconds, out)
    return fuzz_python(args.target, args.seconds, out, args.save)


if __name__ == "__main__":
    sys.exit(main())
