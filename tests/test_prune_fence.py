"""Prune goes by the fence rule claims go by (schema 6): it deletes an entity only holding
its fence lock exclusively, taken without waiting, so a loom write in flight under the
entity's lease (which holds that lock shared from its fence check to its commit) keeps
the tree -- reported as running -- instead of being deleted under it. A real
PostgreSQL (tests/conftest.py)."""

from __future__ import annotations

import threading

import psycopg
import pytest
import trio
from test_retention import greeter

from cantrip import Loom
from cantrip.distributed._queue import WorkQueue
from cantrip.loom._postgres import PostgresStore
from cantrip.loom._postgres_retention import WRITING
from cantrip.loom._retention import Pruned, prune


def _prune_in_a_thread(url: str, entity_id: str) -> Pruned:
    """Prune ``entity_id``'s tree from a connection of its own; it must not wait on the
    write holding the fence (the write's transaction is this test's, still open)."""
    done: list[Pruned] = []

    def run() -> None:
        loom = Loom.open(url)
        try:
            done.append(prune(loom, entity=entity_id, busy_s=0, reclaim=False))
        finally:
            loom.close()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(60)
    assert not thread.is_alive(), "prune waited for the write in flight"
    assert done, "prune failed (see the thread's traceback above)"
    return done[0]


async def test_prune_keeps_an_entity_while_a_write_under_its_fence_is_in_flight(
    pg_url: str,
) -> None:
    loom = Loom.open(pg_url)
    entity_id = (await greeter(loom).cast_async("first")).entity_id
    loom.close()
    store = PostgresStore(pg_url)
    queue = WorkQueue(store)
    queue.enqueue({"factory": "x:y"}, "again", entity_id)
    claim = queue.claim("worker-1", lease_s=30)
    assert claim is not None and claim.entity_id == entity_id
    fence = claim.fence
    with psycopg.connect(pg_url) as write:
        # a fenced write: its fence check passed (the lock held shared to its commit) ...
        held = write.execute(
            "SELECT cantrip_fence_holds(%s, %s, %s)", (fence.lease_entity, fence.owner, fence.epoch)
        ).fetchone()
        assert held == (True,)
        # ... and before it commits, its lease runs out and the work is dead-lettered:
        # nothing open, no live lease -- only the fence lock says a write is in flight
        with psycopg.connect(pg_url, autocommit=True) as other:
            other.execute(
                "UPDATE cantrip_leases SET expires_at = clock_timestamp() - interval '1 s' "
                "WHERE entity_id = %s",
                (entity_id,),
            )
            other.execute(
                "UPDATE cantrip_work SET state = 'dead', owner = NULL WHERE entity_id = %s",
                (entity_id,),
            )
        kept = await trio.to_thread.run_sync(_prune_in_a_thread, pg_url, entity_id)
        assert kept.plan.roots == ()  # before: the tree was deleted under the write
        assert dict(kept.plan.kept) == {entity_id: WRITING}
        write.execute(
            "INSERT INTO cantrip_turns (id, parent_id, entity_id, sequence, data) "
            "VALUES ('late-turn', NULL, %s, 99, '{}')",
            (entity_id,),
        )
        write.commit()  # the write lands: on an entity that is still there
    with psycopg.connect(pg_url) as look:
        entity = look.execute(
            "SELECT count(*) FROM cantrip_entities WHERE entity_id = %s", (entity_id,)
        ).fetchone()
        assert entity == (1,)
    pruned = await trio.to_thread.run_sync(_prune_in_a_thread, pg_url, entity_id)
    assert pruned.plan.roots == (entity_id,)  # the write committed: the tree goes, whole
    with psycopg.connect(pg_url) as look:
        for table in ("cantrip_entities", "cantrip_turns", "cantrip_work", "cantrip_leases"):
            left = look.execute(
                f"SELECT count(*) FROM {table} WHERE entity_id = %s", (entity_id,)
            ).fetchone()
            assert left == (0,), table
    store.close()


async def test_prune_keeps_an_entity_a_claim_is_taking(pg_url: str) -> None:
    """A claim holds the fence lock exclusively from its pick to its commit: prune passes
    the entity over (never waiting for the claim) instead of deleting what the claim is
    leasing."""
    loom = Loom.open(pg_url)
    entity_id = (await greeter(loom).cast_async("first")).entity_id
    loom.close()
    with psycopg.connect(pg_url) as claim:
        assert claim.execute("SELECT cantrip_fence_take(%s)", (entity_id,)).fetchone() == (True,)
        kept = await trio.to_thread.run_sync(_prune_in_a_thread, pg_url, entity_id)
        assert kept.plan.roots == ()
        assert dict(kept.plan.kept)[entity_id].startswith("running")
        claim.rollback()
    pruned = await trio.to_thread.run_sync(_prune_in_a_thread, pg_url, entity_id)
    assert pruned.plan.roots == (entity_id,)


async def test_a_session_whose_entity_a_claim_is_taking_is_busy_not_deleted(pg_url: str) -> None:
    """``serve --db``'s delete of a session goes by the same rule: while its entity's
    fence lock is held it answers ``busy`` (a prompt is being taken), and deletes once
    it is free."""
    from cantrip.protocols.sessions import PostgresBackend, SessionError

    spell = {"factory": "tests.nowhere:build"}  # no worker runs it
    async with PostgresBackend.open(pg_url, spell, poll_s=0.2, tail_s=0.05) as backend:
        info, _ = await backend.create()
        with psycopg.connect(pg_url) as claim:
            taken = claim.execute("SELECT cantrip_fence_take(%s)", (info.entity_id,)).fetchone()
            assert taken == (True,)
            with pytest.raises(SessionError) as refused:
                await backend.delete(info.session_id)
            assert refused.value.kind == "busy", refused.value.message
            claim.rollback()
        await backend.delete(info.session_id)
        with pytest.raises(SessionError) as gone:
            await backend.find(info.session_id)
        assert gone.value.kind == "not_found"
