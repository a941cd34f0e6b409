"""Self-contained HTML reports of bench runs and comparisons: matplotlib draws each plot as SVG, inlined (the page
and its pieces: tether.bench.page)."""
from __future__ import annotations

import json
from typing import Any, Dict, List

import numpy as np

from tether.bench.compare import paired_name
from tether.bench.page import escape, figure, duration, page, plot_block, svg, svg_style, time_unit

MAX_POINTS = 1000  # sample dots drawn per distribution


def _steady(result: Dict[str, Any]) -> List[float]:
    return [s["s"] for s in result["samples"] if s.get("used", not s.get("warmup"))]


def distribution_plot(label: str, groups: List[tuple]) -> str:
    """Latency distribution of each (name, samples): violins with the samples on top."""
    values = [v for _, s in groups for v in s]
    unit, scale = time_unit(values)
    with svg_style():
        fig = figure(8.0, 0.9 + 0.55 * max(2, len(groups)))
        ax = fig.add_subplot(1, 1, 1)
        data = [np.asarray(s) / scale for _, s in groups]
        pos = np.arange(1, len(groups) + 1)
        if all(len(d) > 1 for d in data):
            import inspect

            # matplotlib 3.10 renamed vert=False to orientation="horizontal" (and deprecated the old name)
            horizontal = ({"orientation": "horizontal"} if "orientation" in inspect.signature(ax.violinplot).parameters
                          else {"vert": False})
            parts = ax.violinplot(data, positions=pos, showmedians=True, widths=0.8, **horizontal)
            for body in parts["bodies"]:
                body.set_alpha(0.35)
        rng = np.random.default_rng(0)
        for p, d in zip(pos, data):
            if len(d) > MAX_POINTS:  # every sample is in the violin; a seeded subset keeps the SVG small
                d = rng.choice(d, MAX_POINTS, replace=False)
            ax.scatter(d, p + rng.uniform(-0.12, 0.12, len(d)), s=6, alpha=0.6, color="#2b59c3")
        ax.set_yticks(pos)
        ax.set_yticklabels([n for n, _ in groups])
        ax.set_xlabel("time per run (%s)" % unit)
        ax.set_title(label)
        ax.grid(axis="x", alpha=0.3)
        return svg(fig)


def timeline_plot(result: Dict[str, Any]) -> str:
    """Samples over time, with the CPU temperature and mean frequency on a second axis when the board has them."""
    samples = result["samples"]
    t = np.array([s["t"] for s in samples])
    y = np.array([s["s"] for s in samples])
    unit, scale = time_unit(list(y))
    warm = np.array([bool(s.get("warmup")) for s in samples])
    with svg_style():
        fig = figure(8.0, 3.0)
        ax = fig.add_subplot(1, 1, 1)
        ax.plot(t, y / scale, color="#2b59c3", lw=1, label="time per run")
        if warm.any():
            ax.scatter(t[warm], y[warm] / scale, color="#d98c00", s=14, zorder=3, label="warm-up (dropped)")
        disturbed = np.array([bool(s.get("disturbed")) and not s.get("warmup") for s in samples])
        if disturbed.any():
            ax.scatter(t[disturbed], y[disturbed] / scale, color="#999", s=10, zorder=3,
                       label="interrupted by other programs")
        flagged = np.array([bool(s.get("hot") or s.get("throttled")) for s in samples])
        if flagged.any():
            ax.scatter(t[flagged], y[flagged] / scale, color="#b00020", marker="x", s=20, zorder=4,
                       label="hot / throttled")
        ax.set_xlabel("seconds since start")
        ax.set_ylabel("time per run (%s)" % unit)
        ax.grid(alpha=0.3)
        handles, labels = ax.get_legend_handles_labels()
        temps = [(s["t"], s["temp_c"]) for s in samples if "temp_c" in s]
        freqs = [(s["t"], float(np.mean(s["freq_khz"])) / 1e3) for s in samples if s.get("freq_khz")]
        if temps or freqs:
            ax2 = ax.twinx()
            if temps:
                ax2.plot(*zip(*temps), color="#c0392b", lw=1, ls="--", label="temperature (C)")
            if freqs:
                ax2.plot(*zip(*freqs), color="#27ae60", lw=1, ls=":", label="mean frequency (MHz)")
            ax2.set_ylabel("C / MHz")
            h2, l2 = ax2.get_legend_handles_labels()
            handles, labels = handles + h2, labels + l2
        ax.legend(handles, labels, loc="upper right", fontsize=7)
        ax.set_title("%s on %s" % (result["target"], result["device"]))
        return svg(fig)


def profile_plot(result: Dict[str, Any], top: int = 25) -> str:
    nodes = sorted(result["profile"], key=lambda r: -r["seconds"])[:top]
    unit, scale = time_unit([n["seconds"] for n in nodes])
    with svg_style():
        fig = figure(8.0, 0.8 + 0.22 * len(nodes))
        ax = fig.add_subplot(1, 1, 1)
        names = ["%s (%s)" % (n["name"][:32], n["ops"][:24]) for n in nodes][::-1]
        ax.barh(names, [n["seconds"] / scale for n in nodes][::-1], color="#2b59c3")
        ax.set_xlabel("time per layer (%s)" % unit)
        ax.set_title("per-layer profile: %s on %s (top %d)" % (result["target"], result["device"], len(nodes)))
        ax.grid(axis="x", alpha=0.3)
        return svg(fig)


def ratio_plot(rows: List[Dict[str, Any]]) -> str:
    with svg_style():
        fig = figure(8.0, 0.9 + 0.45 * max(2, len(rows)))
        ax = fig.add_subplot(1, 1, 1)
        colors = {"slower": "#b00020", "faster": "#1b7a2e", "same": "#555"}
        for k, r in enumerate(rows):
            lo, hi = r["ratio_ci95"]
            ax.errorbar([r["ratio"]], [k], xerr=[[r["ratio"] - lo], [hi - r["ratio"]]], fmt="o",
                        color=colors[r["verdict"]], capsize=4)
        ax.axvline(1.0, color="#888", lw=1)
        ax.set_yticks(range(len(rows)))
        ax.set_yticklabels(["%s on %s" % (r["target"], r["device"]) for r in rows])
        ax.set_xlabel("new / base median (95% bootstrap CI)")
        ax.grid(axis="x", alpha=0.3)
        return svg(fig)


def _kv_table(d: Dict[str, Any]) -> str:
    rows = []
    for k, v in d.items():
        if isinstance(v, (list, dict)):
            v = json.dumps(v) if len(json.dumps(v)) < 300 else json.dumps(v)[:300] + " ..."
        rows.append('<tr><th class="l">%s</th><td class="l">%s</td></tr>' % (escape(k), escape(v)))
    return "<table>%s</table>" % "".join(rows)


def pairs_table(pairs: List[Dict[str, Any]]) -> str:
    """GPU build beside CPU build: medians, the clock of each, and the speedup (CPU / GPU)."""
    head = ("target", "device", "GPU", "GPU median", "GPU clock", "CPU median", "CPU clock", "speedup (CPU / GPU)")
    rows = []
    for p in pairs:
        cells = (p["pair"], p["device"], p["compute"], duration(p["gpu_median_s"]), p["gpu_clock"],
                 duration(p["cpu_median_s"]), p["cpu_clock"],
                 "-" if p["speedup"] is None else "%.2fx" % p["speedup"])
        rows.append("<tr>%s</tr>" % "".join('<td%s>%s</td>' % (' class="l"' if i < 3 else "", escape(c))
                                            for i, c in enumerate(cells)))
    return ('<h2>GPU and CPU builds</h2><table id="pairs"><tr>%s</tr>%s</table>'
            % ("".join("<th>%s</th>" % h for h in head), "".join(rows)))


def render_report(doc: Dict[str, Any]) -> str:
    results = doc["results"]
    body = ["<h1>tether bench</h1>",
            "<p>%s &middot; tether %s (%s) &middot; %d result(s) on %d device(s)</p>"
            % (escape(doc.get("created")), escape(doc["host"].get("tether_version")),
               escape((doc["host"].get("git_commit") or "no git")[:12]), len(results), len(doc.get("devices", [])))]
    head = ("target", "device", "median", "95% CI of median", "mean", "min", "p90", "p99", "IQR", "CV", "n x runs",
            "warm-up", "first run", "peak RSS")
    rows = []
    for r in results:
        s = r["stats"]
        rss = r["memory"].get("peak_rss_bytes")
        rows.append("<tr>%s</tr>" % "".join(
            '<td%s>%s</td>' % (' class="l"' if i < 2 else "", escape(c)) for i, c in enumerate(
                (r["target"], r["device"], duration(s["median"]), "%s - %s" % (duration(s["ci95_median"][0]),
                                                                        duration(s["ci95_median"][1])),
                 duration(s["mean"]), duration(s["min"]), duration(s["p90"]), duration(s["p99"]), duration(s["iqr"]),
                 "%.1f%%%s" % (100 * s["cv"], " (unstable)" if s["unstable"] else ""),
                 "%d x %d" % (s["n"], r["number"]), r["warmup"]["count"], duration(r["phases"].get("first_run_s")),
                 "%.1f MiB" % (rss / 2 ** 20) if rss else "-"))))
    body.append('<h2>Summary</h2><table id="summary"><tr>%s</tr>%s</table>'
                % ("".join("<th>%s</th>" % h for h in head), "".join(rows)))
    warnings = [(r, w) for r in results for w in r["warnings"]]
    if warnings:
        body.append("<ul>%s</ul>" % "".join('<li class="warn">%s on %s: %s</li>' % (escape(r["target"]),
                                                                                    escape(r["device"]), escape(w))
                                            for r, w in warnings))
    if doc.get("pairs"):
        body.append(pairs_table(doc["pairs"]))
    body.append("<h2>Latency distributions</h2>")
    by_target: Dict[str, List[Dict[str, Any]]] = {}
    for r in results:
        by_target.setdefault(r["target"], []).append(r)
    for target, rs in by_target.items():
        groups = [("%s (%s)" % (r["device"], r["run"].get("target") or "?"), _steady(r)) for r in rs]
        body.append(plot_block("distribution", distribution_plot(target, groups)))
    if doc.get("pool"):
        body.append("<h2>Across devices</h2>")
        for p in doc["pool"]:
            body.append("<h3>%s</h3>%s" % (escape(p["target"]), _kv_table(
                {"devices": ", ".join(p["devices"]), "median of medians": duration(p["median_of_medians"]),
                 "spread of medians": "%.1f%%" % (100 * p.get("spread_of_medians", 0)),
                 "within-device variance": "%.3g s^2" % p.get("within_var", 0),
                 "between-device variance": "%.3g s^2" % p.get("between_var", 0),
                 "between-device share": "%.0f%%" % (100 * p.get("between_share", 0))})))
    body.append("<h2>Samples over time</h2>")
    for r in results:
        body.append(plot_block("timeline", timeline_plot(r)))
        body.append("<details><summary>phases, memory and run fingerprint</summary>%s%s%s</details>"
                    % (_kv_table({k: duration(v) for k, v in r["phases"].items()}), _kv_table(r["memory"]),
                       _kv_table(r["run"])))
    profiled = [r for r in results if r.get("profile")]
    if profiled:
        body.append("<h2>Per-layer profile</h2>")
        for r in profiled:
            body.append(plot_block("profile", profile_plot(r)))
    body.append("<h2>Fingerprint</h2><h3>host</h3>" + _kv_table(doc["host"]))
    for d in doc.get("devices", []):
        body.append("<h3>device %s</h3>%s" % (escape(d["id"]), _kv_table(d.get("fingerprint", {}))))
    body.append("<h3>options</h3>" + _kv_table(doc.get("options", {})))
    return page("tether bench", body)


def render_compare(cmp: Dict[str, Any], base: Dict[str, Any], new: Dict[str, Any]) -> str:
    body = ["<h1>tether bench compare</h1>",
            "<p>base %s &middot; new %s &middot; U test at alpha %.3g, fail above %.1f%%</p>"
            % (escape(base.get("created")), escape(new.get("created")), cmp["alpha"], cmp["fail_above_pct"])]
    head = ("target", "device", "base median", "new median", "ratio", "95% CI", "p (U test)", "verdict")
    rows = []
    for r in cmp["rows"]:
        cells = ((paired_name(r), "l"), (r["device"], "l"), (duration(r["base_median"]), ""),
                 (duration(r["new_median"]), ""),
                 ("%.3f" % r["ratio"], ""), ("%.3f - %.3f" % tuple(r["ratio_ci95"]), ""), ("%.2g" % r["p_value"], ""),
                 (r["verdict"], r["verdict"]))
        rows.append("<tr>%s</tr>" % "".join('<td%s>%s</td>' % (' class="%s"' % c if c else "", escape(v))
                                            for v, c in cells))
    rows = "".join(rows)
    body.append('<table id="compare"><tr>%s</tr>%s</table>' % ("".join("<th>%s</th>" % h for h in head), rows))
    if cmp["notes"]:
        body.append("<ul>%s</ul>" % "".join('<li class="warn">%s</li>' % escape(n) for n in cmp["notes"]))
    if cmp["rows"]:
        body.append(plot_block("ratio", ratio_plot(cmp["rows"])))
    bres = {(r["target"], r["device"]): r for r in base["results"]}
    nres = {(r["target"], r["device"]): r for r in new["results"]}
    for row in cmp["rows"]:
        rb = bres.get((row["target"], row["base_device"]))
        rn = nres.get((row.get("new_target", row["target"]), row["device"]))
        if rb and rn:
            body.append(plot_block("distribution", distribution_plot(
                "%s on %s" % (paired_name(row), row["device"]), [("base", _steady(rb)), ("new", _steady(rn))])))
    return page("tether bench compare", body)


def write_report(doc: Dict[str, Any], path: str) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(render_report(doc))


def write_compare_report(cmp: Dict[str, Any], base: Dict[str, Any], new: Dict[str, Any], path: str) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(render_compare(cmp, base, new))
