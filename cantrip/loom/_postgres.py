"""The loom on PostgreSQL: one shared tree for any number of worker processes.

The same records and rules as the SQLite store -- append-only (enforced by
triggers in the database), one unified tree, rewards as the one annotation,
the same read queries (:class:`~cantrip.loom._indexed.IndexedQueries`) -- plus
what many writers need: every write is checked against the writer's
:class:`~cantrip.loom._fence.Fence` in the same statement
(:mod:`cantrip.loom._postgres_writes`), the gate journal, and the tables the work
queue uses (:mod:`cantrip.distributed._queue`).

This module is the store itself: it opens the pool
(:mod:`cantrip.loom._postgres_connection`), brings the schema up to date
(:mod:`cantrip.loom._postgres_schema`) and runs the statements.

psycopg is blocking. The loom calls the write side (:meth:`write_batch`: turns,
entities, rewards and journal entries, queued by the loom and group-committed;
:meth:`journal_read`) through ``trio.to_thread`` behind :attr:`limiter`, one
pool connection per call. Each write is one statement with its fence check
inside; a batch is one pipeline (one round trip, one commit). The read side
answers the loom's synchronous queries directly; a worker reads what an
entity needs in a thread before running it (``Loom.refresh``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import trio

from cantrip._errors import LoomAppendOnlyError, LoomError
from cantrip.loom._fence import Fence, PendingOp
from cantrip.loom._indexed import IndexedQueries, query_sql
from cantrip.loom._model import EntityRecord, Turn
from cantrip.loom._postgres_connection import open_pool, safe_url
from cantrip.loom._postgres_schema import migrate
from cantrip.loom._postgres_writes import (
    PlannedStatement,
    covered,
    plan_batch,
    refusal,
    refusals,
    statement,
)

MAX_BATCH = 1024
"""The most deferred writes the loom's group commit puts in one transaction here. Each
write's fence is checked under its entity's advisory lock, held to the commit, and
every such lock is an entry of the server's shared lock table
(``max_locks_per_transaction`` x connections, 6,400 by default, for all sessions): a
batch as big as a worker's concurrency would make the lock table the limit of how many
casts a server can run (a worker of 2,000 casts failed its commits on a small table).
Batches rarely reach this under load (what arrives during one commit)."""


class PostgresStore(IndexedQueries):
    """A loom store on PostgreSQL (psycopg 3 + a connection pool)."""

    deferred = True
    """Writes are queued by the loom and committed by :meth:`write_batch` in a thread."""

    _sql = query_sql("cantrip_", "%s", "sequence")

    def __init__(
        self,
        url: str,
        *,
        max_connections: int = 8,
        create: bool = True,
        max_batch: int = MAX_BATCH,
    ) -> None:
        """``create=False``: a database with no cantrip loom in it is a :class:`LoomError`
        instead of getting cantrip's tables -- for commands that read or edit a loom
        (``cantrip loom URL ...``), where a mistyped database name must not leave
        tables behind in somebody else's database. ``max_batch``: see :data:`MAX_BATCH`."""
        if max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, not {max_batch}")
        self.max_batch = max_batch
        """The most writes one :meth:`write_batch` gets from the loom (:data:`MAX_BATCH`)."""
        self.url = url
        self.path = None
        """Not a file (front ends that print a loom path print :meth:`__str__`)."""
        self.pool = open_pool(url, max_connections)
        self.limiter = trio.CapacityLimiter(max_connections)
        """Worker threads that may hold a pool connection at once."""
        try:
            with self.pool.connection() as conn:
                migrate(conn, create=create, where=safe_url(url))
        except LoomError:
            self.pool.close()
            raise

    def __str__(self) -> str:
        return safe_url(self.url)

    # -- writing ----------------------------------------------------------------

    def write_batch(self, batch: Sequence[PendingOp]) -> list[tuple[int, str]]:
        """Commit queued writes in order, in one transaction. Each write whose fence
        no longer holds is left out; returns (index, why) for every refused write.

        The batch is planned as few statements (:func:`~cantrip.loom._postgres_writes.plan_batch`).
        One statement is its own transaction; several are ``BEGIN``, the statements,
        ``COMMIT`` -- one commit either way. (psycopg's pipeline mode measured slower
        than this: ``bench/pg_turn_cost.py``.)"""
        from psycopg.errors import UniqueViolation  # (psycopg loads with the pool, not before)

        skipped = covered(batch)
        plan = plan_batch(batch, list(skipped))
        with self.pool.connection() as conn:
            try:
                answers = _run(conn, plan)
            except UniqueViolation:
                # a row that was expected to be new is there (a crash's, or a refused
                # append): nothing of the batch was written; again, every write careful
                plan = plan_batch(batch, list(skipped), careful=True)
                answers = _run(conn, plan)
        return refusals(batch, plan, answers, skipped)

    def _write_now(self, op: PendingOp) -> None:
        refused = self.write_batch([op])
        if refused:
            raise LoomAppendOnlyError(refused[0][1])

    def append_entity(self, record: EntityRecord) -> None:
        self._write_now(("entity", record, None))

    def append_turn(self, turn: Turn) -> None:
        self._write_now(("turn", turn, None))

    def set_reward(self, turn_id: str, reward: float | None) -> None:
        with self.pool.connection() as conn:
            cursor = conn.execute(
                "UPDATE cantrip_turns SET reward = %s WHERE id = %s", (reward, turn_id)
            )
            if cursor.rowcount != 1:
                raise LoomError(f"no turn {turn_id!r} in {self}")

    # -- the gate journal (read: IndexedQueries.journal_read) -------------------

    def journal_write(
        self, entity_id: str, sequence: int, ordinal: int, gate: str, data: str, record: str | None
    ) -> None:
        refused = self.journal_write_fenced(entity_id, sequence, ordinal, gate, data, record, None)
        assert refused is None

    def journal_write_fenced(
        self,
        entity_id: str,
        sequence: int,
        ordinal: int,
        gate: str,
        data: str,
        record: str | None,
        fence: Fence | None,
    ) -> str | None:
        """Journal one entry under ``fence``; why it was refused, or None.

        One statement (one round trip, its own transaction): the fence check and the
        write -- for an utterance (``ordinal`` < 0), also voiding what an abandoned
        attempt of the turn journaled."""
        op: PendingOp = ("journal", (entity_id, sequence, ordinal, gate, data, record), fence)
        with self.pool.connection() as conn:
            row = conn.execute(*statement(op)).fetchone()
        return refusal(op, row)

    # -- how the shared queries (IndexedQueries) run here -----------------------

    def _rows(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        with self.pool.connection() as conn:
            return conn.execute(sql, params).fetchall()

    def _stream(self, sql: str) -> Iterator[Any]:
        """Rows read with a server-side cursor (export and ``loom.turns`` read every turn)."""
        with self.pool.connection() as conn, conn.transaction():
            cursor = conn.cursor(name="cantrip_stream")
            cursor.execute(sql)
            yield from cursor

    def _location(self) -> str:
        return safe_url(self.url)

    def close(self) -> None:
        self.pool.close()


def _run(conn: Any, plan: list[PlannedStatement]) -> list[list[Any]]:
    """The rows each statement of ``plan`` answers: one statement is its own
    transaction, several are one."""
    if len(plan) == 1:
        return [conn.execute(plan[0][0], plan[0][1]).fetchall()]
    with conn.transaction():
        return [_fetched(conn.execute(sql, params)) for sql, params, _ in plan]


def _fetched(cursor: Any) -> list[Any]:
    """A statement's rows (none for one that returns none, the blobs' insert)."""
    return cursor.fetchall() if cursor.description is not None else []
