"""A worker's leases and claims on PostgreSQL (a real server, started by tests/conftest.py).

* a lease the worker gives up on purpose (``finish`` releases it) is never reported
  as lost -- the heartbeat that runs after the release is not a loss;
* batched claims: one statement claims up to the worker's free slots, each item on
  a distinct entity under a valid fence, and two workers claiming at once never
  share an entity.

A genuinely lost lease is still reported: the SIGSTOP test in test_distributed.py.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any

import pytest
import trio
from distributed_workload import EFFECTS_TABLE

import cantrip.distributed._leases
import cantrip.distributed._worker
from cantrip.distributed._dispatcher import Dispatcher
from cantrip.distributed._queue import WorkQueue
from cantrip.distributed._spells import spell_from_factory
from cantrip.distributed._work import Claim
from cantrip.distributed._worker import Worker
from cantrip.loom import Loom
from cantrip.loom._fence import Fence

WORKLOAD = spell_from_factory("distributed_workload:build")


@pytest.fixture
def effects_db(pg_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    import psycopg

    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(EFFECTS_TABLE)
    monkeypatch.setenv("CANTRIP_TEST_DB", pg_url)
    return pg_url


async def test_a_lease_given_up_by_finish_is_never_reported_lost(
    effects_db: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    finished = threading.Event()

    real_heartbeat = cantrip.distributed._leases.heartbeat_on
    beats: list[int] = []
    monkeypatch.setenv("WORKLOAD_LATENCY_MS", "150")  # the cast outlasts the first heartbeat

    def late_heartbeat(conn: Any, owner: str, fences: list[Fence], lease_s: float) -> Any:
        """The race of a fast cast, made certain: the heartbeat's statement runs only
        after ``finish`` has released the lease."""
        beats.append(len(fences))
        finished.wait(timeout=20)
        return real_heartbeat(conn, owner, fences, lease_s)

    class LateFinish(WorkQueue):
        def finish_many(self, ended: Sequence[tuple[Claim, str, dict[str, Any]]]) -> list[bool]:
            try:
                return super().finish_many(ended)
            finally:
                finished.set()

    monkeypatch.setattr(cantrip.distributed._worker, "WorkQueue", LateFinish)
    monkeypatch.setattr(cantrip.distributed._leases, "heartbeat_on", late_heartbeat)
    dispatcher = await trio.to_thread.run_sync(Dispatcher, effects_db)
    with caplog.at_level(logging.INFO, logger="cantrip.worker"):
        async with trio.open_nursery() as nursery:
            worker = Worker(effects_db, concurrency=4, lease_s=3)
            await nursery.start(worker.run)
            work, _ = await trio.to_thread.run_sync(lambda: dispatcher.submit(WORKLOAD, "fast"))
            state, outcome = await trio.to_thread.run_sync(
                lambda: dispatcher.wait(work, timeout=30)
            )
            assert (state, outcome["turns"]) == ("done", 10)
            while worker._owned:  # the entity's task (and its heartbeat) has ended
                await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
    dispatcher.close()
    assert finished.is_set() and worker.completed == 1 and beats[0] == 1
    lost = [r.getMessage() for r in caplog.records if "lease lost" in r.getMessage()]
    assert lost == []


# -- batched claims ----------------------------------------------------------------------


def _leases(url: str) -> dict[str, tuple[str | None, int]]:
    import psycopg

    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT entity_id, owner, epoch FROM cantrip_leases").fetchall()
    return {e: (o, int(n)) for e, o, n in rows}


async def test_one_claim_takes_several_items_of_distinct_entities_under_valid_fences(
    pg_url: str,
) -> None:
    from cantrip.loom import Loom
    from cantrip.loom._model import EntityRecord, Turn

    loom = Loom.open(pg_url)
    queue = WorkQueue(loom.store)  # type: ignore[arg-type]
    # entity-a already has a turn, written under an earlier, finished claim (epoch 1)
    queue.enqueue({"factory": "x:y"}, "first", "entity-a")
    earlier = queue.claim("worker-0", lease_s=30)
    assert earlier is not None
    loom.hold("entity-a", earlier.fence)
    loom.register_entity(EntityRecord(entity_id="entity-a", cantrip_id="c"))
    turn = loom.append(
        Turn(id="t-a1", parent_id=None, entity_id="entity-a", cantrip_id="c", sequence=1)
    )
    await loom.sync("entity-a")
    loom.release("entity-a")
    assert queue.finish(earlier, "done", {})
    ids = {}
    for entity, intent in [("entity-a", "a2"), ("entity-b", "b1"), ("entity-a", "a3"),
                           ("entity-c", "c1"), ("entity-d", "d1")]:  # fmt: skip
        ids[intent] = queue.enqueue({"factory": "x:y"}, intent, entity)

    with pytest.raises(ValueError, match="at least one"):
        queue.claim_many("worker-1", 30, 0)
    two = queue.claim_many("worker-1", lease_s=30, limit=2)  # never more than asked
    assert [c.intent for c in two] == ["a2", "b1"]
    rest = queue.claim_many("worker-2", lease_s=30, limit=10)
    # a3 waits behind a2 (one item per entity at a time, in enqueue order)
    assert [c.intent for c in rest] == ["c1", "d1"]
    claims = two + rest
    assert len({c.entity_id for c in claims}) == 4
    assert [c.work_id for c in claims] == [ids["a2"], ids["b1"], ids["c1"], ids["d1"]]
    leases = _leases(pg_url)
    for c in claims:  # each fence is the lease as the database holds it
        assert leases[c.entity_id] == (c.fence.owner, c.fence.epoch)
        assert c.attempt == 1 and c.claim_latency_s >= 0
        assert queue.heartbeat(c.fence, 30) == (True, False)
    by_entity = {c.entity_id: c for c in claims}
    assert by_entity["entity-a"].fence.epoch == 2 and by_entity["entity-a"].base_turn == turn.id
    assert by_entity["entity-b"].fence.epoch == 1 and by_entity["entity-b"].base_turn is None
    # the fence of a batch-claimed item lets its worker write
    loom.hold("entity-a", by_entity["entity-a"].fence)
    loom.append(
        Turn(id="t-a2", parent_id=turn.id, entity_id="entity-a", cantrip_id="c", sequence=2)
    )
    await loom.sync("entity-a")
    loom.release("entity-a")
    assert queue.claim_many("worker-3", 30, 10) == []  # all taken, a3 still behind a2
    assert all(queue.finish(c, "done", {}) for c in claims)
    (a3,) = queue.claim_many("worker-3", 30, 10)
    assert (a3.intent, a3.fence.epoch, a3.base_turn) == ("a3", 3, "t-a2")
    loom.close()


async def test_two_workers_claiming_at_once_never_share_an_entity(pg_url: str) -> None:
    from cantrip.loom import Loom

    loom = Loom.open(pg_url)
    queue = WorkQueue(loom.store)  # type: ignore[arg-type]
    for i in range(60):
        queue.enqueue({"factory": "x:y"}, f"job-{i}", f"entity-{i % 40}")
    rounds = threading.Barrier(2)  # both claim in the same moment, round after round
    got: dict[str, list[Claim]] = {"w1": [], "w2": []}

    def claimer(owner: str) -> None:
        own = Loom.open(pg_url)
        mine = WorkQueue(own.store)  # type: ignore[arg-type]
        for _ in range(12):  # 40 entities, 3 a claim: both run dry within 12 rounds
            rounds.wait(timeout=30)
            got[owner].extend(mine.claim_many(owner, 30, 3))
        own.close()

    async with trio.open_nursery() as nursery:
        for owner in got:
            nursery.start_soon(trio.to_thread.run_sync, claimer, owner)
    entities = [c.entity_id for claims in got.values() for c in claims]
    assert len(entities) == len(set(entities)) == 40  # each entity's oldest item, once
    assert got["w1"] and got["w2"]
    leases = _leases(pg_url)
    for owner, claims in got.items():
        for c in claims:
            assert c.fence.owner == owner and leases[c.entity_id] == (owner, 1)
    loom.close()


async def test_a_worker_never_claims_more_than_its_free_slots(
    effects_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import psycopg

    monkeypatch.setenv("WORKLOAD_LATENCY_MS", "20")
    dispatcher = await trio.to_thread.run_sync(Dispatcher, effects_db)
    works = [
        (await trio.to_thread.run_sync(lambda i=i: dispatcher.submit(WORKLOAD, f"j{i}")))[0]
        for i in range(12)
    ]
    most: dict[str, int] = {}

    def running() -> dict[str, int]:
        with psycopg.connect(effects_db) as conn:
            rows = conn.execute(
                "SELECT owner, count(*) FROM cantrip_work WHERE state = 'running' GROUP BY 1"
            ).fetchall()
        return {o: int(n) for o, n in rows}

    async with trio.open_nursery() as nursery:
        for name, slots in [("small", 2), ("big", 3)]:
            await nursery.start(Worker(effects_db, concurrency=slots, worker_id=name).run)
        deadline = trio.current_time() + 120
        while True:
            assert trio.current_time() < deadline, "the casts did not finish"
            for owner, n in (await trio.to_thread.run_sync(running)).items():
                most[owner] = max(most.get(owner, 0), n)
            states = [
                await trio.to_thread.run_sync(lambda w=w: dispatcher.queue.status(w)[0])
                for w in works
            ]
            if all(s == "done" for s in states):
                break
            await trio.sleep(0.02)
        nursery.cancel_scope.cancel()
    dispatcher.close()
    assert most["small"] <= 2 and most["big"] <= 3
    assert most["small"] + most["big"] >= 4  # both ran casts side by side


async def test_heartbeats_do_not_queue_behind_the_looms_writes(
    effects_db: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Every thread slot of the loom's store held for 2.5 s (a flood of writes, a slow
    commit) mid-cast: the 1 s lease is still renewed, the cast waits and ends ``done`` on
    its first claim. (When the heartbeat went through the loom's pool and limiter, the
    lease ran out and the cast was stopped and claimed again.)"""
    import psycopg

    monkeypatch.setenv("WORKLOAD_LATENCY_MS", "50")
    dispatcher = await trio.to_thread.run_sync(Dispatcher, effects_db)
    with caplog.at_level(logging.INFO, logger="cantrip.worker"):
        async with trio.open_nursery() as nursery:
            worker = Worker(effects_db, concurrency=4, lease_s=1.0)
            await nursery.start(worker.run)
            work, entity = await trio.to_thread.run_sync(
                lambda: dispatcher.submit(WORKLOAD, "busy")
            )
            loom = Loom.open(effects_db)
            while len(await trio.to_thread.run_sync(loom.entity_turns, entity)) < 2:
                await trio.sleep(0.02)
            limiter = worker.loom.store.limiter  # type: ignore[attr-defined]
            holders = [object() for _ in range(int(limiter.total_tokens))]
            for holder in holders:
                await limiter.acquire_on_behalf_of(holder)
            await trio.sleep(2.5)  # 2.5 leases with no loom write getting through
            for holder in holders:
                limiter.release_on_behalf_of(holder)
            state, outcome = await trio.to_thread.run_sync(
                lambda: dispatcher.wait(work, timeout=30)
            )
            nursery.cancel_scope.cancel()
    dispatcher.close()
    loom.close()
    assert (state, outcome["turns"]) == ("done", 10)
    with psycopg.connect(effects_db) as conn:
        (attempts,) = conn.execute("SELECT attempts FROM cantrip_work WHERE id = %s", (work,))
    assert attempts == (1,)
    assert not [r for r in caplog.records if "lease" in r.getMessage()]


async def test_a_retried_submit_or_answer_whose_first_try_committed_is_not_doubled(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The connection breaks after the statement committed, before its reply: the retry
    finds the work the first try queued (and the answer it recorded) instead of doing it
    twice."""
    import psycopg

    from cantrip._approval import Decision, Pause, PauseError

    dispatcher = await trio.to_thread.run_sync(Dispatcher, pg_url)
    queue = dispatcher.queue
    real_enqueue, real_answer = queue.enqueue, queue.answer
    broken: list[str] = []

    def enqueue_then_break(*args: Any) -> int:
        work = real_enqueue(*args)
        if not broken:
            broken.append("submit")
            raise psycopg.OperationalError("the connection is lost")
        return work

    monkeypatch.setattr(queue, "enqueue", enqueue_then_break)
    work, entity = await trio.to_thread.run_sync(lambda: dispatcher.submit({"x": 1}, "once"))
    with psycopg.connect(pg_url) as conn:
        rows = conn.execute("SELECT id FROM cantrip_work WHERE entity_id = %s", (entity,))
        assert [r[0] for r in rows] == [work]
    # the work pauses for a human; the answer's reply is lost after it committed
    (claim,) = queue.claim_many("w", 30, 1)
    pause = Pause("p-1", entity, "approval", "charge", {"amount": 1})
    assert queue.finish(claim, "paused", {"pending": [pause.to_dict()], "entity_id": entity})

    def answer_then_break(*args: Any) -> Any:
        answered = real_answer(*args)
        if len(broken) == 1:
            broken.append("answer")
            raise psycopg.OperationalError("the connection is lost")
        return answered

    monkeypatch.setattr(queue, "answer", answer_then_break)
    carried = await trio.to_thread.run_sync(
        lambda: dispatcher.answer(entity, "p-1", Decision.approve())
    )
    assert broken == ["submit", "answer"]
    with psycopg.connect(pg_url) as conn:
        rows = conn.execute(
            "SELECT id FROM cantrip_work WHERE entity_id = %s ORDER BY id", (entity,)
        ).fetchall()
    assert [r[0] for r in rows] == [work, carried]  # one answer, carried out once
    with pytest.raises(PauseError, match="already answered"):  # another answer still loses
        await trio.to_thread.run_sync(lambda: dispatcher.answer(entity, "p-1", Decision.deny("no")))
    dispatcher.close()
