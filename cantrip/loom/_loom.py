"""The loom: the append-only tree of every turn of an execution tree (chapter 6).

One loom serves a whole execution tree -- the entity, its children, forks and
later casts (D-008). Turns link to their parents; a thread is any root-to-leaf
path and is extracted by walking parent links, O(depth).

Two ways to hold it. A store that can only replay its records (memory, JSONL)
is read once into an in-memory index. A store that answers queries
(:class:`~cantrip.loom._indexed.IndexedStore`: SQLite, PostgreSQL) is
never read whole: the loom asks it for what a request needs -- a thread, an
entity's latest turn, a page of entities -- and keeps what it read or wrote
in a bounded cache (turns never change, so a cached turn is never stale).

A *deferred* store (PostgreSQL) is written from worker threads: ``append``
queues the record and :meth:`Loom.sync` -- awaited by the entity before its
next turn begins (LOOM-1) -- commits the queue in order, in one transaction,
under each entity's :class:`~cantrip.loom._fence.Fence`.
"""

from __future__ import annotations

import os
import random
import sqlite3
import time
from typing import cast

import trio

from cantrip._errors import LoomAppendOnlyError, LoomError
from cantrip.loom._fence import Fence, LeaseLostError, PendingOp
from cantrip.loom._group_commit import GroupCommit
from cantrip.loom._indexed import (
    IndexedStore,
    JournalEntry,
    JournalRecord,
    JournalStore,
    journal_text,
)
from cantrip.loom._loom_reads import LoomReads
from cantrip.loom._model import EntityRecord, Turn
from cantrip.loom._stores import LoomStore, MemoryStore, open_store

_ids = random.Random(os.urandom(32))
"""The random bits of turn ids (:meth:`Loom.new_turn_id`); reseeded in a forked child,
so that parent and child never make the same ids."""
os.register_at_fork(after_in_child=lambda: _ids.seed(os.urandom(32)))


class Loom(LoomReads):
    """The tree of turns, indexed in memory, made durable by a :class:`LoomStore`."""

    def __init__(self, store: LoomStore | None = None, *, journal: bool = True) -> None:
        self.store: LoomStore = store if store is not None else MemoryStore()
        self._journaled = journal and isinstance(self.store, JournalStore)
        """Checked once: a runtime protocol check costs ~20 us, and the loop asks every turn."""
        self._indexed: IndexedStore | None = (
            self.store if isinstance(self.store, IndexedStore) else None
        )
        self._deferred = bool(getattr(self.store, "deferred", False))
        self._commits: GroupCommit[PendingOp] = GroupCommit(
            self._write_batch, max_batch=getattr(self.store, "max_batch", None)
        )
        """Deferred writes, written a batch at a time (:meth:`sync`)."""
        self._pending = self._commits.pending
        """The deferred writes not taken into a batch yet (a live view)."""
        self._fences: dict[str, Fence] = {}
        self._holders: dict[str, set[str]] = {}
        """The entities holding a fence, by its lease entity: :meth:`release` forgets them
        without a look at every entity this process holds (a worker holds ~1,000)."""
        self._lost: dict[str, str] = {}
        """Lease entities whose writes were refused (why), until released."""
        self._until: dict[str, float] = {}
        """Lease entities held until a local deadline (trio clock): past it, their writes
        are refused here, never sent (the lease may be another worker's by now)."""
        self._broken: str | None = None
        """Why a deferred store's batch with unfenced writes failed (then every sync fails)."""
        self._last: dict[str, Turn | None] = {}
        """Indexed mode: each entity's latest turn, as this process wrote or read it."""
        self._turns: list[Turn] = []
        self._by_id: dict[str, Turn] = {}
        self._children: dict[str | None, str | list[str]] = {}
        """Child turn ids by parent id: a lone child as its id, siblings (forks,
        several roots) as a list -- most turns have one child, and a list per
        turn would be one more object per turn for the collector to track."""
        self._entities: dict[str, EntityRecord] = {}
        self._entity_turns: dict[str, list[Turn]] = {}
        self._rewards: dict[str, float | None] = {}
        if self._indexed is not None:
            return
        try:
            self._load()
        except BaseException:
            self.store.close()
            raise

    @property
    def indexed(self) -> bool:
        """Whether reads are queries to the store (never a load of the whole loom)."""
        return self._indexed is not None

    def _load(self) -> None:
        for kind, payload in self.store.load():
            if kind == "entity":
                assert isinstance(payload, EntityRecord)
                self._index_entity(payload)
            elif kind == "turn":
                assert isinstance(payload, Turn)
                self._index_turn(payload)
            else:
                turn_id, reward = payload  # type: ignore[misc]
                self._rewards[turn_id] = reward

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        *,
        journal: bool | None = None,
        create: bool = True,
        read_only: bool = False,
    ) -> Loom:
        """Open (or create) a loom: ``postgresql://...`` on PostgreSQL (schema created
        on first use), ``*.jsonl`` as JSONL, anything else as an SQLite file.

        A file that is not a loom is refused before anything is written to it,
        and a damaged one is a :class:`LoomError` that says how to recover what
        it holds (``cantrip.loom._repair``).

        ``journal``: keep the gate journal (effects exactly once across a crash; see
        ``cantrip._journal``). Always on for PostgreSQL, where workers take over each
        other's entities; off by default for an SQLite file, where it costs about three
        more commits per turn with a gate call (``bench/turn_overhead.py``) -- turn it on
        for single-process effects that must not repeat after a crash.

        ``create=False``: a PostgreSQL database without a loom is a :class:`LoomError`
        rather than a new loom (files: the caller checks that the file exists).

        ``read_only``: a loom file is read and never written, not even to set a torn
        line aside or add what a newer cantrip keeps (for commands that only read)."""
        text = str(path)
        if text.startswith(("postgresql://", "postgres://")):
            from cantrip.loom._postgres import PostgresStore

            return cls(PostgresStore(text, create=create), journal=True)
        from cantrip.loom._repair import damaged_hint, ensure_loom

        if text != ":memory:":
            ensure_loom(path)
        try:
            return cls(open_store(path, read_only=read_only), journal=bool(journal))
        except sqlite3.DatabaseError as exc:
            raise LoomError(f"{path} is a damaged loom ({exc}); {damaged_hint(path)}") from None

    def close(self) -> None:
        if self._pending:  # a deferred store: commit what is queued before closing
            queued = self._commits.take_all()
            size = self._commits.max_batch or len(queued)
            for start in range(0, len(queued), size):  # in batches the store takes
                batch = queued[start : start + size]
                for index, why in self.store.write_batch(batch):  # type: ignore[attr-defined]
                    self._refused(batch[index], why)
        self.store.close()

    # -- writing -------------------------------------------------------------

    @staticmethod
    def new_turn_id() -> str:
        """``turn-`` and 128 bits: a 48-bit millisecond clock, then 80 random bits.

        Ids of one process sort roughly by creation time, so a store's id index
        grows at its end instead of at random places (cheaper appends). The random
        bits come from a generator seeded from ``os.urandom`` (again in a forked
        child), not from ``os.urandom`` per turn: that call releases the GIL, and in a
        worker whose database threads hold it the loop waited ~0.1 ms per turn to get
        it back (``bench/pg_turn_cost.py``, issue 46.4). An id must be unique, not
        secret."""
        return f"turn-{time.time_ns() // 1_000_000:012x}{_ids.getrandbits(80):020x}"

    def register_entity(self, record: EntityRecord) -> None:
        if record.entity_id in self._entities:
            raise LoomAppendOnlyError(
                f"loom is append-only: entity {record.entity_id} is already recorded"
            )
        fence = self._fence_for(record)
        if self._deferred:
            self._queue(("entity", record, fence))
        else:
            self.store.append_entity(record)
        self._index_entity(record)
        if self._indexed is not None:
            self._last[record.entity_id] = None

    def append(self, turn: Turn) -> Turn:
        """Record ``turn`` durably. Its parent must already be in the loom.

        On a deferred store the turn is durable once :meth:`sync` returns."""
        if turn.id in self._by_id:
            raise LoomAppendOnlyError(f"loom is append-only: turn {turn.id} already exists")
        fence = self._fences.get(turn.entity_id)
        if fence is not None:
            stale = self._stale(fence)
            if stale is not None:  # nothing of this run can be recorded any more
                raise LeaseLostError(f"entity {turn.entity_id}: {stale}")
        if turn.parent_id is not None and self._lookup(turn.parent_id) is None:
            raise LoomError(f"turn {turn.id} names unknown parent {turn.parent_id}")
        if self._entity_or_none(turn.entity_id) is None:
            raise LoomError(f"turn {turn.id} belongs to unregistered entity {turn.entity_id}")
        if self._deferred:
            self._queue(("turn", turn, fence))
        else:
            self.store.append_turn(turn)
        self._index_turn(turn)
        return turn

    # -- ownership and deferred writes -----------------------------------------

    def _queue(self, op: PendingOp) -> None:
        self._commits.queue(op)

    def hold(self, entity_id: str, fence: Fence, *, until: float | None = None) -> None:
        """Write everything of ``entity_id`` (and the children it spawns here) under ``fence``.

        ``until``: the lease's local deadline on the trio clock (see :meth:`renew`)."""
        held = self._fences.get(entity_id)
        if held is not None and held != fence:
            # one run of an entity at a time: a second fence would let the old run's
            # writes land under the new one (the worker never claims what it still runs)
            raise LoomError(f"entity {entity_id} is held already (epoch {held.epoch})")
        self._fences[entity_id] = fence
        self._holders.setdefault(fence.lease_entity, set()).add(entity_id)
        self._lost.pop(fence.lease_entity, None)
        if until is not None:
            self._until[fence.lease_entity] = until

    def renew(self, lease_entity: str, until: float) -> None:
        """The lease on ``lease_entity`` was extended: its writes are sent until ``until``.

        The worker passes the time it *sent* the renewal plus the lease: never later than
        the database's own expiry, so a write this process lets through cannot outlive the
        lease, and a process that wakes from a stall past it sends nothing more."""
        current = self._until.get(lease_entity)
        if current is None or lease_entity in self._lost:
            return
        if trio.current_time() >= current:
            # ran out before the renewal came back: the run is being stopped already
            # (its cut-off turn must not land), so the renewal revives nothing
            self._lost[lease_entity] = "the lease ran out here before its renewal came back"
            return
        self._until[lease_entity] = max(current, until)

    def lose(self, fence: Fence, why: str) -> None:
        """The lease ``fence`` names is gone: refuse its writes here from now on (if this
        process still holds the entity under that very fence)."""
        if fence in self._fences.values():
            self._lost.setdefault(fence.lease_entity, why)

    def _stale(self, fence: Fence) -> str | None:
        """Why writes under ``fence`` must not be sent (lost, or past the local deadline)."""
        lost = self._lost.get(fence.lease_entity)
        if lost is not None:
            return lost
        until = self._until.get(fence.lease_entity)
        if until is not None and trio.current_time() >= until:
            why = (
                f"lease on {fence.lease_entity} at epoch {fence.epoch} ran out here "
                "before it was renewed; nothing more is written under it"
            )
            self._lost[fence.lease_entity] = why
            return why
        return None

    def release(self, entity_id: str) -> None:
        """Forget the fence of ``entity_id`` and of the children that inherited it,
        and what this process cached of them (another worker may write next)."""
        fence = self._fences.pop(entity_id, None)
        if fence is None:
            return
        for other in self._holders.pop(fence.lease_entity, ()):
            held = self._fences.get(other)
            if held is not None and held.lease_entity == fence.lease_entity:
                del self._fences[other]
                self._last.pop(other, None)
        self._last.pop(entity_id, None)
        self._lost.pop(fence.lease_entity, None)
        self._until.pop(fence.lease_entity, None)

    def lease_lost(self, entity_id: str) -> str | None:
        """Why writes for ``entity_id`` are refused, if they are."""
        fence = self._fences.get(entity_id)
        return None if fence is None else self._lost.get(fence.lease_entity)

    def _fence_for(self, record: EntityRecord) -> Fence | None:
        if record.entity_id in self._fences:
            return self._fences[record.entity_id]
        parent = record.parent_entity_id
        if parent is not None and parent in self._fences:
            fence = self._fences[record.entity_id] = self._fences[parent]
            self._holders.setdefault(fence.lease_entity, set()).add(record.entity_id)
            return fence
        return None

    async def sync(self, entity_id: str | None = None) -> None:
        """Wait until every record appended so far is durable (LOOM-1).

        A no-op on stores that commit as they append. On a deferred store the
        queue is written in order from a worker thread (one transaction, each
        write checked against its fence); raises :class:`LeaseLostError` if a
        write of ``entity_id``'s lease was refused.

        This is a group commit: while one batch is being written, what other
        entities queue waits and goes into the next batch together, so many
        concurrent entities share one thread hop and one commit, and a caller
        whose writes were in a batch returns when it ends. The batch is
        written shielded from cancellation -- it holds other entities' writes,
        which their callers wait for -- and a batch that fails to commit fails
        every write in it (no caller takes an unwritten record for durable)."""
        if self._deferred:
            try:  # everything queued so far: ours, and others' queued before it
                await self._commits.wait(self._commits.queued - 1)
            except LoomAppendOnlyError:
                raise
            except Exception as exc:  # the batch this task wrote failed (_write_batch)
                lost = self.lease_lost(entity_id) if entity_id is not None else None
                if lost is not None:
                    raise LeaseLostError(f"entity {entity_id}: {lost}") from exc
                raise
            if self._broken is not None:
                raise LoomError(self._broken)
        if entity_id is not None:
            lost = self.lease_lost(entity_id)
            if lost is not None:
                raise LeaseLostError(f"entity {entity_id}: {lost}")

    async def _write_batch(self, queued: list[PendingOp]) -> None:
        """Write a batch of the group commit (:class:`GroupCommit`: the task that writes
        it hears its failure; the others re-check their leases and :attr:`_broken`).

        Writes under a lease lost or run out here are refused without being sent."""
        batch: list[PendingOp] = []
        for op in queued:
            stale = None if op[2] is None else self._stale(op[2])
            if stale is None:
                batch.append(op)
            else:
                self._refused(op, stale)
        if not batch:
            return
        write_batch = self.store.write_batch  # type: ignore[attr-defined]
        limiter = self.store.limiter  # type: ignore[attr-defined]
        try:
            with trio.CancelScope(shield=True):
                failures = await trio.to_thread.run_sync(write_batch, batch, limiter=limiter)
        except Exception as exc:
            self._batch_failed(batch, exc)
            raise
        unfenced: list[str] = []
        for index, why in failures:
            self._refused(batch[index], why)
            if batch[index][2] is None:
                unfenced.append(why)
        if unfenced:
            raise LoomAppendOnlyError("; ".join(unfenced))

    def _batch_failed(self, batch: list[PendingOp], exc: Exception) -> None:
        """A batch the store could not commit: none of its writes is in the loom.
        The entities whose writes were fenced stop (as if their lease were lost:
        the worker drops them and they are resumed from the loom); a loom with
        unfenced writes in a failed batch refuses every later sync."""
        why = f"a loom write failed ({type(exc).__name__}); nothing of the batch was recorded"
        for op in batch:
            self._refused(op, why)
            if op[2] is None:
                self._broken = f"{why}: this loom cannot promise durability any more"

    def _refused(self, op: PendingOp, why: str) -> None:
        """A queued write the store refused: it is not in the loom, so not in the cache."""
        kind, payload, fence = op
        if fence is not None:
            self._lost.setdefault(fence.lease_entity, why)
        if kind == "turn":
            self._by_id.pop(payload.id, None)
            self._last.pop(payload.entity_id, None)
        elif kind == "entity":
            self._entities.pop(payload.entity_id, None)

    # -- the gate journal ------------------------------------------------------

    @property
    def journaled(self) -> bool:
        """Whether this loom keeps a gate journal (PostgreSQL always; SQLite when opened
        with ``journal=True``)."""
        return self._journaled

    async def journal_read(self, entity_id: str, sequence: int) -> list[JournalEntry]:
        """What the journal holds of ``entity_id``'s turn ``sequence`` (see cantrip._journal)."""
        store = cast(JournalStore, self.store)
        assert self._journaled, "this loom keeps no gate journal"
        if self._deferred:
            limiter = self.store.limiter  # type: ignore[attr-defined]
            return await trio.to_thread.run_sync(
                store.journal_read, entity_id, sequence, limiter=limiter
            )
        return store.journal_read(entity_id, sequence)

    async def journal_write(
        self,
        entity_id: str,
        sequence: int,
        ordinal: int,
        gate: str,
        data: str,
        record: JournalRecord | None,
        *,
        durable: bool = True,
    ) -> None:
        """Journal an utterance (ordinal -1), a started call (``record`` None) or its result.

        ``durable=False`` (a deferred store): queue the entry without waiting for its
        commit -- it goes, in order, into the group commit of this loom's next write that
        is waited for (see ``cantrip._journal``). A deferred ``record`` (a callable) is
        encoded only if the store writes it."""
        store = cast(JournalStore, self.store)
        assert self._journaled, "this loom keeps no gate journal"
        if not self._deferred:
            store.journal_write(entity_id, sequence, ordinal, gate, data, journal_text(record))
            return
        fence = self._fences.get(entity_id)
        stale = None if fence is None else self._stale(fence)
        if stale is not None:
            raise LeaseLostError(f"entity {entity_id}: {stale}")
        # queued with the loom's other writes and committed by the next group commit
        self._queue(("journal", (entity_id, sequence, ordinal, gate, data, record), fence))
        if durable:
            await self.sync(entity_id)

    def annotate_reward(self, turn_id: str, reward: float | None) -> None:
        """Assign or update a turn's reward -- the one change LOOM-3 allows."""
        self.get(turn_id)
        self.store.set_reward(turn_id, reward)
        if self._indexed is None:
            self._rewards[turn_id] = reward

    def delete_turn(self, turn_id: str) -> None:
        """Always refused: the loom is append-only (LOOM-3)."""
        raise LoomAppendOnlyError(
            f"loom is append-only: turn {turn_id} cannot be deleted (fork instead)"
        )

    def replace_turn(self, turn_id: str, turn: Turn) -> None:
        """Always refused: the loom is append-only (LOOM-3)."""
        raise LoomAppendOnlyError(
            f"loom is append-only: turn {turn_id} cannot be modified (annotate a reward or fork)"
        )
