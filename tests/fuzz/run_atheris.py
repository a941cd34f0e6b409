"""Run one fuzz target under atheris (libFuzzer's coverage-guided engine, tether_rpc instrumented).

    python tests/fuzz/run_atheris.py TARGET SECONDS NEW_INPUTS_DIR [CORPUS_DIR ...] [-- libFuzzer flags]

New interesting inputs go to NEW_INPUTS_DIR (keep the checked-in corpus read-only: name it after). A failing
input (an undocumented exception or an allocation over the target's limit, see targets.check_one) stops the run
with a non-zero exit and is written as ``crash-*`` into NEW_INPUTS_DIR; a single input running over 10 s is a
hang (``timeout-*``). ``scripts/fuzz.py`` and ``tests/test_fuzz.py`` drive this script.
"""
from __future__ import annotations

import pathlib
import resource
import sys
import tracemalloc

import atheris

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

with atheris.instrument_imports(include=["tether_rpc"]):
    import tether_rpc.graph_executor  # noqa: F401  (imported by their targets on first use: instrument them now)
    import tether_rpc.module  # noqa: F401
    from fuzz.targets import MAX_INPUT, TARGETS, check_one


def main() -> None:
    name, seconds, out, *rest = sys.argv[1:]
    extra = rest[rest.index("--") + 1:] if "--" in rest else []
    corpora = rest[:rest.index("--")] if "--" in rest else rest
    target = TARGETS[name]
    if name == "graph":  # build and load the real module before the clock starts
        from fuzz.targets import graph_module
        graph_module()
    tracemalloc.start()

    def one_input(data: bytes) -> None:
        check_one(target, data)

    pathlib.Path(out).mkdir(parents=True, exist_ok=True)
    # libFuzzer's memory limit reads the peak RSS getrusage reports, and on Linux a child starts with its parent's
    # (a forked address space carries its high-water mark through exec): run from a test process of 2 GB, every
    # input would be "out of memory". The budget is libFuzzer's default 2 GB above what this process starts with;
    # what one input allocates is bounded by targets.check_one (tracemalloc) anyway.
    inherited_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    argv = [sys.argv[0], out, *corpora, "-max_total_time=%d" % int(seconds), "-max_len=%d" % MAX_INPUT,
            "-timeout=10", "-artifact_prefix=%s/" % out, "-print_final_stats=1",
            "-rss_limit_mb=%d" % (inherited_mb + 2048), *extra]
    atheris.Setup(argv, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
