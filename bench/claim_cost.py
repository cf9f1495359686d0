"""What one claim costs a worker beside many running casts: the statement before each
claim that accounts for the runs that ended without an outcome (it reaps the casts of
dead workers and dead-letters those past the attempt limit), then the claim itself.

What it measures
----------------
On a throwaway PostgreSQL cluster (``tests/pg_cluster.py``, fsync off), ``--queued``
casts are queued and ``--running`` of them claimed under live leases (another worker
runs them). Then ``--claims`` single claims (``WorkQueue.claim_many``, limit 1: a
worker with one free slot) are timed, each two statements, one round trip each.
Reported: p50 and p99 over each of ``--rounds`` fresh databases.

Figures (2 cores shared with other jobs; 200 running, 2,000 queued, 500 claims, 3
rounds; before = the dead-lettering statement of schema 4, after = the reaping
statement of schema 5, which also marks a dead worker's bystanders and suspects; run
one after the other)::

    before   p50 3.69 / 4.14 / 4.12 ms   p99 12.0 / 15.3 / 13.2 ms
    after    p50 5.82 / 3.46 / 3.74 ms   p99 13.3 /  8.2 / 10.5 ms
    again, load average 10:
    before   p50 2.66 / 2.94 ms          p99 8.6 / 9.3 ms
    after    p50 5.40 / 4.60 ms          p99 15.9 / 14.0 ms

The machine's load swings these by 2x; the server's own time for the two statements
(``EXPLAIN ANALYZE`` on the same database) does not move: 0.15 ms before, 0.14 ms
after for the statement before the claim; 0.41 and 0.36-0.42 ms for the claim.

How to run
----------
From the repository root::

    python bench/claim_cost.py
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from pg_cluster import fresh_database, postgres_cluster  # noqa: E402

from cantrip.distributed._queue import WorkQueue  # noqa: E402
from cantrip.loom._postgres import PostgresStore  # noqa: E402


def one_round(server: str, name: str, queued: int, running: int, claims: int) -> list[float]:
    """The milliseconds of each of ``claims`` claims on a fresh database."""
    store = PostgresStore(fresh_database(server, name), max_connections=2)
    try:
        queue = WorkQueue(store)
        for i in range(queued):
            queue.enqueue({"factory": "bench:none"}, f"job {i}", f"entity-{i}")
        queue.claim_many("running-worker", 600, running)
        times = []
        for _ in range(claims):
            started = time.perf_counter()
            queue.claim_many("claiming-worker", 600, 1)
            times.append((time.perf_counter() - started) * 1000)
        return sorted(times)
    finally:
        store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--queued", type=int, default=2000)
    parser.add_argument("--running", type=int, default=200)
    parser.add_argument("--claims", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if args.queued < args.running + args.claims:
        parser.error("--queued must hold the running casts and every claim")
    with postgres_cluster() as server:
        for round_ in range(args.rounds):
            times = one_round(server, f"claim_cost_{round_}", args.queued, args.running,
                              args.claims)  # fmt: skip
            p99 = times[min(len(times) - 1, int(len(times) * 0.99))]
            print(
                f"one claim beside {args.running} running, {args.queued} queued: "
                f"p50 {statistics.median(times):.2f} ms, p99 {p99:.2f} ms"
            )


if __name__ == "__main__":
    main()
