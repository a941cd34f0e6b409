"""Reading and writing benchmark documents: JSON (the schema in ``schema/bench.schema.json``) and CSV."""
from __future__ import annotations

import csv
import json
import os
from typing import Any, Dict, List

from tether.errors import InvalidInput
from tether.json_input import read_json_file

SCHEMA_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "schema", "bench.schema.json")

CSV_COLUMNS = ("target", "kind", "device", "n", "number", "median_s", "mean_s", "min_s", "max_s", "p90_s", "p99_s",
               "iqr_s", "ci95_lo_s", "ci95_hi_s", "cv", "unstable", "warmup", "hot", "throttled", "upload_s", "load_s",
               "first_run_s", "peak_rss_bytes", "arena_bytes", "artifact_sha256", "compile_target", "placement",
               "clock")


def write_json(doc: Dict[str, Any], path: str) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(doc, fh, indent=1, sort_keys=False)
        fh.write("\n")


def read_json(path: str) -> Dict[str, Any]:
    """The run document at ``path`` (``tether bench --json``); anything else raises InvalidInput naming it."""
    expected = "expected a `tether bench --json` document"
    doc = read_json_file(path, expected)
    if not isinstance(doc, dict) or not str(doc.get("schema", "")).startswith("tether-bench/"):
        raise InvalidInput("%s is not a tether bench document (no \"schema\": \"tether-bench/1\"); %s"
                           % (path, expected))
    results = doc.get("results")
    if not isinstance(results, list) or not all(
            isinstance(r, dict) and isinstance(r.get("target"), str) and isinstance(r.get("device"), str)
            and isinstance(r.get("run"), dict) and isinstance(r.get("samples"), list)
            and isinstance(r.get("stats"), dict) and isinstance(r["stats"].get("median"), (int, float))
            for r in results):
        raise InvalidInput("%s: its \"results\" are not a list of results with a target, device, run, stats and "
                           "samples; %s" % (path, expected))
    return doc


def schema() -> Dict[str, Any]:
    with open(SCHEMA_PATH, "r", encoding="utf-8") as fh:
        return json.load(fh)


def csv_rows(doc: Dict[str, Any]) -> List[Dict[str, Any]]:
    rows = []
    for r in doc["results"]:
        s = r["stats"]
        rows.append({"target": r["target"], "kind": r["kind"], "device": r["device"], "n": s["n"],
                     "number": r["number"],
                     "median_s": s["median"], "mean_s": s["mean"], "min_s": s["min"], "max_s": s["max"],
                     "p90_s": s["p90"], "p99_s": s["p99"], "iqr_s": s["iqr"], "ci95_lo_s": s["ci95_median"][0],
                     "ci95_hi_s": s["ci95_median"][1], "cv": s["cv"], "unstable": s["unstable"],
                     "warmup": r["warmup"]["count"], "hot": r["flags"]["hot"], "throttled": r["flags"]["throttled"],
                     "upload_s": r["phases"].get("upload_s"), "load_s": r["phases"].get("load_s"),
                     "first_run_s": r["phases"].get("first_run_s"),
                     "peak_rss_bytes": r["memory"].get("peak_rss_bytes"), "arena_bytes": r["memory"].get("arena_bytes"),
                     "artifact_sha256": r["run"].get("artifact_sha256"), "compile_target": r["run"].get("target"),
                     "placement": r.get("placement", "cpu"), "clock": r.get("clock", "host")})
    return rows


def write_csv(doc: Dict[str, Any], path: str) -> None:
    """One row per result (target x device); the raw samples are in the JSON."""
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=CSV_COLUMNS)
        writer.writeheader()
        for row in csv_rows(doc):
            writer.writerow(row)
