"""`tether tune --report`: tuning curves (best latency vs trials, per task) from a tuning log, as one self-contained
HTML page in the style of `tether bench --html` (matplotlib SVG inlined, no script, nothing loaded by URL)."""
from __future__ import annotations

from typing import Any, Dict, List, Optional

from tether.bench.page import escape, figure, duration, page, plot_block, svg, svg_style
from tether.tune import log as tlog


def curves(records: List[Dict[str, Any]]) -> Dict[str, Dict[str, Any]]:
    """task key -> {name, weight, target, trials: [(trial, latency or None, best so far)], failures, default_s}."""
    tasks: Dict[str, Dict[str, Any]] = {}
    for r in records:
        if r.get("kind") == "task":
            tasks.setdefault(r["task"], {"name": r["name"], "weight": r["weight"], "target": r["target"],
                                         "space": r.get("space", {}), "trials": [], "failures": {},
                                         "default_s": None, "best_config": None})
    for r in tlog.results(records):
        t = tasks.setdefault(r["task"], {"name": r["task"], "weight": 1, "target": r.get("target"), "space": {},
                                         "trials": [], "failures": {}, "default_s": None, "best_config": None})
        lat = r.get("latency_s") if r.get("status") == tlog.OK else None
        prev = t["trials"][-1][2] if t["trials"] else None
        best = prev if lat is None or (prev is not None and prev <= lat) else lat
        if best is not prev and lat is not None:
            t["best_config"] = r["config"]
        t["trials"].append((len(t["trials"]) + 1, lat, best))
        if lat is None:
            t["failures"][r["status"]] = t["failures"].get(r["status"], 0) + 1
        space = t["space"]
        if t["default_s"] is None and lat is not None and space and \
                r["config"] == {k: v[0] for k, v in space.items()}:
            t["default_s"] = lat
    return tasks


def curve_plot(name: str, trials: List[tuple]) -> str:
    with svg_style():
        fig = figure(8.0, 2.6)
        ax = fig.add_subplot(1, 1, 1)
        ok = [(n, lat) for n, lat, _ in trials if lat is not None]
        bad = [n for n, lat, _ in trials if lat is None]
        best = [(n, b) for n, _, b in trials if b is not None]
        scale = 1e-3 if best and best[0][1] >= 1e-3 else 1e-6
        unit = "ms" if scale == 1e-3 else "us"
        if ok:
            ax.scatter([n for n, _ in ok], [lat / scale for _, lat in ok], s=6, color="#9aa4bd", label="measured")
        if best:
            ax.step([n for n, _ in best], [b / scale for _, b in best], where="post", color="#1b7a2e",
                    label="best so far")
        if bad:
            top = max([lat for _, lat in ok] or [scale]) / scale
            ax.scatter(bad, [top] * len(bad), marker="x", s=12, color="#b00020", label="invalid")
        ax.set_xlabel("trial")
        ax.set_ylabel("latency (%s)" % unit)
        ax.set_title(name, fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(loc="upper right", fontsize=7)
        return svg(fig)


def _verified(records: List[Dict[str, Any]]) -> Dict[str, tuple]:
    """task key -> (fastest verify run of the default, of the chosen config) for verified tasks."""
    space = {r["task"]: {k: v[0] for k, v in r.get("space", {}).items()} for r in records if r.get("kind") == "task"}
    out = {}
    for task, chosen in tlog.verified(records).items():
        defaults = [r["latency_s"] for r in records if r.get("kind") == "verify" and r["task"] == task
                    and r.get("status") == tlog.OK and r["config"] == space.get(task)]
        if defaults:
            out[task] = (min(defaults), chosen["latency_s"])
    return out


def render(records: List[Dict[str, Any]], title: str = "tether tune") -> str:
    tasks = curves(records)
    verified = _verified(records)
    rows, plots = [], []
    total_default = total_best = 0.0
    for key, t in sorted(tasks.items(), key=lambda kv: -kv[1]["weight"] * (_best(kv[1]) or 0.0)):
        best = _best(t)
        speedup = (t["default_s"] / best) if (t["default_s"] and best) else None
        checked = verified.get(key)
        if checked:
            total_default += t["weight"] * checked[0]
            total_best += t["weight"] * checked[1]
        elif speedup:
            total_default += t["weight"] * t["default_s"]
            total_best += t["weight"] * best
        rows.append("<tr><td class=\"l\">%s</td><td class=\"l\">%s</td><td>%d</td><td>%d</td><td>%s</td><td>%s</td>"
                    "<td>%s</td><td>%s</td><td class=\"l\">%s</td><td class=\"l\">%s</td></tr>"
                    % (escape(key), escape(t["name"]), t["weight"], len(t["trials"]), duration(t["default_s"]),
                       duration(best),
                       "%.2fx" % speedup if speedup else "-",
                       "%.2fx" % (checked[0] / checked[1]) if checked else "-",
                       escape(", ".join("%s %d" % kv for kv in sorted(t["failures"].items()))),
                       escape(t["best_config"] or "")))
        if t["trials"]:
            plots.append("<h3>%s (%s, weight %d)</h3>" % (escape(t["name"]), escape(key), t["weight"])
                         + plot_block("tuning-curve", curve_plot(t["name"], t["trials"])))
    overall = ("<p>kernel time of the model (weighted by how often each kernel runs; verified figures where a task "
               "has them): default %s, tuned %s, "
               "<b>%.2fx</b></p>" % (duration(total_default), duration(total_best), total_default / total_best)
               if total_best else "")
    head = ("<table><tr><th class=\"l\">task</th><th class=\"l\">kernel</th><th>weight</th><th>trials</th>"
            "<th>default</th><th>best</th><th>speedup</th><th>verified</th><th class=\"l\">invalid</th>"
            "<th class=\"l\">best config</th></tr>%s</table>" % "".join(rows))
    return page(title, ["<h1>%s</h1>" % escape(title), overall, "<h2>Tasks</h2>", head,
                         "<h2>Tuning curves</h2>"] + plots)


def _best(t: Dict[str, Any]) -> Optional[float]:
    vals = [b for _, _, b in t["trials"] if b is not None]
    return min(vals) if vals else None


def write_report(log_path: str, out_path: str) -> int:
    """Write the HTML report of the log at `log_path`; returns the number of tasks in it."""
    records = tlog.read_log(log_path)
    text = render(records, "tether tune: %s" % log_path)
    with open(out_path, "w", encoding="utf-8") as fh:
        fh.write(text)
    return len(curves(records))

