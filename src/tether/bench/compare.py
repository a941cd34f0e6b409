"""`tether bench compare`: two run documents, matched per target and device, judged faster / slower / same.

Results are matched per target and device (see :func:`match_results`); the judgement is
:func:`tether.bench.stats.verdict` on the samples each result uses. Targets named differently in the two documents
(two builds of one model in folders of different names) are paired by a rename map, ``{new name: base name}``:
:func:`pair_by_order` or :func:`pair_by_names` make one.
"""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from tether.errors import InvalidInput

from . import stats


def _steady(result: Dict[str, Any]) -> List[float]:
    return [s["s"] for s in result["samples"] if s.get("used", not s.get("warmup"))]


def _fingerprints(doc: Dict[str, Any]) -> Dict[str, str]:
    return {d["id"]: d.get("fingerprint", {}).get("id", d["id"]) for d in doc.get("devices", [])}


def paired_name(row: Dict[str, Any]) -> str:
    """A compared row's target as shown: its name, or both names when the two documents name it differently."""
    new = row.get("new_target", row["target"])
    return row["target"] if new == row["target"] else "%s vs %s" % (row["target"], new)


def targets(doc: Dict[str, Any]) -> List[str]:
    """The document's target names, each once, in the order of its results."""
    return list(dict.fromkeys(r["target"] for r in doc["results"]))


def pair_by_order(base: Dict[str, Any], new: Dict[str, Any]) -> Dict[str, str]:
    """The rename map that pairs the k-th target of ``new`` with the k-th of ``base``; both must have as many."""
    tb, tn = targets(base), targets(new)
    if len(tb) != len(tn):
        raise InvalidInput("pairing by order needs as many targets on each side: the base document has %d (%s), "
                           "the new one %d (%s)" % (len(tb), ", ".join(tb), len(tn), ", ".join(tn)))
    return dict(zip(tn, tb))


def pair_by_names(base: Dict[str, Any], new: Dict[str, Any], pairs: Sequence[Tuple[str, str]]) -> Dict[str, str]:
    """The rename map of ``(base name, new name)`` pairs, each name a target of its document and named once."""
    tb, tn = targets(base), targets(new)
    rename: Dict[str, str] = {}
    for b, n in pairs:
        if b not in tb:
            raise InvalidInput("pair %s=%s: the base document has no target %r (its targets: %s)"
                               % (b, n, b, ", ".join(tb)))
        if n not in tn:
            raise InvalidInput("pair %s=%s: the new document has no target %r (its targets: %s)"
                               % (b, n, n, ", ".join(tn)))
        if n in rename or b in rename.values():
            raise InvalidInput("pair %s=%s: %r is paired twice" % (b, n, n if n in rename else b))
        rename[n] = b
    return rename


def match_results(base: Dict[str, Any], new: Dict[str, Any], rename: Optional[Mapping[str, str]] = None
                  ) -> Tuple[List[Tuple[Dict[str, Any], Dict[str, Any]]], List[str]]:
    """Pairs of results to compare, and notes on what did not pair up. ``rename`` maps targets of ``new`` to the
    base target they are compared with; each paired new result carries its own name as ``new_target``.

    In order: the same target on the same device id; then the same target on devices with the same fingerprint,
    when that pairs them unambiguously (a tracker gave the board another id); then a target that is left on
    exactly one device in each document (compared across devices, with a note)."""
    rename = dict(rename or {})
    fb, fn = _fingerprints(base), _fingerprints(new)
    left_b = list(base["results"])
    left_n = [dict(r, target=rename.get(r["target"], r["target"]), new_target=r["target"]) for r in new["results"]]
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
    notes += ["%s on %s: only in the new document" % (r["new_target"], r["device"]) for r in left_n]
    return pairs, notes


def compare_documents(base: Dict[str, Any], new: Dict[str, Any], alpha: float = 0.01, fail_above: float = 5.0,
                      min_effect: Optional[float] = None, rename: Optional[Mapping[str, str]] = None
                      ) -> Dict[str, Any]:
    """``{"rows": [...], "failed": [rows slower by more than fail_above %], "notes": [...]}``; no rows means
    nothing was compared (the caller must not read that as a pass).

    ``min_effect`` (a fraction) is the smallest change called faster/slower; default ``fail_above`` percent:
    one threshold says both what counts as a change and what fails the gate. ``rename``: see
    :func:`match_results`."""
    if min_effect is None:
        min_effect = max(fail_above, 0.0) / 100.0
    matched, notes = match_results(base, new, rename)
    pairs = [(None, rb, rn) for rb, rn in matched]
    rows = []
    for _, rb, rn in pairs:
        v = stats.verdict(_steady(rb), _steady(rn), alpha=alpha, min_effect=min_effect)
        row = {"target": rb["target"], "new_target": rn["new_target"], "device": rn["device"],
               "base_device": rb["device"],
               "base_median": rb["stats"]["median"], "new_median": rn["stats"]["median"],
               "base_n": rb["stats"]["n"], "new_n": rn["stats"]["n"], **v,
               "same_artifact": rb["run"].get("artifact_sha256") == rn["run"].get("artifact_sha256")}
        if rb["run"].get("target") != rn["run"].get("target"):
            notes.append("%s: compiled for %s vs %s" % (rb["target"], rb["run"].get("target"), rn["run"].get("target")))
        rows.append(row)
    failed = [r for r in rows if r["verdict"] == "slower" and (r["ratio"] - 1.0) * 100.0 > fail_above]
    return {"schema": "tether-bench-compare/1", "alpha": alpha, "fail_above_pct": fail_above,
            "min_effect": min_effect, "rows": rows, "failed": failed, "notes": notes}
