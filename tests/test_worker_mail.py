"""A worker looks for messages whose NOTIFY it missed with one statement for all its
casts, not one per cast (issue 46.4: at 1,000 casts, a poll each every ``poll_s`` was
more statements than their turns), and such a message still reaches its cast; a cast's
first read of its messages rides on the thread hop that refreshes its entity.

A real PostgreSQL (tests/conftest.py), a worker in this process and the chaos workload
(tests/distributed_workload.py)."""

from __future__ import annotations

import traceback
from typing import Any

import distributed_workload
import psycopg
import pytest
import trio
from distributed_workload import EFFECTS_TABLE

from cantrip.distributed._dispatcher import Dispatcher
from cantrip.distributed._queue import WorkQueue
from cantrip.distributed._spells import spell_from_factory
from cantrip.distributed._worker import Worker
from cantrip.loom import Loom

WORKLOAD = spell_from_factory("distributed_workload:build")
CASTS = 6


@pytest.fixture
def db(pg_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(EFFECTS_TABLE)
    Loom.open(pg_url).close()
    monkeypatch.setenv("CANTRIP_TEST_DB", pg_url)
    monkeypatch.setenv("WORKLOAD_LATENCY_MS", "150")
    monkeypatch.setenv("WORKLOAD_TURNS", "8")
    monkeypatch.setattr(distributed_workload, "_connection", None)
    return pg_url


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[Any]]:
    """Every read of a cast's messages (work id, what it found) and every poll (the
    work ids it asked about), as the worker makes them."""
    seen: dict[str, list[Any]] = {"messages": [], "polls": [], "with_refresh": []}
    messages, newest = WorkQueue.messages, WorkQueue.newest_messages

    def counted_messages(self: WorkQueue, work_id: int, after: int = 0) -> Any:
        found = messages(self, work_id, after)
        seen["messages"].append((work_id, found))
        with_refresh = any(f.name == "look" for f in traceback.extract_stack())
        seen["with_refresh"].append((work_id, with_refresh))
        return found

    def counted_newest(self: WorkQueue, work_ids: Any) -> Any:
        seen["polls"].append(list(work_ids))
        return newest(self, work_ids)

    monkeypatch.setattr(WorkQueue, "messages", counted_messages)
    monkeypatch.setattr(WorkQueue, "newest_messages", counted_newest)
    return seen


async def test_one_poll_for_all_casts_and_a_message_without_notify_still_arrives(
    db: str, reads: dict[str, list[Any]]
) -> None:
    dispatcher = await trio.to_thread.run_sync(Dispatcher, db)
    async with trio.open_nursery() as nursery:
        worker = Worker(db, concurrency=CASTS, poll_s=0.05)
        await nursery.start(worker.run)
        queued = await trio.to_thread.run_sync(
            lambda: dispatcher.submit_many(WORKLOAD, [f"job-{i}" for i in range(CASTS)])
        )
        (work_id, entity_id) = queued[0]
        with psycopg.connect(db, autocommit=True) as conn:
            with trio.fail_after(60):  # the first cast runs: its mailbox has read once
                while not any(w == work_id for w, _ in reads["messages"]):
                    await trio.sleep(0.01)
            # a message whose NOTIFY never came (inserted without one)
            conn.execute(
                "INSERT INTO cantrip_messages (entity_id, work_id, text) "
                "VALUES (%s, %s, 'Use metric.')",
                (entity_id, work_id),
            )
        with trio.fail_after(60):  # the poll finds it and the cast's mailbox reads it
            while not any(w == work_id and found for w, found in reads["messages"]):
                await trio.sleep(0.01)
        for work, _ in queued:
            state, _ = await trio.to_thread.run_sync(lambda w=work: dispatcher.wait(w, timeout=60))
            assert state == "done"
        nursery.cancel_scope.cancel()
    dispatcher.close()
    per_cast = [sum(1 for w, _ in reads["messages"] if w == work) for work, _ in queued]
    # one read as each cast began; the one a message was sent to, one more for it
    assert per_cast == [2] + [1] * (CASTS - 1), per_cast
    firsts = {w: r for w, r in reversed(reads["with_refresh"])}
    # each cast's first read is made in the thread hop that refreshes its entity
    assert firsts == {work: True for work, _ in queued}, firsts
    assert len(reads["polls"]) >= 2  # polled while the casts ran (8 turns x 150 ms)
    assert max(len(p) for p in reads["polls"]) > 1  # one statement asked for several casts
