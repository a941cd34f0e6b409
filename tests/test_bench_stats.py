"""tether bench's statistics and the device-side helpers (warm-up detection, sysfs state), without a server."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from fixtures.sysfs import thermal_zone, throttled_flag
from tether.bench import stats
from tether_rpc import device_state


def test_summary_matches_numpy():
    x = np.random.default_rng(1).lognormal(0, 0.05, 200) * 1e-3
    s = stats.summarize(x)
    assert s["n"] == 200
    assert s["median"] == pytest.approx(np.median(x))
    assert s["mean"] == pytest.approx(np.mean(x))
    assert s["std"] == pytest.approx(np.std(x, ddof=1))
    assert s["p90"] == pytest.approx(np.percentile(x, 90)) and s["p99"] == pytest.approx(np.percentile(x, 99))
    assert s["iqr"] == pytest.approx(np.percentile(x, 75) - np.percentile(x, 25))
    assert s["cv"] == pytest.approx(np.std(x, ddof=1) / np.mean(x))
    lo, hi = s["ci95_median"]
    assert lo < s["median"] < hi and not s["unstable"]
    assert stats.summarize(x) == s, "the bootstrap is seeded: same samples, same interval"


def test_bootstrap_ci_covers_the_true_median_about_95_percent():
    rng = np.random.default_rng(2)
    hits = 0
    for k in range(200):
        lo, hi = stats.bootstrap_median_ci(rng.normal(10.0, 1.0, 41), seed=k)
        hits += lo <= 10.0 <= hi
    assert 0.88 <= hits / 200 <= 0.995


def test_unstable_when_cv_exceeds_ten_percent():
    x = np.random.default_rng(3).normal(1.0, 0.2, 50)
    assert stats.summarize(x)["unstable"]


def test_verdicts():
    rng = np.random.default_rng(4)
    base = rng.normal(1.0, 0.02, 30)
    assert stats.verdict(base, rng.normal(1.2, 0.024, 30))["verdict"] == "slower"
    assert stats.verdict(base, rng.normal(0.8, 0.016, 30))["verdict"] == "faster"
    assert stats.verdict(base, rng.normal(1.0, 0.02, 30))["verdict"] == "same"
    # significant but tiny: a 1% drift between runs is not a change in code
    assert stats.verdict(base, base * 1.01)["verdict"] == "same"


def test_variance_components_separate_devices_from_noise():
    rng = np.random.default_rng(5)
    groups = [rng.normal(mu, 0.01, 40) for mu in (1.0, 1.1, 1.2)]
    comp = stats.variance_components(groups)
    assert comp["within_var"] == pytest.approx(1e-4, rel=0.3)
    assert comp["between_var"] == pytest.approx(0.01, rel=0.6)
    assert comp["between_share"] > 0.9
    same = stats.variance_components([rng.normal(1.0, 0.01, 40) for _ in range(3)])
    assert same["between_share"] < 0.2


@pytest.mark.parametrize("series,expected", [
    ([5.0, 3.0, 2.0] + [1.0] * 12, 3),                       # cold start, falling to steady
    ([10, 9, 8, 7, 6] + [5.0] * 12, 5),                       # a slow ramp: no window of it looks steady
    ([1.0, 1.01, 0.99] * 5, 0),                               # already warm: nothing dropped
])
def test_warmup_detection(series, expected):
    k, converged = device_state.detect_warmup(series, window=5, max_warmup=10)
    assert (k, converged) == (expected, True)


def test_warmup_undecided_then_capped():
    assert device_state.detect_warmup([3.0, 2.0, 1.0], window=5) == (None, False)
    falling = [0.5 ** i for i in range(40)]  # every sample far slower than the ones after it
    assert device_state.detect_warmup(falling, window=5, max_warmup=4) == (4, False)


def _fake_board(root, temp_milli=45000, throttled="0x0", freqs=(1500000, 600000)):
    z = thermal_zone(root, temp_milli)
    for k, f in enumerate(freqs):
        p = root / ("sys/devices/system/cpu/cpufreq/policy%d" % (k * 4))
        p.mkdir(parents=True)
        (p / "scaling_cur_freq").write_text("%d\n" % f)
        (p / "cpuinfo_max_freq").write_text("1800000\n")
        (p / "scaling_governor").write_text("ondemand\n")
        (p / "affected_cpus").write_text(" ".join(str(c) for c in range(k * 4, k * 4 + 4)) + "\n")
    throttled_flag(root, throttled)
    return z


def test_state_sampler_reads_a_board_and_follows_changes(tmp_path, monkeypatch):
    zone = _fake_board(tmp_path)
    monkeypatch.setenv("TETHER_SYSFS_ROOT", str(tmp_path))
    with device_state.DeviceStateSampler() as sampler:
        first = sampler.sample()
        assert first == {"temp_c": 45.0, "hot": False, "freq_khz": [1500000, 600000], "throttle_flags": 0,
                         "throttled": False}
        (zone / "temp").write_text("62500\n")
        (tmp_path / "sys/devices/platform/soc/soc:firmware/get_throttled").write_text("0x50004\n")
        second = sampler.sample()
        assert second["temp_c"] == 62.5 and second["hot"] is True, "hot from the passive trip point (60 C)"
        assert second["throttled"] is True and second["throttle_flags"] == 0x50004
    snap = device_state.snapshot()
    assert snap["hot_c"] == 60.0 and [p["cpus"] for p in snap["cpufreq"]] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert snap["cpufreq"][0]["governor"] == "ondemand" and snap["peak_rss_bytes"] > 0


def test_state_fields_are_absent_on_a_bare_board(tmp_path, monkeypatch):
    monkeypatch.setenv("TETHER_SYSFS_ROOT", str(tmp_path))
    with device_state.DeviceStateSampler() as sampler:
        assert sampler.sample() == {}
    snap = device_state.snapshot()
    assert not {"temp_c", "cpufreq", "throttled", "battery_c", "thermal_zones"} & set(snap)
    assert device_state.cooldown(40.0, timeout_s=1)["available"] is False


def test_cooldown_waits_until_cool_and_gives_up_at_its_timeout(tmp_path, monkeypatch):
    zone = _fake_board(tmp_path, temp_milli=70000)
    monkeypatch.setenv("TETHER_SYSFS_ROOT", str(tmp_path))
    res = device_state.cooldown(50.0, timeout_s=0.3, poll_s=0.05)
    assert res["reached"] is False and 0.25 <= res["waited_s"] and res["temp_c"] == 70.0   # gave up at its timeout
    (zone / "temp").write_text("41000\n")
    res = device_state.cooldown(50.0, timeout_s=5, poll_s=0.05)
    assert res["reached"] is True and res["temp_c"] == 41.0


def test_bench_run_calibrates_samples_and_pins():
    import time

    def call():
        t = time.perf_counter()
        while time.perf_counter() - t < 2e-4:
            pass

    cpu = sorted(os.sched_getaffinity(0))[0]
    # a calibration round that another process preempts lasts longer than its runs: on a loaded box one of
    # three tries is enough to see the rule (2 ms samples of 0.2 ms runs need at least 8 runs)
    for _ in range(3):
        res = device_state.bench_run(call, {"min_sample_ms": 2, "samples": 8, "pin": [cpu]})
        assert res["calibration_s"] >= 2e-3, "the calibration ends on a round of at least 2 ms"
        if res["number"] >= 8:
            break
    assert res["number"] >= 8, "2 ms samples of 0.2 ms runs"
    steady = [r for r in res["samples"] if r["i"] >= res["warmup"]]
    assert len(steady) >= 8 and all(r["s"] >= 2e-4 for r in res["samples"])
    assert res["pinned"] == [cpu] and res["state_start"]["affinity"] == sorted(os.sched_getaffinity(0))
    with pytest.raises(TypeError, match="unknown bench options"):
        device_state.bench_run(call, {"sampels": 3})


def _doc(pairs):
    """A minimal run document: [(target, device id, fingerprint id, samples)]."""
    devices = {d: {"id": d, "fingerprint": {"id": fp}} for _, d, fp, _ in pairs}
    return {"devices": list(devices.values()), "results": [
        {"target": t, "device": d, "run": {}, "stats": {"median": float(np.median(s)), "n": len(s)},
         "samples": [{"s": x, "warmup": False, "used": True} for x in s]} for t, d, _, s in pairs]}


def test_compare_matches_by_device_then_fingerprint_then_target():
    from tether.bench import compare

    rng = np.random.default_rng(6)
    same = lambda: list(rng.normal(1.0, 0.01, 20))  # noqa: E731
    base = _doc([("k", "pool/device-1", "aaaa", same()), ("k", "pool/device-2", "aaaa", same()),
                 ("m", "pi", "bbbb", same()), ("gone", "pi", "bbbb", same())])
    new = _doc([("k", "pool/device-1", "aaaa", same()), ("k", "pool/device-7", "aaaa", same()),
                ("m", "other-pi", "cccc", list(rng.normal(1.3, 0.01, 20))), ("added", "pi", "bbbb", same())])
    cmp = compare.compare_documents(base, new)
    rows = {(r["target"], r["base_device"], r["device"]): r["verdict"] for r in cmp["rows"]}
    assert rows == {("k", "pool/device-1", "pool/device-1"): "same", ("k", "pool/device-2", "pool/device-7"): "same",
                    ("m", "pi", "other-pi"): "slower"}
    assert any("different devices" in n for n in cmp["notes"])
    assert any("gone on pi: only in the base" in n for n in cmp["notes"])
    assert any("added on pi: only in the new" in n for n in cmp["notes"])
    assert [r["target"] for r in cmp["failed"]] == ["m"]


PEAK_RSS_RUN = r"""
import json, sys
import numpy as np
from tether_rpc import device_state

big = np.ones(100 << 17)           # 100 MiB touched and freed before the run: the process's old peak
del big


def call():
    np.ones(40 << 17).sum()        # 40 MiB touched and freed by every run


res = device_state.bench_run(call, {"samples": 3, "min_sample_ms": 0, "max_warmup": 0, "warmup_window": 1})
json.dump({k: res[k] for k in ("peak_rss_scope", "peak_rss_bytes", "rss_start_bytes")}, sys.stdout)
"""


def test_peak_rss_is_the_peak_of_the_run():
    # in a process of its own: memory that earlier tests of this process free during the run (their fixtures'
    # buffers, their threads' garbage) would lower the peak below the run's start
    proc = subprocess.run([sys.executable, "-c", PEAK_RSS_RUN], capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert proc.returncode == 0, proc.stderr
    res = json.loads(proc.stdout)
    if res["peak_rss_scope"] != "run":
        pytest.skip("this kernel does not let a process reset its VmHWM (/proc/self/clear_refs)")
    grew = res["peak_rss_bytes"] - res["rss_start_bytes"]
    assert 30 << 20 <= grew < 90 << 20, grew / 2 ** 20
