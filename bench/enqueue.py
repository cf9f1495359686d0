"""Queueing casts for the workers: one at a time against one batch (issue 46.1).

``Dispatcher.submit`` in a loop pays a round trip and a commit per cast;
``Dispatcher.submit_many`` queues the lot in one statement and one commit. Both are
timed from one client thread for ``--casts`` new entities on a throwaway PostgreSQL
cluster started by the script with the durable defaults (fsync, synchronous commit
and full-page writes on: the commit is what a queued cast costs), no worker running.

    python bench/enqueue.py [--casts 1000] [--repeats 3]

Prints the best of ``--repeats`` for each, in seconds, and the commits each made
(``pg_stat_database.xact_commit``).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from pg_cluster import fresh_database, postgres_cluster

from cantrip.distributed._dispatcher import Dispatcher
from cantrip.distributed._spells import spell_from_factory
from cantrip.loom import Loom

SPELL = spell_from_factory("distributed_workload:build")
DURABLE = "-c fsync=on -c synchronous_commit=on -c full_page_writes=on"


def _commits(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
    assert row is not None
    return int(row[0])


def timed(url: str, casts: int, batch: bool) -> tuple[float, int]:
    dispatcher = Dispatcher(url)
    intents = [f"job-{n}" for n in range(casts)]
    before = _commits(url)
    started = time.perf_counter()
    if batch:
        dispatcher.submit_many(SPELL, intents)
    else:
        for intent in intents:
            dispatcher.submit(SPELL, intent)
    elapsed = time.perf_counter() - started
    dispatcher.close()
    return elapsed, _commits(url) - before - 1  # the stats query's own


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--casts", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with postgres_cluster(DURABLE) as server:
        for label, batch in (("submit in a loop", False), ("submit_many", True)):
            runs = []
            for n in range(args.repeats):
                url = fresh_database(server, f"q_{int(batch)}_{n}")
                Loom.open(url).close()  # the schema, outside the timing
                runs.append(timed(url, args.casts, batch))
            seconds, commits = min(runs)
            print(f"{args.casts} casts queued, {label}: {seconds:.3f} s, ~{commits} commits")


if __name__ == "__main__":
    main()
