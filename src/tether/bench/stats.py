"""Statistics of benchmark samples: robust summaries, a bootstrap CI of the median, and two-run comparisons.

Everything here is pure numpy/scipy on plain sequences of seconds, so it is tested without a device. The
bootstrap uses a fixed seed: the same samples always give the same interval (a JSON file re-read later, or
``tether bench compare`` run twice, agree with themselves). docs/bench.md explains each choice.
"""
from __future__ import annotations

import math
from typing import Any, Dict, Optional, Sequence, Tuple

import numpy as np

#: A result is called unstable when its coefficient of variation exceeds this (pyperf warns at 10% too).
UNSTABLE_CV = 0.10
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 0x7E7E


def format_seconds(seconds: Optional[float]) -> str:
    """A duration for a table: three significant digits in s, ms, us or ns; "-" for none."""
    if seconds is None:
        return "-"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if seconds >= scale:
            return "%.3g %s" % (seconds / scale, unit)
    return "%.3g ns" % (seconds * 1e9)


def _bootstrap_medians(x: np.ndarray, resamples: int, rng: np.random.Generator) -> np.ndarray:
    idx = rng.integers(0, len(x), size=(resamples, len(x)))
    return np.median(x[idx], axis=1)


def bootstrap_median_ci(samples: Sequence[float], level: float = 0.95, resamples: int = BOOTSTRAP_RESAMPLES,
                        seed: int = BOOTSTRAP_SEED) -> Tuple[float, float]:
    """Percentile bootstrap interval of the median (``level`` coverage)."""
    x = np.asarray(samples, dtype=np.float64)
    if len(x) < 2:
        v = float(x[0]) if len(x) else math.nan
        return (v, v)
    meds = _bootstrap_medians(x, resamples, np.random.default_rng(seed))
    lo, hi = np.percentile(meds, [50 * (1 - level), 50 * (1 + level)])
    return (float(lo), float(hi))



def summarize(samples: Sequence[float], unstable_cv: float = UNSTABLE_CV) -> Dict[str, Any]:
    """``n, median, mean, std, min, max, p90, p99, q1, q3, iqr, ci95_median [lo, hi], cv, unstable`` (seconds)."""
    x = np.asarray(samples, dtype=np.float64)
    if len(x) == 0:
        raise ValueError("no samples to summarize")
    q1, med, q3, p90, p99 = (float(v) for v in np.percentile(x, [25, 50, 75, 90, 99]))
    mean = float(np.mean(x))
    std = float(np.std(x, ddof=1)) if len(x) > 1 else 0.0
    cv = std / mean if mean > 0 else 0.0
    lo, hi = bootstrap_median_ci(x)
    return {"n": int(len(x)), "median": med, "mean": mean, "std": std, "min": float(np.min(x)),
            "max": float(np.max(x)), "p90": p90, "p99": p99, "q1": q1, "q3": q3, "iqr": q3 - q1,
            "ci95_median": [lo, hi], "cv": cv, "unstable": bool(cv > unstable_cv)}


def ratio_of_medians(base: Sequence[float], new: Sequence[float], level: float = 0.95,
                     resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED) -> Dict[str, float]:
    """``median(new) / median(base)`` with a bootstrap interval (both sets resampled independently)."""
    b = np.asarray(base, dtype=np.float64)
    n = np.asarray(new, dtype=np.float64)
    rng = np.random.default_rng(seed)
    ratios = _bootstrap_medians(n, resamples, rng) / _bootstrap_medians(b, resamples, rng)
    lo, hi = np.percentile(ratios, [50 * (1 - level), 50 * (1 + level)])
    return {"ratio": float(np.median(n) / np.median(b)), "ci": [float(lo), float(hi)]}


def mann_whitney(base: Sequence[float], new: Sequence[float]) -> Dict[str, float]:
    """Two-sided Mann-Whitney U test: ``{"u", "p"}`` (scipy; exact for small samples, else asymptotic)."""
    from scipy.stats import mannwhitneyu

    res = mannwhitneyu(np.asarray(new, dtype=np.float64), np.asarray(base, dtype=np.float64),
                       alternative="two-sided")
    return {"u": float(res.statistic), "p": float(res.pvalue)}


def verdict(base: Sequence[float], new: Sequence[float], alpha: float = 0.01, min_effect: float = 0.05
            ) -> Dict[str, Any]:
    """faster / slower / same for two sets of samples of one target on one device.

    "slower" (or "faster") needs all three: Mann-Whitney U significant at ``alpha``, the bootstrap interval of
    the ratio of medians entirely above (below) 1, and the ratio itself beyond ``1 +- min_effect``. The last
    guard is what keeps re-runs of one artifact "same": with many samples, U finds a 1% drift between two runs
    significant, but a drift that small is noise between runs (clocks, memory layout), not a change in code.
    """
    r = ratio_of_medians(base, new)
    mw = mann_whitney(base, new)
    out: Dict[str, Any] = {"ratio": r["ratio"], "ratio_ci95": r["ci"], "mann_whitney_u": mw["u"], "p_value": mw["p"],
                           "alpha": alpha, "min_effect": min_effect, "verdict": "same"}
    if mw["p"] < alpha:
        if r["ci"][0] > 1.0 and r["ratio"] > 1.0 + min_effect:
            out["verdict"] = "slower"
        elif r["ci"][1] < 1.0 and r["ratio"] < 1.0 / (1.0 + min_effect):
            out["verdict"] = "faster"
    return out


def variance_components(groups: Sequence[Sequence[float]]) -> Optional[Dict[str, float]]:
    """Within- and between-device variance of per-device samples (one-way random-effects ANOVA).

    within = pooled variance of samples around their device's mean; between = the variance of the device means
    that the within-device noise does not explain (method of moments, clipped at 0). Also the share of the
    total that is between devices. None for fewer than two groups.
    """
    arrays = [np.asarray(g, dtype=np.float64) for g in groups if len(g) > 0]
    if len(arrays) < 2:
        return None
    k = len(arrays)
    sizes = np.array([len(a) for a in arrays], dtype=np.float64)
    means = np.array([a.mean() for a in arrays])
    grand = float(np.sum(sizes * means) / np.sum(sizes))
    ss_within = float(sum(((a - a.mean()) ** 2).sum() for a in arrays))
    df_within = float(np.sum(sizes) - k)
    ms_within = ss_within / df_within if df_within > 0 else 0.0
    ms_between = float(np.sum(sizes * (means - grand) ** 2) / (k - 1))
    n0 = (np.sum(sizes) - np.sum(sizes ** 2) / np.sum(sizes)) / (k - 1)
    between = max(0.0, (ms_between - ms_within) / n0) if n0 > 0 else 0.0
    total = between + ms_within
    return {"within_var": ms_within, "between_var": between, "between_share": between / total if total > 0 else 0.0,
            "groups": k, "spread_of_medians": float(max(np.median(a) for a in arrays) /
                                                      min(np.median(a) for a in arrays) - 1.0)}
