"""Renewing leases without row locks (issue 46.2): a heartbeat renews each lease under
its entity's fence lock taken shared, never waiting, instead of ``FOR UPDATE SKIP
LOCKED`` (a WAL record per lease per beat); a claim in flight (that lock held
exclusively) makes the beat skip the entity, and ``reclaim`` changes a lease only under
that lock, as a claim does. A real PostgreSQL (tests/conftest.py)."""

from __future__ import annotations

import threading

import psycopg
import pytest

from cantrip.distributed._queue import WorkQueue
from cantrip.distributed._renewal import heartbeat_on
from cantrip.distributed._work import Claim
from cantrip.loom._postgres import PostgresStore


@pytest.fixture
def store(pg_url: str) -> PostgresStore:
    store = PostgresStore(pg_url)
    yield store  # type: ignore[misc]
    store.close()


def _claim(store: PostgresStore, entity_id: str, owner: str = "worker-1") -> Claim:
    queue = WorkQueue(store)
    queue.enqueue({"factory": "x:y"}, "go", entity_id)
    claim = queue.claim(owner, lease_s=30)
    assert claim is not None and claim.entity_id == entity_id
    return claim


def _expires(url: str, entity_id: str) -> object:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT expires_at FROM cantrip_leases WHERE entity_id = %s", (entity_id,)
        ).fetchone()
    assert row is not None
    return row[0]


def test_a_heartbeat_writes_no_row_lock_record(pg_url: str, store: PostgresStore) -> None:
    claims = [_claim(store, f"beat-{i}") for i in range(3)]
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
        leases = conn.execute("SELECT pg_relation_filenode('cantrip_leases')::text").fetchone()
        assert leases is not None
        conn.execute("SET synchronous_commit = on")  # its commit flushes what it wrote
        (start,) = conn.execute("SELECT pg_current_wal_insert_lsn()").fetchone() or (None,)
        renewed = heartbeat_on(conn, "worker-1", [c.fence for c in claims], 60)
        (end,) = conn.execute("SELECT pg_current_wal_flush_lsn()").fetchone() or (None,)
        records = conn.execute(
            "SELECT record_type FROM pg_get_wal_records_info(%s, %s) "
            "WHERE resource_manager = 'Heap' AND block_ref LIKE %s",
            (start, end, f"%/{leases[0]} %"),
        ).fetchall()
    assert renewed == {c.fence.lease_entity: "" for c in claims}
    kinds = [kind for (kind,) in records]
    assert len(kinds) == 3 and all("UPDATE" in k for k in kinds), kinds  # the renewals only
    assert not any("LOCK" in k for k in kinds), kinds  # before: a LOCK record per lease


def test_a_heartbeat_skips_an_entity_a_claim_is_taking(pg_url: str, store: PostgresStore) -> None:
    """An entity whose fence lock a claim holds (exclusively, to its commit) is skipped --
    neither renewed nor reported lost -- at once, without waiting for the claim; the
    others are renewed."""
    taking, free = _claim(store, "taking"), _claim(store, "free")
    before = _expires(pg_url, "taking")
    with psycopg.connect(pg_url) as claim, psycopg.connect(pg_url, autocommit=True) as beat:
        taken = claim.execute("SELECT cantrip_fence_take('taking')").fetchone()
        assert taken == (True,)
        beat.execute("SET statement_timeout = '20s'")  # a beat that waited would fail here
        renewed = heartbeat_on(beat, "worker-1", [taking.fence, free.fence], 60)
        claim.rollback()
    assert renewed == {"taking": None, "free": ""}
    assert _expires(pg_url, "taking") == before  # not renewed under the claim
    assert heartbeat_on_once(pg_url, taking) == {"taking": ""}  # the next beat renews it


def heartbeat_on_once(url: str, claim: Claim) -> dict[str, str | None]:
    with psycopg.connect(url, autocommit=True) as conn:
        return heartbeat_on(conn, claim.fence.owner, [claim.fence], 60)


def test_reclaim_waits_for_a_write_in_flight_then_expires_the_lease(
    pg_url: str, store: PostgresStore
) -> None:
    """A worker restarted under its identity expires the old leases under their fence
    lock: one whose write (the old process's) is in flight is expired once that write
    committed -- the others at once, in the first statement."""
    writing, idle = _claim(store, "writing"), _claim(store, "idle")
    queue = WorkQueue(store)
    expired: list[int] = []
    with psycopg.connect(pg_url) as write, psycopg.connect(pg_url, autocommit=True) as mon:
        held = write.execute(
            "SELECT cantrip_fence_holds(%s, %s, %s)",
            (writing.fence.lease_entity, writing.fence.owner, writing.fence.epoch),
        ).fetchone()
        assert held == (True,)
        reclaimer = threading.Thread(target=lambda: expired.append(queue.reclaim("worker-1")))
        reclaimer.start()
        # the reclaim waits for the write's fence lock: seen in pg_locks, not guessed
        while True:
            row = mon.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
            ).fetchone()
            if row is not None and row[0] >= 1:
                break
            assert reclaimer.is_alive(), "reclaim did not wait for the write in flight"
        with psycopg.connect(pg_url) as look:  # the idle lease is expired already
            live = look.execute(
                "SELECT entity_id FROM cantrip_leases WHERE expires_at > clock_timestamp()"
            ).fetchall()
        assert live == [("writing",)]
        write.commit()
        reclaimer.join(30)
    assert expired == [2]
    assert idle.fence.epoch == 1
    assert WorkQueue(store).claim("worker-1", lease_s=30) is not None  # takeable at once
