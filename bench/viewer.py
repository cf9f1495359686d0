"""The loom viewer's server-side costs on a large loom.

What it measures
----------------
A JSONL loom of ``--turns`` turns (default 10,000) shaped like the viewer's
tests (one entity's long thread, a fork and a call_agent child), read
through :class:`~cantrip.protocols.viewer._api.LoomViews`:

* ``open`` -- ``Loom.open`` of the file (what ``cantrip loom FILE view`` does
  once, and again whenever the file has grown);
* each API read the page makes on opening an entity, **cold** (first call:
  builds the entity summaries or the flattened tree, O(loom)) and **warm**
  (cached until the loom grows: O(page));
* ``tree (turn=...)`` -- finding the page holding a turn deep in the thread.

Run: ``.venv/bin/python bench/viewer.py [--turns N]``. The browser-side
figures (time to the first painted rows, scroll to the end) are measured by
``tests/test_viewer_browser.py`` and written to
``test-artifacts/viewer/timings.json``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from viewer_looms import build

from cantrip.loom import Loom
from cantrip.protocols.viewer._api import LoomViews


def timed(read: Callable[[LoomViews], Any], views: LoomViews) -> float:
    began = time.perf_counter()
    read(views)
    return (time.perf_counter() - began) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=10_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "big.jsonl"
        build(path, turns=args.turns).close()
        size = path.stat().st_size
        began = time.perf_counter()
        loom = Loom.open(path)
        opened = (time.perf_counter() - began) * 1000
        print(f"loom: {len(loom)} turns, {size / 1e6:.1f} MB JSONL; open {opened:.0f} ms")
        deep = f"turn-a{args.turns // 2}"
        last = {"offset": [str(len(loom) - 200)]}
        reads: list[tuple[str, Callable[[LoomViews], Any]]] = [
            ("overview", lambda v: v.overview()),
            ("entities (first page)", lambda v: v.entities({})),
            ("tree (first page, 200 rows)", lambda v: v.tree("entity-a", {"limit": ["200"]})),
            ("tree (last page)", lambda v: v.tree("entity-a", last)),
            ("tree (turn=deep)", lambda v: v.tree("entity-a", {"turn": [deep]})),
            ("turn detail", lambda v: v.turn(deep)),
            ("thread (first 100 turns)", lambda v: v.thread(deep, {})),
        ]
        print(f"{'read':32} {'cold ms':>9} {'warm ms':>9}")
        for name, read in reads:
            views = LoomViews(lambda: loom)  # fresh caches: the first read is cold
            cold = timed(read, views)
            warm = min(timed(read, views) for _ in range(5))
            print(f"{name:32} {cold:9.1f} {warm:9.1f}")
        loom.close()


if __name__ == "__main__":
    main()
