"""What a human's answer costs on the workers: pause, answer, continue -- on PostgreSQL.

What it measures
----------------
``N`` casts of ``tests/pause_workload.py`` (turn 1 calls ``pay``, which needs
approval; turn 2 calls ``done``) are run one after another through a
``Dispatcher`` and one in-process :class:`~cantrip.distributed._worker.Worker`:

* **to paused** -- from ``submit`` until ``wait`` returns ``paused`` (the
  work queued, claimed, one LLM turn, the pause checkpoint synced, the work
  finished ``paused`` and the lease released);
* **answer to done** -- from ``Dispatcher.answer`` until ``wait`` returns
  ``done`` (the answer recorded and queued, claimed, the entity resumed from
  the loom, the answer mark synced, the gate run through the journal, one
  more LLM turn, the work finished);

beside the **baseline**: the same two-turn cast with nothing to approve, from
``submit`` to ``done``. p50 and p99 of each, in milliseconds.

The PostgreSQL server is a throwaway cluster started by the script (as the
tests do: ``tests/pg_cluster.py``), fsync off.

How to run
----------
From the repository root::

    python bench/pause_answer.py          # N = 100
    python bench/pause_answer.py -n 20    # quicker
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import psycopg  # noqa: E402
import trio  # noqa: E402
from pause_workload import EFFECTS_TABLE  # noqa: E402
from pg_cluster import fresh_database, postgres_cluster  # noqa: E402

from cantrip._approval import Decision  # noqa: E402
from cantrip.distributed._dispatcher import Dispatcher  # noqa: E402
from cantrip.distributed._spells import spell_from_factory  # noqa: E402
from cantrip.distributed._worker import Worker  # noqa: E402


def _ms(values: list[float]) -> str:
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return f"p50 {statistics.median(ordered) * 1000:7.1f} ms   p99 {p99 * 1000:7.1f} ms"


async def measure(url: str, n: int) -> None:
    dispatcher = await trio.to_thread.run_sync(Dispatcher, url)
    pausing = spell_from_factory("pause_workload:build")
    plain = spell_from_factory("pause_workload:build_unguarded")
    paused_s: list[float] = []
    answered_s: list[float] = []
    baseline_s: list[float] = []

    def one_pause(index: int) -> None:
        started = time.perf_counter()
        work, entity = dispatcher.submit(pausing, f"job-{index}")
        state, outcome = dispatcher.wait(work, timeout=60)
        assert state == "paused", outcome
        paused_s.append(time.perf_counter() - started)
        started = time.perf_counter()
        again = dispatcher.answer(entity, outcome["pending"][0]["pause_id"], Decision.approve())
        state, outcome = dispatcher.wait(again, timeout=60)
        assert state == "done", outcome
        answered_s.append(time.perf_counter() - started)

    def one_plain(index: int) -> None:
        started = time.perf_counter()
        work, _ = dispatcher.submit(plain, f"plain-{index}")
        state, outcome = dispatcher.wait(work, timeout=60)
        assert state == "done", outcome
        baseline_s.append(time.perf_counter() - started)

    async with trio.open_nursery() as nursery:
        await nursery.start(Worker(url, concurrency=4).run)
        for index in range(n):
            await trio.to_thread.run_sync(one_plain, index)
            await trio.to_thread.run_sync(one_pause, index)
        nursery.cancel_scope.cancel()
    dispatcher.close()
    print(f"casts: {n} of each, one after another, one in-process worker")
    print(f"baseline (no approval), submit -> done : {_ms(baseline_s)}")
    print(f"pausing cast, submit -> paused         : {_ms(paused_s)}")
    print(f"answer -> continued cast done          : {_ms(answered_s)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-n", type=int, default=100, help="casts of each kind (100)")
    args = parser.parse_args()
    with postgres_cluster() as server:
        url = fresh_database(server, "bench_pause")
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(EFFECTS_TABLE)
        os.environ["CANTRIP_TEST_DB"] = url
        trio.run(measure, url, args.n)


if __name__ == "__main__":
    main()
