"""Distributed throughput on PostgreSQL, claim latency, and opening a big loom.

What it measures
----------------
**Workers.** ``E`` entities x 10 turns (the workload of the chaos test,
``tests/distributed_workload.py``: a stateless LLM that calls an effectful
gate -- one INSERT into PostgreSQL -- on every turn but the last) are queued at
once, then 1, 2 and 4 ``cantrip worker`` processes on one PostgreSQL run them;
timed from the first enqueue to the last work item done. With 50 ms scripted
LLM latency and with none. Every write (turn; journal entries: the utterance,
each gate call started and its result) is one fenced statement, and a worker
group-commits the writes of its concurrent entities (``Loom.sync``; where the
time goes: ``bench/pg_turn_cost.py``).

**Claim latency.** With idle workers, single casts are enqueued one at a time;
the time from enqueue to claim (both stamped by PostgreSQL's clock) is the
NOTIFY wake-up plus the ``SKIP LOCKED`` claim; p50 and p99.

**SQLite comparison.** The same workload in one process on an SQLite loom
(the single-process default), all entities concurrently.

**Opening a big loom.** A loom of ``--open-turns`` turns (default 1,000,000:
1,000 entities x 1,000 turns) is written straight into SQLite and PostgreSQL,
then ``Loom.open`` + ``thread(leaf)`` of one entity's deepest turn is timed
(cold: a fresh process-level ``Loom``). The loom is read by query, never
loaded: the target is < 100 ms on either store.

The PostgreSQL server is a throwaway cluster started by the script (as the
tests do: ``tests/pg_cluster.py``), fsync off -- what is measured is cantrip's
cost per commit, not the disk's.

Figures
-------
Full size (200 entities), 2 shared and busy cores, run back to back on the same
machine; before = separate fence-check/write/BEGIN/COMMIT statements and a commit
per journal entry, after = one fenced statement per write and the worker's group
commit (``Loom.sync``)::

                                        before        after
    1 / 2 / 4 workers, 50 ms latency    382/341/328   647/718/644 turns/s
    1 / 2 / 4 workers, 0 ms latency     390/352/327   753/730/621 turns/s
    SQLite, one process, 50 / 0 ms      1,384/2,055   1,720/2,124 turns/s (unchanged code)
    claim latency p50 / p99             2.0/8.8 ms    1.0/5.7 ms
    open 1M-turn loom + 1000-turn thread              SQLite 14.4 ms, PostgreSQL 24.0 ms

Batched claims (a worker claims up to its free slots in one statement instead of one
item per round trip), 200 entities, ``--open-turns 1000``, before and after run back
to back on the same busy 2 cores::

                                        one claim/item   batched
    1 / 2 / 4 workers, 50 ms latency    663/795/539      672/840/732 turns/s
    1 / 2 / 4 workers, 0 ms latency     739/664/572      729/981/800 turns/s
    claim latency p50 / p99 (idle)      1.1/4.7, 1.0/4.1 1.2/4.5, 1.1/4.1 ms (300 samples, twice)

One worker is CPU-bound here either way; several workers gain because a worker no longer
spends the start of a run claiming item after item while the others wait on the same
rows. Idle claim latency (one cast at a time) is the same statement's cost: unchanged.

On 2 cores one worker already uses them (about 1.3 ms of worker CPU and 0.6 ms
of PostgreSQL CPU per turn, ``bench/pg_turn_cost.py``), so more worker
processes add contention, not throughput; they scale with cores and machines.

How to run
----------
From the repository root::

    python bench/distributed.py                   # everything
    python bench/distributed.py --entities 100 --open-turns 100000   # quicker
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import psycopg  # noqa: E402
from distributed_workload import EFFECTS_TABLE, build  # noqa: E402
from pg_cluster import fresh_database, postgres_cluster  # noqa: E402

from cantrip.distributed._dispatcher import Dispatcher  # noqa: E402
from cantrip.distributed._spells import spell_from_factory  # noqa: E402
from cantrip.loom import Loom, Turn  # noqa: E402
from cantrip.loom._stores import _json  # noqa: E402

SPELL = spell_from_factory("distributed_workload:build")


def _workers(url: str, n: int, latency_ms: int) -> list[subprocess.Popen[bytes]]:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT / "tests"),
        "CANTRIP_TEST_DB": url,
        "WORKLOAD_LATENCY_MS": str(latency_ms),
    }
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "cantrip", "worker", "--db", url, "--concurrency", "100"],
            env=env,
            stderr=subprocess.PIPE,
        )
        for _ in range(n)
    ]
    for proc in procs:  # wait until each says it is ready
        assert proc.stderr is not None
        proc.stderr.readline()
    return procs


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        proc.terminate()
    for proc in procs:
        proc.wait()


def _prepare(server: str, name: str) -> str:
    url = fresh_database(server, name)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(EFFECTS_TABLE)
    Loom.open(url).close()  # the schema, before the workers race for it
    return url


def throughput(server: str, workers: int, latency_ms: int, entities: int) -> float:
    url = _prepare(server, f"tp_{workers}_{latency_ms}")
    procs = _workers(url, workers, latency_ms)
    dispatcher = Dispatcher(url)
    try:
        started = time.perf_counter()
        items = [dispatcher.submit(SPELL, f"job-{i}")[0] for i in range(entities)]
        for work_id in items:
            state, _ = dispatcher.wait(work_id, timeout=600)
            assert state == "done", state
        elapsed = time.perf_counter() - started
    finally:
        dispatcher.close()
        _stop(procs)
    with psycopg.connect(url) as conn:
        turns = conn.execute("SELECT count(*) FROM cantrip_turns").fetchone()[0]  # type: ignore[index]
    return float(turns) / elapsed


def claim_latency(server: str, samples: int) -> tuple[float, float]:
    url = _prepare(server, "claims")
    procs = _workers(url, 2, 0)
    dispatcher = Dispatcher(url)
    try:
        for i in range(samples):
            work_id, _ = dispatcher.submit(SPELL, f"claim-{i}")
            dispatcher.wait(work_id, timeout=60)
    finally:
        dispatcher.close()
        _stop(procs)
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT extract(epoch FROM claimed_at - enqueued_at) FROM cantrip_work"
        ).fetchall()
    waits = sorted(float(r[0]) * 1000.0 for r in rows)
    return statistics.median(waits), waits[min(len(waits) - 1, int(len(waits) * 0.99))]


def sqlite_throughput(entities: int, latency_ms: int, effects_url: str) -> float:
    os.environ["CANTRIP_TEST_DB"] = effects_url
    os.environ["WORKLOAD_LATENCY_MS"] = str(latency_ms)
    with tempfile.TemporaryDirectory() as folder:
        spell = build().with_(loom=Loom.open(Path(folder) / "loom.db"))

        async def run() -> None:
            async with trio.open_nursery() as nursery:
                for i in range(entities):
                    nursery.start_soon(spell.cast_async, f"job-{i}")

        started = time.perf_counter()
        trio.run(run)
        elapsed = time.perf_counter() - started
        turns = len(spell.loom)
        spell.loom.close()
    return turns / elapsed


def _big_rows(entities: int, per_entity: int):  # type: ignore[no-untyped-def]
    for e in range(entities):
        parent = None
        for s in range(1, per_entity + 1):
            turn = Turn(
                id=f"turn-{e:06d}-{s:06d}",
                parent_id=parent,
                entity_id=f"entity-{e:06d}",
                sequence=s,
                utterance="u" * 200,
                observation="o" * 300,
            )
            yield turn.id, parent, turn.entity_id, s, _json(turn.to_dict())
            parent = turn.id


def open_big(server: str, turns: int) -> dict[str, float]:
    entities = 1000
    per_entity = max(1, turns // entities)
    leaf = f"turn-{entities // 2:06d}-{per_entity:06d}"
    figures: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "big.db"
        Loom.open(path).close()  # the schema
        db = sqlite3.connect(path)
        db.executemany(
            "INSERT INTO entities (entity_id, data) VALUES (?, ?)",
            (
                (f"entity-{e:06d}", f'{{"entity_id": "entity-{e:06d}", "cantrip_id": "c"}}')
                for e in range(entities)
            ),
        )
        db.executemany(
            "INSERT INTO turns (id, parent_id, entity_id, sequence, data) VALUES (?,?,?,?,?)",
            _big_rows(entities, per_entity),
        )
        db.commit()
        db.close()
        started = time.perf_counter()
        loom = Loom.open(path)
        thread = loom.thread(leaf)
        figures["sqlite"] = (time.perf_counter() - started) * 1000.0
        assert len(thread) == per_entity
        loom.close()
    url = fresh_database(server, "big")
    Loom.open(url).close()
    with psycopg.connect(url) as conn:
        with conn.cursor().copy("COPY cantrip_entities (entity_id, data) FROM STDIN") as copy:
            for e in range(entities):
                copy.write_row(
                    (f"entity-{e:06d}", f'{{"entity_id": "entity-{e:06d}", "cantrip_id": "c"}}')
                )
        with conn.cursor().copy(
            "COPY cantrip_turns (id, parent_id, entity_id, sequence, data) FROM STDIN"
        ) as copy:
            for row in _big_rows(entities, per_entity):
                copy.write_row(row)
        conn.commit()
        conn.execute("ANALYZE")
    started = time.perf_counter()
    loom = Loom.open(url)
    thread = loom.thread(leaf)
    figures["postgres"] = (time.perf_counter() - started) * 1000.0
    assert len(thread) == per_entity
    started = time.perf_counter()
    again = loom.thread(f"turn-{entities // 3:06d}-{per_entity:06d}")
    figures["postgres_warm_pool"] = (time.perf_counter() - started) * 1000.0
    assert len(again) == per_entity
    loom.close()
    figures["turns"] = entities * per_entity
    figures["depth"] = per_entity
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--entities", type=int, default=200)
    parser.add_argument("--workers", type=int, nargs="*", default=[1, 2, 4])
    parser.add_argument("--latencies", type=int, nargs="*", default=[50, 0])
    parser.add_argument("--claims", type=int, default=100)
    parser.add_argument("--open-turns", type=int, default=1_000_000)
    args = parser.parse_args()
    print(f"machine: {os.cpu_count()} cores; PostgreSQL cluster started by the script")
    with postgres_cluster() as server:
        if args.open_turns:
            big = open_big(server, args.open_turns)
            print(
                f"open a {big['turns']:,.0f}-turn loom + read one {big['depth']:.0f}-turn thread: "
                f"SQLite {big['sqlite']:.1f} ms, PostgreSQL {big['postgres']:.1f} ms "
                f"(a second thread on the open loom: {big['postgres_warm_pool']:.1f} ms)"
            )
        p50, p99 = claim_latency(server, args.claims)
        print(
            f"claim latency (enqueue -> claimed, idle workers): p50 {p50:.1f} ms, p99 {p99:.1f} ms"
        )
        for latency in args.latencies:
            effects = _prepare(server, f"sqlite_{latency}")
            rate = sqlite_throughput(args.entities, latency, effects)
            print(
                f"latency {latency:>2} ms, {args.entities} entities x 10 turns: "
                f"SQLite single process {rate:,.0f} turns/s"
            )
            for n in args.workers:
                rate = throughput(server, n, latency, args.entities)
                print(
                    f"latency {latency:>2} ms, {args.entities} entities x 10 turns: "
                    f"{n} worker process(es) on PostgreSQL {rate:,.0f} turns/s"
                )


if __name__ == "__main__":
    main()
