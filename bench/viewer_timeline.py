"""Time to first paint of a cast's timeline in the browser viewer.

What it measures
----------------
A loom holding one cast of ``--turns`` turns (default 1,000) with ``--children``
call_agent children (default 50), a pause, cut-offs and a fork
(``tests/timeline_looms.py``), written to an SQLite file (or to ``--db``, a
PostgreSQL URL), served by ``cantrip loom LOOM view`` and opened in headless
chromium (Debian's, as the tests drive it) at ``#/e/entity-root/timeline``:

* ``first paint`` -- the page's ``cantrip-timeline-painted`` mark (set on the frame
  after the first rows with bars were built), from the navigation's start, cold (a
  fresh server: the timeline's index is built on that request) and warm (the same
  server again, in a new page);
* ``api cold / warm`` -- the first page of ``/api/entities/entity-root/timeline`` read
  over HTTP by a fresh server, then again (cached until the loom grows);
* the size of that answer and the number of bars the page drew.

Run: ``.venv/bin/python bench/viewer_timeline.py [--turns N] [--children K] [--db URL]``.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import httpx
from playwright.sync_api import sync_playwright
from timeline_looms import build_cast

from cantrip.loom import Loom

CANTRIP = str(Path(sys.executable).with_name("cantrip"))
CHROMIUM = os.environ.get("CANTRIP_CHROMIUM", "/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run"]


@contextmanager
def viewer(loom: str) -> Iterator[str]:
    process = subprocess.Popen(
        [CANTRIP, "loom", loom, "view", "--port", "0"], stderr=subprocess.PIPE, text=True
    )
    try:
        assert process.stderr is not None
        line = process.stderr.readline()
        yield re.findall(r"http://\S+", line)[0].rstrip("/")
    finally:
        process.terminate()
        process.wait(timeout=15)


def paint(browser: Any, url: str) -> tuple[float, int]:
    page = browser.new_page(viewport={"width": 1400, "height": 800})
    page.goto(url + "/#/e/entity-root/timeline")
    mark = "performance.getEntriesByName('cantrip-timeline-painted').length"
    while not page.evaluate(mark):  # (wait_for_function evaluates a string: the CSP refuses)
        page.wait_for_timeout(5)
    painted = page.evaluate("performance.getEntriesByName('cantrip-timeline-painted')[0].startTime")
    bars = page.locator(".bar").count()
    page.close()
    return float(painted), bars


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=1000)
    parser.add_argument("--children", type=int, default=50)
    parser.add_argument("--db", help="a PostgreSQL URL (an empty database) instead of SQLite")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        target = args.db or str(Path(folder) / "cast.db")
        build_cast(Loom.open(target), turns=args.turns, children=args.children).close()
        reader = Loom.open(target)
        count = len(reader)
        reader.close()
        kind = "PostgreSQL" if args.db else "SQLite"
        print(f"loom: {kind}, {count} turns; cast: {args.turns} turns, {args.children} children")
        cold_api, warm_api, cold_paint, warm_paint = [], [], [], []
        size = bars = 0
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            for _ in range(args.runs):
                with viewer(target) as url:
                    path = "/api/entities/entity-root/timeline?width=1150"
                    began = time.perf_counter()
                    answer = httpx.get(url + path, timeout=60)
                    cold_api.append((time.perf_counter() - began) * 1000)
                    began = time.perf_counter()
                    httpx.get(url + path, timeout=60)
                    warm_api.append((time.perf_counter() - began) * 1000)
                    size = len(answer.content)
                with viewer(target) as url:
                    painted, bars = paint(browser, url)
                    cold_paint.append(painted)
                    warm_paint.append(paint(browser, url)[0])
            browser.close()
    print(f"first page of the timeline: {size / 1000:.0f} kB, {bars} bars drawn")
    for name, values in (
        ("api (cold: index built)", cold_api),
        ("api (warm)", warm_api),
        ("first paint (cold server)", cold_paint),
        ("first paint (warm server)", warm_paint),
    ):
        print(f"{name:28} median {statistics.median(values):7.1f} ms   min {min(values):7.1f} ms")


if __name__ == "__main__":
    main()
