"""Recent `tether bench` results on the tracker's dashboard: what is kept of an upload, and the upload itself.

A bench document carries every raw sample (megabytes); the dashboard shows one line per result, so an upload is
cut down to that line (:func:`bench_summary`) before it is kept, by the uploader already and again by the tracker
(a script may POST a whole document). The tracker keeps the last few summaries in memory and nothing else:
uploads are parsed as JSON, never executed or unpickled, and every string in them is shortened.
"""
from __future__ import annotations

import collections
import http.client
import json
import time
from typing import Any, Deque, Dict, List, Optional
from urllib.parse import urlsplit

MAX_RESULTS = 64           # results kept per upload
MAX_TEXT = 200             # characters kept of any string


def _text(value: Any) -> Optional[str]:
    if value is None:
        return None
    text = value if isinstance(value, str) else str(value)
    return text[:MAX_TEXT]


def _number(value: Any) -> Optional[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if value == value and abs(value) != float("inf") else None


class BenchUploadError(ValueError):
    """An upload that is not a bench document (or its summary)."""


def bench_summary(doc: Any) -> Dict[str, Any]:
    """One line per result of a `tether bench --json` document (or of such a summary: the cut is idempotent)."""
    if not isinstance(doc, dict) or not isinstance(doc.get("results"), list):
        raise BenchUploadError("a bench upload must be a JSON object with a 'results' list "
                               "(what `tether bench --json` writes)")
    host = doc.get("host") if isinstance(doc.get("host"), dict) else {}
    command = doc.get("command")
    if isinstance(command, list):
        command = " ".join(str(c) for c in command[:64])
    results: List[Dict[str, Any]] = []
    for r in doc["results"][:MAX_RESULTS]:
        if not isinstance(r, dict):
            raise BenchUploadError("each bench result must be a JSON object")
        stats = r.get("stats") if isinstance(r.get("stats"), dict) else r
        ci = stats.get("ci95_median", stats.get("ci95"))
        results.append({
            "target": _text(r.get("target")), "device": _text(r.get("device")),
            "median": _number(stats.get("median")), "mean": _number(stats.get("mean")),
            "min": _number(stats.get("min")), "p90": _number(stats.get("p90")), "cv": _number(stats.get("cv")),
            "n": _number(stats.get("n")), "unstable": bool(stats.get("unstable")),
            "ci95": [_number(x) for x in ci[:2]] if isinstance(ci, list) and len(ci) >= 2 else None,
        })
    return {"created": _text(doc.get("created")), "command": _text(command),
            "host": {k: _text(host.get(k)) for k in ("tether_version", "git_commit", "hostname")},
            "results": results, "results_total": len(doc["results"])}


class BenchBoard:
    """The last ``keep`` bench summaries, newest first."""

    def __init__(self, keep: int = 20):
        self._items: Deque[Dict[str, Any]] = collections.deque(maxlen=max(1, keep))
        self._seq = 0

    def add(self, body: bytes, source: str) -> Dict[str, Any]:
        """Parse and keep one upload (raises :class:`BenchUploadError` naming what is wrong); returns what is kept."""
        try:
            doc = json.loads(body)
        except (ValueError, RecursionError) as exc:
            raise BenchUploadError("a bench upload must be JSON: %s" % str(exc)[:200]) from None
        summary = bench_summary(doc)
        self._seq += 1
        summary.update({"id": self._seq, "received": time.time(), "from": _text(source)})
        self._items.appendleft(summary)
        return summary

    def items(self) -> List[Dict[str, Any]]:
        return list(self._items)


def upload_bench(url: str, doc: Dict[str, Any], token: Optional[str] = None, timeout: float = 10.0) -> Dict[str, Any]:
    """POST the summary of ``doc`` to a tracker dashboard (``http://HOST:PORT``); returns what the tracker kept.

    Raises :class:`OSError` when the dashboard cannot be reached or refuses the upload (its reason in the message).
    """
    split = urlsplit(url if "//" in url else "http://" + url)
    if split.scheme != "http" or not split.hostname:
        raise ValueError("%s: expected the dashboard's address, http://HOST:PORT" % url)
    body = json.dumps(bench_summary(doc)).encode()
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = "Bearer " + token
    conn = http.client.HTTPConnection(split.hostname, split.port or 80, timeout=timeout)
    try:
        conn.request("POST", "/api/bench", body, headers)
        reply = conn.getresponse()
        text = reply.read(1 << 16)
    except http.client.HTTPException as exc:
        raise OSError("%s does not answer like a tracker dashboard: %s" % (url, exc)) from None
    finally:
        conn.close()
    try:
        answer = json.loads(text)
    except ValueError:
        answer = {"error": text[:200].decode("utf-8", "replace")}
    if reply.status != 200:
        raise OSError("the dashboard at %s refused the bench upload (HTTP %d): %s"
                      % (url, reply.status, answer.get("error") if isinstance(answer, dict) else answer))
    return answer
