"""Where a PostgreSQL worker's time per turn goes: statements, round trips, commits, CPU.

What it measures
----------------
One ``cantrip worker`` process (``--concurrency`` entities at once) runs ``E``
entities x 10 turns of the distributed workload (``tests/distributed_workload.py``:
an effectful ``charge`` gate on every turn but the last) on a throwaway
PostgreSQL cluster with ``pg_stat_statements`` loaded. Reported per turn:

* **statements** the server executed, by kind (``pg_stat_statements``: calls,
  ``BEGIN``/``COMMIT`` included) and the server's execution time for them;
* **transactions** committed (``pg_stat_database.xact_commit``; an autocommit
  statement is a transaction of its own);
* **round trips**: how often the worker waited on a PostgreSQL connection
  (psycopg's ``Connection.wait`` calls that went to the server, counted in the
  worker process; the workload's own effect INSERT included);
* **CPU** of the worker process (its main trio thread and its DB threads
  separately) and of the PostgreSQL server processes (the postmaster, its live
  children and the children it reaped), in microseconds per turn;
* **thread hops**: every ``trio.to_thread.run_sync`` the worker made, by what it
  called -- how long it queued for the limiter (and a thread), how long it ran,
  how long the result took to come back to trio.

The worker here is ``cantrip worker`` itself with these counters wrapped around
it (``--child``), under the command's collector setting; nothing in cantrip is changed
to be measured.

Figures (2 shared, busy cores; 100 entities, --concurrency 100; before = the
fence check, write, BEGIN/COMMIT as separate statements and one commit per
journal entry; after = one fenced statement per write, group commit, one
statement per kind per batch)::

                         before (0 / 50 ms)    after (0 / 50 ms)
    turns/s              312 / 296             645 / 625
    statements/turn      18.1 / 18.2           2.35 / 2.49  (0.9 = the gate's effect)
    round trips/turn     17.7 / 17.9           2.29 / 2.43
    transactions/turn    4.75 / 4.81           1.86 / 1.89
    worker CPU/turn      2,892 / 2,588 us      1,317 / 1,355 us
      DB threads         1,688 / 1,479 us        620 /   626 us
      trio thread        1,205 / 1,109 us        697 /   728 us
    server CPU/turn      1,770 / 1,700 us        570 /   620 us

Batched claims (one statement claims up to the worker's free slots), before/after back
to back, 100 entities, 0 / 50 ms: claim statements 0.16 / 0.15 -> 0.03 / 0.04 per turn
(about 155 claims -> 30 for 100 casts), the 100 casts all began within 0.53 / 0.45 s ->
0.19 / 0.15 s, round trips 2.38 / 2.43 -> 1.89 / 2.20 per turn; turns/s 623 / 624 ->
687 / 622 (one worker on 2 cores is CPU-bound: the claims were not its bottleneck).

1,000 entities x 5 turns, one worker, 0 ms (issue 46.4's last pass; medians of 3, run
interleaved with main, load ~10): worker CPU 1,448 -> 1,161 us per turn (DB threads 638
-> 447, trio thread 810 -> 714), 438 -> 632 turns/s -- the group commit's arrays sent in
binary (psycopg escaped each quote of each JSON record in text, ~70 us a record), the
journal's data encoded in one orjson walk, ``Loom.release`` no longer O(held). Both
figures under Python's own collector, as before: the child now runs under the setting
``cantrip worker`` runs under (``command_gc``, its ``--gc-young``) unless
``PG_TURN_COST_GC_YOUNG=0``; with it, after: 1,047 us per turn, 713 turns/s.
Issue 46.4's third pass (same command, main vs branch back to back, load 8-30): a gate
result encoded only when the group commit writes it, ``arguments_json`` through orjson,
the spell key made once, the group commit's waiters woken once per batch (its heir
writes the next). What the trio thread does per 5,000 turns (cProfile counts, stable
from run to run): task suspensions 73,814 -> 54,076, ``Event.wait`` resumptions 43,624
-> 24,172, journal encodings 13,000 -> 8,000, stdlib argument encodings 5,000 -> 0,
Python calls 4.70 M -> 4.50 M. Worker CPU per turn over 9 pairs: median 1,007 -> 973 us
(main 805-1,197, branch 779-1,130); the pairs' differences run from -300 to +202 us
(median +17): at this load the saving is inside the noise, and whichever side runs
second in a pair tends to read lower -- alternate the order when comparing.
Issue 46.4's fourth pass (same command, 6 interleaved pairs, main 4c3213f vs branch, load
7-22): the worker's loom pool at most 16 connections (it grew towards concurrency/2 =
500: ~50-100 connections and ~400 threads a run), its LISTEN waiting in trio, the casts
of one claim looked up 32 to a thread hop, casts that end together recording their
outcomes in one hop and one transaction. Counted per turn (stable from run to run):
thread hops 1.27-1.42 -> 0.86-0.93 (cantrip's own ~0.5 -> ~0.06; the other 0.80 is the
workload's blocking gate), threads started 0.04-0.10 -> 0.009, connections opened
0.007-0.014 -> 0.002-0.003, task wake-ups 7.0-7.9 -> 6.6-7.0, transactions 2.05-2.23
-> 1.65-1.90, statements 2.07-2.24 -> 2.12-2.28 (a batch of outcomes adds its
``BEGIN``/``COMMIT``). Worker CPU per turn: median 921 -> 694 us (before 846-954, after
619-818; every pair lower, by 105-299 us), PostgreSQL 546 -> 377 us. A thread hop costs
~65 us of CPU here, both threads together (a loop of ``to_thread.run_sync`` of a no-op).
``PG_TURN_COST_PROFILE_CPU=1`` profiles CPU time instead of wall time (on busy cores
wall time counts waits for the GIL and for a core as the code's).

``PG_TURN_COST_PROFILE=x.prof`` keeps the trio thread's profile for pstats,
``PG_TURN_COST_PROFILE_THREADS=y.prof`` profiles every thread hop (the DB threads).

How to run
----------
From the repository root::

    python bench/pg_turn_cost.py                       # 100 entities, 0 ms latency
    python bench/pg_turn_cost.py --entities 200 --latency 50

What-ifs, measured and not adopted: ``PG_TURN_COST_POOL=4`` (the worker's pool and
thread limiter at 4 instead of concurrency/2 = 50: no difference once writes are
group-committed) and ``PG_TURN_COST_SWITCH_S=0.0005`` (CPython's GIL switch
interval at 0.5 ms instead of 5 ms: no difference).
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import json
import os
import pstats
import resource
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

STATS_OPTIONS = (
    "-c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.track=all "
    "-c pg_stat_statements.track_utility=on -c pg_stat_statements.max=10000"
)


# -- the worker, instrumented (runs in a child process) -----------------------------


def child(url: str, concurrency: int) -> None:
    """``cantrip worker`` with counters; prints them as JSON on SIGTERM."""
    import threading

    import psycopg
    import trio

    from cantrip.cli._process import command_gc
    from cantrip.distributed._worker import Worker
    from cantrip.loom import Loom

    waits = collections.Counter[str]()
    lock = threading.Lock()
    original_wait = psycopg.Connection.wait

    def counted_wait(self: Any, gen: Any, *args: Any, **kwargs: Any) -> Any:
        name = threading.current_thread().name.split("-")[0]

        def tracked() -> Any:  # counts a wait that reached the server (the generator
            try:  # yielded: it sends and/or waits for an answer); a no-op commit does not
                value = gen.send(None)
            except StopIteration as end:
                return end.value
            with lock:
                waits[name] += 1
            while True:
                sent = yield value
                try:
                    value = gen.send(sent)
                except StopIteration as end:
                    return end.value

        return original_wait(self, tracked(), *args, **kwargs)

    psycopg.Connection.wait = counted_wait  # type: ignore[method-assign]

    # deterministic counters of what a turn costs the worker's threads (not timings):
    # connections opened (the pool grows under load), threads started (trio's cache),
    # task wake-ups on the trio thread (each is a task switch)
    counts = collections.Counter[str]()
    original_connect = psycopg.Connection.connect.__func__  # type: ignore[attr-defined]

    def counted_connect(cls: Any, *args: Any, **kwargs: Any) -> Any:
        with lock:
            counts["connections opened"] += 1
        return original_connect(cls, *args, **kwargs)

    psycopg.Connection.connect = classmethod(counted_connect)  # type: ignore[assignment,method-assign]
    from trio._core import _run as trio_run
    from trio._core import _thread_cache

    original_worker_init = _thread_cache.WorkerThread.__init__

    def counted_worker_init(self: Any, cache: Any) -> None:
        counts["threads started"] += 1
        original_worker_init(self, cache)

    _thread_cache.WorkerThread.__init__ = counted_worker_init  # type: ignore[method-assign]
    original_reschedule = trio_run.Runner.reschedule

    def counted_reschedule(self: Any, task: Any, next_send: Any = trio_run._NO_SEND) -> None:
        counts["task wake-ups"] += 1
        original_reschedule(self, task, next_send)

    trio_run.Runner.reschedule = counted_reschedule  # type: ignore[method-assign]

    thread_profiles: list[Any] | None = (
        [] if os.environ.get("PG_TURN_COST_PROFILE_THREADS") else None
    )  # one cProfile per hop (a profile covers one thread), merged at the end
    hops: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0, 0.0, 0.0, 0.0])
    original_run_sync = trio.to_thread.run_sync

    async def timed_run_sync(fn: Any, *args: Any, **kwargs: Any) -> Any:
        name = getattr(fn, "__qualname__", repr(fn)).replace(".<locals>.<lambda>", "")
        marks: list[float] = []

        def inner() -> Any:
            marks.append(time.perf_counter())
            cpu = time.thread_time()
            try:
                if thread_profiles is None:
                    return fn(*args)
                profile = (
                    cProfile.Profile(time.thread_time)
                    if os.environ.get("PG_TURN_COST_PROFILE_CPU")
                    else cProfile.Profile()
                )
                try:
                    return profile.runcall(fn, *args)
                finally:
                    thread_profiles.append(profile)
            finally:
                marks.append(time.thread_time() - cpu)
                marks.append(time.perf_counter())

        asked = time.perf_counter()
        try:
            return await original_run_sync(inner, **kwargs)
        finally:
            if len(marks) == 3:
                back = time.perf_counter()
                row = hops[name]
                row[0] += 1
                row[1] += marks[0] - asked  # queued: limiter + thread start
                row[2] += marks[2] - marks[0]  # ran in the thread
                row[3] += back - marks[2]  # back to trio
                row[4] += marks[1]  # CPU in the thread

    trio.to_thread.run_sync = timed_run_sync  # type: ignore[assignment]

    switch = os.environ.get("PG_TURN_COST_SWITCH_S")
    if switch:  # another GIL switch interval than CPython's 5 ms
        sys.setswitchinterval(float(switch))
    pool = os.environ.get("PG_TURN_COST_POOL")
    if pool:  # another pool/limiter size than the worker's own choice
        import cantrip.distributed._worker as worker_module
        from cantrip.loom._postgres import PostgresStore

        def store(url: str, *, max_connections: int = 8) -> PostgresStore:
            return PostgresStore(url, max_connections=int(pool))

        worker_module.PostgresStore = store  # type: ignore[assignment,misc]
    owned: list[tuple[float, float]] = []
    original_own = Worker._own

    async def timed_own(self: Any, claim: Any, free: Any) -> None:
        began = time.perf_counter()
        try:
            await original_own(self, claim, free)
        finally:
            owned.append((began, time.perf_counter()))

    Worker._own = timed_own  # type: ignore[method-assign]
    sync_wall = [0, 0.0]
    original_sync = Loom.sync

    async def timed_sync(self: Any, entity_id: Any = None) -> None:
        began = time.perf_counter()
        try:
            await original_sync(self, entity_id)
        finally:
            sync_wall[0] += 1
            sync_wall[1] += time.perf_counter() - began

    Loom.sync = timed_sync  # type: ignore[method-assign]
    worker = Worker(url, concurrency=concurrency)
    usage: dict[str, float] = {}

    async def run() -> None:
        with trio.open_signal_receiver(signal.SIGTERM) as signals:
            async with trio.open_nursery() as nursery:
                await nursery.start(worker.run)
                print("ready", file=sys.stderr, flush=True)
                ru = resource.getrusage(resource.RUSAGE_SELF)
                usage["start"] = ru.ru_utime + ru.ru_stime
                async for _ in signals:
                    ru = resource.getrusage(resource.RUSAGE_SELF)
                    usage["end"] = ru.ru_utime + ru.ru_stime
                    nursery.cancel_scope.cancel()
                    break

    # the collector setting `cantrip worker` runs under (its --gc-young, default);
    # PG_TURN_COST_GC_YOUNG=0: Python's own, as this bench measured before issue 46.4's
    # last pass (the figures above the 1,000-entity ones were taken so)
    young = os.environ.get("PG_TURN_COST_GC_YOUNG")
    with command_gc(None if young is None else int(young)):
        if os.environ.get("PG_TURN_COST_PROFILE"):
            # PG_TURN_COST_PROFILE_CPU=1: the trio thread's CPU time, not wall time (on
            # busy cores wall time counts waits for the GIL and for the cores)
            cpu_timer = bool(os.environ.get("PG_TURN_COST_PROFILE_CPU"))
            profile = cProfile.Profile(time.thread_time) if cpu_timer else cProfile.Profile()
            profile.runcall(trio.run, run)
            if os.environ["PG_TURN_COST_PROFILE"].endswith(".prof"):  # for pstats' callers
                profile.dump_stats(os.environ["PG_TURN_COST_PROFILE"])
            pstats.Stats(profile, stream=sys.stderr).sort_stats("tottime").print_stats(35)
        else:
            trio.run(run)
    if thread_profiles:
        merged = pstats.Stats(thread_profiles[0], stream=sys.stderr)
        for profile in thread_profiles[1:]:
            merged.add(profile)
        merged.dump_stats(os.environ["PG_TURN_COST_PROFILE_THREADS"])
    print(
        json.dumps(
            {
                "cpu_s": usage["end"] - usage["start"],
                "waits": dict(waits),
                "hops": {k: v for k, v in hops.items()},
                "owned": owned,
                "sync": sync_wall,
                "counts": dict(counts),
            }
        ),
        flush=True,
    )


# -- the measuring side -------------------------------------------------------------


def _kind(query: str) -> str:
    q = " ".join(query.split())
    for needle, kind in (
        ("chaos_effects", "effect (the gate's INSERT)"),
        ("INSERT INTO cantrip_journal", "journal write"),
        ("DELETE FROM cantrip_journal", "journal void (new utterance)"),
        ("FROM cantrip_journal", "journal read"),
        ("INSERT INTO cantrip_turns", "turn insert"),
        ("INSERT INTO cantrip_entities", "entity insert"),
        (
            "FROM cantrip_leases WHERE entity_id = $1 AND owner = $2 AND epoch = $3 AND expires_at "
            "> clock_timestamp() FOR SHARE",
            "fence check",
        ),
        (
            "SELECT cantrip_fence_holds(",
            "fence check",
        ),
        ("INSERT INTO cantrip_leases", "claim: take lease"),
        ("UPDATE cantrip_leases SET expires_at", "heartbeat"),
        ("cancel_requested FROM cantrip_work", "heartbeat: cancel poll"),
        ("FROM cantrip_messages", "steering messages"),
        ("FOR UPDATE SKIP LOCKED", "claim: pick work"),
        ("UPDATE cantrip_work SET state = 'running'", "claim: mark running"),
        ("FOR UPDATE", "finish: lease check"),
        ("UPDATE cantrip_work SET state", "finish: record outcome"),
        ("UPDATE cantrip_leases SET owner = NULL", "finish: release lease"),
        ("pg_notify", "notify"),
        (
            "FROM cantrip_turns WHERE entity_id = $1 ORDER BY sequence DESC",
            "latest turn (claim/refresh)",
        ),
        ("WITH RECURSIVE", "thread read (refresh)"),
        ("FROM cantrip_entities WHERE entity_id", "entity read (refresh)"),
        ("BEGIN", "BEGIN"),
        ("COMMIT", "COMMIT"),
    ):
        if needle in q:
            return kind
    return "other: " + q[:60]


def measure(server: str, entities: int, latency_ms: int, concurrency: int) -> None:
    import psycopg
    from distributed_workload import EFFECTS_TABLE
    from pg_cluster import fresh_database, server_cpu

    from cantrip.distributed._queue import WorkQueue
    from cantrip.distributed._spells import spell_from_factory
    from cantrip.loom import Loom
    from cantrip.loom._postgres import PostgresStore

    url = fresh_database(server, f"cost_{latency_ms}")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(EFFECTS_TABLE)
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
    Loom.open(url).close()
    env = {
        **os.environ,
        "PYTHONPATH": f"{ROOT / 'tests'}{os.pathsep}{ROOT}",
        "CANTRIP_TEST_DB": url,
        "WORKLOAD_LATENCY_MS": str(latency_ms),
    }
    proc = subprocess.Popen(
        [sys.executable, __file__, "--child", url, "--concurrency", str(concurrency)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stderr is not None and proc.stdout is not None
    proc.stderr.readline()
    spell = spell_from_factory("distributed_workload:build")
    store = PostgresStore(url, max_connections=1)
    queue = WorkQueue(store)
    with psycopg.connect(url, autocommit=True) as mon:
        dbid = mon.execute("SELECT oid FROM pg_database WHERE datname = current_database()")
        oid = dbid.fetchone()[0]  # type: ignore[index]
        mon.execute("SELECT pg_stat_statements_reset()")
        mon.execute("SELECT pg_stat_reset()")
        cpu0 = server_cpu(mon)
        started = time.perf_counter()
        for i in range(entities):
            queue.enqueue(spell, f"job-{i}", f"entity-{i:05d}")
        while True:
            row = mon.execute(
                "SELECT count(*) FILTER (WHERE state IN ('queued', 'running')), "
                "count(*) FILTER (WHERE state <> 'done') FROM cantrip_work"
            ).fetchone()
            assert row is not None
            if row[0] == 0:
                assert row[1] == 0, f"{row[1]} work items did not finish"
                break
            time.sleep(0.05)
        elapsed = time.perf_counter() - started
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
        if os.environ.get("PG_TURN_COST_PROFILE"):
            print(err.decode())
        time.sleep(0.5)  # the worker's backends exit and are reaped
        server_s = server_cpu(mon) - cpu0
        turns = mon.execute("SELECT count(*) FROM cantrip_turns").fetchone()[0]  # type: ignore[index]
        commits = mon.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datid = %s", (oid,)
        ).fetchone()[0]  # type: ignore[index]
        rows = mon.execute(
            "SELECT query, calls, total_exec_time FROM pg_stat_statements WHERE dbid = %s "
            "AND toplevel",  # not the statements a function runs (the fence check's)
            (oid,),
        ).fetchall()
    store.close()
    report = json.loads(out.decode().strip().splitlines()[-1])
    kinds: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0])
    for query, calls, exec_ms in rows:
        kind = _kind(query)
        if "pg_stat" in query or ("cantrip_work WHERE" in query and "FILTER" in query):
            continue  # this script's own monitoring
        kinds[kind][0] += calls
        kinds[kind][1] += exec_ms
    n = float(turns)
    rate = n / elapsed
    print(
        f"{entities} entities x 10 turns, {latency_ms} ms LLM latency, 1 worker "
        f"(--concurrency {concurrency}): {turns} turns in {elapsed:.2f} s = {rate:,.0f} turns/s"
    )
    print("statements per turn (server side, pg_stat_statements):")
    total_calls = 0.0
    for kind, (calls, ms) in sorted(kinds.items(), key=lambda kv: -kv[1][0]):
        total_calls += calls
        print(f"  {calls / n:6.2f}  {ms * 1000 / calls if calls else 0:7.1f} us each   {kind}")
    print(f"  {total_calls / n:6.2f}  total statements")
    print(f"transactions committed per turn: {commits / n:.2f} (includes the enqueue's and reads)")
    waits = {k: round(v / n, 2) for k, v in report["waits"].items()}
    print(f"round trips per turn (worker waits on a connection): {sum(waits.values()):.2f}")
    for name, count in sorted(waits.items(), key=lambda kv: -kv[1]):
        print(f"  {count:6.2f}  from {name.removeprefix('inner from ')}")
    cpu, hop_cpu = report["cpu_s"], sum(v[4] for v in report["hops"].values())
    print(
        f"CPU per turn: worker {cpu * 1e6 / n:,.0f} us (DB threads {hop_cpu * 1e6 / n:,.0f} us, "
        f"trio thread {(cpu - hop_cpu) * 1e6 / n:,.0f} us); "
        f"PostgreSQL server {server_s * 1e6 / n:,.0f} us"
    )
    owned = report["owned"]
    cast_s = statistics.mean(e - b for b, e in owned)
    spread = max(b for b, _ in owned) - min(b for b, _ in owned)
    syncs, sync_s = report["sync"]
    print(
        f"an entity's cast (claim to finish): mean {cast_s:.3f} s; casts began over "
        f"{spread:.3f} s; Loom.sync (waiting for the group commit + writing it) "
        f"{sync_s * 1e6 / max(1, syncs):,.0f} us mean, {syncs / n:.2f} per turn"
    )
    hops_n = sum(v[0] for v in report["hops"].values())
    counted = {"thread hops": hops_n, **report["counts"]}
    print(
        "per turn: "
        + ", ".join(f"{name} {count / n:.3f}" for name, count in sorted(counted.items()))
    )
    print(
        "thread hops per turn (to_thread.run_sync): count, then mean us queued / ran / back,"
        " then the thread's CPU us per turn:"
    )
    for name, (count, queued, ran, back, hop_cpu_s) in sorted(
        report["hops"].items(), key=lambda kv: -kv[1][0]
    ):
        print(
            f"  {count / n:5.2f}  {queued * 1e6 / count:8.0f} {ran * 1e6 / count:8.0f} "
            f"{back * 1e6 / count:8.0f} {hop_cpu_s * 1e6 / n:8.1f}   {name}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--entities", type=int, default=100)
    parser.add_argument("--latency", type=int, nargs="*", default=[0])
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--child", metavar="URL", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.concurrency)
        return
    from pg_cluster import postgres_cluster

    print(f"machine: {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}")
    with postgres_cluster(STATS_OPTIONS) as server:
        for latency in args.latency:
            measure(server, args.entities, latency, args.concurrency)


if __name__ == "__main__":
    main()
