"""What a worker does per cast and per turn that costs it CPU and does not need to (issue
46.4), on a real PostgreSQL (tests/conftest.py) with the distributed workload: a gate
result the group commit drops (its turn, in the same commit, holds it) is never
encoded, a cast's spell key is made once, and a worker of any concurrency opens a
bounded number of database connections."""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import distributed_workload
import psycopg
import pytest
import trio
from distributed_workload import EFFECTS_TABLE

from cantrip import _journal
from cantrip.distributed import _execution
from cantrip.distributed._dispatcher import Dispatcher
from cantrip.distributed._queue import WorkQueue
from cantrip.distributed._spells import spell_from_factory
from cantrip.distributed._work import WORK_CHANNEL, Claim
from cantrip.distributed._worker import DB_CONNECTIONS, Worker
from cantrip.loom import Loom

WORKLOAD = spell_from_factory("distributed_workload:build")
CASTS = 4
TURNS = 3  # two ``charge`` calls per cast, then ``done``


@pytest.fixture
def db(pg_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(EFFECTS_TABLE)
    Loom.open(pg_url).close()
    monkeypatch.setenv("CANTRIP_TEST_DB", pg_url)
    monkeypatch.setenv("WORKLOAD_TURNS", str(TURNS))
    monkeypatch.setattr(distributed_workload, "_connection", None)
    return pg_url


async def _run_casts(
    db: str,
    casts: int = CASTS,
    *,
    meanwhile: Callable[[Worker], Awaitable[None]] | None = None,
    at_end: Callable[[Worker], None] | None = None,
) -> Worker:
    """Run ``casts`` workload casts on one worker, each to ``done``: ``meanwhile`` runs once
    they are queued, ``at_end`` once all are done, before the worker stops."""
    dispatcher = await trio.to_thread.run_sync(Dispatcher, db)
    try:
        async with trio.open_nursery() as nursery:
            worker = Worker(db, concurrency=casts, poll_s=0.05)
            await nursery.start(worker.run)
            queued = await trio.to_thread.run_sync(
                lambda: dispatcher.submit_many(WORKLOAD, [f"job-{i}" for i in range(casts)])
            )
            if meanwhile is not None:
                await meanwhile(worker)
            for work, _ in queued:
                state, _ = await trio.to_thread.run_sync(
                    lambda w=work: dispatcher.wait(w, timeout=120)
                )
                assert state == "done"
            if at_end is not None:
                at_end(worker)
            nursery.cancel_scope.cancel()
    finally:
        dispatcher.close()
    return worker


async def test_a_gate_result_is_encoded_only_when_it_is_written(
    db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    encoded: list[Any] = []
    dumps = _journal._dumps

    def counted(value: Any) -> str:
        if isinstance(value, dict) and "result" in value:  # a gate call's record
            encoded.append(value)
        return dumps(value)

    monkeypatch.setattr(_journal, "_dumps", counted)
    await _run_casts(db)
    with psycopg.connect(db) as conn:
        (written,) = conn.execute(
            "SELECT count(*) FROM cantrip_journal WHERE ordinal >= 0 AND record IS NOT NULL"
        ).fetchone() or (None,)
        (effects,) = conn.execute("SELECT count(*) FROM chaos_effects").fetchone() or (None,)
    assert effects == CASTS * (TURNS - 1)  # every call ran, once
    # a result goes to the journal only when its turn was not in the same commit; only
    # those were encoded (before: every result, whether written or dropped)
    assert len(encoded) == written, (len(encoded), written)
    assert written < effects


async def test_a_casts_spell_key_is_made_once(db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    keyed: list[dict[str, Any]] = []
    spell_key = _execution.spell_key

    def counted(spell: dict[str, Any]) -> str:
        keyed.append(spell)
        return spell_key(spell)

    monkeypatch.setattr(_execution, "spell_key", counted)
    await _run_casts(db)
    assert len(keyed) == CASTS  # before: twice per cast (asks_humans, then the attempt)


async def test_a_busy_worker_opens_a_bounded_number_of_connections(db: str) -> None:
    # 200 casts at once: their first reads come together, and the pool grows to what
    # they ask for -- before, up to half the concurrency (100 connections and as many
    # threads, each costing both processes CPU); now at most DB_CONNECTIONS
    casts = 200
    stats: dict[str, int] = {}

    def pool_stats(worker: Worker) -> None:
        stats.update(worker.loom.store.pool.get_stats())  # type: ignore[attr-defined]

    worker = await _run_casts(db, casts, at_end=pool_stats)
    assert worker.completed == casts
    assert stats["connections_num"] <= DB_CONNECTIONS, stats
    assert stats["pool_max"] == DB_CONNECTIONS


async def test_the_listen_waits_for_notifications_without_thread_hops(
    db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the worker's LISTEN: before, a thread hop per notification (and one every 0.25 s
    # when idle); now the socket is waited on in trio. A cast is still claimed on its
    # NOTIFY alone (poll_s 60: the claim loop's own look would come too late)
    listen_hops: list[str] = []
    run_sync = trio.to_thread.run_sync

    async def counted(fn: Any, *args: Any, **kwargs: Any) -> Any:
        if "_listen" in trio.lowlevel.current_task().name:
            listen_hops.append(getattr(fn, "__qualname__", repr(fn)))
        return await run_sync(fn, *args, **kwargs)

    monkeypatch.setattr(trio.to_thread, "run_sync", counted)
    dispatcher = await run_sync(Dispatcher, db)
    try:
        async with trio.open_nursery() as nursery:
            worker = Worker(db, concurrency=2, poll_s=60)
            await nursery.start(worker.run)

            def notify_many() -> None:
                with psycopg.connect(db, autocommit=True) as conn:
                    for i in range(20):
                        conn.execute("SELECT pg_notify(%s, %s)", (WORK_CHANNEL, f"nobody-{i}"))

            await run_sync(notify_many)
            [(work, _)] = await run_sync(lambda: dispatcher.submit_many(WORKLOAD, ["job-n"]))
            with trio.fail_after(30):
                state, _ = await run_sync(lambda: dispatcher.wait(work, timeout=30))
            assert state == "done"
            running = list(listen_hops)  # (its connection is closed in a hop as it ends)
            nursery.cancel_scope.cancel()
    finally:
        dispatcher.close()
    # connecting and the LISTEN, nothing more (before: a hop per notification at least)
    assert len(running) == 2, running


async def _casts_ending_together(
    db: str, monkeypatch: pytest.MonkeyPatch, *, fail_batches: bool
) -> tuple[list[int], Worker]:
    """CASTS casts, the first outcome's recording held until every other cast's end is
    queued behind it (the race made certain): the sizes of the batches recorded."""
    sizes: list[int] = []
    release = threading.Event()
    finish_many = WorkQueue.finish_many

    def held(self: WorkQueue, ended: Sequence[tuple[Claim, str, dict[str, Any]]]) -> list[bool]:
        sizes.append(len(ended))
        if len(sizes) == 1:
            release.wait(timeout=30)
        if fail_batches and len(ended) > 1:
            raise psycopg.OperationalError("the batch's connection was lost")
        return finish_many(self, ended)

    monkeypatch.setattr(WorkQueue, "finish_many", held)

    async def release_once_the_rest_wait(worker: Worker) -> None:
        with trio.fail_after(60):
            while len(worker._endings.pending) < CASTS - 1:
                await trio.sleep(0.01)
        release.set()

    try:
        worker = await _run_casts(db, meanwhile=release_once_the_rest_wait)
    finally:
        release.set()
    return sizes, worker


async def test_casts_that_end_together_share_one_commit(
    db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # before: one thread hop and one commit per cast's outcome
    sizes, worker = await _casts_ending_together(db, monkeypatch, fail_batches=False)
    assert sizes == [1, CASTS - 1]
    assert worker.completed == CASTS


async def test_a_batch_of_outcomes_that_fails_is_recorded_one_by_one(
    db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    sizes, worker = await _casts_ending_together(db, monkeypatch, fail_batches=True)
    # the batch of three failed: each of its casts recorded its own end
    assert sizes == [1, CASTS - 1, 1, 1, 1]
    assert worker.completed == CASTS


async def test_casts_claimed_together_look_themselves_up_in_one_hop(
    db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # each cast's entity refresh and first mail read: before, a thread hop per cast
    hops: list[str] = []
    run_sync = trio.to_thread.run_sync

    async def counted(fn: Any, *args: Any, **kwargs: Any) -> Any:
        hops.append(getattr(fn, "__qualname__", repr(fn)))
        return await run_sync(fn, *args, **kwargs)

    monkeypatch.setattr(trio.to_thread, "run_sync", counted)
    await _run_casts(db)
    looks = [h for h in hops if "look" in h or "refresh" in h]
    assert looks == ["Execution.look_many"], looks  # the CASTS casts were claimed at once
