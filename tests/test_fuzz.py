"""Fuzzing the parsers that read untrusted bytes (docs/security.md, "Fuzzing").

* every input of the checked-in corpus (tests/fuzz/corpus/<target>/: seeds, and every input that ever found a
  bug) through every target, with memory traced: a regression test that runs in a second;
* a short coverage-guided atheris run per target (``TETHER_FUZZ_SECONDS``, 2 s by default) in its own process,
  starting from the corpus; new inputs go to a temporary folder;
* the Java frame decoder on a batch of mutated frames in one JVM run with a 256 MiB heap.

Longer local runs: ``scripts/fuzz.py TARGET --seconds N``.
"""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import tracemalloc

import pytest

from fuzz import mutate
from fuzz.targets import TARGETS, FuzzFailure, Target, check_one, corpus
from test_java_protocol import java_classes  # noqa: F401  (the compiled-classes fixture)

ROOT = pathlib.Path(__file__).resolve().parent.parent
RUNNER = ROOT / "tests" / "fuzz" / "run_atheris.py"
SECONDS = float(os.environ.get("TETHER_FUZZ_SECONDS", "2"))


@pytest.fixture
def traced():
    tracemalloc.start()
    yield
    tracemalloc.stop()


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_corpus_inputs_pass(name, traced):
    inputs = corpus(name)
    assert len(inputs) >= 3, "the %s corpus is missing (tests/fuzz/seed_corpus.py writes the seeds)" % name
    outcomes = [check_one(TARGETS[name], data) for _, data in inputs]
    assert any(o is None for o in outcomes), "no %s seed is accepted: the fuzzer would start outside the format" % name


def test_bug_inputs_stay_fixed(traced):
    bugs = [(name, fn, data) for name in TARGETS for fn, data in corpus(name) if fn.startswith("bug-")]
    assert len(bugs) >= 5
    for name, fn, data in bugs:
        assert check_one(TARGETS[name], data) is not None, "%s/%s is accepted, it must be refused" % (name, fn)


def test_check_one_reports_undocumented_exceptions_and_memory(traced):
    def raises(data: bytes) -> None:
        raise KeyError("boom")

    def hoards(data: bytes) -> None:
        hoards.kept = bytearray(64 << 20)  # type: ignore[attr-defined]

    with pytest.raises(FuzzFailure, match="KeyError"):
        check_one(Target("t", raises, (ValueError,)), b"x")
    with pytest.raises(FuzzFailure, match="allocated"):
        check_one(Target("t", hoards, (ValueError,)), b"x")


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_atheris_finds_nothing(name, tmp_path):
    proc = subprocess.run([sys.executable, str(RUNNER), name, str(max(1, int(SECONDS))), str(tmp_path / "new"),
                           str(ROOT / "tests" / "fuzz" / "corpus" / name)],
                          capture_output=True, text=True, timeout=120 + 2 * SECONDS)
    crashes = sorted(p.name for p in (tmp_path / "new").glob("*-*")) if (tmp_path / "new").is_dir() else []
    assert proc.returncode == 0 and not crashes, "fuzzing %s failed (%s):\n%s" % (name, crashes, proc.stderr[-4000:])
    assert "Done" in proc.stderr and "stat::number_of_executed_units" in proc.stderr


def test_java_decoder_survives_a_mutated_batch(java_classes, tmp_path):  # noqa: F811
    seeds = [data for _, data in corpus("frames")]
    inputs = mutate.batch(seeds, 5000, seed=17)
    path = tmp_path / "batch.bin"
    mutate.write_batch(inputs, path)
    java, classes = java_classes
    proc = subprocess.run([java, "-Xmx256m", "-Xss512k", "-cp", str(classes), "dev.tether.rpc.tools.FuzzRunner",
                           str(path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    n, frames, refused, crashed = (int(w) for w in proc.stdout.split()[0:8:2])
    assert (n, crashed) == (len(inputs), 0)
    assert frames > len(seeds) // 2 and refused > 1000  # the batch reaches both sides of the decoder
