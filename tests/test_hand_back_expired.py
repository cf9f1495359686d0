"""A cast handed back after its lease ran out, before any claim reaped it, is still handed
back (``WorkQueue.hand_back``): its next claim costs no attempt and counts no crash; one
that ended then still records its outcome (``WorkQueue.finish``). A worker's heartbeat
stops renewing a cast it is settling, so a hand-back or finish that waits (a busy thread
limiter, a slow database) can come after the lease's expiry. Before, it was refused, the
next claim reaped the row as a crash -- and a cast held alone (a one-slot worker's, a
quarantined one) was charged an attempt, so at the attempt limit a cast its worker
stopped on purpose, or had ended, was dead-lettered. Fenced: once another claim reaped
or took the cast, a hand-back or finish changes nothing. A real PostgreSQL
(tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from cantrip.distributed._queue import WorkQueue
from cantrip.distributed._work import Claim
from cantrip.loom._postgres import PostgresStore


@pytest.fixture
def queue(pg_url: str) -> Iterator[WorkQueue]:
    store = PostgresStore(pg_url, max_connections=2)
    yield WorkQueue(store)
    store.close()


def _expire(queue: WorkQueue, claim: Claim) -> None:
    """The lease runs out (no heartbeat renewed it): what a second of waiting does."""
    with queue.store.pool.connection() as conn:
        conn.execute(
            "UPDATE cantrip_leases SET expires_at = clock_timestamp() - interval '1 second' "
            "WHERE entity_id = %s",
            (claim.entity_id,),
        )


def _row(queue: WorkQueue) -> dict[str, Any]:
    with queue.store.pool.connection() as conn:
        row = conn.execute(
            "SELECT w.state, w.owner, w.attempts, w.crashes, w.spare, l.owner, l.epoch "
            "FROM cantrip_work w JOIN cantrip_leases l ON l.entity_id = w.entity_id"
        ).fetchone()
    assert row is not None
    keys = ("state", "owner", "attempts", "crashes", "spare", "holder", "epoch")
    return dict(zip(keys, row, strict=True))


def test_a_cast_whose_lease_ran_out_is_still_handed_back_and_resumed_free(
    queue: WorkQueue, pg_url: str
) -> None:
    """A one-slot worker's cast (held alone) at the attempt limit: before, it was
    dead-lettered by the next claim."""
    queue.enqueue({"factory": "m:f"}, "kept", "entity-a")
    (first,) = queue.claim_many("stopping", 30, 1, max_attempts=1, one_slot=True)
    _expire(queue, first)
    with psycopg.connect(pg_url, autocommit=True) as listener:
        listener.execute("LISTEN cantrip_work")
        assert queue.hand_back(first)  # before: refused (the lease had run out)
        woken = [n.payload for n in listener.notifies(timeout=5, stop_after=1)]
    assert woken == ["entity-a"]  # the other workers are told at once
    assert _row(queue) == {
        "state": "running",
        "owner": None,
        "attempts": 1,
        "crashes": 0,
        "spare": True,
        "holder": None,
        "epoch": 1,
    }
    (second,) = queue.claim_many("next", 30, 1, max_attempts=1)  # before: dead-lettered
    assert (second.attempt, second.resumed, second.fence.epoch) == (1, True, 2)
    assert _row(queue)["crashes"] == 0
    assert queue.dead_letters() == []


def test_a_hand_back_after_another_claim_took_the_cast_changes_nothing(
    queue: WorkQueue,
) -> None:
    queue.enqueue({"factory": "m:f"}, "kept", "entity-a")
    (first,) = queue.claim_many("stopping", 30, 1)
    _expire(queue, first)
    (second,) = queue.claim_many("next", 30, 1)  # reaps the run-out lease, takes the cast
    before = _row(queue)
    assert (before["owner"], before["holder"], before["epoch"]) == ("next", "next", 2)
    assert not queue.hand_back(first)
    assert _row(queue) == before
    assert queue.heartbeat(second.fence, 30) == (True, False)  # the new claim holds on


def test_a_hand_back_after_the_reaping_came_first_is_not_taken_for_a_fault(
    queue: WorkQueue,
) -> None:
    """A claim that reaped the run-out lease but did not take the cast (its worker runs
    the entity still: ``busy``) accounted a crash, next claim free; a hand-back after it
    changes nothing -- in particular it does not release the lease beside a reaped row,
    which the reaping would read as a run given up on a fault (an attempt charged)."""
    queue.enqueue({"factory": "m:f"}, "kept", "entity-a")
    (first,) = queue.claim_many("stopping", 30, 1, max_attempts=1)
    _expire(queue, first)
    assert queue.claim_many("other", 30, 1, busy=["entity-a"]) == []  # reaped, not taken
    reaped = _row(queue)
    assert (reaped["owner"], reaped["crashes"], reaped["spare"]) == (None, 1, True)
    assert not queue.hand_back(first)
    assert _row(queue) == reaped
    (second,) = queue.claim_many("next", 30, 1, max_attempts=1)
    assert (second.attempt, second.resumed) == (1, True)


def test_a_cast_that_ended_after_its_lease_ran_out_still_records_its_outcome(
    queue: WorkQueue, pg_url: str
) -> None:
    """``finish`` settles the row the same way: a one-slot worker's cast that ended while
    its lease ran out (its finish waited) is recorded ``done`` -- before, the finish was
    refused and the next claim dead-lettered the cast it had just ended."""
    queue.enqueue({"factory": "m:f"}, "kept", "entity-a")
    (first,) = queue.claim_many("ending", 30, 1, max_attempts=1, one_slot=True)
    _expire(queue, first)
    with psycopg.connect(pg_url, autocommit=True) as listener:
        listener.execute("LISTEN cantrip_work")
        assert queue.finish(first, "done", {"answer": "ok"})  # before: refused
        woken = [n.payload for n in listener.notifies(timeout=5, stop_after=1)]
    assert woken == ["entity-a"]
    assert queue.status(first.work_id) == ("done", {"answer": "ok"})
    row = _row(queue)
    assert (row["holder"], row["crashes"], row["attempts"]) == (None, 0, 1)
    assert queue.claim_many("next", 30, 1, max_attempts=1) == []  # nothing left to run
    assert queue.dead_letters() == []


def test_a_finish_after_another_claim_took_the_cast_records_nothing(queue: WorkQueue) -> None:
    queue.enqueue({"factory": "m:f"}, "kept", "entity-a")
    (first,) = queue.claim_many("zombie", 30, 1)
    _expire(queue, first)
    (second,) = queue.claim_many("next", 30, 1)
    assert not queue.finish(first, "done", {"answer": "stale"})
    assert queue.status(first.work_id)[0] == "running"
    assert queue.finish(second, "done", {"answer": "ok"})
    assert queue.status(first.work_id) == ("done", {"answer": "ok"})
