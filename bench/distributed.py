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

**The cost table** (``--table``, issue 46). ``A`` agents x 5 turns (the same workload,
``WORKLOAD_TURNS=5``) at 0 and 50 ms model latency on 1 and 2 ``cantrip worker``
processes, on a cluster with PostgreSQL's *default durable settings* (fsync,
synchronous commit and full-page writes on; ``pg_stat_statements`` loaded). Per row:
wall time from the first enqueue to the last cast done, turns/s, the workers' CPU and
the PostgreSQL server's CPU per turn (``/proc``: the postmaster, its live children and
those it reaped), statements (``pg_stat_statements``: every call but this script's own
polling, top-level only: not those a function runs), transactions
(``pg_stat_database.xact_commit``, less the polling's) and WAL
bytes (``pg_current_wal_lsn`` before the enqueue and after the last cast) per turn, and
the enqueue (``Dispatcher.submit_many``: one statement). ``--wal-detail`` adds where the
WAL went (``pg_walinspect``: bytes per turn by record type and by relation).
**Takeover after a SIGKILL**: at 50 ms latency, once 40 % of the turns are in, worker 0
(started as ``--worker-id bench-w0``) is killed with SIGKILL and started again under the
same identity at once; the time from the kill to the moment every cast it held runs
again (each one's ``claimed_at`` past the kill, PostgreSQL's clock).

Issue 46 items 2 and 4, the table on main before (2f04137) and after (this branch: the
journal writes each piece once, fences lock no row, one mail poll per worker, turn ids
without ``os.urandom``, the first mail read in the refresh hop), each the whole matrix on
the same 2 shared cores. The cores were busy with other work (load 5-20): wall and CPU
figures move by +-30 % from run to run; WAL, statements and transactions do not::

    before (main):
    agents ms wk   wall s  turns/s  wkr us  pg us  stmts  xacts  WAL B
       200  0  1     5.45      184    1690    880   3.42   2.64   3928
       200  0  2     4.59      218    2440   1440   4.18   3.09   3904
       200 50  1     6.08      164    2160   1230   3.89   2.86   3936
       200 50  2     3.73      268    2120   1050   3.35   2.82   3860
      1000  0  1    21.26      235    1924   1084   3.80   2.98   4109
      1000  0  2    15.98      313    2218   1042   4.08   3.43   4204
      1000 50  1    51.20       98    2624   1476   5.19   4.45   3814
      1000 50  2    30.59      163    2426   1148   5.12   4.82   3816

    after:
    agents ms wk   wall s  turns/s  wkr us  pg us  stmts  xacts  WAL B
       200  0  1     5.02      199    2200   1400   3.28   2.46   3230
       200  0  2     4.13      242    2350   1450   3.10   2.66   3188
       200 50  1     5.19      193    2040   1190   2.98   2.35   3231
       200 50  2     3.38      296    1860   1090   3.58   2.91   3172
      1000  0  1    23.85      210    1754   1148   3.37   2.35   3394
      1000  0  2    17.14      292    1906   1054   2.93   2.46   3459
      1000 50  1    27.01      185    2134   1278   3.17   2.31   3506
      1000 50  2    12.96      386    1874   1132   3.24   2.61   3378
    enqueue (submit_many): 0.011-0.073 s before, 0.016-0.067 s after
    takeover after SIGKILL (worker 0 restarted under its id; 50 ms): 7.6 / 8.5 / 9.2 / 2.9 s
      before -> 2.0 / 1.9 / 1.3 / 2.7 s after (200 x 1, 200 x 2, 1000 x 1, 1000 x 2)

Leases renewed without row locks (issue 46.2, third pass; ``--table --wal-detail
--agents 200 1000 --latencies 0 --workers 1 --no-kill``, main then branch, load ~18-30):
``Heap LOCK cantrip_leases`` 0.80 -> 0.52 records, 43 -> 28 B per turn at 200 agents and
1.59 -> 0.62 records, 86 -> 33 B at 1,000 (what is left: the claim's upsert, which locks
the lease row it updates); WAL per turn 3,303 -> 3,319 B (200; the branch's run was
slower: more beats, each a lease update) and 3,442 -> 3,377 B (1,000); statements per
turn 3.42 -> 3.16 and 3.48 -> 3.24. A heartbeat's renewals scale with wall time, not
turns: compare these per-turn figures at similar walls only.

The worker's CPU, measured back to back on main and on this branch (``WORKLOAD_TURNS=5
bench/pg_turn_cost.py --entities 1000 --concurrency 1000``: one worker, 0 ms, fsync off,
load 5-7): 1,913 -> 1,094 us per turn (DB threads 849 -> 514, trio thread 1,064 -> 580),
PostgreSQL 716 -> 564 us, round trips 2.86 -> 2.09 and transactions 2.99 -> 2.05 per
turn, 411 -> 699 turns/s; the per-cast steering polls (0.98 hops a turn) are gone.

Where the WAL went before the stored form (``--wal-detail``, 200 x 0 ms x 1, per turn):
the turn row ~1,070 B and its five index entries ~430 B, the journal's utterance and
call-start rows ~430 B plus ~230 B of index and speculative-insert records, the cast's
own rows (work, lease, entity; ~450 B over 5 turns), the workload's effect row ~115 B,
commits ~60 B. At 1,000 agents the heartbeat adds ~70 B (``FOR UPDATE SKIP LOCKED`` of
each lease every beat).

Issue 46.2/46.3, the stored form (a turn row holds each piece once), one journal row for
the answer and its first call's start, and plain INSERTs for new rows (no
``HEAP_CONFIRM``), 0 ms, WAL per turn before (main) -> after: 200 x 1 3,174 -> 2,324;
200 x 2 3,188 -> 2,244; 1,000 x 1 3,394 -> 2,683; 1,000 x 2 3,459 -> 2,781 (the after runs
at load 20-30: their slowness adds lease heartbeats, ~150-500 B a turn; 200 x 1 and
200 x 2 again at load 10: 2,245 and 2,197). Per turn now:
the turn row ~520 B and its indexes ~430 B, the journal row ~215 B and its index ~75 B,
the work row's updates ~150 B, the effect row ~115 B, the entity row ~77 B.

Issue 46.4's fourth pass (the worker's pool at most 16 connections, its LISTEN in trio,
a claim's casts looked up 32 to a hop, outcomes recorded a batch at a time, the group
commit's heir rule corrected), ``--table --agents 1000 --latencies 0 --workers 1
--no-kill``, 6 pairs interleaved with main (4c3213f), load 7-22: worker CPU per turn
1,262-1,992 -> 1,096-1,890 us (pairwise -302 to +172, median -89), PostgreSQL
790-1,254 -> 662-1,148 us (median pairwise -73); transactions 2.17-2.49 -> 2.03-2.55,
statements 2.74-3.50 -> 3.07-3.74 per turn. The statements rose: the loom's group
commit writes more, smaller batches than on main, whose heir rule let a caller wait
for a later caller's batch -- a bigger batch by luck, or for ever when none came (the
stuck casts this pass fixed); a batch of two writes or fewer is one statement per
write, each batch a ``BEGIN`` and ``COMMIT``. The worker's CPU here stays over 1 ms at
this load (main: 932 us in one run at load 3.5, before this pass); ``bench/pg_turn_cost.py``
(fsync off) shows the pass's part alone: 921 -> 694 us.

Issue 46.2, fourth pass (schema 7, the journal's first start, stored form 3, entities
without ``ON CONFLICT``): ``--table --no-kill --agents 200 1000 --workers 1 2
--latencies 0`` on main (4c3213f, load 4) then on this branch (``--wal-detail``, load
10), WAL bytes per turn; and the branch at 50 ms model latency (load 10)::

    agents x workers    main 0 ms   branch 0 ms   branch 50 ms
       200 x 1             2142        1848          1852
       200 x 2             2168        1844          1834
      1000 x 1             2253        1901          1901
      1000 x 2             2321        1905          1893

What changed, per turn (200 x 1, main -> branch): the work row's claim is a heap-only
update on its page (``cantrip_work.live`` names the open rows in the partial indexes
instead of ``state``; ``fillfactor`` 40 on ``cantrip_work`` and ``cantrip_leases``):
its heap, lock and index records ~330 -> ~250 B, and lease releases and renewals
stay on their page (no index entry); the (entity, position) turn index is gone (an
entity's turns read through ``UNIQUE (entity_id, sequence)``): 95 -> 0 B; the answer's
journal row carries its first start as ``{"start": 0}``: 215 -> 146 B; a gate-call
record's call id is not written again in the turn row (stored form 3): ~485 -> ~470 B;
an entity's record is a plain INSERT (its ``HEAP_CONFIRM``, 10 B, gone).
What is left (1,000 x 2): the turn row ~470 B and its four indexes ~330 B, the journal
row and index ~220 B, the work row's insert, claim and finish ~240 B, the workload's
own effect row and index ~115 B, the entity row and its indexes ~110 B, lease renewals
~50 B (more in a slower run), commits ~45 B.

All four passes merged (main 1f0c8c5), ``--table --workers 1 2`` on an idle machine
(load 0.2 at its start; the issue's baseline in brackets: wall ~15 s at 1,000 agents,
worker CPU 1.6-1.8 ms, WAL ~3.9 KB per turn)::

    agents ms wk   wall s  turns/s  wkr us  pg us  stmts  xacts  WAL B  enq s
       200 50  1     1.52      657    1200    610   2.66   1.93   1813  0.005
       200 50  2     1.02      980    1040    550   2.65   1.99   1809  0.005
       200  0  1     1.12      895     890    490   2.56   1.79   1812  0.004
       200  0  2     1.13      888    1120    570   2.67   1.99   1811  0.006
      1000 50  1     6.00      834     998    518   2.50   1.73   1833  0.017
      1000 50  2     4.64     1077     956    554   2.52   1.86   1841  0.027
      1000  0  1     5.49      911     902    496   2.54   1.75   1834  0.012
      1000  0  2     4.42     1132     836    454   2.45   1.77   1833  0.015
    takeover after SIGKILL (worker 0 restarted under its id, 50 ms; from the kill,
      the new process's start-up included): 0.44 / 0.54 / 0.43 / 0.71 s
      (200 x 1, 200 x 2, 1000 x 1, 1000 x 2)

How to run
----------
From the repository root::

    python bench/distributed.py                   # everything but the table
    python bench/distributed.py --entities 100 --open-turns 100000   # quicker
    python bench/distributed.py --table --agents 200 1000 --workers 1 2 --latencies 0 50
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
from typing import Any

import trio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import psycopg  # noqa: E402
from distributed_workload import EFFECTS_TABLE, build  # noqa: E402
from pg_cluster import fresh_database, postgres_cluster, server_cpu  # noqa: E402

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


# -- the cost table (issue 46) -----------------------------------------------------------

DURABLE = (
    "-c fsync=on -c synchronous_commit=on -c full_page_writes=on -c max_connections=1200 "
    "-c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.track=all "
    "-c pg_stat_statements.track_utility=on -c pg_stat_statements.max=10000"
)
"""PostgreSQL's default durable settings (overriding the test cluster's fsync=off), and
the statement counter."""
TICK = os.sysconf("SC_CLK_TCK")
WORKER = [sys.executable, "-m", "cantrip", "worker", "--db"]
POLL = "SELECT count(*) FILTER (WHERE state IN ('queued', 'running')) FROM cantrip_work"


def _cpu_of(pid: int) -> float:
    """CPU seconds (user + system) of a live process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def _start_workers(
    url: str, n: int, latency_ms: int, concurrency: int, log: Path, first_id: str | None = None
) -> list[subprocess.Popen[bytes]]:
    """``n`` workers (the first under ``first_id`` if given), each once it says it is ready."""
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT / "tests"),
        "CANTRIP_TEST_DB": url,
        "WORKLOAD_LATENCY_MS": str(latency_ms),
        "WORKLOAD_TURNS": "5",
    }
    procs = []
    for i in range(n):
        named = ["--worker-id", first_id] if first_id and i == 0 else []
        procs.append(
            subprocess.Popen(
                [*WORKER, url, "--concurrency", str(concurrency), *named],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=log.open("ab"),
            )
        )
    for _ in range(2400):  # each says "worker ... ready" on stderr (into the log)
        if log.read_text(errors="replace").count(" ready") >= n:
            return procs
        time.sleep(0.05)
    raise RuntimeError(f"workers not ready; see {log}")


def _table_db(server: str, name: str) -> str:
    url = fresh_database(server, name)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(EFFECTS_TABLE)
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
    Loom.open(url).close()
    return url


def _wait_done(mon: Any, limit_s: float = 900.0) -> int:
    """Poll until no cast is open; how many polls it took."""
    polls, started = 0, time.perf_counter()
    while True:
        polls += 1
        row = mon.execute(POLL).fetchone()
        if row[0] == 0:
            return polls
        if time.perf_counter() - started > limit_s:
            raise RuntimeError(f"{row[0]} casts still open after {limit_s:g} s")
        time.sleep(0.1)


def cost_row(
    server: str, agents: int, latency_ms: int, workers: int, *, wal_detail: bool
) -> dict[str, Any]:
    """One row of the cost table (see the module docstring)."""
    url = _table_db(server, f"cost_{agents}_{latency_ms}_{workers}")
    concurrency = min(500, -(-agents // workers))
    with tempfile.TemporaryDirectory() as folder:
        log = Path(folder) / "workers.log"
        procs = _start_workers(url, workers, latency_ms, concurrency, log)
        dispatcher = Dispatcher(url)
        try:
            with psycopg.connect(url, autocommit=True) as mon:
                oid = mon.execute(
                    "SELECT oid FROM pg_database WHERE datname = current_database()"
                ).fetchone()[0]
                mon.execute("SELECT pg_stat_statements_reset()")
                mon.execute("SELECT pg_stat_reset()")
                lsn0 = mon.execute("SELECT pg_current_wal_lsn()").fetchone()[0]
                worker0 = sum(_cpu_of(p.pid) for p in procs)
                server0 = server_cpu(mon)
                started = time.perf_counter()
                dispatcher.submit_many(SPELL, [f"job-{i}" for i in range(agents)])
                enqueued = time.perf_counter() - started
                polls = _wait_done(mon)
                wall = time.perf_counter() - started
                lsn1 = mon.execute("SELECT pg_current_wal_lsn()").fetchone()[0]
                worker_cpu = sum(_cpu_of(p.pid) for p in procs) - worker0
                server_s = server_cpu(mon) - server0
                wal = mon.execute("SELECT pg_wal_lsn_diff(%s, %s)", (lsn1, lsn0)).fetchone()[0]
                detail = _wal_detail(mon, lsn0, lsn1) if wal_detail else None
                _stop(procs)
                time.sleep(0.6)  # the workers' backends exit and flush their statistics
                states = dict(
                    mon.execute("SELECT state, count(*) FROM cantrip_work GROUP BY 1").fetchall()
                )
                assert states == {"done": agents}, states
                turns = mon.execute("SELECT count(*) FROM cantrip_turns").fetchone()[0]
                statements = mon.execute(
                    "SELECT sum(calls) FROM pg_stat_statements WHERE dbid = %s AND toplevel "
                    "AND query NOT LIKE '%%pg_stat%%' AND query NOT LIKE '%%pg_wal%%' "
                    "AND query NOT LIKE '%%pg_current_wal%%' AND query <> %s",
                    (oid, POLL),
                ).fetchone()[0]
                commits = mon.execute(
                    "SELECT xact_commit FROM pg_stat_database WHERE datid = %s", (oid,)
                ).fetchone()[0]
        finally:
            dispatcher.close()
            _stop(procs)
    n = float(turns)
    return {
        "agents": agents,
        "latency": latency_ms,
        "workers": workers,
        "wall": wall,
        "rate": n / wall,
        "worker_us": worker_cpu * 1e6 / n,
        "server_us": server_s * 1e6 / n,
        "statements": float(statements) / n,
        "transactions": float(commits - polls - 8) / n,  # less the polling and this setup
        "wal": float(wal) / n,
        "enqueue": enqueued,
        "detail": detail,
        "turns": n,
    }


def _wal_detail(mon: Any, lsn0: Any, lsn1: Any) -> list[tuple[str, float, float]]:
    """(what, records, bytes) of the WAL between two positions, by record type and by
    relation (pg_walinspect)."""
    # pg_walinspect reads only flushed WAL; the last records may be written but not yet
    # flushed (an asynchronous commit, a hint bit's record): the WAL writer flushes them
    for _ in range(100):
        if mon.execute("SELECT pg_current_wal_flush_lsn() >= %s", (lsn1,)).fetchone()[0]:
            break
        time.sleep(0.05)
    rows = mon.execute(
        "SELECT resource_manager || ' ' || coalesce(split_part(record_type, ' ', 1), ''), "
        "count(*), sum(record_length + fpi_length), "
        "coalesce(substring(block_ref from 'rel [0-9]+/[0-9]+/([0-9]+)'), '-') "
        "FROM pg_get_wal_records_info(%s, %s) GROUP BY 1, 4",
        (lsn0, lsn1),
    ).fetchall()
    names = dict(
        mon.execute(
            "SELECT pg_relation_filenode(oid)::text, relname FROM pg_class "
            "WHERE pg_relation_filenode(oid) IS NOT NULL"
        ).fetchall()
    )
    return [(f"{kind} {names.get(rel, rel)}", float(c), float(b)) for kind, c, b, rel in rows]


def takeover(server: str, agents: int, workers: int) -> float:
    """Seconds from a SIGKILL of worker 0 (40 % into a 50 ms-latency run) to every cast
    it held running again, worker 0 started again under its identity at once."""
    url = _table_db(server, f"takeover_{agents}_{workers}")
    concurrency = min(500, -(-agents // workers))
    with tempfile.TemporaryDirectory() as folder:
        log = Path(folder) / "workers.log"
        procs = _start_workers(url, workers, 50, concurrency, log, first_id="bench-w0")
        dispatcher = Dispatcher(url)
        try:
            with psycopg.connect(url, autocommit=True) as mon:
                dispatcher.submit_many(SPELL, [f"job-{i}" for i in range(agents)])
                while True:
                    turns = mon.execute("SELECT count(*) FROM cantrip_turns").fetchone()[0]
                    if turns >= agents * 5 * 0.4:
                        break
                    time.sleep(0.02)
                procs[0].kill()
                procs[0].wait()
                killed_at = mon.execute("SELECT clock_timestamp()").fetchone()[0]
                held = [
                    r[0]
                    for r in mon.execute(
                        "SELECT id FROM cantrip_work WHERE state = 'running' AND owner = 'bench-w0'"
                    ).fetchall()
                ]
                assert held, "the killed worker held no cast"
                procs[0] = _start_workers(url, 1, 50, concurrency, log, first_id="bench-w0")[0]
                while True:
                    row = mon.execute(
                        "SELECT count(*) FILTER (WHERE claimed_at <= %s AND state = 'running'), "
                        "max(claimed_at) - %s FROM cantrip_work WHERE id = ANY(%s)",
                        (killed_at, killed_at, held),
                    ).fetchone()
                    if row[0] == 0:
                        taken = row[1].total_seconds()
                        break
                    time.sleep(0.02)
                _wait_done(mon)
        finally:
            dispatcher.close()
            _stop(procs)
    return float(taken)


def cost_table(
    agents: list[int], latencies: list[int], workers: list[int], *, wal_detail: bool, kill: bool
) -> None:
    print(
        f"machine: {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}; PostgreSQL with "
        "default durable settings (fsync, synchronous_commit, full_page_writes on)"
    )
    header = (
        f"{'agents':>6} {'ms':>3} {'wk':>2} {'wall s':>7} {'turns/s':>8} {'wkr us':>7} "
        f"{'pg us':>6} {'stmts':>6} {'xacts':>6} {'WAL B':>6} {'enq s':>6}"
    )
    with postgres_cluster(DURABLE) as server:
        print(header)
        for a in agents:
            for latency in latencies:
                for w in workers:
                    r = cost_row(server, a, latency, w, wal_detail=wal_detail)
                    print(
                        f"{a:>6} {latency:>3} {w:>2} {r['wall']:>7.2f} {r['rate']:>8.0f} "
                        f"{r['worker_us']:>7.0f} {r['server_us']:>6.0f} "
                        f"{r['statements']:>6.2f} {r['transactions']:>6.2f} "
                        f"{r['wal']:>6.0f} {r['enqueue']:>6.3f}",
                        flush=True,
                    )
                    if r["detail"]:
                        for what, count, size in sorted(r["detail"], key=lambda d: -d[2]):
                            if size / r["turns"] < 3:  # the rest: a few bytes a turn
                                break
                            print(
                                f"        {count / r['turns']:6.2f} rec {size / r['turns']:7.0f} B"
                                f"  {what}"
                            )
        if kill:
            for a in agents:
                for w in workers:
                    print(
                        f"takeover after SIGKILL, {a} agents, {w} worker(s), 50 ms: worker 0 "
                        f"restarted under its id, its casts all running again "
                        f"{takeover(server, a, w):.2f} s after the kill",
                        flush=True,
                    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--entities", type=int, default=200)
    parser.add_argument("--workers", type=int, nargs="*", default=[1, 2, 4])
    parser.add_argument("--latencies", type=int, nargs="*", default=[50, 0])
    parser.add_argument("--claims", type=int, default=100)
    parser.add_argument("--open-turns", type=int, default=1_000_000)
    parser.add_argument("--table", action="store_true", help="the cost table (issue 46)")
    parser.add_argument("--agents", type=int, nargs="*", default=[200, 1000])
    parser.add_argument("--wal-detail", action="store_true")
    parser.add_argument("--no-kill", action="store_true", help="the table without takeover")
    args = parser.parse_args()
    if args.table:
        cost_table(
            args.agents,
            args.latencies,
            args.workers if args.workers != [1, 2, 4] else [1, 2],
            wal_detail=args.wal_detail,
            kill=not args.no_kill,
        )
        return
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
