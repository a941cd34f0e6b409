"""The pieces of a self-contained HTML report page, shared by `tether bench --html` and `tether tune --report`.

The page has no script and loads nothing (no CDN, no fonts, no images by URL), so it works offline, from a
CI artifact or an e-mail. Plots use matplotlib's object API (``Figure``) rather than pyplot, so writing a report
neither picks nor changes the caller's matplotlib backend, and nothing global is left behind.
"""
from __future__ import annotations

import html
import io
from typing import Any, List, Optional, Sequence, Tuple

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#1d2330;max-width:1200px}
h1{font-size:22px} h2{font-size:18px;margin-top:32px;border-bottom:1px solid #dde} h3{font-size:15px}
table{border-collapse:collapse;font-size:13px;margin:8px 0}
td,th{border:1px solid #dde;padding:3px 8px;text-align:right} th{background:#f3f4f8}
td.l,th.l{text-align:left} .warn{color:#a15c00} .slower{color:#b00020;font-weight:bold}
.faster{color:#1b7a2e;font-weight:bold} .plot svg{max-width:100%;height:auto}
details{margin:6px 0} pre{font-size:12px;background:#f6f7fa;padding:8px;overflow:auto}
"""


def svg(fig: Any) -> str:
    """A matplotlib figure as an inline ``<svg>`` element (the XML prolog dropped)."""
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    text = buf.getvalue()
    start = text.find("<svg")
    return text[start:] if start >= 0 else text


def figure(width: float = 8.0, height: float = 3.2) -> Any:
    """A new matplotlib ``Figure`` of ``width`` x ``height`` inches (no pyplot, no backend chosen)."""
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=100)


def svg_style() -> Any:
    """The matplotlib settings to draw a report's figures under (a context manager)."""
    import matplotlib

    # text stays text in the SVG (smaller, searchable); the hash salt keeps ids stable between runs
    return matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "tether-bench", "font.size": 9})


def time_unit(values: Sequence[float]) -> Tuple[str, float]:
    """``(name, seconds per unit)`` of the largest unit (s, ms, us, ns) the largest of ``values`` reaches."""
    top = max(values) if len(values) else 1.0
    for name, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if top >= scale:
            return name, scale
    return "ns", 1e-9


def escape(x: Any) -> str:
    """``str(x)`` escaped for HTML text and attribute values."""
    return html.escape(str(x))


def duration(seconds: Optional[float]) -> str:
    """A duration with four significant digits in its own unit (``"1.234 ms"``), or ``"-"`` for None."""
    if seconds is None:
        return "-"
    name, scale = time_unit([seconds])
    return "%.4g %s" % (seconds / scale, name)


def plot_block(kind: str, svg_text: str) -> str:
    """An inline SVG plot wrapped in a ``<figure>`` marked with its kind (``data-plot``)."""
    return '<figure class="plot" data-plot="%s">%s</figure>' % (kind, svg_text)


def page(title: str, body: List[str]) -> str:
    """The whole HTML document: ``body``'s fragments under ``title``, with the style sheet inlined."""
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>%s</title>"
            "<style>%s</style></head><body>%s</body></html>\n" % (escape(title), CSS, "\n".join(body)))
