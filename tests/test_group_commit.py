"""The loom's group commit on a deferred store (PostgreSQL's write path), and its
fenced one-statement writes against a real PostgreSQL (tests/conftest.py).

The group commit is tested on a stand-in deferred store that records each batch
it is given, so what is asserted is the loom's own promise: a write is reported
durable only after a batch holding it was committed, concurrent writers share
batches, a cancelled writer does not drop the others' writes, and a batch that
fails fails every write in it.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import psycopg
import pytest
import trio
import trio.testing

from cantrip._errors import LoomError
from cantrip.distributed._queue import WorkQueue
from cantrip.loom import Loom
from cantrip.loom._fence import Fence, LeaseLostError
from cantrip.loom._model import EntityRecord
from cantrip.loom._postgres import PostgresStore
from cantrip.loom._stores import MemoryStore


class BatchStore(MemoryStore):
    """A deferred store that keeps what it commits, batch by batch, and can be told
    to hold a batch (until released) or to fail the next one."""

    deferred = True

    def __init__(self) -> None:
        super().__init__()
        self.limiter = trio.CapacityLimiter(4)
        self.batches: list[list[tuple[str, Any, Fence | None]]] = []
        self.committed: list[Any] = []
        self.hold = threading.Event()
        self.hold.set()
        self.entered = threading.Event()
        self.fail_next = False

    def write_batch(self, batch: Sequence[tuple[str, Any, Fence | None]]) -> list[tuple[int, str]]:
        self.entered.set()
        self.hold.wait(10)
        if self.fail_next:
            self.fail_next = False
            raise ConnectionError("server closed the connection")
        self.batches.append(list(batch))
        self.committed.extend(payload for _, payload, _ in batch)
        return []

    def journal_read(self, entity_id: str, sequence: int) -> list[Any]:
        return []

    def journal_write(self, *args: Any) -> None:
        raise AssertionError("a deferred store is written by write_batch only")


def _loom() -> tuple[Loom, BatchStore]:
    store = BatchStore()
    loom = Loom(store)
    loom._journaled = True  # the stand-in keeps the journal's writes in its batches
    return loom, store


async def test_concurrent_journal_writes_share_batches_and_return_only_once_committed() -> None:
    loom, store = _loom()
    returned_before_commit: list[str] = []

    async def entity(n: int) -> None:
        for step in range(5):
            data = f"e{n}-{step}"
            await loom.journal_write(f"e{n}", 1, step, "charge", data, None)
            payload = (f"e{n}", 1, step, "charge", data, None)
            if payload not in store.committed:
                returned_before_commit.append(data)

    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            for n in range(20):
                nursery.start_soon(entity, n)
    assert returned_before_commit == []
    assert len(store.committed) == 100
    assert len(store.batches) < 100  # writers that came while a batch was written shared one
    assert max(len(b) for b in store.batches) > 1
    # one entity's writes are committed in the order it made them
    order = [p[2] for p in store.committed if p[0] == "e3"]
    assert order == [0, 1, 2, 3, 4]


async def test_a_cancelled_writer_does_not_drop_the_batch_it_was_writing() -> None:
    loom, store = _loom()
    store.limiter = trio.CapacityLimiter(1)
    await store.limiter.acquire()  # a's batch waits for a thread ...
    first_done = trio.Event()
    scope = trio.CancelScope()
    second_done = trio.Event()

    async def first() -> None:
        with scope:
            await loom.journal_write("a", 1, 0, "charge", "a0", None)
        first_done.set()

    async def second() -> None:
        await loom.journal_write("b", 1, 0, "charge", "b0", None)
        second_done.set()

    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(first)
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(second)  # ... b queues behind it ...
            await trio.testing.wait_all_tasks_blocked()
            scope.cancel()  # ... and a is cancelled: its batch is still written
            store.limiter.release()
            await second_done.wait()
    assert [p[4] for p in store.committed] == ["a0", "b0"]
    assert first_done.is_set()


async def test_a_failed_batch_fails_every_write_in_it() -> None:
    loom, store = _loom()
    fence_a, fence_b = Fence("a", "w1", 1), Fence("b", "w1", 1)
    loom.hold("a", fence_a)
    loom.hold("b", fence_b)
    store.hold.clear()
    store.fail_next = True
    outcomes: dict[str, str] = {}

    async def write(entity_id: str) -> None:
        try:
            await loom.journal_write(entity_id, 1, 0, "charge", entity_id, None)
            outcomes[entity_id] = "durable"
        except LeaseLostError as exc:
            outcomes[entity_id] = str(exc)

    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(write, "a")
            await trio.to_thread.run_sync(store.entered.wait)
            nursery.start_soon(write, "b")
            await trio.sleep(0)  # b's write is queued behind a's batch
            store.hold.set()
    # a's batch failed: a learns it; b's write went into the next batch and is durable
    assert "a loom write failed (ConnectionError)" in outcomes["a"]
    assert outcomes["b"] == "durable"
    assert [p[4] for p in store.committed] == ["b"]
    # a stays stopped until its worker releases it (another worker resumes it)
    with pytest.raises(LeaseLostError):
        await loom.journal_write("a", 1, 1, "charge", "again", None)


async def test_an_unfenced_write_in_a_failed_batch_breaks_the_loom_for_later_syncs() -> None:
    loom, store = _loom()
    loom.register_entity(EntityRecord(entity_id="x", cantrip_id="c"))
    store.fail_next = True
    with pytest.raises(ConnectionError):
        await loom.sync("x")
    with pytest.raises(LoomError, match="cannot promise durability"):
        await loom.sync()
    assert store.committed == []


# -- the fenced statements on a real PostgreSQL -----------------------------------------


def _claimed(url: str, entity_id: str) -> tuple[PostgresStore, Fence]:
    store = PostgresStore(url)
    queue = WorkQueue(store)
    queue.enqueue({"factory": "x:y"}, "go", entity_id)
    claim = queue.claim("worker-1", lease_s=30)
    assert claim is not None
    return store, claim.fence


def _journal(url: str, entity_id: str) -> list[tuple[int, int, str | None]]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT sequence, ordinal, record FROM cantrip_journal WHERE entity_id = %s "
            "ORDER BY sequence, ordinal",
            (entity_id,),
        ).fetchall()
    return [(int(s), int(o), r) for s, o, r in rows]


def test_one_statement_journal_writes_keep_the_journal_rules(pg_url: str) -> None:
    store, fence = _claimed(pg_url, "e")
    try:
        assert store.journal_write_fenced("e", 1, -1, "", "answer-1", None, fence) is None
        assert store.journal_write_fenced("e", 1, 0, "charge", "{}", None, fence) is None
        assert store.journal_write_fenced("e", 1, 0, "charge", "{}", "first", fence) is None
        # a result is recorded once: a second one does not overwrite it
        assert store.journal_write_fenced("e", 1, 0, "charge", "{}", "second", fence) is None
        assert _journal(pg_url, "e") == [(1, -1, None), (1, 0, "first")]
        # a fresh utterance for the sequence voids what the abandoned attempt journaled
        assert store.journal_write_fenced("e", 1, -1, "", "answer-2", None, fence) is None
        assert _journal(pg_url, "e") == [(1, -1, None)]
        assert store.journal_read("e", 1)[0][2] == "answer-2"
        # under a stale fence nothing is written, voided or overwritten
        stale = Fence("e", "worker-1", fence.epoch - 1)
        why = store.journal_write_fenced("e", 1, -1, "", "answer-3", None, stale)
        assert why is not None and "lease lost" in why
        assert store.journal_write_fenced("e", 2, 0, "charge", "{}", None, stale) is not None
        assert _journal(pg_url, "e") == [(1, -1, None)]
        assert store.journal_read("e", 1)[0][2] == "answer-2"
    finally:
        store.close()


def test_a_batch_refuses_exactly_the_writes_whose_fence_is_lost(pg_url: str) -> None:
    store, fence = _claimed(pg_url, "held")
    try:
        lost = Fence("gone", "worker-1", 7)  # no such lease
        record = EntityRecord(entity_id="held", cantrip_id="c")
        refused = store.write_batch(
            [
                ("entity", record, fence),
                ("entity", EntityRecord(entity_id="gone", cantrip_id="c"), lost),
                ("journal", ("held", 1, 0, "charge", "{}", None), fence),
                ("journal", ("gone", 1, 0, "charge", "{}", None), lost),
                ("entity", record, None),  # already recorded (in this same batch)
            ]
        )
        assert [i for i, _ in refused] == [1, 3, 4]
        assert "lease lost" in refused[0][1] and "lease lost" in refused[1][1]
        assert "append-only" in refused[2][1]
        assert store.get_entity("held") is not None and store.get_entity("gone") is None
        assert _journal(pg_url, "held") == [(1, 0, None)] and _journal(pg_url, "gone") == []
    finally:
        store.close()


def test_a_group_commit_batch_is_a_statement_per_kind_and_keeps_every_rule(
    pg_url: str,
) -> None:
    from cantrip.loom._model import Turn
    from cantrip.loom._postgres_writes import _independent

    store, fence = _claimed(pg_url, "a")
    try:
        queue = WorkQueue(store)
        queue.enqueue({"factory": "x:y"}, "go", "b")
        b = queue.claim("worker-2", lease_s=30)
        assert b is not None
        lost = Fence("c", "worker-3", 4)  # no such lease
        with psycopg.connect(pg_url, autocommit=True) as conn:  # a turn already recorded
            conn.execute(
                "INSERT INTO cantrip_turns (id, entity_id, sequence, data) "
                "VALUES ('t-old', 'a', 9, '{}')"
            )
            # what an abandoned attempt of b's turn 2 journaled: a new utterance voids it
            conn.execute("INSERT INTO cantrip_journal VALUES ('b', 2, 0, 'charge', '{}', NULL)")

        def turn(entity_id: str, sequence: int, turn_id: str | None = None) -> Turn:
            return Turn(
                id=turn_id or f"t-{entity_id}-{sequence}",
                parent_id=None,
                entity_id=entity_id,
                sequence=sequence,
                utterance="u",
                observation="o",
            )

        batch: list[tuple[str, object, Fence | None]] = [
            ("turn", turn("a", 1), fence),
            ("journal", ("a", 2, -1, "", "answer", None), fence),
            ("turn", turn("b", 1), b.fence),
            ("turn", turn("c", 1), lost),  # refused: lease lost
            ("journal", ("b", 1, 0, "charge", "{}", None), b.fence),
            ("journal", ("c", 1, 0, "charge", "{}", None), lost),  # refused
            ("turn", turn("a", 9, "t-new"), fence),  # refused: a's sequence 9 exists
            ("journal", ("b", 2, -1, "", "again", None), b.fence),
            ("turn", turn("u", 1), None),  # unfenced
            ("journal", ("a", 1, 0, "charge", "{}", "done"), fence),
        ]
        assert _independent(batch)  # so it is written a kind at a time
        refused = store.write_batch(batch)  # type: ignore[arg-type]
        assert [i for i, _ in refused] == [3, 5, 6]
        assert "lease lost" in refused[0][1] and "lease lost" in refused[1][1]
        assert "already recorded" in refused[2][1]
        with psycopg.connect(pg_url) as conn:
            turns = conn.execute("SELECT id FROM cantrip_turns ORDER BY id").fetchall()
            journal = conn.execute(
                "SELECT entity_id, sequence, ordinal, data, record FROM cantrip_journal "
                "ORDER BY 1, 2, 3"
            ).fetchall()
        assert [t for (t,) in turns] == ["t-a-1", "t-b-1", "t-old", "t-u-1"]
        assert journal == [
            ("a", 1, 0, "{}", "done"),
            ("a", 2, -1, "answer", None),
            ("b", 1, 0, "{}", None),
            ("b", 2, -1, "again", None),  # b's abandoned call at (2, 0) is void
        ]
        # a batch whose writes touch one row twice is written in order, one by one
        again = [
            ("journal", ("b", 3, 0, "charge", "{}", None), b.fence),
            ("journal", ("b", 3, 0, "charge", "{}", "result"), b.fence),
            ("journal", ("b", 3, 0, "charge", "{}", "late"), b.fence),
        ]
        assert not _independent(again)
        assert store.write_batch(again) == []  # type: ignore[arg-type]
        assert store.journal_read("b", 3) == [(0, "charge", "{}", "result")]
    finally:
        store.close()


def test_a_fenced_write_locks_no_lease_row(pg_url: str) -> None:
    """Issue 46.2: the fence is checked under an advisory lock, not a ``FOR SHARE`` row
    lock (which marks the lease row -- its ``xmax`` -- and is a WAL record per write)."""
    store, fence = _claimed(pg_url, "quiet")
    try:
        record = EntityRecord(entity_id="quiet", cantrip_id="c")
        assert store.write_batch([("entity", record, fence)]) == []  # one statement
        assert (
            store.write_batch(
                [
                    ("journal", ("quiet", 1, -1, "", "answer", None), fence),
                    ("journal", ("quiet", 1, 0, "charge", "{}", None), fence),
                    ("journal", ("quiet", 2, 0, "charge", "{}", None), fence),
                ]
            )
            == []
        )  # a batch
        with psycopg.connect(pg_url) as conn:
            xmax = conn.execute(
                "SELECT xmax::text FROM cantrip_leases WHERE entity_id = 'quiet'"
            ).fetchone()
        assert xmax == ("0",)  # never locked since the claim wrote it
        assert len(_journal(pg_url, "quiet")) == 3
    finally:
        store.close()


def test_a_claim_leaves_an_entity_whose_old_fence_is_writing(pg_url: str) -> None:
    """A write and a claim of its entity stay ordered without the row lock: while a
    write under the old fence is in flight (its transaction holds the fence's shared
    lock), a claim passes the entity over; once it committed, the claim takes it, at a
    new epoch, and the old fence writes nothing more."""
    store, fence = _claimed(pg_url, "busy")
    try:
        queue = WorkQueue(store)
        with psycopg.connect(pg_url) as writing, psycopg.connect(pg_url, autocommit=True) as db:
            held = writing.execute(
                "SELECT cantrip_fence_holds(%s, %s, %s)",
                (fence.lease_entity, fence.owner, fence.epoch),
            ).fetchone()
            assert held == (True,)  # the write's transaction is open, its fence held
            # the lease runs out (the writer stalled); the claim must not interleave
            db.execute("UPDATE cantrip_leases SET expires_at = clock_timestamp()")
            assert queue.claim("worker-2", lease_s=30) is None
            writing.commit()
        claim = queue.claim("worker-2", lease_s=30)
        assert claim is not None and claim.fence.epoch == fence.epoch + 1
        why = store.journal_write_fenced("busy", 1, 0, "charge", "{}", None, fence)
        assert why is not None and "lease lost" in why
    finally:
        store.close()


def test_a_version_5_database_is_brought_to_version_6_in_place(pg_url: str) -> None:
    """Schema 6 (issue 46.2): a database made before it (no fence functions) gains them
    when a store opens it; the lease a version 5 worker holds still fences its writes,
    and the write locks no lease row."""
    from cantrip.loom._postgres_schema import SCHEMA_VERSION

    store, fence = _claimed(pg_url, "old")
    store.close()
    with psycopg.connect(pg_url, autocommit=True) as conn:  # back to what v5 made
        conn.execute(
            "DROP FUNCTION cantrip_fence_holds, cantrip_fence_take, cantrip_fence_key; "
            "DELETE FROM cantrip_schema; INSERT INTO cantrip_schema (version) VALUES (5)"
        )
    store = PostgresStore(pg_url)
    try:
        record = EntityRecord(entity_id="old", cantrip_id="c")
        assert store.write_batch([("entity", record, fence)]) == []
        stale = Fence("old", fence.owner, fence.epoch - 1)
        why = store.journal_write_fenced("old", 1, 0, "charge", "{}", None, stale)
        assert why is not None and "lease lost" in why
    finally:
        store.close()
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT max(version) FROM cantrip_schema").fetchone() == (
            SCHEMA_VERSION,
        )
        lease = conn.execute("SELECT xmax::text FROM cantrip_leases").fetchone()
        assert lease == ("0",)


def _wal_records(url: str, write: Any) -> list[tuple[str, str]]:
    """(record type, relation) of every heap WAL record ``write()`` made on the loom's
    turns and journal."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
        # (the test cluster does not flush the WAL at commits: switching to a new WAL
        # file does, so that the records are readable)
        start = conn.execute("SELECT pg_current_wal_lsn()").fetchone()
        write()
        end = conn.execute("SELECT pg_switch_wal()").fetchone()
        assert start is not None and end is not None
        nodes = dict(
            conn.execute(
                "SELECT pg_relation_filenode(oid)::text, relname FROM pg_class "
                "WHERE relname IN ('cantrip_turns', 'cantrip_journal')"
            ).fetchall()
        )
        rows = conn.execute(
            "SELECT record_type, substring(block_ref from 'rel [0-9]+/[0-9]+/([0-9]+)') "
            "FROM pg_get_wal_records_info(%s, %s) WHERE resource_manager = 'Heap'",
            (start[0], end[0]),
        ).fetchall()
    return [(str(t), nodes[n]) for t, n in rows if n in nodes]


@pytest.mark.parametrize("size", [1, 3])
def test_new_turns_and_starts_are_written_without_on_conflict(pg_url: str, size: int) -> None:
    """A turn, an utterance and a call's start are new but after a crash: written as a
    plain INSERT, they cost no speculative-insertion confirmation in the WAL (issue
    46.3; fails before: one HEAP_CONFIRM per row). One write alone and a group commit
    of several entities' writes, a statement per kind."""
    from cantrip.loom._model import Turn

    stores = [_claimed(pg_url, f"e{i}") for i in range(size)]
    store = stores[0][0]
    try:
        batch: list[Any] = []
        for i, (_, fence) in enumerate(stores):
            batch.append(("journal", (f"e{i}", 1, -1, "", "answer", '{"start":0}'), fence))
            batch.append(("journal", (f"e{i}", 2, 0, "charge", "{}", None), fence))
            turn = Turn(id=f"t-{i}", parent_id=None, entity_id=f"e{i}", sequence=1)
            batch.append(("turn", turn, fence))
        if size == 1:
            written: list[Any] = []
            records = _wal_records(
                pg_url,
                lambda: written.extend(
                    store.write_batch(op) for op in [batch[:1], batch[1:2], batch[2:]]
                ),
            )
            assert written == [[], [], []]
        else:
            records = _wal_records(pg_url, lambda: store.write_batch(batch))
        inserts = [t for t, _ in records if t.startswith("INSERT")]
        assert len(inserts) == 3 * size  # the rows were written ...
        assert not [t for t, _ in records if t.startswith("HEAP_CONFIRM")]  # ... plainly
        assert store.get_turn("t-0") is not None
        assert _journal(pg_url, "e0") == [(1, -1, '{"start":0}'), (2, 0, None)]
    finally:
        for s, _ in stores:
            s.close()


def test_a_new_entity_is_written_without_on_conflict(pg_url: str) -> None:
    """An entity's record is new but after a crash: a plain INSERT, no speculative
    insertion's confirmation in the WAL (fails before: one HEAP_CONFIRM); one already
    there is still refused, the rest of its batch made
    (test_a_batch_refuses_exactly_the_writes_whose_fence_is_lost)."""
    store, fence = _claimed(pg_url, "fresh")
    try:
        record = EntityRecord(entity_id="fresh", cantrip_id="c")
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
            start = conn.execute("SELECT pg_current_wal_insert_lsn()").fetchone()
            assert store.write_batch([("entity", record, fence)]) == []
            end = conn.execute("SELECT pg_switch_wal()").fetchone()
            assert start is not None and end is not None
            node = conn.execute("SELECT pg_relation_filenode('cantrip_entities')::text").fetchone()
            assert node is not None
            kinds = [
                str(kind)
                for (kind,) in conn.execute(
                    "SELECT record_type FROM pg_get_wal_records_info(%s, %s) "
                    "WHERE resource_manager = 'Heap' AND block_ref LIKE %s",
                    (start[0], end[0], f"%/{node[0]} %"),
                ).fetchall()
            ]
        assert len(kinds) == 1 and kinds[0].startswith("INSERT"), kinds  # no HEAP_CONFIRM
        assert store.get_entity("fresh") == record
    finally:
        store.close()


def test_a_batch_with_a_row_already_there_is_written_again_with_care(pg_url: str) -> None:
    """A start already journaled (a crashed attempt's) in a batch of new rows: the plain
    INSERT fails, nothing of it stays, and the batch is written again as it always was
    -- every other write made, the journaled start kept, nothing refused."""
    from cantrip.loom._model import Turn

    store, fence = _claimed(pg_url, "e")
    try:
        assert store.write_batch([("journal", ("e", 1, 0, "charge", "{}", None), fence)]) == []
        turn = Turn(id="t-1", parent_id=None, entity_id="e", sequence=2)
        batch: list[Any] = [
            ("journal", ("e", 1, 0, "charge", "{}", None), fence),  # there already
            ("journal", ("e", 1, 1, "charge", "{}", None), fence),
            ("turn", turn, fence),
        ]
        assert store.write_batch(batch) == []
        assert _journal(pg_url, "e") == [(1, 0, None), (1, 1, None)]
        assert store.get_turn("t-1") == turn
        # a turn already recorded is refused as ever, the rest of its batch made
        again = Turn(id="t-1", parent_id=None, entity_id="e", sequence=3)
        refused = store.write_batch(
            [("turn", again, fence), ("journal", ("e", 3, 0, "charge", "{}", None), fence)]
        )
        assert [i for i, _ in refused] == [0] and "already recorded" in refused[0][1]
        assert (3, 0, None) in _journal(pg_url, "e")
    finally:
        store.close()
