#!/usr/bin/env python3
"""Renders a PromQL expression's graph in a real browser and checks that its curves were drawn.

Grafana is neither in Debian nor on PyPI, so the dashboard's panels cannot be rendered by
Grafana here; what can be rendered is the same expression through Prometheus' own graph page
(the classic UI Debian's prometheus package ships: Rickshaw drawing SVG), in headless Chromium
(Debian's chromium-headless-shell). The page is loaded twice: once for its DOM after the
scripts ran, whose graph must hold one SVG path per series with at least `--points` points,
and once for a screenshot (OUT.png), which Pillow must open.

usage: render_prometheus_graph.py PROMETHEUS_URL EXPR OUT.png [--range 5m] [--series N] [--points N]

Prints "rendered: ..." and exits 0; 1 when the curves are not there; 77 (skipped) when Chromium
or Pillow is missing. Used by tests/server/metrics_integration_test.cc.
"""
import argparse
import re
import shutil
import subprocess
import sys
import urllib.parse

BROWSERS = ["chromium-headless-shell", "chromium", "chromium-browser"]


def chromium(browser, page, *what):
    cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--window-size=1200,900",
           "--virtual-time-budget=15000", *what, page]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("expr")
    ap.add_argument("out")
    ap.add_argument("--range", default="5m")
    ap.add_argument("--series", type=int, default=1, help="curves expected")
    ap.add_argument("--points", type=int, default=2, help="points each curve must have at least")
    a = ap.parse_args()
    try:
        from PIL import Image
    except ImportError as e:
        print(f"render: skipped: {e}")
        return 77
    browser = next((shutil.which(b) for b in BROWSERS if shutil.which(b)), None)
    if browser is None:
        print("render: skipped: no headless Chromium (apt-get install chromium-headless-shell)")
        return 77
    page = a.url.rstrip("/") + "/classic/graph?" + urllib.parse.urlencode(
        {"g0.expr": a.expr, "g0.tab": "0", "g0.range_input": a.range})
    dom = chromium(browser, page, "--dump-dom")
    shot = chromium(browser, page, f"--screenshot={a.out}")
    for p in (dom, shot):
        if p.returncode != 0:
            print(f"render: {browser} exited {p.returncode}: {p.stderr[-2000:]}")
            return 1
    # Rickshaw draws each series as <path class="path" d="M x,y L x,y ...">.
    curves = [d.count("L") + 1 for d in re.findall(r'<path class="path" d="(M[^"]*)"', dom.stdout)]
    image = Image.open(a.out)
    print(f"render: {page}: {len(curves)} curve(s) of {curves} points; screenshot {a.out} "
          f"{image.size[0]}x{image.size[1]}")
    ok = len(curves) == a.series and all(n >= a.points for n in curves)
    if not ok and "No datapoints found" in dom.stdout:
        print("render: Prometheus' page says: No datapoints found.")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
