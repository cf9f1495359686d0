"""Listing eval runs in the viewer on a big loom: what a first read of ``/api/evals`` costs.

What it measures
----------------
An SQLite loom holding two recorded eval runs (``run_suite(loom=...)`` over the
scripted greeter: ``--cases`` cases each, every case one 2-turn cast) plus one long
cast of ``--turns`` turns (default 10,000), read by a fresh :class:`LoomViews` (as a
freshly started ``loom view`` reads it):

* ``runs`` -- the first ``/api/evals`` read (the runs and their pass/fail counts);
* ``cases`` -- the first ``/api/evals/{run}?status=failed`` read;
* ``entities`` -- for scale, the first ``/api/entities`` read (which indexes every turn:
  the summaries it shows need them), the way the runs were listed before issue 45.3.

Run: ``.venv/bin/python bench/viewer_evals.py [--turns N] [--cases K]``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from test_evals import greeter

from cantrip.evals import Case, Expect, Suite, run_suite
from cantrip.loom import EntityRecord, Loom, Turn
from cantrip.protocols.viewer._api import LoomViews


def build(path: Path, workdir: Path, turns: int, cases: int) -> str:
    suite = Suite(
        [
            Case(
                name=f"case-{n}",
                intent=f"Greet person {n}.",
                expect=Expect(result_contains="greeted" if n % 3 else "waved"),
            )
            for n in range(cases)
        ]
    )
    spec = greeter(workdir)

    async def runs() -> str:
        loom = Loom.open(path)
        try:
            first = await run_suite(suite, spec=spec, loom=loom)
            await run_suite(suite, spec=spec, loom=loom)
        finally:
            loom.close()
        return first.run_id

    run_id = trio.run(runs)
    loom = Loom.open(path)
    loom.register_entity(EntityRecord("entity-long", "spell"))
    parent = None
    for n in range(turns):
        parent = loom.append(Turn(f"long-{n}", parent, "entity-long", n + 1, utterance=".")).id
    loom.close()
    return run_id


def timed(read: Callable[[], object]) -> float:
    started = time.perf_counter()
    read()
    return (time.perf_counter() - started) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=10_000)
    parser.add_argument("--cases", type=int, default=50)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "evals.db"
        run_id = build(path, Path(tmp), args.turns, args.cases)
        for name, read in (
            ("runs", lambda views: views.evals({})),
            ("cases", lambda views: views.eval_run(run_id, {"status": ["failed"]})),
            ("entities", lambda views: views.entities({})),
        ):
            loom = Loom.open(path)
            views = LoomViews(lambda loom=loom: loom)
            took = timed(lambda views=views, read=read: read(views))
            print(f"{name:>9}: {took:8.1f} ms  (loom of {len(loom)} turns)")
            loom.close()


if __name__ == "__main__":
    main()
