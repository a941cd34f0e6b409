"""`tether bench --html` and `tether bench compare --html`: one self-contained page, opened in headless Chromium.

Checks: the page loads offline with no console errors, its plots are in the rendered DOM (inline SVG drawn by
matplotlib, one per plot kind), it references nothing outside itself, and a screenshot is not blank."""
import json
import os
import re
import subprocess

import pytest
from click.testing import CliRunner
from fixtures.chromium import chromium

from tether.cli.main import cli

DIGITS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "digits_cnn.onnx")
CHROMIUM_TIMEOUT = 120


def open_in_chromium(page, tmp_path):
    """(rendered DOM, console/error log lines, screenshot path) from headless Chromium."""
    exe = chromium()
    profile = tmp_path / "chromium-profile"
    base = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--user-data-dir=%s" % profile,
            "--virtual-time-budget=3000", "--enable-logging=stderr", "--v=0"]
    url = page.resolve().as_uri()
    dom = subprocess.run(base + ["--dump-dom", url], capture_output=True, text=True, timeout=CHROMIUM_TIMEOUT)
    assert dom.returncode == 0, dom.stderr[-3000:]
    shot = tmp_path / (page.stem + ".png")
    res = subprocess.run(base + ["--screenshot=%s" % shot, "--window-size=1280,1600", url], capture_output=True,
                         text=True, timeout=CHROMIUM_TIMEOUT)
    assert res.returncode == 0 and shot.exists(), res.stderr[-3000:]
    console = [line for line in (dom.stderr + res.stderr).splitlines() if "CONSOLE" in line or
               "Uncaught" in line or "Failed to load resource" in line]
    return dom.stdout, console, shot


def assert_not_blank(shot):
    from PIL import Image

    img = Image.open(shot).convert("RGB")
    colors = img.getcolors(maxcolors=1 << 20)
    assert colors is not None and len(colors) > 50, "the screenshot is (nearly) one colour"
    white = max(count for count, c in colors if c == (255, 255, 255)) if any(
        c == (255, 255, 255) for _, c in colors) else 0
    assert white < 0.97 * img.width * img.height, "the screenshot is blank"


def assert_self_contained(text):
    assert "<script" not in text.lower(), "no scripts: nothing to fail offline"
    # xmlns/DTD URIs are names, not loads; anything else with a URL would be fetched
    urls = set(re.findall(r'(?:src|href)\s*=\s*["\'](?!#)([^"\']+)', text))
    assert not urls, "the report references outside resources: %s" % sorted(urls)[:5]
    assert "@import" not in text and not re.search(r"url\((?!#)", text), "only in-page url(#id) references"


@pytest.fixture(scope="module")
def bench_json(rpc_server, rpc_kernels, tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    paths = {}
    for name in ("base", "new"):
        paths[name] = out / (name + ".json")
        res = CliRunner().invoke(cli, ["bench", "%s:vadd" % rpc_kernels["vadd"], DIGITS, "--input-shape",
                                       "input:4,1,8,8", "--host", rpc_server.host, "--port", str(rpc_server.port),
                                       "--profile", "--samples", "8", "--min-sample-ms", "1", "-q",
                                       "--json", str(paths[name])] +
                                 (["--html", str(out / "report.html")] if name == "base" else []))
        assert res.exit_code == 0, res.output
    paths["html"] = out / "report.html"
    return paths


def test_html_report_renders_in_headless_chromium(bench_json, tmp_path):
    page = bench_json["html"]
    text = page.read_text()
    assert_self_contained(text)
    dom, console, shot = open_in_chromium(page, tmp_path)
    assert not console, "console output: %s" % console
    kinds = re.findall(r'<figure class="plot" data-plot="(\w+)">\s*<svg', dom)
    doc = json.loads(bench_json["base"].read_text())
    assert kinds.count("distribution") == len({r["target"] for r in doc["results"]})
    assert kinds.count("timeline") == len(doc["results"])
    assert kinds.count("profile") == 1, "the ONNX model was profiled"
    assert dom.count("<path") > 50, "the SVGs hold drawn paths"
    for r in doc["results"]:
        assert r["target"] in dom
    assert "Fingerprint" in dom and doc["devices"][0]["fingerprint"]["id"] in dom
    assert_not_blank(shot)


def test_compare_html_report_renders(bench_json, tmp_path):
    page = tmp_path / "compare.html"
    res = CliRunner().invoke(cli, ["bench", "compare", str(bench_json["base"]), str(bench_json["new"]),
                                   "--fail-above", "1000", "--html", str(page)])
    assert res.exit_code == 0, res.output
    assert_self_contained(page.read_text())
    dom, console, shot = open_in_chromium(page, tmp_path)
    assert not console, "console output: %s" % console
    kinds = re.findall(r'<figure class="plot" data-plot="(\w+)">\s*<svg', dom)
    assert kinds.count("ratio") == 1 and kinds.count("distribution") == 2
    assert 'id="compare"' in dom and ("same" in dom or "slower" in dom or "faster" in dom)
    assert_not_blank(shot)


def test_the_console_check_sees_errors(tmp_path):
    """The harness itself: a page that logs and throws is caught, so "no console output" above means something."""
    page = tmp_path / "bad.html"
    page.write_text('<html><body><p>x</p><script>console.error("boom"); undefined_fn();</script></body></html>')
    _, console, _ = open_in_chromium(page, tmp_path)
    assert any("boom" in line for line in console) and any("Uncaught" in line for line in console)
