"""The fence locks a worker takes stay within PostgreSQL's lock table, whatever it holds.

Every fence lock (schema 6's advisory lock per entity) is an entry in the server's shared
lock table -- ``max_locks_per_transaction`` x (``max_connections`` +
``max_prepared_transactions``) entries for everyone -- kept to its transaction's end.
A claim, a heartbeat and a reclaim each took one per entity in ONE transaction, so a
worker holding more leases than the table has room for failed every beat ("out of
shared memory": its leases all ran out) and could not claim or reclaim that many. Here
the cluster's table is made small (``max_locks_per_transaction = 10``, the minimum, x 20
connections: a few hundred entries) and a worker holds thousands of leases."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
import trio
from pg_cluster import fresh_database, postgres_cluster

from cantrip.distributed._queue import WorkQueue
from cantrip.distributed._renewal import FENCE_CHUNK, heartbeat_on
from cantrip.distributed._work import Claim
from cantrip.loom import EntityRecord, Loom, Turn
from cantrip.loom._postgres import PostgresStore

LEASES = 2000
"""Several times what the small lock table holds (measured: 400 locks fit in one
transaction, 800 do not), and several chunks."""


@pytest.fixture(scope="module")
def small_lock_table() -> Iterator[str]:
    with postgres_cluster("-c max_locks_per_transaction=10 -c max_connections=20") as url:
        yield url


@pytest.fixture
def store(small_lock_table: str) -> Iterator[PostgresStore]:
    store = PostgresStore(fresh_database(small_lock_table, "locks"), max_connections=2)
    yield store
    store.close()


def test_the_lock_table_is_smaller_than_what_the_worker_holds(store: PostgresStore) -> None:
    """The premise: one transaction cannot take a fence lock per lease here."""
    with (
        psycopg.connect(store.url) as conn,
        pytest.raises(psycopg.errors.OutOfMemory, match="max_locks_per_transaction"),
    ):
        conn.execute(
            "SELECT count(cantrip_fence_take('e' || i)) FROM generate_series(1, %s) i", (LEASES,)
        )
    assert FENCE_CHUNK * 2 < LEASES


def _queue(store: PostgresStore) -> WorkQueue:
    queue = WorkQueue(store)
    queue.enqueue_many({"factory": "x:y"}, [(f"entity-{i}", "go") for i in range(LEASES)])
    return queue


def _held(queue: WorkQueue, owner: str) -> list[Claim]:
    """Every queued item claimed by ``owner``, 200 at a time (within the table)."""
    claims: list[Claim] = []
    while got := queue.claim_many(owner, 60, 200):
        claims.extend(got)
    assert len(claims) == LEASES
    return claims


def test_a_claim_for_more_slots_than_the_lock_table_holds_takes_them_all(
    store: PostgresStore,
) -> None:
    queue = _queue(store)
    claims = queue.claim_many("worker-1", 60, LEASES + 5)  # before: out of shared memory
    assert len(claims) == LEASES
    assert len({c.entity_id for c in claims}) == LEASES
    assert [c.work_id for c in claims] == sorted(c.work_id for c in claims)  # oldest first
    assert queue.claim_many("worker-2", 60, 10) == []  # all taken, each once


def test_a_heartbeat_of_more_leases_than_the_lock_table_holds_renews_them_all(
    store: PostgresStore,
) -> None:
    queue = _queue(store)
    claims = _held(queue, "worker-1")
    with psycopg.connect(store.url, autocommit=True) as conn:
        before = conn.execute("SELECT min(expires_at) FROM cantrip_leases").fetchone()
        renewed = heartbeat_on(conn, "worker-1", [c.fence for c in claims], 120)
        after = conn.execute("SELECT min(expires_at) FROM cantrip_leases").fetchone()
    assert renewed == {c.entity_id: "" for c in claims}  # before: out of shared memory
    assert before is not None and after is not None and after[0] > before[0]


def test_a_reclaim_of_more_leases_than_the_lock_table_holds_expires_them_all(
    store: PostgresStore,
) -> None:
    queue = _queue(store)
    _held(queue, "worker-1")
    assert queue.reclaim("worker-1") == LEASES  # before: out of shared memory
    resumed = _held(queue, "worker-1")  # taken back at once, at a new epoch
    assert {(c.resumed, c.fence.epoch, c.attempt) for c in resumed} == {(True, 2, 1)}


def _fenced_turns(loom: Loom, claims: list[Claim]) -> None:
    """A first turn of each claimed entity, queued under its claim's fence."""
    for claim in claims:
        loom.hold(claim.entity_id, claim.fence)
        loom.register_entity(EntityRecord(entity_id=claim.entity_id, cantrip_id="c"))
        loom.append(
            Turn(
                id=f"turn-{claim.entity_id}", parent_id=None, entity_id=claim.entity_id, sequence=1
            )
        )


def _turn_count(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT count(*) FROM cantrip_turns").fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.parametrize("how", ["sync", "close"])
def test_the_writes_of_more_entities_than_the_lock_table_holds_are_all_committed(
    store: PostgresStore, how: str
) -> None:
    """The loom's group commit writes a batch in one transaction, one fence lock per
    entity in it: a worker whose 2,000 casts all wrote at once (or a loom closed with
    their writes queued) failed the commit -- "out of shared memory" -- with batches
    unbounded. They go ``max_batch`` writes a transaction now (:data:`MAX_BATCH` on a
    real server; here a size this small table holds)."""
    claims = _held(_queue(store), "worker-1")
    loom = Loom(PostgresStore(store.url, max_connections=2, max_batch=FENCE_CHUNK))
    try:
        _fenced_turns(loom, claims)
        if how == "sync":
            trio.run(loom.sync)
    finally:
        loom.close()
    assert _turn_count(store.url) == LEASES


def test_a_store_refuses_a_batch_bound_below_one(store: PostgresStore) -> None:
    with pytest.raises(ValueError, match="max_batch must be at least 1, not 0"):
        PostgresStore(store.url, max_batch=0)
