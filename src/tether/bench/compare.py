"""`tether bench compare`: two run documents, matched per target and device, judged faster / slower / same.

Results are matched per target and device (see :func:`match_results`); the judgement is
:func:`tether.bench.stats.verdict` on the samples each result uses.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from . import stats



def _steady(result: Dict[str, Any]) -> List[float]:
    return [s["s"] for s in result["samples"] if s.get("used", not s.get("warmup"))]


def _fingerprints(doc: Dict[str, Any]) -> Dict[str, str]:
    return {d["id"]: d.get("fingerprint", {}).get("id", d["id"]) for d in doc.get("devices", [])}


def match_results(base: Dict[str, Any], new: Dict[str, Any]) -> Tuple[List[Tuple[Dict[str, Any], Dict[str, Any]]],
                                                                      List[str]]:
    """Pairs of results to compare, and notes on what did not pair up.

    In order: the same target on the same device id; then the same target on devices with the same fingerprint,
    when that pairs them unambiguously (a tracker gave the board another id); then a target that is left on
    exactly one device in each document (compared across devices, with a note)."""
    fb, fn = _fingerprints(base), _fingerprints(new)
    left_b = list(base["results"])
    left_n = list(new["results"])
    pairs: List[Tuple[Dict[str, Any], Dict[str, Any]]] = []
    notes: List[str] = []

    def take(key_b: Any, key_n: Any, unique: bool) -> None:
        for rb in list(left_b):
            cands = [rn for rn in left_n if key_n(rn) == key_b(rb)]
            twins = [x for x in left_b if key_b(x) == key_b(rb)]
            if cands and (not unique or (len(cands) == 1 and len(twins) == 1)):
                pairs.append((rb, cands[0]))
                left_b.remove(rb)
                left_n.remove(cands[0])

    take(lambda r: (r["target"], r["device"]), lambda r: (r["target"], r["device"]), False)
    take(lambda r: (r["target"], fb.get(r["device"])), lambda r: (r["target"], fn.get(r["device"])), True)
    before = len(pairs)
    take(lambda r: r["target"], lambda r: r["target"], True)
    for rb, rn in pairs[before:]:
        notes.append("%s: measured on different devices (%s vs %s)" % (rb["target"], rb["device"], rn["device"]))
    notes += ["%s on %s: only in the base document" % (r["target"], r["device"]) for r in left_b]
    notes += ["%s on %s: only in the new document" % (r["target"], r["device"]) for r in left_n]
    return pairs, notes


def compare_documents(base: Dict[str, Any], new: Dict[str, Any], alpha: float = 0.01, fail_above: float = 5.0,
                      min_effect: Optional[float] = None) -> Dict[str, Any]:
    """``{"rows": [...], "failed": [rows slower by more than fail_above %], "notes": [...]}``.

    ``min_effect`` (a fraction) is the smallest change called faster/slower; default ``fail_above`` percent:
    one threshold says both what counts as a change and what fails the gate."""
    if min_effect is None:
        min_effect = max(fail_above, 0.0) / 100.0
    matched, notes = match_results(base, new)
    pairs = [(None, rb, rn) for rb, rn in matched]
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
