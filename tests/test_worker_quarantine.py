"""A killed worker's bystanders are not charged for its death; the cast that kills its
workers is found in quarantine and dead-lettered alone (real PostgreSQL server and real
``cantrip worker`` processes, as in tests/test_worker_faults.py).

* **The queue's accounting.** A worker's death is what PostgreSQL sees: its leases run
  out. The casts it held beside others are ``spare`` (the next claim is free) and count
  a crash; from their second crash they are suspects, claimed only by an idle worker,
  alone; a suspect whose worker dies while it runs alone is charged; one that records a
  turn is innocent again.
* **A poison cast among bystanders.** A worker running eight casts, one of which
  SIGKILLs its worker at its second turn, is killed again and again (each death replaced
  by a fresh worker): the poison is dead-lettered, named, after the attempt limit; the
  seven bystanders finish with every turn once and no effect doubled, at no attempt.
* **A plain SIGKILL** of a worker holding eight casts costs none of them an attempt,
  even with ``--max-attempts 1``.
* **A version 4 database** is brought to version 5 in place.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import trio
from test_worker_faults import effects_db, procs, spawn_worker  # noqa: F401 -- fixtures

from cantrip.distributed._dispatcher import Dispatcher
from cantrip.distributed._queue import WorkQueue
from cantrip.distributed._spells import spell_from_factory
from cantrip.distributed._work import Claim
from cantrip.distributed._worker import Worker
from cantrip.loom import Loom
from cantrip.loom._postgres import PostgresStore

WORKLOAD = spell_from_factory("distributed_workload:build")
KILLER = spell_from_factory("distributed_workload:killer")
TURNS = 10


# -- the queue's accounting ----------------------------------------------------------------


@pytest.fixture
def queue(pg_url: str) -> Iterator[WorkQueue]:
    store = PostgresStore(pg_url, max_connections=2)
    try:
        yield WorkQueue(store)
    finally:
        store.close()


def _die(queue: WorkQueue, owner: str) -> None:
    """What PostgreSQL sees of a worker killed: its leases run out, nothing else."""
    with queue.store.pool.connection() as conn:
        conn.execute(
            "UPDATE cantrip_leases SET expires_at = clock_timestamp() - interval '1 second' "
            "WHERE owner = %s",
            (owner,),
        )


def _rows(queue: WorkQueue) -> dict[str, dict[str, Any]]:
    with queue.store.pool.connection() as conn:
        rows = conn.execute(
            "SELECT entity_id, state, attempts, crashes, spare, suspect, paroled, alone, "
            "result FROM cantrip_work ORDER BY id"
        ).fetchall()
    keys = ("state", "attempts", "crashes", "spare", "suspect", "paroled", "alone", "result")
    return {r[0]: dict(zip(keys, r[1:], strict=True)) for r in rows}


def _claim(queue: WorkQueue, owner: str, *, idle: bool, **kw: Any) -> list[Claim]:
    return queue.claim_many(owner, 30, 10, idle=idle, max_attempts=3, **kw)


def test_bystanders_of_a_death_are_spared_and_suspects_run_alone(queue: WorkQueue) -> None:
    for entity in ("entity-a", "entity-b", "entity-c"):
        queue.enqueue({"factory": "x:y"}, f"job {entity}", entity)
    first = _claim(queue, "w1", idle=True)
    assert [(c.attempt, c.resumed, c.quarantined) for c in first] == [(1, False, False)] * 3

    # one death with three casts held: no one is charged, nobody is suspect yet
    _die(queue, "w1")
    second = _claim(queue, "w2", idle=True)
    assert [(c.attempt, c.resumed, c.quarantined) for c in second] == [(1, True, False)] * 3
    assert {e: (r["crashes"], r["suspect"]) for e, r in _rows(queue).items()} == {
        e: (1, False) for e in ("entity-a", "entity-b", "entity-c")
    }

    # a second death: all three are suspects; a busy worker drains (claims nothing, not
    # even fresh work) so that an idle one takes them, one at a time
    _die(queue, "w2")
    queue.enqueue({"factory": "x:y"}, "fresh", "entity-d")
    assert _claim(queue, "w3", idle=False) == []
    (a,) = _claim(queue, "w3", idle=True)
    assert (a.entity_id, a.attempt, a.resumed, a.quarantined) == ("entity-a", 1, True, True)
    assert _rows(queue)["entity-a"]["alone"] is True
    assert _claim(queue, "w4", idle=False) == []  # b and c still wait for an idle worker

    # the worker running it alone dies: it is the culprit and is charged
    _die(queue, "w3")
    (a,) = _claim(queue, "w4", idle=True)
    assert (a.entity_id, a.attempt, a.quarantined) == ("entity-a", 2, True)
    # it records a turn: innocent again (paroled) -- but still alone until its worker
    # takes a cast beside it
    assert queue.cleared(a)
    row = _rows(queue)["entity-a"]
    assert (row["suspect"], row["paroled"], row["alone"]) == (False, True, True)
    (b,) = _claim(queue, "w5", idle=True)
    (c,) = _claim(queue, "w6", idle=True)
    assert [(x.entity_id, x.attempt, x.quarantined) for x in (b, c)] == [
        ("entity-b", 1, True),
        ("entity-c", 1, True),
    ]
    (d,) = _claim(queue, "w4", idle=False, alone=[a.work_id])  # no suspect waits: fresh
    assert (d.entity_id, d.attempt, d.quarantined) == ("entity-d", 1, False)
    assert _rows(queue)["entity-a"]["alone"] is False  # held beside d from now on

    # w4 dies holding a and d: both spared; a, in its fourth crash, is a suspect again --
    # paroled once, so quarantined to its end this time
    _die(queue, "w4")
    (a,) = _claim(queue, "w8", idle=True)
    assert (a.attempt, a.quarantined, a.paroled) == (2, True, True)
    assert _rows(queue)["entity-a"]["crashes"] == 4
    _die(queue, "w8")  # alone: charged, the third and last attempt
    (a,) = _claim(queue, "w9", idle=True)
    assert a.attempt == 3
    _die(queue, "w9")
    (d,) = _claim(queue, "w10", idle=True)  # a is dead; d, spared, is taken over for free
    assert (d.entity_id, d.attempt) == ("entity-d", 1)
    dead = _rows(queue)["entity-a"]
    assert (dead["state"], dead["attempts"], dead["crashes"]) == ("dead", 3, 6)
    error = json.loads(dead["result"])["error"]
    assert error.startswith(f"work {a.work_id} (entity entity-a) dead-lettered after 3 attempts")
    assert "running it alone (in quarantine" in error and "6 worker crashes" in error
    assert _rows(queue)["entity-d"]["crashes"] == 1
    assert [_rows(queue)[e]["attempts"] for e in ("entity-b", "entity-c")] == [1, 1]
    # the others were never charged for a's deaths
    assert [_rows(queue)[e]["attempts"] for e in ("entity-b", "entity-c", "entity-d")] == [1] * 3


def test_a_one_slot_workers_death_is_charged_and_a_released_lease_too(queue: WorkQueue) -> None:
    """A worker with one slot never holds a cast beside another: its death is the cast's.
    A lease given up by the runtime (a lost connection) costs an attempt, as before."""
    queue.enqueue({"factory": "x:y"}, "alone", "entity-a")
    queue.enqueue({"factory": "x:y"}, "abandoned", "entity-b")
    assert queue.claim_many("w1", 30, 1, one_slot=True)
    (b,) = queue.claim_many("w2", 30, 1)
    _die(queue, "w1")
    assert queue.abandon(b)
    again = queue.claim_many("w3", 30, 10)
    assert [(c.entity_id, c.attempt, c.quarantined) for c in again] == [
        ("entity-a", 2, False),
        ("entity-b", 2, False),
    ]
    rows = _rows(queue)
    assert (rows["entity-a"]["crashes"], rows["entity-b"]["crashes"]) == (1, 0)


async def test_a_suspect_runs_alone_until_it_records_a_turn_then_work_runs_beside_it(
    effects_db: str,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A worker takes a suspect alone: no other cast is claimed while it runs until it
    records a turn; from then on (cleared in the queue first) the worker fills its
    slots while the suspect's cast goes on."""
    monkeypatch.setenv("WORKLOAD_LATENCY_MS", "150")
    store = await trio.to_thread.run_sync(lambda: PostgresStore(effects_db, max_connections=2))
    queue = WorkQueue(store)
    suspect = queue.enqueue(WORKLOAD, "suspect", "entity-s")
    for ghost in ("ghost-1", "ghost-2"):  # two workers that held it beside others died
        assert [c.work_id for c in queue.claim_many(ghost, 30, 4)] == [suspect]
        _die(queue, ghost)
    others = [queue.enqueue(WORKLOAD, f"other-{i}", f"entity-o{i}") for i in range(3)]

    def snapshot() -> tuple[tuple[str, bool, bool], list[str]]:
        """(the suspect's state, whether it is still suspect, whether it has a turn), and
        the others' states: one statement, so one moment."""
        with store.pool.connection() as conn:
            rows = conn.execute(
                "SELECT w.id, w.state, w.suspect, EXISTS (SELECT 1 FROM cantrip_turns t "
                "WHERE t.entity_id = w.entity_id) FROM cantrip_work w"
            ).fetchall()
        by_id = {int(i): (str(state), bool(s), bool(t)) for i, state, s, t in rows}
        return by_id[suspect], [by_id[o][0] for o in others]

    seen = []
    async with trio.open_nursery() as nursery:
        await nursery.start(Worker(effects_db, concurrency=4, lease_s=3, poll_s=0.2).run)
        with trio.fail_after(60):
            while True:
                seen.append(await trio.to_thread.run_sync(snapshot))
                (state, _, _), rest = seen[-1]
                if state == "done" and rest == ["done"] * 3:
                    break
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    store.close()
    alone = [s for (s, rest) in seen if s[0] == "running" and s[1]]
    beside = [s for (s, rest) in seen if s[0] == "running" and "running" in rest]
    assert alone and beside, seen
    # nothing ran beside it while it was a suspect, and it had a turn before anything did
    assert not [r for (s, r) in seen if s[1] and r != ["queued"] * 3], seen
    assert all(s[2] for s in beside), seen


# -- real worker processes -----------------------------------------------------------------


def _work(url: str) -> dict[int, dict[str, Any]]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT id, entity_id, state, attempts, crashes, suspect, result FROM cantrip_work"
        ).fetchall()
    keys = ("entity", "state", "attempts", "crashes", "suspect", "result")
    return {int(r[0]): dict(zip(keys, r[1:], strict=True)) for r in rows}


def _assert_intact(url: str, jobs: dict[str, str]) -> None:
    """Every bystander's thread is whole, in order, each turn once, none cut off; no
    effect of a gate happened twice."""
    loom = Loom.open(url)
    try:
        for entity_id, job in jobs.items():
            last = loom.last_turn(entity_id)
            assert last is not None and last.terminated and last.result == f"{job} ok", entity_id
            thread = loom.thread(last.id)
            assert [t.sequence for t in thread] == list(range(1, TURNS + 1)), entity_id
            assert not [t for t in thread if t.reason == "cancelled"], entity_id
    finally:
        loom.close()
    with psycopg.connect(url) as conn:
        doubled = conn.execute(
            "SELECT job, step, count(*) FROM chaos_effects GROUP BY 1, 2 HAVING count(*) > 1"
        ).fetchall()
    assert doubled == []


LEASE_S = 3.0
"""The poison test's leases: each death is waited out for one, so they are short, but
not 1 s -- on a loaded machine a live worker that lets one run out counts a crash the
test would take for the poison's (a bystander's second one makes it a suspect, run alone
and charged if that happens again: seen at load 12-19)."""


def test_a_poison_cast_is_dead_lettered_alone_and_its_bystanders_finish(
    effects_db: str,  # noqa: F811
    procs: list[Any],  # noqa: F811
    tmp_path: Path,
) -> None:
    log = tmp_path / "workers.log"
    env = {"CANTRIP_TEST_DB": effects_db, "WORKLOAD_LATENCY_MS": "30"}
    dispatcher = Dispatcher(effects_db)
    jobs: dict[str, str] = {}
    good = []
    poison, poison_entity = dispatcher.submit(KILLER, "poison")
    for i in range(7):
        work, entity_id = dispatcher.submit(WORKLOAD, f"good-{i}")
        good.append(work)
        jobs[entity_id] = f"good-{i}"
    dispatcher.close()
    deaths = 0
    deadline = time.monotonic() + 150
    while True:
        work = _work(effects_db)
        if all(w["state"] not in ("queued", "running") for w in work.values()):
            break
        assert time.monotonic() < deadline, (work, log.read_text())
        if not procs or procs[-1].poll() is not None:  # the poison killed it: a new one
            deaths += len(procs) > 0
            procs.append(
                spawn_worker(
                    effects_db, log, "--max-attempts", "2", lease=LEASE_S, concurrency=8, **env
                )
            )
        time.sleep(0.05)
    assert procs[-1].poll() is None, log.read_text()
    assert [work[w]["state"] for w in good] == ["done"] * 7, work
    assert [work[w]["attempts"] for w in good] == [1] * 7, work
    assert all(work[w]["crashes"] >= 1 for w in good), work  # (in the first, at least)
    dead = work[poison]
    assert dead["state"] == "dead" and dead["attempts"] == 2, dead
    error = json.loads(dead["result"])["error"]
    assert error.startswith(f"work {poison} (entity {poison_entity}) dead-lettered after 2 ")
    assert "running it alone (in quarantine" in error, error
    # every death was the poison's (it was in each), charged only when it ran alone; in
    # quarantine it records a turn before it kills again (its killing call comes back
    # "outcome unknown", journaled), so it walks free once, then is run alone to the end
    assert deaths == dead["crashes"] >= 4, (deaths, dead)
    _assert_intact(effects_db, jobs)


def test_a_killed_workers_casts_are_resumed_at_no_attempt(
    effects_db: str,  # noqa: F811
    procs: list[Any],  # noqa: F811
    tmp_path: Path,
) -> None:
    """``--max-attempts 1``: before, every cast a SIGKILLed worker held was dead-lettered
    by the next claim."""
    log = tmp_path / "workers.log"
    env = {"CANTRIP_TEST_DB": effects_db, "WORKLOAD_LATENCY_MS": "100"}
    dispatcher = Dispatcher(effects_db)
    jobs: dict[str, str] = {}
    works = []
    for i in range(8):
        work, entity_id = dispatcher.submit(WORKLOAD, f"job-{i}")
        works.append(work)
        jobs[entity_id] = f"job-{i}"
    limit = ("--max-attempts", "1")
    procs.append(spawn_worker(effects_db, log, *limit, concurrency=8, **env))
    loom = Loom.open(effects_db)
    deadline = time.monotonic() + 60
    while min(len(loom.store.entity_turns(e)) for e in jobs) < 2:  # type: ignore[attr-defined]
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.02)
    loom.close()
    procs[0].kill()
    procs[0].wait()
    # the new worker's leases are long: a 1 s lease run out on a loaded machine is a
    # crash too, and a second one makes a cast a suspect that dies charged (that rule is
    # tested above), which is not what this test is about
    procs.append(spawn_worker(effects_db, log, *limit, lease=10.0, concurrency=8, **env))
    for work in works:
        state, outcome = dispatcher.wait(work, timeout=60)
        assert state == "done", (state, outcome, log.read_text())
    dispatcher.close()
    after = _work(effects_db)
    # the kill is a crash of each (the killed worker, on a loaded machine, may have let a
    # 1 s lease run out before it: another crash, still at no attempt)
    assert [after[w]["attempts"] for w in works] == [1] * 8, after
    assert all(after[w]["crashes"] >= 1 for w in works), after
    _assert_intact(effects_db, jobs)


# -- the schema ------------------------------------------------------------------------------


def test_a_version_4_database_is_brought_to_version_5_in_place(pg_url: str) -> None:
    """A database made before quarantine (no ``crashes``, ``spare``, ``suspect``, ``alone``
    on ``cantrip_work``) gains them when a store opens it; its work stays, and a cast a
    version 4 worker held beside others when it died is resumed at no attempt."""
    from cantrip.loom._postgres_schema import SCHEMA_VERSION

    store = PostgresStore(pg_url, max_connections=2)
    queue = WorkQueue(store)
    for entity in ("entity-a", "entity-b"):
        queue.enqueue({"factory": "m:f"}, "kept", entity)
    assert len(queue.claim_many("old-worker", 30, 2)) == 2
    store.close()
    with psycopg.connect(pg_url, autocommit=True) as conn:  # back to what v4 made
        conn.execute(
            "DROP INDEX cantrip_work_suspect; ALTER TABLE cantrip_work DROP COLUMN crashes, "
            "DROP COLUMN spare, DROP COLUMN suspect, DROP COLUMN alone, DROP COLUMN paroled; "
            "DELETE FROM cantrip_schema; INSERT INTO cantrip_schema (version) VALUES (4); "
            "UPDATE cantrip_leases SET expires_at = clock_timestamp() - interval '1 second'"
        )
    store = PostgresStore(pg_url, max_connections=2)
    try:
        claims = WorkQueue(store).claim_many("new-worker", 30, 2, max_attempts=1)
        assert [(c.intent, c.attempt, c.resumed) for c in claims] == [("kept", 1, True)] * 2
    finally:
        store.close()
    with psycopg.connect(pg_url) as conn:
        version = conn.execute("SELECT max(version) FROM cantrip_schema").fetchone()
        assert version == (SCHEMA_VERSION,)  # and on, to the latest
        assert (
            conn.execute(
                "SELECT crashes, spare, suspect, alone FROM cantrip_work ORDER BY id"
            ).fetchall()
            == [(1, False, False, False)] * 2
        )
        assert conn.execute("SELECT to_regclass('cantrip_work_suspect')").fetchone() == (
            "cantrip_work_suspect",
        )
