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
from typing import Any

import pytest
import trio
from distributed_workload import EFFECTS_TABLE

import cantrip._worker
from cantrip._queue import Claim, WorkQueue
from cantrip._worker import Dispatcher, Worker, spell_from_factory
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

    class LateHeartbeat(WorkQueue):
        """The race of a fast cast, made certain: the heartbeat's statement runs only
        after ``finish`` has released the lease."""

        def heartbeat(self, fence: Fence, lease_s: float) -> tuple[bool, bool]:
            finished.wait(timeout=20)
            return super().heartbeat(fence, lease_s)

        def finish(self, claim: Claim, state: str, outcome: dict[str, Any]) -> bool:
            try:
                return super().finish(claim, state, outcome)
            finally:
                finished.set()

    monkeypatch.setattr(cantrip._worker, "WorkQueue", LateHeartbeat)
    dispatcher = await trio.to_thread.run_sync(Dispatcher, effects_db)
    with caplog.at_level(logging.INFO, logger="cantrip.worker"):
        async with trio.open_nursery() as nursery:
            worker = Worker(effects_db, concurrency=4)
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
    assert finished.is_set() and worker.completed == 1
    lost = [r.getMessage() for r in caplog.records if "lease lost" in r.getMessage()]
    assert lost == []
