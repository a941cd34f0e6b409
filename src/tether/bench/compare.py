"""`tether bench compare`: two run documents, matched per target and device, judged faster / slower / same.

Results are matched by target name and device fingerprint id (so a device that got another tracker id between
runs still matches); a target measured on one device in each document matches even if the devices differ
(with a note). The judgement is :func:`tether.bench.stats.verdict` on the steady samples.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from . import stats

DEFAULT_MIN_EFFECT = 0.05


def _steady(result: Dict[str, Any]) -> List[float]:
    return [s["s"] for s in result["samples"] if s.get("used", not s.get("warmup"))]


def _fingerprints(doc: Dict[str, Any]) -> Dict[str, str]:
    return {d["id"]: d.get("fingerprint", {}).get("id", d["id"]) for d in doc.get("devices", [])}


def _keyed(doc: Dict[str, Any]) -> Dict[Tuple[str, str], Dict[str, Any]]:
    fps = _fingerprints(doc)
    return {(r["target"], fps.get(r["device"], r["device"])): r for r in doc["results"]}


def compare_documents(base: Dict[str, Any], new: Dict[str, Any], alpha: float = 0.01, fail_above: float = 5.0,
                      min_effect: Optional[float] = None) -> Dict[str, Any]:
    """``{"rows": [...], "failed": [rows slower by more than fail_above %], "notes": [...]}``.

    ``min_effect`` (a fraction) is the smallest change called faster/slower; default: the smaller of 5% and
    ``fail_above``, so that a failure threshold below 5% is still reachable."""
    if min_effect is None:
        min_effect = min(DEFAULT_MIN_EFFECT, max(fail_above, 0.0) / 100.0)
    b, n = _keyed(base), _keyed(new)
    pairs = [(k, b[k], n[k]) for k in b if k in n]
    notes: List[str] = []
    matched_b = {k for k, _, _ in pairs}
    matched_n = set(matched_b)
    # a target alone on one device in each document: compare across devices, but say so
    for target in sorted({k[0] for k in b} | {k[0] for k in n}):
        bk = [k for k in b if k[0] == target and k not in matched_b]
        nk = [k for k in n if k[0] == target and k not in matched_n]
        if len(bk) == 1 and len(nk) == 1:
            pairs.append((bk[0], b[bk[0]], n[nk[0]]))
            notes.append("%s: measured on different devices (%s vs %s)" % (target, b[bk[0]]["device"],
                                                                          n[nk[0]]["device"]))
        else:
            for k in bk:
                notes.append("%s on %s: only in the base document" % (k[0], b[k]["device"]))
            for k in nk:
                notes.append("%s on %s: only in the new document" % (k[0], n[k]["device"]))
    rows = []
    for _, rb, rn in pairs:
        v = stats.verdict(_steady(rb), _steady(rn), alpha=alpha, min_effect=min_effect)
        row = {"target": rb["target"], "device": rn["device"], "base_device": rb["device"],
               "base_median": rb["stats"]["median"], "new_median": rn["stats"]["median"],
               "base_n": rb["stats"]["n"], "new_n": rn["stats"]["n"], **v,
               "same_artifact": rb["run"].get("artifact_sha256") == rn["run"].get("artifact_sha256")}
        if rb["run"].get("target") != rn["run"].get("target"):
            notes.append("%s: compiled for %s vs %s" % (rb["target"], rb["run"].get("target"), rn["run"].get("target")))
        rows.append(row)
    failed = [r for r in rows if r["verdict"] == "slower" and (r["ratio"] - 1.0) * 100.0 > fail_above]
    return {"schema": "tether-bench-compare/1", "alpha": alpha, "fail_above_pct": fail_above,
            "min_effect": min_effect, "rows": rows, "failed": failed, "notes": notes}
