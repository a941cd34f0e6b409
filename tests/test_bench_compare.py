"""`tether bench compare` on real measurements: a build made 20% slower on purpose is flagged, and re-runs of
one artifact are called "same", each in at least 19 of 20 tries during which the machine's own speed held (the
rates are logged and recorded as JUnit properties). The measurements come from a real device server process on
loopback."""
import json
import logging
import shutil
import subprocess

import pytest
from click.testing import CliRunner

from tether.bench import compare, runner
from tether.cli.main import cli

log = logging.getLogger(__name__)

# A dependent multiply-add chain: its time is proportional to WORK on any CPU (no vectorisation can shorten
# a chain whose every step needs the previous one), so WORK * 1.2 is a build exactly 20% slower.
WORK_KERNEL = r"""
#include "tether_abi.h"
TETHER_META("{\"abi_version\": 1, \"tether_version\": \"0.1.0\", "
            "\"target\": {\"arch\": \"" TETHER_ARCH "\", \"preset\": \"test\"}, \"functions\": ["
            "{\"name\": \"work\", \"args\": [{\"name\": \"out\", \"shape\": [1], \"dtype\": \"float32\"}], "
            "\"parallel\": false}]}");

TETHER_EXPORT int32_t work(const TetherValue* args, const int32_t* codes, int32_t num_args) {
  static const int64_t shape[1] = {1};
  CHECK_NARGS(1);
  CHECK(check_tensor(args, codes, 0, 1, shape, 2, 32));
  float* out = DATA(0, float);
  float x = out[0];
  for (int64_t k = 0; k < WORK; ++k) x = x * 0.999999f + 1.0f;
  out[0] = x;
  return 0;
}
"""
BASE_WORK = 20000
TRIES = 20


def build_work(tmp_path, work, name):
    from kernels import GCC_FLAGS, KERNEL_DIR

    src = tmp_path / "work.c"
    src.write_text(WORK_KERNEL)
    out = tmp_path / (name + ".so")
    cmd = [shutil.which("gcc"), *GCC_FLAGS, "-DWORK=%d" % work, "-I", str(KERNEL_DIR), str(src), "-o", str(out),
           "-Wl,-soname,work.so", "-Wl,--hash-style=both", "-Wl,--no-undefined"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return out


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("work")
    return {"base": build_work(tmp, BASE_WORK, "base"), "slow": build_work(tmp, int(BASE_WORK * 1.2), "slow")}


# 1 ms samples: on a busy machine, most longer samples contain a scheduler slice given to another program
OPTIONS = runner.BenchOptions(samples=15, min_sample_ms=1, max_warmup=5, max_seconds=30)


def measure(server, path, device="dev"):
    """One `tether bench` run document for one library, in a session of its own as each `tether bench` of a CI
    job has (the target is named the same for both builds, as a job comparing yesterday's work.so with today's
    would see it)."""
    from tether import rpc

    target = runner.BenchTarget("work.so:work", "kernel", str(path), "work")
    with runner.temp_workdir() as work, rpc.connect(server.host, server.port, timeout=60) as session:
        dev, results = runner.bench_on_session(session, [target], OPTIONS, device, {"mode": "direct"},
                                               runner.OnnxCache(work))
    for r in results:
        r["target"] = "work.so:work"
    return runner.run_document([dev], results, OPTIONS)


# The CI gate: a change of more than 10% fails. Between re-runs of one artifact, this shared 2-core VM drifts by up
# to ~7% (clean samples, the host's clocks and neighbours), so a tighter gate would flag noise here; a quiet board
# can use a tighter one (measure the drift with re-runs first, as this test does).
GATE_PCT = 10


# A try is taken again (at most this many times in all) when the machine's speed moved during it: the base build,
# measured once more after the other three, differs from its first measurement by more than STABLE_PCT. On the CI's
# 2-core VM the emulated devices and other processes of the suite come and go; a try spanning such a change
# compares two machines, not two builds (two failed runs: "flagged 18/20" with ratios 1.076 and 1.091 for the 20%
# slower build, "same 18/20" with 1.117 and 1.151 for one artifact). The verdicts of the kept tries are held to
# the same 19 of 20.
RETAKES = 10
STABLE_PCT = 5


def _stable(first, last) -> bool:
    (row,) = compare.compare_documents(first, last, fail_above=GATE_PCT)["rows"]
    return abs(row["ratio"] - 1.0) * 100 <= STABLE_PCT


@pytest.mark.slow
def test_compare_detects_a_20_percent_slower_build_and_calls_reruns_same(rpc_server, builds, record_property):
    detected = same = retaken = 0
    ratios_slow, ratios_same = [], []
    k = 0
    while k < TRIES:
        # interleaved, each comparison between neighbours, so slow drifts of the machine (its load, the clock
        # of a shared host) hit both sides of a comparison alike
        base = measure(rpc_server, builds["base"])
        again = measure(rpc_server, builds["base"])
        slow = measure(rpc_server, builds["slow"])
        if not _stable(base, measure(rpc_server, builds["base"])) and retaken < RETAKES:
            retaken += 1
            continue
        k += 1
        c_slow = compare.compare_documents(base, slow, fail_above=GATE_PCT)
        c_same = compare.compare_documents(base, again, fail_above=GATE_PCT)
        (row_slow,), (row_same,) = c_slow["rows"], c_same["rows"]
        detected += row_slow["verdict"] == "slower" and bool(c_slow["failed"])
        same += row_same["verdict"] == "same" and not c_same["failed"]
        ratios_slow.append(round(row_slow["ratio"], 3))
        ratios_same.append(round(row_same["ratio"], 3))
        assert row_same["same_artifact"] and not row_slow["same_artifact"]
    record_property("bench_compare_detection_rate", "%d/%d" % (detected, TRIES))
    record_property("bench_compare_same_rate", "%d/%d" % (same, TRIES))
    record_property("bench_compare_retaken", retaken)
    log.warning("bench compare: 20%%-slower build flagged %d/%d (ratios %s); same artifact called same %d/%d "
                "(ratios %s); %d tries taken again (the machine's speed moved)", detected, TRIES, ratios_slow,
                same, TRIES, ratios_same, retaken)
    assert detected >= 19, "flagged %d/%d, ratios %s" % (detected, TRIES, ratios_slow)
    assert same >= 19, "same %d/%d, ratios %s" % (same, TRIES, ratios_same)


def test_compare_cli_exit_status_json_and_notes(rpc_server, builds, tmp_path):
    # taken again, as the interleaved test does, while the machine's speed moved between the first and the last
    # measurement of the base build (one failed run: the 20% slower build measured 1.071x, called "same")
    for _ in range(1 + RETAKES):
        docs = {name: measure(rpc_server, builds[name]) for name in ("base", "slow")}
        docs["again"] = measure(rpc_server, builds["base"])
        if _stable(docs["base"], docs["again"]):
            break
    paths = {}
    for name, doc in docs.items():
        paths[name] = tmp_path / (name + ".json")
        paths[name].write_text(json.dumps(doc))
    res = CliRunner().invoke(cli, ["bench", "compare", str(paths["base"]), str(paths["slow"]), "--fail-above",
                                   str(GATE_PCT), "--json", str(tmp_path / "cmp.json")])
    assert res.exit_code == 1, res.output
    assert "slower" in res.output and "FAIL" in res.output
    cmp = json.loads((tmp_path / "cmp.json").read_text())
    assert cmp["rows"][0]["verdict"] == "slower" and 1.1 < cmp["rows"][0]["ratio"] < 1.35
    # a 20% slowdown does not fail a gate set at 50%
    res = CliRunner().invoke(cli, ["bench", "compare", str(paths["base"]), str(paths["slow"]), "--fail-above", "50"])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(cli, ["bench", "compare", str(paths["base"]), str(paths["again"]), "--fail-above",
                                   str(GATE_PCT)])
    # the same build measured again passes the gate; its verdict may still be "faster" or "slower" by a few percent
    # (the box drifts between two measurements minutes apart: 0.908 with p 3e-6 was seen under load), so the
    # "same" verdict itself is checked on controlled samples in test_bench_stats, not here
    assert res.exit_code == 0 and "FAIL" not in res.output, res.output
    # the reverse direction is "faster"; a target only in one document is named in a note
    base_result = docs["base"]["results"][0]
    other = dict(docs["base"], results=[base_result, dict(base_result, target="other.so:f")])
    paths["other"] = tmp_path / "other.json"
    paths["other"].write_text(json.dumps(other))
    res = CliRunner().invoke(cli, ["bench", "compare", str(paths["slow"]), str(paths["base"]), "--fail-above",
                                   str(GATE_PCT)])
    assert res.exit_code == 0 and "faster" in res.output
    res = CliRunner().invoke(cli, ["bench", "compare", str(paths["base"]), str(paths["other"])])
    assert res.exit_code == 0 and "only in the new document" in res.output
    # with no target in common, nothing was compared: that is no pass
    only_other = dict(other, results=other["results"][1:])
    paths["only_other"] = tmp_path / "only_other.json"
    paths["only_other"].write_text(json.dumps(only_other))
    res = CliRunner().invoke(cli, ["bench", "compare", str(paths["base"]), str(paths["only_other"])])
    assert res.exit_code == 2 and "nothing was compared" in res.output
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    res = CliRunner().invoke(cli, ["bench", "compare", str(paths["base"]), str(bad)])
    assert res.exit_code == 2 and "not a tether bench document" in res.output
